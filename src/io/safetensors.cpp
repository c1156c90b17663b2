// safetensors reader and writer: see include/dspark/io/safetensors.hpp for the
// format summary.
#include "dspark/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"

static_assert(std::endian::native == std::endian::little,
              "the safetensors reader and writer assume a little-endian host");

namespace dspark::io {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct DTypeInfo {
  const char* name;
  at::ScalarType type;
  uint64_t size;
};

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {"F64", at::kDouble, 8},
    {"F32", at::kFloat, 4},
    {"F16", at::kHalf, 2},
    {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},
    {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},
    {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},
    {"BOOL", at::kBool, 1},
}};

// Dtypes of the specification that this reader does not load.
constexpr std::array<const char*, 11> kUnsupportedSpecDTypes = {
    "U16", "U32", "U64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64", "F8_E4M3FNUZ"};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DTypeInfo* find_dtype(at::ScalarType type) {
  for (const auto& d : kDTypes) {
    if (type == d.type) return &d;
  }
  return nullptr;
}

std::string supported_dtype_list() {
  std::string out;
  for (const auto& d : kDTypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// A short rendering of a JSON value for error messages: its type and, for
// small values, the value itself.
std::string describe(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return std::string(v.type_name()) + " " + text;
}

// One validated header entry.
struct Entry {
  std::string name;
  const DTypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in header order
  std::map<std::string, std::string> metadata;
};

class HeaderParser {
 public:
  HeaderParser(const std::string& source, uint64_t data_size) : source_(source), data_size_(data_size) {}

  Header parse(std::string_view text) {
    const json root = parse_json(text);
    if (!root.is_object()) fail("header must be a JSON object, found " + describe(root));
    Header h;
    for (const auto& [key, value] : root.items()) {
      if (key == "__metadata__") {
        h.metadata = parse_metadata(value);
      } else {
        h.entries.push_back(parse_entry(key, value));
      }
    }
    check_coverage(h.entries);
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw FormatError(source_ + ": " + what); }
  [[noreturn]] void fail_tensor(const std::string& name, const std::string& what) const {
    fail("tensor '" + name + "': " + what);
  }

  json parse_json(std::string_view text) const {
    // Track the keys of every open object so that a repeated key (which a
    // plain parse would silently collapse) is reported.
    std::vector<std::set<std::string>> open_objects;
    const json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
      switch (event) {
        case json::parse_event_t::object_start:
          open_objects.emplace_back();
          break;
        case json::parse_event_t::object_end:
          if (!open_objects.empty()) open_objects.pop_back();
          break;
        case json::parse_event_t::key:
          if (!open_objects.empty() && parsed.is_string() &&
              !open_objects.back().insert(parsed.get<std::string>()).second) {
            fail("header repeats the key '" + parsed.get<std::string>() + "'");
          }
          break;
        default:
          break;
      }
      return true;
    };
    try {
      return json::parse(text.begin(), text.end(), callback);
    } catch (const json::parse_error& e) {
      fail(std::string("header is not valid JSON: ") + e.what());
    }
  }

  std::map<std::string, std::string> parse_metadata(const json& value) const {
    if (!value.is_object()) {
      fail("\"__metadata__\" must be an object of strings, found " + describe(value));
    }
    std::map<std::string, std::string> out;
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) {
        fail("\"__metadata__\" key '" + key + "': expected a string value, found " + describe(v));
      }
      out.emplace(key, v.get<std::string>());
    }
    return out;
  }

  // A JSON non-negative integer, or fails with `what` describing the field.
  uint64_t as_u64(const std::string& name, const json& v, const std::string& what) const {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer()) {
      fail_tensor(name, what + " is " + std::to_string(v.get<int64_t>()) + ", expected a non-negative integer");
    }
    fail_tensor(name, what + " must be a non-negative integer, found " + describe(v));
  }

  Entry parse_entry(const std::string& name, const json& value) const {
    if (!value.is_object()) {
      fail_tensor(name, "expected an object with \"dtype\", \"shape\" and \"data_offsets\", found " +
                            describe(value));
    }
    for (const auto& [key, v] : value.items()) {
      (void)v;
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        fail_tensor(name, "unexpected key '" + key + "' (expected only \"dtype\", \"shape\", \"data_offsets\")");
      }
    }
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(key)) fail_tensor(name, std::string("missing \"") + key + "\"");
    }

    Entry e;
    e.name = name;

    const json& dtype = value.at("dtype");
    if (!dtype.is_string()) fail_tensor(name, "\"dtype\" must be a string, found " + describe(dtype));
    const std::string dtype_name = dtype.get<std::string>();
    e.dtype = find_dtype(dtype_name);
    if (e.dtype == nullptr) {
      const bool in_spec = std::any_of(kUnsupportedSpecDTypes.begin(), kUnsupportedSpecDTypes.end(),
                                       [&](const char* n) { return dtype_name == n; });
      fail_tensor(name, std::string(in_spec ? "unsupported" : "unknown") + " dtype '" + dtype_name +
                            "' (supported: " + supported_dtype_list() + ")");
    }

    const json& shape = value.at("shape");
    if (!shape.is_array()) fail_tensor(name, "\"shape\" must be an array of integers, found " + describe(shape));
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < shape.size(); ++i) {
      const uint64_t d = as_u64(name, shape[i], "shape dimension " + std::to_string(i));
      if (d > static_cast<uint64_t>(INT64_MAX)) {
        fail_tensor(name, "shape dimension " + std::to_string(i) + " is " + std::to_string(d) + ", too large");
      }
      e.shape.push_back(static_cast<int64_t>(d));
      overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
    }

    const json& offsets = value.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2) {
      fail_tensor(name, "\"data_offsets\" must be an array of two integers [begin, end], found " +
                            describe(offsets));
    }
    e.begin = as_u64(name, offsets[0], "data_offsets begin");
    e.end = as_u64(name, offsets[1], "data_offsets end");
    std::string range(1, '[');
    range.append(std::to_string(e.begin)).append(", ").append(std::to_string(e.end)).append("]");
    if (e.begin > e.end) fail_tensor(name, "data_offsets " + range + ": begin is after end");
    if (e.end > data_size_) {
      fail_tensor(name, "data_offsets " + range + " end beyond the data section of " + std::to_string(data_size_) +
                            " bytes");
    }
    uint64_t expected = 0;
    overflow = overflow || __builtin_mul_overflow(numel, e.dtype->size, &expected) ||
               numel > static_cast<uint64_t>(INT64_MAX);
    const std::string what = " (shape " + shape_string(e.shape) + ", " + e.dtype->name + ")";
    if (overflow) {
      fail_tensor(name, "data_offsets span " + std::to_string(e.end - e.begin) +
                            " bytes, but the element count overflows" + what);
    }
    if (e.end - e.begin != expected) {
      fail_tensor(name, "data_offsets span " + std::to_string(e.end - e.begin) + " bytes, expected " +
                            std::to_string(expected) + what);
    }
    return e;
  }

  // The ranges must tile [0, data_size) exactly.
  void check_coverage(const std::vector<Entry>& entries) const {
    std::vector<const Entry*> sorted;
    for (const auto& e : entries) sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
      if (a->begin != b->begin) return a->begin < b->begin;
      if (a->end != b->end) return a->end < b->end;
      return a->name < b->name;
    });
    const auto range = [](const Entry* e) {
      std::string r(1, '[');
      r.append(std::to_string(e->begin)).append(", ").append(std::to_string(e->end)).append(")");
      return r;
    };
    uint64_t pos = 0;
    const Entry* prev = nullptr;
    for (const Entry* e : sorted) {
      if (e->begin < pos) {
        fail("tensor '" + e->name + "' (bytes " + range(e) + ") overlaps tensor '" + prev->name + "' (bytes " +
             range(prev) + ")");
      }
      if (e->begin > pos) {
        if (prev == nullptr) {
          fail("gap of " + std::to_string(e->begin) + " bytes at the start of the data section: first tensor '" +
               e->name + "' begins at " + std::to_string(e->begin) + ", expected 0");
        }
        fail("gap of " + std::to_string(e->begin - pos) + " bytes in the data section between tensor '" +
             prev->name + "' (ends at " + std::to_string(pos) + ") and tensor '" + e->name + "' (begins at " +
             std::to_string(e->begin) + ")");
      }
      pos = e->end;
      prev = e;
    }
    if (pos != data_size_) {
      fail("data section has " + std::to_string(data_size_) + " bytes but the tensors cover only " +
           std::to_string(pos) + " (" + std::to_string(data_size_ - pos) + " trailing bytes unaccounted for)");
    }
  }

  const std::string& source_;
  uint64_t data_size_;
};

