// The tokenizers of the real models for the tokenizer and chat-template targets.
#include <cstdio>
#include <filesystem>

#include "fuzz_util.hpp"

namespace dspark::fuzz {

namespace {

Vocab load(Model m) {
  const std::string path = model_path(m);
  if (!std::filesystem::is_regular_file(path)) {
    std::fprintf(stderr, "the model is missing: expected %s (run make setup)\n", path.c_str());
    std::exit(kSkipStatus);
  }
  Vocab out;
  out.file = std::make_unique<io::GGUFFile>(path);
  out.tokenizer = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_gguf(*out.file));
  return out;
}

}  // namespace

const Vocab& vocab(Model m) {
  if (m == Model::SmolLM2) {
    static const Vocab smollm2 = load(Model::SmolLM2);
    return smollm2;
  }
  static const Vocab gemma3 = load(Model::Gemma3);
  return gemma3;
}

}  // namespace dspark::fuzz
