// dspark/model/target.hpp — the interface every target model family implements.
//
// A target forward call processes a ragged batch: several sequences, each with
// its own KV cache and any number of new tokens. All tokens of the batch share
// the weight matmuls (where batching pays), while attention runs per sequence.
// Results for one sequence are bitwise identical whatever else is in the batch
// (see kernels.hpp), which is what makes greedy speculative decoding lossless.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dspark/model/kv_cache.hpp"
#include "dspark/ops/linear.hpp"

namespace dspark {

using TokenId = int32_t;

/// Geometry and identity of a loaded target.
struct TargetInfo {
  std::string arch;        // GGUF general.architecture, e.g. "llama"
  std::string id;          // stable identity used to match drafters (see target_id())
  std::string path;        // file it was loaded from
  int64_t n_layers = 0;
  int64_t hidden = 0;      // d
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;
  int64_t vocab = 0;
  int64_t context = 0;     // trained context length (tokens)
  double rms_eps = 1e-5;
  double rope_base = 10000.0;
  double logit_softcap = 0.0;  // 0 = none; else logits <- cap * tanh(logits / cap)
  double embed_scale = 1.0;    // token embeddings are multiplied by this (Gemma: sqrt(d))
  /// [n_layers] keys each layer attends to: 0 = every earlier position, W = a
  /// sliding window of the W most recent positions (itself included).
  std::vector<int64_t> layer_window;
  std::string compute = "bf16";  // how matmuls run: "quant" (on the GGUF blocks) or "bf16"
};

/// Which positions of a call need logits.
enum class Logits { None, Last, All };

/// One sequence's share of a forward call.
struct ForwardSeq {
  KVCache* cache = nullptr;          // appended to; positions start at cache->size()
  std::span<const TokenId> tokens;   // [T] new tokens
  Logits logits = Logits::Last;
};

/// Hidden-state taps requested for a call.
struct TapRequest {
  /// Layers (0-based) whose OUTPUT residual stream is captured, in this order
  /// (HF hidden_states[l+1]). Empty = none; costs nothing then.
  std::vector<int> layers;
  /// Also return the final-normed hidden (input of the LM head).
  bool final_hidden = false;
};

/// Per-sequence results, all fp32 CPU tensors.
struct ForwardOut {
  at::Tensor logits;        // [T, V] (Logits::All), [1, V] (Last), undefined (None)
  at::Tensor taps;          // [T, m*d]: tapped layers concatenated on the feature axis
  at::Tensor final_hidden;  // [T, d]
};

/// One layer of a target as plain tensors and constants: what a forward
/// written in ATen ops (model/aten_forward.hpp) needs to compute the same
/// layer as TargetModel::forward, on any device. Matrices are the family's
/// own (quantized blocks or bf16, see ops::Linear); norm weights are fp32.
/// The layer maps the residual stream x [T, d] to
///   x += post_attn_norm(W_o · attention(rope(q_norm(q)), rope(k_norm(k)), v)),
///   x += post_ffn_norm(W_down · (act(W_gate h) ⊙ W_up h)), h = ffn_norm(x),
/// with q|k|v = W_qkv · attn_norm(x); an undefined norm is skipped.
struct LayerRecipe {
  at::Tensor attn_norm;               // [d]
  at::Tensor q_norm, k_norm;          // [hd] per-head RMSNorm, or undefined
  const ops::Linear* wqkv = nullptr;  // [(H + 2·Hkv)·hd, d]: q rows, then k, then v
  const ops::Linear* wo = nullptr;    // [d, H·hd]
  at::Tensor post_attn_norm;          // [d], or undefined
  at::Tensor ffn_norm;                // [d]
  const ops::Linear* wgu = nullptr;   // [2F, d]: gate rows, then up
  const ops::Linear* wdown = nullptr; // [d, F]
  at::Tensor post_ffn_norm;           // [d], or undefined
  bool gelu = false;         // act = GELU-tanh (GeGLU) instead of SiLU (SwiGLU)
  bool rope_halves = false;  // RoPE pairs dims (i, i + rot_dim/2) (NeoX) instead of (2i, 2i+1)
  int64_t rot_dim = 0;       // leading dims of each head that RoPE rotates
  std::vector<float> inv_freq;  // [rot_dim / 2]: angle of dim pair i at position p = p · inv_freq[i]
  float attn_scale = 0;      // multiplies q·k before the softmax
  int64_t window = 0;        // keys a query sees: 0 = every earlier position, W = the W most recent (itself included)
};

/// A target model. Forward calls are not thread-safe (one at a time), but
/// any number of KVCaches may be used with one model.
class TargetModel {
 public:
  virtual ~TargetModel() = default;
  virtual const TargetInfo& info() const = 0;

