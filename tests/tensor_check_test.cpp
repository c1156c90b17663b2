// A GGUF whose stored numbers are not finite is refused at load, naming the
// tensor: the f16 scale or minimum of a quantized block, a value of a float
// tensor (include/dspark/io/tensor_check.hpp).
#include "dspark/io/tensor_check.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "dspark/error.hpp"
#include "dspark/io/gguf.hpp"
#include "dspark/model/target.hpp"
#include "test_util.hpp"

namespace {

using dspark::FormatError;
using dspark::io::GGMLType;
using dspark::test::TempDir;

struct Case {
  const char* what;
  GGMLType type;
  const char* tensor;
  int64_t byte;     // offset of the patched field inside the tensor's data
  uint16_t bits;    // written there (f16: 0x7E00 NaN, 0x7C00 +inf)
  const char* want;
};

// Writes a tiny Llama with matrices of `type`, sets the two bytes at `byte`
// of `tensor`'s data to `bits` (located by the tensor's first bytes, which
// are random and unique in the file), and returns the load error.
std::string patched_load_error(const Case& c) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  dspark::test::TinyLlamaOptions o;
  o.hidden = 256;
  o.ffn = 256;
  o.weight_type = c.type;
  dspark::test::write_tiny_llama(path, 3, o);
  dspark::load_target(path);  // loads as written
  std::string bytes = dspark::test::read_bytes(path);
  size_t at = std::string::npos;
  {
    const dspark::io::GGUFFile f(path);
    const auto& t = f.tensor(c.tensor);
    const std::string head(reinterpret_cast<const char*>(t.data), 64);
    at = bytes.find(head);
    EXPECT_EQ(bytes.find(head, at + 1), std::string::npos);
  }
  if (at == std::string::npos) return "(tensor not found)";
  std::memcpy(&bytes[at + static_cast<size_t>(c.byte)], &c.bits, 2);
  dspark::test::write_bytes(path, bytes);
  try {
    dspark::load_target(path);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(TensorCheck, NonFiniteScalesAndValuesAreRefusedAtLoad) {
  const Case cases[] = {
      {"a NaN Q8_0 scale", GGMLType::Q8_0, "blk.1.attn_q.weight", 34 * 5, 0x7E00,
       "tensor 'blk.1.attn_q.weight' (Q8_0) holds a non-finite block scale (NaN or infinity) at 5 of 2048"},
      {"an infinite Q4_1 minimum", GGMLType::Q4_1, "blk.0.ffn_down.weight", 20 * 7 + 2, 0x7C00,
       "tensor 'blk.0.ffn_down.weight' (Q4_1) holds a non-finite block scale (NaN or infinity) at 7 of 2048"},
      {"a NaN Q6_K scale", GGMLType::Q6_K, "blk.0.attn_output.weight", 210 * 2 + 208, 0x7E00,
       "tensor 'blk.0.attn_output.weight' (Q6_K) holds a non-finite block scale (NaN or infinity) at 2 of 256"},
      // An F32 norm weight: the upper half of element 3 (little-endian) made NaN's exponent.
      {"a NaN in an F32 norm", GGMLType::Q8_0, "blk.1.ffn_norm.weight", 4 * 3 + 2, 0x7FC0,
       "tensor 'blk.1.ffn_norm.weight' (F32) holds a non-finite value (NaN or infinity) at 3 of 256"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string m = patched_load_error(c);
    EXPECT_NE(m.find(c.want), std::string::npos) << m;
    EXPECT_NE(m.find("the file is corrupt"), std::string::npos) << m;
  }
}

TEST(TensorCheck, IntegerTensorsAndFiniteValuesPass) {
  // All-ones bytes are NaN as f16 but fine as I8 data.
  std::string data(64, '\xff');
  dspark::io::GGUFTensorInfo t;
  t.name = "ids";
  t.ne = {64};
  t.type_id = static_cast<uint32_t>(GGMLType::I8);
  t.n_bytes = 64;
  t.data = reinterpret_cast<const uint8_t*>(data.data());
  EXPECT_NO_THROW(dspark::io::check_tensor_finite(t, "x.gguf"));
  t.type_id = static_cast<uint32_t>(GGMLType::F16);
  t.ne = {32};
  EXPECT_THROW(dspark::io::check_tensor_finite(t, "x.gguf"), FormatError);
  // 65504 (0x7BFF), the largest finite f16, passes.
  for (size_t i = 0; i < 64; i += 2) {
    data[i] = '\xff';
    data[i + 1] = '\x7b';
  }
  EXPECT_NO_THROW(dspark::io::check_tensor_finite(t, "x.gguf"));
}

}  // namespace
