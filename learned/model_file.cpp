#include "learned/model_file.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "learned/features.h"
#include "traces/h5_handle.h"
#include "traces/shape_attrs.h"
#include "traces/trace_probe.h"

namespace kvsim::learned {

namespace {

using h5::check;
using h5::check_status;
using h5::Handle;

constexpr const char* kFormat = "kvsim-learned-policy";

void write_f64(hid_t loc, const std::string& name, const std::vector<double>& v) {
  const hsize_t dims[1] = {static_cast<hsize_t>(v.size())};
  Handle space = check(H5Screate_simple(1, dims, nullptr), "dataspace " + name);
  Handle d = check(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   "create " + name);
  if (!v.empty())
    check_status(H5Dwrite(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), "write " + name);
}

// Every value must be finite: a NaN weight or gate would order tokens or heads arbitrarily.
void require_finite(const std::vector<double>& v, const std::string& ctx) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) throw FormatError(ctx + ": value " + std::to_string(i) + " is not finite");
}

std::vector<double> read_f64(hid_t loc, const std::string& name, const std::string& path) {
  const std::string ctx = path + ": dataset '" + name + "'";
  if (!h5::link_exists(loc, name)) throw FormatError(ctx + " is missing");
  Handle d = check(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), ctx);
  const auto shape = h5::dataset_shape(d.get());
  if (shape.size() != 1) throw FormatError(ctx + ": shape " + h5::shape_string(shape) + "; expected one dimension");
  h5::check_stored(d.get(), h5::element_count(shape, ctx), sizeof(double), ctx);
  std::vector<double> v(static_cast<std::size_t>(shape[0]));
  if (!v.empty()) check_status(H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), ctx);
  require_finite(v, ctx);
  return v;
}

Handle make_group(hid_t loc, const char* name) {
  return check(H5Gcreate2(loc, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), std::string("create group ") + name);
}

Handle open_group(hid_t loc, const char* name, const std::string& path) {
  if (!h5::link_exists(loc, name)) throw FormatError(path + ": group '/" + std::string(name) + "' is missing");
  return check(H5Gopen2(loc, name, H5P_DEFAULT), path + ": group /" + name);
}

nlohmann::json parse_json(const std::string& text, const std::string& ctx) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(ctx + ": not valid JSON (" + e.what() + ")");
  }
}

void write_provenance(hid_t root, const Provenance& p) {
  Handle g = make_group(root, "provenance");
  nlohmann::json traces = nlohmann::json::array();
  for (const auto& [path, sha] : p.traces) traces.push_back({{"path", path}, {"sha256", sha}});
  h5::write_attr_string(g.get(), "traces", traces.dump());
  nlohmann::json requests = nlohmann::json::array();
  for (const TrainedRequest& r : p.requests)
    requests.push_back({{"trace", r.trace}, {"id", r.id}, {"prompt", std::to_string(r.prompt)}});
  h5::write_attr_string(g.get(), "requests", requests.dump());
  h5::write_attr_string(g.get(), "seed", std::to_string(p.seed));
  h5::write_attr_string(g.get(), "hyperparameters", p.hyperparameters.empty() ? "{}" : p.hyperparameters);
  h5::write_attr_string(g.get(), "created", p.created);
}

