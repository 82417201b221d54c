"""Loss functions shared by methods and the teacher stage: the prediction-layer losses, then the
intermediate-layer ones."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.api.capture import token_pair_mask


def gold_loss(logits: torch.Tensor, labels: torch.Tensor, is_regression: bool,
              has_gold: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy to gold classes, or MSE to gold scores for regression tasks.

    ``has_gold`` (bool per row, from batches of augmented data) restricts the mean to rows
    with a gold label; a batch without any gives 0 (with a gradient path, so DDP is happy).
    """
    if has_gold is not None:
        if not bool(has_gold.any()):
            return logits.float().sum() * 0.0
        logits, labels = logits[has_gold], labels[has_gold]
    if is_regression:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels.long())


def soft_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
            temperature: float) -> torch.Tensor:
    """Hinton's T^2-scaled KL(softmax(z_T/T) || softmax(z_S/T)), mean over the batch."""
    student_log_probs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = F.kl_div(student_log_probs, teacher_log_probs, log_target=True, reduction="batchmean")
    return kl * temperature**2


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                       temperature: float = 1.0) -> torch.Tensor:
    """-softmax(z_T/t) . log_softmax(z_S/t), summed over classes, mean over the batch."""
    teacher_probs = F.softmax(teacher_logits.float() / temperature, dim=-1)
    student_log_probs = F.log_softmax(student_logits.float() / temperature, dim=-1)
    return -(teacher_probs * student_log_probs).sum(dim=-1).mean()


def teacher_regression_loss(student_logits: torch.Tensor,
                            teacher_logits: torch.Tensor) -> torch.Tensor:
    """Regression distillation: MSE to the teacher's prediction (never the gold score)."""
    return F.mse_loss(student_logits.squeeze(-1).float(), teacher_logits.squeeze(-1).float())


def soft_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                     temperature: float, is_regression: bool) -> torch.Tensor:
    """Hinton's soft term: :func:`soft_kl`, or :func:`teacher_regression_loss` for
    regression tasks (kd, BERT-PKD, DistilBERT's task distillation)."""
    if is_regression:
        return teacher_regression_loss(student_logits, teacher_logits)
    return soft_kl(student_logits, teacher_logits, temperature)


# -- intermediate layers --------------------------------------------------------------------
# Intermediate-layer distillation losses (TinyBERT's L_embd, L_hidn, L_attn).
#
# Plain functions over tensors, usable by any method.  All of them ignore padding: only
# real tokens (``attention_mask == 1``) enter the averages, so padded positions, whatever
# they hold (zeros, the -1e4 or dtype-minimum mask value in attention scores, garbage),
# neither change the value nor receive gradient.  The authors' TinyBERT code averages over
# every position instead (padded ones included, attention entries holding the mask value
# zeroed first), which dilutes the loss by the amount of padding in the batch; averaging over
# real tokens makes the value independent of how the batch was padded.
#
# The prediction-layer loss is :func:`soft_cross_entropy` above.


def embedding_loss(student_embeddings: torch.Tensor, teacher_embeddings: torch.Tensor,
                   projection: nn.Module | None, attention_mask: torch.Tensor) -> torch.Tensor:
    """L_embd = MSE(E_S W_e, E_T) over real tokens.

    ``student_embeddings`` (batch, length, d'), ``teacher_embeddings`` (batch, length, d),
    ``projection`` the learnable W_e mapping d' -> d (None when d' == d and no projection is
    wanted), ``attention_mask`` (batch, length) with 1 for real tokens.  The mean runs over
    real token positions x the teacher's hidden dimensions.
    """
    return _projected_token_mse(student_embeddings, teacher_embeddings, projection,
                                attention_mask, "embedding_loss")


