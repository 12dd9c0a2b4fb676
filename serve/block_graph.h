#pragma once
// BlockTree's Boost.Graph type, for the serve/ sources that run graph algorithms on it (kept out
// of block_tree.h so that including the tree does not pull in Boost.Graph).
#include <boost/graph/adjacency_list.hpp>

#include "serve/block_tree.h"

namespace kvsim::serve {

struct BlockTree::Graph {
  using Type = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS>;
  explicit Graph(std::size_t n) : g(n) {}
  Type g;
};

}  // namespace kvsim::serve
