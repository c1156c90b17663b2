// GGUF writer: see include/dspark/io/gguf_writer.hpp for the layout.
#include "dspark/io/gguf_writer.hpp"

#include <cstring>
#include <limits>
#include <type_traits>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"

namespace dspark::io {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;         // the reader's nesting limit
constexpr size_t kMaxNameBytes = 64;      // ggml GGML_MAX_NAME, terminator included
constexpr uint64_t kDefaultAlignment = 32;
constexpr size_t kMaxKeyBytes = 65535;      // the spec's key length limit

const char* type_name(GGUFValueType t) {
  static const char* names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                "bool",  "string", "array", "uint64", "int64", "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "unknown";
}

GGUFValue scalar(GGUFValueType type, decltype(GGUFValue::value) v) {
  GGUFValue out;
  out.type = type;
  out.value = std::move(v);
  return out;
}

// Throws InvalidArgument "<key>: <what>".
[[noreturn]] void bad_value(const std::string& key, const std::string& what) {
  throw InvalidArgument("GGUF metadata key '" + key + "': " + what);
}

// Checks that an integer alternative fits [lo, hi].
void check_int(const std::string& key, const GGUFValue& v, int64_t lo, uint64_t hi) {
  if (auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > hi)
      bad_value(key, std::to_string(*u) + " does not fit " + type_name(v.type));
    return;
  }
  if (auto* i = std::get_if<int64_t>(&v.value)) {
    if (*i < lo || (*i > 0 && static_cast<uint64_t>(*i) > hi))
      bad_value(key, std::to_string(*i) + " does not fit " + type_name(v.type));
    return;
  }
  bad_value(key, std::string("a ") + type_name(v.type) + " value must hold an integer");
}

void validate(const std::string& key, const GGUFValue& v, int depth) {
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
  switch (v.type) {
    case GGUFValueType::UINT8: return check_int(key, v, 0, 0xFF);
    case GGUFValueType::INT8: return check_int(key, v, -128, 127);
    case GGUFValueType::UINT16: return check_int(key, v, 0, 0xFFFF);
    case GGUFValueType::INT16: return check_int(key, v, -32768, 32767);
    case GGUFValueType::UINT32: return check_int(key, v, 0, 0xFFFFFFFFu);
    case GGUFValueType::INT32: return check_int(key, v, INT32_MIN, INT32_MAX);
    case GGUFValueType::UINT64: return check_int(key, v, 0, std::numeric_limits<uint64_t>::max());
    case GGUFValueType::INT64: return check_int(key, v, kI64Min, std::numeric_limits<int64_t>::max());
    case GGUFValueType::FLOAT32:
    case GGUFValueType::FLOAT64:
      if (!std::holds_alternative<double>(v.value))
        bad_value(key, std::string("a ") + type_name(v.type) + " value must hold a double");
      return;
    case GGUFValueType::BOOL:
      if (!std::holds_alternative<bool>(v.value)) bad_value(key, "a bool value must hold a bool");
      return;
    case GGUFValueType::STRING:
      if (!std::holds_alternative<std::string>(v.value))
        bad_value(key, "a string value must hold a std::string");
      return;
    case GGUFValueType::ARRAY: {
      if (depth >= kMaxArrayDepth) bad_value(key, "arrays nested deeper than 8 levels");
      const auto* arr = std::get_if<GGUFValue::Array>(&v.value);
      if (!arr) bad_value(key, "an array value must hold a GGUFValue::Array");
      if (static_cast<uint32_t>(v.elem_type) > 12)
        bad_value(key, "unknown array element type " + std::to_string(static_cast<uint32_t>(v.elem_type)));
      for (size_t i = 0; i < arr->size(); ++i) {
        const GGUFValue& e = (*arr)[i];
        if (e.type != v.elem_type)
          bad_value(key, "array element " + std::to_string(i) + " has type " + type_name(e.type) +
                             ", expected " + type_name(v.elem_type));
        validate(key, e, depth + 1);
      }
      return;
    }
  }
  bad_value(key, "unknown value type " + std::to_string(static_cast<uint32_t>(v.type)) +
                     " (expected 0..12)");
}

// Little-endian appends (the library only builds on little-endian hosts).
template <typename T>
void put(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_string(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s.data(), s.size());
}

