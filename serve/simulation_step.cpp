// One instance's steps under continuous batching with chunked prefill: each step runs one decode
// token of every sequence past its prefill, then fills the rest of the token budget with prefill
// chunks of ready requests in admission order (Sarathi-style). A step costs the decode step's time
// (or the prefill intercept when nothing decodes) plus each chunk's new tokens and attention.
#include <algorithm>

#include "serve/simulation.h"

namespace kvsim::serve::detail {

// The cost of the next `tokens` of s's prefill work: b*l + c*((s+l)^2 - s^2) per piece.
double Simulation::chunk_ms(const Seq& s, std::int64_t tokens) const {
  double ms = 0;
  std::size_t seg = s.seg;
  std::int64_t done = s.seg_done;
  while (tokens > 0 && seg < s.work.size()) {
    const auto [start, len] = s.work[seg];
    const std::int64_t take = std::min(tokens, len - done);
    ms += costs_.prefill.recompute_ms(start + done, take);
    tokens -= take;
    done += take;
    if (done == len) {
      ++seg;
      done = 0;
    }
  }
  return ms;
}

void Simulation::advance_chunk(Seq& s) {
  std::int64_t tokens = s.chunk;
  s.prefill_left -= tokens;
  while (tokens > 0 && s.seg < s.work.size()) {
    const std::int64_t take = std::min(tokens, s.work[s.seg].second - s.seg_done);
    tokens -= take;
    s.seg_done += take;
    if (s.seg_done == s.work[s.seg].second) {
      ++s.seg;
      s.seg_done = 0;
    }
  }
}

void Simulation::start_step(std::size_t i) {
  Instance& in = inst_[i];
  if (in.busy) return;
  while (!in.waiting.empty() && static_cast<int>(in.running.size()) < o_.max_seqs && admit(in, in.waiting.front()))
    in.waiting.pop_front();
  const double now = q_.now();
  std::int64_t batch = 0;
  double ctx = 0;
  for (Seq& s : in.running) {
    s.chunk = 0;
    s.decoding = s.prefill_left == 0 && s.generated < s.output;
    if (s.decoding) {
      ++batch;
      ctx += static_cast<double>(s.ctx);
    }
  }
  std::int64_t budget = o_.max_batch_tokens - batch;
  double ms = batch > 0 ? o_.profile.decode.step_ms(o_.kv_ratio * ctx, batch) : o_.profile.prefill.a_ms;
  double next_ready = kInf;
  bool chunks = false;
  for (Seq& s : in.running) {
    if (s.prefill_left == 0) continue;
    if (s.ready_ms > now) {
      next_ready = std::min(next_ready, s.ready_ms);
      continue;
    }
    if (budget <= 0) continue;
    s.chunk = std::min(budget, s.prefill_left);
    budget -= s.chunk;
    ms += chunk_ms(s, s.chunk);
    chunks = true;
  }
  if (batch == 0 && !chunks) {  // idle until a load lands or a request arrives
    if (next_ready < kInf) q_.schedule(next_ready, kWake, [this, i] { start_step(i); });
    return;
  }
  in.busy = true;
  ++res_.steps;
  res_.load.busy_ms += ms;
  q_.schedule(now + ms, kStepEnd, [this, i, ms] { end_step(i, ms); });
}

void Simulation::end_step(std::size_t i, double ms) {
  Instance& in = inst_[i];
  const double now = q_.now();
  std::int64_t decoded = 0;
  for (Seq& s : in.running) {
    if (s.decoding) {
      ++s.generated;
      ++s.ctx;
      ++decoded;
      s.last_token_ms = now;
    } else if (s.chunk > 0) {
      advance_chunk(s);
      if (s.prefill_left == 0) finish_prefill(in, s);
    }
  }
  samples_.tbt.add(ms, decoded);
  res_.output_tokens += decoded;
  auto done =
      std::stable_partition(in.running.begin(), in.running.end(), [](const Seq& s) { return s.generated < s.output; });
  for (auto it = done; it != in.running.end(); ++it) finish(in, *it);
  in.running.erase(done, in.running.end());
  in.busy = false;
  start_step(i);
}

// The prefill's last chunk gives the first token; the request's new blocks join HBM's cache,
// held (pinned) until it finishes, and leave its reservation.
void Simulation::finish_prefill(Instance& in, Seq& s) {
  const double now = q_.now();
  s.generated = 1;
  s.last_token_ms = now;
  ++res_.output_tokens;
  samples_.ttft.add(now - arrival_ms(s.req));
  ttft_by_req_[static_cast<std::size_t>(s.req)] = now - arrival_ms(s.req);
  Tier& hbm = in.tiers[0];
  for (const std::int32_t b : s.fresh) {
    const double size = bytes(b);
    in.private_bytes -= size;
    if (!hbm.cache->cached(b)) {  // (another request may have brought it in meanwhile)
      hbm.cache->insert(b, tick());
      hbm.bytes += size;
    }
    if (hbm.cache->pin(b)) in.pinned_bytes += size;
  }
  s.fresh.clear();
}

void Simulation::finish(Instance& in, Seq& s) {
  const ServeRequest& r = trace_.requests[static_cast<std::size_t>(s.req)];
  for (const std::int32_t b : r.blocks)
    if (in.tiers[0].cache->unpin(b)) in.pinned_bytes -= bytes(b);
  in.private_bytes -= s.output_bytes;
  ++res_.completed;
  last_done_ms_ = std::max(last_done_ms_, q_.now());
}

}  // namespace kvsim::serve::detail
