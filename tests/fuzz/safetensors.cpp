// Fuzz target: the safetensors reader's checks on arbitrary bytes — the
// length prefix and the JSON header (dtypes, shapes, offsets that must tile
// the data section exactly); every input passes or throws dspark::Error.
// The tensors built afterwards only copy the byte ranges checked here.
#include "dspark/error.hpp"
#include "fuzz_util.hpp"
#include "io/safetensors_header.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dspark;
  using namespace dspark::io::safetensors_detail;
  try {
    const std::string source = "fuzz.safetensors";
    const uint64_t n = check_prefix(source, size, data);
    const Header h = parse_header(source, size - 8 - n, fuzz::as_text(data + 8, n));
    for (const Entry& e : h.entries)
      if (e.begin > e.end || e.end > size - 8 - n) std::abort();
  } catch (const Error&) {
  }
  return 0;
}
