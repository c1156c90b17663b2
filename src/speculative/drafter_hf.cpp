// Drafters in DeepSpec's Hugging Face layout (Qwen3DSparkModel: what
// DeepSpec's trainer saves with save_pretrained, and what vLLM, SGLang and
// llama.cpp's converter read); see include/dspark/speculative/interop.hpp.
//
// config.json: a Qwen3 config (hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
// rms_norm_eps, rope_theta, vocab_size, ...) plus block_size,
// target_layer_ids, num_target_layers, mask_token_id, num_anchors,
// markov_rank, markov_head_type, enable_confidence_head,
// confidence_head_with_markov; and a "dspark" object for what only dspark has.
// model.safetensors, shapes [out, in]:
//   embed_tokens.weight [V, d], lm_head.weight [V, d] (copies of the target's)
//   fc.weight [d, m·d], hidden_norm.weight [d], norm.weight [d]
//   layers.N.input_layernorm / post_attention_layernorm .weight [d]
//   layers.N.self_attn.{q,k,v,o}_proj.weight, .{q,k}_norm.weight [hd]
//   layers.N.mlp.{gate,up,down}_proj.weight
//   markov_head.markov_w1.weight [V, r], markov_head.markov_w2.weight [V, r]
//   markov_head.gate_proj.{weight,bias} (gated), markov_head.joint_proj.{weight,bias} (rnn)
//   confidence_head.proj.weight [1, d + r], confidence_head.proj.bias [1]
#include <filesystem>
#include <fstream>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"
#include "dspark/io/gguf.hpp"
#include "dspark/io/safetensors.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "interop_util.hpp"
#include "json_get.hpp"

namespace dspark::interop {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kFormat = "DeepSpec's Hugging Face layout";
const std::string kArchitecture = "Qwen3DSparkModel";

// dspark parameter name <-> DeepSpec state-dict name.
const std::vector<std::pair<std::string, std::string>>& name_table() {
  static const std::vector<std::pair<std::string, std::string>> t = {
      {"fc.weight", "fc.weight"},
      {"hidden_norm.weight", "hidden_norm.weight"},
      {"output_norm.weight", "norm.weight"},
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"markov_w1.weight", "markov_head.markov_w1.weight"},
      {"markov_w2.weight", "markov_head.markov_w2.weight"},
      {"markov_gate.weight", "markov_head.gate_proj.weight"},
      {"markov_gate.bias", "markov_head.gate_proj.bias"},
      {"rnn.weight", "markov_head.joint_proj.weight"},
      {"rnn.bias", "markov_head.joint_proj.bias"},
      {"conf_proj.weight", "confidence_head.proj.weight"},
      {"conf_proj.bias", "confidence_head.proj.bias"},
  };
  return t;
}

std::string hf_name(const std::string& ours) {
  std::string prefix, rest = ours;
  if (ours.starts_with("layers.")) {
    const size_t dot = ours.find('.', 7);
    prefix = ours.substr(0, dot + 1);
    rest = ours.substr(dot + 1);
  }
  for (const auto& [a, b] : name_table())
    if (a == rest) return prefix + b;
  throw InvalidArgument(kFormat + " has no tensor for dspark parameter '" + ours + "'");
}

bool is_qk(const std::string& name) {
  return name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight") || name.ends_with("attn_q_norm.weight") ||
         name.ends_with("attn_k_norm.weight");
}

std::string head_type(SeqHead h) {
  return h == SeqHead::Gated ? "gated" : h == SeqHead::Rnn ? "rnn" : "vanilla";
}

}  // namespace

InteropNotes export_hf(const Drafter& d, const TargetInfo& t, const std::string& dir, const ExportOptions& opts) {
  const DrafterConfig& c = d.config();
  check_drafter_matches(c, t);
  require_representable(d, kFormat, {SeqHead::Markov, SeqHead::Gated, SeqHead::Rnn});
  const io::GGUFFile target(t.path);
  const at::ScalarType dt = export_dtype(d);
  InteropNotes notes;

  const bool learned = c.mask_token_id < 0;
  const int64_t mask_row = learned ? choose_mask_row(target, opts.mask_row) : c.mask_token_id;
  at::Tensor embed = target_embedding_f32(target);
  if (learned) {
    embed[mask_row].copy_(d.params().at("mask_embedding"));
    notes.push_back("learned mask embedding stored in embed_tokens row " + std::to_string(mask_row) +
                    " (config.json mask_token_id)");
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"embed_tokens.weight", embed.to(dt)},
      {"lm_head.weight", target_head_f32(target).to(dt)},
  };
  for (const auto& [name, shape] : Drafter::param_spec(c)) {
    if (name == "mask_embedding") continue;
    at::Tensor p = d.params().at(name);
    if (is_qk(name)) p = pairs_to_halves(p, c.head_dim);
    tensors.emplace_back(hf_name(name), p.contiguous().to(dt));
  }

  json dspark = {{"format_version", 1},
                 {"target_id", c.target_id},
                 {"seq_head", to_string(c.seq_head)},
                 {"mask_embedding", learned}};
  if (json sts = sts_json(c); !sts.empty()) dspark["sts"] = std::move(sts);
  if (!c.draft_vocab.empty()) dspark["draft_vocab"] = c.draft_vocab;
  const std::string dtype = dt == at::kBFloat16 ? "bfloat16" : "float32";
  const json cfg = {
      {"architectures", {kArchitecture}},
      {"model_type", "qwen3"},
      {"hidden_size", c.hidden},
      {"intermediate_size", c.ffn},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.eps},
      {"rope_theta", c.rope_base},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_base}}},
      {"max_position_embeddings", t.context},
      {"vocab_size", c.vocab},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", false},
      {"use_sliding_window", false},
      {"sliding_window", nullptr},
      {"layer_types", std::vector<std::string>(static_cast<size_t>(c.n_layers), "full_attention")},
      {"block_size", c.gamma},
      {"target_layer_ids", c.tap_layers},
      {"num_target_layers", t.n_layers},
      {"mask_token_id", mask_row},
      {"num_anchors", 512},
      {"markov_rank", c.markov_rank},
      {"markov_head_type", head_type(c.seq_head)},
      {"enable_confidence_head", true},
      {"confidence_head_with_markov", true},
      {"dtype", dtype},
      {"torch_dtype", dtype},
      {"dspark", dspark},
  };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create the output directory: " + ec.message());
  // Weights first, then the config that describes them (each atomic).
  io::save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  io::write_json_atomic((fs::path(dir) / "config.json").string(), cfg);
  return notes;
}