uint64_t int_bits(const GGUFValue& v) {
  if (auto* u = std::get_if<uint64_t>(&v.value)) return *u;
  return static_cast<uint64_t>(std::get<int64_t>(v.value));
}

// Writes the value body (no type tag), validated beforehand.
void put_value(std::string& out, const GGUFValue& v) {
  switch (v.type) {
    case GGUFValueType::UINT8: put<uint8_t>(out, static_cast<uint8_t>(int_bits(v))); break;
    case GGUFValueType::INT8: put<int8_t>(out, static_cast<int8_t>(int_bits(v))); break;
    case GGUFValueType::UINT16: put<uint16_t>(out, static_cast<uint16_t>(int_bits(v))); break;
    case GGUFValueType::INT16: put<int16_t>(out, static_cast<int16_t>(int_bits(v))); break;
    case GGUFValueType::UINT32: put<uint32_t>(out, static_cast<uint32_t>(int_bits(v))); break;
    case GGUFValueType::INT32: put<int32_t>(out, static_cast<int32_t>(int_bits(v))); break;
    case GGUFValueType::UINT64: put<uint64_t>(out, int_bits(v)); break;
    case GGUFValueType::INT64: put<int64_t>(out, static_cast<int64_t>(int_bits(v))); break;
    case GGUFValueType::FLOAT32: put<float>(out, static_cast<float>(std::get<double>(v.value))); break;
    case GGUFValueType::FLOAT64: put<double>(out, std::get<double>(v.value)); break;
    case GGUFValueType::BOOL: put<uint8_t>(out, std::get<bool>(v.value) ? 1 : 0); break;
    case GGUFValueType::STRING: put_string(out, std::get<std::string>(v.value)); break;
    case GGUFValueType::ARRAY: {
      const auto& arr = std::get<GGUFValue::Array>(v.value);
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, arr.size());
      for (const auto& e : arr) put_value(out, e);
      break;
    }
  }
}

uint64_t value_size(const GGUFValue& v) {
  switch (v.type) {
    case GGUFValueType::UINT8:
    case GGUFValueType::INT8:
    case GGUFValueType::BOOL: return 1;
    case GGUFValueType::UINT16:
    case GGUFValueType::INT16: return 2;
    case GGUFValueType::UINT32:
    case GGUFValueType::INT32:
    case GGUFValueType::FLOAT32: return 4;
    case GGUFValueType::UINT64:
    case GGUFValueType::INT64:
    case GGUFValueType::FLOAT64: return 8;
    case GGUFValueType::STRING: return 8 + std::get<std::string>(v.value).size();
    case GGUFValueType::ARRAY: {
      uint64_t n = 4 + 8;
      for (const auto& e : std::get<GGUFValue::Array>(v.value)) n += value_size(e);
      return n;
    }
  }
  return 0;
}

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace

// ---- value builders ----------------------------------------------------------

namespace gguf {
GGUFValue u8(uint8_t v) { return scalar(GGUFValueType::UINT8, uint64_t{v}); }
GGUFValue i8(int8_t v) { return scalar(GGUFValueType::INT8, int64_t{v}); }
GGUFValue u16(uint16_t v) { return scalar(GGUFValueType::UINT16, uint64_t{v}); }
GGUFValue i16(int16_t v) { return scalar(GGUFValueType::INT16, int64_t{v}); }
GGUFValue u32(uint32_t v) { return scalar(GGUFValueType::UINT32, uint64_t{v}); }
GGUFValue i32(int32_t v) { return scalar(GGUFValueType::INT32, int64_t{v}); }
GGUFValue u64(uint64_t v) { return scalar(GGUFValueType::UINT64, v); }
GGUFValue i64(int64_t v) { return scalar(GGUFValueType::INT64, v); }
GGUFValue f32(float v) { return scalar(GGUFValueType::FLOAT32, double{v}); }
GGUFValue f64(double v) { return scalar(GGUFValueType::FLOAT64, v); }
GGUFValue boolean(bool v) { return scalar(GGUFValueType::BOOL, v); }
GGUFValue string(std::string v) { return scalar(GGUFValueType::STRING, std::move(v)); }

GGUFValue array(GGUFValueType elem_type, GGUFValue::Array elems) {
  for (size_t i = 0; i < elems.size(); ++i) {
    if (elems[i].type != elem_type) {
      throw InvalidArgument("gguf::array: element " + std::to_string(i) + " has type " +
                            type_name(elems[i].type) + ", expected " + type_name(elem_type));
    }
  }
  GGUFValue out;
  out.type = GGUFValueType::ARRAY;
  out.elem_type = elem_type;
  out.value = std::move(elems);
  return out;
}

namespace {
template <typename T, typename F>
GGUFValue array_of(GGUFValueType t, const std::vector<T>& v, F make) {
  GGUFValue::Array a;
  a.reserve(v.size());
  for (const auto& x : v) a.push_back(make(x));
  return array(t, std::move(a));
}
}  // namespace

GGUFValue string_array(const std::vector<std::string>& v) {
  return array_of(GGUFValueType::STRING, v, [](const std::string& s) { return string(s); });
}
GGUFValue i32_array(const std::vector<int32_t>& v) { return array_of(GGUFValueType::INT32, v, i32); }
GGUFValue u32_array(const std::vector<uint32_t>& v) { return array_of(GGUFValueType::UINT32, v, u32); }
GGUFValue f32_array(const std::vector<float>& v) { return array_of(GGUFValueType::FLOAT32, v, f32); }
GGUFValue f64_array(const std::vector<double>& v) { return array_of(GGUFValueType::FLOAT64, v, f64); }
}  // namespace gguf

