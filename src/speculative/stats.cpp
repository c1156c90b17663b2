// Generation figures; see include/dspark/speculative/stats.hpp.
#include "dspark/speculative/stats.hpp"

#include <cstddef>

namespace dspark {

double GenerateStats::tau() const {
  if (rounds == 0) return generated_tokens > 0 ? 1.0 : 0.0;  // plain decoding
  return static_cast<double>(accepted + rounds) / static_cast<double>(rounds);
}

std::vector<double> GenerateStats::acceptance_by_position() const {
  std::vector<double> a(reached_by_position.size(), 0.0);
  for (size_t k = 0; k < a.size(); ++k)
    a[k] = reached_by_position[k] > 0
               ? static_cast<double>(accepted_by_position[k]) / reached_by_position[k]
               : 0.0;
  return a;
}

}  // namespace dspark
