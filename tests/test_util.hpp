// Shared test utilities: the real models' locations, temporary directories and
// tiny random Llama, Qwen3 and Gemma 3 GGUF files built with the GGUF writer.
//
// Header-only (the test binary is built from tests/*_test.cpp alone).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dspark/io/gguf.hpp"
#include "dspark/io/gguf_writer.hpp"

namespace dspark::test {

/// Sets the ATen intra-op thread count for a scope, restoring it on exit.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadCount() { at::set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

/// How many times slower than a plain build this test process runs
/// ($DSPARK_TEST_SLOWDOWN, default 1; the sanitizer scripts set it): waits
/// that depend on decoding speed are multiplied by it.
inline int slowdown() {
  const char* s = std::getenv("DSPARK_TEST_SLOWDOWN");
  const int k = s && *s ? std::atoi(s) : 1;
  return k >= 1 ? k : 1;
}

/// True when the exhaustive sweeps are requested (DSPARK_TEST_FULL=1,
/// make test-full).
inline bool full_mode() {
  const char* v = std::getenv("DSPARK_TEST_FULL");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

/// $DSPARK_HOME (default $HOME/.cache/dspark) + "/models/" + file.
inline std::string models_file(const std::string& file) {
  std::string home;
  if (const char* h = std::getenv("DSPARK_HOME"); h && *h) {
    home = h;
  } else {
    const char* u = std::getenv("HOME");
    home = std::string(u && *u ? u : ".") + "/.cache/dspark";
  }
  return home + "/models/" + file;
}

/// The real SmolLM2 file (alias smollm2).
inline std::string model_path() { return models_file("SmolLM2-135M-Instruct.Q4_1.gguf"); }

/// The real Gemma 3 270M file (alias gemma3).
inline std::string gemma_model_path() { return models_file("gemma-3-270m-q4_k_m.gguf"); }

/// Fails (never skips) the current test when the real Gemma model is missing.
#define DSPARK_REQUIRE_GEMMA()                                                                      \
  do {                                                                                              \
    if (!std::filesystem::is_regular_file(::dspark::test::gemma_model_path()))                      \
      FAIL() << "the Gemma 3 model is missing: expected " << ::dspark::test::gemma_model_path()     \
             << " (run make setup)";                                                                \
  } while (0)

/// True when the real model file exists.
inline bool model_available() { return std::filesystem::is_regular_file(model_path()); }

/// Message for a test that needs the real model but cannot find it.
inline std::string missing_model_message() {
  return "the SmolLM2 model is missing: expected " + model_path() + " (run make setup)";
}

/// Fails (never skips) the current test when the real model is missing.
#define DSPARK_REQUIRE_MODEL()                                                   \
  do {                                                                           \
    if (!::dspark::test::model_available())                                      \
      FAIL() << ::dspark::test::missing_model_message();                         \
  } while (0)

/// A fresh directory under the system temp directory, removed with its
/// contents on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto base = std::filesystem::temp_directory_path();
    for (int attempt = 0;; ++attempt) {
      path_ = base / ("dspark-test-" + std::to_string(::getpid()) + "-" +
                      std::to_string(counter.fetch_add(1)));
      if (std::filesystem::create_directory(path_)) break;
      if (attempt > 1000) throw std::runtime_error("cannot create a temporary directory");
    }
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Path of `name` inside the directory (not created).
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// The message of the E thrown by f (a test failure when f throws nothing or something else).
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

/// Writes `bytes` to `path` (plain, non-atomic; for test inputs).
inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

/// Reads a whole file.
inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// ---- GPT-2 byte-level vocabulary ------------------------------------------------

/// The GPT-2 byte-to-unicode mapping: printable bytes map to themselves,
/// the rest to U+0100 onwards in byte order. Returns the UTF-8 text of byte b.
inline std::string gpt2_byte_symbol(int b) {
  static const std::vector<uint32_t> cp = [] {
    std::vector<uint32_t> m(256, 0);
    std::vector<bool> direct(256, false);
    for (int i = 33; i <= 126; ++i) direct[i] = true;
    for (int i = 161; i <= 172; ++i) direct[i] = true;
    for (int i = 174; i <= 255; ++i) direct[i] = true;
    uint32_t next = 256;
    for (int i = 0; i < 256; ++i) m[i] = direct[i] ? static_cast<uint32_t>(i) : next++;
    return m;
  }();
  const uint32_t c = cp[static_cast<size_t>(b)];
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else {  // all mapped code points are below U+0800
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// ---- tiny random Llama --------------------------------------------------------------

/// Geometry and encoding of a tiny random Llama. The vocabulary is fixed:
/// ids 0..2 are the control tokens <|endoftext|>, <|im_start|>, <|im_end|>,
/// ids 3..258 the 256 byte symbols (byte b is id 3 + b), then "Ġt", "he",
/// "Ġthe" with the merges "Ġ t", "h e", "Ġt he" (vocab 262).
struct TinyLlamaOptions {
  int64_t n_layers = 2;
  int64_t hidden = 64;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 2;
  int64_t ffn = 128;
  int64_t context = 256;
  uint32_t version = 3;
  /// Storage type of the matrices: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
  /// Q4_K or Q6_K (quantized by quantize_blocks; norms are F32).
  io::GGMLType weight_type = io::GGMLType::BF16;
  /// Per-tensor type overrides. Types other than the ones above get
  /// deterministic random bytes of the right size (for unsupported-type tests).
  std::map<std::string, io::GGMLType> tensor_types;
  /// No output.weight: the LM head is tied to token_embd.
  bool tied_embeddings = false;
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
};

inline constexpr int64_t kTinyVocab = 262;
inline constexpr int32_t kTinyByteBase = 3;

inline void put_f16(std::string& out, float v) {
  const uint16_t h = c10::Half(v).x;
  out.append(reinterpret_cast<const char*>(&h), 2);
}

/// Round-to-nearest quantization of `values` (a whole number of blocks) into
/// ggml blocks of Q8_0, Q4_0, Q4_1, Q5_0 (32 values) or Q4_K, Q6_K (256), in
/// the layouts of ggml-common.h (a test fixture writer, not ggml's optimizing
/// quantizer: the dequantized values are within half a step of the input).
inline std::string quantize_blocks(const std::vector<float>& values, io::GGMLType type) {
  using T = io::GGMLType;
  std::string out;
  auto byte = [&](int v) { out.push_back(static_cast<char>(static_cast<uint8_t>(v))); };
  const bool k = type == T::Q4_K || type == T::Q6_K;
  const size_t B = k ? 256 : 32;
  for (size_t i = 0; i < values.size(); i += B) {
    const float* x = values.data() + i;
    float amax = 0, max = 0, mn = x[0], mx = x[0];
    for (size_t j = 0; j < B; ++j) {
      if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    if (type == T::Q8_0) {
      const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
      put_f16(out, d);
      for (size_t j = 0; j < 32; ++j) byte(static_cast<int8_t>(std::lround(x[j] * id)));
    } else if (type == T::Q4_0 || type == T::Q5_0) {
      const int half = type == T::Q4_0 ? 8 : 16, top = 2 * half - 1;
      const float d = max / static_cast<float>(-half), id = d != 0.f ? 1.f / d : 0.f;
      int q[32];
      for (int j = 0; j < 32; ++j) q[j] = std::clamp(static_cast<int>(std::lround(x[j] * id)) + half, 0, top);
      put_f16(out, d);
      if (type == T::Q5_0) {
        uint32_t qh = 0;
        for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
        out.append(reinterpret_cast<const char*>(&qh), 4);
      }
      for (int j = 0; j < 16; ++j) byte((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    } else if (type == T::Q4_1) {
      const float d = (mx - mn) / 15.f, id = d != 0.f ? 1.f / d : 0.f;
      put_f16(out, d);
      put_f16(out, mn);
      int q[32];
      for (int j = 0; j < 32; ++j) q[j] = std::clamp(static_cast<int>(std::lround((x[j] - mn) * id)), 0, 15);
      for (int j = 0; j < 16; ++j) byte(q[j] | (q[j + 16] << 4));
    } else if (type == T::Q4_K) {
      float scale[8], mins[8];
      for (int s = 0; s < 8; ++s) {
        float lo = 0, hi = x[32 * s];
        for (int j = 0; j < 32; ++j) lo = std::min(lo, x[32 * s + j]), hi = std::max(hi, x[32 * s + j]);
        mins[s] = -lo;
        scale[s] = (hi - lo) / 15.f;
      }
      const float d = *std::max_element(scale, scale + 8) / 63.f, dmin = *std::max_element(mins, mins + 8) / 63.f;
      int sc[8], m[8];
      for (int s = 0; s < 8; ++s) {
        sc[s] = d != 0.f ? std::clamp(static_cast<int>(std::lround(scale[s] / d)), 1, 63) : 0;
        m[s] = dmin != 0.f ? std::clamp(static_cast<int>(std::lround(mins[s] / dmin)), 0, 63) : 0;
      }
      put_f16(out, d);
      put_f16(out, dmin);
      const float dh = static_cast<float>(c10::Half(d)), mh = static_cast<float>(c10::Half(dmin));
      for (int s = 0; s < 4; ++s) byte(sc[s] | ((sc[s + 4] >> 4) << 6));
      for (int s = 0; s < 4; ++s) byte(m[s] | ((m[s + 4] >> 4) << 6));
      for (int s = 0; s < 4; ++s) byte((sc[s + 4] & 0xF) | ((m[s + 4] & 0xF) << 4));
      int q[256];
      for (int j = 0; j < 256; ++j) {
        const int s = j / 32;
        const float step = dh * static_cast<float>(sc[s]);
        q[j] = step != 0.f ? std::clamp(static_cast<int>(std::lround((x[j] + mh * static_cast<float>(m[s])) / step)), 0, 15) : 0;
      }
      for (int g = 0; g < 4; ++g)
        for (int l = 0; l < 32; ++l) byte(q[64 * g + l] | (q[64 * g + 32 + l] << 4));
    } else {  // Q6_K
      float scale[16];
      for (int s = 0; s < 16; ++s) {
        float a = 0;
        for (int j = 0; j < 16; ++j) a = std::max(a, std::fabs(x[16 * s + j]));
        scale[s] = a / 31.f;
      }
      const float d = *std::max_element(scale, scale + 16) / 127.f;
      const float dh = static_cast<float>(c10::Half(d));
      int sc[16], q[256];
      for (int s = 0; s < 16; ++s) sc[s] = d != 0.f ? std::clamp(static_cast<int>(std::lround(scale[s] / d)), 0, 127) : 0;
      for (int j = 0; j < 256; ++j) {
        const float step = dh * static_cast<float>(sc[j / 16]);
        q[j] = (step != 0.f ? std::clamp(static_cast<int>(std::lround(x[j] / step)), -32, 31) : 0) + 32;
      }
      std::string ql(128, '\0'), qh(64, '\0');
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          const int* e = q + 128 * h;
          ql[64 * h + l] = static_cast<char>((e[l] & 0xF) | ((e[l + 64] & 0xF) << 4));
          ql[64 * h + l + 32] = static_cast<char>((e[l + 32] & 0xF) | ((e[l + 96] & 0xF) << 4));
          qh[32 * h + l] = static_cast<char>((e[l] >> 4) | ((e[l + 32] >> 4) << 2) | ((e[l + 64] >> 4) << 4) |
                                             ((e[l + 96] >> 4) << 6));
        }
      out += ql;
      out += qh;
      for (int s = 0; s < 16; ++s) byte(static_cast<int8_t>(sc[s]));
      put_f16(out, d);
    }
  }
  return out;
}

/// GGUF payload of row-major `values` ([rows, cols], cols = ne[0]) in `type`.
inline std::string encode_tensor(const std::vector<float>& values, int64_t cols, io::GGMLType type,
                                 std::mt19937_64& rng) {
  std::string out;
  auto put = [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  switch (type) {
    case io::GGMLType::F32:
      put(values.data(), values.size() * 4);
      break;
    case io::GGMLType::F16:
      for (float v : values) {
        const uint16_t h = c10::Half(v).x;
        put(&h, 2);
      }
      break;
    case io::GGMLType::BF16:
      for (float v : values) {
        const uint16_t b = c10::BFloat16(v).x;
        put(&b, 2);
      }
      break;
    case io::GGMLType::Q8_0:
    case io::GGMLType::Q4_0:
    case io::GGMLType::Q4_1:
    case io::GGMLType::Q5_0:
    case io::GGMLType::Q4_K:
    case io::GGMLType::Q6_K:
      if (cols % (type == io::GGMLType::Q4_K || type == io::GGMLType::Q6_K ? 256 : 32) != 0)
        throw std::invalid_argument("encode_tensor: rows of " + std::to_string(cols) + " values are no whole " +
                                    io::ggml_type_name(static_cast<uint32_t>(type)) + " blocks");
      out = quantize_blocks(values, type);
      break;
    default: {
      const auto traits = io::ggml_type_traits(static_cast<uint32_t>(type));
      if (!traits || cols % traits->block_elems != 0)
        throw std::invalid_argument("encode_tensor: cannot fill type " +
                                    io::ggml_type_name(static_cast<uint32_t>(type)));
      const size_t n = values.size() / static_cast<size_t>(traits->block_elems) *
                       static_cast<size_t>(traits->block_bytes);
      for (size_t i = 0; i < n; ++i) out += static_cast<char>(rng() & 0x3F);  // small f16 scales
      break;
    }
  }
  return out;
}

/// Adds a random tensor to `w`, stored as `type`: a matrix [rows, cols]
/// ~ N(0, 1/cols), or a norm vector (is_norm, rows == 1) ~ 1 + N(0, 0.1²).
inline void add_random_tensor(io::GGUFWriter& w, std::mt19937_64& rng, std::normal_distribution<float>& normal,
                              const std::string& name, int64_t rows, int64_t cols, bool is_norm, io::GGMLType type) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  const float scale = is_norm ? 0.1f : 1.f / std::sqrt(static_cast<float>(cols));
  for (float& x : v) x = (is_norm ? 1.f : 0.f) + scale * normal(rng);
  std::vector<int64_t> ne = rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
  w.add_tensor(name, static_cast<uint32_t>(type), ne, encode_tensor(v, cols, type, rng));
}

/// The `<arch>.*` geometry keys every decoder family's GGUF carries, and its name.
struct TinyGeometry {
  int64_t n_layers, context, hidden, ffn, n_heads, n_kv_heads;
  float rms_eps, rope_base;
};
inline void set_geometry(io::GGUFWriter& w, const std::string& arch, const std::string& name, const TinyGeometry& g) {
  namespace gg = io::gguf;
  w.set("general.architecture", gg::string(arch));
  w.set("general.name", gg::string(name));
  w.set("general.alignment", gg::u32(32));
  w.set(arch + ".block_count", gg::u32(static_cast<uint32_t>(g.n_layers)));
  w.set(arch + ".context_length", gg::u32(static_cast<uint32_t>(g.context)));
  w.set(arch + ".embedding_length", gg::u32(static_cast<uint32_t>(g.hidden)));
  w.set(arch + ".feed_forward_length", gg::u32(static_cast<uint32_t>(g.ffn)));
  w.set(arch + ".attention.head_count", gg::u32(static_cast<uint32_t>(g.n_heads)));
  w.set(arch + ".attention.head_count_kv", gg::u32(static_cast<uint32_t>(g.n_kv_heads)));
  w.set(arch + ".attention.layer_norm_rms_epsilon", gg::f32(g.rms_eps));
  w.set(arch + ".rope.freq_base", gg::f32(g.rope_base));
}

/// The vocabulary described in TinyLlamaOptions.
inline std::vector<std::string> tiny_vocab() {
  std::vector<std::string> v = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int b = 0; b < 256; ++b) v.push_back(gpt2_byte_symbol(b));
  v.push_back(gpt2_byte_symbol(' ') + "t");
  v.push_back("he");
  v.push_back(gpt2_byte_symbol(' ') + "the");
  return v;
}

/// Draws the tensors of layer l of a Llama-style block through
/// add(name, rows, cols, is_norm), in this order: attn_norm, attn_q, attn_k,
/// attn_v, attn_q_norm and attn_k_norm (when qk_norm), attn_output,
/// ffn_norm, ffn_gate, ffn_up, ffn_down.
template <class Add>
void add_llama_block(Add& add, int64_t l, int64_t d, int64_t F, int64_t H, int64_t Hkv, int64_t hd, bool qk_norm) {
  const std::string p = "blk." + std::to_string(l) + ".";
  add(p + "attn_norm.weight", 1, d, true);
  add(p + "attn_q.weight", H * hd, d, false);
  add(p + "attn_k.weight", Hkv * hd, d, false);
  add(p + "attn_v.weight", Hkv * hd, d, false);
  if (qk_norm) {
    add(p + "attn_q_norm.weight", 1, hd, true);
    add(p + "attn_k_norm.weight", 1, hd, true);
  }
  add(p + "attn_output.weight", d, H * hd, false);
  add(p + "ffn_norm.weight", 1, d, true);
  add(p + "ffn_gate.weight", F, d, false);
  add(p + "ffn_up.weight", F, d, false);
  add(p + "ffn_down.weight", d, F, false);
}

/// Sets tokenizer.ggml.* for the vocabulary of tiny_vocab() (byte-level BPE,
/// pre-tokenizer `pre`, no BOS added).
inline void set_tiny_bpe_tokenizer(io::GGUFWriter& w, const std::string& pre) {
  namespace g = io::gguf;
  const std::vector<std::string> vocab = tiny_vocab();
  std::vector<int32_t> types(vocab.size(), 1);
  types[0] = types[1] = types[2] = 3;
  w.set("tokenizer.ggml.model", g::string("gpt2"));
  w.set("tokenizer.ggml.pre", g::string(pre));
  w.set("tokenizer.ggml.tokens", g::string_array(vocab));
  w.set("tokenizer.ggml.token_type", g::i32_array(types));
  const std::string sp = gpt2_byte_symbol(' ');
  w.set("tokenizer.ggml.merges", g::string_array({sp + " t", "h e", sp + "t he"}));
  w.set("tokenizer.ggml.bos_token_id", g::u32(1));
  w.set("tokenizer.ggml.eos_token_id", g::u32(2));
  w.set("tokenizer.ggml.padding_token_id", g::u32(0));
  w.set("tokenizer.ggml.add_bos_token", g::boolean(false));
}

/// Builds a tiny random Llama GGUF in memory: metadata as llama.cpp's
/// converter writes it (general.*, llama.*, tokenizer.ggml.*) and random
/// weights (matrices ~ N(0, 1/in_features), norm weights ~ 1 + N(0, 0.1^2))
/// drawn from `seed`. Tests may modify the returned writer before writing it.
inline io::GGUFWriter tiny_llama_writer(uint64_t seed, const TinyLlamaOptions& o = {}) {
  namespace g = io::gguf;
  io::GGUFWriter w(o.version);
  const int64_t hd = o.hidden / o.n_heads;
  set_geometry(w, "llama", "tiny-llama-" + std::to_string(seed),
               {o.n_layers, o.context, o.hidden, o.ffn, o.n_heads, o.n_kv_heads, o.rms_eps, o.rope_base});
  w.set("llama.rope.dimension_count", g::u32(static_cast<uint32_t>(hd)));
  w.set("llama.vocab_size", g::u32(static_cast<uint32_t>(kTinyVocab)));
  w.set("general.file_type", g::u32(1));

  set_tiny_bpe_tokenizer(w, "smollm");

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, bool is_norm) {
    io::GGMLType type = is_norm ? io::GGMLType::F32 : o.weight_type;
    if (auto it = o.tensor_types.find(name); it != o.tensor_types.end()) type = it->second;
    add_random_tensor(w, rng, normal, name, rows, cols, is_norm, type);
  };
  const int64_t d = o.hidden, F = o.ffn;
  add("token_embd.weight", kTinyVocab, d, false);
  add("output_norm.weight", 1, d, true);
  if (!o.tied_embeddings) add("output.weight", kTinyVocab, d, false);
  for (int64_t l = 0; l < o.n_layers; ++l) add_llama_block(add, l, d, F, o.n_heads, o.n_kv_heads, hd, false);
  return w;
}

/// Writes a tiny random Llama GGUF (see tiny_llama_writer) to `path`.
inline void write_tiny_llama(const std::string& path, uint64_t seed, const TinyLlamaOptions& opts = {}) {
  tiny_llama_writer(seed, opts).write(path);
}

// ---- tiny random Qwen3 ----------------------------------------------------------------

/// Geometry of a tiny random Qwen3: a key length different from hidden /
/// heads (as in Qwen3-0.6B: 16 heads of 128 over d = 1024), tied embeddings
/// unless `tied_embeddings` is false, the tiny byte-level vocabulary with the
/// Qwen2 pre-tokenizer.
struct TinyQwen3Options {
  int64_t n_layers = 2;
  int64_t hidden = 64;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 2;
  int64_t head_dim = 32;
  int64_t ffn = 128;
  int64_t context = 256;
  float rope_base = 1e6f;
  float rms_eps = 1e-6f;
  bool tied_embeddings = true;
  io::GGMLType weight_type = io::GGMLType::BF16;
};

/// Builds a tiny random Qwen3 GGUF in memory, metadata as llama.cpp's
/// converter writes it (qwen3.attention.key_length, per-head q/k norm
/// weights ~ 1 + N(0, 0.1^2)).
inline io::GGUFWriter tiny_qwen3_writer(uint64_t seed, const TinyQwen3Options& o = {}) {
  namespace g = io::gguf;
  io::GGUFWriter w(3);
  set_geometry(w, "qwen3", "tiny-qwen3-" + std::to_string(seed),
               {o.n_layers, o.context, o.hidden, o.ffn, o.n_heads, o.n_kv_heads, o.rms_eps, o.rope_base});
  w.set("qwen3.attention.key_length", g::u32(static_cast<uint32_t>(o.head_dim)));
  w.set("qwen3.attention.value_length", g::u32(static_cast<uint32_t>(o.head_dim)));
  set_tiny_bpe_tokenizer(w, "qwen2");

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, bool is_norm) {
    add_random_tensor(w, rng, normal, name, rows, cols, is_norm, is_norm ? io::GGMLType::F32 : o.weight_type);
  };
  const int64_t d = o.hidden, F = o.ffn, hd = o.head_dim;
  add("token_embd.weight", kTinyVocab, d, false);
  add("output_norm.weight", 1, d, true);
  if (!o.tied_embeddings) add("output.weight", kTinyVocab, d, false);
  for (int64_t l = 0; l < o.n_layers; ++l) add_llama_block(add, l, d, F, o.n_heads, o.n_kv_heads, hd, true);
  return w;
}

/// Writes a tiny random Qwen3 GGUF (see tiny_qwen3_writer) to `path`.
inline void write_tiny_qwen3(const std::string& path, uint64_t seed, const TinyQwen3Options& opts = {}) {
  tiny_qwen3_writer(seed, opts).write(path);
}

// ---- tiny SentencePiece vocabulary and tiny random Gemma 3 --------------------------

/// A small SentencePiece vocabulary in Gemma's layout: 0 <pad>, 1 <eos>,
/// 2 <bos>, 3 <unk>, 4 <start_of_turn>, 5 <end_of_turn> (control; <unk>
/// unknown), 6 "\n" and 7 "\n\n" (user-defined, as in Gemma), 8..263 the
/// byte-fallback tokens <0x00>..<0xFF> (byte b is id 8 + b), then the pieces
/// of tiny_spm_pieces() with their scores.
inline constexpr int32_t kTinySpmByteBase = 8;
struct SpmPiece {
  const char* text;
  float score;
};
inline const std::vector<SpmPiece>& tiny_spm_pieces() {
  static const std::vector<SpmPiece> p = {
      {"\xE2\x96\x81", -1.f},  {"t", -2.f},     {"h", -2.f},        {"e", -2.f},      {"a", -2.f},
      {"s", -2.f},             {"i", -2.f},     {"\xE2\x96\x81t", -3.f}, {"he", -4.f}, {"\xE2\x96\x81the", -5.f},
      {"is", -6.f},            {"\xE2\x96\x81is", -7.f}, {"\xE2\x96\x81" "a", -8.f}, {"st", -9.f},
      {"\xE2\x96\x81\xE2\x96\x81", -10.f}, {"\xC3\xA9", -11.f}};
  return p;
}
inline int64_t tiny_spm_vocab_size() { return kTinySpmByteBase + 256 + static_cast<int64_t>(tiny_spm_pieces().size()); }

/// Sets tokenizer.ggml.* for the tiny SentencePiece vocabulary (BOS added, no
/// space prefix: Gemma's settings).
inline void set_tiny_spm_tokenizer(io::GGUFWriter& w) {
  namespace g = io::gguf;
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n", "\n\n"};
  std::vector<int32_t> types = {3, 3, 3, 2, 3, 3, 4, 4};
  std::vector<float> scores(tokens.size(), -1000.f);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    tokens.push_back(name);
    types.push_back(6);
    scores.push_back(0.f);
  }
  for (const auto& piece : tiny_spm_pieces()) {
    tokens.push_back(piece.text);
    types.push_back(1);
    scores.push_back(piece.score);
  }
  w.set("tokenizer.ggml.model", g::string("llama"));
  w.set("tokenizer.ggml.pre", g::string("default"));
  w.set("tokenizer.ggml.tokens", g::string_array(tokens));
  w.set("tokenizer.ggml.scores", g::f32_array(scores));
  w.set("tokenizer.ggml.token_type", g::i32_array(types));
  w.set("tokenizer.ggml.bos_token_id", g::u32(2));
  w.set("tokenizer.ggml.eos_token_id", g::u32(1));
  w.set("tokenizer.ggml.unknown_token_id", g::u32(3));
  w.set("tokenizer.ggml.padding_token_id", g::u32(0));
  w.set("tokenizer.ggml.add_bos_token", g::boolean(true));
  w.set("tokenizer.ggml.add_space_prefix", g::boolean(false));
}

/// Geometry of a tiny random Gemma 3: sliding-window layers (window `window`)
/// with one global layer every `swa_period` (layers 2 and 5 of 6), and a key
/// length different from hidden / heads, as in the real models.
struct TinyGemmaOptions {
  int64_t n_layers = 6;
  int64_t hidden = 64;
  int64_t n_heads = 2;
  int64_t n_kv_heads = 1;
  int64_t head_dim = 48;
  int64_t ffn = 128;
  int64_t context = 512;
  int64_t window = 8;
  int64_t swa_period = 3;
  float rope_base = 1e6f;
  float rms_eps = 1e-6f;
  float softcap = 0.f;  // > 0: gemma3.final_logit_softcapping
  io::GGMLType weight_type = io::GGMLType::BF16;
  std::string chat_template;  // empty: none (a base model)
  std::vector<std::string> skip_tensors;  // tensors left out (for error tests)
};

/// Builds a tiny random Gemma 3 GGUF in memory, metadata as llama.cpp's
/// converter writes it (norm weights stored as 1 + w: ~ 1 + N(0, 0.1^2)),
/// tied embedding, the tiny SentencePiece vocabulary.
inline io::GGUFWriter tiny_gemma_writer(uint64_t seed, const TinyGemmaOptions& o = {}) {
  namespace g = io::gguf;
  io::GGUFWriter w(3);
  set_geometry(w, "gemma3", "tiny-gemma-" + std::to_string(seed),
               {o.n_layers, o.context, o.hidden, o.ffn, o.n_heads, o.n_kv_heads, o.rms_eps, o.rope_base});
  w.set("gemma3.attention.key_length", g::u32(static_cast<uint32_t>(o.head_dim)));
  w.set("gemma3.attention.value_length", g::u32(static_cast<uint32_t>(o.head_dim)));
  w.set("gemma3.attention.sliding_window", g::u32(static_cast<uint32_t>(o.window)));
  w.set("gemma3.attention.sliding_window_pattern", g::u32(static_cast<uint32_t>(o.swa_period)));
  if (o.softcap > 0) w.set("gemma3.final_logit_softcapping", g::f32(o.softcap));
  set_tiny_spm_tokenizer(w);
  if (!o.chat_template.empty()) w.set("tokenizer.chat_template", g::string(o.chat_template));

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  io::GGUFWriter skipped(3);  // receives the tensors of skip_tensors
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, bool is_norm) {
    const bool skip = std::find(o.skip_tensors.begin(), o.skip_tensors.end(), name) != o.skip_tensors.end();
    add_random_tensor(skip ? skipped : w, rng, normal, name, rows, cols, is_norm,
                      is_norm ? io::GGMLType::F32 : o.weight_type);
  };
  const int64_t d = o.hidden, F = o.ffn, hd = o.head_dim;
  add("token_embd.weight", tiny_spm_vocab_size(), d, false);
  add("output_norm.weight", 1, d, true);
  for (int64_t l = 0; l < o.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", 1, d, true);
    add(p + "attn_q.weight", o.n_heads * hd, d, false);
    add(p + "attn_k.weight", o.n_kv_heads * hd, d, false);
    add(p + "attn_v.weight", o.n_kv_heads * hd, d, false);
    add(p + "attn_q_norm.weight", 1, hd, true);
    add(p + "attn_k_norm.weight", 1, hd, true);
    add(p + "attn_output.weight", d, o.n_heads * hd, false);
    add(p + "post_attention_norm.weight", 1, d, true);
    add(p + "ffn_norm.weight", 1, d, true);
    add(p + "ffn_gate.weight", F, d, false);
    add(p + "ffn_up.weight", F, d, false);
    add(p + "ffn_down.weight", d, F, false);
    add(p + "post_ffw_norm.weight", 1, d, true);
  }
  return w;
}

/// Writes a tiny random Gemma 3 GGUF (see tiny_gemma_writer) to `path`.
inline void write_tiny_gemma(const std::string& path, uint64_t seed, const TinyGemmaOptions& opts = {}) {
  tiny_gemma_writer(seed, opts).write(path);
}

}  // namespace dspark::test

/// EXPECT that the string `msg` contains `part`, showing both otherwise.
#define EXPECT_MENTIONS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "expected '" << (part) << "' in: " << (msg)
