// Tests for the GGUF reader and writer: round trips of every value type and
// tensor layout through files written by GGUFWriter, structural errors in
// corrupted files (each must throw dspark::FormatError with a message naming
// the file and what was expected versus found, never crash), and the
// metadata and tensor table of the real SmolLM2 GGUF.
#include "dspark/io/gguf.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/gguf_writer.hpp"
#include "test_util.hpp"

namespace {

namespace g = dspark::io::gguf;
using dspark::Error;
using dspark::FormatError;
using dspark::InvalidArgument;
using dspark::io::GGMLType;
using dspark::io::GGUFFile;
using dspark::io::GGUFValue;
using dspark::io::GGUFValueType;
using dspark::io::GGUFWriter;
using dspark::test::TempDir;
using VT = GGUFValueType;

uint32_t id(GGMLType t) { return static_cast<uint32_t>(t); }

// `n` bytes 0, 1, 2, ... (mod 251) as a string.
std::string pattern(size_t n, int salt = 0) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i + static_cast<size_t>(salt)) % 251);
  return s;
}

template <typename T>
void patch(std::string& bytes, size_t offset, T v) {
  ASSERT_LE(offset + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + offset, &v, sizeof(T));
}

// Offset of the first occurrence of `needle` in `hay` (fails the test if absent).
size_t find_or_fail(const std::string& hay, const std::string& needle) {
  const size_t p = hay.find(needle);
  EXPECT_NE(p, std::string::npos) << "'" << needle << "' not found";
  return p;
}

// Opens `bytes` written to a file and expects a FormatError whose message
// contains the file path and every string in `parts`.
void expect_format_error(const TempDir& dir, const std::string& bytes,
                         const std::vector<std::string>& parts, const std::string& name = "bad.gguf") {
  const std::string path = dir.file(name);
  dspark::test::write_bytes(path, bytes);
  try {
    GGUFFile f(path);
    ADD_FAILURE() << "expected FormatError for " << name;
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message lacks the path: " << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected FormatError, got another exception: " << e.what();
  }
}

// ---- round trips ------------------------------------------------------------------

class GGUFVersionTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GGUFVersionTest, ScalarValuesRoundTripWithExactType) {
  TempDir dir;
  GGUFWriter w(GetParam());
  w.set("t.u8", g::u8(255));
  w.set("t.i8", g::i8(-128));
  w.set("t.u16", g::u16(65535));
  w.set("t.i16", g::i16(-32768));
  w.set("t.u32", g::u32(4294967295u));
  w.set("t.i32", g::i32(std::numeric_limits<int32_t>::min()));
  w.set("t.u64", g::u64(std::numeric_limits<uint64_t>::max()));
  w.set("t.i64", g::i64(std::numeric_limits<int64_t>::min()));
  w.set("t.f32", g::f32(0.1f));
  w.set("t.f64", g::f64(0.1));
  w.set("t.true", g::boolean(true));
  w.set("t.false", g::boolean(false));
  w.set("t.str", g::string("h\xC3\xa9llo \xF0\x9F\x98\x80 \n"));
  w.set("t.empty", g::string(""));
  w.set("t.nul", g::string(std::string("a\0b", 3)));
  const std::string path = dir.file("v.gguf");
  w.write(path);

