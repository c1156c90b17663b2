// safetensors reader and writer: see include/dspark/io/safetensors.hpp for the
// format summary.
#include "dspark/io/safetensors.hpp"

#include <ATen/ops/empty.h>
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
#include "safetensors_header.hpp"

static_assert(std::endian::native == std::endian::little,
              "the safetensors reader and writer assume a little-endian host");

namespace dspark::io {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace safetensors_detail;

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
  } catch (const json::exception& e) {  // syntax errors, and numbers beyond double range (1e400)
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
  const Header header = parse_header(source_name, total - data_start, bytes.substr(8, n));
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
  const Header header = parse_header(path, total - data_start, text);
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
