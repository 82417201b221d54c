"""What a method is handed to build its student and its augmenter, and the protocols of the
student encoders and augmenters a method may bring."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from harness.config.schema import StudentConfig
from harness.data.tasks import TaskSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class StudentKindConfig(BaseModel):
    """The schema of a student kind that a plugin defines (``Method.student_shapes``): the
    fields a suite's ``students.<name>`` entry with ``kind: <kind>`` may hold.  Unknown keys
    are errors; the dump of a validated shape enters the run id."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: str = Field(min_length=1)

    def missing_assets(self) -> str | None:
        """What building a student of this shape needs that this machine lacks (word
        vectors, a file), with how to get it; None (the default): nothing.  Checked with
        :meth:`Method.missing_assets` for every cell before the first one trains."""
        return None

    def run_identity(self) -> dict[str, Any]:
        """The shape as run ids hold it: its fields (the default), where a kind may name an
        asset by its content instead of its location (a word-vector file's digest, not its
        path) and add the release of what it reads (a tokenizer), so that a record made
        with other assets is not taken for a run with these."""
        return self.model_dump()


@dataclass
class StudentContext:
    """What a method needs to build its student."""

    task: TaskSpec
    shape_name: str
    shape: StudentConfig | StudentKindConfig
    """A BERT shape, or a plugin kind's shape validated against its schema."""
    teacher_config: PretrainedConfig
    teacher_state: dict[str, torch.Tensor] | None = None
    """The pre-trained teacher's weights, for students initialised from teacher layers."""
    assets: AugmentContext | None = None
    """The teacher checkpoint, its tokenizer, the suite's corpus and the artifact cache, for
    methods that need more of the teacher than its weights (e.g. its masked-LM head)."""
    encoder: StudentEncoder | None = None
    """The method's own student encoder (:meth:`Method.student_encoder`), fitted on the
    task's training texts, e.g. to size a word-embedding table."""
    pooling: str = "pooler"
    """What a Transformer student's classification head reads (``cls``, ``pooler`` or
    ``mean``), resolved from the shape's ``pooling`` and the teacher's."""


@dataclass
class AugmentContext:
    """What a method's augmenter may use: the teacher checkpoint (e.g. its masked-LM head),
    its tokenizer, the suite's unlabeled corpus (to fit a head) and the artifact cache."""

    checkpoint: Any
    tokenizer: Any
    corpus: Callable[[], list[str]]
    cache: Any
    log: Callable[[str], None]


class StudentEncoder(Protocol):
    """A student's own tokenisation: texts -> named per-row id arrays.

    The runner adds them to every split the student reads (training, augmented, dev), and
    batches carry them zero-padded as ``batch[name]`` with ``batch[name + "_lengths"]``;
    the teacher keeps reading its WordPiece ``input_ids``.  :meth:`describe` identifies
    the encoder (vocabulary included) for records and memoisation.
    """

    def describe(self) -> dict[str, Any]: ...

    def encode(self, texts_a: Sequence[str], texts_b: Sequence[str] | None
               ) -> dict[str, list[Any]]: ...


class Augmenter(Protocol):
    """Makes synthetic copies of training examples; the runner caches them by
    :meth:`describe` and the task data, labels them with the fine-tuned teacher, and
    never takes a gold label from them.  Every method is required
    (:func:`augmenter_problem`): a plugin whose ``augmenter()`` is annotated with a class
    lacking one is not loaded, and an augmenter built without one is refused before it
    makes a copy."""

    def describe(self) -> dict[str, Any]: ...

    def augment(self, examples: Sequence[tuple[str, ...]], seed: int,
                progress: bool = True) -> list[tuple[int, tuple[str, ...]]]: ...

    def made_from(self) -> list[tuple[str, str]]:
        """The cache entries (kind, key) the copies of its last :meth:`augment` were
        computed from (a fitted masked-LM head, POS tags): the cached copies record them
        and are made again once one of them is rebuilt with other contents.  An augmenter
        that reads no cache entry returns []."""
        ...


AUGMENTER_METHODS = tuple(name for name, value in vars(Augmenter).items()
                          if not name.startswith("_") and callable(value))
"""What an augmenter must define: :class:`Augmenter`'s methods."""


def augmenter_problem(augmenter: type | object) -> str | None:
    """What ``augmenter`` (a class, or an instance) lacks of :class:`Augmenter`, as a
    message naming it; None when it has every method.  An augmenter without
    :meth:`Augmenter.made_from` would have its copies trusted after the cache entries they
    came from were rebuilt."""
    cls = augmenter if isinstance(augmenter, type) else type(augmenter)
    missing = [name for name in AUGMENTER_METHODS if not callable(getattr(cls, name, None))]
    if not missing:
        return None
    return (f"augmenter {cls.__module__}.{cls.__qualname__} lacks "
            f"{', '.join(f'{name}()' for name in missing)} of the Augmenter protocol "
            f"(harness.api.Augmenter: {', '.join(AUGMENTER_METHODS)}; made_from() returns "
            "the cache entries its copies were computed from, [] for none)")


class ExportedStudent(Protocol):
    """A student loaded back from an exported folder (:meth:`Method.load_student`), for
    students that are not Transformers models: it reads raw texts, as a Hugging Face
    folder's model and tokenizer do together."""

    id2label: dict[int, str]
    """The label names, in logit order (``{0: "score"}`` for a regression task)."""

    def predict(self, texts_a: Sequence[str], texts_b: Sequence[str] | None = None,
                batch_size: int = 64) -> np.ndarray:
        """Logits, one row per text (or pair), in the order given: (n, num_labels)."""
        ...
