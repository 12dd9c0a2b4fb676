// Each validation rule of `kvsim trace check`, on a file crafted to break exactly that rule.
#include <catch2/catch.hpp>

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <set>
#include <algorithm>
#include <iostream>

#include "core/error.h"
#include "trace_fixtures.h"
#include "traces/h5_handle.h"
#include "traces/trace_check.h"
#include "traces/trace_reader.h"
#include "traces/trace_writer.h"
#include "traces/synth_trace.h"
#include "sim/sweep.h"

using namespace kvsim;
using h5::Handle;

namespace {

// Copies the pristine small trace and lets `edit` change it through the raw HDF5 API.
std::string crafted(const std::string& name, const std::function<void(hid_t file)>& edit) {
  static const std::string pristine = test::write_small_trace("pristine.h5");
  const std::string path = test::scratch_file(name);
  std::filesystem::copy_file(pristine, path, std::filesystem::copy_options::overwrite_existing);
  Handle f = h5::check(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), "open for edit");
  edit(f.get());
  return path;
}

template <typename T>
void overwrite_dataset(hid_t file, const char* path, hid_t mem_type, const std::vector<T>& data) {
  Handle d = h5::check(H5Dopen2(file, path, H5P_DEFAULT), path);
  h5::check_status(H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), path);
}

template <typename T>
std::vector<T> read_dataset(hid_t file, const char* path, hid_t mem_type, std::size_t n) {
  std::vector<T> out(n);
  Handle d = h5::check(H5Dopen2(file, path, H5P_DEFAULT), path);
  h5::check_status(H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), path);
  return out;
}

std::string all_errors(const TraceCheckReport& r) {
  std::string s;
  for (const auto& e : r.errors) s += e + "\n";
  return s;
}

}  // namespace

TEST_CASE("a pristine synthetic trace passes the check", "[check]") {
  const TraceCheckReport r = check_trace(test::write_small_trace("ok.h5"));
  INFO(all_errors(r));
  CHECK(r.ok());
  CHECK(r.requests_checked == 3);
  CHECK(r.tokens_checked == 3 * 63);
}

