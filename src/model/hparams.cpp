// Shared decoder hyper-parameters; see hparams.hpp.
#include "hparams.hpp"

#include <cmath>

#include "dspark/error.hpp"

namespace dspark {

double ArchKeys::positive_float(const std::string& suffix, double def) const {
  const double v = get_float_or(suffix, def);
  if (!(v > 0) || !std::isfinite(v))
    throw FormatError(f_.path() + ": " + key(suffix) + " must be a positive finite number, got " + std::to_string(v));
  return v;
}

namespace {

// Identity used to pair drafters with targets: the model, not its quantization.
std::string target_id(const io::GGUFFile& f, const std::string& arch) {
  std::string id = f.find("general.basename") ? f.get_string("general.basename") : "";
  if (id.empty() && f.find("general.name")) id = f.get_string("general.name");
  if (auto* v = f.find("general.size_label")) id += "-" + v->as_string();
  if (auto* v = f.find("general.finetune")) id += "-" + v->as_string();
  return arch + "/" + id;
}

}  // namespace

DecoderConfig parse_decoder_config(const ArchKeys& k) {
  const io::GGUFFile& f = k.file();
  const std::string& arch = k.arch();
  DecoderConfig c;
  TargetInfo& i = c.info;
  i.arch = arch;
  i.path = f.path();
  i.id = target_id(f, arch);
  i.n_layers = k.get_int("block_count");
  i.hidden = k.get_int("embedding_length");
  i.n_heads = k.get_int("attention.head_count");
  i.n_kv_heads = k.get_int_or("attention.head_count_kv", i.n_heads);
  if (i.n_heads <= 0 || i.hidden <= 0)
    throw FormatError(f.path() + ": " + k.key("attention.head_count") + " and " + k.key("embedding_length") +
                      " must be positive, got " + std::to_string(i.n_heads) + " and " + std::to_string(i.hidden));
  i.head_dim = k.get_int_or("attention.key_length", i.hidden / i.n_heads);
  i.ffn = k.get_int("feed_forward_length");
  i.context = k.get_int_or("context_length", 2048);
  c.rot_dim = k.get_int_or("rope.dimension_count", i.head_dim);
  i.vocab = f.tensor("token_embd.weight").shape().at(0);

  constexpr int64_t kMaxLayers = 4096;  // far above any released model; guards the allocations below
  if (i.n_layers <= 0 || i.n_layers > kMaxLayers || i.n_kv_heads <= 0 || i.head_dim <= 0 ||
      i.n_heads % i.n_kv_heads != 0 || c.rot_dim <= 0 || c.rot_dim % 2 != 0 || c.rot_dim > i.head_dim) {
    throw FormatError(f.path() + ": inconsistent " + arch + " hyper-parameters (layers " + std::to_string(i.n_layers) +
                      ", heads " + std::to_string(i.n_heads) + "/" + std::to_string(i.n_kv_heads) + ", rope dims " +
                      std::to_string(c.rot_dim) + ")");
  }
  i.rms_eps = k.positive_float("attention.layer_norm_rms_epsilon", 1e-5);
  i.rope_base = k.positive_float("rope.freq_base", 10000.0);
  if (i.context <= 0 || i.ffn <= 0)
    throw FormatError(f.path() + ": " + k.key("context_length") + " and " + k.key("feed_forward_length") +
                      " must be positive, got " + std::to_string(i.context) + " and " + std::to_string(i.ffn));
  if (k.has("vocab_size") && k.get_int("vocab_size") != i.vocab)
    throw FormatError(f.path() + ": " + k.key("vocab_size") + " is " + std::to_string(k.get_int("vocab_size")) +
                      " but token_embd.weight has " + std::to_string(i.vocab) + " rows");
  for (int64_t dim : {i.hidden, i.ffn, i.n_heads * i.head_dim}) {
    if (dim % 32 != 0)
      throw FormatError(f.path() + ": dimension " + std::to_string(dim) +
                        " is not a multiple of 32, which the matmul kernels require");
  }

  const std::string scaling = k.has("rope.scaling.type") ? f.get_string(k.key("rope.scaling.type")) : "none";
  if (scaling == "linear") {
    c.rope_linear = k.positive_float("rope.scaling.factor", 1.0);
  } else if (scaling != "none") {
    throw FormatError(f.path() + ": unsupported rope scaling '" + scaling + "' (supported: none, linear)");
  }
  i.layer_window.assign(static_cast<size_t>(i.n_layers), 0);
  return c;
}

}  // namespace dspark
