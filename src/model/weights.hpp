// Tensor registry of a target family: every tensor the family reads, with its
// shape and whether it must be present. One registry drives validation (all
// tensors are checked before anything is loaded, so a broken file fails with
// the tensor named) and loading (shapes come from the registry).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dspark/io/gguf.hpp"
#include "dspark/model/target.hpp"
#include "dspark/ops/linear.hpp"

namespace dspark {

struct TensorSpec {
  std::string name;            // GGUF tensor name, e.g. "blk.0.attn_q.weight"
  std::vector<int64_t> shape;  // [rows, cols] for a matrix, [n] for a vector
  bool required = true;
};

/// The tensors of the Llama-style blocks of every layer l < i.n_layers,
/// shaped from `i` (head dim i.head_dim): blk.<l>.attn_norm [d], attn_q
/// [H·hd, d], attn_k and attn_v [Hkv·hd, d], attn_output [d, H·hd],
/// ffn_norm [d], ffn_gate and ffn_up [F, d], ffn_down [d, F]; with `qk_norm`
/// also attn_q_norm and attn_k_norm [hd]. All required.
std::vector<TensorSpec> block_tensors(const TargetInfo& i, bool qk_norm);

/// The registered tensors of one file.
class Weights {
 public:
  /// Checks every spec against `f`: a required tensor that is missing, or a
  /// present one with another shape, is a dspark::FormatError naming it.
  Weights(const io::GGUFFile& f, std::vector<TensorSpec> specs, ops::Compute compute);

  /// True when the (registered) tensor is present in the file.
  bool has(const std::string& name) const;
  /// Registered matrices with the same column count as one layer whose rows
  /// are theirs in order (e.g. q, k, v). Computed as the Compute mode says.
  ops::Linear linear(const std::vector<std::string>& names) const;
  /// A registered vector (any float or quantized type) as an fp32 [n] tensor.
  at::Tensor vector(const std::string& name) const;

 private:
  const TensorSpec& spec(const std::string& name) const;
  const io::GGUFFile& f_;
  ops::Compute compute_;
  std::map<std::string, TensorSpec> specs_;
};

}  // namespace dspark
