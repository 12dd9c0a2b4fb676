#include "cuda_emu.h"

#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__)
// Switching threads is most of what the emulator does (twice per barrier per thread), and glibc's
// swapcontext makes a system call each time (it saves the signal mask): on x86-64 a switch is
// the callee-saved registers, the SSE and x87 control words and the stack pointer, in user space.
// kvsim_emu_switch(&save, load) stores the current stack pointer in save and resumes the one in
// load; a new thread's first resume "returns" into kvsim_emu_start, which calls rbx. A return to
// another stack is what a CET shadow stack forbids: this file is built without -fcf-protection
// (tests/CMakeLists.txt), so a binary holding it never claims shadow-stack support.
asm(R"(
  .pushsection .text
  .globl kvsim_emu_switch
  .type kvsim_emu_switch, @function
kvsim_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kvsim_emu_switch, .-kvsim_emu_switch

  .globl kvsim_emu_start
  .type kvsim_emu_start, @function
kvsim_emu_start:
  callq *%rbx
  ud2
  .size kvsim_emu_start, .-kvsim_emu_start
  .popsection
)");
extern "C" void kvsim_emu_switch(void** save, void* load);
extern "C" void kvsim_emu_start();
#endif

// The linker's bounds of the section every static __shared__ array is in (cuda_emu.h); weak, so
// a program without any has none.
extern "C" char __start_kvsim_emu_shared[] __attribute__((weak));
extern "C" char __stop_kvsim_emu_shared[] __attribute__((weak));

namespace emu {

namespace {

enum class Wait { None, Block, Warp, Done };

// Where a suspended thread (or the scheduler) resumes.
struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
  // A new thread on [base, base + size) that will call fn(), with this thread's floating-point
  // control words.
  void start(char* base, std::size_t size, void (*fn)()) {
    auto top = reinterpret_cast<std::uintptr_t>(base + size) & ~std::uintptr_t{15};
    auto* slot = reinterpret_cast<std::uint64_t*>(top - 16);  // kvsim_emu_start runs with rsp = top - 16 (16-aligned)
    std::uint32_t mxcsr = 0;
    std::uint16_t fpcw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    *--slot = reinterpret_cast<std::uint64_t>(&kvsim_emu_start);  // ret's target
    *--slot = 0;                                                  // rbp
    *--slot = reinterpret_cast<std::uint64_t>(fn);                // rbx
    *--slot = 0;                                                  // r12
    for (int i = 0; i < 3; ++i) *--slot = 0;                      // r13, r14, r15
    *--slot = static_cast<std::uint64_t>(mxcsr) | static_cast<std::uint64_t>(fpcw) << 32;
    sp = slot;
  }
  static void swap(Context& from, const Context& to) { kvsim_emu_switch(&from.sp, to.sp); }
#else
  ucontext_t uc;
  void start(char* base, std::size_t size, void (*fn)()) {
    getcontext(&uc);
    uc.uc_stack.ss_sp = base;
    uc.uc_stack.ss_size = size;
    uc.uc_link = nullptr;
    makecontext(&uc, fn, 0);
  }
  static void swap(Context& from, const Context& to) { swapcontext(&from.uc, &to.uc); }
#endif
};

struct Thread {
  ThreadInfo info;
  Context context;
  Wait wait = Wait::None;
};

// One block at a time: its threads, their stacks, the scheduler's context.
struct BlockRun {
  std::vector<Thread> threads;
  std::vector<char*> stacks;         // from stack_pool_
  std::vector<std::uint64_t> slots;  // [threads]: what each lane deposited in a shuffle
  std::vector<unsigned char> shared;
  Context scheduler;
  int running = -1;
  Body body = nullptr;
  void* state = nullptr;
};

constexpr std::size_t kStack = 256 * 1024, kGuard = 4096;
BlockRun* run_ = nullptr;

// A thread's stack with an inaccessible page below it: a kernel that overflows its stack faults
// there instead of corrupting its neighbour's.
struct Stack {
  char* base = nullptr;  // the guard page, then kStack usable bytes
  Stack() {
    void* p = mmap(nullptr, kGuard + kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("cuda_emu: cannot map a thread stack");
    base = static_cast<char*>(p);
    mprotect(base, kGuard, PROT_NONE);
  }
  ~Stack() { munmap(base, kGuard + kStack); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* usable() const { return base + kGuard; }
};
std::vector<std::unique_ptr<Stack>> stack_pool_;  // grows to the largest block, then reused
int last_error_ = 0;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "cuda_emu: %s\n", what.c_str());
  std::abort();  // a kernel that would hang or misbehave on a GPU: stop the test here
}

void yield(Wait w) {
  Thread& t = run_->threads[static_cast<std::size_t>(run_->running)];
  t.wait = w;
  Context::swap(t.context, run_->scheduler);
}

void entry() {
  run_->body(run_->state);
  yield(Wait::Done);  // never resumed
}

// Releases a barrier when every live thread of its group waits on it; false when nothing can run.
bool release(BlockRun& b) {
  bool all_block = true, any = false;
  for (const Thread& t : b.threads)
    if (t.wait != Wait::Done) {
      any = true;
      all_block = all_block && t.wait == Wait::Block;
    }
  if (!any) return false;
  if (all_block) {
    for (Thread& t : b.threads)
      if (t.wait == Wait::Block) t.wait = Wait::None;
    return true;
  }
  bool released = false;
  for (std::size_t w0 = 0; w0 < b.threads.size(); w0 += 32) {
    const std::size_t w1 = std::min(b.threads.size(), w0 + 32);
    bool all_warp = true, live = false;
    for (std::size_t i = w0; i < w1; ++i)
      if (b.threads[i].wait != Wait::Done) {
        live = true;
        all_warp = all_warp && b.threads[i].wait == Wait::Warp;
      }
    if (live && all_warp) {
      for (std::size_t i = w0; i < w1; ++i)
        if (b.threads[i].wait == Wait::Warp) b.threads[i].wait = Wait::None;
      released = true;
    }
  }
  return released;
}

// Runs one block to completion; on its own (not inlined into launch's loops) since the contexts
// it switches between return into it.
__attribute__((noinline)) void run_block(BlockRun& b, uint3 block_id, dim3 block, dim3 grid, std::size_t shared_bytes) {
  const std::size_t threads = b.threads.size();
  b.shared.assign(shared_bytes, 0xFF);                                     // NaN floats: reading before writing shows
  char *first = __start_kvsim_emu_shared, *end = __stop_kvsim_emu_shared;  // static shared arrays alike
  if (first && end > first) std::memset(first, 0xFF, static_cast<std::size_t>(end - first));
  for (std::size_t i = 0; i < threads; ++i) {
    Thread& t = b.threads[i];
    const auto ui = static_cast<unsigned>(i);
    t.info = ThreadInfo{uint3{ui % block.x, ui / block.x % block.y, ui / (block.x * block.y)}, block_id, block, grid};
    t.wait = Wait::None;
    t.context.start(b.stacks[i], kStack, entry);
  }
  // Odd blocks run their threads last to first between barriers: a missing barrier between a
  // write by one thread and a read by another shows in one order or the other.
  const bool reverse = (block_id.x + block_id.y + block_id.z) % 2 == 1;
  for (;;) {
    bool ran = false;
    for (std::size_t k = 0; k < threads; ++k) {
      const std::size_t i = reverse ? threads - 1 - k : k;
      if (b.threads[i].wait == Wait::None) {
        b.running = static_cast<int>(i);
        Context::swap(b.scheduler, b.threads[i].context);
        ran = true;
      }
    }
    if (ran) continue;
    if (release(b)) continue;
    if (std::all_of(b.threads.begin(), b.threads.end(), [](const Thread& t) { return t.wait == Wait::Done; })) return;
    fail("block (" + std::to_string(block_id.x) + ", " + std::to_string(block_id.y) +
         "): a barrier that not every live thread of its block or warp reaches (a GPU would hang)");
  }
}

}  // namespace

