// kvsim: one CLI, one subcommand per job.
#include <iostream>
#include <string>
#include <vector>

#include "cli/dispatch.h"
#include "core/heap_reuse.h"

int main(int argc, char** argv) {
  kvsim::keep_freed_memory_for_reuse();
  static const kvsim::cli::Subcommand commands[] = {
      {"trace", "inspect, validate and synthesize kvtrace HDF5 files", kvsim::cli::trace_command},
      {"sweep", "replay traces against many (policy, budget) configs in one pass", kvsim::cli::sweep_command},
      {"model", "inspect GGUF model files (metadata, tensors, dequantized rows)", kvsim::cli::model_command},
      {"capture", "record kvtrace files from a real GGUF model", kvsim::cli::capture_command},
      {"tasks", "generate capture requests (needle tasks, text windows)", kvsim::cli::tasks_command},
      {"verify", "run configs live on the model's compressed cache; agreement with a sweep",
       kvsim::cli::verify_command},
      {"calibrate", "fit the offline estimate of live KL (est_kl) to live runs of a calibration split",
       kvsim::cli::calibrate_command},
      {"agreement", "the offline/live agreement report from sweep and verify result files",
       kvsim::cli::agreement_command},
      {"train", "train a learned policy (foresight, sigmoid_gate, distillcache, rlkv) on captured traces",
       kvsim::cli::train_command},
      {"serve", "serving simulation of request traces: prefix caches, tiers, batching, compression",
       kvsim::cli::serve_command},
      {"report", "plots of result files (sweep, verify, agreement, serve, traces) in one HTML page",
       kvsim::cli::report_command},
  };
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "--version") {
    std::cout << "kvsim " << KVSIM_VERSION << "\n";
    return 0;
  }
  return kvsim::cli::dispatch("kvsim", commands, args);
}