def hidden_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                projection: nn.Module | None, attention_mask: torch.Tensor) -> torch.Tensor:
    """L_hidn = MSE(H_S W_h, H_T) for one mapped layer pair, over real tokens.

    Same shapes and averaging as :func:`embedding_loss`; H is a Transformer layer's output
    (``hidden_states[m]`` of a transformers model, m >= 1).
    """
    return _projected_token_mse(student_hidden, teacher_hidden, projection, attention_mask,
                                "hidden_loss")


def attention_score_loss(student_scores: torch.Tensor, teacher_scores: torch.Tensor,
                         attention_mask: torch.Tensor) -> torch.Tensor:
    """L_attn = (1/h) sum_i MSE(A_i^S, A_i^T) over pairs of real tokens.

    Scores are (batch, heads, length, length) unnormalised attention scores (see
    :mod:`harness.api.capture`).  Each head's MSE averages over every (query, key) pair of real
    tokens in the batch; pairs with a padded query or key are excluded, so the padding
    mask's huge negative values never enter the loss.  TinyBERT compares head i of the
    student with head i of the teacher, so the head counts must be equal.
    """
    if student_scores.dim() != 4 or teacher_scores.dim() != 4:
        raise ValueError("attention_score_loss expects (batch, heads, length, length) scores, "
                         f"got {tuple(student_scores.shape)} and {tuple(teacher_scores.shape)}")
    student_heads, teacher_heads = student_scores.shape[1], teacher_scores.shape[1]
    if student_heads != teacher_heads:
        raise ValueError(f"attention_score_loss needs as many student heads as teacher heads "
                         f"(student {student_heads}, teacher {teacher_heads}): TinyBERT "
                         "matches attention head by head")
    if student_scores.shape != teacher_scores.shape:
        raise ValueError(f"attention_score_loss: student scores {tuple(student_scores.shape)} "
                         f"and teacher scores {tuple(teacher_scores.shape)} differ in shape")
    batch, _, length, _ = student_scores.shape
    if attention_mask.shape != (batch, length):
        raise ValueError(f"attention_score_loss: attention mask {tuple(attention_mask.shape)} "
                         f"does not match scores (batch {batch}, length {length})")
    # Every head has the same real pairs, so the mean over (head, pair) entries equals the
    # mean over heads of the per-head MSEs.  ``where`` keeps padded entries out of both the
    # forward value and the backward pass (their gradient is exactly 0, whatever they hold,
    # NaN and inf included).  Not boolean indexing: gathering the (batch, heads, L, L)
    # entries and scattering their gradient back cost ~15% of a TinyBERT step on a CPU.
    real_pairs = token_pair_mask(attention_mask)
    difference = torch.where(real_pairs, student_scores.float() - teacher_scores.float(), 0.0)
    return difference.square().sum() / (real_pairs.sum() * student_heads)


def _projected_token_mse(student: torch.Tensor, teacher: torch.Tensor,
                         projection: nn.Module | None, attention_mask: torch.Tensor,
                         name: str) -> torch.Tensor:
    if student.dim() != 3 or teacher.dim() != 3:
        raise ValueError(f"{name} expects (batch, length, hidden) tensors, got "
                         f"{tuple(student.shape)} and {tuple(teacher.shape)}")
    if student.shape[:2] != teacher.shape[:2] or attention_mask.shape != student.shape[:2]:
        raise ValueError(f"{name}: student {tuple(student.shape)}, teacher "
                         f"{tuple(teacher.shape)} and attention mask "
                         f"{tuple(attention_mask.shape)} disagree on (batch, length)")
    real_tokens = attention_mask.bool()
    # Select before projecting: padded rows never reach the projection, so garbage there
    # cannot leak into the projection's gradient (0 * NaN is NaN).
    student_real = student[real_tokens]
    if projection is not None:
        student_real = projection(student_real)
    if student_real.shape[-1] != teacher.shape[-1]:
        raise ValueError(f"{name}: student width {student_real.shape[-1]} (after projection) "
                         f"differs from teacher width {teacher.shape[-1]}; pass a projection")
    return F.mse_loss(student_real.float(), teacher[real_tokens].float())