// ---- GGUFWriter ----------------------------------------------------------------

GGUFWriter::GGUFWriter(uint32_t version) : version_(version) {
  if (version != 2 && version != 3)
    throw InvalidArgument("GGUFWriter: unsupported GGUF version " + std::to_string(version) +
                          " (expected 2 or 3)");
}

void GGUFWriter::set(const std::string& key, GGUFValue value) {
  if (key.empty()) throw InvalidArgument("GGUF metadata key must not be empty");
  if (key.size() > kMaxKeyBytes)
    throw InvalidArgument("GGUF metadata key of " + std::to_string(key.size()) + " bytes exceeds the limit of " +
                          std::to_string(kMaxKeyBytes));
  validate(key, value, 0);
  if (key == "general.alignment") {
    if (value.type != GGUFValueType::UINT32) {
      bad_value(key, std::string("must be a uint32, found ") + type_name(value.type));
    }
    const uint64_t a = int_bits(value);
    if (a == 0 || (a & (a - 1)) != 0) bad_value(key, "must be a power of two, found " + std::to_string(a));
    alignment_ = a;
  }
  if (auto it = kv_index_.find(key); it != kv_index_.end()) {
    kv_[it->second].second = std::move(value);
  } else {
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(key, std::move(value));
  }
  relayout();
}

const GGUFValue* GGUFWriter::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

bool GGUFWriter::erase(const std::string& key) {
  auto it = kv_index_.find(key);
  if (it == kv_index_.end()) return false;
  kv_.erase(kv_.begin() + static_cast<std::ptrdiff_t>(it->second));
  kv_index_.clear();
  for (size_t i = 0; i < kv_.size(); ++i) kv_index_.emplace(kv_[i].first, i);
  if (key == "general.alignment") alignment_ = kDefaultAlignment;
  relayout();
  return true;
}

void GGUFWriter::add_tensor(const std::string& name, uint32_t type_id, std::vector<int64_t> ne,
                            std::string_view data) {
  const std::string where = "GGUFWriter: tensor '" + name + "': ";
  if (name.empty()) throw InvalidArgument("GGUFWriter: tensor name must not be empty");
  if (name.size() >= kMaxNameBytes)
    throw InvalidArgument(where + "name is " + std::to_string(name.size()) +
                          " bytes, the limit is " + std::to_string(kMaxNameBytes - 1));
  if (tensor_index_.count(name)) throw InvalidArgument(where + "already added");
  if (ne.empty() || ne.size() > 4)
    throw InvalidArgument(where + "expected 1..4 dimensions, found " + std::to_string(ne.size()));
  const auto traits = ggml_type_traits(type_id);
  if (!traits) throw InvalidArgument(where + "unknown ggml type " + ggml_type_name(type_id));
  int64_t n = 1;
  for (int64_t d : ne) {
    if (d <= 0) throw InvalidArgument(where + "dimension " + std::to_string(d) + " is not positive");
    if (n > std::numeric_limits<int64_t>::max() / d)
      throw InvalidArgument(where + "element count overflows int64");
    n *= d;
  }
  if (ne[0] % traits->block_elems != 0)
    throw InvalidArgument(where + "row length " + std::to_string(ne[0]) + " is not a multiple of the " +
                          traits->name + " block size " + std::to_string(traits->block_elems));
  const uint64_t want = static_cast<uint64_t>(n / traits->block_elems) *
                        static_cast<uint64_t>(traits->block_bytes);
  if (data.size() != want)
    throw InvalidArgument(where + "expected " + std::to_string(want) + " bytes of " + traits->name +
                          " data, got " + std::to_string(data.size()));
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back(Tensor{name, type_id, std::move(ne), std::string(data), 0});
  relayout();
}

