"""`harness bench`: the record's layout, parameters and FLOPs against hand formulas, the
ratios against the teacher, the newest record, and the errors (tiny real models, no
timing assertions)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from harness.api.students import count_parameters
from harness.bench.efficiency import (
    BERT_BASE_FOLDER,
    BenchError,
    BenchSettings,
    build_student,
    comparison_lines,
    latest_bench,
    load_teacher,
    published_efficiency,
    run_bench,
    time_forwards,
)
from harness.cli import app
from harness.common.files import write_json_atomic
from harness.common.flops import count_flops
from harness.experiments.suites import load_suite
from methods.bilstm_soft.words import SPECIALS

SEQS = (16, 32)
GLOVE_DIM = 50  # the default word vectors: the GloVe 6B 50-d package
STAT_KEYS = {"median", "q25", "q75", "min", "max", "repeats"}


def bert_flops(seq: int, layers: int, hidden: int, intermediate: int, labels: int = 2) -> int:
    """One forward of a BERT classifier, a multiply-add counting 2: per token and layer
    Q, K, V and the attention output (4 h x h), the feed-forward (h x i and i x h), the
    scores Q K^T and their weighted values (2 x seq x h); then the pooler on [CLS]
    (h x h) and the classifier (h x labels).  Embedding lookups, softmax, LayerNorm and
    GELU are not matrix products and are not counted."""
    per_token = 2 * (4 * hidden * hidden + 2 * hidden * intermediate + 2 * seq * hidden)
    return seq * layers * per_token + 2 * hidden * hidden + 2 * hidden * labels


def bilstm_flops(seq: int, embedding: int, hidden: int, fc: int, labels: int = 2) -> int:
    """Per word and direction the four gates: (embedding + hidden) x 4 hidden; then the
    ReLU layer on the two final states and the classifier."""
    lstm = 2 * seq * 2 * 4 * hidden * (embedding + hidden)
    return lstm + 2 * (2 * hidden) * fc + 2 * fc * labels


def published_rows(student: str, teacher: str) -> pd.DataFrame:
    rows = [("TinyBERT4", "tinybert", student, "parameters_millions", 14.5),
            ("TinyBERT4", "tinybert", student, "flops_billions", 1.2),
            ("TinyBERT4", "tinybert", student, "speedup", 9.4),
            ("BERT-base (teacher)", "teacher", teacher, "parameters_millions", 109.0),
            ("BERT-base (teacher)", "teacher", teacher, "flops_billions", 22.5),
            ("BERT-base (teacher)", "teacher", teacher, "speedup", 1.0),
            ("TinyBERT4", "tinybert", student, "accuracy", 92.6)]
    return pd.DataFrame([
        {"source_label": label, "method": method, "student": shape,
         "task": "sst2" if metric == "accuracy" else "-", "split": "test" if metric ==
         "accuracy" else "-", "metric": metric, "value": value,
         "source": "arXiv:1909.10351", "table": "Table 1", "version": "v5", "verified": True}
        for label, method, shape, metric, value in rows])


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory, tiny_teacher_dir):
    """One bench of the tests' tiny suite (teacher 2L-32, students 2L-16, 2L-32 and a
    BiLSTM), random weights, two sequence lengths, with published figures for 2L-16."""
    import yaml

    from tests.conftest import tiny_suite_dict

    root = tmp_path_factory.mktemp("bench")
    suite_file = root / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump(tiny_suite_dict(root / "no-data", tiny_teacher_dir),
                                         sort_keys=False))
    config = load_suite(str(suite_file))
    settings = BenchSettings(seq_lengths=SEQS, throughput_batch=4, warmup=1, repeats=2,
                             min_seconds=0.0, random_weights=True, bilstm_vocab=500,
                             device="cpu")
    results = root / "results"
    record, path = run_bench(config, settings, results, log=lambda line: None,
                             published=published_rows("2L-16", "2L-32"))
    return config, settings, results, record, path, suite_file


@pytest.mark.slow
def test_record_layout_and_store(bench_run):
    config, _, results, record, path, _ = bench_run
    assert path.parent == results / "bench" / "tiny"
    assert path.name.endswith(".json") and "-cpu-" in path.name
    stored = json.loads(path.read_text())
    assert stored == json.loads(json.dumps(record))
    assert stored["kind"] == "bench" and stored["suite"] == "tiny"
    assert stored["random_weights"] is True
    dt.datetime.fromisoformat(stored["created_at"])
    machine = stored["machine"]
    assert machine["device"] == "cpu" and machine["threads"] == torch.get_num_threads()
    assert {"host", "device_name", "torch", "cpu_count"} <= set(machine)
    assert stored["settings"] == {**stored["settings"], "seq_lengths": [16, 32],
                                  "latency_batch": 1, "throughput_batch": 4, "warmup": 1,
                                  "repeats": 2, "min_seconds": 0.0}
    models = stored["models"]
    assert [(m["role"], m["name"], m["kind"]) for m in models] == [
        ("teacher", "teacher", "bert"), ("student", "tiny", "bert"),
        ("student", "tiny-wide", "bert"), ("student", "tiny-bilstm", "bilstm")]
    assert models[0]["checkpoint"] == str(config.teacher.checkpoint)
    for model in models:
        assert set(model["parameters"]) == {"total", "non_embedding"}
        for key in ("flops_per_example", "latency_ms", "throughput"):
            assert list(model[key]) == ["16", "32"]
        for seq in ("16", "32"):
            assert set(model["latency_ms"][seq]) >= STAT_KEYS
            assert set(model["throughput"][seq]) >= STAT_KEYS
            latency, rate = model["latency_ms"][seq], model["throughput"][seq]
            assert latency["repeats"] >= 2 and rate["repeats"] >= 2
            assert latency["min"] <= latency["q25"] <= latency["median"] <= latency["q75"] \
                <= latency["max"]
            assert rate["min"] <= rate["median"] <= rate["max"]
            # examples/s of the same forwards as the milliseconds per batch
            assert rate["median"] == pytest.approx(4 * 1000 / rate["ms_per_batch"]["median"],
                                                   rel=1e-6)


def test_parameters_match_the_built_models(bench_run):
    config, settings, _, record, _, _ = bench_run
    teacher = load_teacher(config.teacher.checkpoint, random_weights=True)
    assert record["models"][0]["parameters"] == count_parameters(teacher.model)
    for entry in record["models"][1:]:
        student = build_student(entry["name"], config.students[entry["name"]],
                                teacher.model.config, settings.bilstm_vocab)
        assert entry["parameters"] == count_parameters(student.model)
    bilstm = record["models"][3]
    # Built by its plugin: a vocabulary of the 500 synthetic words and the plugin's
    # specials, embedded in the 50-d GloVe vectors.
    assert bilstm["plugin"] == "bilstm-soft"
    assert bilstm["encoder"]["vocabulary_size"] == 500 + len(SPECIALS)
    assert bilstm["parameters"]["total"] - bilstm["parameters"]["non_embedding"] == \
        (500 + len(SPECIALS)) * GLOVE_DIM


def test_flops_match_hand_formulas(bench_run):
    record = bench_run[3]
    teacher, tiny, wide, bilstm = record["models"]
    embedding = GLOVE_DIM
    for seq in SEQS:
        key = str(seq)
        assert teacher["flops_per_example"][key] == pytest.approx(
            bert_flops(seq, 2, 32, 64), rel=0.02)
        assert tiny["flops_per_example"][key] == pytest.approx(
            bert_flops(seq, 2, 16, 32), rel=0.02)
        assert wide["flops_per_example"][key] == pytest.approx(
            bert_flops(seq, 2, 32, 64), rel=0.02)
        assert bilstm["flops_per_example"][key] == pytest.approx(
            bilstm_flops(seq, embedding, 8, 8), rel=0.02)
    # Linear in the length but for attention (quadratic) and the per-example head.
    for entry, formula in ((teacher, lambda s: bert_flops(s, 2, 32, 64)),
                           (bilstm, lambda s: bilstm_flops(s, embedding, 8, 8))):
        ratio = entry["flops_per_example"]["32"] / entry["flops_per_example"]["16"]
        assert ratio == pytest.approx(formula(32) / formula(16), rel=0.01)
    assert 2 < teacher["flops_per_example"]["32"] / teacher["flops_per_example"]["16"] < 2.3
    assert bilstm["flops_per_example"]["32"] / bilstm["flops_per_example"]["16"] < 2


def test_flops_count_sdpa_attention_like_eager():
    """CPU scaled-dot-product attention has no formula in torch's counter: the bench adds
    one, so SDPA and eager attention count alike."""
    from transformers import BertConfig, BertForSequenceClassification

    counts = {}
    for implementation in ("sdpa", "eager"):
        config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=64,
                            attn_implementation=implementation)
        model = BertForSequenceClassification(config)
        ids = torch.randint(0, 100, (1, 24))
        counts[implementation] = count_flops(model, {"input_ids": ids,
                                                     "attention_mask": torch.ones_like(ids)})
    assert counts["sdpa"] == counts["eager"] == bert_flops(24, 2, 32, 64)


def test_comparison_is_consistent(bench_run):
    _, _, _, record, _, _ = bench_run
    teacher = record["models"][0]
    assert set(record["comparison"]) == {"tiny", "tiny-wide", "tiny-bilstm"}
    for entry in record["models"][1:]:
        ratios = record["comparison"][entry["name"]]
        assert ratios["parameters_ratio"] == pytest.approx(
            teacher["parameters"]["total"] / entry["parameters"]["total"])
        assert ratios["non_embedding_ratio"] == pytest.approx(
            teacher["parameters"]["non_embedding"] / entry["parameters"]["non_embedding"])
        for seq in ("16", "32"):
            assert ratios["flops_ratio"][seq] == pytest.approx(
                teacher["flops_per_example"][seq] / entry["flops_per_example"][seq])
            assert ratios["latency_speedup"][seq] == pytest.approx(
                teacher["latency_ms"][seq]["median"] / entry["latency_ms"][seq]["median"])
            assert ratios["throughput_speedup"][seq] == pytest.approx(
                entry["throughput"][seq]["median"] / teacher["throughput"][seq]["median"])
    # tiny-wide is the teacher's shape: same size and FLOPs
    assert record["comparison"]["tiny-wide"]["parameters_ratio"] == pytest.approx(1.0)
    assert record["comparison"]["tiny-wide"]["flops_ratio"]["32"] == pytest.approx(1.0)
    # published figures matched by shape (2L-16 against a 2L-32 teacher), to nobody else
    paper = record["comparison"]["tiny"]["paper"]
    assert paper["source_label"] == "TinyBERT4" and paper["teacher_label"] == \
        "BERT-base (teacher)"
    assert "paper" not in record["comparison"]["tiny-wide"]


def test_published_efficiency_and_comparison_lines():
    baseline = published_rows("4L-312", "12L-768").iloc[:3].assign(
        source_label="BERT-tiny (no KD)", method="finetune", value=[14.5, 1.2, 9.4])
    elsewhere = published_rows("BiLSTM-150", "24L-1024").iloc[[0, 2, 3]].assign(
        source="another paper")
    published = pd.concat([baseline, published_rows("4L-312", "12L-768"), elsewhere])
    paper = published_efficiency("4L-312", "12L-768", published)
    assert paper["source_label"] == "TinyBERT4"  # the distilled model's row, not the baseline
    assert paper["parameters_ratio"] == pytest.approx(109 / 14.5)
    assert paper["flops_ratio"] == pytest.approx(22.5 / 1.2)
    assert paper["speedup"] == 9.4
    assert paper["student"] == {"parameters_millions": 14.5, "flops_billions": 1.2,
                                "speedup": 9.4}
    assert published_efficiency("4L-312", "6L-384", published) is None
    assert published_efficiency("6L-768", "12L-768", published) is None
    # a speedup against another paper's teacher is not set against this teacher
    assert published_efficiency("BiLSTM-150", "12L-768", published) is None
    ours = {"parameters_ratio": 7.55, "non_embedding_ratio": 19.0,
            "flops_ratio": {"128": 17.9}, "latency_speedup": {"128": 8.0},
            "throughput_speedup": {"128": 11.2}}
    text = "\n".join(comparison_lines(ours, paper))
    assert "ours 7.5x" in text and "paper 7.5x" in text and "paper 9.4x" in text
    assert "ours 8.0x at batch 1, 11.2x at batch 32" in text and "paper 18.8x" in text
    # the project's anchors file: TinyBERT's Table 1 (BERT-base 109M, 4L-312 14.5M, 9.4x)
    shipped = published_efficiency("4L-312", "12L-768")
    assert shipped["parameters_ratio"] == pytest.approx(7.5, abs=0.05)
    assert shipped["speedup"] == pytest.approx(9.4)


def test_latest_bench_returns_the_newest(bench_run):
    _, _, _, record, path, _ = bench_run
    results = path.parent.parent.parent / "latest"
    created = dt.datetime.fromisoformat(record["created_at"])
    folder = results / "bench" / "tiny"
    for name, hours in (("b-newer", 2), ("c-older", -3), ("a-newest", 5)):
        copied = copy.deepcopy(record)
        copied["created_at"] = (created + dt.timedelta(hours=hours)).isoformat()
        copied["tag"] = name
        write_json_atomic(folder / f"{name}.json", copied)
    write_json_atomic(folder / "z-other.json", {"kind": "other", "created_at": "2999-01-01"})
    assert latest_bench(results, "tiny")["tag"] == "a-newest"
    assert latest_bench(results, "absent") is None
    # by device: the newest record measured on that kind
    on_gpu = copy.deepcopy(record)
    on_gpu["created_at"] = (created + dt.timedelta(hours=9)).isoformat()
    on_gpu["machine"]["device"], on_gpu["tag"] = "cuda", "gpu"
    write_json_atomic(folder / "d-gpu.json", on_gpu)
    assert latest_bench(results, "tiny")["tag"] == "gpu"
    assert latest_bench(results, "tiny", "cuda")["tag"] == "gpu"
    assert latest_bench(results, "tiny", "cpu")["tag"] == "a-newest"
    assert latest_bench(results, "tiny", "mps") is None


def test_teacher_checkpoint_weights_and_config_only_folders(tmp_path, tiny_teacher_dir):
    from transformers import AutoConfig, BertConfig, BertModel

    loaded = load_teacher(str(tiny_teacher_dir), random_weights=False)
    saved = BertModel.from_pretrained(tiny_teacher_dir)
    assert torch.equal(loaded.model.bert.embeddings.word_embeddings.weight,
                       saved.embeddings.word_embeddings.weight)
    assert loaded.model.config.num_labels == 2
    # a folder with only config.json: random weights, or an error saying so
    folder = tmp_path / "config-only"
    BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32).save_pretrained(folder)
    built = load_teacher(str(folder), random_weights=True)
    assert built.info["shape"] == "1L-16" and built.info["weights"] == "random"
    with pytest.raises(BenchError, match="--random-weights"):
        load_teacher(str(folder), random_weights=False)
    # the shipped BERT-base architecture is the public bert-base-uncased config
    base = AutoConfig.from_pretrained(Path(__file__).resolve().parents[2] /
                                      BERT_BASE_FOLDER)
    assert (base.model_type, base.vocab_size, base.hidden_size, base.num_hidden_layers,
            base.num_attention_heads, base.intermediate_size, base.max_position_embeddings,
            base.type_vocab_size) == ("bert", 30522, 768, 12, 12, 3072, 512, 2)


def test_offline_hub_teacher_says_what_to_pass():
    with pytest.raises(BenchError) as error:
        load_teacher("google-bert/bert-base-uncased", random_weights=True)
    assert f"--teacher {BERT_BASE_FOLDER} --random-weights" in str(error.value)


def test_settings_are_checked():
    with pytest.raises(BenchError, match="sequence lengths"):
        BenchSettings(seq_lengths=())
    with pytest.raises(BenchError, match="repeats"):
        BenchSettings(repeats=0)
    with pytest.raises(BenchError, match="precision 'fp16'"):
        BenchSettings(precision="fp16")


class _OutputDtypes(torch.nn.Module):
    """A linear layer that notes the dtype each forward computed in."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.dtypes: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        self.dtypes.append(out.dtype)
        return out


