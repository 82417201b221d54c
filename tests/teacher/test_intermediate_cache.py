"""Teacher outputs of a step: only the layers a method reads (live forward stopped after
the deepest one), and the opt-in fp16 disk cache of hidden states and attention scores,
on tiny random-weight BERTs."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from transformers import BertConfig, BertForSequenceClassification

from harness.api.capture import capture_attention_scores, transformer_layers
from harness.api.context import StudentContext
from harness.api.method import TeacherLayers, TeacherView
from harness.api.registry import instantiate
from harness.api.students import classifier_config
from harness.common.cache import ArtifactCache
from harness.common.devices import batch_to_device
from harness.config.schema import MethodRecipe, StudentConfig, TrainConfig
from harness.data.features import EncodedSplit, PaddingCollator
from harness.data.metrics import TaskEvaluator
from harness.data.tasks import get_task
from harness.teacher.outputs import (
    INTERMEDIATES_KIND,
    CachedIntermediates,
    IntermediateCacheRequest,
    IntermediateCacheTooLarge,
    TeacherRuntime,
    estimate_bytes,
    forward_to_depth,
    intermediate_cache_spec,
    live_teacher_outputs,
    prepare_intermediates,
)
from harness.training.engine import train_stage

VOCAB, HEADS, TEACHER_LAYERS, TEACHER_HIDDEN = 60, 4, 4, 32
TASK = get_task("rte")


def teacher_config() -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=TEACHER_HIDDEN,
                      num_hidden_layers=TEACHER_LAYERS, num_attention_heads=HEADS,
                      intermediate_size=64, max_position_embeddings=32)


def tiny_teacher() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(classifier_config(teacher_config(), TASK)).eval()


def tiny_split(rows: int = 20) -> EncodedSplit:
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 12, rows)
    return EncodedSplit(name="train",
                        input_ids=[rng.integers(1, VOCAB, length) for length in lengths],
                        token_type_ids=[(np.arange(length) > length // 2).astype(np.int64)
                                        for length in lengths],
                        labels=rng.integers(0, 2, rows), lengths=lengths)


def tinybert(**params):
    return instantiate("tinybert", MethodRecipe(params={
        "general_distillation": False, "augment": False, **params.pop("params", {})},
        **params))


def student_for(method, layers: int = 2):
    shape = StudentConfig(num_layers=layers, hidden_size=16, num_heads=HEADS,
                          intermediate_size=32)
    context = StudentContext(task=TASK, shape_name="tiny", shape=shape,
                             teacher_config=teacher_config())
    torch.manual_seed(1)
    return method.build_student(context), method.extra_modules(context)


def run_intermediate(method, runtime: TeacherRuntime, seed: int = 0, steps: int = 3):
    """The intermediate stage for a few steps; its per-step losses and final weights."""
    stage = next(stage for stage in method.stages(TASK) if stage.name == "intermediate")
    student, extra = student_for(method)
    torch.manual_seed(seed)
    result = train_stage(method=method, stage=stage, student=student, extra=extra,
                         config=TrainConfig(max_steps=steps, batch_size=6, log_every_steps=1),
                         train_split=tiny_split(), eval_split=None,
                         evaluator=TaskEvaluator(TASK), teacher=runtime,
                         accelerator=Accelerator(), seed=seed)
    return result.history, torch.cat([p.detach().flatten() for p in student.parameters()])


def batch_of(split: EncodedSplit, rows) -> dict[str, torch.Tensor]:
    return PaddingCollator(split)(list(rows))


# -- live forward: only what is read ----------------------------------------------------------
def test_forward_to_depth_gives_the_full_forwards_tensors_and_runs_no_deeper():
    teacher = tiny_teacher()
    batch = batch_of(tiny_split(), range(7))
    calls = []
    hooks = [layer.register_forward_hook(lambda *_, n=n: calls.append(n))
             for n, layer in enumerate(transformer_layers(teacher), start=1)]
    with torch.inference_mode():  # both with the score-capturing (eager) attention
        with capture_attention_scores(teacher) as capture:
            full = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           token_type_ids=batch["token_type_ids"], output_hidden_states=True)
            all_scores = list(capture.scores)
        calls.clear()
        with capture_attention_scores(teacher, [1, 2]) as capture:
            found = forward_to_depth(teacher, batch, {0, 2}, depth=2)
            capture.finish_early(2)
            early_scores = list(capture.scores)
    for hook in hooks:
        hook.remove()
    assert calls == [1, 2]  # layers 3 and 4 never ran
    assert set(found) == {0, 2}
    torch.testing.assert_close(found[0], full.hidden_states[0], rtol=0, atol=0)
    torch.testing.assert_close(found[2], full.hidden_states[2], rtol=0, atol=0)
    for early, reference in zip(early_scores, all_scores[:2], strict=True):
        torch.testing.assert_close(early, reference, rtol=0, atol=0)


def test_tinybert_declares_the_mapped_layers_of_its_active_terms():
    teacher_depth = TEACHER_LAYERS
    full = tinybert(params={"mapping": "bottom"})
    stage = {s.name: s for s in full.stages(TASK)}["intermediate"]
    student, _ = student_for(full)
    assert full.teacher_layers(stage, teacher_depth, student) == TeacherLayers(
        frozenset({0, 1, 2}), frozenset({1, 2}))
    no_attention = tinybert(params={"mapping": "bottom"}, disabled_losses=["attention"])
    stage = {s.name: s for s in no_attention.stages(TASK)}["intermediate"]
    layers = no_attention.teacher_layers(stage, teacher_depth, student)
    assert layers == TeacherLayers(frozenset({0, 1, 2}), frozenset())
    assert "attention_scores" not in stage.teacher_outputs
    embedding_only = tinybert(disabled_losses=["attention", "hidden"])
    stage = {s.name: s for s in embedding_only.stages(TASK)}["intermediate"]
    layers = embedding_only.teacher_layers(stage, teacher_depth, student)
    assert layers == TeacherLayers(frozenset({0}), frozenset()) and layers.depth == 0


def test_bert_pkd_declares_only_its_patient_layers():
    method = instantiate("bert-pkd", MethodRecipe())
    stage = method.stages(TASK)[0]
    student = BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=3, num_attention_heads=HEADS,
        intermediate_size=32))
    layers = method.teacher_layers(stage, 6, student)
    assert layers == TeacherLayers(frozenset({2, 4})) and layers.depth == 4


@pytest.mark.slow
@pytest.mark.parametrize("disabled", [[], ["attention"]])
def test_stopped_forward_trains_exactly_like_the_full_forward(disabled):
    """Bottom mapping g = (1, 2) of a 4-layer teacher: layers 3 and 4 never run, and the
    losses and weights are those of the full forward, step for step."""
    method = tinybert(params={"mapping": "bottom"}, disabled_losses=disabled)
    history, weights = run_intermediate(method, TeacherRuntime(model=tiny_teacher()))
    method.teacher_layers = lambda *_: None  # undeclared: the whole teacher, as before
    full_history, full_weights = run_intermediate(method, TeacherRuntime(model=tiny_teacher()))
    assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in full_history],
                                                         rel=1e-6)
    torch.testing.assert_close(weights, full_weights, rtol=1e-5, atol=1e-6)


def test_live_view_keeps_layer_numbering_with_none_for_layers_not_read():
    method = tinybert(params={"mapping": "bottom"})
    stage = {s.name: s for s in method.stages(TASK)}["intermediate"]
    teacher = tiny_teacher()
    batch = batch_of(tiny_split(), range(5))
    layers = TeacherLayers(frozenset({0, 1, 2}), frozenset({1, 2}))
    view = TeacherView()
    with capture_attention_scores(teacher, [1, 2]) as capture, torch.inference_mode():
        live_teacher_outputs(teacher, batch, stage, view, layers, capture, need_logits=False)
    assert len(view.hidden_states) == TEACHER_LAYERS + 1
    assert [h is None for h in view.hidden_states] == [False, False, False, True, True]
    assert [s is None for s in view.attention_scores] == [False, False, True, True]
    assert view.logits is None


def _live_view_under_bf16_training(precision: str | None) -> TeacherView:
    """The live teacher's view of a batch, filled inside the bf16 autocast that a student
    training in bf16 steps under."""
    method = tinybert(params={"mapping": "bottom"})
    stage = {s.name: s for s in method.stages(TASK)}["intermediate"]
    student, _ = student_for(method)
    runtime = TeacherRuntime(model=tiny_teacher(), precision=precision)
    view = TeacherView()
    accelerator = Accelerator()  # the stage puts the teacher on its device, as in a run
    with ExitStack() as stack:
        fill = runtime.open_stage(method, stage, student, tiny_split(), accelerator, stack,
                                  live_logits=False)
        with torch.autocast(accelerator.device.type, dtype=torch.bfloat16):
            fill(batch_to_device(batch_of(tiny_split(), range(6)), accelerator.device), view)
    return view


def test_live_teacher_computes_in_its_inference_precision_not_the_students():
    reference = _live_view_under_bf16_training(None)  # the stage's autocast: bf16
    fp32 = _live_view_under_bf16_training("fp32")
    device = Accelerator().device
    teacher = tiny_teacher().to(device)
    batch = batch_to_device(batch_of(tiny_split(), range(6)), device)
    with torch.no_grad():
        plain = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"], output_hidden_states=True)
    for layer in (1, 2):  # the bottom mapping's hidden states, computed in fp32
        torch.testing.assert_close(fp32.hidden_states[layer], plain.hidden_states[layer])
        assert not torch.allclose(reference.hidden_states[layer].float(),
                                  plain.hidden_states[layer], rtol=1.3e-6, atol=1e-5)
    bf16 = _live_view_under_bf16_training("bf16")
    for layer in (1, 2):
        torch.testing.assert_close(bf16.hidden_states[layer], reference.hidden_states[layer])


# -- the disk cache ---------------------------------------------------------------------------
def request(tmp_path, max_gb: float = 1.0, log=None) -> IntermediateCacheRequest:
    return IntermediateCacheRequest(cache=ArtifactCache(tmp_path / "cache"),
                                    teacher_key="tiny-teacher", max_gb=max_gb, batch_size=8,
                                    log=log or (lambda _: None))


def entries(tmp_path) -> list:
    folder = tmp_path / "cache" / INTERMEDIATES_KIND
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) \
        if folder.exists() else []


def test_cached_rows_equal_the_live_forward_in_fp16_and_the_size_is_known_before(tmp_path):
    teacher, split = tiny_teacher(), tiny_split()
    layers = TeacherLayers(frozenset({0, 2, 3}), frozenset({2, 3}))
    messages: list[str] = []
    cached = prepare_intermediates(request(tmp_path, log=messages.append), teacher, split,
                                   layers, Accelerator())
    teacher.cpu()  # it ran on the accelerator's device; the live forward below runs here
    expected = estimate_bytes(split.lengths, layers, TEACHER_HIDDEN, HEADS)
    assert cached.bytes == expected["total"]  # the size reported before writing
    assert len(entries(tmp_path)) == 5  # one per output and layer
    assert "to write" in messages[0] and "limit 1 GB" in messages[0]  # before writing
    rows = [4, 0, 13, 7]  # any order, any rows
    batch = batch_of(split, rows)
    stage = {s.name: s for s in tinybert().stages(TASK)}["intermediate"]
    live = TeacherView()
    with capture_attention_scores(teacher, [2, 3]) as capture, torch.inference_mode():
        live_teacher_outputs(teacher, batch, stage, live, layers, capture, need_logits=False)
    view = TeacherView()
    cached.fill(view, batch, stage.teacher_outputs)
    mask = batch["attention_mask"].bool()
    pairs = mask[:, None, :, None] & mask[:, None, None, :]
    for number in range(TEACHER_LAYERS + 1):
        if number not in layers.hidden:
            assert view.hidden_states[number] is None
            continue
        ours, reference = view.hidden_states[number], live.hidden_states[number]
        assert ours.dtype == torch.float32 and ours.shape == reference.shape
        torch.testing.assert_close(ours[mask], reference[mask], rtol=1e-3, atol=1e-3)
        assert not ours[~mask].any()
    for number in range(1, TEACHER_LAYERS + 1):
        ours, reference = view.attention_scores[number - 1], live.attention_scores[number - 1]
        if number not in layers.scores:
            assert ours is None
            continue
        real = pairs.expand_as(reference)
        torch.testing.assert_close(ours[real], reference[real], rtol=1e-3, atol=2e-3)
    # a different split (other rows) does not open this entry
    with pytest.raises(ValueError, match="does not hold the rows"):
        CachedIntermediates(cached.paths, tiny_split(rows=7))


def test_too_large_an_entry_is_refused_with_its_size_and_the_limit(tmp_path):
    with pytest.raises(IntermediateCacheTooLarge, match=r"would take .* over "
                       r"teacher\.intermediate_cache\.max_gb = 1e-06 GB"):
        prepare_intermediates(request(tmp_path, max_gb=1e-6), tiny_teacher(), tiny_split(),
                              TeacherLayers(frozenset({1}), frozenset({1})), Accelerator())
    assert entries(tmp_path) == []


@pytest.mark.slow
def test_cached_training_matches_live_within_fp16_and_entries_serve_seeds_and_ablations(
        tmp_path):
    method = tinybert(params={"mapping": "bottom"})
    live_history, live_weights = run_intermediate(method, TeacherRuntime(model=tiny_teacher()))
    runtime = TeacherRuntime(model=tiny_teacher(), intermediate_cache=request(tmp_path))
    history, weights = run_intermediate(method, runtime)
    built = entries(tmp_path)
    assert len(built) == 5  # hidden states 0, 1, 2 and scores 1, 2 of the bottom mapping
    for ours, reference in zip(history, live_history, strict=True):
        for term in ("embedding", "attention", "hidden", "loss"):
            assert ours[term] == pytest.approx(reference[term], rel=5e-3), term
    torch.testing.assert_close(weights, live_weights, rtol=0, atol=1e-3)
    # another seed, other loss weights and lambdas, an ablation reading fewer layers:
    # all served by those entries
    for other, seed in ((tinybert(params={"mapping": "bottom", "layer_weights": [1, 2, 0.5, 1]},
                                  loss_weights={"hidden": 3.0}), 5),
                        (tinybert(params={"mapping": "bottom"},
                                  disabled_losses=["attention"]), 0)):
        run_intermediate(other, TeacherRuntime(model=tiny_teacher(),
                                               intermediate_cache=request(tmp_path)), seed=seed)
        assert entries(tmp_path) == built
    # the top mapping (layers 3, 4) adds only what it lacks: their states and scores
    top = tinybert(params={"mapping": "top"})
    run_intermediate(top, TeacherRuntime(model=tiny_teacher(),
                                         intermediate_cache=request(tmp_path)))
    assert len(entries(tmp_path)) == 9 and set(built) < set(entries(tmp_path))


def test_run_ids_mention_the_cache_only_when_it_is_on_and_used():
    from harness.config.schema import TeacherConfig

    method = tinybert()
    stages = method.stages(TASK)
    off = TeacherConfig(checkpoint="x")
    on = TeacherConfig(checkpoint="x", intermediate_cache={"enabled": True})
    assert intermediate_cache_spec(off, method, stages) == {}
    assert intermediate_cache_spec(on, method, stages) == {
        "intermediate_cache": {"dtype": "float16", "stages": ["intermediate"]}}
    kd = instantiate("kd", MethodRecipe())
    assert intermediate_cache_spec(on, kd, kd.stages(TASK)) == {}


@pytest.mark.e2e
def test_a_suite_with_the_cache_on_records_it_and_shares_entries_across_seeds(
        tiny_suite_file, tmp_path):
    import json

    from harness.experiments.runner import SuiteRunner
    from harness.experiments.suites import load_suite

    plain = ["methods.tinybert.params.general_distillation=false",
             "methods.tinybert.params.augment=false"]

    def runner(overrides):
        return SuiteRunner(load_suite(str(tiny_suite_file), plain + overrides),
                           tmp_path / "results", tmp_path / "cache", log=lambda _: None)

    cached = runner(["teacher.intermediate_cache.enabled=true"])
    assert (cached.planner.run_id("tinybert", "rte", 1)
            != runner([]).planner.run_id("tinybert", "rte", 1))
    assert cached.planner.run_id("kd", "rte", 1) == runner([]).planner.run_id("kd", "rte", 1)
    record = json.loads(cached.run_one("tinybert", "rte", seed=1).path.read_text())
    assert record["status"] == "finished"
    assert record["config"]["teacher"]["intermediate_cache"] == {
        "dtype": "float16", "stages": ["intermediate"]}
    built = entries(tmp_path)
    assert len(built) == 5  # hidden states 0, 1, 2 and scores 1, 2 of the 2-layer teacher
    cached.run_one("tinybert", "rte", seed=2)
    assert entries(tmp_path) == built


@pytest.mark.slow
@pytest.mark.parametrize("cached", [False, True], ids=["live teacher", "cached teacher"])
def test_batches_rounded_up_to_8_tokens_as_on_a_gpu_train_the_same(cached, tmp_path,
                                                                    monkeypatch):
    """On a GPU each batch is padded to a multiple of 8 tokens (``padding_multiple``).  Every
    TinyBERT term reads real tokens only, so without dropout (whose masks would be drawn over
    the wider batch) the losses and weights are those of batches padded to their longest
    row, with the teacher run live or read from its cache."""
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    config = BertConfig(**{**teacher_config().to_dict(), **no_dropout})
    split = tiny_split()
    assert any(length % 8 for length in split.lengths)

    def train(multiple: int, folder) -> tuple[list[dict], torch.Tensor]:
        for module in ("harness.training.batches", "harness.teacher.outputs"):
            monkeypatch.setattr(f"{module}.padding_multiple", lambda _device: multiple)
        method = tinybert(params={"mapping": "bottom"})
        torch.manual_seed(0)
        teacher = BertForSequenceClassification(classifier_config(config, TASK)).eval()
        context = StudentContext(task=TASK, shape_name="tiny", teacher_config=config,
                                 shape=StudentConfig(num_layers=2, hidden_size=16,
                                                     num_heads=HEADS, intermediate_size=32))
        torch.manual_seed(1)
        student, extra = method.build_student(context), method.extra_modules(context)
        for module in student.modules():  # a BERT student is built with BERT's dropout
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        stage = {s.name: s for s in method.stages(TASK)}["intermediate"]
        runtime = TeacherRuntime(model=teacher, intermediate_cache=request(folder)
                                 if cached else None)
        result = train_stage(method=method, stage=stage, student=student, extra=extra,
                             config=TrainConfig(max_steps=3, batch_size=6, log_every_steps=1),
                             train_split=split, eval_split=None, evaluator=TaskEvaluator(TASK),
                             teacher=runtime, accelerator=Accelerator(), seed=0)
        return result.history, torch.cat([p.detach().flatten() for p in student.parameters()])

    history, weights = train(1, tmp_path / "longest row")
    rounded_history, rounded_weights = train(8, tmp_path / "rounded")
    for ours, reference in zip(rounded_history, history, strict=True):
        for term in ("embedding", "attention", "hidden", "loss"):
            assert ours[term] == pytest.approx(reference[term], rel=1e-5), term
    torch.testing.assert_close(rounded_weights, weights, rtol=1e-5, atol=1e-6)
