#include "kvcache/plan_apply.h"

#include <algorithm>

#include "core/error.h"

namespace kvsim::kvcache {

LayerIndex LayerIndex::prefix(int entries, std::int64_t n) {
  LayerIndex out;
  std::vector<std::int32_t> all(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) all[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
  out.tokens.assign(static_cast<std::size_t>(entries), all);
  out.encoding.assign(static_cast<std::size_t>(entries), HeadPlan{});
  out.listed = false;
  return out;
}

std::int64_t LayerIndex::rows() const {
  std::int64_t n = 0;
  for (const auto& t : tokens) n += static_cast<std::int64_t>(t.size());
  return n;
}

std::vector<std::int64_t> LayerIndex::sizes() const {
  std::vector<std::int64_t> out;
  for (const auto& t : tokens) out.push_back(static_cast<std::int64_t>(t.size()));
  return out;
}

namespace {

// The tokens of `held` a head plan over them keeps.
std::vector<std::int32_t> kept_tokens(const HeadPlan& hp, const std::vector<std::int32_t>& held) {
  std::vector<std::int32_t> kept;
  for (std::size_t m = 0; m < hp.codec.size(); ++m)
    if (hp.codec[m] != TokenCodec::Drop) kept.push_back(held[m]);
  return kept;
}

}  // namespace

bool check_plan(const ReplayConfig& cfg, const LayerPlan& plan, const std::vector<std::int64_t>& cached,
                const ModelGeometry& g) {
  const int Hkv = static_cast<int>(cached.size()), Hq = g.n_q_heads;
  const bool per_query_head = static_cast<int>(plan.heads.size()) == Hq && Hq != Hkv;
  if (static_cast<int>(plan.heads.size()) != Hkv && !per_query_head)
    throw Error("policy " + cfg.policy + ": plan has " + std::to_string(plan.heads.size()) + " heads, expected " +
                std::to_string(Hkv) + " (one per KV head) or " + std::to_string(Hq) + " (one per query head)");
  for (std::size_t e = 0; e < plan.heads.size(); ++e) {
    const HeadPlan& hp = plan.heads[e];
    if (per_query_head && needs_codec(hp))
      throw Error("policy " + cfg.policy + ": plans with encoded tokens must have one entry per KV head");
    const std::int64_t expect = cached[per_query_head ? e / static_cast<std::size_t>(g.group()) : e];
    if (static_cast<std::int64_t>(hp.codec.size()) != expect)
      throw Error("policy " + cfg.policy + ": plan covers " + std::to_string(hp.codec.size()) + " tokens, expected " +
                  std::to_string(expect));
    if (!hp.logit_bias.empty() && (hp.logit_bias.size() != hp.codec.size() || per_query_head || cfg.impl->codec()))
      throw Error("policy " + cfg.policy + ": plan has " + std::to_string(hp.logit_bias.size()) +
                  " logit biases; expected one per token it covers (" + std::to_string(hp.codec.size()) +
                  "), one entry per KV head and no codec");
    for (TokenCodec codec : hp.codec)
      if (!codec_supported(codec) && !cfg.impl->codec())
        throw Error("policy " + cfg.policy + ": plan encodes tokens as " + codec_name(codec) +
                    ", but the policy names no codec to store them (drop and fp16 are built in)");
  }
  return per_query_head;
}

bool needs_compression(const ReplayConfig& cfg, const ConfigBudget& b, const LayerSignals& s) {
  if (b.compress) return true;
  if (!cfg.impl->respects_budget()) return false;
  const std::int64_t n = s.n_tokens();
  const LayerPlan plan = cfg.impl->compress(s, Budget{n, cfg.budget});
  if (static_cast<int>(plan.heads.size()) != s.geometry().n_kv_heads) return true;
  for (const HeadPlan& hp : plan.heads)
    if (hp.kept() != n)
      throw Error("policy " + cfg.policy + ": dropped " + std::to_string(n - hp.kept()) +
                  " tokens with a budget that fits the whole cache (" + std::to_string(n) + " tokens)");
  return false;
}

void FallbackCount::add(const LayerPlan& plan) {
  for (const HeadPlan& hp : plan.heads) {
    ++plans;
    fallbacks += hp.position_fallback;
  }
}

void check_no_cuts_across_layers(const ReplayConfig& cfg, std::size_t cuts) {
  if (cuts > 1 && cfg.impl->selects_across_layers())
    throw Error("policy " + cfg.label() +
                " selects across layers, so it compresses once, at the compression point: --compress-every cuts are "
                "not supported (select per layer instead, e.g. kvzip:level=layer, or drop --compress-every)");
}

LayerPlan make_plan(const ReplayConfig& cfg, const ConfigBudget& b, const LayerSignals& s,
                    const std::vector<std::int64_t>& cached, bool one_entry_per_kv_head) {
  if (cfg.impl->selects_across_layers() && !b.across_layers)
    throw Error("policy " + cfg.label() + " selects across layers, but its selection was not made before layer " +
                std::to_string(s.layer()) + " (an engine bug)");
  LayerPlan plan = cfg.impl->compress(s, b.policy_budget());
  const bool per_query_head = check_plan(cfg, plan, cached, s.geometry());
  if (one_entry_per_kv_head && has_logit_bias(plan))
    throw Error("policy " + cfg.label() +
                ": a soft-gated plan (logit biases) is made once, at the compression point: "
                "run it without --compress-every and with --budget-semantics point");
  if (per_query_head && one_entry_per_kv_head)
    throw Error("policy " + cfg.policy +
                ": per-query-head plans are not supported with chunked compression or peak-matched budgets");
  return plan;
}

void apply_plan(const ReplayConfig& cfg, const LayerPlan& plan, const ModelGeometry& g, LayerIndex& cache,
                RowSink* rows) {
  const bool per_query_head = check_plan(cfg, plan, cache.sizes(), g);
  LayerIndex next;
  // Without a codec every kept token is fp16: left implicit, so decode-time edits stay cheap.
  next.listed = cfg.impl->codec() != nullptr;
  for (std::size_t e = 0; e < plan.heads.size(); ++e) {
    const auto& held = cache.tokens[per_query_head ? e / static_cast<std::size_t>(g.group()) : e];
    const HeadPlan& hp = plan.heads[e];
    next.tokens.push_back(kept_tokens(hp, held));
    next.encoding.push_back(next.listed ? hp : HeadPlan{});
  }
  if (!rows) refuse_logit_bias_offline(cfg, plan);
  if (rows) {
    rows->keep(next.tokens);
    for (std::size_t e = 0; e < plan.heads.size(); ++e) {
      const HeadPlan& hp = plan.heads[e];
      if (needs_codec(hp)) rows->encode(static_cast<int>(e), hp);
      if (hp.logit_bias.empty()) continue;
      std::vector<float> bias;
      for (std::size_t j = 0; j < hp.codec.size(); ++j)
        if (hp.codec[j] != TokenCodec::Drop) bias.push_back(hp.logit_bias[j]);
      rows->bias(static_cast<int>(e), std::move(bias));
    }
  }
  cache = std::move(next);
}

bool has_logit_bias(const LayerPlan& plan) {
  for (const HeadPlan& hp : plan.heads)
    if (!hp.logit_bias.empty()) return true;
  return false;
}

void refuse_logit_bias_offline(const ReplayConfig& cfg, const LayerPlan& plan) {
  if (has_logit_bias(plan))
    throw Error("policy " + cfg.label() +
                ": its plan biases attention logits (a soft-gated run), which offline replay "
                "does not score; run it live (kvsim verify, CPU engine). kvsim train sigmoid_gate reports its offline "
                "soft error");
}

LayerPlan drops_only(const LayerPlan& plan) {
  LayerPlan out;
  for (const HeadPlan& hp : plan.heads) {
    HeadPlan kept;
    kept.codec.reserve(hp.codec.size());
    for (const TokenCodec c : hp.codec)
      kept.codec.push_back(c == TokenCodec::Drop ? TokenCodec::Drop : TokenCodec::Fp16);
    out.heads.push_back(std::move(kept));
  }
  return out;
}

HeadPlan without_drops(const HeadPlan& plan) {
  HeadPlan out;
  // The codec data stays: it no longer lines up with the tokens (a codec refits them), but it
  // still says how its bases are charged (a shared calibration basis).
  out.data = plan.data;
  for (std::size_t m = 0; m < plan.codec.size(); ++m) {
    if (plan.codec[m] == TokenCodec::Drop) continue;
    out.codec.push_back(plan.codec[m]);
    if (!plan.rank.empty()) out.rank.push_back(plan.rank[m]);
  }
  return out;
}

bool over_budget(const LayerIndex& cache, std::int64_t tokens) {
  return std::any_of(cache.tokens.begin(), cache.tokens.end(),
                     [&](const std::vector<std::int32_t>& t) { return static_cast<std::int64_t>(t.size()) > tokens; });
}

bool apply_cut(const ReplayConfig& cfg, const ConfigBudget& b, const LayerSignals& s, LayerIndex& cache,
               RowSink* rows) {
  if (!over_budget(cache, b.tokens)) return false;
  const LayerPlan plan = make_plan(cfg, b, s, cache.sizes(), true);
  apply_plan(cfg, drops_only(plan), s.geometry(), cache, rows);
  return true;
}

LayerPlan widen_plan(const LayerPlan& plan, const LayerIndex& cache, std::int64_t n) {
  LayerPlan out;
  for (std::size_t e = 0; e < plan.heads.size(); ++e) {
    const HeadPlan& cut = plan.heads[e];
    HeadPlan full;
    full.codec.assign(static_cast<std::size_t>(n), TokenCodec::Drop);
    if (!cut.rank.empty()) full.rank.assign(static_cast<std::size_t>(n), 0);
    const auto& held = cache.tokens[e];
    for (std::size_t m = 0; m < held.size(); ++m) {
      full.codec[static_cast<std::size_t>(held[m])] = cut.codec[m];
      if (!cut.rank.empty()) full.rank[static_cast<std::size_t>(held[m])] = cut.rank[m];
    }
    out.heads.push_back(std::move(full));
  }
  return out;
}

void append_token(LayerIndex& cache, std::int32_t token) {
  for (std::size_t e = 0; e < cache.tokens.size(); ++e) {
    cache.tokens[e].push_back(token);
    if (!cache.listed) continue;
    HeadPlan& enc = cache.encoding[e];
    enc.codec.push_back(TokenCodec::Fp16);
    if (!enc.rank.empty()) enc.rank.push_back(0);
    enc.data.reset();  // codec data made for the old token set no longer lines up
  }
}

KeepBits keep_bits(const HeadPlan& plan, std::int64_t n) {
  if (static_cast<std::int64_t>(plan.codec.size()) < n)
    throw Error("keep_bits: a plan over fewer tokens than " + std::to_string(n));
  KeepBits out;
  out.words.assign(static_cast<std::size_t>((n + 63) / 64), 0);
  for (std::int64_t j = 0; j < n; ++j) {
    if (plan.codec[static_cast<std::size_t>(j)] == TokenCodec::Drop) continue;
    out.words[static_cast<std::size_t>(j / 64)] |= std::uint64_t{1} << (j % 64);
    ++out.kept;
  }
  return out;
}

namespace {

// Removes the encoding entry of held token m (the m-th non-Drop one).
void erase_encoding(HeadPlan& enc, std::size_t m, const std::string& label) {
  std::size_t at = 0, seen = 0;
  for (; at < enc.codec.size(); ++at)
    if (enc.codec[at] != TokenCodec::Drop && seen++ == m) break;
  if (at == enc.codec.size())
    throw Error("policy " + label + ": the cache's encoding lists " + std::to_string(seen) +
                " tokens, fewer than it holds (a kvsim bug)");
  enc.codec.erase(enc.codec.begin() + static_cast<std::ptrdiff_t>(at));
  if (!enc.rank.empty()) enc.rank.erase(enc.rank.begin() + static_cast<std::ptrdiff_t>(at));
  enc.data.reset();  // codec data made for the old token set no longer lines up
}

}  // namespace

void apply_evictions(const std::string& label, const std::vector<std::vector<std::int32_t>>& evict, std::int64_t step,
                     std::int64_t max_rows, LayerIndex& cache, RowSink* rows) {
  if (evict.size() != cache.tokens.size())
    throw Error("policy " + label + ": evicted from " + std::to_string(evict.size()) + " cache entries, expected " +
                std::to_string(cache.tokens.size()));
  for (std::size_t e = 0; e < evict.size(); ++e) {
    auto& held = cache.tokens[e];
    for (const std::int32_t j : evict[e]) {
      const auto it = std::lower_bound(held.begin(), held.end(), j);
      if (it == held.end() || *it != j)
        throw Error("policy " + label + ": evicted token " + std::to_string(j) + " that is not in the cache");
      if (cache.listed) erase_encoding(cache.encoding[e], static_cast<std::size_t>(it - held.begin()), label);
      held.erase(it);
    }
    if (rows) rows->evict(static_cast<int>(e), evict[e]);
    if (max_rows >= 0 && static_cast<std::int64_t>(held.size()) > max_rows)
      throw Error("policy " + label + ": cache holds " + std::to_string(held.size()) + " tokens after step " +
                  std::to_string(step) + ", over its budget of " + std::to_string(max_rows));
  }
}

void apply_retier(const std::string& label, const LayerPlan& next, int layer, std::int64_t step, const KvCodec& codec,
                  double entry_budget, int head_dim, LayerIndex& cache, RowSink* rows) {
  if (next.heads.size() != cache.tokens.size())
    throw Error("policy " + label + ": re-tier plan has " + std::to_string(next.heads.size()) + " heads, expected " +
                std::to_string(cache.tokens.size()));
  LayerIndex kept;
  kept.listed = true;
  for (std::size_t e = 0; e < next.heads.size(); ++e) {
    const HeadPlan& hp = next.heads[e];
    const auto& held = cache.tokens[e];
    if (hp.codec.size() != held.size())
      throw Error("policy " + label + ": re-tier plan covers " + std::to_string(hp.codec.size()) +
                  " tokens, expected " + std::to_string(held.size()));
    std::vector<std::int32_t> tokens = kept_tokens(hp, held);
    HeadPlan plan = without_drops(hp);
    const double bytes = codec.bytes(plan, head_dim);
    if (bytes > entry_budget + 1e-6)
      throw Error("policy " + label + ": re-tiered cache of layer " + std::to_string(layer) + ", KV head " +
                  std::to_string(e) + " holds " + std::to_string(bytes) + " bytes after step " + std::to_string(step) +
                  ", over its budget of " + std::to_string(entry_budget));
    kept.tokens.push_back(std::move(tokens));
    kept.encoding.push_back(std::move(plan));
  }
  if (rows) {
    rows->keep(kept.tokens);
    for (std::size_t e = 0; e < kept.encoding.size(); ++e) rows->encode(static_cast<int>(e), kept.encoding[e]);
  }
  cache = std::move(kept);
}

CodecBytes codec_bytes(const KvCodec& codec, const LayerIndex& cache, int head_dim) {
  const double fp16 = codec_token_bytes(TokenCodec::Fp16, head_dim);
  CodecBytes out;
  if (!cache.listed) return out;  // fp16 throughout
  for (std::size_t e = 0; e < cache.tokens.size(); ++e) {
    const HeadPlan& enc = cache.encoding[e];
    out.saving += static_cast<double>(cache.tokens[e].size()) * fp16 - codec.bytes(enc, head_dim);
    out.host += codec.host_bytes(enc, head_dim);
  }
  return out;
}

double layer_bytes(const LayerIndex& cache, const ConfigBudget& b, const KvCodec* codec, int head_dim) {
  const double saving = codec ? codec_bytes(*codec, cache, head_dim).saving : 0.0;
  return cache_bytes(b, static_cast<double>(cache.rows()), static_cast<std::int64_t>(cache.tokens.size()), 1) - saving;
}

}  // namespace kvsim::kvcache
