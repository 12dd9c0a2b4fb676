#pragma once
// The parameter grids of `kvsim serve hit-rate` and `kvsim serve simulate`: each point's result row
// is appended to OUT.progress as it finishes (a header line with the run's configuration, then one
// JSON line per point, flushed), so a run killed at any moment keeps every finished point and
// `--resume` runs only the rest. Under mpirun (built with MPI, docs/scale_out.md) rank 0 hands the
// points out to the other ranks, one at a time, and writes the progress file.
#include <cstddef>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvsim::cli {

struct ServeGrid {
  std::size_t points = 0;
  std::string progress;         // OUT.progress; empty: no outputs, nothing kept
  nlohmann::json config;        // what the rows depend on: a resume must have the same
  nlohmann::json row_template;  // a row's keys, and which hold strings: kept rows must match it
  bool resume = false;
  bool force = false;
  std::function<nlohmann::json(std::size_t)> run;                  // one point's row
  std::function<void(std::size_t, const nlohmann::json&)> report;  // prints a row (rank 0, serial order)
};

// The progress file beside the outputs: OUT.progress for --out (else --json); empty without either.
std::string grid_progress_path(const std::string& out, const std::string& json);

// With --resume: true when there is nothing to resume (no progress file, and every output is
// there: the run finished), after saying so.
bool grid_finished(const ServeGrid& grid, const std::vector<std::string>& outputs);
// Refuses existing outputs unless --force, or --resume of a run whose progress file is there.
void refuse_grid_overwrite(const ServeGrid& grid, const std::vector<std::string>& outputs);
// Whether this process is an MPI rank other than 0 (started by mpirun): such ranks run points and
// print nothing; rank 0 reports.
bool grid_worker_rank();

// Every point's row in grid order, over MPI ranks when started by mpirun. Throws naming the progress file when it
// belongs to another configuration, or when one exists and neither --resume nor --force is given. The caller writes its
// outputs, then calls finish_grid.
std::vector<nlohmann::json> run_grid(const ServeGrid& grid);
void finish_grid(const ServeGrid& grid);

// A grid under way: the rows so far and the progress file they are appended to.
struct GridState {
  std::vector<nlohmann::json> rows;
  std::vector<bool> done;
  std::string path;
  std::ofstream progress;
};
// The rows an earlier run kept (with --resume), the progress file opened for appending.
GridState open_grid(const ServeGrid& grid);
// Stores point p's row and appends it to the progress file, flushed.
void record_point(GridState& state, std::size_t p, nlohmann::json row);

#ifdef KVSIM_HAVE_MPI
// The grid over MPI ranks; false (nothing done) with a single rank. Ranks other than 0 exit when done.
bool run_grid_mpi(const ServeGrid& grid, std::vector<nlohmann::json>& rows);
#endif

}  // namespace kvsim::cli
