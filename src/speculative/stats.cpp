// Generation figures; see include/dspark/speculative/stats.hpp.
#include "dspark/speculative/stats.hpp"

#include <cstddef>
#include <utility>

namespace dspark {

double GenerateStats::tau() const {
  if (rounds == 0) return generated_tokens > 0 ? 1.0 : 0.0;  // plain decoding
  return static_cast<double>(accepted + rounds) / static_cast<double>(rounds);
}

std::vector<double> GenerateStats::acceptance_by_position() const {
  // A draft that reaches position k reached every earlier one, so the
  // positions no round reached are a tail: left out.
  size_t n = reached_by_position.size();
  while (n > 0 && reached_by_position[n - 1] == 0) --n;
  std::vector<double> a(n, 0.0);
  for (size_t k = 0; k < a.size(); ++k)
    a[k] = reached_by_position[k] > 0
               ? static_cast<double>(accepted_by_position[k]) / reached_by_position[k]
               : 0.0;
  return a;
}

GenerateStats& GenerateStats::operator+=(const GenerateStats& o) {
  prompt_tokens += o.prompt_tokens;
  generated_tokens += o.generated_tokens;
  prefill_s += o.prefill_s;
  decode_s += o.decode_s;
  target_calls += o.target_calls;
  drafted += o.drafted;
  accepted += o.accepted;
  rounds += o.rounds;
  lookup_rounds += o.lookup_rounds;
  drafter_rounds += o.drafter_rounds;
  lookup_drafted += o.lookup_drafted;
  lookup_accepted += o.lookup_accepted;
  draft_s += o.draft_s;
  verify_s += o.verify_s;
  for (auto [from, to] : {std::pair{&o.reached_by_position, &reached_by_position},
                          std::pair{&o.accepted_by_position, &accepted_by_position}}) {
    if (to->size() < from->size()) to->resize(from->size(), 0);
    for (size_t k = 0; k < from->size(); ++k) (*to)[k] += (*from)[k];
  }
  return *this;
}

}  // namespace dspark
