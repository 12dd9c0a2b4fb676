#pragma once
// `kvsim sweep merge`: joins the result files of a complete set of shards (`kvsim sweep --shard
// i/n`, any machines) into the file one serial sweep would have written, byte for byte, and their
// detail files likewise. Shard i holds the requests k with k % n == i in the serial order, so the
// serial order is rebuilt by taking one request from each shard in turn; no trace is read.
#include <string>
#include <vector>

#include "sim/sweep.h"

namespace kvsim {

struct SweepMergeSpec {
  std::vector<std::string> inputs;         // the shards' result CSVs, in any order
  std::vector<std::string> detail_inputs;  // their --detail files, in the same order as inputs (or none)
  std::string out_csv;
  std::string detail_jsonl;  // required with detail_inputs
  bool force = false;        // replace an existing out_csv / detail_jsonl
};

// Throws naming the file and what is wrong: not a shard's result file, shards of different
// configurations, a shard missing or given twice, a shard that did not finish (resume it), a
// request in two shards, detail that does not match its CSV. Returns the merged summary.
std::vector<SweepSummaryRow> merge_sweeps(const SweepMergeSpec& spec);

}  // namespace kvsim
