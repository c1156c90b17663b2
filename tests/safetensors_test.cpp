// Tests for the safetensors reader/writer and atomic file replacement.
//
// Expected values are literal numbers or bit patterns; the interop tests read
// a file written by the reference implementation (the PyPI `safetensors`
// package, see scripts/golden/make_safetensors_golden.py) and check that the
// writer still produces the committed file that script verified with the
// reference reader.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"
#include "dspark/io/safetensors.hpp"

namespace {

namespace fs = std::filesystem;
using dspark::Error;
using dspark::FormatError;
using dspark::InvalidArgument;
using dspark::io::AtomicFileWriter;
using dspark::io::load_safetensors;
using dspark::io::load_safetensors_dir;
using dspark::io::parse_safetensors;
using dspark::io::save_safetensors;
using dspark::io::SafetensorsData;
using dspark::io::serialize_safetensors;
using dspark::io::write_file_atomic;
using dspark::io::write_json_atomic;
using TensorList = std::vector<std::pair<std::string, at::Tensor>>;
using Metadata = std::map<std::string, std::string>;

const std::string kGoldenDir = std::string(DSPARK_SOURCE_DIR) + "/tests/golden";

// A fresh directory, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = (fs::temp_directory_path() /
             ("dspark_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1))))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Names of all entries, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A safetensors file: size prefix, header text (as given), then `data_size`
// bytes of data (0, 1, 2, ... mod 251 so that misplaced reads show).
std::string make_file(const std::string& header, uint64_t data_size) {
  std::string data(data_size, '\0');
  for (uint64_t i = 0; i < data_size; ++i) data[i] = static_cast<char>(i % 251);
  return le64(header.size()) + header + data;
}

template <typename T>
at::Tensor from_values(std::initializer_list<T> values, std::vector<int64_t> shape, at::ScalarType type) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  EXPECT_EQ(static_cast<size_t>(t.nbytes()), values.size() * sizeof(T));
  if (values.size() > 0) std::memcpy(t.data_ptr(), values.begin(), values.size() * sizeof(T));
  return t;
}

std::string raw_bytes(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// Same dtype, same shape, same bytes.
::testing::AssertionResult bits_equal(const at::Tensor& got, const at::Tensor& want) {
  if (got.scalar_type() != want.scalar_type()) {
    return ::testing::AssertionFailure() << "dtype " << got.scalar_type() << ", expected " << want.scalar_type();
  }
  if (got.sizes() != want.sizes()) {
    return ::testing::AssertionFailure() << "shape " << got.sizes() << ", expected " << want.sizes();
  }
  if (!got.device().is_cpu() || !got.is_contiguous()) {
    return ::testing::AssertionFailure() << "not a contiguous CPU tensor";
  }
  if (raw_bytes(got) != raw_bytes(want)) return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

// The tensors of scripts/golden/make_safetensors_golden.py's expected(), in
// the same order, with the same values.
TensorList golden_tensors() {
  TensorList t;
  t.emplace_back("f64", (at::arange(6, at::kDouble) * 0.5 - 1.0).reshape({2, 3}));
  t.emplace_back("f32", from_values<uint32_t>({0x00000000u, 0x80000000u, 0x3FC00000u, 0xC0100000u, 0x7F800000u,
                                               0xFF800000u, 0x7FC00001u, 0x00000001u},
                                              {8}, at::kFloat));
  t.emplace_back("f16", from_values<uint16_t>({0xBC00, 0xBA00, 0xB800, 0xB400, 0x0000, 0x3400, 0x3800, 0x3A00},
                                              {2, 2, 2}, at::kHalf));  // -1, -0.75, ..., 0.75
  t.emplace_back("bf16", from_values<uint16_t>({0x3F80, 0xC000, 0x7FC1, 0x8000, 0x0001, 0x7F80}, {2, 3},
                                               at::kBFloat16));
  t.emplace_back("i64", from_values<int64_t>({std::numeric_limits<int64_t>::min(), -1, 1234567890123,
                                              std::numeric_limits<int64_t>::max()},
                                             {4}, at::kLong));
  t.emplace_back("i32", from_values<int32_t>({-300000, -200000, -100000, 0, 100000, 200000}, {3, 2}, at::kInt));
  t.emplace_back("i16", from_values<int16_t>({-32768, -1, 0, 1, 32767}, {5}, at::kShort));
  t.emplace_back("i8", from_values<int8_t>({-128, -91, -54, -17, 20, 57, 94}, {7}, at::kChar));
  t.emplace_back("u8", from_values<uint8_t>({0, 51, 102, 153, 204, 255}, {2, 3}, at::kByte));
  t.emplace_back("bool", from_values<uint8_t>({1, 0, 1, 1}, {4}, at::kBool));
  t.emplace_back("scalar", from_values<float>({3.25f}, {}, at::kFloat));
  t.emplace_back("empty", at::zeros({0, 3}, at::kFloat));
  return t;
}

const Metadata kGoldenMetadata = {
    {"format", "np"}, {"generator", "make_safetensors_golden.py"}, {"text", "h\xC3\xA9llo \xE2\x9C\x93"}};

// Runs `fn`, expecting exception E whose message contains every fragment.
template <typename E>
void expect_throw_with(const std::function<void()>& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

// ---------------------------------------------------------------- round trip

TEST(SafetensorsRoundTrip, EveryDtypeBitExact) {
  TempDir dir;
  TensorList tensors = golden_tensors();
  // Random values over each dtype's whole range, plus special floats.
  at::manual_seed(1234);
  const at::Tensor bits16 = at::randint(-32768, 32768, {33}, at::kShort);
  tensors.emplace_back("rand_f64", at::randn({3, 5}, at::kDouble));
  tensors.emplace_back("rand_f32", at::randn({4, 7}, at::kFloat));
  tensors.emplace_back("rand_f16_bits", bits16.view(at::kHalf));
  tensors.emplace_back("rand_bf16_bits", bits16.flip(0).view(at::kBFloat16));
  tensors.emplace_back("rand_i64", at::randint(-32768, 32768, {9, 4}, at::kShort).view(at::kLong));
  tensors.emplace_back("rand_i32", at::randint(-32768, 32768, {2, 2, 6}, at::kShort).view(at::kInt));
  tensors.emplace_back("rand_i16", at::randint(-32768, 32768, {11}, at::kShort));
  tensors.emplace_back("rand_i8", at::randint(-128, 128, {13}, at::kChar));
  tensors.emplace_back("rand_u8", at::randint(0, 256, {1, 17}, at::kByte));
  tensors.emplace_back("rand_bool", at::randint(0, 2, {19}, at::kLong).to(at::kBool));
  tensors.emplace_back("neg_zero_nan_f32",
                       from_values<uint32_t>({0x80000000u, 0x7FA00001u, 0xFFC12345u}, {3}, at::kFloat));
  tensors.emplace_back("neg_zero_nan_bf16", from_values<uint16_t>({0x8000, 0x7F81, 0xFFC3}, {3}, at::kBFloat16));

  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors);
  const SafetensorsData loaded = load_safetensors(path);
  ASSERT_EQ(loaded.tensors.size(), tensors.size());
  EXPECT_TRUE(loaded.metadata.empty());
  for (const auto& [name, want] : tensors) {
    const auto it = loaded.tensors.find(name);
    ASSERT_NE(it, loaded.tensors.end()) << name;
    EXPECT_TRUE(bits_equal(it->second, want)) << name;
  }
  // The in-memory forms agree with the file forms.
  EXPECT_EQ(read_bytes(path), serialize_safetensors(tensors));
  const SafetensorsData parsed = parse_safetensors(read_bytes(path), "mem");
  for (const auto& [name, want] : tensors) EXPECT_TRUE(bits_equal(parsed.tensors.at(name), want)) << name;
}

TEST(SafetensorsRoundTrip, LoadedTensorsOwnTheirMemory) {
  TempDir dir;
  const std::string path = dir.file("a.safetensors");
  save_safetensors(path, {{"w", at::arange(12, at::kFloat).reshape({3, 4})}});
  SafetensorsData loaded = load_safetensors(path);
  fs::remove(path);
  at::Tensor w = loaded.tensors.at("w");
  w.add_(1);  // writable, and still valid after the file is gone
  EXPECT_TRUE(at::equal(w, at::arange(1, 13, at::kFloat).reshape({3, 4})));
}

TEST(SafetensorsRoundTrip, MetadataRoundTrip) {
  TempDir dir;
  const Metadata meta = {{"format", "pt"},
                         {"empty", ""},
                         {"quote\"back\\slash", "line\nbreak\ttab"},
                         {"unicode", "\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82"},
                         {"json-looking", "{\"a\": [1, 2]}"}};
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"x", at::ones({2}, at::kFloat)}}, meta);
  const SafetensorsData loaded = load_safetensors(path);
  EXPECT_EQ(loaded.metadata, meta);
  EXPECT_TRUE(bits_equal(loaded.tensors.at("x"), at::ones({2}, at::kFloat)));
}

