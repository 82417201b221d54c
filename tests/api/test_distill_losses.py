"""TinyBERT intermediate losses against explicit loop computations of their formulas."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.api import losses
from harness.api.losses import (
    attention_score_loss,
    embedding_loss,
    hidden_loss,
    soft_cross_entropy,
)

BATCH, LENGTH, STUDENT_WIDTH, TEACHER_WIDTH, HEADS = 3, 6, 5, 8, 2
LENGTHS = (6, 3, 4)
MASK_MINIMUM = torch.finfo(torch.float32).min  # what transformers' eager mask adds


def attention_mask() -> torch.Tensor:
    return (torch.arange(LENGTH)[None, :] < torch.tensor(LENGTHS)[:, None]).long()


def fill_padding(tensor: torch.Tensor, value: float, token_dims: int = 1) -> torch.Tensor:
    """A copy with every padded position set to ``value``: rows past each length for
    token tensors (token_dims=1), padded queries or keys for score tensors (token_dims=2)."""
    filled = tensor.detach().clone()
    for row, length in enumerate(LENGTHS):
        if token_dims == 1:
            filled[row, length:] = value
        else:
            filled[row, :, length:, :] = value
            filled[row, :, :, length:] = value
    return filled.requires_grad_(tensor.requires_grad)


def loop_projected_mse(student: torch.Tensor, teacher: torch.Tensor,
                       projection: nn.Linear) -> torch.Tensor:
    """sum over real tokens t and teacher dims j of ((W x_t + b)_j - y_tj)^2 / count."""
    total, count = torch.zeros(()), 0
    for row, length in enumerate(LENGTHS):
        for token in range(length):
            for out_dim in range(TEACHER_WIDTH):
                projected = (projection.weight[out_dim] * student[row, token]).sum() \
                    + projection.bias[out_dim]
                total = total + (projected - teacher[row, token, out_dim]) ** 2
                count += 1
    return total / count


def loop_attention_mse(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """(1/h) sum over heads of the head's mean squared error over real (query, key) pairs."""
    per_head = []
    for head in range(student.shape[1]):
        total, count = torch.zeros(()), 0
        for row, length in enumerate(LENGTHS):
            for query in range(length):
                for key in range(length):
                    difference = student[row, head, query, key] - teacher[row, head, query, key]
                    total = total + difference**2
                    count += 1
        per_head.append(total / count)
    return sum(per_head) / len(per_head)


@pytest.fixture
def token_tensors() -> tuple[torch.Tensor, torch.Tensor, nn.Linear]:
    torch.manual_seed(0)
    student = torch.randn(BATCH, LENGTH, STUDENT_WIDTH, requires_grad=True)
    teacher = torch.randn(BATCH, LENGTH, TEACHER_WIDTH)
    projection = nn.Linear(STUDENT_WIDTH, TEACHER_WIDTH)
    return student, teacher, projection


