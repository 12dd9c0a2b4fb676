#pragma once
// `kvsim sweep` under mpirun (docs/scale_out.md): available when kvsim was built with MPI
// (KVSIM_MPI=AUTO finds OpenMPI).
#include <iosfwd>
#include <vector>

#include "sim/sweep.h"

namespace kvsim::cli {

// Runs the sweep over the MPI ranks: rank 0 hands out requests and merges, the others sweep. Returns
// false (having done nothing) when there is a single rank; rank 0 returns true with the summary;
// the other ranks exit when done.
bool run_sweep_mpi(const SweepSpec& spec, std::vector<SweepSummaryRow>& rows, std::ostream& log);

}  // namespace kvsim::cli
