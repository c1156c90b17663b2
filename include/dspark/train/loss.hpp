// dspark/train/loss.hpp — training targets and the DSpark loss
// (dspark-method.md §4; DSpark arXiv 2607.05147 Eq. 9-12).
//
// Alignment (the classic off-by-one, tested in train_loss_test): for an
// anchor at position p of a sequence `tokens` [L],
//   slot j (0-based, j < γ) predicts tokens[p+1+j]                (label)
//   its target distribution is softmax(LMHead(h^t_{p+j}))          (the target's
//     prediction from the ground-truth prefix ending at p+j)
//   the previous token fed to the sequential head is tokens[p+j]  (teacher
//     forcing; for j = 0 that is the anchor itself)
//   the drafter sees context features of positions < p only
//   slot j is valid iff p+1+j < L, loss_mask[p+1+j] = 1 and every slot
//     before it is valid (cumulative mask).
// Anchors are positions p >= 1 with loss_mask[p] = loss_mask[p+1] = 1.
//
// Draft vocabulary D (DrafterConfig::draft_vocab, |D| = V'): the drafter's
// logits cover D only (DrafterGraph), so its distribution q is the softmax
// over D and zero elsewhere, exactly as at inference. Training then uses
//   p^t restricted to D: p_v = exp(l_v − logsumexp_{u<V} l_u), v ∈ D
//     (the full-vocabulary target distribution at the columns of D; it sums
//     to the in-D mass, see target_logit_stats and target_probs_sub);
//   labels mapped to their row of D (SlotTargets::draft_labels);
//   L1 = Σ_{v∈D} |q_v − p_v| + (1 − Σ_{v∈D} p_v), the mass outside D
//     counting fully (q is 0 there; this term is constant for the drafter);
//   acceptance against the target's full-vocabulary argmax.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "dspark/model/target.hpp"
#include "dspark/train/drafter_graph.hpp"

