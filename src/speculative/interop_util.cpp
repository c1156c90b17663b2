// Helpers shared by the drafter exporters and importers; see interop_util.hpp.
#include "interop_util.hpp"

#include <algorithm>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"

namespace dspark::interop {

namespace {

// Row order within one head: halves[j] takes pairs[perm[j]].
at::Tensor halves_perm(int64_t hd) {
  std::vector<int64_t> p(static_cast<size_t>(hd));
  for (int64_t j = 0; j < hd / 2; ++j) {
    p[j] = 2 * j;
    p[j + hd / 2] = 2 * j + 1;
  }
  return at::tensor(p, at::kLong);
}

at::Tensor permute_heads(const at::Tensor& w, int64_t hd, const at::Tensor& perm) {
  if (w.dim() == 1) return w.index_select(0, perm);
  const int64_t cols = w.size(1);
  return w.reshape({-1, hd, cols}).index_select(1, perm).reshape({-1, cols}).contiguous();
}

}  // namespace

at::Tensor pairs_to_halves(const at::Tensor& w, int64_t head_dim) {
  return permute_heads(w, head_dim, halves_perm(head_dim));
}

at::Tensor halves_to_pairs(const at::Tensor& w, int64_t head_dim) {
  return permute_heads(w, head_dim, at::argsort(halves_perm(head_dim)));
}

bool all_bf16_exact(const std::map<std::string, at::Tensor>& params) {
  for (const auto& [name, t] : params) {
    const at::Tensor f = t.to(at::kFloat);
    if (!at::equal(f, f.to(at::kBFloat16).to(at::kFloat))) return false;
  }
  return true;
}

at::ScalarType export_dtype(const Drafter& d) {
  return all_bf16_exact(d.params()) ? at::kBFloat16 : at::kFloat;
}

void require_representable(const Drafter& d, const std::string& format, const std::vector<SeqHead>& heads) {
  const SeqHead h = d.config().seq_head;
  if (h == SeqHead::None) {
    if (d.params().at("markov_w2.weight").abs().max().item<float>() != 0.f)
      throw InvalidArgument(format + " applies markov_w2 whenever the drafter has markov_w1 (which the confidence "
                            "head reads), but this drafter's sequential head is 'none' and its markov_w2 is not "
                            "zero: it cannot be represented there");
    return;
  }
  if (std::find(heads.begin(), heads.end(), h) != heads.end()) return;
  std::string names;
  for (SeqHead k : heads) names += (names.empty() ? "" : ", ") + to_string(k);
  throw InvalidArgument(format + " holds only these sequential heads: " + names + "; this drafter's '" +
                        to_string(h) + "' head cannot be represented there");
}

int64_t choose_mask_row(const io::GGUFFile& target, int64_t requested) {
  const auto tokens = target.get_string_array("tokenizer.ggml.tokens");
  const int64_t V = static_cast<int64_t>(tokens.size());
  if (requested >= 0) {
    if (requested >= V)
      throw InvalidArgument("mask row " + std::to_string(requested) + " is outside the target's vocabulary [0, " +
                            std::to_string(V) + ")");
    return requested;
  }
  if (target.has("tokenizer.ggml.mask_token_id")) return target.get_int("tokenizer.ggml.mask_token_id");
  std::vector<int64_t> special;
  for (const auto& [key, value] : target.metadata())
    if (key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id") && value.is_integer())
      special.push_back(value.as_int());
  const std::string chat = target.has("tokenizer.chat_template") ? target.get_string("tokenizer.chat_template") : "";
  const auto types = target.has("tokenizer.ggml.token_type") ? target.get_int_array("tokenizer.ggml.token_type")
                                                              : std::vector<int64_t>{};
  constexpr int64_t kControl = 3;
  for (int64_t id = std::min<int64_t>(V, static_cast<int64_t>(types.size())) - 1; id >= 0; --id) {
    if (types[id] != kControl || std::find(special.begin(), special.end(), id) != special.end()) continue;
    if (!chat.empty() && chat.find(tokens[id]) != std::string::npos) continue;
    return id;
  }
  throw InvalidArgument(target.path() +
                        ": no spare control token to hold the learned mask embedding (every control token is a "
                        "declared special token or appears in the chat template); choose a row with --mask-row");
}

at::Tensor target_embedding_f32(const io::GGUFFile& target) {
  return io::dequantize_tensor(target.tensor("token_embd.weight"), at::kFloat);
}

at::Tensor target_head_f32(const io::GGUFFile& target) {
  const io::GGUFTensorInfo* out = target.find_tensor("output.weight");
  return out ? io::dequantize_tensor(*out, at::kFloat) : target_embedding_f32(target);
}

void check_import_dims(const DrafterConfig& c, const TargetInfo& t, const std::string& where) {
  if (c.hidden != t.hidden)
    throw FormatError(where + ": hidden size " + std::to_string(c.hidden) + ", the target's is " +
                      std::to_string(t.hidden) + " (dspark drafters use the target's hidden size)");
  if (c.vocab != t.vocab)
    throw FormatError(where + ": vocabulary of " + std::to_string(c.vocab) + " tokens, the target has " +
                      std::to_string(t.vocab));
  for (int l : c.tap_layers)
    if (l < 0 || l >= t.n_layers)
      throw FormatError(where + ": taps the output of target layer " + std::to_string(l) +
                        ", the target has layers 0.." + std::to_string(t.n_layers - 1));
}

}  // namespace dspark::interop
