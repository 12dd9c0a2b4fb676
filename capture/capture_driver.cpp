#include "capture/capture_driver.h"

#include <algorithm>
#include <chrono>
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
#include <thread>

#include "capture/gguf.h"
#include "capture/llama_model.h"
#include "capture/tokenizer.h"
#include "core/error.h"
#include "core/half.h"
#include "traces/trace_schema.h"
#include "traces/trace_writer.h"

namespace kvsim {

std::vector<CaptureRequest> read_capture_requests(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the requests file");
  std::vector<CaptureRequest> out;
  std::string line;
  std::int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(where + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object()) throw FormatError(where + ": expected a JSON object per line");
    auto text = [&](const char* key, bool required) -> std::string {
      if (!j.contains(key)) {
        if (required) throw FormatError(where + ": field '" + key + "' is missing");
        return "";
      }
      if (!j[key].is_string()) throw FormatError(where + ": field '" + key + "' must be a string");
      return j[key].get<std::string>();
    };
    CaptureRequest r;
    r.line = n;
    r.id = j.contains("id") ? (j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump()) : "r" + std::to_string(out.size());
    if (j.contains("text")) {
      r.context = text("text", true);
    } else {
      r.context = text("context", true);
      r.question = text("question", true);
    }
    r.system = text("system", false);
    r.answer = text("answer", false);
    r.task = text("task", false);
    if (j.contains("expected")) {
      const auto& e = j["expected"];
      if (!e.is_array() || !std::all_of(e.begin(), e.end(), [](const auto& x) { return x.is_string(); }))
        throw FormatError(where + ": field 'expected' must be an array of strings");
      r.expected = e.dump();
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) throw FormatError(path + ": no requests (expected one JSON object per line)");
  return out;
}

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

}  // namespace

