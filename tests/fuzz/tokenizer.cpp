// Fuzz target: the tokenizer of SmolLM2 (byte-level BPE); see tokenizer_body.hpp.
#include "fuzz_util.hpp"
#include "tokenizer_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dspark::fuzz;
  return fuzz_tokenizer(*vocab(Model::SmolLM2).tokenizer, /*spm=*/false, data, size);
}