// Reads `n` bytes at byte offset `offset` of the data section into `dst`.
using ReadAt = std::function<void(uint64_t offset, void* dst, uint64_t n)>;

SafetensorsData build(const std::string& source, const Header& header, const ReadAt& read_data) {
  SafetensorsData out;
  out.metadata = header.metadata;
  for (const Entry& e : header.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype->type).device(at::kCPU));
    const uint64_t n = e.end - e.begin;
    if (n > 0) read_data(e.begin, t.data_ptr(), n);
    if (e.dtype->type == at::kBool && n > 0) {
      const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
      for (uint64_t i = 0; i < n; ++i) {
        if (bytes[i] > 1) {
          std::ostringstream os;
          os << source << ": tensor '" << e.name << "': BOOL element " << i << " is byte "
             << static_cast<unsigned>(bytes[i]) << ", expected 0 or 1";
          throw FormatError(os.str());
        }
      }
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Validates the size prefix against the total size; returns the header size.
uint64_t check_prefix(const std::string& source, uint64_t total, const unsigned char* prefix) {
  if (total < 8) {
    throw FormatError(source + ": file is " + std::to_string(total) +
                      " bytes, too short for the 8-byte header size");
  }
  const uint64_t n = read_u64_le(prefix);
  if (n > kSafetensorsMaxHeaderBytes) {
    throw FormatError(source + ": header size " + std::to_string(n) + " bytes is implausible (limit " +
                      std::to_string(kSafetensorsMaxHeaderBytes) + ")");
  }
  if (n > total - 8) {
    throw FormatError(source + ": header size " + std::to_string(n) + " bytes exceeds the " +
                      std::to_string(total - 8) + " bytes that follow the size field");
  }
  return n;
}

// Owns a file descriptor.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pread_exact(int fd, const std::string& path, uint64_t offset, void* dst, uint64_t n) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": read failed: " + std::strerror(errno));
    }
    if (got == 0) {
      throw FormatError(path + ": unexpected end of file at offset " + std::to_string(offset) +
                        " (was the file truncated while being read?)");
    }
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