namespace {

template <typename T>
T get_or(const json& j, const std::string& key, T fallback, const std::string& where) {
  return j.contains(key) && !j.at(key).is_null() ? json_get<T>(j, key, where) : fallback;
}

// Refuses config.json features that dspark's drafter does not compute.
void refuse_unsupported(const json& j, const std::string& where) {
  auto refuse = [&](const std::string& what) {
    throw FormatError(where + ": " + what + ", which dspark's drafter cannot represent");
  };
  const auto arch = get_or<std::vector<std::string>>(j, "architectures", {}, where);
  if (std::find(arch.begin(), arch.end(), kArchitecture) == arch.end())
    refuse("architectures is " + j.value("architectures", json::array()).dump() + ", not [\"" + kArchitecture +
           "\"] (a Llama-like backbone with q/k norms)");
  if (get_or<bool>(j, "attention_bias", false, where)) refuse("attention_bias is true (biased projections)");
  if (get_or<std::string>(j, "hidden_act", "silu", where) != "silu")
    refuse("hidden_act is " + j.at("hidden_act").dump() + " (dspark's MLP is SwiGLU with silu)");
  if (get_or<bool>(j, "use_sliding_window", false, where)) refuse("use_sliding_window is true");
  for (const auto& lt : get_or<std::vector<std::string>>(j, "layer_types", {}, where))
    if (lt != "full_attention") refuse("a layer type is '" + lt + "'");
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) refuse("rope_scaling is set");
  if (j.contains("rope_parameters") && j.at("rope_parameters").is_object() &&
      get_or<std::string>(j.at("rope_parameters"), "rope_type", "default", where) != "default")
    refuse("rope_parameters.rope_type is " + j.at("rope_parameters").at("rope_type").dump());
  if (get_or<bool>(j, "is_causal", false, where)) refuse("is_causal is true (causal blocks)");
}