TEST(SafetensorsRoundTrip, NoTensorsNoMetadata) {
  TempDir dir;
  const std::string path = dir.file("e.safetensors");
  save_safetensors(path, {});
  EXPECT_EQ(read_bytes(path), le64(8) + "{}      ");
  const SafetensorsData loaded = load_safetensors(path);
  EXPECT_TRUE(loaded.tensors.empty());
  EXPECT_TRUE(loaded.metadata.empty());
}

// -------------------------------------------------------------------- writer

TEST(SafetensorsWriter, OrderPreservedAlignedAndPaddedWithSpaces) {
  TempDir dir;
  const TensorList tensors = {{"z.last", at::arange(3, at::kShort)},
                              {"a.first", at::full({2, 2}, 7.5, at::kDouble)},
                              {"m.middle", from_values<uint8_t>({9}, {1}, at::kByte)},
                              {"b.zero", at::empty({0}, at::kFloat)},
                              {"c.tail", at::arange(5, at::kInt)}};
  const std::string path = dir.file("o.safetensors");
  save_safetensors(path, tensors, {{"k", "v"}});
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  const std::string header = bytes.substr(8, n);
  const size_t close = header.find_last_of('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "padding must be spaces: " << header;

  const auto parsed = nlohmann::ordered_json::parse(header);
  std::vector<std::string> keys;
  for (const auto& [k, v] : parsed.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "z.last", "a.first", "m.middle", "b.zero", "c.tail"}));

  // Data laid out in the same order, back to back, holding each tensor's bytes.
  uint64_t expect_begin = 0;
  for (const auto& [name, t] : tensors) {
    const auto& offsets = parsed.at(name).at("data_offsets");
    const uint64_t begin = offsets.at(0).get<uint64_t>();
    const uint64_t end = offsets.at(1).get<uint64_t>();
    EXPECT_EQ(begin, expect_begin) << name;
    EXPECT_EQ(bytes.substr(8 + n + begin, end - begin), raw_bytes(t)) << name;
    expect_begin = end;
  }
  EXPECT_EQ(8 + n + expect_begin, bytes.size());
  EXPECT_EQ(parsed.at("a.first").at("dtype"), "F64");
  EXPECT_EQ(parsed.at("a.first").at("shape"), nlohmann::json::array({2, 2}));
}

