#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "policies/codec.h"
#include "sim/replay_internal.h"

namespace kvsim::replay_detail {

// One-shot plans with encoded tokens (quantized tiers). Reconstructed keys change the logits, so
// no partial output can be shared with other configs: per query head, the evaluation rows attend
// over the reconstructed kept tokens and the exact tokens after the compression point, once per
// config and layer (one GEMM each side). Per row: recall = full attention mass on kept tokens,
// KL(compressed || full) over the tokens the compressed row sees (as eviction's -log recall),
// and the output's relative error.
void replay_codec(const ReplayConfig& cfg, const LayerPlan& plan, const LayerWork& w, Accumulator& a) {
  const KvCodec* codec = cfg.impl->codec();
  if (!codec) throw Error("policy " + cfg.policy + ": plan encodes tokens but the policy names no codec");
  const int Hkv = w.g.n_kv_heads, Hq = w.g.n_q_heads, G = w.g.group(), d = w.g.head_dim;
  const std::int64_t c = w.c, E = w.E, T = w.T, tail = T - c;
  const double fp16_token = codec_token_bytes(TokenCodec::Fp16, d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<std::vector<double>> recall(static_cast<std::size_t>(Hq)), kl(recall.size()), err(recall.size());
  for (int kv = 0; kv < Hkv; ++kv) {
    const HeadPlan& hp = plan.heads[static_cast<std::size_t>(kv)];
    std::vector<std::int32_t> kept;
    for (std::int64_t j = 0; j < c; ++j) {
      const TokenCodec code = hp.codec[static_cast<std::size_t>(j)];
      const std::uint64_t rank = hp.rank.empty() ? 0 : hp.rank[static_cast<std::size_t>(j)];
      a.mix((static_cast<std::uint64_t>(code) * 0x9e37ull + 1) ^ (rank << 20));
      if (code != TokenCodec::Drop) kept.push_back(static_cast<std::int32_t>(j));
    }
    const auto nk = static_cast<Eigen::Index>(kept.size());
    Mat kh(nk, d), vh(nk, d);
    const Mat& K = w.full_k[static_cast<std::size_t>(kv)];
    const Mat& V = w.full_v[static_cast<std::size_t>(kv)];
    for (Eigen::Index m = 0; m < nk; ++m) {
      kh.row(m) = K.row(kept[static_cast<std::size_t>(m)]);
      vh.row(m) = V.row(kept[static_cast<std::size_t>(m)]);
    }
    std::vector<std::int32_t> positions;
    for (auto j : kept) positions.push_back(w.h.positions[static_cast<std::size_t>(j)]);
    codec->reconstruct(hp, w.g, positions, {kh.data(), static_cast<std::size_t>(kh.size())},
                       {vh.data(), static_cast<std::size_t>(vh.size())});
    a.kept += nk;
    a.codec_saving += static_cast<double>(nk) * fp16_token - codec->bytes(hp, d);
    for (std::int64_t i = 0; i < tail; ++i) a.kept_after_step[static_cast<std::size_t>(i)] += static_cast<double>(nk + i + 1);
    Mat k_exact(nk, d);
    for (Eigen::Index m = 0; m < nk; ++m) k_exact.row(m) = K.row(kept[static_cast<std::size_t>(m)]);
    for (int r = 0; r < G; ++r) {
      const int qh = kv * G + r;
      const auto qi = static_cast<std::size_t>(qh);
      const StridedMap qe(w.q.data() + (w.first_eval * Hq + qh) * d, E, d, Eigen::OuterStride<>(Hq * d));
      const Mat qs = qe * scale;
      // Logits over [kept (reconstructed) | tail (exact)], and the exact logits of the kept
      // tokens: their difference is all KL needs (no per-element logarithms).
      Mat s(E, nk + tail), delta(E, nk);
      s.leftCols(nk).noalias() = qs * kh.transpose();
      s.rightCols(tail).noalias() = qs * K.bottomRows(tail).transpose();
      delta.noalias() = qs * k_exact.transpose();
      delta = s.leftCols(nk) - delta;  // reconstructed minus exact logit of each kept token
      const Mat& A = w.attn[qi];
      std::vector<double> lse_q(static_cast<std::size_t>(E)), lse_p(static_cast<std::size_t>(E));
      for (std::int64_t i = 0; i < E; ++i) {
        // The full row's logsumexp from its largest probability: p_j = exp(logit_j - lse).
        const Eigen::Index last = w.eval_tokens[static_cast<std::size_t>(i)];
        Eigen::Index jmax = 0;
        A.row(i).head(last + 1).maxCoeff(&jmax);
        const double logit = static_cast<double>(qs.row(i).dot(K.row(jmax)));
        lse_p[static_cast<std::size_t>(i)] = logit - std::log(static_cast<double>(A(i, jmax)));
        // The compressed row's softmax, causal on the tail, with its logsumexp.
        auto row = s.row(i);
        const Eigen::Index seen = nk + (last - c) + 1;
        const float mx = row.head(seen).maxCoeff();
        row.head(seen) = (row.head(seen).array() - mx).exp();
        const double sum = row.head(seen).sum();
        row.head(seen) /= static_cast<float>(sum);
        if (seen < row.size()) row.tail(row.size() - seen).setZero();
        lse_q[static_cast<std::size_t>(i)] = mx + std::log(sum);
      }
      Mat o(E, d);
      o.noalias() = s.leftCols(nk) * vh;
      o.noalias() += s.rightCols(tail) * V.bottomRows(tail);
      for (std::int64_t i = 0; i < E; ++i) {
        // KL(q || p) = sum_j q_j (log q_j - log p_j); on the tail the logits agree, so only the
        // kept tokens' logit shifts remain, plus the two normalisers.
        double mass = static_cast<double>(w.tail_mass[qi](i)), shift = 0;
        for (Eigen::Index m = 0; m < nk; ++m) {
          mass += A(i, kept[static_cast<std::size_t>(m)]);
          shift += static_cast<double>(s(i, m)) * delta(i, m);
        }
        const double div = shift + lse_p[static_cast<std::size_t>(i)] - lse_q[static_cast<std::size_t>(i)];
        const auto full = w.out[qi].row(i);
        const double norm = full.squaredNorm();
        recall[qi].push_back(std::clamp(mass, 1e-30, 1.0));
        kl[qi].push_back(std::max(div, 0.0));
        err[qi].push_back(norm > 0 ? std::sqrt((o.row(i) - full).squaredNorm() / norm) : 0.0);
      }
    }
  }
  for (std::int64_t i = 0; i < E; ++i)
    for (int qh = 0; qh < Hq; ++qh) {
      const auto qi = static_cast<std::size_t>(qh), ii = static_cast<std::size_t>(i);
      a.add_row(w.layer, recall[qi][ii], kl[qi][ii], err[qi][ii]);
    }
}

}  // namespace kvsim::replay_detail