CaptureSummary run_capture(const std::vector<CaptureRequest>& requests, const CaptureOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const GgufFile gguf(opts.model_path);
  const Tokenizer tok(gguf);
  LlamaModel model(gguf);
  const LlamaConfig& c = model.config();
  const std::int64_t ctx_len = gguf.get_int(c.arch + ".context_length", 1 << 30);

  ModelGeometry g;
  g.name = gguf.has("general.name") ? gguf.get_string("general.name") : "unknown";
  g.arch = c.arch;
  g.n_layers = c.n_layers;
  g.n_q_heads = c.n_head;
  g.n_kv_heads = c.n_head_kv;
  g.head_dim = c.head_dim;
  g.vocab = c.vocab;
  g.rope_theta = c.rope.theta;
  g.rope_type = c.rope.type;
  g.rope_dim = c.rope.rope_dim;
  nlohmann::json cfg = {{"tool", "kvsim capture"},        {"model", opts.model_path},
                        {"max_new", opts.max_new},        {"ref_topk", opts.ref_topk},
                        {"queries", opts.all_queries ? "all" : "eval"},
                        {"query_window", opts.query_window}, {"prefill_chunk", opts.prefill_chunk}};
  CaptureInfo info{"kvsim 0.1.0", "cpu", utc_now(), 0, cfg.dump()};
  if (!opts.overwrite && std::filesystem::exists(opts.out_path))
    throw Error(opts.out_path + ": file exists; refusing to overwrite it (pass --force to replace)");
  const std::string tmp = opts.out_path + ".partial";
  CaptureSummary summary;
  {
    TraceWriter writer(tmp, g, info, TraceWriterOptions{true, 0});
    WriterThread io;
    for (const CaptureRequest& r : requests) {
      const std::string where = "request '" + r.id + "' (line " + std::to_string(r.line) + ")";
      // Segments: each part tokenized on its own so its tokens are known; the model sees their
      // concatenation.
      const std::string sys = r.system.empty() ? "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
                                               : r.system;
      std::vector<std::int32_t> tokens;
      std::vector<std::int8_t> segments;
      auto add = [&](const std::string& text, Segment s) {
        for (auto id : tok.encode(text)) {
          tokens.push_back(id);
          segments.push_back(static_cast<std::int8_t>(s));
        }
      };
      add("<|im_start|>system\n" + sys + "<|im_end|>\n<|im_start|>user\n", Segment::System);
      const auto context_start = static_cast<std::int64_t>(tokens.size());
      add(r.context, Segment::Context);
      // The needle: the sentence of the context holding the first expected answer, as a token
      // span (byte-level BPE decodes token by token back to the exact bytes).
      std::int64_t needle_start = -1, needle_end = -1;
      if (!r.expected.empty()) {
        const auto expected = nlohmann::json::parse(r.expected);
        const std::size_t at = expected.empty() ? std::string::npos : r.context.find(expected[0].get<std::string>());
        if (at != std::string::npos) {
          const std::size_t dot = r.context.rfind(". ", at);
          const std::size_t begin = dot == std::string::npos ? 0 : dot + 2;
          const std::size_t end_dot = r.context.find('.', at);
          const std::size_t end = end_dot == std::string::npos ? r.context.size() : end_dot + 1;
          std::size_t bytes = 0;
          for (std::int64_t t = context_start; t < static_cast<std::int64_t>(tokens.size()); ++t) {
            const std::size_t next = bytes + tok.decode({tokens[static_cast<std::size_t>(t)]}).size();
            if (needle_start < 0 && next > begin) needle_start = t;
            if (next >= end) {
              needle_end = t + 1;
              break;
            }
            bytes = next;
          }
          if (needle_start < 0 || needle_end <= needle_start) needle_start = needle_end = -1;
        }
      }
      const auto question_start = static_cast<std::int64_t>(tokens.size());
      add((r.question.empty() ? "" : "\n\n" + r.question) + "<|im_end|>\n<|im_start|>assistant\n", Segment::Question);
      const auto n_prompt = static_cast<std::int64_t>(tokens.size());
      std::vector<std::int32_t> answer = r.answer.empty() ? std::vector<std::int32_t>{} : tok.encode(r.answer);
      const std::int64_t planned = n_prompt + (r.answer.empty() ? opts.max_new : static_cast<std::int64_t>(answer.size()));
      if (planned > ctx_len)
        throw Error(where + ": prompt + answer is " + std::to_string(planned) + " tokens, over the model's context of " +
                    std::to_string(ctx_len));

      // Per-layer f16 buffers: K/V of every token, Q of the kept rows.
      model.reset();
      const std::size_t q_row = static_cast<std::size_t>(c.n_head) * c.head_dim;
      std::vector<std::vector<std::uint16_t>> K(static_cast<std::size_t>(c.n_layers)), V(K.size()), Q(K.size());
      std::vector<std::int32_t> q_index;
      const std::int64_t first_q = opts.all_queries ? 0 : std::max<std::int64_t>(0, question_start - opts.query_window);
      std::int64_t processed = 0;
      auto hook = [&](const LayerActivations& a) {
        auto& k = K[static_cast<std::size_t>(a.layer)];
        auto& v = V[static_cast<std::size_t>(a.layer)];
        auto& q = Q[static_cast<std::size_t>(a.layer)];
        const std::size_t k0 = k.size();
        k.resize(k0 + a.k.size());
        v.resize(k0 + a.v.size());
        floats_to_halves(a.k.data(), k.data() + k0, a.k.size());
        floats_to_halves(a.v.data(), v.data() + k0, a.v.size());
        for (std::int64_t i = 0; i < a.n; ++i) {
          if (processed + i < first_q) continue;
          const std::size_t q0 = q.size();
          q.resize(q0 + q_row);
          floats_to_halves(a.q.data() + static_cast<std::size_t>(i) * q_row, q.data() + q0, q_row);
        }
      };
      ReferenceDistribution ref;
      ref.topk = opts.ref_topk;
      auto record_ref = [&](std::int64_t index, const float* logits) {
        const auto V_ = static_cast<std::size_t>(c.vocab);
        const float mx = *std::max_element(logits, logits + V_);
        double sum = 0;
        for (std::size_t i = 0; i < V_; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
        const double lse = mx + std::log(sum);
        std::vector<std::int32_t> order(V_);
        std::iota(order.begin(), order.end(), 0);
        const auto k = std::min<std::size_t>(static_cast<std::size_t>(opts.ref_topk), V_);
        std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                          [&](std::int32_t a, std::int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
        ref.index.push_back(static_cast<std::int32_t>(index));
        ref.lse.push_back(static_cast<float>(lse));
        for (std::size_t j = 0; j < k; ++j) {
          ref.topk_ids.push_back(order[j]);
          ref.topk_logp.push_back(static_cast<float>(logits[order[j]] - lse));
        }
        ++ref.rows;
      };
      // Prefill in chunks; the reference rows of the question come from the prefill logits.
      std::vector<float> last_logits;
      for (std::int64_t s = 0; s < n_prompt; s += opts.prefill_chunk) {
        const std::int64_t e = std::min<std::int64_t>(n_prompt, s + opts.prefill_chunk);
        std::vector<std::int32_t> pos(static_cast<std::size_t>(e - s));
        std::iota(pos.begin(), pos.end(), static_cast<std::int32_t>(s));
        std::vector<std::int64_t> rows;
        for (std::int64_t i = std::max(s, question_start); i < e; ++i) rows.push_back(i - s);
        const auto logits = model.forward(std::span(tokens).subspan(static_cast<std::size_t>(s), static_cast<std::size_t>(e - s)),
                                          pos, rows, hook);
        for (std::size_t r2 = 0; r2 < rows.size(); ++r2)
          record_ref(s + rows[r2], logits.data() + r2 * static_cast<std::size_t>(c.vocab));
        if (e == n_prompt && !rows.empty())
          last_logits.assign(logits.end() - c.vocab, logits.end());
        processed = e;
      }
      // Answer: teacher-forced on the given answer, else greedy until EOS or max_new.
      std::int64_t generated = 0;
      for (std::int64_t step = 0;; ++step) {
        std::int32_t next;
        if (!r.answer.empty()) {
          if (step >= static_cast<std::int64_t>(answer.size())) break;
          next = answer[static_cast<std::size_t>(step)];
        } else {
          if (step >= opts.max_new) break;
          next = static_cast<std::int32_t>(std::max_element(last_logits.begin(), last_logits.end()) - last_logits.begin());
        }
        tokens.push_back(next);
        segments.push_back(static_cast<std::int8_t>(Segment::Generated));
        ++generated;
        const auto p = static_cast<std::int64_t>(tokens.size() - 1);
        last_logits = model.step(next, hook);
        record_ref(p, last_logits.data());
        processed = p + 1;
        if (r.answer.empty() && next == tok.eos()) break;
      }
      const auto T = static_cast<std::int64_t>(tokens.size());
      for (std::int64_t i = first_q; i < T; ++i) q_index.push_back(static_cast<std::int32_t>(i));

      RequestHeader h;
      h.id = r.id;
      h.task = r.task;
      h.answer = r.answer.empty() ? r.expected : r.answer;
      h.tokens = tokens;
      h.positions.resize(static_cast<std::size_t>(T));
      std::iota(h.positions.begin(), h.positions.end(), 0);
      h.segments = segments;
      h.q_index = q_index;
      h.n_prompt = n_prompt;
      h.n_generated = generated;
      h.question_start = question_start;
      h.needle_start = needle_start;
      h.needle_end = needle_end;
      h.ref_rows = ref.rows;
      h.ref_topk = ref.rows > 0 ? ref.topk : 0;
      if (ref.rows == 0) ref.topk = 0;
      summary.tokens += T;
      ++summary.requests;
      io.submit([&writer, h = std::move(h), K = std::move(K), V = std::move(V), Q = std::move(Q),
                 ref = std::move(ref)]() {
        writer.begin_request(h);
        for (std::size_t l = 0; l < K.size(); ++l) writer.write_layer(static_cast<int>(l), K[l], V[l], Q[l]);
        writer.write_reference(ref);
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
