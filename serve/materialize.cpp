#include "serve/materialize.h"

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/dag_shortest_paths.hpp>
#include <cmath>
#include <limits>

namespace kvsim::serve {

namespace {

struct Edge {
  double ms = 0;
  Way way = Way::Recompute;
};
using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, boost::no_property, Edge>;

double run_bytes(const std::vector<BlockState>& blocks, std::size_t from, std::size_t to) {
  double b = 0;
  for (std::size_t i = from; i < to; ++i) b += blocks[i].bytes;
  return b;
}

double recompute_ms(const BlockState& b, const MaterializeCosts& c) {
  return c.prefill.recompute_ms(b.start, b.tokens);
}

double transition_ms(const BlockState& b, const MaterializeCosts& c) {
  const std::int64_t k = transition_tokens(b.tokens, c.transition_diff);
  const double fix = c.prefill.recompute_ms(b.start + b.tokens - k, k);  // the tail after the first difference
  if (b.sibling_tier == 0) return fix;
  return c.links[static_cast<std::size_t>(b.sibling_tier)].ms(b.sibling_bytes) + fix;
}

// Every way of each block as an edge: i -> i+1 for one block, i -> k for every run i..k-1 that one
// tier holds, loaded as one transfer (a shorter run lets another tier or way take over at k).
Graph build_graph(const std::vector<BlockState>& blocks, const MaterializeCosts& c) {
  const std::size_t n = blocks.size();
  Graph g(n + 1);
  for (std::size_t i = 0; i < n; ++i) {
    const BlockState& b = blocks[i];
    if (b.in[0]) boost::add_edge(i, i + 1, Edge{0.0, Way::Hbm}, g);
    boost::add_edge(i, i + 1, Edge{recompute_ms(b, c), Way::Recompute}, g);
    if (c.transitions && b.sibling_tier >= 0 && !b.in[0] &&
        (b.sibling_tier == 0 || c.links[static_cast<std::size_t>(b.sibling_tier)].gbps > 0))
      boost::add_edge(i, i + 1, Edge{transition_ms(b, c), Way::Transition}, g);
    for (int t = 1; t < kTiers; ++t) {
      const Link& link = c.links[static_cast<std::size_t>(t)];
      if (!b.in[static_cast<std::size_t>(t)] || link.gbps <= 0) continue;
      const Way way = t == 1 ? Way::LoadDram : Way::LoadSsd;
      double run = 0;
      for (std::size_t k = i; k < n && blocks[k].in[static_cast<std::size_t>(t)]; ++k) {
        run += blocks[k].bytes;
        boost::add_edge(i, k + 1, Edge{link.ms(run), way}, g);
      }
    }
  }
  return g;
}

// Load-only: every block outside HBM that a tier holds is loaded from the fastest such tier (runs
// in one tier as one transfer), the rest recomputed.
double load_only_ms(const std::vector<BlockState>& blocks, const MaterializeCosts& c) {
  double ms = 0;
  std::size_t i = 0;
  while (i < blocks.size()) {
    const BlockState& b = blocks[i];
    int tier = -1;
    for (int t = 1; t < kTiers && tier < 0 && !b.in[0]; ++t)
      if (b.in[static_cast<std::size_t>(t)] && c.links[static_cast<std::size_t>(t)].gbps > 0) tier = t;
    if (tier < 0) {
      ms += b.in[0] ? 0.0 : recompute_ms(b, c);
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    while (j < blocks.size() && !blocks[j].in[0] && blocks[j].in[static_cast<std::size_t>(tier)]) ++j;
    ms += c.links[static_cast<std::size_t>(tier)].ms(run_bytes(blocks, i, j));
    i = j;
  }
  return ms;
}

}  // namespace

std::string way_name(Way w) {
  static const char* names[kWays] = {"hbm", "dram", "ssd", "recompute", "transition"};
  return names[static_cast<int>(w)];
}

std::int64_t transition_tokens(std::int64_t tokens, double diff) {
  return std::min(tokens,
                  std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(diff * static_cast<double>(tokens)))));
}

MaterializePlan plan_materialization(const std::vector<BlockState>& blocks, const MaterializeCosts& c) {
  MaterializePlan plan;
  const std::size_t n = blocks.size();
  plan.way.assign(n, Way::Recompute);
  for (const BlockState& b : blocks) plan.recompute_only_ms += b.in[0] ? 0.0 : recompute_ms(b, c);
  plan.load_only_ms = load_only_ms(blocks, c);
  if (n == 0) return plan;
  const Graph g = build_graph(blocks, c);
  std::vector<double> dist(n + 1);
  std::vector<std::size_t> pred(n + 1);
  boost::dag_shortest_paths(g, 0,
                            boost::distance_map(dist.data())
                                .predecessor_map(pred.data())
                                .weight_map(boost::get(&Edge::ms, g))
                                .distance_inf(std::numeric_limits<double>::infinity())
                                .distance_zero(0.0));
  plan.ms = dist[n];
  // Walk back; among parallel edges take the one that realises the distance (the first added on a
  // tie: HBM, then recompute, then transition, then loads).
  for (std::size_t v = n; v > 0;) {
    const std::size_t u = pred[v];
    Way way = Way::Recompute;
    double best = std::numeric_limits<double>::infinity();
    for (auto [e, end] = boost::out_edges(u, g); e != end; ++e)
      if (boost::target(*e, g) == v && g[*e].ms < best) {
        best = g[*e].ms;
        way = g[*e].way;
      }
    for (std::size_t i = u; i < v; ++i) plan.way[i] = way;
    v = u;
  }
  return plan;
}

}  // namespace kvsim::serve
