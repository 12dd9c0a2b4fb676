#pragma once
// What the MPI commands share (`kvsim sweep`, `kvsim serve` grids under mpirun; docs/scale_out.md):
// built when kvsim was built with MPI (KVSIM_MPI=AUTO finds OpenMPI).
#include <functional>
#include <string>

namespace kvsim::cli {

// Whether this process was started by an MPI launcher (mpirun sets these variables).
bool mpi_launched();
// Whether it is a rank other than 0, from the launcher's variables (before MPI starts).
bool mpi_worker_process();
// Starts MPI (once) and gives this process's rank and the world's size; false, with MPI finalised,
// when there is a single rank (the command then runs as usual).
bool mpi_start(int& rank, int& size);
// Runs this rank's part: an exception stops every rank with its message (the others would wait for
// this one forever). Finalises MPI; ranks other than 0 then exit, since only rank 0 reports.
void mpi_run(const char* command, int rank, const std::function<void()>& body);
// Rank 0's side of a work queue: the next text message from any rank, with its sender and tag.
std::string mpi_receive_any(int& source, int& tag);

}  // namespace kvsim::cli
