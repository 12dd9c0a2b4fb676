#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "policies/codec.h"
#include "policies/scratch_matrix.h"
#include "sim/replay_internal.h"

namespace kvsim::replay_detail {

namespace {

// An encoded cache here is a listed kvcache::LayerIndex: per KV head the tokens held and their
// encoding (the policy's plan as made, with its codec data, at the compression point; Drop-free
// while decoding).
using kvcache::LayerIndex;

// Per query head, per evaluation row: the metrics of one config, zeroed.
CodedRows blank_rows(int hq, std::int64_t e) {
  CodedRows m;
  m.recall.assign(static_cast<std::size_t>(hq), std::vector<double>(static_cast<std::size_t>(e)));
  m.kl = m.err = m.recall;
  return m;
}

// Maximal runs of consecutive token indices in a head's (increasing) token list: the cache's
// slices that gather, and compare with the exact rows, as contiguous blocks. Kept sets are mostly
// long runs (every token, windows, segments), so this replaces per-element gathers.
struct Run {
  Eigen::Index at, token, len;  // cache slots [at, at + len) hold tokens [token, token + len)
};

std::vector<Run> runs_of(const std::vector<std::int32_t>& tokens) {
  std::vector<Run> runs;
  for (std::size_t m = 0; m < tokens.size(); ++m) {
    if (!runs.empty() && runs.back().token + runs.back().len == tokens[m])
      ++runs.back().len;
    else
      runs.push_back({static_cast<Eigen::Index>(m), tokens[m], 1});
  }
  return runs;
}

// The gaps between the runs within [0, end): the tokens a head does not hold.
std::vector<Run> gaps_of(const std::vector<Run>& runs, Eigen::Index end) {
  std::vector<Run> gaps;
  Eigen::Index next = 0;
  for (const Run& r : runs) {
    if (r.token > next) gaps.push_back({0, next, r.token - next});
    next = r.token + r.len;
  }
  if (end > next) gaps.push_back({0, next, end - next});
  return gaps;
}

struct ExpSums {
  double sum = 0, shift = 0;
  ExpSums& operator+=(const ExpSums& o) {
    sum += o.sum;
    shift += o.shift;
    return *this;
  }
};

// x[m] <- exp(x[m] - mx) over [0, n), returning the sum of the exps and, with an exact row, the
// sum of exp * (x - exact): one fused pass in SIMD packets (loads, exp, both sums, store), as
// this loop runs over every cached slot of every row of every encoded config. The float lanes
// are flushed into the double sums every kFlush elements, so long rows keep their precision.
template <bool WithShift>
ExpSums exp_shift_impl(float* x, const float* exact, Eigen::Index n, float mx) {
  namespace ei = Eigen::internal;
  using Packet = ei::packet_traits<float>::type;
  constexpr Eigen::Index W = ei::packet_traits<float>::size, kFlush = 512;
  ExpSums out;
  const Packet vm = ei::pset1<Packet>(mx);
  Eigen::Index m = 0;
  while (m + W <= n) {
    Packet sum = ei::pset1<Packet>(0.0f), shift = sum;
    const Eigen::Index stop = std::min(n, m + kFlush);
    for (; m + W <= stop; m += W) {
      const Packet xv = ei::ploadu<Packet>(x + m);
      const Packet z = ei::pexp(ei::psub(xv, vm));
      sum = ei::padd(sum, z);
      if constexpr (WithShift) shift = ei::pmadd(z, ei::psub(xv, ei::ploadu<Packet>(exact + m)), shift);
      ei::pstoreu(x + m, z);
    }
    out.sum += static_cast<double>(ei::predux(sum));
    if constexpr (WithShift) out.shift += static_cast<double>(ei::predux(shift));
  }
  for (; m < n; ++m) {
    const float z = std::exp(x[m] - mx);
    out.sum += z;
    if constexpr (WithShift) out.shift += static_cast<double>(z) * (x[m] - exact[m]);
    x[m] = z;
  }
  return out;
}

ExpSums exp_shift(float* x, const float* exact, Eigen::Index n, float mx) {
  return exact ? exp_shift_impl<true>(x, exact, n, mx) : exp_shift_impl<false>(x, nullptr, n, mx);
}

// The full attention mass on what evaluation row i sees: summed over the kept runs (and the tail
// up to `last`) or, when those are longer, one minus the mass on the gaps (a full row sums to one).
double seen_mass(const Mat& A, std::int64_t i, const std::vector<Run>& spans, bool kept, std::int64_t t0,
                 Eigen::Index last) {
  double mass = kept ? 0.0 : 1.0;
  for (const Run& s : spans) mass += (kept ? 1.0 : -1.0) * static_cast<double>(A.row(i).segment(s.token, s.len).sum());
  if (kept) mass += static_cast<double>(A.row(i).segment(t0, last - t0 + 1).sum());
  return mass;
}

// A row's exact logits for cache slots [c0, c0 + len) in slot order: the row itself when the chunk
// is one run, else gathered run by run into `gathered`, so the exps run over the whole chunk in
// packets however scattered the kept tokens are.
const float* slot_order(const float* exact, const std::vector<Run>& runs, std::size_t first_run, std::size_t end_run,
                        Eigen::Index c0, Eigen::Index len, std::vector<float>& gathered) {
  if (end_run - first_run <= 1) return exact + runs[first_run].token + (c0 - runs[first_run].at);
  for (std::size_t k = first_run; k < end_run; ++k) {
    const Eigen::Index a = std::max(runs[k].at, c0), b = std::min(runs[k].at + runs[k].len, c0 + len);
    std::copy_n(exact + runs[k].token + (a - runs[k].at), b - a, gathered.data() + (a - c0));
  }
  return gathered.data();
}

// A head's cached keys and values as its codec reads them back, into kh and vh (slot order), with
// their positions. The exact rows are gathered only when the codec reads them (a fully low-rank
// head is rebuilt from its coefficients: gathering 2 x nk x d floats would be overwritten unread).
// Returns the rank of factored values (coefficients in vh, basis in v_basis), or -1.
template <class Rows>
int read_back(const KvCodec& codec, const HeadPlan& plan, const LayerWork& w, const std::vector<Run>& runs,
              const Mat& K, const Mat& V, Rows& kh, Rows& vh, std::vector<std::int32_t>& positions,
              std::span<const float>& v_basis) {
  positions.resize(static_cast<std::size_t>(kh.rows()));
  const bool gather = codec.reads_rows(plan);
  for (const Run& r : runs) {
    if (gather) {
      kh.middleRows(r.at, r.len) = K.middleRows(r.token, r.len);
      vh.middleRows(r.at, r.len) = V.middleRows(r.token, r.len);
    }
    std::copy_n(w.h.positions.begin() + r.token, r.len, positions.begin() + r.at);
  }
  return codec.reconstruct_factored(plan, w.g, positions, {kh.data(), static_cast<std::size_t>(kh.size())},
                                    {vh.data(), static_cast<std::size_t>(vh.size())}, v_basis);
}

// The group of KV head kv's query heads stacked into qs, scaled: row r * rows + x is query head
// kv * G + r at evaluation row i0 + x.
template <class Rows>
void stack_queries(const LayerWork& w, int kv, std::int64_t i0, std::int64_t rows, float scale, Rows& qs) {
  const int G = w.g.group(), d = w.g.head_dim, Hq = w.g.n_q_heads;
  for (int r = 0; r < G; ++r)
    qs.middleRows(r * rows, rows) =
        StridedMap(w.q.data() + ((w.first_eval + i0) * Hq + kv * G + r) * d, rows, d, Eigen::OuterStride<>(Hq * d)) *
        scale;
}

// ||got * inv_sum - full|| / ||full|| (0 for a zero row).
template <class Row, class Full>
double relative_error(const Row& got, double inv_sum, const Full& full) {
  const double norm = full.squaredNorm();
  return norm > 0 ? std::sqrt((got * static_cast<float>(inv_sum) - full).squaredNorm() / norm) : 0.0;
}

// The compressed rows' softmax, online: per stacked row y the running max, the sums (with the
// logit shifts against the exact logits), and the accumulated values acc.row(y), rescaled
// whenever the max rises.
template <class Acc>
struct OnlineSoftmax {
  explicit OnlineSoftmax(Acc& a)
      : acc(a),
        mx(static_cast<std::size_t>(a.rows()), -std::numeric_limits<float>::infinity()),
        sums(static_cast<std::size_t>(a.rows())) {}
  // Row y's next n logits (exps in place), `exact` the full cache's logits for them or null.
  void add(std::int64_t y, float* row, const float* exact, Eigen::Index n) {
    const auto yy = static_cast<std::size_t>(y);
    const float m = Eigen::Map<const Eigen::ArrayXf>(row, n).maxCoeff();
    if (m > mx[yy]) {
      if (mx[yy] > -std::numeric_limits<float>::infinity()) {
        const double f = std::exp(static_cast<double>(mx[yy]) - m);
        sums[yy].sum *= f;
        sums[yy].shift *= f;
        acc.row(y) *= static_cast<float>(f);
      }
      mx[yy] = m;
    }
    sums[yy] += exp_shift(row, exact, n, mx[yy]);
  }
  // KL(compressed || full) of row y, all its logits added: the q-weighted logit shift plus the
  // full row's log normaliser lse_p minus this one's (the tail's logits agree).
  double kl(std::int64_t y, double lse_p) const {
    const auto yy = static_cast<std::size_t>(y);
    return sums[yy].shift / sums[yy].sum + lse_p - (mx[yy] + std::log(sums[yy].sum));
  }
  Acc& acc;
  std::vector<float> mx;
  std::vector<ExpSums> sums;
};

// Scores evaluation rows [i0, i1) on an encoded cache: every row attends over the heads' cached
// tokens as their codec reads them back, plus the exact tokens from t0 on (causally). Reconstructed
// keys change the logits, so no partial output can be shared with other configs: per KV head one
// GEMM for the logits and one for the output, the group's query heads stacked; the exact logits
// and the full rows' normalisers come from the shared pass. Per row: recall = full attention mass
// on what the row sees, KL(compressed || full) from the kept tokens' logit shifts and the two
// normalisers (no per-element logarithms; as eviction's -log recall when nothing is encoded), and
// the output's relative error.
void score_rows(const KvCodec& codec, const LayerIndex& cache, std::int64_t t0, std::int64_t i0, std::int64_t i1,
                const LayerWork& w, CodedRows& out) {
  const int Hkv = w.g.n_kv_heads, G = w.g.group(), d = w.g.head_dim, Hq = w.g.n_q_heads;
  const std::int64_t rows = i1 - i0, tail = w.T - t0;
  if (rows <= 0) return;
  if (w.logits.size() != static_cast<std::size_t>(Hq) || w.logits.front().rows() != w.E ||
      w.lse.size() != static_cast<std::size_t>(Hq))
    throw Error("replay: encoded configs need the shared logits");
  thread_local ScratchMatrix k_buf, v_buf, q_buf, s_buf, o_buf, c_buf;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<std::int32_t> positions;
  for (int kv = 0; kv < Hkv; ++kv) {
    const auto& held = cache.tokens[static_cast<std::size_t>(kv)];
    const HeadPlan& plan = cache.encoding[static_cast<std::size_t>(kv)];
    const auto nk = static_cast<Eigen::Index>(held.size());
    const std::vector<Run> runs = runs_of(held);
    const Mat& K = w.full_k[static_cast<std::size_t>(kv)];
    const Mat& V = w.full_v[static_cast<std::size_t>(kv)];
    auto kh = k_buf.get(nk, d);
    auto vh = v_buf.get(nk, d);
    std::span<const float> v_basis;
    const int v_rank = read_back(codec, plan, w, runs, K, V, kh, vh, positions, v_basis);
    const std::int64_t GR = G * rows;
    auto qs = q_buf.get(GR, d);
    stack_queries(w, kv, i0, rows, scale, qs);
    // The head holds nk of the t0 tokens before the tail; recall sums whichever side is shorter.
    const bool sum_kept = nk <= t0 - nk;
    const std::vector<Run> gaps = sum_kept ? std::vector<Run>{} : gaps_of(runs, t0);
    // The compressed rows' softmax runs over the cache in chunks of kChunk slots, online (a
    // running max, with the sums and the output rescaled when it rises), so a chunk's logits stay
    // in cache from their GEMM through the exps to the output GEMM. Values are accumulated in
    // the codec's own space: coefficients when it keeps them factored (then x U at the end).
    constexpr Eigen::Index kChunk = 512;
    const Eigen::Index width = v_rank >= 0 ? v_rank : d;
    const Eigen::Map<const ScratchMatrix::Mat> values(vh.data(), nk, width);
    auto acc = c_buf.get(GR, width);
    acc.setZero();
    OnlineSoftmax<decltype(acc)> sm(acc);
    std::size_t first_run = 0;
    std::vector<float> gathered(static_cast<std::size_t>(std::min(kChunk, nk)));
    for (Eigen::Index c0 = 0; c0 < nk; c0 += kChunk) {
      const Eigen::Index len = std::min(kChunk, nk - c0);
      auto sc = s_buf.get(GR, len);
      sc.noalias() = qs * kh.middleRows(c0, len).transpose();
      while (first_run < runs.size() && runs[first_run].at + runs[first_run].len <= c0) ++first_run;
      std::size_t end_run = first_run;
      while (end_run < runs.size() && runs[end_run].at < c0 + len) ++end_run;
      for (int r = 0; r < G; ++r) {
        const Mat& Lx = w.logits[static_cast<std::size_t>(kv * G + r)];
        for (std::int64_t x = 0; x < rows; ++x) {
          const std::int64_t y = r * rows + x;
          sm.add(y, sc.row(y).data(), slot_order(Lx.row(i0 + x).data(), runs, first_run, end_run, c0, len, gathered),
                 len);
        }
      }
      acc.noalias() += sc * values.middleRows(c0, len);
    }
    // The tail: exact logits from the shared pass, causal per row.
    auto st = s_buf.get(GR, tail);
    std::vector<double> inv_sum(static_cast<std::size_t>(GR));
    for (int r = 0; r < G; ++r) {
      const auto qi = static_cast<std::size_t>(kv * G + r);
      const Mat& Lx = w.logits[qi];
      const Mat& A = w.attn[qi];
      st.middleRows(r * rows, rows) = Lx.block(i0, t0, rows, tail);
      for (std::int64_t x = 0; x < rows; ++x) {
        const std::int64_t i = i0 + x, y = r * rows + x;
        const auto yy = static_cast<std::size_t>(y);
        const Eigen::Index last = w.eval_tokens[static_cast<std::size_t>(i)];
        const double mass = seen_mass(A, i, sum_kept ? runs : gaps, sum_kept, t0, last);
        // KL(q || p) = sum_j q_j (log q_j - log p_j) = the q-weighted logit shift + lse_p - lse_q,
        // since the tail's logits agree: the shifts come with the exps, no per-element logarithm.
        float* row = st.row(y).data();
        const Eigen::Index seen = last - t0 + 1;
        sm.add(y, row, nullptr, seen);
        std::fill(row + seen, row + tail, 0.0f);
        inv_sum[yy] = 1.0 / sm.sums[yy].sum;
        const double div = sm.kl(y, w.lse[qi](i));
        const auto ii = static_cast<std::size_t>(i);
        out.recall[qi][ii] = std::clamp(mass, 1e-30, 1.0);
        out.kl[qi][ii] = std::max(div, 0.0);
      }
    }
    auto o = o_buf.get(GR, d);
    if (v_rank >= 0)  // coefficients x U's first v_rank columns
      o.noalias() = acc * Eigen::Map<const ScratchMatrix::Mat>(v_basis.data(), d, d).leftCols(v_rank).transpose();
    else
      o = acc;
    o.noalias() += st * V.bottomRows(tail);
    for (int r = 0; r < G; ++r) {
      const auto qi = static_cast<std::size_t>(kv * G + r);
      for (std::int64_t x = 0; x < rows; ++x) {
        const std::int64_t i = i0 + x, y = r * rows + x;
        out.err[qi][static_cast<std::size_t>(i)] =
            relative_error(o.row(y), inv_sum[static_cast<std::size_t>(y)], w.out[qi].row(i));
      }
    }
  }
}

void add_rows(const LayerWork& w, const CodedRows& m, Accumulator& a) {
  for (std::int64_t i = 0; i < w.E; ++i)
    for (int qh = 0; qh < w.g.n_q_heads; ++qh) {
      const auto qi = static_cast<std::size_t>(qh), ii = static_cast<std::size_t>(i);
      a.add_row(w.layer, qh, i, m.recall[qi][ii], m.kl[qi][ii], m.err[qi][ii], w.out[qi].row(i).squaredNorm());
    }
}

// The plan's kept tokens of [0, c) with their encodings, as a listed index; mixes the plan into
// the keep hash when given an accumulator.
LayerIndex coded_index(const LayerPlan& plan, std::int64_t c, Accumulator* a) {
  LayerIndex cache;
  cache.listed = true;
  for (const HeadPlan& hp : plan.heads) {
    std::vector<std::int32_t> held;
    for (std::int64_t j = 0; j < c; ++j) {
      const auto jj = static_cast<std::size_t>(j);
      const TokenCodec code = hp.codec[jj];
      const std::uint64_t rank = hp.rank.empty() ? 0 : hp.rank[jj];
      if (a) a->mix((static_cast<std::uint64_t>(code) * 0x9e37ull + 1) ^ (rank << 20));
      if (code != TokenCodec::Drop) held.push_back(static_cast<std::int32_t>(j));
    }
    cache.tokens.push_back(std::move(held));
    cache.encoding.push_back(hp);
  }
  return cache;
}

const KvCodec& codec_of(const ReplayConfig& cfg) {
  const KvCodec* codec = cfg.impl->codec();
  if (!codec) throw Error("policy " + cfg.policy + ": plan encodes tokens but the policy names no codec");
  return *codec;
}

}  // namespace

// One-shot plans with encoded tokens (quantized tiers, low rank): bytes now, rows once scored.
CodedShot account_codec(std::size_t index, const ReplayConfig& cfg, const LayerPlan& plan, const LayerWork& w,
                        Accumulator& a) {
  const KvCodec& codec = codec_of(cfg);
  const LayerIndex cache = coded_index(plan, w.c, &a);
  const auto [saving, host] = kvcache::codec_bytes(codec, cache, w.g.head_dim);
  const std::int64_t nk = cache.rows();
  a.kept += nk;
  a.codec_saving += saving;
  a.host_bytes += host;
  for (std::int64_t i = 0; i < w.T - w.c; ++i) {
    a.kept_after_step[static_cast<std::size_t>(i)] += static_cast<double>(nk + (i + 1) * w.g.n_kv_heads);
    a.saving_after_step[static_cast<std::size_t>(i)] += saving;
  }
  return CodedShot{index, &codec, plan};
}

// Same codec, same encoding, same codec data (the data by identity: a layer's fits are shared).
std::vector<std::size_t> first_equal(const std::vector<CodedShot>& shots) {
  auto same = [](const CodedShot& x, const CodedShot& y) {
    if (x.codec != y.codec || x.plan.heads.size() != y.plan.heads.size()) return false;
    for (std::size_t k = 0; k < x.plan.heads.size(); ++k) {
      const HeadPlan &a = x.plan.heads[k], &b = y.plan.heads[k];
      if (a.codec != b.codec || a.rank != b.rank || a.data != b.data) return false;
    }
    return true;
  };
  std::vector<std::size_t> first(shots.size());
  for (std::size_t k = 0; k < shots.size(); ++k) {
    first[k] = k;
    for (std::size_t e = 0; e < k; ++e)
      if (first[e] == e && same(shots[e], shots[k])) {
        first[k] = e;
        break;
      }
  }
  return first;
}

CodedRows score_codec(const CodedShot& shot, const LayerWork& w) {
  CodedRows m = blank_rows(w.g.n_q_heads, w.E);
  score_rows(*shot.codec, coded_index(shot.plan, w.c, nullptr), w.c, 0, w.E, w, m);
  return m;
}

void add_codec_rows(const LayerWork& w, const CodedRows& rows, Accumulator& a) { add_rows(w, rows, a); }

// Encoded plans whose policy re-encodes (re-tiers) or evicts while decoding. The walk: at each
// decode step the token joins every head's cache in fp16 and its query attends (the weights the
// policy reads are the full attention renormalised over the cache, as replay_decode's: exact for
// fp16 tokens, the uncompressed reading for encoded ones), then the policy may evict and
// re-tier. Between two changes the cache's encoding is fixed, so each stretch of rows is scored
// once on it, with the tokens that joined inside the stretch exact.
void replay_codec_decode(const ReplayConfig& cfg, const ConfigBudget& b, const LayerWork& w, const LayerPlan& plan,
                         DecodeState& state, Accumulator& a) {
  const KvCodec& codec = codec_of(cfg);
  const int Hkv = w.g.n_kv_heads, Hq = w.g.n_q_heads, d = w.g.head_dim;
  const std::int64_t c = w.c, E = w.E;
  require_decode_queries(cfg, w, "re-encodes its cache while decoding");
  // Drop entries leave the encodings (and the codec data made for them), so decode tokens append.
  LayerIndex cache = coded_index(plan, c, &a);
  for (HeadPlan& enc : cache.encoding) enc = kvcache::without_drops(enc);
  const double head_budget = cfg.budget * static_cast<double>(c) * codec_token_bytes(TokenCodec::Fp16, d);
  kvcache::CodecBytes bytes = kvcache::codec_bytes(codec, cache, d);
  a.kept += cache.rows();
  a.codec_saving += bytes.saving;
  double host_peak = bytes.host;

  struct Stretch {
    std::int64_t i0;
    LayerIndex cache;  // the cache before row i0's token joined
  };
  std::vector<Stretch> stretches{{0, cache}};
  std::vector<std::vector<float>> weights(static_cast<std::size_t>(Hq));
  std::vector<std::vector<std::int32_t>> evict;
  for (std::int64_t i = 0; i < E; ++i) {
    const auto t = static_cast<std::int32_t>(w.eval_tokens[static_cast<std::size_t>(i)]);
    kvcache::append_token(cache, t);
    if (state.needs_attention()) cache_weights(w, i, cache.tokens, weights, true);
    evict.assign(static_cast<std::size_t>(Hkv), {});
    const std::function<std::shared_ptr<const LayerSignals>()> signals = [&] {
      return signals_over(w, cache.tokens, t + 1);
    };
    DecodeStep step{t, cache.tokens, weights, b.tokens, segment_of(w, t)};
    step.signals = &signals;
    state.step(step, evict);
    bool changed = false;
    kvcache::apply_evictions(cfg.policy, evict, t, -1, cache, nullptr);
    for (const auto& evicted_kv : evict)
      for (const auto j : evicted_kv) {
        a.mix(static_cast<std::uint64_t>(j) + 1);
        changed = true;
      }
    LayerPlan next;
    DecodeStep after{t, cache.tokens, {}, b.tokens};
    after.signals = &signals;
    if (state.retier(after, next)) {
      for (std::size_t kv = 0; kv < next.heads.size() && kv < cache.tokens.size(); ++kv) {
        const HeadPlan& hp = next.heads[kv];
        for (std::size_t m = 0; m < hp.codec.size() && m < cache.tokens[kv].size(); ++m)
          a.mix((static_cast<std::uint64_t>(hp.codec[m]) * 0x9e37ull + 7) ^
                static_cast<std::uint64_t>(cache.tokens[kv][m]));
      }
      kvcache::apply_retier(cfg.policy, next, w.layer, t, codec, head_budget, d, cache, nullptr);
      changed = true;
    }
    // Every step: a streaming codec (KIVI) stores a joining token as its layout says, not fp16.
    bytes = kvcache::codec_bytes(codec, cache, d);
    host_peak = std::max(host_peak, bytes.host);
    if (changed && i + 1 < E) stretches.push_back({i + 1, cache});
    a.kept_after_step[static_cast<std::size_t>(i)] += static_cast<double>(cache.rows());
    a.saving_after_step[static_cast<std::size_t>(i)] += bytes.saving;
  }
  a.host_bytes += host_peak;
  // A stretch's cache lacks the tokens that join inside it: they are the exact tail from its
  // first row's token on (which is also why each snapshot is taken before that token joins).
  CodedRows m = blank_rows(Hq, E);
  for (std::size_t k = 0; k < stretches.size(); ++k) {
    const std::int64_t i0 = stretches[k].i0, i1 = k + 1 < stretches.size() ? stretches[k + 1].i0 : E;
    LayerIndex& before = stretches[k].cache;
    const auto t0 = static_cast<std::int32_t>(w.eval_tokens[static_cast<std::size_t>(i0)]);
    for (std::size_t e = 0; e < before.tokens.size(); ++e) {
      // Drop the decode tokens >= t0 (in fp16) that this snapshot already holds.
      auto& held = before.tokens[e];
      HeadPlan& enc = before.encoding[e];
      while (!held.empty() && held.back() >= t0) {
        held.pop_back();
        enc.codec.pop_back();
        if (!enc.rank.empty()) enc.rank.pop_back();
      }
    }
    score_rows(codec, before, t0, i0, i1, w, m);
  }
  add_rows(w, m, a);
}

}  // namespace kvsim::replay_detail