void GGUFWriter::add_tensor(const std::string& name, const at::Tensor& t) {
  GGMLType type;
  switch (t.scalar_type()) {
    case at::kFloat: type = GGMLType::F32; break;
    case at::kHalf: type = GGMLType::F16; break;
    case at::kBFloat16: type = GGMLType::BF16; break;
    case at::kDouble: type = GGMLType::F64; break;
    case at::kChar: type = GGMLType::I8; break;
    case at::kShort: type = GGMLType::I16; break;
    case at::kInt: type = GGMLType::I32; break;
    case at::kLong: type = GGMLType::I64; break;
    default:
      throw InvalidArgument("GGUFWriter: tensor '" + name + "': unsupported dtype " +
                            std::string(c10::toString(t.scalar_type())) +
                            " (supported: float32, float16, bfloat16, float64, int8, int16, int32, int64)");
  }
  if (t.dim() > 4)
    throw InvalidArgument("GGUFWriter: tensor '" + name + "': expected at most 4 dimensions, found " +
                          std::to_string(t.dim()));
  if (t.numel() == 0) throw InvalidArgument("GGUFWriter: tensor '" + name + "' is empty");
  const at::Tensor c = t.to(at::kCPU).contiguous();
  std::vector<int64_t> ne(c.sizes().rbegin(), c.sizes().rend());
  if (ne.empty()) ne.push_back(1);
  add_tensor(name, static_cast<uint32_t>(type), std::move(ne),
             std::string_view(static_cast<const char*>(c.data_ptr()), c.nbytes()));
}

void GGUFWriter::relayout() {
  uint64_t off = 0;
  for (auto& t : tensors_) {
    t.offset = off;
    off = align_up(off + t.data.size(), alignment_);
  }
}

uint64_t GGUFWriter::header_size() const {
  uint64_t n = 4 + 4 + 8 + 8;
  for (const auto& [k, v] : kv_) n += 8 + k.size() + 4 + value_size(v);
  for (const auto& t : tensors_) n += 8 + t.name.size() + 4 + 8 * t.ne.size() + 4 + 8;
  return n;
}

uint64_t GGUFWriter::data_section_offset() const { return align_up(header_size(), alignment_); }

uint64_t GGUFWriter::size() const {
  uint64_t n = data_section_offset();
  for (const auto& t : tensors_) n += align_up(t.data.size(), alignment_);
  return n;
}

// Calls sink(std::string_view) with consecutive pieces of the file.
template <typename Sink>
void GGUFWriter::serialize(Sink&& sink) const {
  std::string head;
  head.reserve(static_cast<size_t>(data_section_offset()));
  put<uint32_t>(head, kMagic);
  put<uint32_t>(head, version_);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_string(head, k);
    put<uint32_t>(head, static_cast<uint32_t>(v.type));
    put_value(head, v);
  }
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, t.type_id);
    put<uint64_t>(head, t.offset);
  }
  head.resize(static_cast<size_t>(align_up(head.size(), alignment_)), '\0');
  sink(std::string_view(head));
  const std::string zeros(static_cast<size_t>(alignment_), '\0');
  for (const auto& t : tensors_) {
    sink(std::string_view(t.data));
    const uint64_t pad = align_up(t.data.size(), alignment_) - t.data.size();
    if (pad) sink(std::string_view(zeros.data(), static_cast<size_t>(pad)));
  }
}

std::string GGUFWriter::bytes() const {
  std::string out;
  out.reserve(static_cast<size_t>(size()));
  serialize([&](std::string_view piece) { out.append(piece); });
  return out;
}

void GGUFWriter::write(const std::string& path) const {
  AtomicFileWriter w(path);
  serialize([&](std::string_view piece) { w.write(piece); });
  w.commit();
}

}  // namespace dspark::io
