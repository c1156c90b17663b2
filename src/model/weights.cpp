// Tensor registry and loading; see weights.hpp.
#include "weights.hpp"

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "dspark/io/tensor_check.hpp"

namespace dspark {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out;
  for (auto d : s) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return "[" + out + "]";
}

int64_t elements(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

}  // namespace

std::vector<TensorSpec> block_tensors(const TargetInfo& i, bool qk_norm) {
  const int64_t d = i.hidden, hd = i.head_dim, q = i.n_heads * hd, kv = i.n_kv_heads * hd, F = i.ffn;
  std::vector<TensorSpec> s;
  for (int64_t l = 0; l < i.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    s.insert(s.end(), {{p + "attn_norm.weight", {d}},      {p + "attn_q.weight", {q, d}},
                       {p + "attn_k.weight", {kv, d}},     {p + "attn_v.weight", {kv, d}},
                       {p + "attn_output.weight", {d, q}}, {p + "ffn_norm.weight", {d}},
                       {p + "ffn_gate.weight", {F, d}},    {p + "ffn_up.weight", {F, d}},
                       {p + "ffn_down.weight", {d, F}}});
    if (qk_norm) s.insert(s.end(), {{p + "attn_q_norm.weight", {hd}}, {p + "attn_k_norm.weight", {hd}}});
  }
  return s;
}

Weights::Weights(const io::GGUFFile& f, std::vector<TensorSpec> specs, ops::Compute compute)
    : f_(f), compute_(compute) {
  for (auto& s : specs) {
    if (const auto* t = f.find_tensor(s.name)) {
      // Vectors may be stored with any shape of the right size; matrices must match exactly.
      const bool ok = s.shape.size() == 1 ? t->n_elements() == s.shape[0] : t->shape() == s.shape;
      if (!ok)
        throw FormatError(f.path() + ": tensor '" + s.name + "' has shape " + shape_str(t->shape()) + " (" +
                          std::to_string(t->n_elements()) + " elements), expected " + shape_str(s.shape));
      io::check_tensor_finite(*t, f.path());
    } else if (s.required) {
      throw FormatError(f.path() + ": missing tensor '" + s.name + "' of shape " + shape_str(s.shape) + " (" +
                        std::to_string(elements(s.shape)) + " elements)");
    }
    std::string name = s.name;
    specs_.emplace(std::move(name), std::move(s));
  }
}

const TensorSpec& Weights::spec(const std::string& name) const {
  auto it = specs_.find(name);
  if (it == specs_.end()) throw Error("tensor '" + name + "' is not in the family's registry");
  return it->second;
}

bool Weights::has(const std::string& name) const {
  spec(name);
  return f_.find_tensor(name) != nullptr;
}

ops::Linear Weights::linear(const std::vector<std::string>& names) const {
  std::vector<int64_t> rows;
  int64_t cols = 0;
  for (const auto& n : names) {
    const auto& s = spec(n);
    if (s.shape.size() != 2) throw Error("tensor '" + n + "' is registered as a vector, not a matrix");
    rows.push_back(s.shape[0]);
    cols = s.shape[1];
  }
  return ops::Linear::load(f_, names, rows, cols, compute_);
}

at::Tensor Weights::vector(const std::string& name) const {
  const auto& s = spec(name);
  return io::dequantize_tensor(f_.tensor(name), at::kFloat).reshape({s.shape.at(0)});
}

}  // namespace dspark
