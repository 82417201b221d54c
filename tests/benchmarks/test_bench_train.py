"""`python -m benchmarks train`: the minimal loop and TextBrewer do the harness's arithmetic, the
interleaved rounds produce every figure, and the command refuses bad options clearly.

Tiny random-weight BERT teacher and student; no timing assertions."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from transformers import BertConfig, BertForSequenceClassification
from typer.testing import CliRunner

from benchmarks.commands import app
from benchmarks.train import (
    DEFAULT_TEXTBREWER_ENV,
    TEXTBREWER_SCRIPT,
    BenchSetup,
    Interleaver,
    MinimalLoop,
    TrainBenchError,
    TrainBenchSettings,
    fixed_length_split,
    run_benchmark,
    run_harness,
    stage_config,
    summary_lines,
    textbrewer_setup,
)
from harness.api.context import StudentContext
from harness.api.registry import instantiate
from harness.api.students import classifier_config
from harness.config.schema import MethodRecipe, StudentConfig, TrainConfig
from harness.data.features import EncodedSplit
from harness.data.tasks import get_task

TASK = get_task("mrpc")
VOCAB, HEADS = 60, 4
MAPPING = [2, 4]


def tiny_setup(rows: int = 24, seed: int = 0) -> BenchSetup:
    """A 4-layer teacher, a 2-layer student of another width, both with 4 heads; rows of
    different lengths so batches are padded."""
    torch.manual_seed(seed)
    teacher_config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=4,
                                num_attention_heads=HEADS, intermediate_size=32,
                                max_position_embeddings=32)
    teacher = BertForSequenceClassification(classifier_config(teacher_config, TASK))
    method = instantiate("tinybert", MethodRecipe(params={"mapping": MAPPING}), TASK.name)
    stage = next(stage for stage in method.stages(TASK) if stage.name == "intermediate")
    shape = StudentConfig(num_layers=2, hidden_size=8, num_heads=HEADS, intermediate_size=16)
    context = StudentContext(task=TASK, shape_name="tiny", shape=shape,
                             teacher_config=teacher_config)
    student = method.build_student(context)
    extra = method.extra_modules(context)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 12, rows)
    split = EncodedSplit(name="train",
                         input_ids=[rng.integers(1, VOCAB, n) for n in lengths],
                         token_type_ids=[np.zeros(n, dtype=np.int64) for n in lengths],
                         labels=rng.integers(0, 2, rows), lengths=lengths)
    return BenchSetup(method=method, stage=stage,
                      config=TrainConfig(lr=1e-3, weight_decay=0.01, warmup_ratio=0.1,
                                         max_grad_norm=1.0),
                      split=split, teacher=teacher, student=student, extra=extra,
                      mapping=MAPPING, lambdas=[1.0] * 4,
                      weights={"embedding": 1.0, "attention": 1.0, "hidden": 1.0},
                      describe={"suite": "tiny", "task": TASK.name, "student": "tiny",
                                "teacher": "random"})


def settings(**changes) -> TrainBenchSettings:
    values = {"batch_size": 4, "warmup": 0, "rounds": 1, "steps": 1, "textbrewer": False}
    return TrainBenchSettings(**{**values, **changes})


def minimal_for(setup: BenchSetup, config: TrainConfig,
                device: torch.device) -> MinimalLoop:
    return MinimalLoop(copy.deepcopy(setup.teacher), copy.deepcopy(setup.student),
                       copy.deepcopy(setup.extra), setup.mapping, setup.lambdas, setup.weights,
                       config, device, seed=0)


@pytest.mark.slow
def test_minimal_loop_step_equals_the_harness_engine_step():
    """One engine step and one minimal-loop step from identical weights on the identical
    batch (dropout on, same seed): same losses, same updated student and projections."""
    setup = tiny_setup()
    chosen = settings()
    config = stage_config(setup, chosen)
    accelerator = Accelerator()  # both loops on its device, as `benchmarks train` runs them
    minimal = minimal_for(setup, config, accelerator.device)
    interleaver = Interleaver(0, 1, 1, {"minimal": minimal.run}, accelerator.device, seed=0)
    harness_losses = run_harness(setup, config, interleaver, accelerator, seed=0)
    minimal.close()

    assert len(interleaver.batches) == 1
    assert interleaver.batches[0]["attention_mask"].eq(0).any()  # padding is exercised
    assert set(harness_losses) == {"embedding", "attention", "hidden", "total"}
    for term, value in harness_losses.items():
        assert value == pytest.approx(minimal.first_losses[term], rel=1e-6, abs=1e-7), term
    assert minimal.steps == 1
    for name, parameter in setup.student.named_parameters():
        torch.testing.assert_close(parameter, dict(minimal.student.named_parameters())[name],
                                   rtol=1e-5, atol=1e-6, msg=name)
    for name, parameter in setup.extra.named_parameters():
        torch.testing.assert_close(parameter,
                                   dict(minimal.projections.named_parameters())[name],
                                   rtol=1e-5, atol=1e-6, msg=name)
    # The step did train: the student moved away from its copy's starting weights.
    fresh = tiny_setup()
    assert not torch.equal(setup.student.bert.embeddings.word_embeddings.weight.cpu(),
                           fresh.student.bert.embeddings.word_embeddings.weight)
    # and the engine's method is left as it was (no instrumentation behind).
    assert "prepare_batch" not in vars(setup.method)
    assert "compute_losses" not in vars(setup.method)


@pytest.mark.e2e
def test_interleaved_rounds_report_every_side_and_ratio():
    chosen = settings(warmup=1, rounds=2, steps=2)
    record = run_benchmark(tiny_setup(), chosen, log=lambda message: None)
    times = record["times"]
    assert set(times) == {"harness", "minimal"}
    assert len(times["harness"]) == len(times["minimal"]) == 4
    assert all(value > 0 for values in times.values() for value in values)
    assert record["setup"]["schedule_steps"] == chosen.total_steps == 6
    assert len(record["shapes"]["padded_lengths"]) == 4
    losses = record["first_losses"]
    for term in ("embedding", "attention", "hidden", "total"):
        assert losses["harness"][term] == pytest.approx(losses["minimal"][term], rel=1e-6)
    ratio = record["summary"]["ratios"]["minimal"]
    assert ratio["target"] == 1.10 and ratio["paired_median"] > 0
    text = "\n".join(summary_lines(record))
    assert "harness / minimal" in text and ("PASS" in text or "MISS" in text)
    assert "harness / TextBrewer" in text and "not run" in text
    assert "median ms/step" in text and "examples/s" in text
    json.dumps(record)  # the record is JSON-serialisable


def test_fixed_length_split_gives_unpadded_rows_of_the_length():
    split = tiny_setup().split
    fixed = fixed_length_split(split, 7)
    assert all(len(row) == 7 for row in fixed.input_ids)
    assert all(len(row) == 7 for row in fixed.token_type_ids)
    assert (fixed.lengths == 7).all()
    assert all(row[0] == original[0] for row, original in zip(fixed.input_ids, split.input_ids,
                                                                strict=True))


@pytest.mark.e2e
@pytest.mark.parametrize(("args", "message"), [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--warmup", "-1"], "--warmup cannot be negative"),
    (["--seq", "1"], "--seq must be at least 2"),
    (["--teacher-outputs", "cached"], "not supported by `bench train`"),
    (["--teacher-outputs", "disk"], "must be live or cached"),
    (["--textbrewer-env", "/nonexistent/env"], "make bench-env"),
])
def test_cli_refuses_bad_options(args, message):
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


@pytest.mark.e2e
def test_textbrewer_side_matches_the_minimal_loop(tmp_path):
    """One TextBrewer step through scripts/textbrewer_step.py (in .venv-textbrewer) gives
    the minimal loop's first-step losses on the same batch; without that environment the
    benchmark says how to build it."""
    chosen = settings(textbrewer=True)
    if not (DEFAULT_TEXTBREWER_ENV / "bin" / "python").exists():
        with pytest.raises(TrainBenchError, match="make bench-env"):
            chosen.textbrewer_python()
        return
    setup = tiny_setup()
    config = stage_config(setup, chosen)
    minimal = minimal_for(setup, config, torch.device("cpu"))
    batch = minimal_batch(setup)
    minimal.run([batch])
    minimal.close()
    torch.save(textbrewer_setup(setup, config, torch.device("cpu"), tmp_path / "out", 0),
               tmp_path / "setup.pt")
    torch.save([batch], tmp_path / "batches.pt")
    done = subprocess.run(
        [str(chosen.textbrewer_python()), str(TEXTBREWER_SCRIPT), "run", "--setup",
         str(tmp_path / "setup.pt"), "--batches", str(tmp_path / "batches.pt"),
         "--warmup", "0", "--steps", "1"],
        capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1",
                                                         "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(reply["times"]) == 1 and reply["textbrewer"]
    for term in ("embedding", "attention", "hidden", "total"):
        assert reply["losses"][term] == pytest.approx(minimal.first_losses[term], rel=1e-5)


def minimal_batch(setup: BenchSetup) -> dict[str, torch.Tensor]:
    """A padded batch of the setup's first four rows, as the harness's collator makes it."""
    from harness.data.features import PaddingCollator

    batch = PaddingCollator(setup.split)(list(range(4)))
    assert batch["attention_mask"].eq(0).any()
    return {name: batch[name] for name in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.mark.parametrize("precision", ["auto", "bf16", "fp16"])
def test_the_engine_side_steps_in_fp32_whatever_the_suite_says(precision):
    """The minimal loop and TextBrewer step in fp32: the engine's stage must too, not in the
    suite's precision (glue-cpu's ``auto`` reached the engine unresolved and ran in fp16)."""
    setup = tiny_setup()
    setup = dataclasses.replace(setup, config=setup.config.model_copy(
        update={"mixed_precision": precision}))
    assert stage_config(setup, settings()).mixed_precision == "no"
