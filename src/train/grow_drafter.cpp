// Growing a drafter by draft layers that start as the identity; see
// grow_drafter in include/dspark/train/trainer.hpp.
#include <map>
#include <string>

#include "dspark/error.hpp"
#include "dspark/train/trainer.hpp"

namespace dspark::train {

Drafter grow_drafter(const Drafter& d, int n_layers, uint64_t seed) {
  const int have = d.config().n_layers;
  if (n_layers <= have)
    throw InvalidArgument("grow_drafter: the drafter has " + std::to_string(have) + " draft layer(s), asked for " +
                          std::to_string(n_layers) + " (growing only adds layers)");
  DrafterConfig c = d.config();
  c.n_layers = n_layers;
  c.validate();
  const Drafter fresh = Drafter::init(c, seed);
  std::map<std::string, at::Tensor> p;
  for (const auto& [name, t] : fresh.params()) {
    auto it = d.params().find(name);
    p[name] = it != d.params().end() ? it->second.detach().clone() : t;
  }
  for (int i = have; i < n_layers; ++i)
    for (const char* out : {"attn_output.weight", "ffn_down.weight"})
      p.at("layers." + std::to_string(i) + "." + out).zero_();
  return Drafter(c, std::move(p));
}

}  // namespace dspark::train
