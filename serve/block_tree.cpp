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

}  // namespace kvsim::serve
