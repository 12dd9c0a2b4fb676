#include "traces/trace_schema.h"

#include "core/error.h"

namespace kvsim {

const char* segment_name(Segment s) {
  switch (s) {
    case Segment::System:
      return "system";
    case Segment::Context:
      return "context";
    case Segment::Question:
      return "question";
    case Segment::Generated:
      return "generated";
  }
  return "?";
}

std::string segment_names_csv() { return "system,context,question,generated"; }

const char* rope_type_name(RopeType t) { return t == RopeType::Norm ? "norm" : "neox"; }

RopeType parse_rope_type(const std::string& s, const std::string& context) {
  if (s == "norm") return RopeType::Norm;
  if (s == "neox") return RopeType::Neox;
  throw FormatError(context + ": rope_type is '" + s + "', expected 'norm' or 'neox'");
}

const char* tensor_name(Tensor t) {
  switch (t) {
    case Tensor::K:
      return "k";
    case Tensor::V:
      return "v";
    case Tensor::Q:
      return "q";
  }
  return "?";
}

ModelGeometry smollm2_135m_geometry() {
  ModelGeometry g;
  g.name = "SmolLM2-135M-Instruct";
  g.arch = "llama";
  g.n_layers = 30;
  g.n_q_heads = 9;
  g.n_kv_heads = 3;
  g.head_dim = 64;
  g.vocab = 49152;
  g.rope = RopeSpec{RopeType::Norm, 64, 64, 100000.0};
  return g;
}

std::vector<std::string> geometry_problems(const ModelGeometry& g, const std::string& context) {
  std::vector<std::string> out;
  auto positive = [&](const char* field, std::int64_t v) {
    if (v <= 0) out.push_back(context + ": model/" + field + " = " + std::to_string(v) + ", expected > 0");
  };
  positive("n_layers", g.n_layers);
  positive("n_q_heads", g.n_q_heads);
  positive("n_kv_heads", g.n_kv_heads);
  positive("head_dim", g.head_dim);
  positive("vocab", g.vocab);
  // Upper limits keep every size product far from overflow and reject hostile attributes.
  auto at_most = [&](const char* field, std::int64_t v, std::int64_t limit) {
    if (v > limit)
      out.push_back(context + ": model/" + field + " = " + std::to_string(v) +
                    ", expected <= " + std::to_string(limit));
  };
  at_most("n_layers", g.n_layers, 1024);
  at_most("n_q_heads", g.n_q_heads, 1024);
  at_most("n_kv_heads", g.n_kv_heads, 1024);
  at_most("head_dim", g.head_dim, 4096);
  at_most("vocab", g.vocab, std::int64_t{1} << 31);
  if (g.n_q_heads > 0 && g.n_kv_heads > 0 && g.n_q_heads % g.n_kv_heads != 0)
    out.push_back(context + ": model/n_q_heads = " + std::to_string(g.n_q_heads) +
                  " is not a multiple of model/n_kv_heads = " + std::to_string(g.n_kv_heads));
  if (g.rope.rope_dim < 0 || g.rope.rope_dim > g.head_dim || g.rope.rope_dim % 2 != 0)
    out.push_back(context + ": model/rope_dim = " + std::to_string(g.rope.rope_dim) +
                  ", expected an even number in [0, head_dim = " + std::to_string(g.head_dim) + "]");
  if (!(g.rope.theta > 0)) out.push_back(context + ": model/rope_theta must be > 0");
  if (g.rope.head_dim != g.head_dim)
    out.push_back(context + ": RoPE head_dim " + std::to_string(g.rope.head_dim) +
                  " differs from model/head_dim = " + std::to_string(g.head_dim));
  if (!g.sliding_window.empty() && static_cast<int>(g.sliding_window.size()) != g.n_layers)
    out.push_back(context + ": model/sliding_window has " + std::to_string(g.sliding_window.size()) +
                  " entries, expected n_layers = " + std::to_string(g.n_layers));
  return out;
}

std::vector<std::string> RequestHeader::problems(const ModelGeometry& g, const std::string& context) const {
  std::vector<std::string> out;
  const std::int64_t T = n_tokens();
  auto sized = [&](const char* name, std::int64_t n) {
    if (n != T)
      out.push_back(context + ": dataset '" + name + "' has " + std::to_string(n) +
                    " entries, expected T = " + std::to_string(T) + " (length of 'tokens')");
  };
  if (T == 0) out.push_back(context + ": dataset 'tokens' is empty, expected at least one token");
  sized("positions", static_cast<std::int64_t>(positions.size()));
  sized("segments", static_cast<std::int64_t>(segments.size()));
  for (std::int64_t i = 0; i < T; ++i) {
    if (tokens[i] < 0 || tokens[i] >= g.vocab) {
      out.push_back(context + ": tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                    ", expected a token id in [0, vocab = " + std::to_string(g.vocab) + ")");
      break;
    }
  }
  if (static_cast<std::int64_t>(positions.size()) == T) {
    for (std::int64_t i = 0; i < T; ++i) {
      if (positions[i] < 0 || (i > 0 && positions[i] <= positions[i - 1])) {
        out.push_back(context + ": positions[" + std::to_string(i) + "] = " + std::to_string(positions[i]) +
                      (i > 0 ? " after " + std::to_string(positions[i - 1]) : std::string()) +
                      ", expected non-negative and strictly increasing");
        break;
      }
    }
  }
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (segments[i] < 0 || segments[i] >= kSegmentCount) {
      out.push_back(context + ": segments[" + std::to_string(i) + "] = " + std::to_string(segments[i]) +
                    ", expected 0..3 (" + segment_names_csv() + ")");
      break;
    }
  }
  if (q_index.empty()) out.push_back(context + ": dataset 'q_index' is empty, expected at least one query");
  for (std::size_t i = 0; i < q_index.size(); ++i) {
    if (q_index[i] < 0 || q_index[i] >= T || (i > 0 && q_index[i] <= q_index[i - 1])) {
      out.push_back(context + ": q_index[" + std::to_string(i) + "] = " + std::to_string(q_index[i]) +
                    ", expected strictly increasing token indices in [0, T = " + std::to_string(T) + ")");
      break;
    }
  }
  if (n_prompt < 0 || n_generated < 0 || n_prompt + n_generated != T)
    out.push_back(context + ": n_prompt = " + std::to_string(n_prompt) +
                  " + n_generated = " + std::to_string(n_generated) + ", expected to sum to T = " + std::to_string(T));
  if (question_start < 0 || question_start > T)
    out.push_back(context + ": question_start = " + std::to_string(question_start) +
                  ", expected in [0, T = " + std::to_string(T) + "]");
  if (needle_start != -1 || needle_end != -1) {
    if (needle_start < 0 || needle_end <= needle_start || needle_end > T)
      out.push_back(context + ": needle span [" + std::to_string(needle_start) + ", " + std::to_string(needle_end) +
                    ") is not a non-empty span inside [0, T = " + std::to_string(T) + ")");
  }
  if (ref_rows < 0 || ref_topk < 0 || (ref_rows > 0) != (ref_topk > 0))
    out.push_back(context + ": reference shape [" + std::to_string(ref_rows) + ", " + std::to_string(ref_topk) +
                  "] is inconsistent, expected both > 0 or both 0");
  return out;
}

}  // namespace kvsim