  /// Runs the batch. Each sequence's cache grows by its token count.
  /// Throws dspark::InvalidArgument when a sequence would exceed its cache's
  /// context length or a token id is outside [0, vocab); no cache is modified
  /// then.
  virtual std::vector<ForwardOut> forward(std::span<ForwardSeq> batch,
                                          const TapRequest& taps = {}) = 0;

  /// Convenience for one sequence.
  ForwardOut forward_one(KVCache& cache, std::span<const TokenId> tokens, Logits logits,
                         const TapRequest& taps = {});

  /// A new empty cache for this model holding up to `max_tokens` positions
  /// (0 = the model's context length), with the model's sliding windows.
  KVCache new_cache(int64_t max_tokens = 0) const;

  /// The input of the first layer for `tokens`: x [T, d] fp32 = embedding
  /// rows × info().embed_scale. What the forward pass and a drafter reading
  /// the target's embeddings both use. Throws InvalidArgument for an id
  /// outside [0, vocab).
  void embed(std::span<const TokenId> tokens, float* x) const;
  /// Logits of final-normed hidden states: logits [N, W.rows()] fp32 =
  /// softcap(hidden [N, d] · Wᵀ) with W = head() or `rows`, a subset of its
  /// rows (a draft vocabulary); the family's logit softcap applies.
  void head_logits(const float* hidden, int64_t N, float* logits, const ops::Linear* rows = nullptr) const;

  /// Token embedding table [V, d] as the forward pass reads it (quantized
  /// blocks or bf16). Copies share the storage.
  virtual const ops::Linear& embedding_table() const = 0;
  /// LM head [V, d] (tied models: the embedding table).
  virtual const ops::Linear& head() const = 0;
  /// Final RMSNorm weight [d] fp32.
  virtual const at::Tensor& output_norm() const = 0;
  /// Layer l (0 <= l < n_layers) as a LayerRecipe, which points into this
  /// model (valid while it lives). Throws dspark::InvalidArgument for l out
  /// of range.
  virtual LayerRecipe layer_recipe(int64_t l) const = 0;

  /// The embedding table and LM head dequantized to bf16 [V, d] tensors, made
  /// on first use (training reads them through ATen; decoding does not need
  /// them). Thread-safe. embedding() holds the rows as embed() gives them,
  /// embed_scale included; lm_head() is the head() as stored (tied models
  /// without an embedding scale share one tensor).
  const at::Tensor& embedding() const;
  const at::Tensor& lm_head() const;

 private:
  mutable std::once_flag embd_once_, head_once_;
  mutable at::Tensor embd_bf16_, head_bf16_;
};

/// Loads a target from a GGUF file (or a model alias such as "smollm2" or
/// "gemma3", see resolve_model_path). Dispatches on general.architecture
/// (supported: llama, gemma3). `compute`:
/// Quant multiplies on the file's quantized blocks (tensors of other types
/// are dequantized to bf16), BF16 dequantizes every matrix to bf16. Throws
/// dspark::FormatError for an unsupported architecture or a broken file.
std::unique_ptr<TargetModel> load_target(const std::string& path_or_alias,
                                         ops::Compute compute = ops::Compute::Quant);

/// Resolves an alias ("smollm2", "gemma3") to its file under $DSPARK_HOME/models
/// (default ~/.cache/dspark/models); other strings are returned unchanged.
/// Throws dspark::Error when an alias's file is missing (says to run `make setup`)
/// or when the string is neither an existing path nor an alias (lists the aliases).
std::string resolve_model_path(const std::string& path_or_alias);

}  // namespace dspark
