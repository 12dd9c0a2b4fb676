#include "core/heap_reuse.h"

#include <malloc.h>

namespace kvsim {

void keep_freed_memory_for_reuse() {
#if defined(__GLIBC__)
  // 32 MB is the largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2); a fixed
  // threshold also stops glibc adapting it. Trimming only past 1 GB of free top-of-heap.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace kvsim