namespace dspark::train {

/// Loss weights and position decay. Defaults: DSpark's recipe (DeepSpec's
/// config/dspark: 0.1·CE + 0.9·TV-term + 1.0·confidence, w_j = exp(−j/4));
/// its "total variation" term is the L1 distance Σ_v |p^d − p^t| here.
struct LossOptions {
  double w_ce = 0.1;          // cross-entropy against the data token
  double w_l1 = 0.9;          // Σ_v |p^d − p^t| (twice the total variation distance)
  double w_bce = 1.0;         // confidence head vs c* = clamp(1 − ½·L1, 0, 1)
  /// w_j = exp(−j / gamma_decay), j 0-based (slot j is draft position k = j+1,
  /// so exp(−(k−1)/gamma_decay)); 0: every position weighs 1.
  double gamma_decay = 4.0;
  /// On CPU tensors, the fused cross-entropy/L1 kernel; false: ATen ops only,
  /// as on any other device (same values, same gradients to rounding).
  bool kernels = true;
  /// Forward KL(p^t ‖ p^d) = Σ_v p^t_v (log p^t_v − log p^d_v), the
  /// distillation alternative to the L1 term (0: not computed).
  double w_kl = 0.0;
};

/// Positions eligible as anchors: p >= 1, p + 1 < L, loss_mask[p] and
/// loss_mask[p+1] non-zero. Ascending.
std::vector<int64_t> eligible_anchors(std::span<const uint8_t> loss_mask);

/// Up to `max_anchors` distinct eligible anchors drawn uniformly without
/// replacement with `rng`, returned in ascending order (all of them when
/// there are fewer). Deterministic for a given rng state.
std::vector<int64_t> sample_anchors(std::span<const uint8_t> loss_mask, int max_anchors,
                                    std::mt19937_64& rng);

/// Per-slot training targets of N anchors of one sequence.
struct SlotTargets {
  at::Tensor anchors;      // [N] int64   p_i
  at::Tensor prev_tokens;  // [N, γ] int64 tokens[p_i + j] (0 past the end)
  at::Tensor labels;       // [N, γ] int64 tokens[p_i + 1 + j] (0 where invalid)
  at::Tensor target_pos;   // [N, γ] int64 p_i + j, clamped to L−1 (position of the target distribution)
  at::Tensor valid;        // [N, γ] bool  cumulative validity
  /// [N, γ] int64, only with a draft vocabulary D (undefined otherwise): the
  /// row of labels[i][j] in D, −1 where the label lies outside D or the slot
  /// is invalid. Its presence makes dspark_loss work on draft-vocab rows.
  at::Tensor draft_labels;
};

/// Builds the targets for `anchors` (each in [0, L)) with block size `gamma`.
/// With a non-empty `draft_vocab` (strictly ascending token ids, as
/// DrafterConfig::draft_vocab) draft_labels is filled as well; validity does
/// not depend on it. Throws InvalidArgument when the token and mask lengths
/// differ, an anchor is out of range or gamma is outside [1, kMaxGamma].
SlotTargets make_slot_targets(std::span<const TokenId> tokens, std::span<const uint8_t> loss_mask,
                              std::span<const int64_t> anchors, int gamma,
                              std::span<const TokenId> draft_vocab = {});

/// Target distributions p^t [N, γ, V] fp32 (no gradient):
/// softmax(softcap(final_hidden[target_pos] · lm_headᵀ)).
///   final_hidden  [L, d] the target's final-normed hidden states (fp32)
///   lm_head       [V, d] the target's LM head (any floating dtype)
///   target_pos    [N, γ] int64 rows of final_hidden
///   softcap       > 0: logits ← softcap·tanh(logits/softcap) (Gemma); 0: none
///   precision     matmul precision of the head product (fp32 inputs)
///   kernels       bf16 on CPU tensors: dspark's kernel (the target's own
///                 logits arithmetic); false, or off the CPU: ATen matmul
/// Throws InvalidArgument on shape mismatches.
at::Tensor target_probs(const at::Tensor& final_hidden, const at::Tensor& lm_head,
                        const at::Tensor& target_pos, double softcap = 0.0,
                        MatmulPrecision precision = MatmulPrecision::BFloat16, bool kernels = true);

/// Per-position summary of the target's full-vocabulary logits
/// l = softcap(final_hidden · lm_headᵀ) (the product as in target_probs).
struct TargetLogitStats {
  at::Tensor lse;     // [L] logsumexp_v l_v, fp32 (fp64 when final_hidden is fp64)
  at::Tensor argmax;  // [L] int64 argmax_v l_v (the target's greedy token; first on ties)
};

/// Computes TargetLogitStats for every row of final_hidden [L, d] (fp32 or
/// fp64) with lm_head [V, d], in row chunks (never [L, V] at once); no
/// gradient. Throws InvalidArgument on shape mismatches.
TargetLogitStats target_logit_stats(const at::Tensor& final_hidden, const at::Tensor& lm_head,
                                    double softcap = 0.0,
                                    MatmulPrecision precision = MatmulPrecision::BFloat16, bool kernels = true);

/// Target distributions restricted to a subset of the vocabulary (the draft
/// vocabulary): [N, γ, V'] fp32 (fp64 when final_hidden is fp64), no gradient,
///   p[i][j][k] = exp(softcap(final_hidden[target_pos[i][j]] · head_rows[k]) − lse[target_pos[i][j]]),
/// i.e. target_probs at those columns, which sum to the mass inside the subset.
///   head_rows  [V', d] the rows of the LM head for the subset
///              (DrafterGraph::head_rows()), any floating dtype
///   lse        [L] TargetLogitStats::lse of the same final_hidden, computed
///              with the same softcap and precision
/// Throws InvalidArgument on shape mismatches or positions outside [0, L).
at::Tensor target_probs_sub(const at::Tensor& final_hidden, const at::Tensor& head_rows, const at::Tensor& lse,
                            const at::Tensor& target_pos, double softcap = 0.0,
                            MatmulPrecision precision = MatmulPrecision::BFloat16, bool kernels = true);

/// The loss of one group of anchors.
struct LossTerms {
  at::Tensor total;    // scalar: (w_ce·ΣCE + w_l1·ΣL1 + w_bce·ΣBCE + w_kl·ΣKL) / normalizer (differentiable)
  double ce = 0;       // Σ_slots w_j·valid·CE_j   (sums, divide by weight_sum for the mean)
  double l1 = 0;       // Σ_slots w_j·valid·L1_j
  double bce = 0;      // Σ_slots w_j·valid·BCE_j
  double kl = 0;       // Σ_slots w_j·valid·KL_j (0 unless w_kl > 0)
  double weight_sum = 0;  // Σ_slots w_j·valid
  at::Tensor c_star;   // [N, γ] the confidence labels used (detached)
  at::Tensor l1_slot;  // [N, γ] L1_j per slot (detached)
};

/// Σ_j w_j over the valid slots of `valid` [N, γ] (the normalizer of a batch
/// is the sum of this over all of its groups).
double slot_weight_sum(const at::Tensor& valid, double gamma_decay);

/// The DSpark loss (Eq. 9-12) of one group of anchors:
///   CE_j  = −log softmax(logits_j)[label_j]
///   L1_j  = Σ_v |softmax(logits_j)(v) − p^t_j(v)|
///   c*_j  = clamp(1 − ½·L1_j, 0, 1) (no gradient)
///   BCE_j = BCE-with-logits(z_j, c*_j)
///   KL_j  = Σ_v p^t_j(v) (log p^t_j(v) − log softmax(logits_j)(v))  (only when w_kl > 0)
/// each weighted by w_j·valid_j and divided by `normalizer` (> 0; pass the
/// batch's total slot_weight_sum so that summing the totals of all groups
/// gives the w-weighted mean over the batch; <= 0 means this group's own
/// weight sum). `out` comes from DrafterGraph::forward with the targets'
/// prev_tokens; `p_target` is [N, γ, V] from target_probs. `c_star_override`
/// [N, γ], when defined, replaces c* (gradient checks hold it fixed).
/// A group without valid slots yields total = 0.
///
/// With a draft vocabulary (t.draft_labels defined) logits and p_target are
/// [N, γ, V'] over the draft vocabulary D (p_target from target_probs_sub),
/// softmax is over D, and
///   CE_j  = −log softmax(logits_j)[draft_labels_j] where draft_labels_j >= 0;
///           a slot whose label is outside D has no CE term (CE_j = 0; the
///           drafter cannot propose that token) but keeps its L1 and BCE
///           terms, its weight in weight_sum and its validity for the slots
///           after it (the target may still accept a different proposal);
///   L1_j  = Σ_{v∈D} |softmax(logits_j)(v) − p_j(v)| + max(0, 1 − Σ_{v∈D} p_j(v));
///   KL_j  = Σ_{v∈D} p_j(v) (log p_j(v) − log softmax(logits_j)(v)): the target
///           mass outside D (where q = 0, an infinite but constant part of
///           the true KL) is left out; its gradient, q·Σ_{v∈D} p_j(v) − p_j,
///           is the true KL's.
/// Throws InvalidArgument on shape mismatches or labels outside the logits'
/// rows.
LossTerms dspark_loss(const GraphOut& out, const at::Tensor& p_target, const SlotTargets& t,
                      const LossOptions& opts, double normalizer = 0.0,
                      const at::Tensor& c_star_override = {});

/// Teacher-forced acceptance statistics (evaluation).
struct AcceptanceStats {
  int64_t anchors = 0;
  double tau_greedy = 0;   // Σ over anchors of 1 + Σ_k Π_{i≤k} [argmax logits_i = argmax p^t_i]·valid_i
  double tau_sample = 0;   // Σ over anchors of 1 + Σ_k Π_{i≤k} c*_i·valid_i  (expected, T = 1)
  std::vector<int64_t> reached;   // [γ] anchors whose greedy prefix reached slot k
  std::vector<int64_t> accepted;  // [γ] ... and accepted it
  double ce = 0, l1 = 0, bce = 0, kl = 0, weight_sum = 0;  // LossTerms sums, for the mean eval loss terms

