#include "serve/block_tree.h"

#include "serve/block_graph.h"

namespace kvsim::serve {

BlockTree::BlockTree(const RequestTrace& trace) : trace_(trace), graph_(std::make_unique<Graph>(trace.blocks())) {
  for (std::size_t b = 0; b < trace.blocks(); ++b)
    if (trace.parent[b] >= 0) boost::add_edge(static_cast<std::size_t>(trace.parent[b]), b, graph_->g);
}

BlockTree::~BlockTree() = default;

std::int64_t BlockTree::children(std::int32_t block) const {
  return static_cast<std::int64_t>(boost::out_degree(static_cast<std::size_t>(block), graph_->g));
}

std::int32_t BlockTree::find_child(std::int32_t block, const std::function<bool(std::int32_t)>& pred) const {
  for (auto [v, end] = boost::adjacent_vertices(static_cast<std::size_t>(block), graph_->g); v != end; ++v)
    if (pred(static_cast<std::int32_t>(*v))) return static_cast<std::int32_t>(*v);
  return -1;
}

}  // namespace kvsim::serve