Provenance read_provenance(hid_t root, const std::string& path) {
  Handle g = open_group(root, "provenance", path);
  const std::string ctx = path + ": /provenance";
  Provenance p;
  const nlohmann::json traces = parse_json(h5::read_attr_string(g.get(), "traces", ctx), ctx + " attribute 'traces'");
  const nlohmann::json requests =
      parse_json(h5::read_attr_string(g.get(), "requests", ctx), ctx + " attribute 'requests'");
  auto unsigned_of = [&](const std::string& text, const std::string& field) {
    if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
      throw FormatError(ctx + " " + field + ": '" + text + "' is not an unsigned integer");
    try {
      return static_cast<std::uint64_t>(std::stoull(text));
    } catch (const std::exception&) {
      throw FormatError(ctx + " " + field + ": '" + text + "' is out of range");
    }
  };
  try {
    for (const auto& t : traces)
      p.traces.emplace_back(t.at("path").get<std::string>(), t.at("sha256").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(ctx + " attribute 'traces': expected a list of {path, sha256} (" + e.what() + ")");
  }
  try {
    for (const auto& r : requests)
      p.requests.push_back({r.at("trace").get<int>(), r.at("id").get<std::string>(),
                            unsigned_of(r.at("prompt").get<std::string>(), "attribute 'requests' field 'prompt'")});
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(ctx + " attribute 'requests': expected a list of {trace, id, prompt} (" + e.what() + ")");
  }
  p.seed = unsigned_of(h5::read_attr_string(g.get(), "seed", ctx), "attribute 'seed'");
  p.hyperparameters = h5::read_attr_string(g.get(), "hyperparameters", ctx);
  p.created = h5::read_attr_string(g.get(), "created", ctx);
  return p;
}

void write_geometry(hid_t root, const ModelGeometry& g) {
  Handle gr = make_group(root, "geometry");
  h5::write_shape_attrs(gr.get(), g);
}

ModelGeometry read_geometry(hid_t root, const std::string& path) {
  Handle gr = open_group(root, "geometry", path);
  const std::string ctx = path + ": /geometry";
  ModelGeometry g;
  h5::read_shape_attrs(gr.get(), ctx, g);
  if (g.n_layers < 1 || g.n_kv_heads < 1 || g.n_q_heads < g.n_kv_heads || g.n_q_heads % g.n_kv_heads != 0 ||
      g.head_dim < 1)
    throw FormatError(ctx + ": layers " + std::to_string(g.n_layers) + ", heads " + std::to_string(g.n_q_heads) + "/" +
                      std::to_string(g.n_kv_heads) + ", head_dim " + std::to_string(g.head_dim) +
                      "; expected positive sizes with query heads a multiple of KV heads");
  return g;
}

void write_network(hid_t root, const LearnedModel& m) {
  Handle g = make_group(root, "network");
  const auto& sizes = m.network.sizes();
  h5::write_attr_string(g.get(), "sizes", nlohmann::json(sizes).dump());
  h5::write_attr_string(g.get(), "activation", activation_name(m.network.activation()));
  write_f64(g.get(), "params", m.network.params());
  write_f64(g.get(), "norm_mean", m.norm_mean);
  write_f64(g.get(), "norm_std", m.norm_std);
}

void read_network(hid_t root, const std::string& path, LearnedModel& m) {
  Handle g = open_group(root, "network", path);
  const std::string ctx = path + ": /network";
  std::vector<int> sizes;
  try {
    sizes = parse_json(h5::read_attr_string(g.get(), "sizes", ctx), ctx + " attribute 'sizes'").get<std::vector<int>>();
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(ctx + " attribute 'sizes': expected a list of layer sizes (" + e.what() + ")");
  }
  const Activation act =
      parse_activation(h5::read_attr_string(g.get(), "activation", ctx), ctx + " attribute 'activation'");
  m.network = Mlp(sizes, act, read_f64(g.get(), "params", path), ctx + " dataset 'params'");
  m.norm_mean = read_f64(g.get(), "norm_mean", path);
  m.norm_std = read_f64(g.get(), "norm_std", path);
  const auto inputs = static_cast<std::size_t>(m.network.inputs());
  if (m.norm_mean.size() != inputs || m.norm_std.size() != inputs)
    throw FormatError(ctx + ": norm_mean/norm_std hold " + std::to_string(m.norm_mean.size()) + "/" +
                      std::to_string(m.norm_std.size()) + " values; expected the network's " + std::to_string(inputs) +
                      " inputs");
  for (double s : m.norm_std)
    if (!(s > 0)) throw FormatError(ctx + " dataset 'norm_std': expected positive values, got " + std::to_string(s));
}

}  // namespace

void write_learned_model(const LearnedModel& m, const std::string& path) {
  h5::silence_library_errors();
  const std::string tmp = path + ".partial";
  {
    Handle f = check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), tmp + ": cannot create");
    h5::write_attr_string(f.get(), "format", kFormat);
    h5::write_attr_i64(f.get(), "format_version", kModelFormatVersion);
    h5::write_attr_string(f.get(), "method", m.method);
    h5::write_attr_string(f.get(), "feature_set", m.feature_set);
    h5::write_attr_i64(f.get(), "feature_version", m.feature_version);
    h5::write_attr_string(f.get(), "features", nlohmann::json(m.features).dump());
    h5::write_attr_string(f.get(), "results", m.results.empty() ? "{}" : m.results);
    write_geometry(f.get(), m.geometry);
    if (m.has_network()) write_network(f.get(), m);
    write_f64(f.get(), "head_gates", m.head_gates);
    Handle c = make_group(f.get(), "curve");
    h5::write_attr_string(c.get(), "metric", m.curve.metric);
    write_f64(c.get(), "step", m.curve.step);
    write_f64(c.get(), "value", m.curve.value);
    write_provenance(f.get(), m.provenance);
    check_status(H5Fflush(f.get(), H5F_SCOPE_GLOBAL), tmp + ": flush");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(path + ": cannot move the finished model file into place (" + ec.message() + ")");
}