def test_precision_runs_the_timed_forwards_in_bf16_or_fp32(bench_run, monkeypatch):
    model, inputs, cpu = _OutputDtypes(), {"x": torch.randn(3, 4)}, torch.device("cpu")
    time_forwards(model, inputs, cpu, warmup=1, repeats=2, min_seconds=0.0)
    assert set(model.dtypes) == {torch.float32}
    model.dtypes.clear()
    time_forwards(model, inputs, cpu, warmup=1, repeats=2, min_seconds=0.0, precision="bf16")
    assert set(model.dtypes) == {torch.bfloat16} and len(model.dtypes) >= 3
    # auto follows the device's bf16 arithmetic, as a suite's auto does; fp32 and bf16 are
    # taken as given
    import harness.common.precision as precision

    for flags, expected in (({"avx2"}, "fp32"), ({"avx2", "avx512_bf16"}, "bf16")):
        monkeypatch.setattr(precision, "cpu_flags", lambda flags=flags: flags)
        assert BenchSettings(precision="auto").resolved(cpu).precision == expected
        assert BenchSettings(precision="bf16").resolved(cpu).precision == "bf16"
        assert BenchSettings().resolved(cpu).precision == "fp32"
    # the record says what the forwards ran in, and whether the device computes bf16
    _, _, _, record, _, _ = bench_run
    assert record["settings"]["precision"] == "fp32"
    assert isinstance(record["machine"]["native_bf16"], bool)


