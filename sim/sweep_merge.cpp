#include "sim/sweep_merge.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <tuple>

#include "core/atomic_file.h"
#include "core/error.h"
#include "results/detail_file.h"

namespace kvsim {

namespace {

using RequestKey = std::pair<std::string, std::string>;  // (trace, request)

struct RequestRows {
  RequestKey key;
  std::vector<std::string> lines;
};

struct ShardFile {
  std::string path;
  int shard = 0, shards = 0;
  std::string own_config;          // the configuration JSON as written (with its shard)
  std::string base_config;         // the same without the shard: what a serial sweep writes
  results::SweepConfig base;       // (and as a configuration)
  std::size_t configs = 0;         // rows per request
  std::int64_t all_requests = -1;  // the whole sweep's request count
  std::vector<RequestRows> requests;
};

// The shard fields of a file's configuration, checked; base_config is the configuration a serial
// sweep writes (the same without them).
void read_config(const std::string& path, const results::SweepConfig& config, ShardFile& f) {
  if (config.shard.empty() || config.shard_of_requests < 0)
    throw Error(path +
                ": its configuration has no \"shard\" and \"shard_of_requests\"; expected the result file of "
                "kvsim sweep --shard i/n");
  try {
    std::tie(f.shard, f.shards) = parse_shard(config.shard);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  f.own_config = results::sweep_config_text(config);
  f.configs = config.configs.size();
  f.all_requests = config.shard_of_requests;
  results::SweepConfig base = config;
  base.shard.clear();
  base.shard_of_requests = -1;
  f.base = base;
  f.base_config = results::sweep_config_text(base);
}

// Consecutive rows of one request, checked whole; keys[i] is lines[i]'s (trace, request).
std::vector<RequestRows> group_requests(const std::string& path, const std::vector<std::string>& lines,
                                        const std::vector<RequestKey>& keys, const std::vector<int>& line_numbers,
                                        std::size_t per_request) {
  std::vector<RequestRows> out;
  std::set<RequestKey> seen;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const RequestKey& key = keys[i];
    if (out.empty() || out.back().key != key) {
      if (!seen.insert(key).second)
        throw Error(path + ":" + std::to_string(line_numbers[i]) + ": rows of request '" + key.second + "' (" +
                    key.first + ") are not together; expected a kvsim sweep file");
      out.push_back({key, {}});
    }
    out.back().lines.push_back(lines[i]);
  }
  for (const auto& r : out)
    if (r.lines.size() != per_request)
      throw Error(path + ": request '" + r.key.second + "' (" + r.key.first + ") has " +
                  std::to_string(r.lines.size()) + " of " + std::to_string(per_request) +
                  " config rows: the shard did not finish; resume it "
                  "(kvsim sweep ... --shard i/n --resume), then merge");
  return out;
}

template <class File>
std::pair<std::vector<RequestKey>, std::vector<int>> keys_of(const File& f) {
  std::pair<std::vector<RequestKey>, std::vector<int>> out;
  for (const auto& r : f.rows) {
    out.first.push_back({r.trace, r.request});
    out.second.push_back(r.line);
  }
  return out;
}

ShardFile read_shard(const std::string& path) {
  const results::SweepFile file = results::read_sweep_file(path);
  if (!file.has_banner || !file.config)
    throw Error(path + ": not a kvsim sweep result file (expected its banner and configuration line first)");
  ShardFile f;
  f.path = path;
  read_config(path, *file.config, f);
  const auto [keys, numbers] = keys_of(file);
  f.requests = group_requests(path, file.lines, keys, numbers, f.configs);
  return f;
}

// A shard's detail file: its configuration first, then the same requests as its CSV, in order.
std::vector<RequestRows> read_detail(const std::string& path, const ShardFile& shard) {
  const results::DetailFile file = results::read_detail_file(path);
  if (file.config_text != shard.own_config)
    throw Error(path + ": its configuration is not that of " + shard.path + " (expected the --detail file of shard " +
                std::to_string(shard.shard) + "/" + std::to_string(shard.shards) + ")");
  const auto [keys, numbers] = keys_of(file);
  auto rows = group_requests(path, file.lines, keys, numbers, shard.configs);
  if (rows.size() != shard.requests.size() || !std::equal(rows.begin(), rows.end(), shard.requests.begin(),
                                                          [](const auto& a, const auto& b) { return a.key == b.key; }))
    throw Error(path + ": its requests are not those of " + shard.path +
                " (the shard stopped between the two files; run it again), expected " +
                std::to_string(shard.requests.size()) + " requests in the same order");
  return rows;
}

// The shards, ordered by index, checked to be one complete set of one configuration.
std::vector<ShardFile> read_shard_set(const std::vector<std::string>& inputs) {
  std::vector<ShardFile> files;
  for (const auto& p : inputs) files.push_back(read_shard(p));
  const int n = files.front().shards;
  std::map<int, std::string> by_index;
  for (const auto& f : files) {
    if (f.base_config != files.front().base_config)
      throw Error(f.path + ": a different sweep configuration than " + files.front().path +
                  "'s (traces, policies, budgets and options must be the same in every shard)");
    if (f.all_requests != files.front().all_requests)
      throw Error(f.path + ": a shard of a sweep of " + std::to_string(f.all_requests) + " requests, but " +
                  files.front().path + "'s sweep has " + std::to_string(files.front().all_requests));
    if (f.shards != n)
      throw Error(f.path + ": shard " + std::to_string(f.shard) + "/" + std::to_string(f.shards) + ", but " +
                  files.front().path + " is one of " + std::to_string(n));
    if (!by_index.emplace(f.shard, f.path).second)
      throw Error(f.path + ": shard " + std::to_string(f.shard) + "/" + std::to_string(n) + " is also " +
                  by_index[f.shard]);
  }
  for (int i = 0; i < n; ++i)
    if (!by_index.count(i))
      throw Error("shard " + std::to_string(i) + "/" + std::to_string(n) +
                  " is missing (given: " + std::to_string(files.size()) + " of " + std::to_string(n) + " shard files)");
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.shard < b.shard; });
  // Round-robin over the serial order: shard i holds ceil((total - i) / n) of the sweep's requests.
  const auto total = static_cast<std::size_t>(files.front().all_requests);
  for (const auto& f : files) {
    const std::size_t want =
        (total - static_cast<std::size_t>(f.shard) + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n);
    if (f.requests.size() != want)
      throw Error(f.path + ": " + std::to_string(f.requests.size()) + " requests, expected " + std::to_string(want) +
                  " for shard " + std::to_string(f.shard) + "/" + std::to_string(n) + " of " + std::to_string(total) +
                  " (a shard that stopped early must be resumed with --resume)");
  }
  std::set<RequestKey> keys;
  for (const auto& f : files)
    for (const auto& r : f.requests)
      if (!keys.insert(r.key).second)
        throw Error(f.path + ": request '" + r.key.second + "' (" + r.key.first + ") is in another shard too");
  return files;
}

