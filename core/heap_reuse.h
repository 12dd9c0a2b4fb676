#pragma once
// Replay and capture allocate and free buffers of a few MB per (request, layer): attention rows,
// gathered K/V, policy scores. glibc hands blocks that large back to the kernel on free (mmap /
// trim), so every layer pays for fresh zeroed pages again (measured: ~8% of a 48-config sweep
// in page faults). Keeping freed memory in the heap for reuse trades a little resident memory
// (the largest layer's buffers, which were resident anyway) for none of that.
namespace kvsim {

// Call once, early in main(), before threads start.
void keep_freed_memory_for_reuse();

}  // namespace kvsim
