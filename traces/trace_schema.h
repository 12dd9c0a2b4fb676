#pragma once
// The kvtrace contract between capture and replay (docs/trace-format.md is the prose version;
// a change here bumps kTraceVersion). Plain structs only: no HDF5 types leak out of traces/.
#include <cstdint>
#include <string>
#include <vector>

#include "core/geometry.h"
#include "core/rope.h"

namespace kvsim {

inline constexpr const char* kTraceFormat = "kvtrace";
inline constexpr std::int64_t kTraceVersion = 1;

enum class Segment : std::int8_t { System = 0, Context = 1, Question = 2, Generated = 3 };
inline constexpr int kSegmentCount = 4;
const char* segment_name(Segment s);
// "system,context,question,generated": stored as an attribute so files explain their codes.
std::string segment_names_csv();

const char* rope_type_name(RopeType t);
RopeType parse_rope_type(const std::string& s, const std::string& context);

// Empty when `g` is a consistent trace geometry; otherwise one message per broken field
// (context-prefixed, naming the model/ attribute).
std::vector<std::string> geometry_problems(const ModelGeometry& g, const std::string& context);

// SmolLM2-135M-Instruct (formats.md §4): the default geometry everywhere.
ModelGeometry smollm2_135m_geometry();

struct CaptureInfo {
  std::string tool_version;
  std::string backend;  // "synthetic", "cpu", "cuda"
  std::string date;     // ISO 8601 UTC
  std::uint64_t seed = 0;
  std::string config;  // fully resolved generator / capture configuration (JSON)
};

// Everything about one request except the per-layer tensors and the reference distribution.
struct RequestHeader {
  std::string id;
  std::string task;
  std::string answer;
  std::vector<std::int32_t> tokens;     // [T]
  std::vector<std::int32_t> positions;  // [T], strictly increasing
  std::vector<std::int8_t> segments;    // [T], Segment codes
  std::vector<std::int32_t> q_index;    // [Tq], strictly increasing token indices with queries
  std::int64_t n_prompt = 0;
  std::int64_t n_generated = 0;
  std::int64_t question_start = 0;  // token index of the first question token (T if none)
  std::int64_t needle_start = -1;   // planted or known answer span [start, end), -1 if none
  std::int64_t needle_end = -1;
  std::int32_t ref_rows = 0;  // Tg: rows of the reference next-token distribution
  std::int32_t ref_topk = 0;  // k: width of each reference row

  std::int64_t n_tokens() const { return static_cast<std::int64_t>(tokens.size()); }
  std::int64_t n_queries() const { return static_cast<std::int64_t>(q_index.size()); }
  // Empty when consistent with itself and with `g`; otherwise one message per problem.
  std::vector<std::string> problems(const ModelGeometry& g, const std::string& context) const;
};

// KVzip's context-reconstruction pass of a request (optional, `kvsim capture --repeat-pass`):
// the model, on top of the prompt's cache up to the question, teacher-forced to repeat the
// context chunk by chunk; chunk c repeats context tokens [begin, end) in pass rows
// [row_begin, row_end) (its prompt's instruction rows first). Post-RoPE queries and keys of every
// pass row; each chunk attended to the prompt cache and causally to its own rows only.
struct RepeatChunk {
  std::int64_t begin = 0, end = 0, row_begin = 0, row_end = 0;
};
struct RepeatPass {
  std::vector<RepeatChunk> chunks;
  std::int64_t rows = 0;
  std::vector<std::vector<float>> q, k;  // [layer] [rows, n_q_heads, head_dim], [rows, n_kv_heads, head_dim]
};

// A chunked request's chunks computed alone (optional, `kvsim capture --chunk-states`): each
// chunk's K/V after the prompt's header only, in passes of its own, keys moved to its positions in
// the request (docs/chunk-states.md). Chunk c (`id`) covers tokens [begin, end) and rows
// [row_begin, row_end) of k and v: consecutive, in the request's order.
struct ChunkStateSpan {
  std::string id;
  std::int64_t begin = 0, end = 0, row_begin = 0, row_end = 0;
};
struct ChunkStateRecord {
  std::vector<ChunkStateSpan> chunks;
  std::int64_t rows = 0;
  std::vector<std::vector<float>> k, v;  // [layer] [rows, n_kv_heads, head_dim]
};

// The full-cache model's next-token distribution after token index[i]: top-k ids and
// log-probabilities, plus the log-sum-exp of the logits (for recovering any logit's log-prob).
struct ReferenceDistribution {
  std::int32_t rows = 0;
  std::int32_t topk = 0;
  std::vector<std::int32_t> index;     // [rows] token index the prediction follows
  std::vector<std::int32_t> topk_ids;  // [rows, topk]
  std::vector<float> topk_logp;        // [rows, topk]
  std::vector<float> lse;              // [rows]
};

enum class Tensor { K, V, Q };
const char* tensor_name(Tensor t);

}  // namespace kvsim
