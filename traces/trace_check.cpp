#include "traces/trace_check.h"
#include "traces/trace_probe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/isolated_call.h"
#include "traces/trace_reader.h"

namespace kvsim {

std::int64_t first_nonfinite_half(const std::uint16_t* bits, std::size_t n, std::size_t* count) {
  std::int64_t first = -1;
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if ((bits[i] & 0x7c00u) == 0x7c00u) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++c;
    }
  }
  if (count) *count = c;
  return first;
}

namespace {

void add_lines(std::vector<std::string>& out, const std::string& multi_line) {
  std::istringstream in(multi_line);
  for (std::string line; std::getline(in, line);) out.push_back(line);
}

// `h`: the request's header, or null when it could not be read (rows are then not tokens).
void check_tensors(const TraceReader& reader, const std::string& id, const RequestHeader* h, TraceCheckReport& report) {
  const ModelGeometry& g = reader.geometry();
  std::vector<std::uint16_t> buf;
  for (Tensor t : {Tensor::K, Tensor::V, Tensor::Q}) {
    const int heads = t == Tensor::Q ? g.n_q_heads : g.n_kv_heads;
    buf.resize(reader.layer_elements(id, t));
    for (int layer = 0; layer < g.n_layers; ++layer) {
      try {
        reader.read_layer_half(id, t, layer, buf);
      } catch (const Error& e) {  // a damaged chunk: report it and go on to the next
        add_lines(report.errors, e.what());
        continue;
      }
      std::size_t count = 0;
      const std::int64_t first = first_nonfinite_half(buf.data(), buf.size(), &count);
      if (first < 0) continue;
      const std::int64_t per_row = static_cast<std::int64_t>(heads) * g.head_dim;
      const std::int64_t row = first / per_row;
      const bool q_row = t == Tensor::Q && !h;  // without the header, a query row is not a token
      const std::int64_t token = t == Tensor::Q && h ? h->q_index[static_cast<std::size_t>(row)] : row;
      report.errors.push_back(reader.path() + ": request '" + id + "' dataset '" + tensor_name(t) + "' layer " +
                              std::to_string(layer) + ": " + std::to_string(count) +
                              " non-finite values (NaN/Inf), first at " + (q_row ? "query row " : "token ") +
                              std::to_string(token) + ", head " + std::to_string((first % per_row) / g.head_dim) +
                              ", dim " + std::to_string(first % g.head_dim) + "; expected finite float16");
    }
  }
}

void check_reference(const TraceReader& reader, const std::string& id, TraceCheckReport& report) {
  const ReferenceDistribution ref = reader.reference(id);
  const std::string ctx = reader.path() + ": request '" + id + "' ref";
  for (std::size_t r = 0; r < static_cast<std::size_t>(ref.rows); ++r) {
    if (!std::isfinite(ref.lse[r])) {
      report.errors.push_back(ctx + ": lse[" + std::to_string(r) + "] is not finite");
      return;
    }
    for (std::size_t j = 0; j < static_cast<std::size_t>(ref.topk); ++j) {
      const float lp = ref.topk_logp[r * static_cast<std::size_t>(ref.topk) + j];
      // Log-probabilities: finite or -inf (a masked token), never positive beyond rounding.
      if (std::isnan(lp) || lp > 1e-4f) {
        report.errors.push_back(ctx + ": topk_logp[" + std::to_string(r) + ", " + std::to_string(j) +
                                "] = " + std::to_string(lp) + ", expected a log-probability <= 0");
        return;
      }
    }
  }
}

// The optional reconstruction pass: table, shapes, and finite values in every layer.
void check_repeat_pass(const TraceReader& reader, const std::string& id, TraceCheckReport& report) {
  if (!reader.has_repeat_pass(id)) return;
  reader.repeat_pass_table(id);  // throws naming the bad field
  std::vector<float> q, k;
  for (int layer = 0; layer < reader.geometry().n_layers; ++layer) {
    reader.read_repeat_layer(id, layer, q, k);
    for (const auto* v : {&q, &k})
      for (float x : *v)
        if (!std::isfinite(x)) {
          report.errors.push_back(reader.path() + ": request '" + id + "' repeat pass: layer " + std::to_string(layer) +
                                  " holds a non-finite " + (v == &q ? "query" : "key") + " value");
          return;
        }
  }
}

// The optional chunks computed alone: table, shapes, and finite values in every layer.
void check_chunk_states(const TraceReader& reader, const std::string& id, TraceCheckReport& report) {
  if (!reader.has_chunk_states(id)) return;
  reader.chunk_state_table(id);  // throws naming the bad field
  std::vector<float> k, v;
  for (int layer = 0; layer < reader.geometry().n_layers; ++layer) {
    reader.read_chunk_state_layer(id, layer, k, v);
    for (const auto* x : {&k, &v})
      if (!std::all_of(x->begin(), x->end(), [](float f) { return std::isfinite(f); })) {
        report.errors.push_back(reader.path() + ": request '" + id + "' chunk states: layer " + std::to_string(layer) +
                                " holds a non-finite " + (x == &k ? "key" : "value"));
        return;
      }
  }
}

}  // namespace

