#include "capture/capture_driver.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <thread>
#include <unistd.h>

#include "model/gguf.h"
#include "model/engine.h"
#include "prompts/prompt.h"
#include "prompts/chunk_alone.h"
#include "prompts/repeat_pass.h"
#include "capture/query_spill.h"
#include "model/tokenizer.h"
#include "core/error.h"
#include "core/half.h"
#include "traces/trace_schema.h"
#include "traces/trace_writer.h"

namespace kvsim {

namespace {

// One background thread writes finished requests, so the model never waits on HDF5; the queue
// holds at most one request, which bounds the memory in flight.
class WriterThread {
 public:
  WriterThread() : thread_([this] { run(); }) {}
  ~WriterThread() { finish(); }
  void submit(std::function<void()> job) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return jobs_.empty() || failed_; });
    rethrow_locked();
    jobs_.push_back(std::move(job));
    cv_.notify_all();
  }
  void finish() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (done_) return;
      done_ = true;
      cv_.notify_all();
    }
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    rethrow_locked();
  }

 private:
  void rethrow_locked() {
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !jobs_.empty() || done_; });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
      }
      try {
        job();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
        failed_ = true;
      }
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.pop_front();
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool done_ = false, failed_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

// Top-k log-probs and logsumexp of one position's next-token logits.
void record_reference(ReferenceDistribution& ref, std::int64_t index, const float* logits, std::int64_t vocab) {
  const auto V = static_cast<std::size_t>(vocab);
  const float mx = *std::max_element(logits, logits + V);
  double sum = 0;
  for (std::size_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const double lse = mx + std::log(sum);
  std::vector<std::int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  const auto k = std::min<std::size_t>(static_cast<std::size_t>(ref.topk), V);
  std::partial_sort(
      order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
      [&](std::int32_t a, std::int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  ref.index.push_back(static_cast<std::int32_t>(index));
  ref.lse.push_back(static_cast<float>(lse));
  for (std::size_t j = 0; j < k; ++j) {
    ref.topk_ids.push_back(order[j]);
    ref.topk_logp.push_back(static_cast<float>(logits[order[j]] - lse));
  }
  ++ref.rows;
}

// The directory the trace goes to must exist and be writable before minutes of compute.
void check_output_path(const std::string& out, bool overwrite) {
  namespace fs = std::filesystem;
  if (!overwrite && fs::exists(out))
    throw Error(out + ": file exists; refusing to overwrite it (pass --force to replace)");
  if (fs::is_directory(out)) throw Error(out + ": is a directory, expected a trace file path");
  const fs::path dir = fs::path(out).has_parent_path() ? fs::path(out).parent_path() : fs::path(".");
  if (!fs::is_directory(dir)) throw Error(out + ": output directory '" + dir.string() + "' does not exist");
  if (access(dir.c_str(), W_OK) != 0) throw Error(out + ": output directory '" + dir.string() + "' is not writable");
}

// A digest of the requests (FNV-1a over every field), so --resume refuses another request list.
std::string requests_digest(const std::vector<CaptureRequest>& requests) {
  std::uint64_t h = 1469598103934665603ull;
  auto add = [&](const std::string& s) {
    for (const unsigned char c : s + '\x1f') h = (h ^ c) * 1099511628211ull;
  };
  for (const CaptureRequest& r : requests) {
    for (const std::string* f : {&r.id, &r.system, &r.context, &r.question, &r.answer, &r.task, &r.expected}) add(*f);
    for (const RequestChunk& c : r.chunks) add(c.id + '\x1e' + c.text);  // the same text cut otherwise differs
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::to_string(requests.size()) + " requests, fnv1a " + hex;
}

}  // namespace

namespace {

// The capture's configuration as the trace records it (a resumed capture must match it).
// A chunked prompt's chunks computed alone, keys moved to their positions, rows in prompt order.
ChunkStateRecord chunk_state_record(ChunkAlone& alone, const Prompt& p) {
  ChunkStateRecord rec;
  for (const ChunkSpan& span : p.chunks) {
    const ChunkAlone::Rows rows = alone.moved(p, span);
    const std::int64_t n = span.end - span.begin;
    rec.chunks.push_back({span.id, span.begin, span.end, rec.rows, rec.rows + n});
    rec.rows += n;
    rec.k.resize(rows.k.size());
    rec.v.resize(rows.v.size());
    for (std::size_t l = 0; l < rows.k.size(); ++l) {
      const std::size_t heads = rows.k[l].size(), d = rows.k[l][0].size() / static_cast<std::size_t>(n);
      for (std::int64_t t = 0; t < n; ++t)  // [head][token, d] -> [token, head, d]
        for (std::size_t h = 0; h < heads; ++h) {
          const auto at = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t) * d);
          rec.k[l].insert(rec.k[l].end(), rows.k[l][h].begin() + at,
                          rows.k[l][h].begin() + at + static_cast<std::ptrdiff_t>(d));
          rec.v[l].insert(rec.v[l].end(), rows.v[l][h].begin() + at,
                          rows.v[l][h].begin() + at + static_cast<std::ptrdiff_t>(d));
        }
    }
  }
  return rec;
}

std::string capture_config(const CaptureOptions& opts, const Engine& model,
                           const std::vector<CaptureRequest>& requests) {
  return nlohmann::json{{"tool", "kvsim capture"},
                        {"model", opts.model_path},
                        {"max_new", opts.max_new},
                        {"min_new", opts.min_new},
                        {"ref_topk", opts.ref_topk},
                        {"queries", opts.all_queries ? "all" : "eval"},
                        {"query_window", opts.query_window},
                        {"prefill_chunk", opts.prefill_chunk},
                        {"weights", weight_format_name(opts.weights)},
                        {"repeat_pass", opts.repeat_pass},
                        {"chunk_states", opts.chunk_states},
                        {"device", model.device()},
                        {"requests", requests_digest(requests)}}
      .dump();
}

// A finished request's header: its tokens and segments (taken from the prompt, answer included),
// positions 0..T-1, the kept queries from first_q on, and the reference rows.
RequestHeader request_header(const CaptureRequest& r, Prompt p, std::int64_t n_prompt, std::int64_t generated,
                             std::int64_t first_q, const ReferenceDistribution& ref) {
  const auto T = static_cast<std::int64_t>(p.tokens.size());
  RequestHeader h;
  h.id = r.id;
  h.task = r.task;
  h.answer = r.answer.empty() ? r.expected : r.answer;
  h.positions.resize(static_cast<std::size_t>(T));
  std::iota(h.positions.begin(), h.positions.end(), 0);
  for (std::int64_t i = first_q; i < T; ++i) h.q_index.push_back(static_cast<std::int32_t>(i));
  h.tokens = std::move(p.tokens);
  h.segments = std::move(p.segments);
  h.n_prompt = n_prompt;
  h.n_generated = generated;
  h.question_start = p.question_start;
  h.needle_start = p.needle_start;
  h.needle_end = p.needle_end;
  h.ref_rows = ref.rows;
  h.ref_topk = ref.rows > 0 ? ref.topk : 0;
  return h;
}

// Layer l of the engine's cache as the trace stores it: f16 K and V, [T, d] per head to [T, Hkv, d].
std::pair<std::vector<std::uint16_t>, std::vector<std::uint16_t>> layer_halves(const Engine& model, int l,
                                                                               std::int64_t T) {
  const auto& entries = model.cache().layers[static_cast<std::size_t>(l)];
  const auto d = static_cast<std::size_t>(model.config().head_dim), Hkv = entries.size();
  std::vector<std::uint16_t> K(static_cast<std::size_t>(T) * Hkv * d), V(K.size());
  for (std::size_t kv = 0; kv < Hkv; ++kv)
    for (std::size_t t = 0; t < static_cast<std::size_t>(T); ++t) {
      floats_to_halves(entries[kv].k.data() + t * d, K.data() + (t * Hkv + kv) * d, d);
      floats_to_halves(entries[kv].v.data() + t * d, V.data() + (t * Hkv + kv) * d, d);
    }
  return {std::move(K), std::move(V)};
}

// Tokens a request will hold: its prompt and its answer (`answer` tokens, or max_new generated when
// it has none, answer < 0); refused over the model's context.
std::int64_t planned_tokens(const std::string& where, std::int64_t n_prompt, std::int64_t answer, int max_new,
                            std::int64_t ctx_len) {
  const std::int64_t planned = n_prompt + (answer < 0 ? max_new : answer);
  if (planned > ctx_len)
    throw Error(where + ": prompt + answer is " + std::to_string(planned) + " tokens, over the model's context of " +
                std::to_string(ctx_len));
  return planned;
}

// The tokens after the prompt: teacher-forced on `answer` when given, else greedy until EOS or
// max_new (no end before min_new), each step's reference row recorded and its queries through `hook`. Returns how many.
std::int64_t run_answer(Engine& model, const Tokenizer& tok, const std::vector<std::int32_t>* answer, int max_new,
                        int min_new, const LayerHook& hook, Prompt& p, std::vector<float>& last_logits,
                        ReferenceDistribution& ref, std::int64_t& processed) {
  std::int64_t generated = 0;
  for (std::int64_t step = 0;; ++step) {
    std::int32_t next;
    if (answer) {
      if (step >= static_cast<std::int64_t>(answer->size())) break;
      next = (*answer)[static_cast<std::size_t>(step)];
    } else {
      if (step >= max_new) break;
      next = tok.greedy_next(last_logits, step >= min_new);
    }
    p.tokens.push_back(next);
    p.segments.push_back(static_cast<std::int8_t>(Segment::Generated));
    ++generated;
    const auto at = static_cast<std::int64_t>(p.tokens.size() - 1);
    last_logits = model.step(next, hook);
    record_reference(ref, at, last_logits.data(), model.config().vocab);
    processed = at + 1;
    if (!answer && tok.is_eog(next)) break;
  }
  return generated;
}

}  // namespace

// The prompt in prefill passes: the question's reference rows from their logits, KVzip's pass
// once the cache holds exactly the context (the passes split at the question); returns the last
// prompt token's logits. `processed` follows the passes (the query hook reads it).
std::vector<float> prefill_prompt(Engine& model, const Tokenizer& tok, const Prompt& p, const CaptureOptions& opts,
                                  const LayerHook& hook, ReferenceDistribution& ref, RepeatPass& repeat,
                                  std::int64_t& processed) {
  const std::int64_t vocab = model.config().vocab;
  const auto n_prompt = static_cast<std::int64_t>(p.tokens.size());
  std::vector<float> last_logits;
  for (const auto& [s, e] : prefill_chunks(n_prompt, prompt_splits(p), opts.prefill_chunk)) {
    std::vector<std::int32_t> pos(static_cast<std::size_t>(e - s));
    std::iota(pos.begin(), pos.end(), static_cast<std::int32_t>(s));
    std::vector<std::int64_t> rows;
    for (std::int64_t i = std::max(s, p.question_start); i < e; ++i) rows.push_back(i - s);
    const auto logits = model.forward(
        std::span(p.tokens).subspan(static_cast<std::size_t>(s), static_cast<std::size_t>(e - s)), pos, rows, hook);
    for (std::size_t r2 = 0; r2 < rows.size(); ++r2)
      record_reference(ref, s + rows[r2], logits.data() + r2 * static_cast<std::size_t>(vocab), vocab);
    if (e == n_prompt && !rows.empty()) last_logits.assign(logits.end() - vocab, logits.end());
    processed = e;
    if (opts.repeat_pass && e == context_span(p).second) repeat = run_repeat_pass(model, tok, p);
  }
  return last_logits;
}

CaptureSummary run_capture(const std::vector<CaptureRequest>& requests, const CaptureOptions& opts,
                           const EngineFactory& make) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string tmp = opts.out_path + ".partial";
  const bool resuming = opts.resume && std::filesystem::exists(tmp);
  // A capture that finished (the kill came after the rename) has nothing left to do.
  if (opts.resume && !resuming && std::filesystem::exists(opts.out_path)) return {};
  check_output_path(opts.out_path, opts.overwrite);
  const GgufFile gguf(opts.model_path);
  const Tokenizer tok(gguf);
  const std::unique_ptr<Engine> engine =
      make ? make(gguf) : make_engine(gguf, EngineOptions{opts.device, opts.weights});
  Engine& model = *engine;
  ChunkAlone alone(model, opts.prefill_chunk);  // chunks computed alone, kept across requests
  const ModelConfig& c = model.config();
  const std::int64_t ctx_len = gguf.get_int(c.arch + ".context_length", 1 << 30);
  const std::string default_system = default_system_prompt(gguf);

  ModelGeometry g = c;  // the model's own geometry, named
  g.name = gguf.has("general.name") ? gguf.get_string("general.name") : "unknown";
  CaptureInfo info{"kvsim 0.1.0", device_name(opts.device), utc_now(), 0, capture_config(opts, model, requests)};
  CaptureSummary summary;
  {
    TraceWriterOptions wo;
    wo.overwrite = true;
    wo.append = resuming;
    TraceWriter writer(tmp, g, info, wo);
    const std::set<std::string> done = writer.written_ids();  // resuming: these are in the file
    QuerySpill spill(tmp, c.n_layers, static_cast<std::int64_t>(c.n_q_heads) * c.head_dim);
    WriterThread io;
    for (const CaptureRequest& r : requests) {
      if (done.count(r.id)) continue;
      const std::string where = "request '" + r.id + "' (line " + std::to_string(r.line) + ")";
      Prompt p = build_prompt(tok, r, default_system);
      const auto n_prompt = static_cast<std::int64_t>(p.tokens.size());
      const std::vector<std::int32_t> answer = r.answer.empty() ? std::vector<std::int32_t>{} : tok.encode(r.answer);
      const std::int64_t planned =
          planned_tokens(where, n_prompt, r.answer.empty() ? -1 : std::ssize(answer), opts.max_new, ctx_len);

      // K/V come from the engine's cache (capture never compresses) once the request is done;
      // the kept queries go to the spill file as they are produced.
      model.reset();
      model.reserve(planned);
      spill.clear();
      const std::int64_t first_q =
          opts.all_queries ? 0 : std::max<std::int64_t>(0, p.question_start - opts.query_window);
      std::int64_t processed = 0;
      const std::int64_t q_row = static_cast<std::int64_t>(c.n_q_heads) * c.head_dim;
      auto hook = [&](const LayerActivations& a) {
        const std::int64_t skip = std::clamp<std::int64_t>(first_q - processed, 0, a.n);
        spill.append(a.layer, a.q.data() + skip * q_row, a.n - skip);
      };
      ReferenceDistribution ref;
      ref.topk = opts.ref_topk;
      RepeatPass repeat;
      if (opts.repeat_pass && context_span(p).first == context_span(p).second)
        throw Error(where + ": --repeat-pass needs a context to repeat, and this request has none");
      if (opts.chunk_states && p.chunks.empty())
        throw Error(where + ": --chunk-states needs chunked requests (field 'chunks'), and this request has none");
      std::vector<float> last_logits = prefill_prompt(model, tok, p, opts, hook, ref, repeat, processed);
      const std::int64_t generated = run_answer(model, tok, r.answer.empty() ? nullptr : &answer, opts.max_new,
                                                opts.min_new, hook, p, last_logits, ref, processed);
      const auto T = static_cast<std::int64_t>(p.tokens.size());
      const Prompt chunked = opts.chunk_states ? p : Prompt{};  // (p moves into the header)
      RequestHeader h = request_header(r, std::move(p), n_prompt, generated, first_q, ref);
      if (ref.rows == 0) ref.topk = 0;
      summary.tokens += T;
      ++summary.requests;
      // One job per layer, so at most a few layers of f16 buffers exist at a time; the engine's
      // cache is converted before submit, so the next request may reuse it while this one is
      // still being written.
      io.submit([&writer, h = std::move(h)] { writer.begin_request(h); });
      for (int l = 0; l < c.n_layers; ++l) {
        io.submit([&writer, l, kv = layer_halves(model, l, T), Q = spill.read_layer(l)] {
          writer.write_layer(l, kv.first, kv.second, Q);
        });
      }
      // After the layers took the engine's cache: computing chunks alone replaces it.
      ChunkStateRecord states = opts.chunk_states ? chunk_state_record(alone, chunked) : ChunkStateRecord{};
      io.submit([&writer, ref = std::move(ref), repeat = std::move(repeat), with = opts.repeat_pass,
                 states = std::move(states), with_states = opts.chunk_states] {
        writer.write_reference(ref);
        if (with) writer.write_repeat_pass(repeat);
        if (with_states) writer.write_chunk_states(states);
        writer.commit_request();
      });
    }
    io.finish();
    writer.close();
  }
  std::filesystem::rename(tmp, opts.out_path);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

}  // namespace kvsim