  GGUFFile f(path);
  EXPECT_EQ(f.version(), GetParam());
  EXPECT_EQ(f.metadata().size(), 15u);
  EXPECT_EQ(f.tensors().size(), 0u);
  auto check = [&](const std::string& k, VT type) -> const GGUFValue& {
    const GGUFValue& v = f.get(k);
    EXPECT_EQ(v.type, type) << k;
    return v;
  };
  EXPECT_EQ(std::get<uint64_t>(check("t.u8", VT::UINT8).value), 255u);
  EXPECT_EQ(std::get<int64_t>(check("t.i8", VT::INT8).value), -128);
  EXPECT_EQ(std::get<uint64_t>(check("t.u16", VT::UINT16).value), 65535u);
  EXPECT_EQ(std::get<int64_t>(check("t.i16", VT::INT16).value), -32768);
  EXPECT_EQ(std::get<uint64_t>(check("t.u32", VT::UINT32).value), 4294967295u);
  EXPECT_EQ(std::get<int64_t>(check("t.i32", VT::INT32).value), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(std::get<uint64_t>(check("t.u64", VT::UINT64).value), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(std::get<int64_t>(check("t.i64", VT::INT64).value), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(std::get<double>(check("t.f32", VT::FLOAT32).value), static_cast<double>(0.1f));
  EXPECT_EQ(std::get<double>(check("t.f64", VT::FLOAT64).value), 0.1);
  EXPECT_EQ(std::get<bool>(check("t.true", VT::BOOL).value), true);
  EXPECT_EQ(std::get<bool>(check("t.false", VT::BOOL).value), false);
  EXPECT_EQ(check("t.str", VT::STRING).as_string(), "h\xC3\xa9llo \xF0\x9F\x98\x80 \n");
  EXPECT_EQ(check("t.empty", VT::STRING).as_string(), "");
  EXPECT_EQ(check("t.nul", VT::STRING).as_string(), std::string("a\0b", 3));
  // Typed getters.
  EXPECT_EQ(f.get_int("t.i16"), -32768);
  EXPECT_EQ(f.get_int("t.u32"), 4294967295);
  EXPECT_DOUBLE_EQ(f.get_float("t.f64"), 0.1);
  EXPECT_EQ(f.get_string("t.str"), "h\xC3\xa9llo \xF0\x9F\x98\x80 \n");
  EXPECT_TRUE(f.get_bool_or("t.true", false));
  EXPECT_EQ(f.get_int_or("t.absent", 7), 7);
}

TEST_P(GGUFVersionTest, ArraysOfEveryTypeRoundTrip) {
  TempDir dir;
  GGUFWriter w(GetParam());
  w.set("a.u8", g::array(VT::UINT8, {g::u8(0), g::u8(7), g::u8(255)}));
  w.set("a.i8", g::array(VT::INT8, {g::i8(-1), g::i8(127)}));
  w.set("a.u16", g::array(VT::UINT16, {g::u16(1), g::u16(65535)}));
  w.set("a.i16", g::array(VT::INT16, {g::i16(-300)}));
  w.set("a.u32", g::u32_array({1u, 2u, 4000000000u}));
  w.set("a.i32", g::i32_array({-5, 0, 5}));
  w.set("a.u64", g::array(VT::UINT64, {g::u64(1ull << 63)}));
  w.set("a.i64", g::array(VT::INT64, {g::i64(-(1ll << 40)), g::i64(3)}));
  w.set("a.f32", g::f32_array({0.5f, -1.25f, 3.0e-8f}));
  w.set("a.f64", g::f64_array({1e300, -2.5}));
  w.set("a.bool", g::array(VT::BOOL, {g::boolean(true), g::boolean(false), g::boolean(true)}));
  w.set("a.str", g::string_array({"alpha", "", "\xC4\xA0the"}));
  w.set("a.empty", g::array(VT::INT32, {}));
  // An array of arrays: one of strings, one of ints, one empty.
  w.set("a.nested", g::array(VT::ARRAY, {g::string_array({"x", "yz"}), g::i32_array({1, -2, 3}),
                                         g::array(VT::FLOAT32, {})}));
  // Arrays nested 8 levels deep (the reader's limit).
  GGUFValue deep = g::array(VT::STRING, {g::string("core")});
  for (int i = 1; i < 8; ++i) deep = g::array(VT::ARRAY, {deep});
  w.set("a.deep", deep);
  const std::string path = dir.file("a.gguf");
  w.write(path);

  GGUFFile f(path);
  auto arr = [&](const std::string& k, VT et) -> const GGUFValue::Array& {
    const GGUFValue& v = f.get(k);
    EXPECT_EQ(v.type, VT::ARRAY) << k;
    EXPECT_EQ(v.elem_type, et) << k;
    for (const auto& e : v.as_array()) EXPECT_EQ(e.type, et) << k;
    return v.as_array();
  };
  EXPECT_EQ(arr("a.u8", VT::UINT8).size(), 3u);
  EXPECT_EQ(f.get_int_array("a.u8"), (std::vector<int64_t>{0, 7, 255}));
  arr("a.i8", VT::INT8);
  EXPECT_EQ(f.get_int_array("a.i8"), (std::vector<int64_t>{-1, 127}));
  arr("a.u16", VT::UINT16);
  EXPECT_EQ(f.get_int_array("a.u16"), (std::vector<int64_t>{1, 65535}));
  arr("a.i16", VT::INT16);
  EXPECT_EQ(f.get_int_array("a.i16"), (std::vector<int64_t>{-300}));
  arr("a.u32", VT::UINT32);
  EXPECT_EQ(f.get_int_array("a.u32"), (std::vector<int64_t>{1, 2, 4000000000}));
  arr("a.i32", VT::INT32);
  EXPECT_EQ(f.get_int_array("a.i32"), (std::vector<int64_t>{-5, 0, 5}));
  EXPECT_EQ(arr("a.u64", VT::UINT64)[0].as_uint(), 1ull << 63);
  arr("a.i64", VT::INT64);
  EXPECT_EQ(f.get_int_array("a.i64"), (std::vector<int64_t>{-(1ll << 40), 3}));
  arr("a.f32", VT::FLOAT32);
  EXPECT_EQ(f.get_float_array("a.f32"),
            (std::vector<double>{0.5, -1.25, static_cast<double>(3.0e-8f)}));
  arr("a.f64", VT::FLOAT64);
  EXPECT_EQ(f.get_float_array("a.f64"), (std::vector<double>{1e300, -2.5}));
  const auto& b = arr("a.bool", VT::BOOL);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_TRUE(b[0].as_bool());
  EXPECT_FALSE(b[1].as_bool());
  EXPECT_TRUE(b[2].as_bool());
  arr("a.str", VT::STRING);
  EXPECT_EQ(f.get_string_array("a.str"), (std::vector<std::string>{"alpha", "", "\xC4\xA0the"}));
  EXPECT_TRUE(arr("a.empty", VT::INT32).empty());

  const auto& nested = arr("a.nested", VT::ARRAY);
  ASSERT_EQ(nested.size(), 3u);
  EXPECT_EQ(nested[0].elem_type, VT::STRING);
  ASSERT_EQ(nested[0].as_array().size(), 2u);
  EXPECT_EQ(nested[0].as_array()[1].as_string(), "yz");
  EXPECT_EQ(nested[1].elem_type, VT::INT32);
  ASSERT_EQ(nested[1].as_array().size(), 3u);
  EXPECT_EQ(nested[1].as_array()[1].type, VT::INT32);
  EXPECT_EQ(nested[1].as_array()[1].as_int(), -2);
  EXPECT_EQ(nested[2].elem_type, VT::FLOAT32);
  EXPECT_TRUE(nested[2].as_array().empty());

  const GGUFValue* v = &f.get("a.deep");
  for (int i = 1; i < 8; ++i) {
    ASSERT_EQ(v->elem_type, VT::ARRAY);
    ASSERT_EQ(v->as_array().size(), 1u);
    v = &v->as_array()[0];
  }
  ASSERT_EQ(v->elem_type, VT::STRING);
  EXPECT_EQ(v->as_array().at(0).as_string(), "core");
}

INSTANTIATE_TEST_SUITE_P(GGUF, GGUFVersionTest, ::testing::Values(2u, 3u),
                         [](const auto& info) { return std::string("v").append(std::to_string(info.param)); });

TEST(GGUFWriter, ReaderValuesCopyBackUnchanged) {
  // Values read from one file can be set on a new writer and read back equal.
  TempDir dir;
  GGUFWriter w;
  w.set("x.i8", g::i8(-3));
  w.set("x.arr", g::array(VT::ARRAY, {g::string_array({"a"}), g::array(VT::UINT16, {g::u16(9)})}));
  w.write(dir.file("1.gguf"));
  GGUFFile f1(dir.file("1.gguf"));
  GGUFWriter w2(2);
  for (const auto& [k, v] : f1.metadata()) w2.set(k, v);
  w2.write(dir.file("2.gguf"));
  GGUFFile f2(dir.file("2.gguf"));
  EXPECT_EQ(f2.version(), 2u);
  EXPECT_EQ(f2.get("x.i8").type, VT::INT8);
  EXPECT_EQ(f2.get("x.i8").as_int(), -3);
  const auto& a = f2.get("x.arr").as_array();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].as_array()[0].as_string(), "a");
  EXPECT_EQ(a[1].elem_type, VT::UINT16);
  EXPECT_EQ(a[1].as_array()[0].as_int(), 9);
}

TEST(GGUFWriter, SetReplacesValueAndEraseRemovesKey) {
  GGUFWriter w;
  w.set("k.a", g::u32(1));
  w.set("k.b", g::string("x"));
  w.set("k.a", g::string("now a string"));
  EXPECT_EQ(w.n_metadata(), 2u);
  ASSERT_NE(w.find("k.a"), nullptr);
  EXPECT_EQ(w.find("k.a")->as_string(), "now a string");
  EXPECT_TRUE(w.erase("k.b"));
  EXPECT_FALSE(w.erase("k.b"));
  EXPECT_EQ(w.find("k.b"), nullptr);
  EXPECT_EQ(w.n_metadata(), 1u);
  // Keys are written in insertion order: the header holds "k.a" right after the counts.
  const std::string b = w.bytes();
  EXPECT_EQ(b.substr(24 + 8, 3), "k.a");
}

TEST(GGUFWriter, RejectsMalformedInput) {
  EXPECT_THROW(GGUFWriter(1), InvalidArgument);
  EXPECT_THROW(GGUFWriter(4), InvalidArgument);
  GGUFWriter w;
  EXPECT_THROW(w.set("", g::u8(1)), InvalidArgument);
  EXPECT_THROW(w.set(std::string(65536, 'k'), g::u8(1)), InvalidArgument);
  GGUFValue too_big = g::u8(1);
  too_big.value = uint64_t{256};
  EXPECT_THROW(w.set("k", too_big), InvalidArgument);
  GGUFValue negative = g::u32(1);
  negative.value = int64_t{-1};
  EXPECT_THROW(w.set("k", negative), InvalidArgument);
  GGUFValue wrong_alt = g::string("x");
  wrong_alt.value = 1.0;
  EXPECT_THROW(w.set("k", wrong_alt), InvalidArgument);
  GGUFValue mixed = g::i32_array({1});
  std::get<GGUFValue::Array>(mixed.value).push_back(g::u8(1));
  try {
    w.set("k.mixed", mixed);
    ADD_FAILURE() << "mixed array accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("k.mixed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("element 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g::array(VT::STRING, {g::u8(1)}), InvalidArgument);
  GGUFValue deep = g::array(VT::STRING, {});
  for (int i = 1; i < 9; ++i) deep = g::array(VT::ARRAY, {deep});
  EXPECT_THROW(w.set("k.deep", deep), InvalidArgument);
  EXPECT_THROW(w.set("general.alignment", g::u32(48)), InvalidArgument);
  EXPECT_THROW(w.set("general.alignment", g::u32(0)), InvalidArgument);
  EXPECT_THROW(w.set("general.alignment", g::u64(64)), InvalidArgument);
  EXPECT_EQ(w.n_metadata(), 0u);

  const std::string four_f32(16, '\0');
  EXPECT_THROW(w.add_tensor("", id(GGMLType::F32), {4}, four_f32), InvalidArgument);
  EXPECT_THROW(w.add_tensor(std::string(64, 'n'), id(GGMLType::F32), {4}, four_f32), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", id(GGMLType::F32), {}, four_f32), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", id(GGMLType::F32), {1, 1, 1, 1, 4}, four_f32), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", id(GGMLType::F32), {4, 0}, four_f32), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", 99, {4}, four_f32), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", id(GGMLType::F32), {5}, four_f32), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", id(GGMLType::Q8_0), {16}, std::string(17, '\0')), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", at::zeros({2, 2}, at::kBool)), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", at::zeros({1, 1, 1, 1, 2})), InvalidArgument);
  EXPECT_THROW(w.add_tensor("t", at::zeros({0, 2})), InvalidArgument);
  w.add_tensor(std::string(63, 'n'), id(GGMLType::F32), {4}, four_f32);
  EXPECT_THROW(w.add_tensor(std::string(63, 'n'), id(GGMLType::F32), {4}, four_f32), InvalidArgument);
  EXPECT_EQ(w.n_tensors(), 1u);
}