TraceCheckReport check_trace(const std::string& path, TraceOpen how) {
  TraceCheckReport report;
  try {
    TraceReader reader(path, how);
    for (const auto& id : reader.incomplete_request_ids())
      report.errors.push_back(path + ": request '" + id +
                              "' is incomplete (status is not \"complete\": its writer stopped before committing "
                              "it); the other requests are usable");
    std::int64_t unchecked = 0;
    for (const auto& id : reader.request_ids()) {
      // Each part on its own: a damaged header, reference or pass does not hide the others.
      auto part = [&](const std::function<void()>& f) {
        try {
          f();
        } catch (const Error& e) {
          add_lines(report.errors, e.what());
        } catch (const std::exception& e) {  // e.g. bad_alloc from a hostile size: keep the other findings
          report.errors.push_back(path + ": request '" + id + "': unreadable (" + e.what() + ")");
        }
      };
      // Every header and reference array first, each on its own: a damaged one hides no other.
      std::vector<std::string> broken;
      part([&] { broken = reader.unreadable_arrays(id); });
      report.errors.insert(report.errors.end(), broken.begin(), broken.end());
      std::optional<RequestHeader> h;
      if (broken.empty())
        part([&] {
          h = reader.header(id);
          report.tokens_checked += h->n_tokens();
        });
      ++report.requests_checked;
      part([&] { unchecked += reader.checksummed(id) ? 0 : 1; });
      part([&] { check_tensors(reader, id, h ? &*h : nullptr, report); });
      if (broken.empty()) part([&] { check_reference(reader, id, report); });
      part([&] { check_repeat_pass(reader, id, report); });
      part([&] { check_chunk_states(reader, id, report); });
    }
    if (unchecked > 0)
      report.notes.push_back(path + ": " + std::to_string(unchecked) + " of " +
                             std::to_string(reader.request_ids().size()) +
                             " requests carry no checksums (written before kvsim added them): damage to their data "
                             "cannot be detected; capture them again for checked reads");
  } catch (const Error& e) {
    add_lines(report.errors, e.what());
  } catch (const std::exception& e) {
    report.errors.push_back(path + ": unreadable (" + e.what() + ")");
  }
  return report;
}

TraceCheckReport check_trace_isolated(const std::string& path) {
  const IsolatedResult r = run_isolated([&] {
    const TraceCheckReport report = check_trace(path, TraceOpen::Trusted);
    return nlohmann::json{{"errors", report.errors},
                          {"notes", report.notes},
                          {"requests", report.requests_checked},
                          {"tokens", report.tokens_checked}}
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  });
  TraceCheckReport report;
  switch (r.status) {
    case IsolatedResult::Status::Ok: {
      const auto j = nlohmann::json::parse(r.output);
      report.errors = j["errors"].get<std::vector<std::string>>();
      report.notes = j["notes"].get<std::vector<std::string>>();
      report.requests_checked = j["requests"].get<std::int64_t>();
      report.tokens_checked = j["tokens"].get<std::int64_t>();
      break;
    }
    case IsolatedResult::Status::Threw:
      report.errors.push_back(path + ": " + r.output);
      break;
    case IsolatedResult::Status::Crashed:
      report.errors.push_back(crashed_parser_message(path, r.signal));
      break;
  }
  return report;
}

}  // namespace kvsim
