"""A trained BiLSTM student as a folder of its own, and loaded back from it.

The folder holds what the student needs to read raw texts: ``config.json`` (the network's
sizes, the task's label names, the tokenisation), ``vocabulary.json`` (the word list built
from the task's training texts, row order) and ``model.safetensors``. Word vectors are not
needed: the trained embedding table is in the weights.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from harness.api import TaskSpec
from methods.bilstm_soft.words import MASK, WordVocabulary

if TYPE_CHECKING:
    from methods.bilstm_soft import BiLSTMClassifier, WordEncoder

CONFIG_FILE = "config.json"
VOCABULARY_FILE = "vocabulary.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "distill-bench-bilstm"


def save_bilstm(student: BiLSTMClassifier, encoder: WordEncoder, task: TaskSpec,
                folder: Path) -> None:
    """Write ``student`` and its word encoder into ``folder``."""
    labels = ["score"] if task.is_regression else list(task.label_names)
    config = {
        "format": FORMAT, "architecture": type(student).__name__,
        "vocabulary_size": student.embedding.num_embeddings,
        "embedding_dim": student.embedding.embedding_dim,
        "hidden_size": student.lstm.hidden_size, "fc_size": student.classifier.in_features,
        "num_labels": student.classifier.out_features, "is_pair": student.is_pair,
        "id2label": dict(enumerate(labels)),
        "tokenizer": encoder.describe(),
    }
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    (folder / VOCABULARY_FILE).write_text(json.dumps(encoder.vocabulary.words,
                                                     ensure_ascii=False))
    save_file({name: tensor.detach().contiguous().cpu()
               for name, tensor in student.state_dict().items()}, str(folder / WEIGHTS_FILE))


class ExportedBiLSTM:
    """A BiLSTM student read from its folder: :meth:`predict` tokenises raw texts as the
    run did (spaCy words, lower-cased, at most ``max_words`` per sentence) and returns
    logits."""

    def __init__(self, model: BiLSTMClassifier, encoder: WordEncoder,
                 id2label: dict[int, str]) -> None:
        self.model = model.eval()
        self.encoder = encoder
        self.id2label = id2label

    def predict(self, texts_a: Sequence[str], texts_b: Sequence[str] | None = None,
                batch_size: int = 64) -> np.ndarray:
        if self.model.is_pair != (texts_b is not None):
            raise ValueError("this student reads sentence pairs: give texts_a and texts_b"
                             if self.model.is_pair else
                             "this student reads single sentences: give texts_a only")
        features = self.encoder.encode(list(texts_a),
                                       list(texts_b) if texts_b is not None else None)
        logits = []
        with torch.no_grad():
            for start in range(0, len(texts_a), batch_size):
                batch = {}
                for name, rows in features.items():
                    padded, lengths = _padded(rows[start:start + batch_size])
                    batch[name], batch[f"{name}_lengths"] = padded, lengths
                logits.append(self.model(**batch).logits)
        if not logits:
            return np.zeros((0, self.model.classifier.out_features), dtype=np.float32)
        return torch.cat(logits).numpy()


def load_bilstm(folder: Path) -> ExportedBiLSTM:
    """The student :func:`save_bilstm` wrote into ``folder``."""
    from methods.bilstm_soft import BiLSTMClassifier, WordEncoder

    config: dict[str, Any] = json.loads((folder / CONFIG_FILE).read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"{folder / CONFIG_FILE}: not a BiLSTM student exported by "
                         f"distill-bench (format {config.get('format')!r})")
    vocabulary = WordVocabulary(json.loads((folder / VOCABULARY_FILE).read_text()))
    model = BiLSTMClassifier(config["vocabulary_size"], config["embedding_dim"],
                             config["hidden_size"], config["fc_size"], config["num_labels"],
                             config["is_pair"])
    model.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
    encoder = WordEncoder(vocabulary, config["tokenizer"]["max_words"],
                          config["tokenizer"].get("mask_token", MASK))
    if encoder.describe() != config["tokenizer"]:
        raise ValueError(f"{folder}: the vocabulary does not match the one the student was "
                         f"trained with ({config['tokenizer']})")
    return ExportedBiLSTM(model, encoder,
                          {int(index): name for index, name in config["id2label"].items()})


def _padded(rows: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of word ids zero-padded to the longest (``[PAD]`` is row 0), and their
    lengths."""
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    padded = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
    for index, row in enumerate(rows):
        padded[index, :len(row)] = torch.from_numpy(np.asarray(row, dtype=np.int64))
    return padded, lengths
