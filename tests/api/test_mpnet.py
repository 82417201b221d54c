"""MPNet teachers and students: the attention scores (relative position bias included) and
the queries, keys and values the harness captures, against a hand computation on a tiny
random MPNet; students copied from MPNet layers keep the relative bias; a BERT student
learns from an MPNet teacher through the harness's own runner."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from transformers import AutoConfig, BertConfig, MPNetConfig, MPNetModel

from harness.api.architectures import dimensions
from harness.api.capture import capture_attention_scores
from harness.api.context import StudentContext
from harness.api.students import build_encoder_student, student_config, teacher_fit_problem
from harness.config.schema import ConfigError, StudentConfig
from harness.data.tasks import get_task
from harness.experiments.kept_students import kept_student
from harness.experiments.planner import Variation
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from harness.teacher.outputs import forward_to_depth
from tests.api.test_architectures import mpnet_tokenizer, write_tiny_encoder
from tests.conftest import tiny_suite_dict

HIDDEN, LAYERS, HEADS, VOCAB = 32, 2, 4, 100
HEAD_DIM = HIDDEN // HEADS
LENGTHS = (40, 23, 9)  # real tokens per row: distances up to 39 reach the logarithmic buckets
PAD = 1  # MPNet's padding index


def tiny_mpnet() -> MPNetModel:
    """A random 2-layer MPNet whose relative attention bias is large enough to matter (the
    default initialisation's std 0.02 would hide a missing bias in the tolerance)."""
    torch.manual_seed(0)
    config = MPNetConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         intermediate_size=64, vocab_size=VOCAB,
                         relative_attention_num_buckets=32)
    model = MPNetModel(config).eval()
    with torch.no_grad():
        model.encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
    return model