TEST(SafetensorsWriter, NonContiguousTensorsAreWrittenRowMajor) {
  TempDir dir;
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  const at::Tensor transposed = base.t();                     // strides (1, 6)
  const at::Tensor sliced = base.slice(1, 1, 5, 2);           // storage offset 1, step 2
  const at::Tensor expanded = at::arange(3, at::kInt).expand({2, 3});  // stride 0
  ASSERT_FALSE(transposed.is_contiguous());
  const std::string path = dir.file("nc.safetensors");
  save_safetensors(path, {{"t", transposed}, {"s", sliced}, {"e", expanded}});
  const SafetensorsData loaded = load_safetensors(path);
  EXPECT_TRUE(bits_equal(loaded.tensors.at("t"), transposed.contiguous()));
  EXPECT_TRUE(bits_equal(loaded.tensors.at("s"), sliced.contiguous()));
  EXPECT_TRUE(bits_equal(loaded.tensors.at("e"), expanded.contiguous()));
  EXPECT_EQ(loaded.tensors.at("t").sizes(), (at::IntArrayRef{6, 4}));
}

TEST(SafetensorsWriter, RejectsBadInputWithoutTouchingTheFile) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  write_bytes(path, "previous");
  const at::Tensor x = at::ones({2}, at::kFloat);
  expect_throw_with<InvalidArgument>([&] { save_safetensors(path, {{"a", x}, {"b", x}, {"a", x}}); },
                                     {"'a'", "more than once"});
  expect_throw_with<InvalidArgument>([&] { save_safetensors(path, {{"__metadata__", x}}); }, {"reserved"});
  expect_throw_with<InvalidArgument>([&] { save_safetensors(path, {{"u", at::Tensor()}}); }, {"'u'", "undefined"});
  expect_throw_with<InvalidArgument>(
      [&] { save_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}}); }, {"'c'", "ComplexFloat", "BF16"});
  expect_throw_with<InvalidArgument>([&] { save_safetensors(path, {{"bad\xFF", x}}); }, {"UTF-8"});
  expect_throw_with<InvalidArgument>([&] { save_safetensors(path, {{"x", x}}, {{"k", "bad\xC3"}}); }, {"UTF-8"});
  EXPECT_EQ(read_bytes(path), "previous");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"w.safetensors"});
}

TEST(SafetensorsWriter, DtypeNames) {
  EXPECT_EQ(dspark::io::safetensors_scalar_type("BF16"), at::kBFloat16);
  EXPECT_EQ(dspark::io::safetensors_scalar_type("BOOL"), at::kBool);
  EXPECT_EQ(dspark::io::safetensors_scalar_type("bf16"), std::nullopt);
  EXPECT_EQ(dspark::io::safetensors_scalar_type("U32"), std::nullopt);
  EXPECT_EQ(dspark::io::safetensors_dtype_name(at::kChar), "I8");
  EXPECT_EQ(dspark::io::safetensors_dtype_name(at::kHalf), "F16");
  EXPECT_EQ(dspark::io::safetensors_dtype_name(at::kComplexDouble), std::nullopt);
}

