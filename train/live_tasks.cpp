#include "train/live_tasks.h"

#include "prompts/request_file.h"
#include "core/error.h"
#include "core/fingerprint.h"
#include "model/tokenizer.h"

namespace kvsim::train {

const CaptureRequest& LiveTasks::task(const TrainingSet& set, int request) const {
  return tasks.at(set.provenance.requests.at(static_cast<std::size_t>(request)).id);
}

LiveTasks open_live_tasks(const std::string& who, const TrainingSet& set, const std::vector<int>& requests,
                          const std::string& model, const std::string& tasks, VerifyOptions vo) {
  const ModelGeometry& g = set.geometry;
  LiveTasks out;
  out.gguf = std::make_unique<GgufFile>(model);
  vo.allow_training_requests = true;  // a trainer runs on its own requests
  out.verifier = std::make_unique<LiveVerifier>(*out.gguf, vo);
  const ModelGeometry lg = out.verifier->geometry();
  if (!same_kv_shape(lg, g))
    throw Error(model + ": a model of " + kv_shape(lg) + "; the traces were captured from " + g.name + " (" +
                kv_shape(g) + ")");
  for (CaptureRequest& r : read_capture_requests(tasks)) out.tasks.emplace(r.id, std::move(r));
  const Tokenizer tok(*out.gguf);
  const std::string system = default_system_prompt(*out.gguf);
  for (int r : requests) {
    const learned::TrainedRequest& req = set.provenance.requests.at(static_cast<std::size_t>(r));
    const auto it = out.tasks.find(req.id);
    if (it == out.tasks.end())
      throw Error(who + ": " + tasks + " has no task '" + req.id +
                  "' (a request of the traces); give the task file the " + "traces were captured from");
    if (prompt_fingerprint(build_prompt(tok, it->second, system).tokens) != req.prompt)
      throw Error(who + ": " + tasks + ": task '" + req.id + "' (line " + std::to_string(it->second.line) +
                  ") tokenizes to another prompt than the trace's request of that id; give the task file the traces "
                  "were captured from");
  }
  return out;
}

VerifyOptions reward_verify_options(ReplayMode mode, int max_new, int min_new, BudgetRule rule) {
  VerifyOptions vo;
  vo.mode = mode;
  vo.max_new = max_new;
  vo.min_new = min_new;
  vo.budget_rule = rule;
  vo.free_run = false;
  return vo;
}

}  // namespace kvsim::train
