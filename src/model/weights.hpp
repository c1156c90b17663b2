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
#include "dspark/ops/linear.hpp"

namespace dspark {

struct TensorSpec {
  std::string name;            // GGUF tensor name, e.g. "blk.0.attn_q.weight"
  std::vector<int64_t> shape;  // [rows, cols] for a matrix, [n] for a vector
  bool required = true;
};

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