// -------------------------------------------------------------------- reader

// Every byte written out literally: size prefix 138 (0x8a), a header with
// metadata, tensors listed out of data order, three trailing spaces, then
// a = F32 [2, 1] {1.0, -2.5} at [0, 8) and b = I16 [2] {258, -1} at [8, 12).
const char kHandBuilt[] =
    "\x8a\x00\x00\x00\x00\x00\x00\x00"
    R"({"__metadata__":{"k":"v"},"b":{"dtype":"I16","shape":[2],"data_offsets":[8,12]},)"
    R"("a":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]}}   )"
    "\x00\x00\x80\x3f"
    "\x00\x00\x20\xc0"
    "\x02\x01"
    "\xff\xff";

TEST(SafetensorsReader, HandBuiltFile) {
  const std::string bytes(kHandBuilt, sizeof(kHandBuilt) - 1);
  ASSERT_EQ(bytes.size(), 8u + 138u + 12u);
  TempDir dir;
  const std::string path = dir.file("hand.safetensors");
  write_bytes(path, bytes);
  for (const SafetensorsData& d : {load_safetensors(path), parse_safetensors(bytes, "hand")}) {
    ASSERT_EQ(d.tensors.size(), 2u);
    EXPECT_EQ(d.metadata, (Metadata{{"k", "v"}}));
    const at::Tensor& a = d.tensors.at("a");
    ASSERT_EQ(a.scalar_type(), at::kFloat);
    ASSERT_EQ(a.sizes(), (at::IntArrayRef{2, 1}));
    EXPECT_EQ(a[0][0].item<float>(), 1.0f);
    EXPECT_EQ(a[1][0].item<float>(), -2.5f);
    const at::Tensor& b = d.tensors.at("b");
    ASSERT_EQ(b.scalar_type(), at::kShort);
    ASSERT_EQ(b.sizes(), (at::IntArrayRef{2}));
    EXPECT_EQ(b[0].item<int16_t>(), 258);
    EXPECT_EQ(b[1].item<int16_t>(), -1);
  }
}

TEST(SafetensorsReader, ZeroSizedTensorsAndScalars) {
  // Two empty tensors at the same offset, one between two others, and a scalar.
  const std::string header =
      R"({"e1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
      R"("e2":{"dtype":"I64","shape":[3,0,2],"data_offsets":[0,0]},)"
      R"("s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
      R"("e3":{"dtype":"U8","shape":[0],"data_offsets":[8,8]},)"
      R"("t":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})";
  const SafetensorsData d = parse_safetensors(make_file(header, 10), "z");
  EXPECT_EQ(d.tensors.at("e2").sizes(), (at::IntArrayRef{3, 0, 2}));
  EXPECT_EQ(d.tensors.at("s").dim(), 0);
  EXPECT_EQ(raw_bytes(d.tensors.at("s")), std::string("\x00\x01\x02\x03\x04\x05\x06\x07", 8));
  EXPECT_EQ(raw_bytes(d.tensors.at("t")), "\x08\x09");
}

