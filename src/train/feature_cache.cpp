// Disk cache of target features; see include/dspark/train/feature_cache.hpp.
#include "dspark/train/feature_cache.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"

namespace dspark::train {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[4] = {'D', 'S', 'F', 'C'};
constexpr uint32_t kVersion = 1;

// File header (little-endian, as written by this machine).
struct Header {
  char magic[4];
  uint32_t version;
  int64_t n_tokens;
  uint64_t token_hash;
  int64_t taps_cols;
  int64_t hidden;
  uint32_t bf16;
  uint32_t logit_stats;
};

// FNV-1a over the token ids.
uint64_t hash_tokens(std::span<const TokenId> tokens) {
  uint64_t h = 1469598103934665603ull;
  for (TokenId t : tokens) {
    uint32_t u = static_cast<uint32_t>(t);
    for (int b = 0; b < 4; ++b, u >>= 8) {
      h ^= u & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

nlohmann::json key_json(const FeatureCacheKey& k) {
  return {{"kind", "dspark-feature-cache"}, {"version", kVersion},   {"target_id", k.target_id},
          {"tap_layers", k.tap_layers},      {"max_len", k.max_len}, {"dtype", k.bf16 ? "bf16" : "f32"},
          {"logit_stats", k.logit_stats}};
}

void append(std::string& out, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  out.append(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes()));
}

}  // namespace

int64_t TargetFeatures::bytes() const {
  return taps.nbytes() + final_hidden.nbytes() + (lse.defined() ? lse.nbytes() : 0) +
         (argmax.defined() ? argmax.nbytes() : 0);
}

int64_t feature_bytes_per_token(const FeatureCacheKey& key, int64_t hidden) {
  const int64_t m = static_cast<int64_t>(key.tap_layers.size());
  return (m + 1) * hidden * (key.bf16 ? 2 : 4) + (key.logit_stats ? 12 : 0);
}

DiskFeatureCache::DiskFeatureCache(std::string dir, FeatureCacheKey key) : dir_(std::move(dir)), key_(std::move(key)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw Error(dir_ + ": cannot create the feature cache directory" + (ec ? ": " + ec.message() : ""));
  const std::string manifest = (fs::path(dir_) / "cache.json").string();
  const nlohmann::json want = key_json(key_);
  if (fs::exists(manifest)) {
    nlohmann::json have;
    try {
      std::ifstream in(manifest);
      have = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(manifest + ": not a feature cache manifest (" + e.what() + ")");
    }
    if (have != want)
      throw InvalidArgument(dir_ + ": this feature cache holds features for " + have.dump() + ", this run needs " +
                            want.dump() + "; give another --feature-cache-dir or delete this one");
  } else {
    io::write_json_atomic(manifest, want);
  }
}

std::string DiskFeatureCache::path_of(size_t index) const {
  char name[32];
  std::snprintf(name, sizeof name, "seq-%08zu.bin", index);
  return (fs::path(dir_) / name).string();
}

int64_t DiskFeatureCache::free_bytes() const {
  std::error_code ec;
  const auto s = fs::space(dir_, ec);
  return ec ? 0 : static_cast<int64_t>(s.available);
}

std::optional<TargetFeatures> DiskFeatureCache::get(size_t index, std::span<const TokenId> tokens) const {
  const std::string path = path_of(index);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  const int64_t L = static_cast<int64_t>(tokens.size());
  const int64_t m = static_cast<int64_t>(key_.tap_layers.size());
  Header h{};
  auto fail = [&](const std::string& why) -> std::optional<TargetFeatures> {
    if (!warned_read_) {
      std::cerr << "warning: " << path << ": " << why << "; recomputing such entries\n";
      warned_read_ = true;
    }
    return std::nullopt;
  };
  if (!in.read(reinterpret_cast<char*>(&h), sizeof h)) return fail("truncated header");
  if (std::memcmp(h.magic, kMagic, 4) != 0 || h.version != kVersion) return fail("not a feature cache file");
  if (h.n_tokens != L || h.token_hash != hash_tokens(tokens)) return std::nullopt;  // other tokens: recompute
  if (h.bf16 != (key_.bf16 ? 1u : 0u) || h.logit_stats != (key_.logit_stats ? 1u : 0u) || h.hidden <= 0 ||
      h.taps_cols != m * h.hidden)
    return fail("header does not match the cache's key");
  const auto dtype = key_.bf16 ? at::kBFloat16 : at::kFloat;
  TargetFeatures f;
  f.taps = at::empty({L, h.taps_cols}, dtype);
  f.final_hidden = at::empty({L, h.hidden}, dtype);
  if (key_.logit_stats) {
    f.lse = at::empty({L}, at::kFloat);
    f.argmax = at::empty({L}, at::kLong);
  }
  for (const at::Tensor* t : {&f.taps, &f.final_hidden, &f.lse, &f.argmax}) {
    if (!t->defined()) continue;
    if (!in.read(static_cast<char*>(t->data_ptr()), static_cast<std::streamsize>(t->nbytes())))
      return fail("truncated data");
  }
  if (in.peek() != std::char_traits<char>::eof()) return fail("trailing bytes");
  ++hits_;
  return f;
}

void DiskFeatureCache::put(size_t index, std::span<const TokenId> tokens, const TargetFeatures& f) {
  if (!writing_) return;
  Header h{};
  std::memcpy(h.magic, kMagic, 4);
  h.version = kVersion;
  h.n_tokens = static_cast<int64_t>(tokens.size());
  h.token_hash = hash_tokens(tokens);
  h.hidden = f.final_hidden.size(1);
  h.taps_cols = f.taps.size(1);
  h.bf16 = key_.bf16 ? 1 : 0;
  h.logit_stats = key_.logit_stats ? 1 : 0;
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof h);
  bytes.reserve(sizeof h + static_cast<size_t>(f.bytes()));
  append(bytes, f.taps);
  append(bytes, f.final_hidden);
  if (key_.logit_stats) {
    append(bytes, f.lse);
    append(bytes, f.argmax);
  }
  if (free_bytes() < static_cast<int64_t>(bytes.size()) + reserve_bytes) {
    std::cerr << "warning: feature cache " << dir_ << ": less than 1 GiB would stay free; no more entries are "
              << "written (later passes recompute the rest)\n";
    writing_ = false;
    return;
  }
  try {
    io::write_file_atomic(path_of(index), bytes);
    ++writes_;
  } catch (const Error& e) {
    std::cerr << "warning: feature cache: " << e.what() << "; no more entries are written\n";
    writing_ = false;
  }
}

}  // namespace dspark::train