DrafterConfig config_from_hf(const json& j, const TargetInfo& t, const std::string& where) {
  refuse_unsupported(j, where);
  DrafterConfig c;
  c.hidden = json_get<int64_t>(j, "hidden_size", where);
  c.ffn = json_get<int>(j, "intermediate_size", where);
  c.n_layers = json_get<int>(j, "num_hidden_layers", where);
  c.n_heads = json_get<int>(j, "num_attention_heads", where);
  c.n_kv_heads = get_or<int>(j, "num_key_value_heads", c.n_heads, where);
  c.head_dim = get_or<int>(j, "head_dim", c.n_heads > 0 ? static_cast<int>(c.hidden / c.n_heads) : 0, where);
  c.eps = json_get<double>(j, "rms_norm_eps", where);
  c.rope_base = j.contains("rope_theta") ? json_get<double>(j, "rope_theta", where)
                : j.contains("rope_parameters") ? json_get<double>(j.at("rope_parameters"), "rope_theta", where + " rope_parameters")
                                                : 10000.0;
  c.vocab = json_get<int64_t>(j, "vocab_size", where);
  c.gamma = json_get<int>(j, "block_size", where);
  for (int l : json_get<std::vector<int>>(j, "target_layer_ids", where)) {
    if (l < 0)
      throw FormatError(where + ": target_layer_ids holds " + std::to_string(l) +
                        " (the embedding output), which dspark's drafter cannot tap");
    c.tap_layers.push_back(l);
  }
  const int64_t n_target = get_or<int64_t>(j, "num_target_layers", t.n_layers, where);
  if (n_target != t.n_layers)
    throw FormatError(where + ": num_target_layers is " + std::to_string(n_target) + ", the target has " +
                      std::to_string(t.n_layers) + " layers");
  const int rank = json_get<int>(j, "markov_rank", where);
  c.markov_rank = rank == 0 ? 32 : rank;  // rank 0: no Markov head; W1 = W2 = 0 below
  c.seq_head = SeqHead::None;
  if (rank > 0) {
    const std::string type = get_or<std::string>(j, "markov_head_type", "vanilla", where);
    if (type == "vanilla") c.seq_head = SeqHead::Markov;
    else if (type == "gated") c.seq_head = SeqHead::Gated;
    else if (type == "rnn") c.seq_head = SeqHead::Rnn;
    else throw FormatError(where + ": markov_head_type '" + type + "', which dspark's drafter cannot represent");
  }
  const json ds = j.value("dspark", json::object());
  const std::string dw = where + " dspark";
  if (ds.contains("seq_head")) {
    try {
      c.seq_head = parse_seq_head(json_get<std::string>(ds, "seq_head", dw));
    } catch (const InvalidArgument& e) {
      throw FormatError(dw + ": " + e.what());
    }
  }
  if (ds.contains("target_id") && json_get<std::string>(ds, "target_id", dw) != t.id)
    throw FormatError(where + ": the drafter was built for '" + ds.at("target_id").get<std::string>() +
                      "', the target is '" + t.id + "'");
  c.target_id = t.id;
  const int mask = json_get<int>(j, "mask_token_id", where);
  if (mask < 0 || mask >= c.vocab)
    throw FormatError(where + ": mask_token_id " + std::to_string(mask) + " is outside the vocabulary [0, " +
                      std::to_string(c.vocab) + ")");
  c.mask_token_id = get_or<bool>(ds, "mask_embedding", true, dw) ? -1 : mask;
  if (ds.contains("sts")) {
    c.sts_thresholds = get_or<std::vector<double>>(ds.at("sts"), "thresholds", {}, dw);
    c.sts_temperatures = get_or<std::vector<double>>(ds.at("sts"), "temperatures", {}, dw);
    if (ds.at("sts").is_object()) c.sts_report = sts_report_of(ds.at("sts"));
  }
  c.draft_vocab = get_or<std::vector<TokenId>>(ds, "draft_vocab", {}, dw);
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    throw FormatError(where + ": " + e.what());
  }
  check_import_dims(c, t, where);
  return c;
}

}  // namespace

Drafter import_hf(const std::string& dir, const TargetInfo& t, InteropNotes& notes) {
  const std::string where = (fs::path(dir) / "config.json").string();
  std::ifstream in(where);
  if (!in) throw Error(where + ": cannot open (expected a Hugging Face drafter directory with config.json)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw FormatError(where + ": invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw FormatError(where + ": expected a JSON object");
  const DrafterConfig c = config_from_hf(j, t, where);
  const int rank = json_get<int>(j, "markov_rank", where);
  const bool conf = get_or<bool>(j, "enable_confidence_head", false, where);
  const bool conf_markov = conf && get_or<bool>(j, "confidence_head_with_markov", false, where);
  const int mask = json_get<int>(j, "mask_token_id", where);

  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, tensor] : io::load_safetensors_dir(dir).tensors)
    tensors[name.starts_with("model.") ? name.substr(6) : name] = tensor.to(at::kFloat);
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  auto take = [&](const std::string& name) {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw FormatError(weights + ": missing tensor '" + name + "'");
    at::Tensor v = it->second;
    tensors.erase(it);
    return v;
  };
  std::map<std::string, at::Tensor> params;
  for (const auto& [name, shape] : Drafter::param_spec(c)) {
    if (name == "mask_embedding") continue;
    const bool no_markov = rank == 0 && name.starts_with("markov_w");
    const bool no_conf = !conf && name.starts_with("conf_proj");
    if (no_markov || no_conf) {
      params[name] = at::zeros(shape, at::kFloat);
      continue;
    }
    at::Tensor p = take(hf_name(name));
    if (is_qk(name)) p = halves_to_pairs(p, c.head_dim);
    if (name == "conf_proj.weight" && !conf_markov) p = at::cat({p.reshape({1, -1}), at::zeros({1, c.markov_rank})}, 1);
    params[name] = p;
  }
  if (!conf) notes.push_back("no confidence head (enable_confidence_head false): imported as zeros, every confidence is 0.5");
  if (rank == 0) notes.push_back("no Markov head (markov_rank 0): imported as sequential head 'none'");
  const at::Tensor embed = take("embed_tokens.weight");
  if (c.mask_token_id < 0) {
    params["mask_embedding"] = embed[mask].clone();
    notes.push_back("embed_tokens row " + std::to_string(mask) +
                    " became the learned mask embedding; the other rows and lm_head are taken to be the target's, "
                    "which dspark shares");
  }
  tensors.erase("lm_head.weight");
  if (!tensors.empty())
    throw FormatError(weights + ": unexpected tensor '" + tensors.begin()->first +
                      "' (a feature dspark's drafter cannot represent)");
  try {
    return Drafter(c, std::move(params));
  } catch (const FormatError& e) {
    throw FormatError(weights + ": " + e.what());
  }
}

}  // namespace dspark::interop
