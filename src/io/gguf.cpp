// GGUF reader: see include/dspark/io/gguf.hpp for the format summary.
#include "dspark/io/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "dspark/error.hpp"

namespace dspark::io {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;
// Guards against absurd counts in corrupt headers before we allocate.
constexpr uint64_t kMaxCount = uint64_t{1} << 32;

const char* value_type_name(uint32_t t) {
  static const char* names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                "bool",  "string", "array", "uint64", "int64", "float64"};
  return t < 13 ? names[t] : "unknown";
}

// Bounds-checked little-endian cursor over the mapped file.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* base, uint64_t size)
      : path_(path), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t size() const { return size_; }

  [[noreturn]] void fail(const std::string& what) const {
    std::ostringstream os;
    os << path_ << ": " << what << " at offset " << pos_;
    throw FormatError(os.str());
  }

  void need(uint64_t n, const char* what) const {
    if (n > size_ - pos_) {
      std::ostringstream os;
      os << "truncated file: expected " << n << " bytes of " << what << ", but only "
         << (size_ - pos_) << " remain of " << size_;
      fail(os.str());
    }
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > size_) fail(std::string("implausible string length ") + std::to_string(n) + " for " + what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const std::string& path_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

GGUFValue read_value(Cursor& c, uint32_t type, const std::string& key, int depth) {
  GGUFValue v;
  v.type = static_cast<GGUFValueType>(type);
  switch (static_cast<GGUFValueType>(type)) {
    case GGUFValueType::UINT8: v.value = uint64_t{c.read<uint8_t>("uint8")}; break;
    case GGUFValueType::INT8: v.value = int64_t{c.read<int8_t>("int8")}; break;
    case GGUFValueType::UINT16: v.value = uint64_t{c.read<uint16_t>("uint16")}; break;
    case GGUFValueType::INT16: v.value = int64_t{c.read<int16_t>("int16")}; break;
    case GGUFValueType::UINT32: v.value = uint64_t{c.read<uint32_t>("uint32")}; break;
    case GGUFValueType::INT32: v.value = int64_t{c.read<int32_t>("int32")}; break;
    case GGUFValueType::UINT64: v.value = c.read<uint64_t>("uint64"); break;
    case GGUFValueType::INT64: v.value = c.read<int64_t>("int64"); break;
    case GGUFValueType::FLOAT32: v.value = double{c.read<float>("float32")}; break;
    case GGUFValueType::FLOAT64: v.value = c.read<double>("float64"); break;
    case GGUFValueType::BOOL: {
      const uint8_t b = c.read<uint8_t>("bool");
      if (b > 1) c.fail("key '" + key + "': bool value " + std::to_string(b) + " is neither 0 nor 1");
      v.value = b != 0;
      break;
    }
    case GGUFValueType::STRING: v.value = c.read_string("string value"); break;
    case GGUFValueType::ARRAY: {
      if (depth >= kMaxArrayDepth) c.fail("key '" + key + "': arrays nested deeper than 8 levels");
      const uint32_t et = c.read<uint32_t>("array element type");
      if (et > 12) c.fail("key '" + key + "': unknown array element type " + std::to_string(et));
      const uint64_t n = c.read<uint64_t>("array length");
      if (n > kMaxCount) c.fail("key '" + key + "': implausible array length " + std::to_string(n));
      v.elem_type = static_cast<GGUFValueType>(et);
      // Every element takes at least one byte: a length beyond the bytes left
      // is a truncated or corrupt file, rejected before allocating for it.
      if (n > c.remaining())
        c.fail("key '" + key + "': truncated file: array of " + std::to_string(n) +
               " elements but only " + std::to_string(c.remaining()) + " bytes remain of " +
               std::to_string(c.size()));
      GGUFValue::Array arr;
      arr.reserve(n);
      for (uint64_t i = 0; i < n; ++i) arr.push_back(read_value(c, et, key, depth + 1));
      v.value = std::move(arr);
      break;
    }
    default:
      c.fail("key '" + key + "': unknown value type " + std::to_string(type) +
             " (expected 0..12)");
  }
  return v;
}

// Offsets summed without wrapping, for messages about offsets beyond 2^64.
using u128 = unsigned __int128;
std::string decimal(u128 v) {
  std::string out;
  do {
    out.insert(out.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return out;
}

[[noreturn]] void type_error(const GGUFValue& v, const char* wanted) {
  throw FormatError(std::string("metadata value of type ") +
                    value_type_name(static_cast<uint32_t>(v.type)) + " used as " + wanted);
}

}  // namespace

std::optional<GGMLTypeTraits> ggml_type_traits(uint32_t id) {
  switch (static_cast<GGMLType>(id)) {
    case GGMLType::F32: return GGMLTypeTraits{"F32", 1, 4};
    case GGMLType::F16: return GGMLTypeTraits{"F16", 1, 2};
    case GGMLType::BF16: return GGMLTypeTraits{"BF16", 1, 2};
    case GGMLType::Q4_0: return GGMLTypeTraits{"Q4_0", 32, 18};
    case GGMLType::Q4_1: return GGMLTypeTraits{"Q4_1", 32, 20};
    case GGMLType::Q5_0: return GGMLTypeTraits{"Q5_0", 32, 22};
    case GGMLType::Q5_1: return GGMLTypeTraits{"Q5_1", 32, 24};
    case GGMLType::Q8_0: return GGMLTypeTraits{"Q8_0", 32, 34};
    case GGMLType::Q8_1: return GGMLTypeTraits{"Q8_1", 32, 36};
    case GGMLType::Q2_K: return GGMLTypeTraits{"Q2_K", 256, 84};
    case GGMLType::Q3_K: return GGMLTypeTraits{"Q3_K", 256, 110};
    case GGMLType::Q4_K: return GGMLTypeTraits{"Q4_K", 256, 144};
    case GGMLType::Q5_K: return GGMLTypeTraits{"Q5_K", 256, 176};
    case GGMLType::Q6_K: return GGMLTypeTraits{"Q6_K", 256, 210};
    case GGMLType::Q8_K: return GGMLTypeTraits{"Q8_K", 256, 292};
    case GGMLType::I8: return GGMLTypeTraits{"I8", 1, 1};
    case GGMLType::I16: return GGMLTypeTraits{"I16", 1, 2};
    case GGMLType::I32: return GGMLTypeTraits{"I32", 1, 4};
    case GGMLType::I64: return GGMLTypeTraits{"I64", 1, 8};
    case GGMLType::F64: return GGMLTypeTraits{"F64", 1, 8};
  }
  return std::nullopt;
}

std::string ggml_type_name(uint32_t id) {
  auto t = ggml_type_traits(id);
  return t ? std::string(t->name) : "type#" + std::to_string(id);
}

// ---- GGUFValue -------------------------------------------------------------

bool GGUFValue::is_integer() const {
  return std::holds_alternative<uint64_t>(value) || std::holds_alternative<int64_t>(value);
}
bool GGUFValue::is_float() const { return std::holds_alternative<double>(value); }

int64_t GGUFValue::as_int() const {
  if (auto* u = std::get_if<uint64_t>(&value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw FormatError("metadata value " + std::to_string(*u) + " does not fit int64");
    return static_cast<int64_t>(*u);
  }
  if (auto* i = std::get_if<int64_t>(&value)) return *i;
  if (auto* b = std::get_if<bool>(&value)) return *b ? 1 : 0;
  type_error(*this, "integer");
}
uint64_t GGUFValue::as_uint() const {
  if (auto* u = std::get_if<uint64_t>(&value)) return *u;
  if (auto* i = std::get_if<int64_t>(&value)) {
    if (*i < 0) throw FormatError("metadata value " + std::to_string(*i) + " is negative, expected unsigned");
    return static_cast<uint64_t>(*i);
  }
  type_error(*this, "unsigned integer");
}
double GGUFValue::as_float() const {
  if (auto* d = std::get_if<double>(&value)) return *d;
  if (auto* u = std::get_if<uint64_t>(&value)) return static_cast<double>(*u);
  if (auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  type_error(*this, "float");
}
bool GGUFValue::as_bool() const {
  if (auto* b = std::get_if<bool>(&value)) return *b;
  if (is_integer()) return as_int() != 0;
  type_error(*this, "bool");
}
const std::string& GGUFValue::as_string() const {
  if (auto* s = std::get_if<std::string>(&value)) return *s;
  type_error(*this, "string");
}
const GGUFValue::Array& GGUFValue::as_array() const {
  if (auto* a = std::get_if<Array>(&value)) return *a;
  type_error(*this, "array");
}

// ---- GGUFTensorInfo --------------------------------------------------------

int64_t GGUFTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GGUFTensorInfo::shape() const { return {ne.rbegin(), ne.rend()}; }

// ---- GGUFFile --------------------------------------------------------------

GGUFFile::GGUFFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block; fstat refuses it
  if (fd_ < 0) {
    throw Error(path + ": cannot open model file: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw Error(path + ": not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) {
      ::close(fd_);
      fd_ = -1;
      throw Error(path + ": mmap failed: " + std::strerror(errno));
    }
    base_ = static_cast<const uint8_t*>(p);
  }
  try {
    parse();
  } catch (...) {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    ::close(fd_);
    base_ = nullptr;
    fd_ = -1;
    throw;
  }
}

GGUFFile::~GGUFFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

GGUFFile::GGUFFile(GGUFFile&& o) noexcept { *this = std::move(o); }

GGUFFile& GGUFFile::operator=(GGUFFile&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    version_ = o.version_;
    alignment_ = o.alignment_;
    kv_ = std::move(o.kv_);
    tensors_ = std::move(o.tensors_);
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}

void GGUFFile::parse() {
  Cursor c(path_, base_, size_);
  if (size_ < 4) c.fail("not a GGUF file: " + std::to_string(size_) + " bytes is too short for the header");
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) {
    char got[5] = {0};
    std::memcpy(got, &magic, 4);
    for (char& ch : got)
      if (ch && (ch < 32 || ch > 126)) ch = '?';
    throw FormatError(path_ + ": not a GGUF file: expected magic \"GGUF\" at offset 0, found \"" +
                      std::string(got) + "\"");
  }
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    throw FormatError(path_ + ": unsupported GGUF version " + std::to_string(version_) +
                      " (expected 2 or 3)");
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  if (n_tensors > kMaxCount || n_kv > kMaxCount)
    c.fail("implausible tensor count " + std::to_string(n_tensors) + " or metadata count " + std::to_string(n_kv) +
           " (at most " + std::to_string(kMaxCount) + " each)");
  // Smallest encodings: a KV pair takes >= 13 bytes, a tensor info >= 32.
  if (n_kv * 13 + n_tensors * 32 > c.remaining()) {
    c.fail("truncated file: " + std::to_string(n_kv) + " metadata entries and " +
           std::to_string(n_tensors) + " tensor infos need at least " +
           std::to_string(n_kv * 13 + n_tensors * 32) + " bytes, but only " +
           std::to_string(c.remaining()) + " remain of " + std::to_string(c.size()));
  }

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key");
    const uint32_t type = c.read<uint32_t>("metadata value type");
    GGUFValue v = read_value(c, type, key, 0);
    if (!kv_.emplace(key, std::move(v)).second) c.fail("duplicate metadata key '" + key + "'");
  }
  if (auto it = kv_.find("general.alignment"); it != kv_.end()) {
    uint64_t a = 0;
    try {
      a = it->second.as_uint();
    } catch (const FormatError& e) {  // a string, a float or a negative number
      throw FormatError(path_ + ": key 'general.alignment': " + e.what());
    }
    if (a == 0 || (a & (a - 1)) != 0)
      throw FormatError(path_ + ": general.alignment must be a power of two, found " + std::to_string(a));
    alignment_ = a;
  }

  tensors_.reserve(std::min<uint64_t>(n_tensors, c.remaining() / 24));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GGUFTensorInfo t;
    t.name = c.read_string("tensor name");
    const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > 4)
      c.fail("tensor '" + t.name + "': expected 1..4 dimensions, found " + std::to_string(n_dims));
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.read<uint64_t>("tensor dimension");
      if (n == 0 || n > kMaxCount) c.fail("tensor '" + t.name + "': invalid dimension " + std::to_string(n));
      t.ne.push_back(static_cast<int64_t>(n));
    }
    t.type_id = c.read<uint32_t>("tensor type");
    t.offset = c.read<uint64_t>("tensor offset");
    auto traits = ggml_type_traits(t.type_id);
    if (!traits) {
      throw FormatError(path_ + ": tensor '" + t.name + "' has unsupported type " +
                        ggml_type_name(t.type_id) + " (this reader knows F32, F16, BF16, Q4_0..Q8_1, Q2_K..Q8_K)");
    }
    if (t.ne[0] % traits->block_elems != 0) {
      throw FormatError(path_ + ": tensor '" + t.name + "': row length " + std::to_string(t.ne[0]) +
                        " is not a multiple of the " + traits->name + " block size " +
                        std::to_string(traits->block_elems));
    }
    t.n_bytes = static_cast<uint64_t>(t.n_elements() / traits->block_elems * traits->block_bytes);
    if (!tensor_index_.emplace(t.name, tensors_.size()).second)
      c.fail("duplicate tensor name '" + t.name + "'");
    tensors_.push_back(std::move(t));
  }

  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (auto& t : tensors_) {
    if (t.offset % alignment_ != 0) {
      throw FormatError(path_ + ": tensor '" + t.name + "' offset " + std::to_string(t.offset) +
                        " is not aligned to " + std::to_string(alignment_));
    }
    // Compared without forming data_start + offset + n_bytes: an offset near
    // 2^64 would wrap that sum back into the header.
    const uint64_t room = data_start <= size_ ? size_ - data_start : 0;
    if (t.offset > room || t.n_bytes > room - t.offset) {
      throw FormatError(path_ + ": truncated file: tensor '" + t.name + "' needs bytes " +
                        decimal(u128(data_start) + t.offset) + ".." + decimal(u128(data_start) + t.offset + t.n_bytes) +
                        " but the file has " + std::to_string(size_) + " bytes");
    }
    const uint64_t begin = data_start + t.offset;
    t.data = base_ + begin;
  }
}

