#pragma once
// The live engine's view of training requests: a trainer that runs the live model (distillcache's
// live reward, sigmoid_gate's live soft-to-hard gap) needs each request's task, and must know it
// is the request the trace recorded.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "prompts/prompt.h"
#include "model/gguf.h"
#include "train/training_set.h"
#include "verify/live_verifier.h"

namespace kvsim::train {

struct LiveTasks {
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<LiveVerifier> verifier;
  std::map<std::string, CaptureRequest> tasks;  // by request id
  const CaptureRequest& task(const TrainingSet& set, int request) const;
};

// What a live training reward runs: teacher-forced only (no free run, no task score) over
// max_new tokens with no end before min_new, in `mode` under `rule`.
VerifyOptions reward_verify_options(ReplayMode mode, int max_new, int min_new, BudgetRule rule = {});

// Opens `model` and reads `tasks`; checks the model's geometry against the traces' and that each
// of `requests` (indices into set.provenance.requests) has a task that tokenizes to the prompt
// the trace recorded. Throws naming `who`, the file and the request otherwise.
LiveTasks open_live_tasks(const std::string& who, const TrainingSet& set, const std::vector<int>& requests,
                          const std::string& model, const std::string& tasks, VerifyOptions vo);

}  // namespace kvsim::train