// ---- tensors and alignment ----------------------------------------------------------

// Writes tensors of sizes that are not multiples of the alignment and checks
// offsets, padding, shapes and data against the writer's layout.
void check_tensor_layout(uint64_t alignment, bool set_key) {
  TempDir dir;
  GGUFWriter w;
  if (set_key) w.set("general.alignment", g::u32(static_cast<uint32_t>(alignment)));
  w.set("general.name", g::string("layout"));
  EXPECT_EQ(w.alignment(), alignment);
  const std::string a = pattern(5 * 4, 1), b = pattern(3 * 2 * 2, 2), c = pattern(2 * 34, 3),
                    d = pattern(2 * 3 * 2 * 4, 4), e = pattern(7, 5);
  w.add_tensor("a", id(GGMLType::F32), {5}, a);
  w.add_tensor("b.weight", id(GGMLType::F16), {3, 2}, b);
  w.add_tensor("c", id(GGMLType::Q8_0), {64}, c);
  w.add_tensor("d", id(GGMLType::I32), {2, 3, 1, 2}, d);
  w.add_tensor("e", id(GGMLType::I8), {7}, e);
  const std::string path = dir.file("t.gguf");
  w.write(path);
  const std::string bytes = w.bytes();
  EXPECT_EQ(bytes, dspark::test::read_bytes(path));
  EXPECT_EQ(bytes.size(), w.size());
  EXPECT_EQ(w.data_section_offset() % alignment, 0u);

  GGUFFile f(path);
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.file_size(), bytes.size());
  ASSERT_EQ(f.tensors().size(), 5u);
  const std::vector<std::string> data = {a, b, c, d, e};
  const std::vector<std::vector<int64_t>> shapes = {{5}, {2, 3}, {64}, {2, 1, 3, 2}, {7}};
  const std::vector<int64_t> counts = {5, 6, 64, 12, 7};
  const uint8_t* first = f.tensors()[0].data;
  for (size_t i = 0; i < 5; ++i) {
    const auto& t = f.tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.offset % alignment, 0u);
    EXPECT_EQ(t.shape(), shapes[i]);
    EXPECT_EQ(t.n_elements(), counts[i]);
    EXPECT_EQ(t.n_bytes, data[i].size());
    ASSERT_NE(t.data, nullptr);
    EXPECT_EQ(std::memcmp(t.data, data[i].data(), data[i].size()), 0);
    EXPECT_EQ(static_cast<uint64_t>(t.data - first), t.offset);
    // Position in the file: data section start + offset.
    EXPECT_EQ(bytes.substr(w.data_section_offset() + t.offset, data[i].size()), data[i]);
    if (i > 0) {
      const auto& p = f.tensors()[i - 1];
      const uint64_t gap_begin = p.offset + p.n_bytes;
      EXPECT_LT(t.offset - gap_begin, alignment);
      for (uint64_t k = gap_begin; k < t.offset; ++k)
        EXPECT_EQ(bytes[w.data_section_offset() + k], '\0') << "padding byte " << k;
    }
  }
  EXPECT_EQ(f.tensor("c").type(), GGMLType::Q8_0);
  EXPECT_EQ(f.tensor("b.weight").type_id, id(GGMLType::F16));
  EXPECT_EQ(f.find_tensor("zzz"), nullptr);
}

