// Target loading and the shared TargetModel helpers; see target.hpp.
#include "dspark/model/target.hpp"

#include <cstdlib>
#include <filesystem>
#include <map>

#include "dspark/error.hpp"
#include "dspark/io/gguf.hpp"
#include "llama.hpp"

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
  };
  return m;
}

}  // namespace

std::string resolve_model_path(const std::string& path_or_alias) {
  auto it = aliases().find(path_or_alias);
  if (it == aliases().end()) return path_or_alias;
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
  if (arch == "llama") return make_llama(file, compute);
  throw FormatError(path + ": unsupported architecture '" + arch + "' (supported: llama)");
}

const at::Tensor& TargetModel::embedding() const {
  std::call_once(embd_once_, [&] { embd_bf16_ = embedding_table().dequantized(at::kBFloat16); });
  return embd_bf16_;
}

const at::Tensor& TargetModel::lm_head() const {
  std::call_once(head_once_, [&] {
    head_bf16_ = &head() == &embedding_table() ? embedding() : head().dequantized(at::kBFloat16);
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
  return KVCache(i.n_layers, i.n_kv_heads, i.head_dim, max_tokens > 0 ? max_tokens : i.context);
}

}  // namespace dspark
