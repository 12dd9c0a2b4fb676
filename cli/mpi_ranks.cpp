#include "cli/mpi_ranks.h"

#include <mpi.h>

#include <cstdlib>
#include <iostream>

namespace kvsim::cli {

bool mpi_launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

bool mpi_worker_process() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* r = std::getenv(v)) return std::string(r) != "0";
  return false;
}

bool mpi_start(int& rank, int& size) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init(nullptr, nullptr);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size >= 2) return true;
  MPI_Finalize();
  return false;
}

void mpi_run(const char* command, int rank, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    std::cerr << command << " (rank " << rank << "): error: " << e.what() << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  if (rank != 0) std::exit(0);
}

std::string mpi_receive_any(int& source, int& tag) {
  MPI_Status status;
  MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &status);
  int n = 0;
  MPI_Get_count(&status, MPI_CHAR, &n);
  std::string msg(static_cast<std::size_t>(n), '\0');
  MPI_Recv(msg.data(), n, MPI_CHAR, status.MPI_SOURCE, status.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  source = status.MPI_SOURCE;
  tag = status.MPI_TAG;
  return msg;
}

}  // namespace kvsim::cli
