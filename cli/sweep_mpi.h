#pragma once
// `kvsim sweep` under mpirun (docs/scale_out.md): available when kvsim was built with MPI
// (KVSIM_MPI=AUTO finds OpenMPI).
#include <functional>
#include <iosfwd>
#include <vector>

#include "sim/sweep.h"

namespace kvsim::cli {

// Whether this process was started by an MPI launcher (mpirun sets these variables).
bool mpi_launched();
// Starts MPI (once) and gives this process's rank and the world's size; false, with MPI finalised,
// when there is a single rank (the command then runs as usual).
bool mpi_start(int& rank, int& size);
// Runs this rank's part: an exception stops every rank with its message (the others would wait for
// this one forever). Finalises MPI; ranks other than 0 then exit, since only rank 0 reports.
void mpi_run(const char* command, int rank, const std::function<void()>& body);
// Runs the sweep over the MPI ranks: rank 0 hands out requests and merges, the others sweep. Returns
// false (having done nothing) when there is a single rank; rank 0 returns true with the summary;
// the other ranks exit when done.
bool run_sweep_mpi(const SweepSpec& spec, std::vector<SweepSummaryRow>& rows, std::ostream& log);

}  // namespace kvsim::cli
