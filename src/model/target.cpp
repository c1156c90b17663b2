// Target loading and the shared TargetModel helpers; see target.hpp.
#include "dspark/model/target.hpp"

#include <cstdlib>
#include <filesystem>
#include <map>

#include "dspark/error.hpp"
#include "dspark/io/gguf.hpp"
#include "dspark/ops/activations.hpp"
#include "families.hpp"

namespace dspark {

namespace {

std::string dspark_home() {
  if (const char* h = std::getenv("DSPARK_HOME"); h && *h) return h;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/dspark";
}

// Model aliases and the file each resolves to under $DSPARK_HOME/models.
const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> m = {
      {"smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"},
      {"gemma3", "gemma-3-270m-q4_k_m.gguf"},
  };
  return m;
}

using Factory = std::unique_ptr<TargetModel> (*)(std::shared_ptr<const io::GGUFFile>, ops::Compute);

// general.architecture -> family (one file each under src/model/).
const std::map<std::string, Factory>& families() {
  static const std::map<std::string, Factory> m = {
      {"llama", make_llama},
      {"gemma3", make_gemma3},
      {"qwen3", make_qwen3},
  };
  return m;
}

}  // namespace

std::string resolve_model_path(const std::string& path_or_alias) {
  auto it = aliases().find(path_or_alias);
  if (it == aliases().end()) {
    std::error_code ec;
    if (!std::filesystem::exists(path_or_alias, ec)) {
      std::string names;
      for (const auto& [name, file] : aliases()) names += (names.empty() ? "" : ", ") + name;
      throw Error("model '" + path_or_alias + "': no such file, and not a model alias (" + names + ")");
    }
    return path_or_alias;
  }
  const std::string path = dspark_home() + "/models/" + it->second;
  if (!std::filesystem::exists(path)) {
    throw Error("model '" + path_or_alias + "' is not installed: expected " + path +
                " (run `make setup` or scripts/fetch_model.sh " + path_or_alias + ")");
  }
  return path;
}

std::unique_ptr<TargetModel> load_target(const std::string& path_or_alias, ops::Compute compute) {
  const std::string path = resolve_model_path(path_or_alias);
  auto file = std::make_shared<const io::GGUFFile>(path);
  const std::string arch = file->get_string("general.architecture");
  if (auto it = families().find(arch); it != families().end()) return it->second(file, compute);
  std::string known;
  for (const auto& [name, make] : families()) known += (known.empty() ? "" : ", ") + name;
  throw FormatError(path + ": unsupported architecture '" + arch + "' (supported: " + known + ")");
}

void TargetModel::embed(std::span<const TokenId> tokens, float* x) const {
  const ops::Linear& table = embedding_table();
  const int64_t d = table.cols();
  const float scale = static_cast<float>(info().embed_scale);
  for (size_t t = 0; t < tokens.size(); ++t) {
    float* row = x + static_cast<int64_t>(t) * d;
    table.row_f32(tokens[t], row);
    if (scale != 1.f) ops::scale(row, d, scale);
  }
}

void TargetModel::head_logits(const float* hidden, int64_t N, float* logits, const ops::Linear* rows) const {
  const ops::Linear& W = rows ? *rows : head();
  W.forward(hidden, N, logits, W.rows());
  ops::softcap(logits, N * W.rows(), static_cast<float>(info().logit_softcap));
}

const at::Tensor& TargetModel::embedding() const {
  std::call_once(embd_once_, [&] {
    const double scale = info().embed_scale;
    embd_bf16_ = scale == 1.0 ? embedding_table().dequantized(at::kBFloat16)
                              : embedding_table().dequantized(at::kFloat).mul_(scale).to(at::kBFloat16);
  });
  return embd_bf16_;
}

const at::Tensor& TargetModel::lm_head() const {
  std::call_once(head_once_, [&] {
    const bool shared = &head() == &embedding_table() && info().embed_scale == 1.0;
    head_bf16_ = shared ? embedding() : head().dequantized(at::kBFloat16);
  });
  return head_bf16_;
}

ForwardOut TargetModel::forward_one(KVCache& cache, std::span<const TokenId> tokens, Logits logits,
                                    const TapRequest& taps) {
  ForwardSeq seq{&cache, tokens, logits};
  auto out = forward(std::span<ForwardSeq>(&seq, 1), taps);
  return std::move(out[0]);
}

KVCache TargetModel::new_cache(int64_t max_tokens) const {
  const auto& i = info();
  if (i.context > 0 && max_tokens > i.context)
    throw InvalidArgument("context length " + std::to_string(max_tokens) + " tokens (-c) exceeds the model's " +
                          std::to_string(i.context) + "-token context");
  return KVCache(i.n_layers, i.n_kv_heads, i.head_dim, max_tokens > 0 ? max_tokens : i.context, i.layer_window);
}

}  // namespace dspark
