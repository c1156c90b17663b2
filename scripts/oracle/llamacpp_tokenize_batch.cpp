// Tokenizes many texts with llama.cpp's tokenizer (llama_tokenize, the call
// behind llama-tokenize) in one process, so that a golden corpus does not
// reload the vocabulary per text. Built and run by scripts/oracle/llamacpp.py.
//
// Input (stdin): records of [u32 length][u8 parse_special][length bytes].
// Output (stdout): one line per record, the ids as "[1, 2, 3]" (no BOS).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf < records\n", argv[0]);
    return 2;
  }
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  for (;;) {
    uint32_t len;
    unsigned char parse;
    if (std::fread(&len, 4, 1, stdin) != 1) break;
    if (std::fread(&parse, 1, 1, stdin) != 1) return 1;
    std::string text(len, '\0');
    if (len && std::fread(text.data(), 1, len, stdin) != len) return 1;
    std::vector<llama_token> ids(text.size() + 8);
    int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                               static_cast<int32_t>(ids.size()), false, parse != 0);
    if (n < 0) {
      ids.resize(static_cast<size_t>(-n));
      n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                         static_cast<int32_t>(ids.size()), false, parse != 0);
    }
    std::printf("[");
    for (int32_t i = 0; i < n; ++i) std::printf(i ? ", %d" : "%d", ids[static_cast<size_t>(i)]);
    std::printf("]\n");
  }
  llama_model_free(model);
  return 0;
}
