"""Loss functions shared by methods and the teacher stage."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
