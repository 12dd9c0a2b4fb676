#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "sim/event_queue.h"

using namespace kvsim;

TEST_CASE("events fire by time, then priority, then insertion order", "[des]") {
  EventQueue<std::int64_t> q;
  std::vector<std::string> log;
  q.schedule(5, 1, [&] { log.push_back("t5 p1 a"); });
  q.schedule(5, 0, [&] { log.push_back("t5 p0"); });
  q.schedule(2, 9, [&] { log.push_back("t2"); });
  q.schedule(5, 1, [&] { log.push_back("t5 p1 b"); });
  q.schedule(7, 0, [&] {
    log.push_back("t7");
    q.schedule_in(0, 0, [&] { log.push_back("t7 follow-up"); });
  });
  q.run();
  CHECK(log == std::vector<std::string>{"t2", "t5 p0", "t5 p1 a", "t5 p1 b", "t7", "t7 follow-up"});
  CHECK(q.now() == 7);
}

TEST_CASE("schedule refuses the past and run_until stops at the horizon", "[des]") {
  EventQueue<double> q;
  int fired = 0;
  q.schedule(1.0, 0, [&] { ++fired; });
  q.schedule(3.0, 0, [&] { ++fired; });
  q.run_until(2.0);
  CHECK(fired == 1);
  CHECK(q.now() == 1.0);
  CHECK(q.pending() == 1);
  q.step();
  CHECK_THROWS_AS(q.schedule(2.5, 0, [] {}), std::logic_error);
}