  /// Mean τ estimates (0 when no anchors).
  double mean_tau_greedy() const { return anchors ? tau_greedy / anchors : 0; }
  double mean_tau_sample() const { return anchors ? tau_sample / anchors : 0; }
  /// Conditional greedy acceptance per slot: accepted[k] / reached[k].
  std::vector<double> acceptance_by_position() const;
};

/// Adds the anchors of one group to `stats`. A slot that is invalid (past the
/// supervised span) counts as rejected, so τ estimates near the end of a
/// response are conservative. Greedy acceptance of slot k: argmax of
/// out.logits equals argmax of p_target [N, γ, V] (full vocabulary).
void accumulate_acceptance(const GraphOut& out, const at::Tensor& p_target, const SlotTargets& t,
                           const LossTerms& loss, AcceptanceStats& stats);

/// The same with the target's greedy tokens given directly, for drafters
/// with a draft vocabulary: slot k is accepted iff the drafted token
/// vocab_ids[argmax out.logits] equals target_argmax (so a target token
/// outside the draft vocabulary is a rejection).
///   target_argmax  [N, γ] int64 token ids: the target's full-vocabulary
///                  argmax at target_pos (TargetLogitStats::argmax gathered)
///   vocab_ids      [V'] int64 token id of each logit row
///                  (DrafterGraph::vocab_ids()); undefined: rows are ids
/// τ_sample uses loss.c_star as above. Throws InvalidArgument on shape
/// mismatches.
void accumulate_acceptance(const GraphOut& out, const at::Tensor& target_argmax, const at::Tensor& vocab_ids,
                           const SlotTargets& t, const LossTerms& loss, AcceptanceStats& stats);

}  // namespace dspark::train
