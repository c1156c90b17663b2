// The tokenizer of the real model for the tokenizer and chat-template targets.
#include <cstdio>
#include <filesystem>

#include "fuzz_util.hpp"

namespace dspark::fuzz {

const Vocab& vocab() {
  static const Vocab v = [] {
    const std::string path = model_path();
    if (!std::filesystem::is_regular_file(path)) {
      std::fprintf(stderr, "the SmolLM2 model is missing: expected %s (run make setup)\n", path.c_str());
      std::exit(kSkipStatus);
    }
    Vocab out;
    out.file = std::make_unique<io::GGUFFile>(path);
    out.tokenizer = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_gguf(*out.file));
    return out;
  }();
  return v;
}

}  // namespace dspark::fuzz