TEST_CASE("trace check names each broken rule", "[check]") {
  struct Case {
    const char* name;
    std::function<void(hid_t)> edit;
    std::vector<std::string> expect;  // substrings of one error message
  };
  const std::vector<Case> cases = {
      {"wrong_format",
       [](hid_t f) { h5::write_attr_string(f, "format", "kvcache"); },
       {"'format' is \"kvcache\"", "expected \"kvtrace\""}},
      {"no_format", [](hid_t f) { H5Adelete(f, "format"); }, {"'format' is missing", "not a kvtrace file"}},
      {"future_version",
       [](hid_t f) { h5::write_attr_i64(f, "version", 7); },
       {"version 7 is not supported", "reads version 1"}},
      {"missing_dataset",
       [](hid_t f) { H5Ldelete(f, "requests/r1/v", H5P_DEFAULT); },
       {"request 'r1'", "dataset 'v' is missing"}},
      {"shape_mismatch",
       [](hid_t f) {
         H5Ldelete(f, "requests/r2/k", H5P_DEFAULT);
         const hsize_t dims[4] = {4, 63, 3, 16};  // 3 kv heads, model says 2
         Handle s = h5::check(H5Screate_simple(4, dims, nullptr), "space");
         Handle d = h5::check(
             H5Dcreate2(f, "requests/r2/k", h5::half_type(), s.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "k");
       },
       {"request 'r2'", "dataset 'k' has shape [4, 63, 3, 16]", "expected [4, 63, 2, 16]"}},
      {"wrong_dtype",
       [](hid_t f) {
         H5Ldelete(f, "requests/r0/q", H5P_DEFAULT);
         const hsize_t dims[4] = {4, 63, 4, 16};
         Handle s = h5::check(H5Screate_simple(4, dims, nullptr), "space");
         Handle d = h5::check(
             H5Dcreate2(f, "requests/r0/q", H5T_IEEE_F32LE, s.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "q");
       },
       {"dataset 'q' must be IEEE float16"}},
      {"unwritten_q",  // the right shape and type, but no data stored: never allocated, never read
       [](hid_t f) {
         H5Ldelete(f, "requests/r0/q", H5P_DEFAULT);
         const hsize_t dims[4] = {4, 63, 4, 16};
         Handle s = h5::check(H5Screate_simple(4, dims, nullptr), "space");
         Handle d = h5::check(
             H5Dcreate2(f, "requests/r0/q", h5::half_type(), s.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "q");
       },
       {"request 'r0'", "dataset 'q'", "claims 32256 bytes of data but stores 0"}},
      {"nan_in_k",
       [](hid_t f) {
         auto k = read_dataset<std::uint16_t>(f, "requests/r1/k", h5::half_type(), 4 * 63 * 2 * 16);
         k[(2 * 63 + 10) * 2 * 16 + 1 * 16 + 5] = 0x7e00;  // layer 2, token 10, head 1, dim 5
         k[(2 * 63 + 11) * 2 * 16] = 0xfc00;               // and a -inf
         overwrite_dataset(f, "requests/r1/k", h5::half_type(), k);
       },
       {"request 'r1' dataset 'k' layer 2", "2 non-finite values", "first at token 10, head 1, dim 5"}},
      {"positions_not_increasing",
       [](hid_t f) {
         auto p = read_dataset<std::int32_t>(f, "requests/r0/positions", H5T_NATIVE_INT32, 63);
         p[20] = 5;
         overwrite_dataset(f, "requests/r0/positions", H5T_NATIVE_INT32, p);
       },
       {"request 'r0'", "positions[20] = 5 after 19", "strictly increasing"}},
      {"segment_out_of_range",
       [](hid_t f) {
         auto s = read_dataset<std::int8_t>(f, "requests/r2/segments", H5T_NATIVE_INT8, 63);
         s[30] = 4;
         overwrite_dataset(f, "requests/r2/segments", H5T_NATIVE_INT8, s);
       },
       {"request 'r2'", "segments[30] = 4", "expected 0..3 (system,context,question,generated)"}},
      {"q_index_out_of_range",
       [](hid_t f) {
         auto q = read_dataset<std::int32_t>(f, "requests/r0/q_index", H5T_NATIVE_INT32, 63);
         q[62] = 63;
         overwrite_dataset(f, "requests/r0/q_index", H5T_NATIVE_INT32, q);
       },
       {"q_index[62] = 63", "[0, T = 63)"}},
      {"model_attr_missing",
       [](hid_t f) { H5Adelete_by_name(f, "model", "n_kv_heads", H5P_DEFAULT); },
       {"/model", "attribute 'n_kv_heads' is missing"}},
      {"model_inconsistent",
       [](hid_t f) {
         Handle m = h5::check(H5Gopen2(f, "model", H5P_DEFAULT), "model");
         h5::write_attr_i64(m.get(), "n_kv_heads", 3);
       },
       {"model/n_q_heads = 4 is not a multiple of model/n_kv_heads = 3"}},
      {"ref_positive_logp",
       [](hid_t f) {
         auto lp = read_dataset<float>(f, "requests/r1/ref/topk_logp", H5T_NATIVE_FLOAT, 11 * 4);
         lp[5] = 0.5f;
         overwrite_dataset(f, "requests/r1/ref/topk_logp", H5T_NATIVE_FLOAT, lp);
       },
       {"request 'r1' ref", "topk_logp[1, 1]", "expected a log-probability <= 0"}},
  };
  for (const Case& c : cases) {
    SECTION(c.name) {
      const TraceCheckReport r = check_trace(crafted(std::string(c.name) + ".h5", c.edit));
      const std::string errors = all_errors(r);
      INFO(errors);
      REQUIRE_FALSE(r.ok());
      bool one_line_has_all = false;
      for (const auto& e : r.errors) {
        bool all = true;
        for (const auto& want : c.expect) all = all && e.find(want) != std::string::npos;
        one_line_has_all = one_line_has_all || all;
      }
      CHECK(one_line_has_all);
      CHECK(errors.find(test::scratch_dir().string()) != std::string::npos);  // names the file
    }
  }
}

TEST_CASE("hostile files give errors, never crashes", "[check]") {
  SECTION("missing file") {
    const auto r = check_trace(test::scratch_file("nope.h5"));
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0], Catch::Contains("no such file"));
  }
  SECTION("not HDF5") {
    const std::string path = test::scratch_file("garbage.h5");
    std::ofstream(path) << std::string(4096, 'x');
    const auto r = check_trace(path);
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0], Catch::Contains("not an HDF5 file"));
  }
  SECTION("truncated at many points") {
    const std::string pristine = test::write_small_trace("to_truncate.h5");
    const auto size = std::filesystem::file_size(pristine);
    for (double frac : {0.001, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99}) {
      const std::string path = test::scratch_file("truncated.h5");
      std::filesystem::copy_file(pristine, path, std::filesystem::copy_options::overwrite_existing);
      std::filesystem::resize_file(path, static_cast<std::uintmax_t>(static_cast<double>(size) * frac));
      const auto r = check_trace(path);
      INFO("truncated to " << frac);
      CHECK_FALSE(r.ok());
    }
  }
  SECTION("reader refuses data of a request that is not committed") {
    const std::string path = crafted("uncommitted.h5", [](hid_t f) {
      Handle g = h5::check(H5Gopen2(f, "requests/r1", H5P_DEFAULT), "r1");
      h5::write_attr_string(g.get(), "status", "writing");
    });
    TraceReader reader(path);
    CHECK(reader.request_ids() == std::vector<std::string>{"r0", "r2"});
    CHECK(reader.incomplete_request_ids() == std::vector<std::string>{"r1"});
    CHECK_THROWS_WITH(reader.header("r1"), Catch::Contains("request 'r1' is incomplete"));
    CHECK_THROWS_WITH(reader.header("r9"), Catch::Contains("request 'r9' does not exist"));
    const auto r = check_trace(path);
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0], Catch::Contains("'r1' is incomplete"));
  }
}