TEST(GGUFAlignment, Default32) { check_tensor_layout(32, false); }
TEST(GGUFAlignment, Explicit32) { check_tensor_layout(32, true); }
TEST(GGUFAlignment, Custom64) { check_tensor_layout(64, true); }
TEST(GGUFAlignment, Custom8) { check_tensor_layout(8, true); }

TEST(GGUFAlignment, AlignmentChangeAfterTensorsRelayouts) {
  GGUFWriter w;
  w.add_tensor("a", id(GGMLType::F32), {3}, pattern(12));
  w.add_tensor("b", id(GGMLType::F32), {3}, pattern(12));
  w.set("general.alignment", g::u32(128));
  TempDir dir;
  w.write(dir.file("x.gguf"));
  GGUFFile f(dir.file("x.gguf"));
  EXPECT_EQ(f.alignment(), 128u);
  EXPECT_EQ(f.tensor("b").offset, 128u);
  EXPECT_EQ(std::memcmp(f.tensor("b").data, pattern(12).data(), 12), 0);
}

TEST(GGUFTensors, AtenTensorsKeepShapeAndBits) {
  TempDir dir;
  GGUFWriter w;
  const at::Tensor f32 = at::arange(24, at::kFloat).reshape({2, 3, 4}) * 0.37f;
  const at::Tensor bf16 = at::randn({5, 32}).to(at::kBFloat16);
  const at::Tensor f16 = at::randn({32}).to(at::kHalf);
  const at::Tensor strided = at::arange(12, at::kFloat).reshape({3, 4}).t();  // non-contiguous
  const at::Tensor scalar = at::scalar_tensor(2.5, at::kFloat);
  const at::Tensor i64 = at::arange(6, at::kLong).reshape({1, 2, 3, 1});
  w.add_tensor("f32", f32);
  w.add_tensor("bf16", bf16);
  w.add_tensor("f16", f16);
  w.add_tensor("strided", strided);
  w.add_tensor("scalar", scalar);
  w.add_tensor("i64", i64);
  w.write(dir.file("x.gguf"));
  GGUFFile f(dir.file("x.gguf"));
  auto check = [&](const std::string& name, const at::Tensor& t, GGMLType type,
                   std::vector<int64_t> ne) {
    SCOPED_TRACE(name);
    const auto& info = f.tensor(name);
    EXPECT_EQ(info.type(), type);
    EXPECT_EQ(info.ne, ne);
    const at::Tensor c = t.contiguous();
    EXPECT_EQ(info.n_elements(), c.numel());
    EXPECT_EQ(info.n_bytes, c.nbytes());
    EXPECT_EQ(std::memcmp(info.data, c.data_ptr(), c.nbytes()), 0);
  };
  check("f32", f32, GGMLType::F32, {4, 3, 2});
  EXPECT_EQ(f.tensor("f32").shape(), (std::vector<int64_t>{2, 3, 4}));
  check("bf16", bf16, GGMLType::BF16, {32, 5});
  check("f16", f16, GGMLType::F16, {32});
  check("strided", strided, GGMLType::F32, {3, 4});
  check("scalar", scalar, GGMLType::F32, {1});
  check("i64", i64, GGMLType::I64, {1, 3, 2, 1});
  // Element [1][2] of the transposed matrix is original [2][1] = 9.
  float v;
  std::memcpy(&v, f.tensor("strided").data + (1 * 3 + 2) * 4, 4);
  EXPECT_EQ(v, 9.0f);
}

