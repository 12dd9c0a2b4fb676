#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "core/event_queue.h"

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

TEST_CASE("the event core's random numbers follow its seed", "[des]") {
  EventQueue<std::int64_t> a(42), b(42), c(43);
  std::vector<double> xa, xb, xc;
  for (int i = 0; i < 5; ++i) {
    xa.push_back(a.rng().uniform());
    xb.push_back(b.rng().normal());
    xc.push_back(c.rng().uniform());
  }
  EventQueue<std::int64_t> a2(42);
  CHECK(a2.rng().uniform() == xa[0]);
  CHECK(xa != xc);
  CHECK(a.seed() == 42);
  for (double x : xa) CHECK((x >= 0.0 && x < 1.0));
  // Rng streams: the same (seed, stream ids) gives the same numbers, other ids other ones.
  Rng s1(7, 1, 2), s2(7, 1, 2), s3(7, 1, 3);
  const auto v1 = s1.below(1000000), v2 = s2.below(1000000), v3 = s3.below(1000000);
  CHECK(v1 == v2);
  CHECK(v1 != v3);
}