// A tensor list made ready for writing: CPU, contiguous, checked.
struct Prepared {
  std::string prefix_and_header;  // 8-byte size + padded header
  std::vector<at::Tensor> tensors;
};

Prepared prepare(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                 const std::map<std::string, std::string>& metadata) {
  Prepared out;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") {
      throw InvalidArgument("safetensors: tensor name '__metadata__' is reserved for the metadata");
    }
    if (!seen.insert(name).second) {
      throw InvalidArgument("safetensors: tensor name '" + name + "' appears more than once");
    }
    if (!tensor.defined()) throw InvalidArgument("safetensors: tensor '" + name + "' is undefined");
    if (tensor.layout() != at::kStrided) {
      throw InvalidArgument("safetensors: tensor '" + name + "' is not a dense (strided) tensor");
    }
    const DTypeInfo* dtype = find_dtype(tensor.scalar_type());
    if (dtype == nullptr) {
      throw InvalidArgument("safetensors: tensor '" + name + "' has dtype " +
                            std::string(c10::toString(tensor.scalar_type())) +
                            ", which safetensors cannot store here (supported: " + supported_dtype_list() + ")");
    }
    at::Tensor t = tensor.device().is_cpu() ? tensor : tensor.to(at::kCPU);
    t = t.contiguous();
    const uint64_t n_bytes = static_cast<uint64_t>(t.numel()) * dtype->size;
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype->name;
    entry["shape"] = t.sizes().vec();
    entry["data_offsets"] = {offset, offset + n_bytes};
    header[name] = std::move(entry);
    offset += n_bytes;
    out.tensors.push_back(std::move(t));
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    throw InvalidArgument(std::string("safetensors: a tensor name or metadata string is not valid UTF-8: ") +
                          e.what());
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  const uint64_t n = text.size();
  out.prefix_and_header.resize(8);
  std::memcpy(out.prefix_and_header.data(), &n, 8);
  out.prefix_and_header += text;
  return out;
}

// Shard file names must stay inside the checkpoint directory.
void check_shard_name(const std::string& index_path, const std::string& tensor, const std::string& shard) {
  const fs::path p(shard);
  bool bad = shard.empty() || p.is_absolute();
  for (const auto& part : p) bad = bad || part == "..";
  if (bad) {
    throw FormatError(index_path + ": weight_map entry '" + tensor + "': shard file name '" + shard +
                      "' must be a relative path inside the checkpoint directory");
  }
}

