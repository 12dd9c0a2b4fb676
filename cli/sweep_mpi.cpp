// `mpirun -np N kvsim sweep ...` (built with MPI, docs/scale_out.md). Rank 0 keeps the work queue
// and merges; ranks 1..N-1 sweep. A worker goes through the requests in the sweep's order and asks
// rank 0 for each one it has not finished: the first rank to ask takes it, so a rank held up by a
// long request takes fewer. Each worker writes OUT.rankR (and its detail beside it) as a serial
// sweep writes its file, and resumes it; rank 0 then writes OUT in the serial sweep's order and
// removes the rank files. With --resume, a rank file of any earlier run counts, whatever N was.
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/mpi_ranks.h"
#include "cli/sweep_mpi.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "results/detail_file.h"
#include "traces/trace_reader.h"

namespace kvsim::cli {

namespace {

enum Tag { kClaim = 1, kReply = 2, kDone = 3 };
using Key = std::pair<std::string, std::string>;

std::string rank_file(const std::string& base, int rank) { return base + ".rank" + std::to_string(rank); }

// Rank files of any earlier run: BASE.rank<digits>.
std::vector<std::string> rank_files(const std::string& base) {
  namespace fs = std::filesystem;
  const fs::path p(base);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".rank";
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.size() > prefix.size() &&
        name.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
      out.push_back((dir / name).string());
  }
  return out;
}

// Worker: the sweep with every request claimed from rank 0 first.
void work(SweepSpec spec, int rank) {
  const std::string base = spec.out_csv, detail = spec.detail_jsonl;
  spec.out_csv = rank_file(base, rank);
  if (!detail.empty()) spec.detail_jsonl = rank_file(detail, rank);
  spec.resume = spec.resume && std::filesystem::exists(spec.out_csv);
  spec.force = true;
  spec.progress = false;
  spec.claim = [](const std::string& trace, const std::string& request) {
    const std::string key = trace + '\x1f' + request;
    MPI_Send(key.data(), static_cast<int>(key.size()), MPI_CHAR, 0, kClaim, MPI_COMM_WORLD);
    int yes = 0;
    MPI_Recv(&yes, 1, MPI_INT, 0, kReply, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return yes == 1;
  };
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0 has read what earlier runs finished
  std::ostringstream quiet;
  run_sweep(spec, quiet);
  MPI_Send(nullptr, 0, MPI_CHAR, 0, kDone, MPI_COMM_WORLD);
}

// The serial sweep's request order, over all traces.
std::vector<Key> serial_order(const SweepSpec& spec) {
  std::vector<Key> order;
  for (const auto& path : spec.traces) {
    const TraceReader r(path);
    for (const auto& id : r.request_ids()) order.emplace_back(path, id);
  }
  return order;
}

struct Finished {
  std::vector<std::string> rows, detail;
};

// What the result files of earlier runs (and the workers) finished: a request counts when its CSV
// rows are whole and, with --detail, its detail lines in the file beside them too.
std::map<Key, Finished> finished_requests(const SweepSpec& spec, const results::SweepConfig& config,
                                          std::size_t per_request) {
  std::vector<std::pair<std::string, std::string>> pairs;  // (csv, detail)
  for (const auto& f : rank_files(spec.out_csv)) {
    const std::string suffix = f.substr(f.rfind(".rank"));  // f may read ./OUT.rankR for OUT
    pairs.emplace_back(f, spec.detail_jsonl.empty() ? std::string() : spec.detail_jsonl + suffix);
  }
  if (spec.resume && std::filesystem::exists(spec.out_csv)) pairs.emplace_back(spec.out_csv, spec.detail_jsonl);
  std::map<Key, Finished> out;
  for (const auto& [csv, detail] : pairs) {
    std::map<Key, std::vector<std::string>> details;
    if (!detail.empty())
      for (auto& [key, lines] : finished_detail_rows(detail, config, per_request)) details[key] = std::move(lines);
    for (auto& [key, rows] : finished_sweep_rows(csv, config, per_request)) {
      if (!detail.empty() && !details.count(key)) continue;  // its detail was cut: redone
      out[key] = Finished{std::move(rows), detail.empty() ? std::vector<std::string>() : std::move(details[key])};
    }
  }
  return out;
}

// Rank 0: answers claims until every worker is done, then merges.
std::vector<SweepSummaryRow> coordinate(const SweepSpec& spec, int size, std::ostream& log) {
  const std::vector<ReplayConfig> configs = expand_configs(spec);
  const results::SweepConfig config = sweep_config(spec, configs);
  if (!spec.resume) {
    if (std::filesystem::exists(spec.out_csv) && !spec.force)
      throw Error(spec.out_csv + ": exists; pass --resume to continue that sweep or --force to replace it");
    for (const auto& f : rank_files(spec.out_csv)) std::filesystem::remove(f);
    if (!spec.detail_jsonl.empty())
      for (const auto& f : rank_files(spec.detail_jsonl)) std::filesystem::remove(f);
  }
  const std::vector<Key> order = serial_order(spec);
  // Earlier runs' finished requests: the merged file (a finished sweep) and every rank file.
  std::set<Key> taken;
  for (const auto& [key, f] : finished_requests(spec, config, configs.size())) taken.insert(key);
  log << "sweep (MPI): " << order.size() << " requests, " << taken.size() << " finished earlier, " << size - 1
      << " worker ranks\n";
  MPI_Barrier(MPI_COMM_WORLD);
  std::map<int, int> took;  // requests each rank took
  for (int done = 0; done < size - 1;) {
    int source = 0, tag = 0;
    const std::string key = mpi_receive_any(source, tag);
    if (tag == kDone) {
      ++done;
      continue;
    }
    const auto cut = key.find('\x1f');
    const int yes = taken.insert({key.substr(0, cut), key.substr(cut + 1)}).second ? 1 : 0;
    took[source] += yes;
    MPI_Send(&yes, 1, MPI_INT, source, kReply, MPI_COMM_WORLD);
  }
  log << "sweep (MPI): requests swept per rank:";
  for (int r = 1; r < size; ++r) log << " " << r << ":" << took[r];
  log << "\n";
  // Merge: every finished request from every file, in the serial order.
  const std::map<Key, Finished> finished = finished_requests(spec, config, configs.size());
  std::string csv = results::sweep_file_head(config);
  std::string detail = results::detail_file_head(config);
  for (const auto& key : order) {
    const auto it = finished.find(key);
    if (it == finished.end())
      throw Error(spec.out_csv + ": request '" + key.second + "' (" + key.first +
                  ") is in no rank's results (a rank stopped early?); run again with --resume");
    for (const auto& l : it->second.rows) csv += l + "\n";
    for (const auto& l : it->second.detail) detail += l + "\n";
  }
  write_file_atomically(spec.out_csv, csv);
  if (!spec.detail_jsonl.empty()) write_file_atomically(spec.detail_jsonl, detail);
  for (const auto& f : rank_files(spec.out_csv)) std::filesystem::remove(f);
  if (!spec.detail_jsonl.empty())
    for (const auto& f : rank_files(spec.detail_jsonl)) std::filesystem::remove(f);
  return summarize_sweep_csv(spec.out_csv);
}

}  // namespace

bool run_sweep_mpi(const SweepSpec& spec, std::vector<SweepSummaryRow>& rows, std::ostream& log) {
  int rank = 0, size = 1;
  if (!mpi_start(rank, size)) return false;  // one process: the plain sweep
  if (spec.shards > 1) {
    if (rank == 0) std::cerr << "kvsim sweep: error: --shard and MPI are two ways to split one sweep; use one\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  mpi_run("kvsim sweep", rank, [&] {
    if (rank == 0)
      rows = coordinate(spec, size, log);
    else
      work(spec, rank);
  });
  return true;
}

}  // namespace kvsim::cli