def padded_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    width = max(LENGTHS)
    ids = torch.randint(5, VOCAB, (len(LENGTHS), width), generator=generator)
    mask = (torch.arange(width)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    ids[mask == 0] = PAD
    return {"input_ids": ids, "attention_mask": mask}


def bucket(relative: int) -> int:
    """MPNet's bucket of (key position - query position): 16 buckets for keys at or before
    the query, 16 after; within each, distances 0-7 exactly, then logarithmic up to 128."""
    distance = abs(relative)
    base = 16 if relative > 0 else 0
    if distance < 8:
        return base + distance
    return base + min(15, 8 + int(math.log(distance / 8) / math.log(128 / 8) * 8))


def hand_position_bias(table: torch.Tensor, length: int) -> torch.Tensor:
    """(heads, L, L): the learnt value of each (query, key) pair's bucket, head by head."""
    bias = torch.empty(table.shape[1], length, length)
    for query in range(length):
        for key in range(length):
            bias[:, query, key] = table[bucket(key - query)]
    return bias


def hand_projection(linear: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """(batch, heads, L, head_dim): the projection's rows of each head applied to ``hidden``."""
    heads = []
    for head in range(HEADS):
        rows = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)
        heads.append(hidden @ linear.weight[rows].T + linear.bias[rows])
    return torch.stack(heads, dim=1)


def test_scores_and_projections_match_a_hand_computation_with_the_relative_bias() -> None:
    model = tiny_mpnet()
    batch = padded_batch()
    with torch.no_grad():
        states = model(**batch, output_hidden_states=True).hidden_states
        with capture_attention_scores(model, record=("queries", "keys", "values")) as capture:
            model(**batch)
    width = max(LENGTHS)
    bias = hand_position_bias(model.encoder.relative_attention_bias.weight.detach(), width)
    # the bucket formula written out is the model's own
    torch.testing.assert_close(model.encoder.compute_position_bias(states[0])[0], bias,
                               rtol=0, atol=0)
    assert len(capture.scores) == LAYERS
    for layer in range(LAYERS):
        attention = model.encoder.layer[layer].attention.attn
        hidden = states[layer]
        queries, keys, values = (hand_projection(getattr(attention, name), hidden)
                                 for name in ("q", "k", "v"))
        for name, expected in (("queries", queries), ("keys", keys), ("values", values)):
            got = getattr(capture, name)[layer]
            assert got.shape == (len(LENGTHS), HEADS, width, HEAD_DIM)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        scores = capture.scores[layer]
        assert scores.shape == (len(LENGTHS), HEADS, width, width)
        plain = queries @ keys.transpose(-1, -2) / math.sqrt(HEAD_DIM)
        for row, length in enumerate(LENGTHS):
            real = scores[row, :, :length, :length]
            torch.testing.assert_close(real, (plain + bias)[row, :, :length, :length],
                                       rtol=0, atol=1e-5)
            # the bias is really in them: without it they are far off
            assert (real - plain[row, :, :length, :length]).abs().max() > 0.5
            if length < width:
                assert (scores[row, :, :, length:] < -1e30).all(), "padded keys: mask value"


def test_captured_scores_are_the_models_own_and_leave_its_outputs_unchanged() -> None:
    """softmax(scores) is MPNet's own attention distribution, bit for bit, in fp32 and
    under bf16 autocast; capturing changes nothing the model computes."""
    model = tiny_mpnet()
    batch = padded_batch()
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            plain = model(**batch, output_attentions=True)
            with capture_attention_scores(model) as capture:
                captured = model(**batch, output_attentions=True)
        assert torch.equal(captured.last_hidden_state, plain.last_hidden_state)
        for scores, probabilities in zip(capture.scores, plain.attentions, strict=True):
            assert scores.dtype == probabilities.dtype
            assert torch.equal(torch.softmax(scores, dim=-1), probabilities)


def test_a_students_scores_carry_gradients_and_an_early_stop_sees_its_layers() -> None:
    model = tiny_mpnet().train()
    batch = padded_batch()
    with capture_attention_scores(model, record=("values",)) as capture:
        model(**batch)
    (capture.scores[1].masked_fill(capture.scores[1] < -1e30, 0).sum()
     + capture.values[1].sum()).backward()
    attention = model.encoder.layer[1].attention.attn
    assert attention.q.weight.grad.abs().sum() > 0 and attention.v.weight.grad.abs().sum() > 0
    assert model.encoder.relative_attention_bias.weight.grad.abs().sum() > 0
    # the teacher's early stop (forward_to_depth) with capture of its first layer only
    model.eval()
    with torch.no_grad(), capture_attention_scores(model, layers=[1]) as capture:
        forward_to_depth(model, batch, {1}, depth=1)
        capture.finish_early(1)
    assert capture.layer(1).shape == (len(LENGTHS), HEADS, max(LENGTHS), max(LENGTHS))


def _teacher_state(model: MPNetModel) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def test_students_copied_from_mpnet_layers_keep_the_relative_bias() -> None:
    teacher = tiny_mpnet()
    state = _teacher_state(teacher)
    copied = StudentConfig(num_layers=1, hidden_size=HIDDEN, num_heads=HEADS,
                           intermediate_size=64, init="teacher_layers", teacher_layers=[1],
                           embedding_init="teacher")
    student = build_encoder_student(StudentContext(get_task("rte"), "s", copied,
                                                   teacher.config, state, pooling="mean"))
    assert student.config.model_type == "mpnet"
    bias = student.base_model.encoder.relative_attention_bias.weight
    assert torch.equal(bias, teacher.encoder.relative_attention_bias.weight)
    # with half the heads (weight selection), the chosen heads' columns
    narrow = copied.model_copy(update={"hidden_size": 16, "num_heads": 2,
                                       "intermediate_size": 32, "init": "teacher_select",
                                       "embedding_init": "teacher_select"})
    selected = build_encoder_student(StudentContext(get_task("rte"), "s", narrow,
                                                    teacher.config, state, pooling="mean"))
    assert torch.equal(selected.base_model.encoder.relative_attention_bias.weight,
                       teacher.encoder.relative_attention_bias.weight[:, ::2])
    # and its layer adds the teacher's bias to its scores, as computed by hand from the
    # teacher's second layer and bias table on the student's own layer input
    batch = padded_batch()
    base = student.base_model.eval()
    with torch.no_grad():
        states = base(**batch, output_hidden_states=True).hidden_states
        with capture_attention_scores(base) as got:
            base(**batch)
    attention = teacher.encoder.layer[1].attention.attn
    expected = (hand_projection(attention.q, states[0])
                @ hand_projection(attention.k, states[0]).transpose(-1, -2) / math.sqrt(HEAD_DIM)
                + hand_position_bias(teacher.encoder.relative_attention_bias.weight.detach(),
                                     max(LENGTHS)))
    real = slice(0, LENGTHS[0])
    torch.testing.assert_close(got.scores[0][0, :, real, real], expected[0, :, real, real],
                               rtol=0, atol=1e-5)


def test_a_bert_student_of_an_mpnet_teacher_reads_its_vocabulary() -> None:
    teacher_config = AutoConfig.for_model("mpnet", vocab_size=30527, hidden_size=HIDDEN,
                                          num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                          intermediate_size=64)
    shape = StudentConfig(num_layers=1, hidden_size=16, num_heads=HEADS, intermediate_size=32,
                          architecture="bert")
    config = student_config(shape, teacher_config, get_task("rte"), "cls")
    assert isinstance(config, BertConfig)
    assert (config.vocab_size, config.pad_token_id) == (30527, PAD)
    assert config.max_position_embeddings == teacher_config.max_position_embeddings
    teacher = dimensions(teacher_config)
    assert teacher_fit_problem(shape, teacher) is None
    # a BERT cannot hold an MPNet's layers or embeddings: refused with what to do
    for change in ({"embedding_init": "teacher_pca"},
                   {"hidden_size": HIDDEN, "intermediate_size": 64, "init": "teacher_layers"}):
        problem = teacher_fit_problem(shape.model_copy(update=change), teacher)
        assert problem is not None and "architecture: bert" in problem \
            and "mpnet" in problem, change
    # the default (the teacher's architecture) stays out of the shape's identity
    assert "architecture" not in shape.model_copy(update={"architecture": "teacher"}).model_dump()
    assert shape.model_dump()["architecture"] == "bert"


@pytest.fixture(scope="module")
def mpnet_runner(tiny_data_dir, tmp_path_factory) -> SuiteRunner:
    """A tiny random MPNet teacher (its tokenizer laid out as all-mpnet-base-v2's) and a
    tiny BERT student shape, RTE only, 2 steps a stage."""
    root = tmp_path_factory.mktemp("mpnet")
    teacher = write_tiny_encoder(root / "teacher", "mpnet")
    suite = tiny_suite_dict(tiny_data_dir, teacher, steps=2)
    suite["tasks"] = ["rte"]
    suite["students"]["tiny-bert"] = {"num_layers": 2, "hidden_size": 16, "num_heads": HEADS,
                                      "intermediate_size": 32, "architecture": "bert"}
    suite["default_student"] = "tiny-bert"
    path = root / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    return SuiteRunner(load_suite(str(path)), root / "results", root / "cache",
                       log=lambda _: None, save_students=True)


@pytest.mark.e2e
@pytest.mark.parametrize("method", ["kd", "tinybert", "minilm"])
def test_a_bert_student_learns_from_an_mpnet_teacher(method, mpnet_runner) -> None:
    """kd (logits), tinybert (general distillation on the pre-trained MPNet, then its
    attention scores with the relative bias and hidden states) and minilm (last-layer
    scores and values) train a BERT student of an MPNet teacher to a finite score."""
    outcome = mpnet_runner.run_one(method, "rte", seed=1)
    assert outcome.status == "finished", outcome
    assert math.isfinite(outcome.main_score)
    record = outcome.record
    assert record.config["student"]["architecture"] == "bert"
    assert all(math.isfinite(value) for stage in record.stages
               for value in stage.final_losses.values())
    kept = AutoConfig.from_pretrained(kept_student(mpnet_runner.cache, record.run_id))
    assert kept.model_type == "bert" and kept.vocab_size == len(mpnet_tokenizer())


@pytest.mark.e2e
def test_a_bert_student_copied_from_mpnet_layers_is_refused_before_training(mpnet_runner
                                                                           ) -> None:
    with pytest.raises(ConfigError, match="architecture: bert"):
        mpnet_runner.run_one("bert-pkd", "rte", seed=1,
                             variation=Variation.of(student="tiny-bert"))
    assert not list(mpnet_runner.store.root.rglob("bert-pkd/**/*.json"))
