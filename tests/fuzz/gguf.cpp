// Fuzz target: the GGUF reader on arbitrary file contents. Every input must
// either load or throw dspark::Error; a loaded file's tensors must lie inside
// the mapping.
#include <cstdint>

#include "dspark/error.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dspark;
  static const std::string path = fuzz::scratch_path("input.gguf");
  fuzz::write_file(path, fuzz::as_text(data, size));
  try {
    io::GGUFFile f(path);
    uint64_t sum = 0;
    for (const auto& [key, value] : f.metadata()) {
      sum += key.size();
      if (value.is_integer()) sum += static_cast<uint64_t>(value.as_int());
    }
    for (const auto& t : f.tensors()) {
      sum += static_cast<uint64_t>(t.n_elements());
      // Touch the first and last byte: ASan reports a view outside the map.
      if (t.n_bytes > 0) sum += t.data[0] + t.data[t.n_bytes - 1];
    }
    asm volatile("" : : "g"(sum) : "memory");  // keeps the reads
  } catch (const Error&) {
  }
  return 0;
}