SafetensorsData load_sharded(const std::string& dir, const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) throw Error(index_path + ": cannot open: " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw Error(index_path + ": read failed");
  json index;
  try {
    index = json::parse(buf.str());
  } catch (const json::parse_error& e) {
    throw FormatError(index_path + ": not valid JSON: " + e.what());
  }
  if (!index.is_object()) throw FormatError(index_path + ": expected a JSON object, found " + describe(index));
  if (!index.contains("weight_map")) throw FormatError(index_path + ": missing \"weight_map\"");
  const json& weight_map = index.at("weight_map");
  if (!weight_map.is_object()) {
    throw FormatError(index_path + ": \"weight_map\" must be an object, found " + describe(weight_map));
  }
  std::map<std::string, std::string> shard_of;  // tensor -> shard
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : weight_map.items()) {
    if (!shard.is_string()) {
      throw FormatError(index_path + ": weight_map entry '" + tensor + "': expected a shard file name string, found " +
                        describe(shard));
    }
    const std::string name = shard.get<std::string>();
    check_shard_name(index_path, tensor, name);
    shard_of.emplace(tensor, name);
    shards.insert(name);
  }

  SafetensorsData out;
  std::map<std::string, std::string> found_in;  // tensor -> shard it was read from
  for (const std::string& shard : shards) {
    const std::string shard_path = (fs::path(dir) / shard).string();
    SafetensorsData part = load_safetensors(shard_path);
    for (auto& [name, tensor] : part.tensors) {
      const auto [it, inserted] = found_in.emplace(name, shard);
      if (!inserted) {
        throw FormatError(shard_path + ": tensor '" + name + "' is also stored in shard '" + it->second +
                          "' (each tensor must be in exactly one shard)");
      }
      const auto mapped = shard_of.find(name);
      if (mapped == shard_of.end()) {
        throw FormatError(shard_path + ": tensor '" + name + "' is not listed in the weight_map of " + index_path);
      }
      if (mapped->second != shard) {
        throw FormatError(shard_path + ": tensor '" + name + "' is stored in shard '" + shard + "', but " +
                          index_path + " maps it to shard '" + mapped->second + "'");
      }
      out.tensors.emplace(name, std::move(tensor));
    }
    for (auto& [k, v] : part.metadata) out.metadata.emplace(k, std::move(v));
  }
  for (const auto& [tensor, shard] : shard_of) {
    if (found_in.count(tensor) == 0) {
      throw FormatError(index_path + ": weight_map lists tensor '" + tensor + "' in shard '" + shard +
                        "', but that shard does not contain it");
    }
  }
  return out;
}

}  // namespace

std::optional<at::ScalarType> safetensors_scalar_type(std::string_view dtype) {
  const DTypeInfo* d = find_dtype(dtype);
  if (d == nullptr) return std::nullopt;
  return d->type;
}

std::optional<std::string_view> safetensors_dtype_name(at::ScalarType type) {
  const DTypeInfo* d = find_dtype(type);
  if (d == nullptr) return std::nullopt;
  return std::string_view(d->name);
}

SafetensorsData parse_safetensors(std::string_view bytes, const std::string& source_name) {
  const uint64_t total = bytes.size();
  const uint64_t n = check_prefix(source_name, total, reinterpret_cast<const unsigned char*>(bytes.data()));
  const uint64_t data_start = 8 + n;
  const Header header = HeaderParser(source_name, total - data_start).parse(bytes.substr(8, n));
  return build(source_name, header, [&](uint64_t offset, void* dst, uint64_t count) {
    std::memcpy(dst, bytes.data() + data_start + offset, count);
  });
}

SafetensorsData load_safetensors(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw Error(path + ": fstat failed: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw Error(path + ": is a directory, expected a safetensors file");
  const uint64_t total = static_cast<uint64_t>(st.st_size);

  unsigned char prefix[8] = {};
  if (total >= 8) pread_exact(f.fd, path, 0, prefix, 8);
  const uint64_t n = check_prefix(path, total, prefix);
  std::string text(n, '\0');
  pread_exact(f.fd, path, 8, text.data(), n);
  const uint64_t data_start = 8 + n;
  const Header header = HeaderParser(path, total - data_start).parse(text);
  return build(path, header, [&](uint64_t offset, void* dst, uint64_t count) {
    pread_exact(f.fd, path, data_start + offset, dst, count);
  });
}

SafetensorsData load_safetensors_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw Error(dir + ": not a directory" + (ec ? ": " + ec.message() : std::string()));
  }
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(index_path, ec)) return load_sharded(dir, index_path);
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  if (fs::exists(single, ec)) return load_safetensors(single);
  throw Error(dir + ": contains neither model.safetensors.index.json nor model.safetensors");
}

std::string serialize_safetensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  const Prepared p = prepare(tensors, metadata);
  std::string out = p.prefix_and_header;
  for (const at::Tensor& t : p.tensors) {
    const size_t n = t.nbytes();
    if (n > 0) out.append(static_cast<const char*>(t.data_ptr()), n);
  }
  return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const Prepared p = prepare(tensors, metadata);
  AtomicFileWriter writer(path);
  writer.write(p.prefix_and_header);
  for (const at::Tensor& t : p.tensors) {
    const size_t n = t.nbytes();
    if (n > 0) writer.write(t.data_ptr(), n);
  }
  writer.commit();
}

}  // namespace dspark::io
