// The fingerprint of a training data set; see
// include/dspark/train/data_fingerprint.hpp.
#include "dspark/train/data_fingerprint.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

namespace dspark::train {

nlohmann::json data_fingerprint(const TrainDataset& data) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  auto mix = [&h](uint64_t v, int bytes) {
    for (int b = 0; b < bytes; ++b, v >>= 8) {
      h ^= v & 0xffu;
      h *= 1099511628211ull;
    }
  };
  int64_t n_tokens = 0;
  for (const auto& s : data.sequences) {
    mix(s.tokens.size(), 8);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      mix(static_cast<uint32_t>(s.tokens[i]), 4);
      mix(s.loss_mask[i] ? 1 : 0, 1);
    }
    n_tokens += static_cast<int64_t>(s.tokens.size());
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  auto recipe_of = [](const nlohmann::json& manifest) {
    nlohmann::json r = nlohmann::json::object();
    for (const char* k : {"format", "target_id", "target_path", "prompts_file", "sampling", "chat_template"})
      if (manifest.is_object() && manifest.contains(k)) r[k] = manifest[k];
    return r;
  };
  nlohmann::json recipe;
  if (data.manifest.is_object() && data.manifest.contains("parts")) {  // several data sets, in order
    recipe = nlohmann::json::array();
    for (const auto& part : data.manifest["parts"]) recipe.push_back(recipe_of(part));
  } else {
    recipe = recipe_of(data.manifest);
  }
  return {{"n_sequences", data.sequences.size()},
          {"n_tokens", n_tokens},
          {"n_supervised", data.supervised_tokens()},
          {"hash", std::string(hex)},
          {"recipe", recipe}};
}

}  // namespace dspark::train