@pytest.fixture
def score_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher scores as captured: padded keys carry the mask minimum."""
    torch.manual_seed(1)
    keys_padded = ~attention_mask().bool()[:, None, None, :]
    student = torch.randn(BATCH, HEADS, LENGTH, LENGTH) * 3
    teacher = torch.randn(BATCH, HEADS, LENGTH, LENGTH) * 3
    student = student.masked_fill(keys_padded, MASK_MINIMUM).requires_grad_()
    teacher = teacher.masked_fill(keys_padded, MASK_MINIMUM)
    return student, teacher


@pytest.mark.parametrize("loss_function", [embedding_loss, hidden_loss])
def test_token_losses_equal_the_loop_formula(token_tensors, loss_function):
    student, teacher, projection = token_tensors
    value = loss_function(student, teacher, projection, attention_mask())
    expected = loop_projected_mse(student, teacher, projection)
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6)
    # Averaging over all positions (the authors' code) would give a different number here.
    assert not torch.isclose(value, nn.functional.mse_loss(projection(student), teacher))


@pytest.mark.parametrize("padding_value", [0.0, -1e4, 1e30, float("nan"), float("inf")])
@pytest.mark.parametrize("loss_function", [embedding_loss, hidden_loss])
def test_token_losses_ignore_whatever_padding_holds(token_tensors, loss_function,
                                                    padding_value):
    student, teacher, projection = token_tensors
    clean = loss_function(student, teacher, projection, attention_mask())
    clean_grad = torch.autograd.grad(clean, [projection.weight, projection.bias])
    dirty_student = fill_padding(student, padding_value)
    dirty = loss_function(dirty_student, fill_padding(teacher, -padding_value), projection,
                          attention_mask())
    dirty_grad = torch.autograd.grad(dirty, [projection.weight, projection.bias,
                                             dirty_student])
    torch.testing.assert_close(dirty, clean, rtol=0, atol=0)
    for ours, reference in zip(dirty_grad[:2], clean_grad, strict=True):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0)
    student_grad = dirty_grad[2]
    assert torch.isfinite(student_grad).all()
    assert (student_grad[1, 3:] == 0).all() and (student_grad[1, :3] != 0).any()


@pytest.mark.parametrize("loss_function", [embedding_loss, hidden_loss])
def test_token_loss_gradient_reaches_the_projection_as_the_formula_says(token_tensors,
                                                                         loss_function):
    student, teacher, projection = token_tensors
    ours = torch.autograd.grad(loss_function(student, teacher, projection, attention_mask()),
                               [projection.weight, projection.bias, student])
    reference = torch.autograd.grad(loop_projected_mse(student, teacher, projection),
                                    [projection.weight, projection.bias, student])
    assert ours[0].abs().sum() > 0 and ours[1].abs().sum() > 0
    for mine, theirs in zip(ours, reference, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_token_loss_without_projection_needs_equal_widths(token_tensors):
    _, teacher, _ = token_tensors
    same_width = torch.randn(BATCH, LENGTH, TEACHER_WIDTH)
    value = hidden_loss(same_width, teacher, None, attention_mask())
    real = attention_mask().bool()
    torch.testing.assert_close(value, ((same_width - teacher)[real] ** 2).mean())
    with pytest.raises(ValueError, match=r"student width 5 .* teacher width 8; pass a projection"):
        hidden_loss(torch.randn(BATCH, LENGTH, STUDENT_WIDTH), teacher, None, attention_mask())
    with pytest.raises(ValueError, match="disagree on"):
        embedding_loss(same_width, teacher, None, attention_mask()[:, :4])


def test_attention_loss_equals_the_loop_formula(score_tensors):
    student, teacher = score_tensors
    value = attention_score_loss(student, teacher, attention_mask())
    expected = loop_attention_mse(student, teacher)
    assert torch.isfinite(value)
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6)


def test_attention_loss_averages_per_head_then_over_heads():
    """Heads with different errors: (1/h) sum_i MSE_i, with MSE_i over real pairs only."""
    mask = torch.tensor([[1, 1, 0]])
    student = torch.zeros(1, 2, 3, 3)
    teacher = torch.zeros(1, 2, 3, 3)
    teacher[0, 0, :2, :2] = 2.0  # head 0: squared error 4 on each of the 4 real pairs
    teacher[0, 1, 0, 0] = 4.0  # head 1: squared error 16 on one of 4 pairs -> MSE 4
    teacher[0, :, 2, :] = 1e6  # padded query row
    teacher[0, :, :, 2] = -1e4  # padded key column
    value = attention_score_loss(student, teacher, mask)
    torch.testing.assert_close(value, torch.tensor((4.0 + 4.0) / 2))


@pytest.mark.parametrize("padding_value", [-1e4, MASK_MINIMUM, float("-inf"), float("nan"),
                                           123.0])
def test_attention_loss_ignores_padded_queries_and_keys(score_tensors, padding_value):
    student, teacher = score_tensors
    clean = attention_score_loss(student, teacher, attention_mask())
    (clean_grad,) = torch.autograd.grad(clean, student)
    dirty_student = fill_padding(student, padding_value, token_dims=2)
    dirty = attention_score_loss(dirty_student, fill_padding(teacher, 7.0, token_dims=2),
                                 attention_mask())
    (dirty_grad,) = torch.autograd.grad(dirty, dirty_student)
    torch.testing.assert_close(dirty, clean, rtol=0, atol=0)
    torch.testing.assert_close(dirty_grad, clean_grad, rtol=0, atol=0)
    assert torch.isfinite(dirty_grad).all()
    assert (dirty_grad[1, :, 3:, :] == 0).all() and (dirty_grad[1, :, :, 3:] == 0).all()
    assert (dirty_grad[1, :, :3, :3] != 0).any()


def test_attention_loss_gradient_matches_the_loop_formula(score_tensors):
    student, teacher = score_tensors
    (ours,) = torch.autograd.grad(attention_score_loss(student, teacher, attention_mask()),
                                  student)
    (reference,) = torch.autograd.grad(loop_attention_mse(student, teacher), student)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-7)


def test_attention_loss_shape_errors(score_tensors):
    student, teacher = score_tensors
    with pytest.raises(ValueError, match=r"as many student heads as teacher heads "
                                         r"\(student 2, teacher 4\)"):
        attention_score_loss(student, torch.zeros(BATCH, 4, LENGTH, LENGTH), attention_mask())
    with pytest.raises(ValueError, match="differ in shape"):
        attention_score_loss(student, teacher[:, :, :4, :4], attention_mask())
    with pytest.raises(ValueError, match="does not match scores"):
        attention_score_loss(student, teacher, attention_mask()[:, :5])
    with pytest.raises(ValueError, match="expects"):
        attention_score_loss(student[0], teacher[0], attention_mask())


def test_prediction_loss_is_the_shared_soft_cross_entropy():
    assert soft_cross_entropy is losses.soft_cross_entropy
