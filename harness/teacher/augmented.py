"""Augmented training sets: synthetic copies made once, labelled by the teacher, cached.

The copies depend on the task data, the augmenter's description and a seed, not on the run
seed, so every seed and ablation of a suite shares them; the teacher's logits on them are
cached apart (keyed by the teacher too), since a different teacher relabels the same text.
A synthetic row keeps its source row's gold label for bookkeeping only: stages on augmented
data learn from the teacher, and gold-label terms train on the plain task split.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from accelerate import Accelerator
from transformers import PreTrainedTokenizerBase

from harness.api.context import Augmenter
from harness.common.cache import ArtifactCache, content_hash
from harness.data.features import EncodedSplit, encode_split
from harness.data.loading import TaskData
from harness.teacher.outputs import autocast_setting
from harness.teacher.preparation import TeacherArtifacts
from harness.training.distributed import any_process
from harness.training.engine import predict_logits

AUGMENTED_VERSION = 1


@dataclass
class AugmentedSet:
    split: EncodedSplit
    """The original training rows first, then the synthetic ones."""
    teacher_logits: np.ndarray
    source_rows: np.ndarray
    """For every row of ``split``, the original training row it came from."""
    summary: dict[str, Any]


def _examples(data: TaskData) -> list[tuple[str, ...]]:
    train = data.splits["train"]
    if data.task.is_pair:
        return list(zip(train["text_a"], train["text_b"], strict=True))
    return [(text,) for text in train["text_a"]]


def _as_dataset(data: TaskData, copies: list[tuple[int, tuple[str, ...]]]) -> datasets.Dataset:
    labels = data.splits["train"]["label"]
    columns: dict[str, list[Any]] = {
        "text_a": [fields[0] for _, fields in copies],
        "label": [labels[row] for row, _ in copies],
    }
    if data.task.is_pair:
        columns["text_b"] = [fields[1] for _, fields in copies]
    return datasets.Dataset.from_dict(columns)


def _concat(first: EncodedSplit, second: EncodedSplit) -> EncodedSplit:
    return EncodedSplit(
        name="train+augmented",
        input_ids=[*first.input_ids, *second.input_ids],
        token_type_ids=[*first.token_type_ids, *second.token_type_ids],
        labels=np.concatenate([first.labels, second.labels]),
        lengths=np.concatenate([first.lengths, second.lengths]),
        texts=([*first.texts, *second.texts]
               if first.texts is not None and second.texts is not None else None),
        # Synthetic rows carry their source row's label for bookkeeping only.
        has_gold=np.concatenate([np.ones(len(first), dtype=bool),
                                 np.zeros(len(second), dtype=bool)]),
    )


def prepare_augmented(
    *,
    data: TaskData,
    train_split: EncodedSplit,
    augmenter: Augmenter,
    teacher: TeacherArtifacts,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    cache: ArtifactCache,
    accelerator: Accelerator,
    inference_batch_size: int,
    seed: int,
    log: Callable[[str], None] = print,
) -> AugmentedSet:
    """The task's training split plus its cached synthetic copies and teacher logits.

    Under ``accelerate launch`` every process calls this alike: the copies are made by the
    main process of each machine while the others wait (they then read them from the
    cache); the teacher labels them with every process (a collective), and the main
    process of each machine writes the labels."""
    task = data.task
    description = augmenter.describe()
    text_key = content_hash({"kind": "augmented", "version": AUGMENTED_VERSION,
                             "task": task.name, "data": data.fingerprint,
                             "augmenter": description, "seed": seed})
    # No collective inside (the augmenter and the assets it caches, a masked-LM head or
    # POS tags, are one process's work): the others find the finished entry.
    with accelerator.local_main_process_first():
        if not cache.has("augmented", text_key):
            _make_copies(data, len(train_split), augmenter, description, cache, text_key,
                         seed, log)
    text_path = cache.path("augmented", text_key)
    copies = _read_copies(text_path)
    text_summary = json.loads((text_path / "summary.json").read_text())
    synthetic = encode_split("augmented", _as_dataset(data, copies), task, tokenizer, max_length)

    logits_key = content_hash({"kind": "augmented_logits", "text": text_key,
                               "teacher": teacher.key, "max_length": max_length})
    if any_process(not cache.has("augmented_logits", logits_key), accelerator):
        _label_copies(synthetic, task.name, teacher, cache, (text_key, logits_key),
                      accelerator, inference_batch_size, log)
    logits_path = cache.path("augmented_logits", logits_key)
    synthetic_logits = np.load(logits_path / "logits.npy")
    logits_summary = json.loads((logits_path / "summary.json").read_text())
    split = _concat(train_split, synthetic)
    return AugmentedSet(
        split=split,
        teacher_logits=np.concatenate([np.asarray(teacher.logits("train")), synthetic_logits]),
        source_rows=np.concatenate([np.arange(len(train_split)),
                                    np.asarray([row for row, _ in copies], dtype=np.int64)]),
        summary={"key": text_key, "logits_key": logits_key, "rows": len(split),
                 "synthetic_rows": len(synthetic), "original_rows": len(train_split),
                 "augment_seconds": text_summary["seconds"],
                 "teacher_logits_seconds": logits_summary["seconds"],
                 "augmenter": description},
    )


def _make_copies(data: TaskData, source_examples: int, augmenter: Augmenter,
                 description: dict[str, Any], cache: ArtifactCache, text_key: str, seed: int,
                 log: Callable[[str], None]) -> None:
    """Make the synthetic copies of the task's training rows and cache them under
    ``text_key``: examples.jsonl (one source row and its fields a line) and summary.json."""
    task = data.task
    log(f"[augment] {task.name}: making synthetic copies (candidates from "
        f"{description.get('source', '?')})")
    started = time.perf_counter()
    copies = augmenter.augment(_examples(data), seed=seed)
    seconds = time.perf_counter() - started
    with cache.build("augmented", text_key, {"task": task.name,
                                             "augmenter": description,
                                             "data": data.fingerprint},
                     made_from=augmenter.made_from()) as scratch:
        with (scratch / "examples.jsonl").open("w") as handle:
            for row, fields in copies:
                handle.write(json.dumps({"source_row": row, "fields": list(fields)}) + "\n")
        summary = {"examples": len(copies), "source_examples": source_examples,
                   "seconds": seconds,
                   "sentences_per_second": source_examples / seconds if seconds else None,
                   "augmenter": description}
        (scratch / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"[augment] {task.name}: {len(copies)} copies of {source_examples} examples "
        f"in {seconds:.0f}s")


def _read_copies(text_path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """The cached copies as (source row, fields), in the order they were made."""
    copies = []
    with (text_path / "examples.jsonl").open() as handle:
        for line in handle:
            item = json.loads(line)
            copies.append((int(item["source_row"]), tuple(item["fields"])))
    return copies


def _label_copies(synthetic: EncodedSplit, task_name: str, teacher: TeacherArtifacts,
                  cache: ArtifactCache, keys: tuple[str, str], accelerator: Accelerator,
                  inference_batch_size: int, log: Callable[[str], None]) -> None:
    """The teacher's logits on the synthetic rows, predicted by every process (a collective)
    and cached under the logits key by the main process of each machine; ``keys`` is
    (the copies' key, the logits' key)."""
    text_key, logits_key = keys
    log(f"[augment] {task_name}: teacher logits on {len(synthetic)} synthetic examples")
    started = time.perf_counter()
    model = teacher.load_model().to(accelerator.device)
    logits = predict_logits(model, synthetic, accelerator, inference_batch_size,
                            autocast_setting(teacher.inference_precision),
                            progress=f"teacher labels {task_name}")
    if accelerator.is_local_main_process:
        with cache.build("augmented_logits", logits_key,
                         {"task": task_name, "text": text_key, "teacher": teacher.key},
                         made_from=[("teachers", teacher.model_key),
                                    ("augmented", text_key)]) as scratch:
            np.save(scratch / "logits.npy", logits)
            (scratch / "summary.json").write_text(json.dumps(
                {"seconds": time.perf_counter() - started, "rows": len(synthetic)}))
    accelerator.wait_for_everyone()