TEST(SafetensorsReader, MissingFileIsAnError) {
  TempDir dir;
  const std::string path = dir.file("missing.safetensors");
  try {
    load_safetensors(path);
    ADD_FAILURE() << "no exception";
  } catch (const FormatError& e) {
    ADD_FAILURE() << "a missing file is not a format error: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
  expect_throw_with<Error>([&] { load_safetensors(dir.path()); }, {"directory"});
}

// ---------------------------------------------------------------- validation

struct BadCase {
  const char* label;
  std::string bytes;
  std::vector<std::string> fragments;
};

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

std::vector<BadCase> bad_cases() {
  const std::string ok_a = entry("a", "F32", "[2]", 0, 8);
  return {
      {"empty file", "", {"file is 0 bytes", "too short for the 8-byte header size"}},
      {"short file", std::string("\x05\x00\x00", 3), {"file is 3 bytes", "too short"}},
      {"header beyond file", le64(1000) + "{}", {"header size 1000 bytes exceeds the 2 bytes"}},
      {"absurd header", le64(uint64_t{1} << 40) + "{}", {"header size 1099511627776 bytes is implausible"}},
      {"not json", make_file("{\"a\": nope}", 0), {"header is not valid JSON"}},
      {"invalid utf-8", make_file("{\"a\xff\":1}", 0), {"header is not valid JSON"}},
      {"not object", make_file("[1, 2]", 0), {"header must be a JSON object", "found array"}},
      {"repeated key", make_file("{" + ok_a + "," + ok_a + "}", 8), {"repeats the key 'a'"}},
      {"entry not object", make_file(R"({"a": 5})", 0), {"tensor 'a'", "expected an object", "found number 5"}},
      {"missing dtype", make_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), {"tensor 'a'", "missing \"dtype\""}},
      {"missing shape", make_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8), {"tensor 'a'", "missing \"shape\""}},
      {"missing offsets", make_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8),
       {"tensor 'a'", "missing \"data_offsets\""}},
      {"unexpected key", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
       {"tensor 'a'", "unexpected key 'x'"}},
      {"dtype not string", make_file(R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8),
       {"tensor 'a'", "\"dtype\" must be a string, found number 7"}},
      {"shape not array", make_file(R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8),
       {"tensor 'a'", "\"shape\" must be an array", "found string"}},
      {"shape float", make_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8),
       {"tensor 'a'", "shape dimension 0 must be a non-negative integer, found number 2.0"}},
      {"negative dim", make_file("{" + entry("a", "F32", "[2,-3]", 0, 8) + "}", 8),
       {"tensor 'a'", "shape dimension 1 is -3, expected a non-negative integer"}},
      {"offsets not pair", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
       {"tensor 'a'", "\"data_offsets\" must be an array of two integers"}},
      {"offsets negative", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8),
       {"tensor 'a'", "data_offsets begin is -8"}},
      {"offsets string", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}})", 8),
       {"tensor 'a'", "data_offsets begin must be a non-negative integer, found string"}},
      {"unknown dtype", make_file("{" + entry("a", "F128", "[2]", 0, 8) + "}", 8),
       {"tensor 'a'", "unknown dtype 'F128'", "supported: F64, F32, F16, BF16"}},
      {"unsupported dtype", make_file("{" + entry("a", "U32", "[2]", 0, 8) + "}", 8),
       {"tensor 'a'", "unsupported dtype 'U32'"}},
      {"begin after end", make_file("{" + entry("a", "F32", "[2]", 8, 0) + "}", 8),
       {"tensor 'a'", "data_offsets [8, 0]: begin is after end"}},
      {"end beyond data", make_file("{" + entry("a", "F32", "[2]", 0, 8) + "}", 6),
       {"tensor 'a'", "data_offsets [0, 8] end beyond the data section of 6 bytes"}},
      {"span mismatch", make_file("{" + entry("fc.weight", "BF16", "[4,6]", 0, 100) + "}", 100),
       {"tensor 'fc.weight': data_offsets span 100 bytes, expected 48 (shape [4, 6], BF16)"}},
      {"numel overflow",
       make_file("{" + entry("big", "F64", "[4294967296,4294967296,16]", 0, 8) + "}", 8),
       {"tensor 'big'", "overflows"}},
      {"overlap",
       make_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", 12),
       {"tensor 'b' (bytes [4, 12)) overlaps tensor 'a' (bytes [0, 8))"}},
      {"empty inside another",
       make_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("e", "F32", "[0]", 4, 4) + "}", 8),
       {"tensor 'e' (bytes [4, 4)) overlaps tensor 'a' (bytes [0, 8))"}},
      {"gap", make_file("{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[1]", 8, 12) + "}", 12),
       {"gap of 4 bytes", "between tensor 'a' (ends at 4) and tensor 'b' (begins at 8)"}},
      {"gap at start", make_file("{" + entry("b", "F32", "[1]", 4, 8) + "}", 8),
       {"gap of 4 bytes at the start of the data section", "'b' begins at 4"}},
      {"trailing bytes", make_file("{" + ok_a + "}", 11),
       {"data section has 11 bytes but the tensors cover only 8", "3 trailing bytes"}},
      {"no tensors but data", make_file("{}", 4), {"data section has 4 bytes but the tensors cover only 0"}},
      {"metadata not object", make_file(R"({"__metadata__":["a"]})", 0),
       {"\"__metadata__\" must be an object of strings, found array"}},
      {"metadata value not string", make_file(R"({"__metadata__":{"ok":"x","n":1}})", 0),
       {"\"__metadata__\" key 'n': expected a string value, found number 1"}},
      {"bool byte",
       make_file("{" + entry("f", "BOOL", "[3]", 0, 3) + "}", 0) + std::string("\x01\x00\x02", 3),
       {"tensor 'f'", "BOOL element 2 is byte 2, expected 0 or 1"}},
  };
}

TEST(SafetensorsValidation, EveryProblemIsAFormatErrorNamingFileAndCause) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.label);
    write_bytes(path, c.bytes);
    for (int from_memory = 0; from_memory < 2; ++from_memory) {
      try {
        if (from_memory) {
          parse_safetensors(c.bytes, path);
        } else {
          load_safetensors(path);
        }
        ADD_FAILURE() << "accepted";
      } catch (const FormatError& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "message must start with the file: " << msg;
        for (const auto& f : c.fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
      }
    }
  }
}

