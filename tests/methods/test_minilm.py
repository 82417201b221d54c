"""MiniLM's losses against a loop over sequences, heads and query tokens of the paper's
formulas, on the real tokens of each sequence only."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import BertConfig

from harness.api import ConfigError, StudentConfig, StudentContext
from harness.api.capture import capture_attention_scores
from harness.data.tasks import get_task
from methods.minilm import MiniLM, _relation_kl, value_relation

LENGTHS = (5, 3, 4)
HEADS, LENGTH, HEAD_DIM = 2, 5, 4


def _mask() -> torch.Tensor:
    return torch.tensor([[1] * n + [0] * (LENGTH - n) for n in LENGTHS])


def _reference_kl(teacher: torch.Tensor, student: torch.Tensor) -> float:
    """(1 / (A_h |x|)) sum_a sum_t KL(T_{a,t} || S_{a,t}), pooled over the batch's real
    query tokens, each distribution over the sequence's real keys only."""
    total, count = 0.0, 0
    for row, length in enumerate(LENGTHS):
        for head in range(HEADS):
            for query in range(length):
                t = torch.softmax(teacher[row, head, query, :length].double(), -1)
                s = torch.softmax(student[row, head, query, :length].double(), -1)
                total += float((t * (t.log() - s.log())).sum())
                count += 1
    return total / count


def test_attention_term_is_the_papers_kl_over_real_tokens():
    torch.manual_seed(0)
    teacher = torch.randn(len(LENGTHS), HEADS, LENGTH, LENGTH) * 3
    student = torch.randn(len(LENGTHS), HEADS, LENGTH, LENGTH) * 3
    # Whatever sits at padded positions (here garbage) must not matter.
    value = _relation_kl(teacher, student, _mask())
    assert math.isclose(float(value), _reference_kl(teacher, student), rel_tol=1e-5)
    assert float(_relation_kl(teacher, teacher, _mask())) == pytest.approx(0.0, abs=1e-6)


def test_value_relation_term_is_the_kl_of_softmax_v_vt_over_sqrt_dk():
    torch.manual_seed(1)
    teacher_values = torch.randn(len(LENGTHS), HEADS, LENGTH, 8)   # wider teacher heads
    student_values = torch.randn(len(LENGTHS), HEADS, LENGTH, HEAD_DIM)
    expected = _reference_kl(teacher_values @ teacher_values.transpose(-1, -2) / math.sqrt(8),
                             student_values @ student_values.transpose(-1, -2) / 2.0)
    value = _relation_kl(value_relation(teacher_values), value_relation(student_values),
                         _mask())
    assert math.isclose(float(value), expected, rel_tol=1e-5)


def test_captured_scores_give_the_models_own_attention_distributions():
    """The attention term reads softmax(scores) of the captured last layer: the very
    distributions an eager forward returns."""
    from transformers import BertModel

    torch.manual_seed(2)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=HEADS, intermediate_size=32,
                        attn_implementation="eager")
    model = BertModel(config).eval()
    ids = torch.randint(5, 50, (len(LENGTHS), LENGTH))
    with torch.no_grad(), capture_attention_scores(model, record={"values"}) as captured:
        out = model(input_ids=ids, attention_mask=_mask(), output_attentions=True)
    for row, length in enumerate(LENGTHS):
        probabilities = torch.softmax(captured.scores[-1][row, :, :length, :length], -1)
        assert torch.allclose(probabilities, out.attentions[-1][row, :, :length, :length],
                              atol=1e-6)
    assert captured.values[-1].shape == (len(LENGTHS), HEADS, LENGTH, 16 // HEADS)


def test_heads_must_match_the_teacher():
    teacher = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=32)
    shape = StudentConfig(num_layers=1, hidden_size=8, num_heads=2, intermediate_size=16)
    method = MiniLM(MiniLM.Params(), {})
    with pytest.raises(ConfigError, match="2 heads, the teacher 4"):
        method.build_student(StudentContext(task=get_task("rte"), shape_name="1L-8",
                                            shape=shape, teacher_config=teacher))


def test_general_key_ignores_the_task_stage():
    finetune = MiniLM(MiniLM.Params(), {"attention": 1.0, "value_relation": 1.0, "gold": 1.0})
    kd = MiniLM(MiniLM.Params(task_objective="kd", alpha=0.3),
                {"attention": 1.0, "value_relation": 1.0, "gold": 0.7, "soft": 0.3})
    assert finetune.general_key() == kd.general_key()
    ablated = MiniLM(MiniLM.Params(), {"attention": 1.0, "value_relation": 0.0, "gold": 1.0})
    assert ablated.general_key() != finetune.general_key()