void check_writable(const std::string& path, bool force, const std::vector<std::string>& inputs) {
  if (std::find(inputs.begin(), inputs.end(), path) != inputs.end())
    throw Error(path + ": is one of the inputs; write the merged file elsewhere");
  if (std::filesystem::exists(path) && !force) throw Error(path + ": exists; pass --force to replace it");
}

}  // namespace

std::vector<SweepSummaryRow> merge_sweeps(const SweepMergeSpec& spec) {
  if (spec.inputs.empty()) throw Error("no shard result files given (kvsim sweep merge SHARD.csv... -o OUT.csv)");
  if (spec.out_csv.empty()) throw Error("no output file given (-o merged.csv)");
  if (!spec.detail_inputs.empty() && spec.detail_inputs.size() != spec.inputs.size())
    throw Error(std::to_string(spec.detail_inputs.size()) + " detail files for " + std::to_string(spec.inputs.size()) +
                " shard files; expected one per shard, in the same order");
  if (spec.detail_inputs.empty() != spec.detail_jsonl.empty())
    throw Error("--detail-from and --detail go together: the shards' detail files and the merged one");
  std::vector<std::string> all_inputs = spec.inputs;
  all_inputs.insert(all_inputs.end(), spec.detail_inputs.begin(), spec.detail_inputs.end());
  check_writable(spec.out_csv, spec.force, all_inputs);
  if (!spec.detail_jsonl.empty()) check_writable(spec.detail_jsonl, spec.force, all_inputs);

  std::vector<ShardFile> files = read_shard_set(spec.inputs);
  std::vector<std::vector<RequestRows>> details(files.size());
  for (std::size_t i = 0; i < spec.detail_inputs.size(); ++i) {
    const std::size_t at = static_cast<std::size_t>(
        std::find_if(files.begin(), files.end(), [&](const ShardFile& f) { return f.path == spec.inputs[i]; }) -
        files.begin());
    details[at] = read_detail(spec.detail_inputs[i], files[at]);
  }
  std::string csv = results::sweep_file_head(files.front().base);
  std::string detail = results::detail_file_head(files.front().base);
  for (std::size_t j = 0; j < files.front().requests.size(); ++j)
    for (std::size_t s = 0; s < files.size(); ++s) {
      if (j >= files[s].requests.size()) continue;
      for (const auto& l : files[s].requests[j].lines) csv += l + "\n";
      if (!details[s].empty())
        for (const auto& l : details[s][j].lines) detail += l + "\n";
    }
  write_file_atomically(spec.out_csv, csv);
  if (!spec.detail_jsonl.empty()) write_file_atomically(spec.detail_jsonl, detail);
  return summarize_sweep_csv(spec.out_csv);
}

}  // namespace kvsim