const GGUFValue* GGUFFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GGUFValue& GGUFFile::get(const std::string& key) const {
  if (auto* v = find(key)) return *v;
  throw FormatError(path_ + ": missing metadata key '" + key + "'");
}

namespace {
template <typename F>
auto with_key(const std::string& path, const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const FormatError& e) {
    throw FormatError(path + ": key '" + key + "': " + e.what());
  }
}
}  // namespace

std::string GGUFFile::get_string(const std::string& key) const {
  const auto& v = get(key);
  return with_key(path_, key, [&] { return v.as_string(); });
}
int64_t GGUFFile::get_int(const std::string& key) const {
  const auto& v = get(key);
  return with_key(path_, key, [&] { return v.as_int(); });
}
int64_t GGUFFile::get_int_or(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double GGUFFile::get_float(const std::string& key) const {
  const auto& v = get(key);
  return with_key(path_, key, [&] { return v.as_float(); });
}
double GGUFFile::get_float_or(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool GGUFFile::get_bool_or(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = get(key);
  return with_key(path_, key, [&] { return v.as_bool(); });
}
std::vector<std::string> GGUFFile::get_string_array(const std::string& key) const {
  const auto& v = get(key);
  return with_key(path_, key, [&] {
    std::vector<std::string> out;
    for (const auto& e : v.as_array()) out.push_back(e.as_string());
    return out;
  });
}
std::vector<int64_t> GGUFFile::get_int_array(const std::string& key) const {
  const auto& v = get(key);
  return with_key(path_, key, [&] {
    std::vector<int64_t> out;
    for (const auto& e : v.as_array()) out.push_back(e.as_int());
    return out;
  });
}
std::vector<double> GGUFFile::get_float_array(const std::string& key) const {
  const auto& v = get(key);
  return with_key(path_, key, [&] {
    std::vector<double> out;
    for (const auto& e : v.as_array()) out.push_back(e.as_float());
    return out;
  });
}

const GGUFTensorInfo* GGUFFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GGUFTensorInfo& GGUFFile::tensor(const std::string& name) const {
  if (auto* t = find_tensor(name)) return *t;
  throw FormatError(path_ + ": missing tensor '" + name + "'");
}

}  // namespace dspark::io
