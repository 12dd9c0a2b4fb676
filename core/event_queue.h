#pragma once
// The discrete-event core shared by token-level replay (time = token steps) and the serving
// simulator (time = milliseconds). Events fire in (time, priority, insertion order): ties never
// depend on pointers or hash order, so a run is reproducible from its seed alone.
#include <cstdint>

#include "core/rng.h"
#include <functional>
#include <queue>
#include <stdexcept>
#include <vector>

namespace kvsim {

template <typename Time>
class EventQueue {
 public:
  using Action = std::function<void()>;

  // Every random choice a simulation makes comes from rng(), seeded here (and the seed is
  // written to every output by the caller), so a run is reproducible from its seed.
  explicit EventQueue(std::uint64_t seed = 0) : seed_(seed), rng_(seed) {}
  std::uint64_t seed() const { return seed_; }
  Rng& rng() { return rng_; }

  // Lower priority values fire first among events at the same time.
  void schedule(Time when, int priority, Action action) {
    if (when < now_) throw std::logic_error("EventQueue::schedule: event in the past");
    heap_.push(Entry{when, priority, next_seq_++, std::move(action)});
  }
  void schedule_in(Time delay, int priority, Action action) { schedule(now_ + delay, priority, std::move(action)); }

  // Runs the earliest event; false when none is left.
  bool step() {
    if (heap_.empty()) return false;
    Entry e = heap_.top();
    heap_.pop();
    now_ = e.when;
    e.action();
    return true;
  }
  // Runs events until none is left or the next one is later than `until`.
  void run_until(Time until) {
    while (!heap_.empty() && !(until < heap_.top().when)) step();
  }
  void run() {
    while (step()) {
    }
  }

  Time now() const { return now_; }
  std::size_t pending() const { return heap_.size(); }

 private:
  struct Entry {
    Time when;
    int priority;
    std::uint64_t seq;
    Action action;
  };
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      if (a.when != b.when) return b.when < a.when;
      if (a.priority != b.priority) return a.priority > b.priority;
      return a.seq > b.seq;
    }
  };
  std::uint64_t seed_;
  Rng rng_;
  std::priority_queue<Entry, std::vector<Entry>, Later> heap_;
  Time now_{};
  std::uint64_t next_seq_ = 0;
};

}  // namespace kvsim
