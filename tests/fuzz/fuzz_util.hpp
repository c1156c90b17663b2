// Shared helpers of the fuzz targets (tests/fuzz/*.cpp). Each target defines
// LLVMFuzzerTestOneInput; libFuzzer drives it in the fuzzing build and
// replay_main.cpp feeds it the committed corpus in the normal build.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "dspark/io/gguf.hpp"
#include "dspark/tokenizer/tokenizer.hpp"

namespace dspark::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// A per-process scratch path under $TMPDIR (default /tmp) ending in `name`.
inline std::string scratch_path(const std::string& name) {
  const char* t = std::getenv("TMPDIR");
  return std::string(t && *t ? t : "/tmp") + "/dspark-fuzz-" + std::to_string(::getpid()) + "-" + name;
}

/// Writes `bytes` to `path`, replacing it.
inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The real models whose tokenizers the targets drive: SmolLM2 (byte-level
/// BPE) and Gemma 3 (SentencePiece), as `make setup` fetches them.
enum class Model { SmolLM2, Gemma3 };

/// The model's GGUF ($DSPARK_HOME, default ~/.cache/dspark, + /models/...).
inline std::string model_path(Model m) {
  const char* h = std::getenv("DSPARK_HOME");
  const char* u = std::getenv("HOME");
  const std::string home = h && *h ? std::string(h) : std::string(u && *u ? u : ".") + "/.cache/dspark";
  return home + (m == Model::SmolLM2 ? "/models/SmolLM2-135M-Instruct.Q4_1.gguf" : "/models/gemma-3-270m-q4_k_m.gguf");
}

/// The model's GGUF and tokenizer, loaded once; the process exits with a
/// message when the model is missing (replay reports it as skipped).
struct Vocab {
  std::unique_ptr<io::GGUFFile> file;
  std::unique_ptr<tok::Tokenizer> tokenizer;
};
const Vocab& vocab(Model m = Model::SmolLM2);

/// Exit status that replay_main and ctest read as "skipped".
inline constexpr int kSkipStatus = 77;

}  // namespace dspark::fuzz