const ThreadInfo& current() { return run_->threads[static_cast<std::size_t>(run_->running)].info; }
int lane() { return run_->running % 32; }
void* dynamic_shared_bytes() { return run_->shared.data(); }
void sync_block() { yield(Wait::Block); }
void sync_warp() { yield(Wait::Warp); }

std::uint64_t exchange(std::uint64_t bits, int src) {
  const int me = run_->running, warp0 = me - me % 32;
  run_->slots[static_cast<std::size_t>(me)] = bits;
  sync_warp();  // every lane has deposited
  const int from = warp0 + (src & 31);
  if (from >= static_cast<int>(run_->threads.size())) fail("shuffle from a lane past the block");
  if (run_->threads[static_cast<std::size_t>(from)].wait == Wait::Done)
    fail("shuffle from a lane that has returned (undefined on a GPU)");
  const std::uint64_t got = run_->slots[static_cast<std::size_t>(from)];
  sync_warp();  // every lane has read before the slots are reused
  return got;
}

bool launch(dim3 grid, dim3 block, std::size_t shared_bytes, Body body, void* state) {
  const std::size_t threads = static_cast<std::size_t>(block.x) * block.y * block.z;
  const std::size_t blocks = static_cast<std::size_t>(grid.x) * grid.y * grid.z;
  if (blocks == 0 || threads == 0 || threads > 1024 || shared_bytes > 48 * 1024) {
    last_error_ = 9;  // cudaErrorInvalidConfiguration
    return false;
  }
  BlockRun b;
  b.threads.resize(threads);
  b.slots.resize(threads);
  while (stack_pool_.size() < threads) stack_pool_.push_back(std::make_unique<Stack>());
  for (std::size_t i = 0; i < threads; ++i) b.stacks.push_back(stack_pool_[i]->usable());
  b.body = body;
  b.state = state;
  BlockRun* outer = run_;
  run_ = &b;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) run_block(b, uint3{bx, by, bz}, block, grid, shared_bytes);
  run_ = outer;
  return true;
}

void set_last_error(int code) { last_error_ = code; }
int take_last_error() {
  const int e = last_error_;
  last_error_ = 0;
  return e;
}

}  // namespace emu
