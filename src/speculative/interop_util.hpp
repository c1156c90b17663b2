// Helpers shared by the drafter exporters and importers of other formats
// (drafter_gguf.cpp: llama.cpp's dflash GGUF; drafter_hf.cpp: DeepSpec's
// Hugging Face layout). Private to src/spec.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dspark/io/gguf.hpp"
#include "dspark/speculative/drafter.hpp"
#include "dspark/speculative/interop.hpp"

namespace dspark::interop {

/// RoPE layouts of q/k rows within one head of `head_dim` values. dspark
/// rotates adjacent pairs (2i, 2i+1) (GGUF Llama convention); llama.cpp's
/// dflash graph and Hugging Face's rotate_half rotate halves (i, i + hd/2)
/// (NeoX). The rotation angle of pair i is the same in both, so permuting
/// the rows of W_q, W_k and of the per-head q/k norm weights converts one
/// layout into the other exactly (RMSNorm and q·k are permutation-invariant).
///
/// `w`: [n·hd, in] (a projection) or [hd] (a norm weight). Returns a new tensor
/// with each head's rows reordered: halves[j] = pairs[2j], halves[j+hd/2] =
/// pairs[2j+1] (pairs_to_halves) or the inverse (halves_to_pairs).
at::Tensor pairs_to_halves(const at::Tensor& w, int64_t head_dim);
at::Tensor halves_to_pairs(const at::Tensor& w, int64_t head_dim);

/// True when every value of every tensor is exactly a bf16 value, so storing
/// them as bf16 loses nothing (drafters as shipped are).
bool all_bf16_exact(const std::map<std::string, at::Tensor>& params);

/// The float type an export stores the drafter's matrices in: bf16 when that
/// is exact for every parameter, fp32 otherwise.
at::ScalarType export_dtype(const Drafter& d);

/// Refuses a drafter whose sequential head `format` cannot hold: throws
/// InvalidArgument naming `format`, the head and the heads it holds. A "none"
/// head is held as a Markov head with markov_w2 = 0 (both formats apply
/// markov_w2 whenever markov_w1, which the confidence head reads, exists), so
/// it is refused when its markov_w2 is not zero.
void require_representable(const Drafter& d, const std::string& format, const std::vector<SeqHead>& heads);

/// The token row of the target's vocabulary that holds a learned mask
/// embedding in an exported file: `requested` when >= 0 (checked against the
/// vocabulary); else the target's declared mask token; else the highest-id
/// control token that is none of the tokenizer's declared special ids and
/// does not occur in its chat template (a token the target never emits in
/// chat). Throws InvalidArgument when there is no such token.
int64_t choose_mask_row(const io::GGUFFile& target, int64_t requested);

/// The target's token embedding [V, d] and LM head [V, d] (the embedding when
/// tied), dequantized to fp32 exactly as stored. Throws FormatError when the
/// file lacks token_embd.weight.
at::Tensor target_embedding_f32(const io::GGUFFile& target);
at::Tensor target_head_f32(const io::GGUFFile& target);

/// Checks an imported configuration against the target it will run with:
/// hidden size and vocabulary equal, tap layers inside the target. Throws
/// FormatError prefixed with `where`, quoting both values.
void check_import_dims(const DrafterConfig& c, const TargetInfo& target, const std::string& where);

/// The per-format halves of export_drafter / import_drafter
/// (drafter_gguf.cpp, drafter_hf.cpp).
InteropNotes export_gguf(const Drafter& d, const TargetInfo& t, const std::string& path, const ExportOptions& opts);
Drafter import_gguf(const std::string& path, const TargetInfo& t, InteropNotes& notes);
InteropNotes export_hf(const Drafter& d, const TargetInfo& t, const std::string& dir, const ExportOptions& opts);
Drafter import_hf(const std::string& dir, const TargetInfo& t, InteropNotes& notes);

}  // namespace dspark::interop
