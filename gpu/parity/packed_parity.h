#pragma once
// kvsim-parity's sections on caches held packed (core/packed_kv.h): the unpack kernel against
// unpack_tensor, and the fused packed decode against attention over the same rows read back.
#include <string>

#include "gpu/kv_format.h"
#include "gpu/parity/parity_buffers.h"
#include "gpu/parity/parity_report.h"

namespace kvsim::gpu {

// n rows of every row kind (fp16, int4 / int2 codes, rotated low rank) unpacked on the device
// against unpack_tensor; with `bench`, the unpack's bandwidth against `copy_gbs`.
void packed_unpack_parity(const std::string& name, int head_dim, std::int64_t n, const Bench& bench, ParityReport& r,
                          double copy_gbs);

// attend_decode_packed over s.capacity rows per entry (a fully packed entry, packed prefixes with
// fp16 rows after them, an entry with none) against attend_kept_ref over the rows unpack_tensor
// reads back: output and softmax weights. With `bench`, an int4 cache decoded by the fused kernel,
// by unpack-then-attend and, as fp16, by attend_decode, each against `copy_gbs`, and the fused
// output against attend_quant_ref.
void packed_decode_parity(const std::string& name, const AttnShape& s, const Bench& bench, ParityReport& r,
                          double copy_gbs);

}  // namespace kvsim::gpu