TEST_CASE("randomly corrupted files never take the checker down", "[check]") {
  // Byte flips concentrated in the metadata at the front of the file: some corrupt an object
  // header badly enough to crash HDF5 1.10 itself; the isolated check must still answer.
  const std::string pristine = test::write_small_trace("fuzz_base.h5");
  std::ifstream in(pristine, std::ios::binary);
  const std::string base((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937 gen(1);
  int failed = 0;
  for (int i = 0; i < 120; ++i) {
    std::string bytes = base;
    const int flips = std::array{1, 4, 16}[gen() % 3];
    for (int f = 0; f < flips; ++f) {
      const std::size_t span = gen() % 10 < 7 ? std::min<std::size_t>(8192, bytes.size()) : bytes.size();
      bytes[gen() % span] = static_cast<char>(gen() & 0xff);
    }
    const std::string path = test::scratch_file("fuzz.h5");
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    const TraceCheckReport r = check_trace_isolated(path);
    if (!r.ok()) {
      ++failed;
      for (const auto& e : r.errors) REQUIRE(e.find(path) != std::string::npos);  // every line names the file
    }
  }
  CHECK(failed > 30);  // most metadata damage is detected, not silently accepted
}

namespace {

// Where each chunk of a request's dataset lies in the file: (byte offset, size), one per chunk.
struct ChunkSpot {
  std::string request, dataset;
  int layer = 0;  // the chunk index along the first dimension (the layer, for K/V/Q)
  haddr_t offset = 0;
  hsize_t size = 0;
};

std::vector<ChunkSpot> data_chunks(const std::string& path) {
  std::vector<ChunkSpot> out;
  const TraceReader reader(path);
  Handle f = h5::check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open");
  for (const auto& id : reader.request_ids())
    for (const char* name : {"k", "v", "q", "tokens", "positions", "segments", "q_index", "ref/index", "ref/topk_ids",
                             "ref/topk_logp", "ref/lse"}) {
      const std::string where = "requests/" + id + "/" + name;
      Handle d = h5::check(H5Dopen2(f.get(), where.c_str(), H5P_DEFAULT), where);
      Handle space = h5::check(H5Dget_space(d.get()), where);
      const int rank = H5Sget_simple_extent_ndims(space.get());
      const int chunks = rank == 4 ? reader.geometry().n_layers : 1;
      for (int c = 0; c < chunks; ++c) {
        std::vector<hsize_t> coord(static_cast<std::size_t>(rank), 0);
        coord[0] = static_cast<hsize_t>(c);
        unsigned mask = 0;
        ChunkSpot s{id, name, c, 0, 0};
        h5::check_status(H5Dget_chunk_info_by_coord(d.get(), coord.data(), &mask, &s.offset, &s.size),
                         where + ": chunk");
        out.push_back(s);
      }
    }
  return out;
}

void flip(const std::string& path, haddr_t at, char mask) {
  std::fstream io(path, std::ios::binary | std::ios::in | std::ios::out);
  io.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  io.get(c);
  io.seekp(static_cast<std::streamoff>(at));
  io.put(static_cast<char>(c ^ mask));
}

}  // namespace

TEST_CASE("a damaged chunk fails its read and the check, naming request, tensor and layer", "[check]") {
  const std::string path = test::write_small_trace("damaged.h5");
  {
    const TraceReader reader(path);
    for (const auto& id : reader.request_ids()) CHECK(reader.checksummed(id));
  }
  const auto chunks = data_chunks(path);
  auto spot = [&](const std::string& req, const std::string& ds, int layer) {
    return *std::find_if(chunks.begin(), chunks.end(),
                         [&](const ChunkSpot& s) { return s.request == req && s.dataset == ds && s.layer == layer; });
  };
  const ChunkSpot v1 = spot("r1", "v", 1), k2 = spot("r0", "k", 2), q0 = spot("r2", "q", 0);
  const ChunkSpot tokens = spot("r2", "tokens", 0), lse = spot("r2", "ref/lse", 0);
  flip(path, v1.offset + v1.size / 2, 0x10);  // one bit of a value
  flip(path, k2.offset + 3, 0x01);            // the low bit of the first key's first half
  flip(path, q0.offset + q0.size - 1, 0x7f);  // the chunk's last byte
  flip(path, tokens.offset + 2, 0x08);        // two of r2's header and reference arrays
  flip(path, lse.offset, 0x01);
  const TraceCheckReport r = check_trace(path);
  INFO(all_errors(r));
  REQUIRE(r.errors.size() == 5);  // each damaged chunk once, the others read
  CHECK_THAT(all_errors(r), Catch::Contains("request 'r2': reading dataset 'tokens'") &&
                                Catch::Contains("request 'r2': reading dataset 'ref/lse'"));
  CHECK_THAT(all_errors(r), Catch::Contains("request 'r1' dataset 'v': reading layer 1") &&
                                Catch::Contains("request 'r0' dataset 'k': reading layer 2") &&
                                Catch::Contains("request 'r2' dataset 'q': reading layer 0") &&
                                Catch::Contains("Fletcher32"));
  CHECK(r.requests_checked == 3);
  const TraceReader reader(path);
  std::vector<float> buf(reader.layer_elements("r1", Tensor::V));
  CHECK_THROWS_WITH(reader.read_layer("r1", Tensor::V, 1, buf), Catch::Contains("'r1' dataset 'v': reading layer 1"));
  CHECK_NOTHROW(reader.read_layer("r1", Tensor::V, 0, buf));
}

TEST_CASE("50 random byte flips in a trace's data never pass the check or change results silently", "[check]") {
  const std::string pristine = test::write_small_trace("flips_base.h5");
  const auto chunks = data_chunks(pristine);
  std::mt19937 gen(5);
  for (int round = 0; round < 5; ++round) {
    const std::string path = test::scratch_file("flips.h5");
    std::filesystem::copy_file(pristine, path, std::filesystem::copy_options::overwrite_existing);
    std::set<std::string> damaged;
    for (int i = 0; i < 50; ++i) {
      const ChunkSpot& s = chunks[gen() % chunks.size()];
      flip(path, s.offset + gen() % s.size, static_cast<char>(1 + gen() % 255));
      if (s.dataset == "k" || s.dataset == "v" || s.dataset == "q")
        damaged.insert("request '" + s.request + "' dataset '" + s.dataset + "': reading layer " +
                       std::to_string(s.layer));
    }
    const TraceCheckReport r = check_trace(path);
    INFO("round " << round << "\n" << all_errors(r));
    CHECK_FALSE(r.ok());
    for (const auto& d : damaged) CHECK_THAT(all_errors(r), Catch::Contains(d));  // every damaged tensor chunk
    SweepSpec spec;
    spec.traces = {path};
    spec.policies = {"snapkv"};
    spec.budgets = {0.5};
    spec.out_csv = test::scratch_file("flips.csv");
    spec.force = true;
    spec.progress = false;
    CHECK_THROWS_WITH(run_sweep(spec, std::cerr), Catch::Contains(path + ": request '"));
  }
}

TEST_CASE("a trace written before checksums still reads, with a note", "[check]") {
  const std::string path = test::scratch_file("unchecked.h5");
  {
    TraceWriterOptions opts;
    opts.overwrite = true;
    opts.checksums = false;
    const SynthConfig cfg = test::small_synth_config();
    TraceWriter writer(path, cfg.geometry, synth_capture_info(cfg), opts);
    write_synth_trace(cfg, writer);
    writer.close();
  }
  const TraceReader reader(path);
  CHECK_FALSE(reader.checksummed("r0"));
  const TraceCheckReport r = check_trace(path);
  CHECK(r.ok());
  REQUIRE(r.notes.size() == 1);
  CHECK_THAT(r.notes[0], Catch::Contains("3 of 3 requests carry no checksums"));
  // Read the same as the checked file of the same data.
  const TraceReader checked(test::write_small_trace("checked.h5"));
  std::vector<float> a(reader.layer_elements("r2", Tensor::K)), b(a.size());
  reader.read_layer("r2", Tensor::K, 1, a);
  checked.read_layer("r2", Tensor::K, 1, b);
  CHECK(a == b);
}
