#pragma once
// Replay and capture allocate and free buffers of a few MB per (request, layer): attention rows,
// gathered K/V, policy scores. glibc gives freed memory at the top of a heap back to the kernel
// past its trim threshold, and maps the largest blocks separately, so every layer paid for fresh
// zeroed pages again (measured on a 48-config sweep: 290K page faults -> 52K, 8% of its time).
// Keeping freed memory for reuse costs some resident memory: each thread's arena keeps its peak
// (bench_sweep's peak RSS: 100 MB -> 109 MB).
namespace kvsim {

// Call once, early in main().
void keep_freed_memory_for_reuse();

}  // namespace kvsim