TEST(SafetensorsValidation, SpanMismatchMessageIsExact) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  write_bytes(path, make_file("{" + entry("fc.weight", "BF16", "[4,6]", 0, 100) + "}", 100));
  try {
    load_safetensors(path);
    ADD_FAILURE() << "accepted";
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": tensor 'fc.weight': data_offsets span 100 bytes, expected 48 (shape [4, 6], BF16)");
  }
}

TEST(SafetensorsValidation, TruncatedTrailingDataAfterValidFile) {
  // A file cut short inside the data section: the header promises more data.
  TempDir dir;
  const TensorList tensors = {{"w", at::arange(16, at::kFloat)}};
  std::string bytes = serialize_safetensors(tensors);
  bytes.resize(bytes.size() - 4);
  const std::string path = dir.file("cut.safetensors");
  write_bytes(path, bytes);
  expect_throw_with<FormatError>([&] { load_safetensors(path); },
                                 {path, "tensor 'w'", "end beyond the data section of 60 bytes"});
}

// ------------------------------------------------------------ golden / interop

TEST(SafetensorsGolden, ReadsFileWrittenByReferenceImplementation) {
  const std::string path = kGoldenDir + "/safetensors_python.safetensors";
  const SafetensorsData d = load_safetensors(path);
  const TensorList want = golden_tensors();
  EXPECT_EQ(d.metadata, kGoldenMetadata);
  EXPECT_EQ(d.tensors.size(), want.size());
  for (const auto& [name, t] : want) {
    const auto it = d.tensors.find(name);
    ASSERT_NE(it, d.tensors.end()) << name;
    EXPECT_TRUE(bits_equal(it->second, t)) << name;
  }
  // Spot checks in plain numbers, independent of golden_tensors' encoding.
  EXPECT_EQ(d.tensors.at("f64")[1][2].item<double>(), 1.5);
  EXPECT_EQ(d.tensors.at("f16")[0][1][1].item<float>(), -0.25f);
  EXPECT_EQ(d.tensors.at("bf16")[0][1].item<float>(), -2.0f);
  EXPECT_TRUE(std::isnan(d.tensors.at("f32")[6].item<float>()));
  EXPECT_TRUE(std::signbit(d.tensors.at("f32")[1].item<float>()));
  EXPECT_EQ(d.tensors.at("i64")[0].item<int64_t>(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(d.tensors.at("u8")[1][2].item<uint8_t>(), 255);
  EXPECT_FALSE(d.tensors.at("bool")[1].item<bool>());
  EXPECT_EQ(d.tensors.at("scalar").item<float>(), 3.25f);
}

TEST(SafetensorsGolden, WriterReproducesTheFileVerifiedByReferenceImplementation) {
  const std::string path = kGoldenDir + "/safetensors_dspark.safetensors";
  const char* update = std::getenv("DSPARK_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    save_safetensors(path, golden_tensors(), kGoldenMetadata);
    GTEST_SKIP() << "rewrote " << path << "; now run scripts/golden/make_safetensors_golden.py --verify-only";
  }
  const std::string produced = serialize_safetensors(golden_tensors(), kGoldenMetadata);
  EXPECT_TRUE(produced == read_bytes(path))
      << "the writer's output changed; if intended, regenerate " << path
      << " with DSPARK_UPDATE_GOLDEN=1 and verify it with scripts/golden/make_safetensors_golden.py --verify-only";
  // And the committed file reads back to the same tensors.
  const SafetensorsData d = load_safetensors(path);
  for (const auto& [name, t] : golden_tensors()) EXPECT_TRUE(bits_equal(d.tensors.at(name), t)) << name;
  EXPECT_EQ(d.metadata, kGoldenMetadata);
}

// ----------------------------------------------------------- sharded checkpoints

void write_index(const TempDir& dir, const nlohmann::json& weight_map) {
  const nlohmann::json index = {{"metadata", {{"total_size", 1234}}}, {"weight_map", weight_map}};
  write_bytes(dir.file("model.safetensors.index.json"), index.dump(2));
}

TEST(SafetensorsDir, LoadsShardedCheckpoint) {
  TempDir dir;
  const at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor b = at::arange(4, at::kLong);
  const at::Tensor c = from_values<uint16_t>({0x3F80, 0x4000}, {2}, at::kBFloat16);
  save_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"a", a}, {"b", b}}, {{"format", "pt"}});
  save_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"c", c}}, {{"format", "pt"}, {"part", "2"}});
  write_index(dir, {{"a", "model-00001-of-00002.safetensors"},
                    {"b", "model-00001-of-00002.safetensors"},
                    {"c", "model-00002-of-00002.safetensors"}});
  const SafetensorsData d = load_safetensors_dir(dir.path());
  ASSERT_EQ(d.tensors.size(), 3u);
  EXPECT_TRUE(bits_equal(d.tensors.at("a"), a));
  EXPECT_TRUE(bits_equal(d.tensors.at("b"), b));
  EXPECT_TRUE(bits_equal(d.tensors.at("c"), c));
  EXPECT_EQ(d.metadata, (Metadata{{"format", "pt"}, {"part", "2"}}));
}

