"""The glue-base suite: an MPNet-base teacher (12L-768) and TinyBERT's 4L-312 student, checked
on configs (no 438 MB checkpoint is read): the shapes it plans, and the teacher / student
parameter ratio beside the paper's 7.5x."""

from __future__ import annotations

import pytest
import torch
from transformers import MPNetConfig

from harness.api.pooling import with_pooling
from harness.api.students import count_parameters, new_sequence_classifier, resolve_teacher_sizes
from harness.assets.checkpoints import Checkpoint
from harness.bench import efficiency
from harness.bench.efficiency import build_student, load_teacher, published_efficiency
from harness.experiments.suites import load_suite

# all-mpnet-base-v2's config.json (the sizes the asset's checksummed config holds).
MPNET_BASE = {"vocab_size": 30527, "hidden_size": 768, "num_hidden_layers": 12,
              "num_attention_heads": 12, "intermediate_size": 3072,
              "max_position_embeddings": 514, "relative_attention_num_buckets": 32,
              "layer_norm_eps": 1e-5, "pad_token_id": 1}


@pytest.fixture(scope="module")
def suite():
    return load_suite("glue-base")


@pytest.fixture(scope="module")
def teacher_config() -> MPNetConfig:
    config = MPNetConfig(**MPNET_BASE, num_labels=2)
    return with_pooling(config, "mean")


def test_glue_base_has_glue_cpu_tasks_data_and_corpus(suite) -> None:
    cpu = load_suite("glue-cpu")
    assert suite.tasks == cpu.tasks and suite.seeds == [1, 2, 3]
    assert suite.data == cpu.data and suite.corpus == cpu.corpus
    assert suite.selection == "last"
    assert suite.teacher.checkpoint == "sentence-transformers/all-mpnet-base-v2"
    assert suite.teacher.pooling == "auto"
    for task in suite.tasks:  # one precision for every record, teacher and students
        assert suite.teacher_train_config(task).mixed_precision == "no"
        assert suite.train_config(task).mixed_precision == "no"
    assert set(suite.grid.methods) <= set(suite.method_names())


def test_glue_base_students_resolve_to_the_papers_shapes(suite, teacher_config) -> None:
    tiny = suite.students["4L-312"]
    assert (tiny.num_layers, tiny.hidden_size, tiny.num_heads, tiny.intermediate_size) == \
        (4, 312, 12, 1200)
    assert suite.recipe("kd").init_from == "tinybert"
    assert suite.recipe("finetune").init_from == "tinybert"
    copied = resolve_teacher_sizes(suite.students["3L-768"], teacher_config)
    assert (copied.num_layers, copied.hidden_size, copied.num_heads,
            copied.intermediate_size) == (3, 768, 12, 3072)
    assert {suite.recipe(name).student for name in ("kd-3L", "bert-pkd", "distilbert")} \
        == {"3L-768"}


def test_teacher_to_4l312_parameter_ratio_beside_the_papers(suite, teacher_config) -> None:
    student = build_student("4L-312", suite.students["4L-312"], teacher_config, 100)
    assert student.info["shape"] == "4L-312"
    assert student.model.config.model_type == "mpnet"  # the teacher's architecture
    with torch.device("meta"):  # sizes only: no 109M-parameter allocation
        teacher = new_sequence_classifier(teacher_config)
    ours = count_parameters(teacher)["total"] / count_parameters(student.model)["total"]
    paper = published_efficiency("4L-312", f"{teacher_config.num_hidden_layers}L-"
                                 f"{teacher_config.hidden_size}")
    assert paper is not None and paper["source_label"] == "TinyBERT4"
    assert paper["parameters_ratio"] == pytest.approx(109 / 14.5)
    assert paper["speedup"] == 9.4
    # MPNet-base vs its 4L-312: 109.5M vs 14.3M (BERT-base vs TinyBERT4: 109M vs 14.5M)
    assert 7.0 < ours < 8.0


def test_an_assembled_asset_teacher_loads_its_weights(monkeypatch, tiny_teacher_dir) -> None:
    """An asset's identity lists its files, not a folder's ``weights`` digests: its weights
    load all the same (the bench refused the MPNet asset as a config-only folder)."""
    asset = Checkpoint(spec="org/asset", location=str(tiny_teacher_dir),
                       identity={"asset": "asset", "files": {"model.safetensors": "0" * 64}})
    monkeypatch.setattr("harness.assets.checkpoints.resolve_checkpoint", lambda spec: asset)
    loaded = load_teacher("org/asset", random_weights=False)
    assert loaded.info["weights"] == "checkpoint"
    assert efficiency._has_weights(tiny_teacher_dir)
