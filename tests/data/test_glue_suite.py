"""The paper-scale suite (suites/glue.yaml) run end to end with stand-ins, as on a GPU.

Every method of the glue suite goes through ``harness run --suite glue --method M`` with
the suite's own recipes, changed only by command-line options: a tiny random BERT with a
masked-LM head (12 layers and 12 heads like bert-base-uncased, 48 wide) in place of
bert-base-uncased (``--teacher``), the local GLUE folder in place of the hub
(``--data-dir``), the shared general corpus in place of wikitext-103, and tiny budgets
(``--set``). A bug in the glue recipes, or in what they alone use (teacher-sized student
shapes, hub data settings, bf16), shows here rather than on a GPU's first run.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from harness.api.registry import instantiate
from harness.assets.checkpoints import resolve_checkpoint
from harness.cli import app
from harness.common.cache import content_hash
from harness.common.cli_options import recipe_overrides
from harness.common.precision import auto_precision
from harness.data.loading import resolve_data_dir
from harness.data.tasks import get_task
from harness.experiments.planner import RunPlanner
from harness.experiments.store import ResultsStore
from harness.experiments.suites import load_suite
from tests.conftest import MINILM_DIR

TASK = "mrpc"
STEPS = 2
TEACHER = {"layers": 12, "hidden": 48, "heads": 12, "intermediate": 96}

# The stand-ins and budgets, each a plain command-line override of the suite.
STAND_IN_SETS = [
    f"teacher.training.max_steps={STEPS}",
    f"training.max_steps={STEPS}",  # every stage of every method, general ones included
    "teacher.min_margin=-1000",  # the stand-in teacher is barely trained: no margin to check
    f"data.max_train_examples.{TASK}=64",
    "data.max_seq_length.single=32",
    "data.max_seq_length.pair=32",
    # The shared general corpus (beside the GLUE folder) instead of wikitext-103 on the hub,
    # and MRPC's sentences instead of all nine tasks' (MNLI, QQP, QNLI are not local).
    "corpus.hub_dataset=null",
    "corpus.text_files=[corpus/en-general.txt]",
    f"corpus.tasks=[{TASK}]",
    "corpus.max_sentences=64",
    "corpus.max_seq_length=32",
    "methods.tinybert.params.augmentation.copies=1",
    "methods.bilstm-soft.params.augmentation.n_iter=1",
]

METHODS = load_suite("glue").method_names()


def write_stand_in_teacher(path: Path) -> Path:
    """A random-weight BertForPreTraining (its masked-LM head included: DistilBERT's
    general stage and TinyBERT's augmentation read bert-base's) with the bert-base-uncased
    vocabulary of the MiniLM tokenizer, saved as a folder."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForPreTraining

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=TEACHER["hidden"],
                        num_hidden_layers=TEACHER["layers"],
                        num_attention_heads=TEACHER["heads"],
                        intermediate_size=TEACHER["intermediate"])
    BertForPreTraining(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(MINILM_DIR).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> dict[str, Path]:
    """The teacher folder, results store and cache every method's run shares (the
    fine-tuned teacher, its logits and the corpus are made once)."""
    root = tmp_path_factory.mktemp("glue-suite")
    return {"teacher": write_stand_in_teacher(root / "teacher"),
            "data": resolve_data_dir(), "results": root / "results", "cache": root / "cache"}


def _options(stand_ins: dict[str, Path]) -> list[str]:
    sets = [option for value in STAND_IN_SETS for option in ("--set", value)]
    return ["--suite", "glue", "--tasks", TASK, "--seeds", "1",
            "--data-dir", str(stand_ins["data"]), "--teacher", str(stand_ins["teacher"]),
            "--results", str(stand_ins["results"]), "--cache-dir", str(stand_ins["cache"]),
            *sets]


def test_the_suite_declares_the_methods_tested() -> None:
    """Every glue method (variants included) is run below; a new one is run too."""
    assert {"finetune", "kd", "bert-pkd", "distilbert", "tinybert", "bilstm-soft"} <= set(
        METHODS)
    assert len(METHODS) >= 10


@pytest.mark.e2e
@pytest.mark.parametrize("method", METHODS)
def test_glue_method_runs_end_to_end_with_stand_ins(method: str, stand_ins) -> None:
    result = CliRunner().invoke(app, ["run", *_options(stand_ins), "--method", method])
    assert result.exit_code == 0, result.output

    records = [record for record in ResultsStore(stand_ins["results"] / "glue").records()
               if record.method == method]
    assert len(records) == 1
    record = records[0].model_dump()
    assert record["status"] == "finished" and record["task"] == TASK
    assert math.isfinite(record["main_score"])

    # The recipe's own stages ran, each on the tiny budget; corpus stages on the corpus.
    suite = load_suite("glue", recipe_overrides(STAND_IN_SETS, None, None))
    stages = instantiate(suite.plugin(method), suite.recipe(method), TASK).stages(
        get_task(TASK))
    task_stages = [stage.name for stage in stages if not stage.is_general]
    assert list(record["config"]["stages"]) == [stage.name for stage in stages]
    assert [stage["name"] for stage in record["stages"]] == task_stages
    assert all(stage["steps"] == STEPS for stage in record["stages"])
    general = record.get("general_distillation")
    if any(stage.is_general for stage in stages):
        assert general["corpus_sentences"] == 64
        assert "file:corpus/en-general.txt" in general["corpus_sources"]
    else:
        assert general is None

    # The stand-ins were used: local files, the stand-in teacher, sizes taken from it.
    assert record["data"]["source"] == "local"
    assert record["data"]["files"]["dev"] == "MRPC/dev.tsv"
    assert record["config"]["teacher"]["checkpoint"] == resolve_checkpoint(
        str(stand_ins["teacher"])).name  # the folder by content: records hold no paths
    assert record["config"]["teacher"]["checkpoint"].startswith("folder:")
    student = record["config"]["student"]
    if getattr(suite.students[student["name"]], "teacher_sizes", None):  # 6L-768, 4L-768, 3L-768
        assert (student["hidden_size"], student["num_heads"], student["intermediate_size"]
                ) == (TEACHER["hidden"], TEACHER["heads"], TEACHER["intermediate"])
    # mixed_precision: auto, resolved for this CPU (the BiLSTM's recipe says "no").
    expected = auto_precision(torch.device("cpu"))["mixed_precision"]
    precisions = {stage["mixed_precision"] for stage in record["config"]["stages"].values()}
    assert precisions <= {expected, "no"}


def test_teacher_sizes_hash_as_the_numbers_written_out(stand_ins) -> None:
    """A shape whose sizes are ``teacher`` resolves to the teacher's numbers before the run
    id is computed: glue's 6L-768 run ids are those of the shape with the sizes written
    out (for bert-base-uncased: 768, 12, 3072, as before the shapes said ``teacher``)."""
    base = [*STAND_IN_SETS, f"teacher.checkpoint={stand_ins['teacher']}",
            "data.source=local", f"data.dir={stand_ins['data']}"]
    written = [f"students.6L-768.hidden_size={TEACHER['hidden']}",
               f"students.6L-768.num_heads={TEACHER['heads']}",
               f"students.6L-768.intermediate_size={TEACHER['intermediate']}"]
    ids = []
    for overrides in (base, [*base, *written]):
        planner = RunPlanner(load_suite("glue", overrides), torch.device("cpu"),
                             log=lambda _: None)
        spec = planner.resolve("bert-pkd", TASK, 1).spec
        assert spec["student"]["hidden_size"] == TEACHER["hidden"]
        ids.append(content_hash(spec))
    assert ids[0] == ids[1]