namespace {

LearnedModel read_in_process(const std::string& path) {
  Handle f = check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path + ": not an HDF5 file");
  const std::string ctx = path + ": /";
  if (!h5::attr_exists(f.get(), "format") || h5::read_attr_string(f.get(), "format", ctx) != kFormat)
    throw FormatError(path + ": attribute 'format' is not '" + std::string(kFormat) +
                      "'; not a kvsim learned-policy model");
  const std::int64_t version = h5::read_attr_i64(f.get(), "format_version", ctx);
  if (version != kModelFormatVersion)
    throw FormatError(path + ": attribute 'format_version' is " + std::to_string(version) + "; this kvsim reads " +
                      std::to_string(kModelFormatVersion));
  LearnedModel m;
  m.method = h5::read_attr_string(f.get(), "method", ctx);
  m.feature_set = h5::read_attr_string(f.get(), "feature_set", ctx);
  m.feature_version = static_cast<int>(h5::read_attr_i64(f.get(), "feature_version", ctx));
  try {
    m.features = parse_json(h5::read_attr_string(f.get(), "features", ctx), ctx + " attribute 'features'")
                     .get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(path + ": attribute 'features': expected a list of names (" + e.what() + ")");
  }
  m.results = h5::read_attr_string(f.get(), "results", ctx);
  m.geometry = read_geometry(f.get(), path);
  if (h5::link_exists(f.get(), "network")) read_network(f.get(), path, m);
  m.head_gates = read_f64(f.get(), "head_gates", path);
  Handle c = open_group(f.get(), "curve", path);
  m.curve.metric = h5::read_attr_string(c.get(), "metric", path + ": /curve");
  m.curve.step = read_f64(c.get(), "step", path);
  m.curve.value = read_f64(c.get(), "value", path);
  if (m.curve.step.size() != m.curve.value.size())
    throw FormatError(path + ": /curve step and value differ in length (" + std::to_string(m.curve.step.size()) +
                      " vs " + std::to_string(m.curve.value.size()) + ")");
  m.provenance = read_provenance(f.get(), path);
  if (m.has_network() && static_cast<int>(m.features.size()) != m.network.inputs())
    throw FormatError(path + ": " + std::to_string(m.features.size()) + " feature names for a network of " +
                      std::to_string(m.network.inputs()) + " inputs");
  if (!m.head_gates.empty() &&
      m.head_gates.size() != static_cast<std::size_t>(m.geometry.n_layers) * m.geometry.n_kv_heads)
    throw FormatError(path + ": dataset 'head_gates' holds " + std::to_string(m.head_gates.size()) +
                      " values; expected " + std::to_string(m.geometry.n_layers) + " layers x " +
                      std::to_string(m.geometry.n_kv_heads) + " KV heads");
  return m;
}

}  // namespace

LearnedModel read_learned_model(const std::string& path) {
  h5::silence_library_errors();
  if (!std::filesystem::exists(path)) throw Error(path + ": model file not found");
  // HDF5 1.10 can crash on a corrupt file: read it in a child first (a model file is small).
  probe_hdf5(
      path, [&] { read_in_process(path); }, "a kvsim learned-policy model (kvsim train)");
  return read_in_process(path);
}

void check_learned_model(const LearnedModel& m, const std::string& path, const std::string& method,
                         const ModelGeometry& g) {
  auto refuse = [&](const std::string& field, const std::string& has, const std::string& want) {
    throw Error(path + ": " + field + " is " + has + "; expected " + want);
  };
  if (m.method != method)
    refuse("attribute 'method'", "'" + m.method + "'", "'" + method + "' (train it with kvsim train " + method + ")");
  if (method != "rlkv") {  // every other method scores tokens with its network
    if (!m.has_network())
      refuse("group '/network'", "missing", "a network (a " + method + " model scores tokens with one)");
    if (m.network.inputs() != kFeatureCount || m.network.outputs() < 1)
      refuse("/network attribute 'sizes'",
             std::to_string(m.network.inputs()) + " inputs, " + std::to_string(m.network.outputs()) + " outputs",
             std::to_string(kFeatureCount) + " inputs (one per token feature) and at least one output");
  }
  if (m.has_network()) {  // per-head gates alone read no token features
    if (m.feature_set != kFeatureSet || m.feature_version != kFeatureVersion)
      refuse("attributes 'feature_set'/'feature_version'", m.feature_set + " v" + std::to_string(m.feature_version),
             std::string(kFeatureSet) + " v" + std::to_string(kFeatureVersion) + " (retrain with this kvsim)");
    if (m.features != feature_names()) refuse("attribute 'features'", "a different list", "this kvsim's feature names");
  }
  check_learned_geometry(m, path, g);
}

void check_learned_geometry(const LearnedModel& m, const std::string& path, const ModelGeometry& g) {
  const ModelGeometry& t = m.geometry;
  if (!same_kv_shape(t, g))
    throw Error(path + ": /geometry is " + kv_shape(t) + " (" + t.name + "); expected " + kv_shape(g) + " (" + g.name +
                "), the model this run replays");
}

std::vector<std::uint64_t> training_prompts(const LearnedModel& m) {
  std::vector<std::uint64_t> out;
  for (const TrainedRequest& r : m.provenance.requests) out.push_back(r.prompt);
  return out;
}

}  // namespace kvsim::learned
