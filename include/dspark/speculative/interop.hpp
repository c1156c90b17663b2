// dspark/speculative/interop.hpp — drafters in other projects' formats: export to
// and import from llama.cpp's dflash GGUF and DeepSpec's Hugging Face layout.
//
// Both formats hold a DSpark drafter with a DFlash backbone (KV injection,
// per-head q/k RMSNorm, SwiGLU), anchor-first blocks, a Markov head and a
// confidence head on [h_k ; W1[x_{k-1}]]. Differences from dspark's own
// checkpoint (docs/checkpoint-format.md) that the converters bridge:
//
// * RoPE: both rotate halves (i, i + hd/2) (NeoX / rotate_half); dspark
//   rotates adjacent pairs. The rows of W_q, W_k and the q/k norm weights are
//   permuted per head, which gives the same attention exactly.
// * Taps: llama.cpp's `dflash.target_layers` name the layer whose INPUT is
//   tapped (dspark tap l, the output of layer l, is stored as l + 1);
//   DeepSpec's `target_layer_ids` are output indices like dspark's.
// * MASK: both read the mask input from a token row of an embedding table
//   (`tokenizer.ggml.mask_token_id` / `mask_token_id`). A fixed-row drafter
//   (mask_token_id >= 0) keeps its row. A learned mask embedding is written
//   into the row `mask_row` of the drafter's own copy of the target's token
//   embedding (GGUF `token_embd.weight`, which llama.cpp then prefers to the
//   target's, together with `output.weight`, the target's LM head; HF
//   `embed_tokens.weight`). On import, a file that carries its own embedding
//   table gets a learned mask embedding equal to that table's mask row (what
//   the drafter was trained with); one without gets a fixed row.
// * Draft vocabulary: GGUF `d2t` (I64, draft row -> target token id) with
//   `markov_w2` and `output.weight` holding only those rows, as llama.cpp
//   runs it; the other markov_w2 rows are kept for the round trip in the
//   metadata array `dspark.markov_w2.outside_draft_vocab` (f32, ascending
//   token order), which llama.cpp ignores. The HF layout keeps the full
//   vocabulary and the list in config.json `dspark.draft_vocab`.
// * What only dspark has (target id, "none" head, STS calibration, whether
//   the mask is learned) travels in `dspark.*` metadata keys / a `dspark`
//   object in config.json, ignored by the other readers.
//
// Tensors are written as bf16 when every drafter parameter is exactly a bf16
// value (drafters as shipped), fp32 otherwise (norm weights, biases and the
// confidence head are always fp32 in GGUF), so dspark -> format -> dspark
// gives bit-identical parameters.
//
// Refused, with a message that names the format and the feature: Elman heads
// (both), gated and RNN heads (GGUF: llama.cpp has only the Markov head), a
// "none" head with a non-zero markov_w2; on import, files with features
// dspark's drafter lacks (bonus-anchor or causal blocks, sliding windows,
// softcapping, embedding/attention scales, partial rotary, biases, another
// activation, taps of the embedding output, DFlash drafters without a Markov
// head, extra tensors), or built for another target (hidden size, vocabulary,
// layers, `dspark.target_id`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dspark/model/target.hpp"
#include "dspark/speculative/drafter.hpp"

namespace dspark {

/// Drafter formats of other projects.
enum class DrafterFormat { GGUF, HF };
std::string to_string(DrafterFormat f);
/// "gguf" | "hf"; throws InvalidArgument otherwise.
DrafterFormat parse_drafter_format(const std::string& s);
/// A file starting with the GGUF magic is GGUF; a directory holding
/// config.json is HF. Throws Error naming the path otherwise.
DrafterFormat detect_drafter_format(const std::string& path);

struct ExportOptions {
  /// Token row that holds a learned mask embedding; -1: the target's declared
  /// mask token, else its highest-id control token that is not a declared
  /// special token and not in the chat template. Ignored for fixed-row drafters.
  int64_t mask_row = -1;
};

/// True when storing every parameter of `d` as bf16 loses nothing (what
/// exports choose bf16 by, and what a lossless save of an import needs).
bool bf16_exact(const Drafter& d);

/// One line each: what an export or import decided that its user should know
/// (the mask row chosen, rows dropped, defaults filled in).
using InteropNotes = std::vector<std::string>;

/// Writes `drafter` for `target` (the target it was built for: its GGUF file,
/// read from target.path, supplies the tokenizer, the embedding table and the
/// LM head) to `path`, atomically:
///   GGUF: one llama.cpp dflash file (llama-speculative-simple / llama-server
///         `--spec-type draft-dspark -md path`);
///   HF:   a directory with config.json and model.safetensors in DeepSpec's
///         Qwen3DSparkModel layout.
/// Throws InvalidArgument for a drafter of another target or one the format
/// cannot represent, Error for I/O failures.
InteropNotes export_drafter(const Drafter& drafter, const TargetInfo& target, DrafterFormat format,
                            const std::string& path, const ExportOptions& opts = {});

/// Reads a drafter in `format` from `path` for `target` (whose dims it must
/// match; the result's target_id is target.id). Throws FormatError naming the
/// file and key or tensor for malformed content and for anything dspark's
/// drafter cannot represent.
Drafter import_drafter(const std::string& path, const TargetInfo& target, DrafterFormat format,
                       InteropNotes* notes = nullptr);

}  // namespace dspark