TEST(GGUFWriter, WriteReplacesFileAtomically) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  dspark::test::write_bytes(path, "old contents");
  GGUFWriter w;
  w.set("general.name", g::string("new"));
  w.add_tensor("t", id(GGMLType::F32), {8}, pattern(32));
  w.write(path);
  EXPECT_EQ(dspark::test::read_bytes(path), w.bytes());
  // Nothing but the file itself remains in the directory.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"m.gguf"});
  // A missing directory is an error naming the path.
  const std::string bad = dir.file("no/such/dir/m.gguf");
  try {
    w.write(bad);
    ADD_FAILURE() << "write into a missing directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

// ---- error cases ------------------------------------------------------------------------

// A small valid file with metadata of several types and two tensors; the last
// tensor ends exactly at the end of the file (no trailing padding), so any
// truncation removes needed bytes.
GGUFWriter sample_writer() {
  GGUFWriter w;
  w.set("general.architecture", g::string("llama"));
  w.set("s.u32", g::u32(7));
  w.set("s.arr", g::string_array({"ab", "cde"}));
  w.set("s.f32", g::f32(1.5f));
  w.add_tensor("first", id(GGMLType::F32), {3, 2}, pattern(24));
  w.add_tensor("second", id(GGMLType::Q8_0), {64}, pattern(68));
  w.add_tensor("third", id(GGMLType::F32), {8}, pattern(32));
  return w;
}

TEST(GGUFErrors, MissingFile) {
  TempDir dir;
  const std::string path = dir.file("does-not-exist.gguf");
  try {
    GGUFFile f(path);
    FAIL() << "opened a missing file";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
  }
}

TEST(GGUFErrors, DirectoryIsNotAFile) {
  TempDir dir;
  EXPECT_THROW(GGUFFile f(dir.path().string()), Error);
}

TEST(GGUFErrors, EmptyFile) {
  TempDir dir;
  expect_format_error(dir, "", {"not a GGUF file", "0 bytes"});
}

TEST(GGUFErrors, TextFileHasWrongMagic) {
  TempDir dir;
  expect_format_error(dir, "hello, this is a text file\nwith two lines\n",
                      {"expected magic \"GGUF\"", "found \"hell\"", "offset 0"});
  // Non-printable bytes are shown as '?'.
  expect_format_error(dir, std::string("\x01\x02GG-rest-of-file", 16), {"found \"??GG\""});
}

TEST(GGUFErrors, BadVersion) {
  TempDir dir;
  std::string b = sample_writer().bytes();
  patch<uint32_t>(b, 4, 7);
  expect_format_error(dir, b, {"unsupported GGUF version 7", "expected 2 or 3"});
  patch<uint32_t>(b, 4, 1);
  expect_format_error(dir, b, {"unsupported GGUF version 1"});
}

TEST(GGUFErrors, TruncatedAtManyCutPoints) {
  TempDir dir;
  const GGUFWriter w = sample_writer();
  const std::string full = w.bytes();
  ASSERT_EQ(full.size(), w.size());
  std::set<size_t> cuts;
  for (size_t i = 0; i < 37; ++i) cuts.insert(full.size() * i / 37);
  // Header boundaries: inside/after magic, version, counts; inside the first
  // key; the end of the header; the data section start; the last byte.
  for (size_t c : {size_t{1}, size_t{3}, size_t{4}, size_t{6}, size_t{8}, size_t{12}, size_t{16},
                   size_t{20}, size_t{24}, size_t{28}, size_t{32}, size_t{35}})
    cuts.insert(c);
  const size_t header_end = static_cast<size_t>(w.data_section_offset());
  for (size_t c : {header_end - 1, header_end, header_end + 1, full.size() - 33, full.size() - 1})
    cuts.insert(c);
  const size_t arr = find_or_fail(full, "s.arr");
  for (size_t c = arr; c < arr + 40; ++c) cuts.insert(c);
  const size_t info = find_or_fail(full, "second");
  for (size_t c = info - 8; c < info + 40; ++c) cuts.insert(c);

  const std::string path = dir.file("cut.gguf");
  for (size_t c : cuts) {
    ASSERT_LT(c, full.size());
    SCOPED_TRACE("cut at " + std::to_string(c) + " of " + std::to_string(full.size()));
    dspark::test::write_bytes(path, full.substr(0, c));
    try {
      GGUFFile f(path);
      ADD_FAILURE() << "truncated file accepted";
    } catch (const FormatError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      const bool says_truncated = msg.find("truncated") != std::string::npos;
      const bool too_short = msg.find("too short") != std::string::npos;
      EXPECT_TRUE(says_truncated || too_short) << msg;
      EXPECT_NE(msg.find(std::to_string(c)), std::string::npos)
          << "message should state the file size: " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected FormatError, got: " << e.what();
    }
  }
  // The untruncated bytes load.
  dspark::test::write_bytes(path, full);
  EXPECT_NO_THROW(GGUFFile f(path));
}

TEST(GGUFErrors, TruncatedTensorData) {
  TempDir dir;
  const GGUFWriter w = sample_writer();
  const std::string full = w.bytes();
  GGUFFile ok([&] {
    dspark::test::write_bytes(dir.file("ok.gguf"), full);
    return dir.file("ok.gguf");
  }());
  const auto& second = ok.tensor("second");
  const size_t begin = static_cast<size_t>(w.data_section_offset() + second.offset);
  const size_t cut = begin + 30;
  expect_format_error(dir, full.substr(0, cut),
                      {"truncated file", "tensor 'second'",
                       "needs bytes " + std::to_string(begin) + ".." + std::to_string(begin + 68),
                       "has " + std::to_string(cut) + " bytes"});
}

TEST(GGUFErrors, TensorOffsetThatWrapsPast2To64) {
  // An offset of 2^64 - data_start + 32 makes data_start + offset wrap to 32:
  // inside the header. The bounds check must not form that sum.
  TempDir dir;
  const GGUFWriter w = sample_writer();
  std::string b = w.bytes();
  // name "second" | n_dims u32 | ne[0] u64 | type u32 | offset u64
  const size_t offset_at = find_or_fail(b, "second") + 6 + 4 + 8 + 4;
  const uint64_t data_start = w.data_section_offset();
  const uint64_t wrapping = (~uint64_t{0} - data_start + 1) + 32;
  ASSERT_EQ(data_start + wrapping, 32u);  // the wrapped sum (unsigned arithmetic)
  patch<uint64_t>(b, offset_at, wrapping);
  // 2^64 + 32 = 18446744073709551648; + 68 bytes of Q8_0.
  expect_format_error(dir, b, {"tensor 'second'", "needs bytes 18446744073709551648..18446744073709551716"});
  // The largest offsets, and one whose end alone passes 2^64.
  patch<uint64_t>(b, offset_at, ~uint64_t{0} - 31);
  expect_format_error(dir, b, {"tensor 'second'", "truncated file"});
  patch<uint64_t>(b, offset_at, ~uint64_t{0} - 63 - data_start);
  expect_format_error(dir, b, {"tensor 'second'", "truncated file"});
}

TEST(GGUFErrors, AlignmentOfTheWrongTypeNamesTheKey) {
  // The writer accepts general.alignment only as a uint32: write the value
  // under another key of the same length and rename it in the bytes.
  TempDir dir;
  auto with_alignment = [](GGUFValue v) {
    GGUFWriter w;
    w.set("general.alignmenX", std::move(v));
    w.add_tensor("t", id(GGMLType::F32), {4}, pattern(16));
    std::string b = w.bytes();
    b[find_or_fail(b, "general.alignmenX") + 16] = 't';
    return b;
  };
  expect_format_error(dir, with_alignment(g::i32(-32)), {"key 'general.alignment'", "-32 is negative"});
  expect_format_error(dir, with_alignment(g::string("32")),
                      {"key 'general.alignment'", "string used as unsigned integer"});
  expect_format_error(dir, with_alignment(g::f32(32.f)), {"key 'general.alignment'", "float32"});
}

TEST(GGUFErrors, UnknownMetadataValueType) {
  TempDir dir;
  GGUFWriter w;
  w.set("abc.key", g::u32(5));
  std::string b = w.bytes();
  const size_t type_at = 24 + 8 + 7;
  patch<uint32_t>(b, type_at, 13);
  expect_format_error(dir, b, {"key 'abc.key'", "unknown value type 13", "expected 0..12",
                               "offset " + std::to_string(type_at + 4)});
}

TEST(GGUFErrors, UnknownArrayElementType) {
  TempDir dir;
  GGUFWriter w;
  w.set("abc.arr", g::i32_array({1, 2}));
  std::string b = w.bytes();
  patch<uint32_t>(b, 24 + 8 + 7 + 4, 42);
  expect_format_error(dir, b, {"key 'abc.arr'", "unknown array element type 42"});
}

TEST(GGUFErrors, InvalidBoolByte) {
  TempDir dir;
  GGUFWriter w;
  w.set("abc.flag", g::boolean(true));
  std::string b = w.bytes();
  patch<uint8_t>(b, 24 + 8 + 8 + 4, 2);
  expect_format_error(dir, b, {"key 'abc.flag'", "bool value 2"});
}

TEST(GGUFErrors, UnknownTensorType) {
  TempDir dir;
  GGUFWriter w;
  w.add_tensor("w", id(GGMLType::F32), {4}, pattern(16));
  std::string b = w.bytes();
  // header 24 | name len 8 | "w" | n_dims 4 | ne 8 | type
  patch<uint32_t>(b, 24 + 8 + 1 + 4 + 8, 99);
  expect_format_error(dir, b, {"tensor 'w'", "unsupported type type#99"});
}

TEST(GGUFErrors, RowLengthNotMultipleOfBlockSize) {
  TempDir dir;
  GGUFWriter w;
  w.add_tensor("q", id(GGMLType::Q8_0), {32, 2}, pattern(68));
  std::string b = w.bytes();
  patch<uint64_t>(b, 24 + 8 + 1 + 4, 48);
  expect_format_error(dir, b, {"tensor 'q'", "row length 48", "Q8_0 block size 32"});
}

TEST(GGUFErrors, BadTensorDimensionCount) {
  TempDir dir;
  GGUFWriter w;
  w.add_tensor("q", id(GGMLType::F32), {4}, pattern(16));
  std::string b = w.bytes();
  patch<uint32_t>(b, 24 + 8 + 1, 0);
  expect_format_error(dir, b, {"tensor 'q'", "expected 1..4 dimensions, found 0"});
  patch<uint32_t>(b, 24 + 8 + 1, 5);
  expect_format_error(dir, b, {"tensor 'q'", "expected 1..4 dimensions, found 5"});
}

TEST(GGUFErrors, MisalignedTensorOffset) {
  TempDir dir;
  GGUFWriter w;
  w.add_tensor("q", id(GGMLType::F32), {4}, pattern(16));
  std::string b = w.bytes();
  patch<uint64_t>(b, 24 + 8 + 1 + 4 + 8 + 4, 4);
  expect_format_error(dir, b, {"tensor 'q'", "offset 4", "not aligned to 32"});
}

TEST(GGUFErrors, DuplicateKey) {
  TempDir dir;
  GGUFWriter w;
  w.set("dup.a", g::u32(1));
  w.set("dup.b", g::u32(2));
  std::string b = w.bytes();
  const size_t second = find_or_fail(b, "dup.b");
  b[second + 4] = 'a';
  expect_format_error(dir, b, {"duplicate metadata key 'dup.a'"});
}

TEST(GGUFErrors, DuplicateTensorName) {
  TempDir dir;
  GGUFWriter w;
  w.add_tensor("t1", id(GGMLType::F32), {4}, pattern(16));
  w.add_tensor("t2", id(GGMLType::F32), {4}, pattern(16));
  std::string b = w.bytes();
  b[find_or_fail(b, "t2") + 1] = '1';
  expect_format_error(dir, b, {"duplicate tensor name 't1'"});
}

TEST(GGUFErrors, AlignmentNotPowerOfTwo) {
  TempDir dir;
  GGUFWriter w;
  w.set("general.alignment", g::u32(64));
  w.add_tensor("t", id(GGMLType::F32), {4}, pattern(16));
  std::string b = w.bytes();
  const size_t value_at = find_or_fail(b, "general.alignment") + 17 + 4;
  uint32_t cur;
  std::memcpy(&cur, b.data() + value_at, 4);
  ASSERT_EQ(cur, 64u);
  patch<uint32_t>(b, value_at, 48);
  expect_format_error(dir, b, {"general.alignment must be a power of two", "found 48"});
  patch<uint32_t>(b, value_at, 0);
  expect_format_error(dir, b, {"general.alignment must be a power of two", "found 0"});
}

TEST(GGUFErrors, AbsurdStringLength) {
  TempDir dir;
  GGUFWriter w;
  w.set("k.name", g::string("value"));
  std::string b = w.bytes();
  // The key's own length.
  std::string key_len = b;
  patch<uint64_t>(key_len, 24, uint64_t{1} << 62);
  expect_format_error(dir, key_len, {"implausible string length 4611686018427387904", "metadata key",
                                     "offset 32"});
  // A string value's length: huge, and just past the end of the file.
  const size_t len_at = 24 + 8 + 6 + 4;
  std::string val_len = b;
  patch<uint64_t>(val_len, len_at, ~uint64_t{0});
  expect_format_error(dir, val_len, {"implausible string length"});
  patch<uint64_t>(val_len, len_at, b.size());
  expect_format_error(dir, val_len, {"truncated file", "string value"});
}

TEST(GGUFErrors, AbsurdArrayLength) {
  // An array claiming 2^31 elements in a tiny file must be rejected as
  // truncated/implausible, not by exhausting memory.
  TempDir dir;
  GGUFWriter w;
  w.set("k.arr", g::i32_array({1, 2, 3}));
  std::string b = w.bytes();
  patch<uint64_t>(b, 24 + 8 + 5 + 4 + 4, uint64_t{1} << 31);
  expect_format_error(dir, b, {"k.arr"});
  patch<uint64_t>(b, 24 + 8 + 5 + 4 + 4, ~uint64_t{0});
  expect_format_error(dir, b, {"k.arr", "implausible array length"});
}

TEST(GGUFErrors, AbsurdCounts) {
  TempDir dir;
  std::string b = sample_writer().bytes();
  std::string tensors = b;
  patch<uint64_t>(tensors, 8, uint64_t{1} << 40);
  expect_format_error(dir, tensors, {"implausible tensor count 1099511627776", "at most 4294967296"});
  std::string kvs = b;
  patch<uint64_t>(kvs, 16, uint64_t{1} << 40);
  expect_format_error(dir, kvs, {"metadata count 1099511627776"});
  // Counts below the plausibility bound but far beyond what the file holds:
  // rejected from the bytes that follow, without allocating for the count.
  patch<uint64_t>(kvs, 16, (uint64_t{1} << 32) - 1);
  expect_format_error(dir, kvs, {"offset"});
  patch<uint64_t>(tensors, 8, (uint64_t{1} << 32) - 1);
  expect_format_error(dir, tensors, {"truncated"});
}

TEST(GGUFErrors, MissingKeyAndTensorAndTypeMismatch) {
  TempDir dir;
  sample_writer().write(dir.file("s.gguf"));
  GGUFFile f(dir.file("s.gguf"));
  auto expect_msg = [&](auto fn, const std::vector<std::string>& parts) {
    try {
      fn();
      ADD_FAILURE() << "no exception";
    } catch (const FormatError& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { f.get("no.such.key"); }, {f.path(), "missing metadata key 'no.such.key'"});
  expect_msg([&] { f.tensor("nope"); }, {f.path(), "missing tensor 'nope'"});
  expect_msg([&] { f.get_string("s.u32"); }, {f.path(), "key 's.u32'", "uint32", "string"});
  expect_msg([&] { f.get_int_array("s.arr"); }, {f.path(), "key 's.arr'"});
}

// ---- the real model -----------------------------------------------------------------------

TEST(GGUFSmolLM2, MetadataAndTensorTable) {
  DSPARK_REQUIRE_MODEL();
  GGUFFile f(dspark::test::model_path());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_int("llama.context_length"), 8192);
  EXPECT_EQ(f.get("llama.block_count").type, VT::UINT32);
  EXPECT_EQ(f.get("llama.attention.layer_norm_rms_epsilon").type, VT::FLOAT32);
  EXPECT_NEAR(f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(tokens[2], "<|im_end|>");
  EXPECT_EQ(f.get("tokenizer.ggml.token_type").elem_type, VT::INT32);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 2);

  // Tied embeddings: 2 global tensors + 9 per layer.
  EXPECT_EQ(f.tensors().size(), 2u + 30u * 9u);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  const auto& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type(), GGMLType::Q8_0);
  EXPECT_EQ(emb.shape(), (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(emb.n_bytes, 49152u * 576u / 32u * 34u);
  EXPECT_EQ(f.tensor("output_norm.weight").type(), GGMLType::F32);
  EXPECT_EQ(f.tensor("output_norm.weight").shape(), (std::vector<int64_t>{576}));
  int q41 = 0, f32 = 0, other = 0;
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_LE(t.data + t.n_bytes, f.tensors().front().data + (f.file_size() - 0)) << t.name;
    if (t.type() == GGMLType::Q4_1) ++q41;
    else if (t.type() == GGMLType::F32) ++f32;
    else if (t.name != "token_embd.weight") ++other;
  }
  EXPECT_EQ(f32, 1 + 2 * 30);  // output_norm + attn_norm, ffn_norm per layer
  EXPECT_EQ(other + q41, 30 * 7);
  EXPECT_GE(q41, 30 * 6) << "most matrices are Q4_1";
  const auto& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.type(), GGMLType::Q4_1);
  EXPECT_EQ(q.shape(), (std::vector<int64_t>{576, 576}));
  EXPECT_EQ(f.tensor("blk.29.attn_k.weight").shape(), (std::vector<int64_t>{192, 576}));
  EXPECT_EQ(f.tensor("blk.7.ffn_down.weight").shape(), (std::vector<int64_t>{576, 1536}));
}

}  // namespace