TEST(SafetensorsDir, LoadsSingleFileCheckpoint) {
  TempDir dir;
  const at::Tensor w = at::arange(5, at::kShort);
  save_safetensors(dir.file("model.safetensors"), {{"w", w}});
  const SafetensorsData d = load_safetensors_dir(dir.path());
  ASSERT_EQ(d.tensors.size(), 1u);
  EXPECT_TRUE(bits_equal(d.tensors.at("w"), w));
}

TEST(SafetensorsDir, ShardingErrors) {
  const at::Tensor x = at::ones({2}, at::kFloat);
  {
    TempDir dir;  // neither file
    expect_throw_with<Error>([&] { load_safetensors_dir(dir.path()); },
                             {dir.path(), "neither model.safetensors.index.json nor model.safetensors"});
    expect_throw_with<Error>([&] { load_safetensors_dir(dir.file("nope")); }, {"not a directory"});
  }
  {
    TempDir dir;  // mapped tensor absent from its shard
    save_safetensors(dir.file("s1.safetensors"), {{"a", x}});
    write_index(dir, {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}});
    expect_throw_with<FormatError>([&] { load_safetensors_dir(dir.path()); },
                                   {"model.safetensors.index.json", "weight_map lists tensor 'b' in shard "
                                                                    "'s1.safetensors', but that shard does not contain it"});
  }
  {
    TempDir dir;  // tensor in a shard but not in the weight_map
    save_safetensors(dir.file("s1.safetensors"), {{"a", x}, {"extra", x}});
    write_index(dir, {{"a", "s1.safetensors"}});
    expect_throw_with<FormatError>([&] { load_safetensors_dir(dir.path()); },
                                   {"s1.safetensors", "tensor 'extra' is not listed in the weight_map"});
  }
  {
    TempDir dir;  // the same tensor in two shards
    save_safetensors(dir.file("s1.safetensors"), {{"a", x}});
    save_safetensors(dir.file("s2.safetensors"), {{"a", x}, {"b", x}});
    write_index(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
    expect_throw_with<FormatError>([&] { load_safetensors_dir(dir.path()); },
                                   {"s2.safetensors", "tensor 'a' is also stored in shard 's1.safetensors'"});
  }
  {
    TempDir dir;  // tensor stored in a different shard than mapped
    save_safetensors(dir.file("s1.safetensors"), {{"b", x}});
    save_safetensors(dir.file("s2.safetensors"), {{"a", x}});
    write_index(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
    expect_throw_with<FormatError>([&] { load_safetensors_dir(dir.path()); },
                                   {"tensor 'b' is stored in shard 's1.safetensors'", "maps it to shard 's2.safetensors'"});
  }
  {
    TempDir dir;  // missing shard file
    write_index(dir, {{"a", "gone.safetensors"}});
    expect_throw_with<Error>([&] { load_safetensors_dir(dir.path()); }, {"gone.safetensors", "cannot open"});
  }
  {
    TempDir dir;  // shard escaping the directory
    write_index(dir, {{"a", "../s.safetensors"}});
    expect_throw_with<FormatError>([&] { load_safetensors_dir(dir.path()); },
                                   {"weight_map entry 'a'", "'../s.safetensors'", "relative path inside"});
  }
  {
    TempDir dir;  // malformed index
    write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": {"a": 3}})");
    expect_throw_with<FormatError>([&] { load_safetensors_dir(dir.path()); },
                                   {"weight_map entry 'a'", "expected a shard file name string, found number 3"});
    write_bytes(dir.file("model.safetensors.index.json"), R"({"metadata": {}})");
    expect_throw_with<FormatError>([&] { load_safetensors_dir(dir.path()); }, {"missing \"weight_map\""});
    write_bytes(dir.file("model.safetensors.index.json"), "{oops");
    expect_throw_with<FormatError>([&] { load_safetensors_dir(dir.path()); }, {"not valid JSON"});
  }
}

// --------------------------------------------------------------- atomic files

TEST(AtomicFile, WritesAndReplacesLeavingNoTemporaryFiles) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  write_file_atomic(path, "first version");
  EXPECT_EQ(read_bytes(path), "first version");
  write_file_atomic(path, std::string("second\0version", 14));
  EXPECT_EQ(read_bytes(path), std::string("second\0version", 14));
  write_file_atomic(path, "");
  EXPECT_EQ(read_bytes(path), "");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"out.bin"});
}

