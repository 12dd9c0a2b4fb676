#pragma once
// The state graph of a request trace's prefix blocks, held in Boost.Graph: an edge from each block
// to every block that follows it in some prompt (so each block has at most one parent, and a
// prefix is a path from a root). Built once per trace and shared by every cache simulated on it.
#include <cstdint>
#include <functional>
#include <memory>

#include "serve/request_trace.h"

namespace kvsim::serve {

class BlockTree {
 public:
  explicit BlockTree(const RequestTrace& trace);
  ~BlockTree();
  const RequestTrace& trace() const { return trace_; }
  // -1 for a root. The graph's in-edge, read from the trace's own parent list (the same edge):
  // it is on the replay's hot path.
  std::int32_t parent(std::int32_t block) const { return trace_.parent[static_cast<std::size_t>(block)]; }
  std::int64_t children(std::int32_t block) const;  // blocks that follow it anywhere
  // Its first child (in graph order) for which `pred` holds, or -1.
  std::int32_t find_child(std::int32_t block, const std::function<bool(std::int32_t)>& pred) const;
  std::size_t blocks() const { return trace_.blocks(); }
  // The Boost.Graph itself (boost::adjacency_list<vecS, vecS, bidirectionalS>), for algorithms.
  struct Graph;
  const Graph& graph() const { return *graph_; }

 private:
  const RequestTrace& trace_;
  std::unique_ptr<Graph> graph_;
};

}  // namespace kvsim::serve