@pytest.mark.e2e
def test_cli_runs_and_names_known_shapes(bench_run, tmp_path):
    _, _, _, _, _, suite_file = bench_run
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "--suite", str(suite_file), "--student", "nope",
                                 "--results", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown student shape 'nope'" in result.output
    assert "tiny, tiny-wide, tiny-bilstm" in result.output
    result = runner.invoke(app, [
        "bench", "--suite", str(suite_file), "--student", "tiny,tiny-bilstm",
        "--seq-lengths", "8,12", "--warmup", "0", "--repeats", "1", "--min-seconds", "0",
        "--throughput-batch", "2", "--random-weights", "--results", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "| teacher 2L-32 |" in result.output and "| tiny-bilstm |" in result.output
    record = latest_bench(tmp_path, "tiny")
    assert [model["name"] for model in record["models"]] == ["teacher", "tiny", "tiny-bilstm"]
    assert record["settings"]["seq_lengths"] == [8, 12]
    assert record["settings"]["precision"] == "fp32"
    result = runner.invoke(app, [
        "bench", "--suite", str(suite_file), "--student", "tiny", "--seq-lengths", "8",
        "--warmup", "0", "--repeats", "1", "--min-seconds", "0", "--throughput-batch", "2",
        "--random-weights", "--precision", "bf16", "--results", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert ", bf16, random teacher weights" in result.output
    assert latest_bench(tmp_path, "tiny")["settings"]["precision"] == "bf16"
    # a plugin student whose tokeniser is not installed: what to install, no traceback
    import sys

    from methods.bilstm_soft.words import _spacy_tokenizer

    _spacy_tokenizer.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "spacy", None)
            result = runner.invoke(app, [
                "bench", "--suite", str(suite_file), "--student", "tiny-bilstm",
                "--random-weights", "--results", str(tmp_path)])
    finally:
        _spacy_tokenizer.cache_clear()
    assert result.exit_code == 2, result.output
    assert "student 'tiny-bilstm' (kind bilstm): word-level students tokenise with spaCy: " \
        "pip install spacy; or leave it out with --student" in " ".join(result.output.split())


@pytest.mark.slow
def test_glue_cpu_models_are_the_runners_mean_pooled_ones_as_the_records_count_them():
    """glue-cpu's teacher reads the mean of its tokens (all-MiniLM-L6-v2's convention) and
    its students follow it: no pooler in either, as in the committed records."""
    from harness.api.pooling import config_pooling

    config = load_suite("glue-cpu")
    teacher = load_teacher(config.teacher.checkpoint, random_weights=True,
                           teacher=config.teacher)
    assert config_pooling(teacher.model.config) == "mean"
    results = Path(__file__).resolve().parents[2] / "results" / "glue-cpu"
    checked = []
    for shape, spec in config.students.items():
        if getattr(spec, "kind", "bert") != "bert":  # a plugin's student: its own vocabulary
            continue
        found = sorted(results.glob(f"*/mrpc/{shape}-seed*-*.json"))
        if not found:  # the re-run has not reached this shape yet
            continue
        record = json.loads(found[0].read_text())
        assert count_parameters(teacher.model)["total"] == record["teacher"]["parameters"]
        student = build_student(shape, spec, teacher.model.config, 100)
        assert count_parameters(student.model) == record["parameters"]
        checked.append(shape)
    assert checked, f"no committed glue-cpu record on MRPC under {results}"