TEST(AtomicFile, MissingDirectoryThrowsWithPathAndReason) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/out.bin");
  expect_throw_with<Error>([&] { write_file_atomic(path, "x"); }, {path, "No such file or directory"});
  EXPECT_TRUE(dir.entries().empty());
  expect_throw_with<Error>([&] { save_safetensors(path, {{"x", at::ones({1})}}); }, {path});
}

TEST(AtomicFile, FailedRenameKeepsDestinationAndRemovesTemporary) {
  // The destination is a non-empty directory, so everything succeeds up to
  // the rename, which fails.
  TempDir dir;
  const std::string path = dir.file("target");
  fs::create_directory(path);
  write_bytes(path + "/keep.txt", "kept");
  expect_throw_with<Error>([&] { write_file_atomic(path, "new contents"); }, {path, "rename failed"});
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"target"});
  EXPECT_EQ(read_bytes(path + "/keep.txt"), "kept");
}

TEST(AtomicFile, WriterWithoutCommitLeavesPreviousFileIntact) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"w", at::arange(4, at::kFloat)}});
  const std::string before = read_bytes(path);
  std::string temp;
  try {
    AtomicFileWriter w(path);
    temp = w.temp_path();
    EXPECT_EQ(temp.rfind(path + ".tmp.", 0), 0u) << temp;
    w.write("partial new con");
    w.write("tents", 5);
    EXPECT_EQ(w.bytes_written(), 20u);
    EXPECT_TRUE(fs::exists(temp));
    EXPECT_EQ(read_bytes(path), before);  // nothing visible before commit
    throw std::runtime_error("simulated failure while producing the data");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(temp.empty());
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(bits_equal(load_safetensors(path).tensors.at("w"), at::arange(4, at::kFloat)));
}

TEST(AtomicFile, WriterLifecycle) {
  TempDir dir;
  const std::string path = dir.file("f.txt");
  AtomicFileWriter w;
  EXPECT_FALSE(w.is_open());
  EXPECT_THROW(w.write("x"), std::logic_error);
  EXPECT_THROW(w.commit(), std::logic_error);
  w.open(path);
  w.write("abc");
  w.discard();
  EXPECT_FALSE(w.is_open());
  EXPECT_TRUE(dir.entries().empty());

  // Moving hands over the temporary file; only the final owner commits.
  AtomicFileWriter a(path);
  a.write("moved ");
  AtomicFileWriter b(std::move(a));
  EXPECT_FALSE(a.is_open());  // NOLINT(bugprone-use-after-move)
  b.write("data");
  AtomicFileWriter c;
  c = std::move(b);
  c.commit();
  EXPECT_FALSE(c.is_open());
  EXPECT_THROW(c.write("late"), std::logic_error);
  EXPECT_EQ(read_bytes(path), "moved data");

  // Re-opening a writer discards what it had.
  AtomicFileWriter d(path);
  d.write("dropped");
  const std::string first_temp = d.temp_path();
  d.open(path);
  EXPECT_NE(d.temp_path(), first_temp);
  EXPECT_FALSE(fs::exists(first_temp));
  d.write("kept");
  d.commit();
  EXPECT_EQ(read_bytes(path), "kept");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"f.txt"});
}

TEST(AtomicFile, ConcurrentWritersNeverProduceAMix) {
  TempDir dir;
  const std::string path = dir.file("shared.txt");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string body(4096, static_cast<char>('a' + t));
      for (int i = 0; i < 20; ++i) write_file_atomic(path, body);
    });
  }
  for (auto& th : threads) th.join();
  const std::string final_contents = read_bytes(path);
  ASSERT_EQ(final_contents.size(), 4096u);
  EXPECT_EQ(final_contents, std::string(4096, final_contents[0]));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"shared.txt"});
}

TEST(AtomicFile, JsonIsPrettyPrinted) {
  TempDir dir;
  const std::string path = dir.file("c.json");
  nlohmann::json j = {{"b", 1}, {"a", {1, 2}}, {"s", "\xC3\xA9"}};
  write_json_atomic(path, j);
  EXPECT_EQ(read_bytes(path), j.dump(2) + "\n");
  EXPECT_EQ(nlohmann::json::parse(read_bytes(path)), j);
  EXPECT_NE(read_bytes(path).find("\n  \"a\": [\n    1,"), std::string::npos) << read_bytes(path);
  expect_throw_with<InvalidArgument>([&] { write_json_atomic(path, nlohmann::json("bad\xFF")); }, {path});
  EXPECT_EQ(nlohmann::json::parse(read_bytes(path)), j);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"c.json"});
}

}  // namespace
