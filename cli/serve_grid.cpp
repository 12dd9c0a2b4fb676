#include "cli/serve_grid.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/text_lines.h"
#include "results/serve_file.h"
#include "cli/options.h"
#include "core/error.h"
#ifdef KVSIM_HAVE_MPI
#include "cli/mpi_ranks.h"
#endif

namespace kvsim::cli {

std::string grid_progress_path(const std::string& out, const std::string& json) {
  if (!out.empty()) return out + ".progress";
  if (!json.empty()) return json + ".progress";
  return "";
}

namespace {

// A kept row must have the template's keys, with a string, a list or a flag where the template has
// one and a number or null elsewhere: the table printer and the outputs read them without further checks.
void check_row(const nlohmann::json& row, const nlohmann::json& templ, const std::string& where) {
  for (const auto& [key, value] : templ.items()) {
    if (!row.contains(key)) throw Error(where + ": the row has no '" + key + "'; not a row of this grid");
    const nlohmann::json& v = row[key];
    const bool ok = value.is_string()    ? v.is_string()
                    : value.is_array()   ? v.is_array()
                    : value.is_boolean() ? v.is_boolean()
                                         : (v.is_number() || v.is_null());
    if (!ok) throw Error(where + ": '" + key + "' is " + v.dump() + ", not what this grid writes there");
  }
  if (row.size() != templ.size()) throw Error(where + ": the row has keys this grid does not write");
}

// Rows a progress file's whole lines hold (results/serve_file.h), by point, checked against this grid.
std::vector<std::pair<std::size_t, nlohmann::json>> read_grid_progress(const ServeGrid& g,
                                                                       const std::vector<std::string>& lines) {
  const std::string& path = g.progress;
  results::GridProgress file = results::parse_grid_progress(lines, path);
  if (file.config != nlohmann::json::parse(g.config.dump()))  // as written: a NaN reads back as null
    throw Error(path + ": --resume with a different configuration; the file was written for\n  " + file.config.dump() +
                "\nbut this run is\n  " + g.config.dump() + "\n(use --force to start again)");
  std::map<std::size_t, nlohmann::json> rows;
  for (std::size_t i = 0; i < file.rows.size(); ++i) {
    auto& [p, row] = file.rows[i];
    const std::string where = path + ": line " + std::to_string(i + 2);
    check_row(row, g.row_template, where);
    if (p >= g.points)
      throw Error(where + ": point " + std::to_string(p) + " is outside the grid's " + std::to_string(g.points) +
                  " points");
    rows[p] = std::move(row);
  }
  return {rows.begin(), rows.end()};
}

// Opens the progress file for appending, after a fresh header unless resuming one.
std::ofstream open_progress(const ServeGrid& g, bool fresh) {
  std::ofstream out(g.progress, fresh ? std::ios::binary | std::ios::trunc : std::ios::binary | std::ios::app);
  if (!out) throw Error(g.progress + ": cannot write the progress file");
  if (fresh) out << results::grid_progress_head(g.config) << "\n" << std::flush;
  return out;
}

}  // namespace

GridState open_grid(const ServeGrid& g) {
  GridState st;
  st.rows.resize(g.points);
  st.done.assign(g.points, false);
  bool fresh = true;
  if (!g.progress.empty() && std::filesystem::exists(g.progress)) {
    if (!g.resume && !g.force)
      throw Error(g.progress +
                  ": an earlier run of this grid stopped here; pass --resume to continue it or --force to "
                  "start again");
    // Without a whole header line the file is started again.
    const std::vector<std::string> lines = g.resume ? whole_lines(g.progress) : std::vector<std::string>{};
    if (!lines.empty()) {
      for (auto& [p, row] : read_grid_progress(g, lines)) {
        st.rows[p] = std::move(row);
        st.done[p] = true;
      }
      // A torn last line (what a kill leaves) is cut, so that appending starts on a line of its own.
      std::uintmax_t whole = 0;
      for (const std::string& l : lines) whole += l.size() + 1;
      if (whole != std::filesystem::file_size(g.progress)) std::filesystem::resize_file(g.progress, whole);
      fresh = false;
    }
  }
  st.path = g.progress;
  if (!g.progress.empty()) st.progress = open_progress(g, fresh);
  return st;
}

void record_point(GridState& st, std::size_t p, nlohmann::json row) {
  // As it reads back from the file (a NaN becomes null), so that a resumed or MPI run's rows and
  // an uninterrupted serial run's are the same.
  row = nlohmann::json::parse(row.dump());
  if (st.progress.is_open()) {
    st.progress << results::grid_progress_line(p, row) << "\n" << std::flush;
    if (!st.progress) throw Error(st.path + ": cannot write the progress file (disk full?)");
  }
  st.rows[p] = std::move(row);
  st.done[p] = true;
}

bool grid_finished(const ServeGrid& g, const std::vector<std::string>& outputs) {
  if (!g.resume || g.progress.empty() || std::filesystem::exists(g.progress)) return false;
  for (const std::string& f : outputs)
    if (!f.empty() && !std::filesystem::exists(f)) return false;
  if (!grid_worker_rank())
    std::printf("nothing to resume: no %s, and the outputs are there (that run finished; --force runs it again)\n",
                g.progress.c_str());
  return true;
}

void refuse_grid_overwrite(const ServeGrid& g, const std::vector<std::string>& outputs) {
  if (g.force || (g.resume && !g.progress.empty() && std::filesystem::exists(g.progress))) return;
  for (const std::string& f : outputs) refuse_overwrite(f, false);
}

bool grid_worker_rank() {
#ifdef KVSIM_HAVE_MPI
  return mpi_launched() && mpi_worker_process();
#else
  return false;
#endif
}

std::vector<nlohmann::json> run_grid(const ServeGrid& g) {
#ifdef KVSIM_HAVE_MPI
  if (mpi_launched()) {
    std::vector<nlohmann::json> rows;
    if (run_grid_mpi(g, rows)) return rows;
  }
#endif
  GridState st = open_grid(g);
  // For tests: stop after this many points are on disk (an error exit, not a kill: the test then
  // tears the last line itself), so that a resume starts from a known point.
  const char* stop = std::getenv("KVSIM_GRID_STOP_AFTER");
  std::size_t ran = 0;
  for (std::size_t p = 0; p < g.points; ++p) {
    if (!st.done[p]) {
      if (stop && ran++ == std::stoul(stop))
        throw Error("stopped after " + std::string(stop) + " points (KVSIM_GRID_STOP_AFTER)");
      record_point(st, p, g.run(p));
    }
    if (g.report) g.report(p, st.rows[p]);
  }
  return std::move(st.rows);
}

void finish_grid(const ServeGrid& g) {
  if (!g.progress.empty()) std::filesystem::remove(g.progress);
}

}  // namespace kvsim::cli
