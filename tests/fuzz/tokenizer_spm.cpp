// Fuzz target: the tokenizer of Gemma 3 (SentencePiece); see tokenizer_body.hpp.
#include "fuzz_util.hpp"
#include "tokenizer_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dspark::fuzz;
  return fuzz_tokenizer(*vocab(Model::Gemma3).tokenizer, /*spm=*/true, data, size);
}
