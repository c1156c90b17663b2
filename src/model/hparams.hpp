// Hyper-parameters every decoder-only family reads from GGUF metadata
// (`<arch>.block_count`, `.embedding_length`, ...), parsed and validated in
// one place. Each family's own config struct starts from this one.
#pragma once

#include <cstdint>
#include <string>

#include "dspark/io/gguf.hpp"
#include "dspark/model/target.hpp"

namespace dspark {

/// Reads `<arch>.<suffix>` keys.
class ArchKeys {
 public:
  ArchKeys(const io::GGUFFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  std::string key(const std::string& suffix) const { return arch_ + "." + suffix; }
  bool has(const std::string& suffix) const { return f_.find(key(suffix)) != nullptr; }
  int64_t get_int(const std::string& suffix) const { return f_.get_int(key(suffix)); }
  int64_t get_int_or(const std::string& suffix, int64_t def) const { return f_.get_int_or(key(suffix), def); }
  double get_float_or(const std::string& suffix, double def) const { return f_.get_float_or(key(suffix), def); }
  /// A positive finite float (default `def` when absent); FormatError naming the key otherwise.
  double positive_float(const std::string& suffix, double def) const;
  const io::GGUFFile& file() const { return f_; }
  const std::string& arch() const { return arch_; }

 private:
  const io::GGUFFile& f_;
  std::string arch_;
};

struct DecoderConfig {
  TargetInfo info;           // geometry and identity (compute, windows, scales left at defaults)
  int64_t rot_dim = 0;       // rope.dimension_count (default: head_dim)
  double rope_linear = 1.0;  // rope.scaling.factor when rope.scaling.type is "linear"
};

/// Parses and checks the shared keys: block_count, embedding_length,
/// attention.head_count(_kv), attention.key_length, feed_forward_length,
/// context_length, attention.layer_norm_rms_epsilon, rope.freq_base,
/// rope.dimension_count, rope.scaling.*; the vocabulary from token_embd's rows
/// (and vocab_size when present); the identity from general.*. Throws
/// dspark::FormatError naming the key for nonsense values (zero heads, huge
/// block count, bad rope/eps/context/vocab, widths that are not multiples of 32).
DecoderConfig parse_decoder_config(const ArchKeys& keys);

}  // namespace dspark
