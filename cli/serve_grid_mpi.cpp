// `mpirun -np N kvsim serve simulate|hit-rate ...` (built with MPI, docs/scale_out.md). Rank 0 keeps
// the queue of grid points and the progress file; ranks 1..N-1 ask for a point, run it and send its
// row back, until none is left. Points differ in cost (a small HBM means more recomputation), so the
// first rank to ask takes the next one. With --resume the points of the progress file, written by
// any number of ranks, are not run again.
#include <mpi.h>

#include <cstdlib>
#include <iostream>
#include <map>

#include "cli/serve_grid.h"
#include "cli/mpi_ranks.h"
#include "core/error.h"

namespace kvsim::cli {

namespace {

enum Tag { kAsk = 11, kPoint = 12, kRow = 13 };

// Rank 0: answers requests for points and records the rows that come back.
std::vector<nlohmann::json> coordinate(const ServeGrid& g, int size) {
  GridState st = open_grid(g);
  std::size_t next = 0, earlier = 0;
  for (bool d : st.done) earlier += d ? 1 : 0;
  std::cerr << "serve (MPI): " << g.points << " grid points, " << earlier << " finished earlier, " << size - 1
            << " worker ranks\n";
  std::map<int, int> took;
  for (int finished = 0; finished < size - 1;) {
    int source = 0, tag = 0;
    const std::string msg = mpi_receive_any(source, tag);
    if (tag == kRow) {
      const std::size_t cut = msg.find('\n');
      record_point(st, std::stoul(msg.substr(0, cut)), nlohmann::json::parse(msg.substr(cut + 1)));
      continue;
    }
    while (next < g.points && st.done[next]) ++next;
    long long point = -1;  // none left: that worker stops (its rows were all sent before it asked)
    if (next < g.points) {
      point = static_cast<long long>(next);
      st.done[next++] = true;  // taken; its row arrives later
      ++took[source];
    } else {
      ++finished;
    }
    MPI_Send(&point, 1, MPI_LONG_LONG, source, kPoint, MPI_COMM_WORLD);
  }
  std::cerr << "serve (MPI): points run per rank:";
  for (int r = 1; r < size; ++r) std::cerr << " " << r << ":" << took[r];
  std::cerr << "\n";
  for (std::size_t p = 0; p < g.points; ++p)
    if (g.report) g.report(p, st.rows[p]);
  return std::move(st.rows);
}

void work(const ServeGrid& g) {
  for (;;) {
    MPI_Send(nullptr, 0, MPI_CHAR, 0, kAsk, MPI_COMM_WORLD);
    long long point = -1;
    MPI_Recv(&point, 1, MPI_LONG_LONG, 0, kPoint, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (point < 0) return;
    const std::string msg = std::to_string(point) + "\n" + g.run(static_cast<std::size_t>(point)).dump();
    MPI_Send(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, 0, kRow, MPI_COMM_WORLD);
  }
}

}  // namespace

bool run_grid_mpi(const ServeGrid& g, std::vector<nlohmann::json>& rows) {
  int rank = 0, size = 1;
  if (!mpi_start(rank, size)) return false;  // one process: the serial grid
  mpi_run("kvsim serve", rank, [&] {
    if (rank == 0)
      rows = coordinate(g, size);
    else
      work(g);
  });
  return true;
}

}  // namespace kvsim::cli
