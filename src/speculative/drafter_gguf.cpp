// Drafters as llama.cpp's dflash GGUF files (see include/dspark/speculative/interop.hpp
// and ../shared/docs/llama-cpp-dspark-gguf.md for the layout; llama.cpp's
// src/models/dflash.cpp and common/speculative.cpp for what it reads).
//
// Shapes below are [out, in] (row-major); GGUF stores ne reversed.
//   fc.weight [d, m·d], enc.output_norm.weight [d], output_norm.weight [d]
//   blk.N.attn_{norm,q,k,v,output,q_norm,k_norm}, blk.N.ffn_{norm,gate,up,down}
//   markov_w1.weight [V, r], markov_w2.weight [Vd, r] (Vd = V without d2t)
//   conf_proj.weight [1, d + r], conf_proj.bias [1]
//   token_embd.weight [V, d] (learned mask only), output.weight [Vd, d]
//   d2t [Vd] I64 (draft vocabulary only)
#include <algorithm>
#include <cmath>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "dspark/io/gguf_writer.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "interop_util.hpp"

namespace dspark::interop {

namespace {

namespace g = io::gguf;

const std::string kArch = "dflash";
const std::string kFormat = "llama.cpp's dflash GGUF";
constexpr const char* kOutsideRows = "dspark.markov_w2.outside_draft_vocab";

// dspark parameter name -> GGUF tensor name.
std::string gguf_name(const std::string& ours) {
  if (ours == "hidden_norm.weight") return "enc.output_norm.weight";
  if (ours.starts_with("layers.")) return "blk." + ours.substr(7);
  return ours;
}

bool is_qk(const std::string& name) {
  return name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight") || name.ends_with("attn_q_norm.weight") ||
         name.ends_with("attn_k_norm.weight");
}

// Raw bytes of the listed rows of a 2-D GGUF tensor (all rows when empty),
// in that order: a row of any ggml type is a whole number of blocks.
std::string raw_rows(const io::GGUFTensorInfo& t, const std::vector<int64_t>& rows) {
  const auto traits = io::ggml_type_traits(t.type_id);
  const int64_t row_bytes = t.ne[0] / traits->block_elems * traits->block_bytes;
  const char* base = reinterpret_cast<const char*>(t.data);
  if (rows.empty()) return std::string(base, static_cast<size_t>(t.n_bytes));
  std::string out;
  out.reserve(static_cast<size_t>(row_bytes) * rows.size());
  for (int64_t r : rows) out.append(base + r * row_bytes, static_cast<size_t>(row_bytes));
  return out;
}

std::string token_text(const io::GGUFFile& f, int64_t id) {
  const auto& tokens = f.get("tokenizer.ggml.tokens").as_array();
  return id >= 0 && id < static_cast<int64_t>(tokens.size()) ? tokens[id].as_string() : "?";
}

}  // namespace

InteropNotes export_gguf(const Drafter& d, const TargetInfo& t, const std::string& path, const ExportOptions& opts) {
  const DrafterConfig& c = d.config();
  check_drafter_matches(c, t);
  require_representable(d, kFormat, {SeqHead::Markov});
  const io::GGUFFile target(t.path);
  const at::ScalarType dt = export_dtype(d);
  InteropNotes notes;
  io::GGUFWriter w;
  const std::string A = kArch + ".";
  w.set("general.architecture", g::string(kArch));
  w.set("general.name", g::string("DSpark drafter for " + c.target_id));
  w.set(A + "block_count", g::u32(static_cast<uint32_t>(c.n_layers)));
  w.set(A + "context_length", g::u32(static_cast<uint32_t>(t.context)));
  w.set(A + "embedding_length", g::u32(static_cast<uint32_t>(c.hidden)));
  w.set(A + "feed_forward_length", g::u32(static_cast<uint32_t>(c.ffn)));
  w.set(A + "attention.head_count", g::u32(static_cast<uint32_t>(c.n_heads)));
  w.set(A + "attention.head_count_kv", g::u32(static_cast<uint32_t>(c.n_kv_heads)));
  w.set(A + "attention.key_length", g::u32(static_cast<uint32_t>(c.head_dim)));
  w.set(A + "attention.value_length", g::u32(static_cast<uint32_t>(c.head_dim)));
  w.set(A + "attention.layer_norm_rms_epsilon", g::f32(static_cast<float>(c.eps)));
  w.set(A + "attention.causal", g::boolean(false));
  w.set(A + "rope.freq_base", g::f32(static_cast<float>(c.rope_base)));
  std::vector<int32_t> layers;
  for (int l : c.tap_layers) layers.push_back(l + 1);  // llama.cpp taps the INPUT of a layer
  w.set(A + "target_layers", g::i32_array(layers));
  w.set(A + "block_size", g::u32(static_cast<uint32_t>(c.gamma)));
  w.set(A + "sample_from_anchor", g::boolean(true));
  w.set(A + "has_confidence_head", g::boolean(true));
  for (const auto& [key, value] : target.metadata())
    if (key.starts_with("tokenizer.")) w.set(key, value);

  for (const auto& [name, shape] : Drafter::param_spec(c)) {
    if (name == "mask_embedding") continue;
    at::Tensor p = d.params().at(name);
    if (is_qk(name)) p = pairs_to_halves(p, c.head_dim);
    if (name == "markov_w2.weight" && !c.draft_vocab.empty()) {
      // llama.cpp holds only the draft rows; the others ride along in metadata.
      const std::vector<int64_t> ids(c.draft_vocab.begin(), c.draft_vocab.end());
      at::Tensor outside = at::ones({c.vocab}, at::kBool);
      outside.index_fill_(0, at::tensor(ids, at::kLong), false);
      const at::Tensor rest = p.index_select(0, outside.nonzero().squeeze(1)).contiguous();
      const float* v = rest.data_ptr<float>();
      w.set(kOutsideRows, g::f32_array(std::vector<float>(v, v + rest.numel())));
      p = p.index_select(0, at::tensor(ids, at::kLong));
    }
    const bool matrix = p.dim() == 2 && name != "conf_proj.weight";
    w.add_tensor(gguf_name(name), p.contiguous().to(matrix ? dt : at::kFloat));
  }

  // MASK: llama.cpp embeds tokenizer.ggml.mask_token_id; a learned embedding
  // goes into that row of the drafter's own copy of the token embedding.
  bool own_tables = !c.draft_vocab.empty();
  int64_t mask_row = c.mask_token_id;
  if (mask_row < 0) {
    mask_row = choose_mask_row(target, opts.mask_row);
    at::Tensor embd = target_embedding_f32(target);
    embd[mask_row].copy_(d.params().at("mask_embedding"));
    w.add_tensor("token_embd.weight", embd.to(dt));
    own_tables = true;
    notes.push_back("learned mask embedding stored in token_embd row " + std::to_string(mask_row) + " ('" +
                    token_text(target, mask_row) + "'), which llama.cpp feeds as MASK");
  }
  w.set("tokenizer.ggml.mask_token_id", g::u32(static_cast<uint32_t>(mask_row)));
  if (own_tables) {
    // With its own token_embd or a d2t the drafter must carry the LM head
    // (the target's, block for block, restricted to the draft rows).
    const io::GGUFTensorInfo* head = target.find_tensor("output.weight");
    const io::GGUFTensorInfo& h = head ? *head : target.tensor("token_embd.weight");
    const std::vector<int64_t> rows(c.draft_vocab.begin(), c.draft_vocab.end());
    const int64_t n_rows = rows.empty() ? h.ne[1] : static_cast<int64_t>(rows.size());
    w.add_tensor("output.weight", h.type_id, {h.ne[0], n_rows}, raw_rows(h, rows));
  }
  if (!c.draft_vocab.empty()) {
    w.add_tensor("d2t", at::tensor(std::vector<int64_t>(c.draft_vocab.begin(), c.draft_vocab.end()), at::kLong));
    notes.push_back("draft vocabulary of " + std::to_string(c.draft_vocab.size()) +
                    " tokens written as d2t; markov_w2's other rows kept in " + kOutsideRows);
  }

  if (t.arch == "gemma3")
    notes.push_back("llama.cpp (build de3ff81) runs no drafter on a gemma3 target: its gemma3 graph does not expose "
                    "the layer inputs a drafter taps (llama-speculative-simple aborts with 'layer input tensor is "
                    "null'); the file is complete and imports back with dspark import");
  w.set("dspark.format_version", g::u32(1));
  w.set("dspark.target_id", g::string(c.target_id));
  w.set("dspark.seq_head", g::string(to_string(c.seq_head)));
  if (!c.sts_thresholds.empty()) w.set("dspark.sts.thresholds", g::f64_array(c.sts_thresholds));
  if (!c.sts_temperatures.empty()) w.set("dspark.sts.temperatures", g::f64_array(c.sts_temperatures));
  if (!c.sts_report.empty()) w.set("dspark.sts.report", g::string(c.sts_report));
  w.write(path);
  return notes;
}

namespace {

// Refuses GGUF metadata describing what dspark's drafter does not compute.
void refuse_unsupported(const io::GGUFFile& f, int64_t head_dim) {
  const std::string A = kArch + ".";
  auto refuse = [&](const std::string& what) {
    throw FormatError(f.path() + ": " + what + ", which dspark's drafter cannot represent");
  };
  if (!f.get_bool_or(A + "sample_from_anchor", true))
    refuse("dflash.sample_from_anchor is false (a bonus-anchor block layout; dspark's blocks are anchor-first)");
  if (f.get_bool_or(A + "attention.causal", false)) refuse("dflash.attention.causal is true (causal blocks)");
  if (f.get_int_or(A + "attention.sliding_window", 0) > 0) refuse("the drafter uses sliding-window attention");
  if (f.has(A + "hidden_activation") && f.get_string(A + "hidden_activation") != "silu")
    refuse("the MLP activation is " + f.get_string(A + "hidden_activation") + " (dspark's is silu)");
  for (const char* key : {"embedding_scale", "logit_scale"}) {
    const double v = f.get_float_or(A + key, 1.0);
    if (v != 0.0 && v != 1.0) refuse(A + key + " is " + std::to_string(v));
  }
  if (f.get_float_or(A + "final_logit_softcapping", 0.0) > 0.0) refuse("the drafter softcaps its logits");
  const double scale = f.get_float_or(A + "attention.scale", 0.0);
  if (scale != 0.0 && std::fabs(scale * std::sqrt(static_cast<double>(head_dim)) - 1.0) > 1e-6)
    refuse("dflash.attention.scale is " + std::to_string(scale) + " (dspark scales by 1/sqrt(head_dim))");
  if (f.has(A + "rope.dimension_count") && f.get_int(A + "rope.dimension_count") != head_dim)
    refuse("RoPE covers " + std::to_string(f.get_int(A + "rope.dimension_count")) + " of " +
           std::to_string(head_dim) + " head dimensions");
  if (f.has(A + "rope.scaling.type") && f.get_string(A + "rope.scaling.type") != "none")
    refuse("RoPE scaling '" + f.get_string(A + "rope.scaling.type") + "'");
  if (f.has(A + "rope.dimension_sections"))
    for (int64_t s : f.get_int_array(A + "rope.dimension_sections"))
      if (s != 0) refuse("the drafter uses M-RoPE sections");
}

at::Tensor read_f32(const io::GGUFFile& f, const std::string& name) {
  return io::dequantize_tensor(f.tensor(name), at::kFloat);
}

}  // namespace

Drafter import_gguf(const std::string& path, const TargetInfo& t, InteropNotes& notes) {
  const io::GGUFFile f(path);
  const std::string arch = f.get_string("general.architecture");
  if (arch != kArch)
    throw FormatError(path + ": general.architecture is '" + arch + "', expected 'dflash' (a DFlash/DSpark drafter)");
  const std::string A = kArch + ".";
  DrafterConfig c;
  c.n_layers = static_cast<int>(f.get_int(A + "block_count"));
  c.hidden = f.get_int(A + "embedding_length");
  c.ffn = static_cast<int>(f.get_int(A + "feed_forward_length"));
  c.n_heads = static_cast<int>(f.get_int(A + "attention.head_count"));
  c.n_kv_heads = static_cast<int>(f.get_int_or(A + "attention.head_count_kv", c.n_heads));
  c.head_dim = static_cast<int>(f.get_int_or(A + "attention.key_length", c.n_heads > 0 ? c.hidden / c.n_heads : 0));
  if (f.get_int_or(A + "attention.value_length", c.head_dim) != c.head_dim)
    throw FormatError(path + ": value heads of " + std::to_string(f.get_int(A + "attention.value_length")) +
                      " dimensions differ from key heads of " + std::to_string(c.head_dim) +
                      ", which dspark's drafter cannot represent");
  c.eps = f.get_float(A + "attention.layer_norm_rms_epsilon");
  c.rope_base = f.get_float_or(A + "rope.freq_base", 10000.0);
  refuse_unsupported(f, c.head_dim);
  if (!f.has(A + "block_size")) throw FormatError(path + ": missing metadata key 'dflash.block_size' (the DSpark block size)");
  c.gamma = static_cast<int>(f.get_int(A + "block_size"));
  for (int64_t l : f.get_int_array(A + "target_layers")) {
    if (l < 1)
      throw FormatError(path + ": dflash.target_layers taps the input of layer " + std::to_string(l) +
                        " (the embedding output), which dspark's drafter cannot tap");
    c.tap_layers.push_back(static_cast<int>(l - 1));
  }
  if (!f.find_tensor("markov_w1.weight"))
    throw FormatError(path + ": no markov_w1.weight: a DFlash drafter (predictions at the mask slots), not an "
                      "anchor-first DSpark drafter, which dspark's drafter cannot represent");
  const auto& w1 = f.tensor("markov_w1.weight");
  c.markov_rank = static_cast<int>(w1.ne[0]);
  c.vocab = w1.ne[1];
  if (!f.has("tokenizer.ggml.mask_token_id")) throw FormatError(path + ": missing metadata key 'tokenizer.ggml.mask_token_id'");
  const int64_t mask_row = f.get_int("tokenizer.ggml.mask_token_id");
  if (mask_row < 0 || mask_row >= c.vocab)
    throw FormatError(path + ": tokenizer.ggml.mask_token_id " + std::to_string(mask_row) +
                      " is outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
  const io::GGUFTensorInfo* embd = f.find_tensor("token_embd.weight");
  c.mask_token_id = embd ? -1 : static_cast<int>(mask_row);
  c.seq_head = SeqHead::Markov;
  if (f.has("dspark.seq_head")) {
    try {
      c.seq_head = parse_seq_head(f.get_string("dspark.seq_head"));
    } catch (const InvalidArgument& e) {
      throw FormatError(path + ": dspark.seq_head: " + e.what());
    }
  }
  if (f.has("dspark.target_id") && f.get_string("dspark.target_id") != t.id)
    throw FormatError(path + ": the drafter was built for '" + f.get_string("dspark.target_id") +
                      "', the target is '" + t.id + "'");
  c.target_id = t.id;
  if (f.has("dspark.sts.thresholds")) c.sts_thresholds = f.get_float_array("dspark.sts.thresholds");
  if (f.has("dspark.sts.temperatures")) c.sts_temperatures = f.get_float_array("dspark.sts.temperatures");
  if (f.has("dspark.sts.report")) {
    const std::string report = f.get_string("dspark.sts.report");
    const auto j = nlohmann::json::parse(report, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object())
      throw FormatError(path + ": dspark.sts.report is not a JSON object (expected the calibration record)");
    c.sts_report = sts_report_of(j);
  }

  // Draft vocabulary: d2t lists target ids of the stored rows, in any order.
  at::Tensor d2t;
  if (const io::GGUFTensorInfo* info = f.find_tensor("d2t")) {
    if (info->type() != io::GGMLType::I64 || info->ne.size() != 1)
      throw FormatError(path + ": tensor 'd2t' must be a 1-D I64 tensor, got " + io::ggml_type_name(info->type_id));
    d2t = at::from_blob(const_cast<uint8_t*>(info->data), {info->ne[0]}, at::kLong).clone();
    at::Tensor sorted = std::get<0>(at::sort(d2t));
    if (sorted.numel() > 0 && (sorted[0].item<int64_t>() < 0 || sorted[-1].item<int64_t>() >= c.vocab))
      throw FormatError(path + ": d2t holds token ids outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
    if (sorted.numel() > 1 && !at::all(sorted.slice(0, 1) > sorted.slice(0, 0, -1)).item<bool>())
      throw FormatError(path + ": d2t lists a token id twice");
    const int64_t* s = sorted.data_ptr<int64_t>();
    c.draft_vocab.assign(s, s + sorted.numel());
  }
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    throw FormatError(path + ": " + e.what());
  }
  check_import_dims(c, t, path);

  std::map<std::string, at::Tensor> params;
  std::vector<std::string> known = {"token_embd.weight", "output.weight", "d2t"};
  for (const auto& [name, shape] : Drafter::param_spec(c)) {
    if (name == "mask_embedding") {
      params[name] = io::dequantize_tensor(*embd, at::kFloat)[mask_row].clone();
      continue;
    }
    const std::string gname = gguf_name(name);
    known.push_back(gname);
    if (name.starts_with("conf_proj") && !f.find_tensor(gname)) {
      params[name] = at::zeros(shape, at::kFloat);
      notes.push_back("no " + gname + " (no confidence head): imported as zeros, every confidence is 0.5");
      continue;
    }
    at::Tensor p = read_f32(f, gname);
    if (is_qk(name)) p = halves_to_pairs(p, c.head_dim);
    if (name == "conf_proj.weight" && p.numel() == c.hidden) p = at::cat({p.reshape({1, -1}), at::zeros({1, c.markov_rank})}, 1);
    if (name == "markov_w2.weight" && d2t.defined()) {
      at::Tensor full = at::zeros({c.vocab, c.markov_rank}, at::kFloat);
      if (f.has(kOutsideRows)) {
        at::Tensor outside = at::ones({c.vocab}, at::kBool);
        outside.index_fill_(0, d2t, false);
        const auto rest = f.get_float_array(kOutsideRows);
        const at::Tensor idx = outside.nonzero().squeeze(1);
        if (static_cast<int64_t>(rest.size()) != idx.numel() * c.markov_rank)
          throw FormatError(path + ": " + kOutsideRows + " holds " + std::to_string(rest.size()) + " values, expected " +
                            std::to_string(idx.numel() * c.markov_rank));
        full.index_copy_(0, idx, at::tensor(rest, at::kDouble).to(at::kFloat).reshape({-1, c.markov_rank}));
      } else {
        notes.push_back("markov_w2 rows outside the draft vocabulary are not in the file: set to zero (they take "
                        "no part in drafting with the draft vocabulary)");
      }
      full.index_copy_(0, d2t, p);
      p = full;
    }
    params[name] = p;
  }
  for (const auto& ti : f.tensors())
    if (std::find(known.begin(), known.end(), ti.name) == known.end())
      throw FormatError(path + ": unexpected tensor '" + ti.name + "' (a feature dspark's drafter cannot represent)");
  if (embd)
    notes.push_back("the file's token_embd row " + std::to_string(mask_row) +
                    " became the learned mask embedding; its other rows and output.weight are taken to be the "
                    "target's, which dspark shares");
  try {
    return Drafter(c, std::move(params));
  } catch (const FormatError& e) {
    throw FormatError(path + ": " + e.what());
  }
}

}  // namespace dspark::interop
