"""Student construction: shapes, initialisation from teacher weights, label order."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import BertConfig, BertModel

from harness.api.architectures import Dimensions
from harness.api.context import StudentContext
from harness.api.students import (
    build_bert_student,
    count_parameters,
    evenly_spaced_layers,
    teacher_fit_problem,
)
from harness.assets.checkpoints import TeacherError, check_label_order
from harness.config.schema import StudentConfig
from harness.data.tasks import get_task


def _teacher(layers: int = 4, hidden: int = 32) -> tuple[BertConfig, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return config, BertModel(config).state_dict()


def test_evenly_spaced_layers_end_at_the_top_and_reject_deeper_students():
    assert evenly_spaced_layers(12, 6) == [1, 3, 5, 7, 9, 11]
    assert evenly_spaced_layers(6, 3) == [1, 3, 5]
    assert evenly_spaced_layers(6, 6) == [0, 1, 2, 3, 4, 5]
    assert evenly_spaced_layers(6, 4) == [1, 2, 4, 5]  # halves round up, not to even
    assert evenly_spaced_layers(12, 8) == [1, 2, 4, 5, 7, 8, 10, 11]
    with pytest.raises(ValueError, match="cannot take 7 layers"):
        evenly_spaced_layers(6, 7)


def test_teacher_layer_init_copies_exactly_the_chosen_layers():
    config, state = _teacher(layers=4)
    shape = StudentConfig(num_layers=2, hidden_size=32, num_heads=4, intermediate_size=64,
                          init="teacher_layers", teacher_layers=[0, 3], embedding_init="teacher")
    student = build_bert_student(StudentContext(get_task("rte"), "s", shape, config, state))
    student_state = student.state_dict()
    for student_layer, teacher_layer in enumerate([0, 3]):
        for suffix in ("attention.self.query.weight", "output.dense.weight",
                       "intermediate.dense.bias"):
            copied = student_state[f"bert.encoder.layer.{student_layer}.{suffix}"]
            assert torch.equal(copied, state[f"encoder.layer.{teacher_layer}.{suffix}"])
    assert not torch.equal(student_state["bert.encoder.layer.1.attention.self.query.weight"],
                           state["encoder.layer.1.attention.self.query.weight"])
    for name in ("word_embeddings.weight", "position_embeddings.weight", "LayerNorm.weight",
                 "LayerNorm.bias"):
        assert torch.equal(student_state[f"bert.embeddings.{name}"], state[f"embeddings.{name}"])
    assert torch.equal(student_state["bert.pooler.dense.weight"], state["pooler.dense.weight"])


def test_a_student_copied_from_every_teacher_layer_computes_what_the_teacher_does():
    """Copied layers run under the teacher's activation and layer-norm epsilon (a BERT
    teacher with non-default ones), so a full copy gives the teacher's hidden states."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                        hidden_act="relu", layer_norm_eps=1e-6)
    teacher = BertModel(config).eval()
    shape = StudentConfig(num_layers=2, hidden_size=32, num_heads=4, intermediate_size=64,
                          init="teacher_layers", teacher_layers=[0, 1], embedding_init="teacher")
    student = build_bert_student(StudentContext(get_task("rte"), "s", shape, config,
                                                teacher.state_dict())).eval()
    assert (student.config.hidden_act, student.config.layer_norm_eps) == ("relu", 1e-6)
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        expected = teacher(input_ids=ids).last_hidden_state
        got = student(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    assert torch.allclose(got, expected, atol=1e-6)


def test_teacher_layer_init_with_a_different_width_is_a_clear_error():
    config, state = _teacher(hidden=32)
    shape = StudentConfig(num_layers=2, hidden_size=16, num_heads=4, intermediate_size=32,
                          init="teacher_layers")
    with pytest.raises(ValueError, match=r"copies teacher layers whole.*hidden_size 16 "
                       r"\(the teacher's: 32\), intermediate_size 32 \(the teacher's: 64\)"):
        build_bert_student(StudentContext(get_task("rte"), "s", shape, config, state))


@pytest.mark.parametrize(("fields", "problem"), [
    ({"init": "teacher_layers", "teacher_layers": [0, 6]},
     r"teacher_layers \[6\] do not exist in a 6-layer teacher \(layers 0..5\)"),
    ({"init": "teacher_select", "num_layers": 7, "teacher_layers": None},
     "a 7-layer student cannot take 7 layers of a 6-layer teacher"),
    ({"init": "teacher_layers", "intermediate_size": 32},
     r"intermediate_size 32 \(the teacher's: 64\)"),
    ({"init": "teacher_select", "hidden_size": 16, "num_heads": 8},
     "no wider than the teacher in heads"),
    ({"embedding_init": "teacher", "hidden_size": 16, "intermediate_size": 32},
     r"hidden_size must be the teacher's \(32\), not 16"),
    ({"embedding_init": "teacher_pca", "hidden_size": 48, "num_heads": 4},
     "cannot give 48"),
])
def test_a_shape_that_does_not_fit_its_teacher_is_named_from_the_config_alone(fields, problem):
    """What the planner refuses before any teacher is fine-tuned, from the teacher's
    dimensions only; the same shapes within the teacher's sizes fit."""
    teacher = Dimensions(layers=6, hidden=32, heads=4, intermediate=64)
    base = {"num_layers": 2, "hidden_size": 32, "num_heads": 4, "intermediate_size": 64}
    assert teacher_fit_problem(StudentConfig(**base, init="teacher_layers",
                                             teacher_layers=[0, 5], embedding_init="teacher"),
                               teacher) is None
    assert teacher_fit_problem(StudentConfig(num_layers=6, hidden_size=16, num_heads=2,
                                             intermediate_size=32, init="teacher_select",
                                             embedding_init="teacher_select"), teacher) is None
    found = teacher_fit_problem(StudentConfig(**{**base, **fields}), teacher)
    assert found is not None and re.search(problem, found), found


@pytest.mark.parametrize("embedding_init", ["teacher", "teacher_pca"])
def test_a_teacher_with_separate_embeddings_lends_them_to_a_student_of_another_width(
        embedding_init):
    """ELECTRA embeds narrower than it computes (ELECTRA-small: 128 and 256); a student
    keeps that width and projects it to its own hidden size, so the teacher's embeddings
    are copied (or rotated) whatever the student's hidden size: no refusal, in the builder
    or from the config alone."""
    from transformers import ElectraConfig, ElectraModel

    from harness.api.architectures import dimensions

    torch.manual_seed(0)
    config = ElectraConfig(vocab_size=100, embedding_size=16, hidden_size=32,
                           num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=64)
    state = ElectraModel(config).state_dict()
    for hidden in (24, 48):
        shape = StudentConfig(num_layers=2, hidden_size=hidden, num_heads=4,
                              intermediate_size=48, embedding_init=embedding_init)
        assert teacher_fit_problem(shape, dimensions(config)) is None
        student = build_bert_student(StudentContext(get_task("rte"), "s", shape, config,
                                                    state))
        word = student.electra.embeddings.word_embeddings.weight
        assert word.shape == (100, 16)
        if embedding_init == "teacher":
            assert torch.equal(word, state["embeddings.word_embeddings.weight"])
    # Embeddings as wide as the hidden states follow the student's: a copy must match.
    assert dimensions(ElectraConfig(embedding_size=32, hidden_size=32)).embedding is None
    assert "hidden_size must be the teacher's (32), not 24" in teacher_fit_problem(
        StudentConfig(num_layers=2, hidden_size=24, num_heads=4, intermediate_size=48,
                      embedding_init="teacher"),
        dimensions(ElectraConfig(embedding_size=32, hidden_size=32, num_attention_heads=4)))


def test_pca_embeddings_are_the_teacher_rows_on_its_principal_directions():
    config, state = _teacher(hidden=32)
    shape = StudentConfig(num_layers=1, hidden_size=8, num_heads=2, intermediate_size=16,
                          embedding_init="teacher_pca")
    student = build_bert_student(StudentContext(get_task("sst2"), "s", shape, config, state))
    words = state["embeddings.word_embeddings.weight"]
    projected = student.bert.embeddings.word_embeddings.weight.detach()
    # The projection is orthonormal and spans the top principal subspace: projecting the
    # centred rows keeps at least as much variance as any other 8 coordinates would.
    centred = words - words.mean(0)
    singular = torch.linalg.svdvals(centred)
    kept = ((projected - projected.mean(0)) ** 2).sum()
    assert torch.isclose(kept, (singular[:8] ** 2).sum(), rtol=1e-4)


def test_weight_selection_keeps_whole_heads_evenly_spaced_and_the_same_indices_everywhere():
    config, state = _teacher(layers=4, hidden=32)  # 4 heads of 8, feed-forward 64
    # 2 heads of 8: teacher heads 0 and 2, whole; every other feed-forward unit.
    shape = StudentConfig(num_layers=2, hidden_size=16, num_heads=2, intermediate_size=32,
                          init="teacher_select", teacher_layers=[0, 3],
                          embedding_init="teacher_select")
    student = build_bert_student(StudentContext(get_task("rte"), "s", shape, config, state))
    got = student.state_dict()
    hidden = torch.tensor([*range(0, 8), *range(16, 24)])
    ffn = torch.arange(0, 64, 2)
    for student_layer, teacher_layer in enumerate([0, 3]):
        source, target = f"encoder.layer.{teacher_layer}.", f"bert.encoder.layer.{student_layer}."
        for name, rows, columns in (("attention.self.query.weight", hidden, hidden),
                                    ("attention.output.dense.weight", hidden, hidden),
                                    ("intermediate.dense.weight", ffn, hidden),
                                    ("output.dense.weight", hidden, ffn)):
            assert torch.equal(got[target + name], state[source + name][rows][:, columns])
        for name, index in (("attention.self.value.bias", hidden),
                            ("intermediate.dense.bias", ffn), ("output.LayerNorm.weight", hidden)):
            assert torch.equal(got[target + name], state[source + name][index])
    assert torch.equal(got["bert.embeddings.word_embeddings.weight"],
                       state["embeddings.word_embeddings.weight"][:, hidden])
    assert torch.equal(got["bert.embeddings.LayerNorm.bias"],
                       state["embeddings.LayerNorm.bias"][hidden])
    assert torch.equal(got["bert.pooler.dense.weight"],
                       state["pooler.dense.weight"][hidden][:, hidden])

    # 4 heads of 4: every head, every other dimension inside it.
    shape = shape.model_copy(update={"num_heads": 4})
    student = build_bert_student(StudentContext(get_task("rte"), "s", shape, config, state))
    assert torch.equal(student.state_dict()["bert.encoder.layer.1.attention.self.key.bias"],
                       state["encoder.layer.3.attention.self.key.bias"][::2])


def test_weight_selection_refuses_a_wider_head_and_a_pca_embedding():
    config, state = _teacher(hidden=32)  # heads of 8
    shape = StudentConfig(num_layers=1, hidden_size=16, num_heads=1, intermediate_size=32,
                          init="teacher_select", embedding_init="teacher_select")
    with pytest.raises(ValueError, match="no wider than the teacher"):
        build_bert_student(StudentContext(get_task("rte"), "s", shape, config, state))
    with pytest.raises(ValueError, match="use embedding_init: teacher_select"):
        StudentConfig(num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32,
                      init="teacher_select", embedding_init="teacher_pca")


def test_student_heads_and_labels_follow_the_task():
    config, _ = _teacher()
    shape = StudentConfig(num_layers=2, hidden_size=16, num_heads=4, intermediate_size=32)
    mnli = build_bert_student(StudentContext(get_task("mnli"), "s", shape, config))
    assert mnli.config.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"}
    stsb = build_bert_student(StudentContext(get_task("stsb"), "s", shape, config))
    assert stsb.config.num_labels == 1 and stsb.config.problem_type == "regression"
    counts = count_parameters(mnli)
    embeddings = 100 * 16 + 64 * 16 + 2 * 16
    assert counts["total"] - counts["non_embedding"] == embeddings


def test_label_order_mismatch_stops_the_run():
    config = BertConfig(num_labels=3)
    config.id2label = {0: "contradiction", 1: "neutral", 2: "entailment"}
    with pytest.raises(TeacherError, match="label order mismatch"):
        check_label_order(get_task("mnli"), config, "teacher")
    config.id2label = {0: "entailment", 1: "neutral", 2: "contradiction"}
    check_label_order(get_task("mnli"), config, "teacher")
    with pytest.raises(TeacherError, match="3 outputs"):
        check_label_order(get_task("rte"), config, "teacher")
