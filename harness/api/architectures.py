"""The Hugging Face encoder architectures a teacher (and so a Transformer student) may have,
and what each can give the methods.

A Transformer student is built "of the teacher's architecture": the teacher's config class
with the student shape's depth, width, heads and feed-forward size written under that
class's own field names (:data:`ARCHITECTURES`).  What a method reads from inside the
self-attention (pre-softmax scores, queries, keys, values) is captured through transformers'
``AttentionInterface`` (:mod:`harness.api.capture`), which only some architectures route
their attention through, or, for MPNet, whose scores add a relative position bias, through
hooks on its self-attention modules; :func:`self_attention_problem` says when neither works,
and :mod:`harness.experiments.compatibility` turns that into the refusal of a method whose stages
need it, before anything trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.config.schema import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class Architecture:
    """One supported encoder architecture: its config's field names for a student shape,
    and its own classification head (what ``pooling: pooler`` means for it)."""

    model_type: str
    name: str
    layers: str = "num_hidden_layers"
    hidden: str = "hidden_size"
    heads: str = "num_attention_heads"
    intermediate: str = "intermediate_size"
    own_head: str = ""
    """What the architecture's stock ``*ForSequenceClassification`` reads: ``pooling:
    pooler`` trains that head."""
    scores: str | None = None
    """Why attention scores cannot be captured from it (None: they can)."""


ARCHITECTURES: dict[str, Architecture] = {arch.model_type: arch for arch in (
    Architecture("bert", "BERT",
                 own_head="the pooler (dense + tanh over [CLS], pre-trained by next-sentence "
                 "prediction), then the classifier"),
    Architecture("roberta", "RoBERTa",
                 own_head="RobertaClassificationHead: dense + tanh over `<s>`, then the output "
                 "projection (no pre-trained pooler)"),
    Architecture("electra", "ELECTRA",
                 own_head="ElectraClassificationHead: dense + GELU over [CLS], then the "
                 "output projection"),
    Architecture("deberta-v2", "DeBERTa-v2",
                 own_head="ContextPooler (dense + activation over [CLS]), then the "
                 "classifier",
                 scores="its disentangled attention adds content-to-position and "
                 "position-to-content terms to QK^T inside DisentangledSelfAttention, which "
                 "does not go through transformers' AttentionInterface, so its pre-softmax "
                 "scores (and queries, keys, values) cannot be captured without forking its "
                 "modelling code"),
    Architecture("distilbert", "DistilBERT", layers="n_layers", hidden="dim", heads="n_heads",
                 intermediate="hidden_dim",
                 own_head="pre_classifier (dense + ReLU over [CLS]), then the classifier"),
    Architecture("mpnet", "MPNet",
                 own_head="MPNetClassificationHead: dense + tanh over `<s>`, then the output "
                 "projection (the checkpoint's pooler is not read)"),
)}


def architecture(config: PretrainedConfig) -> Architecture:
    """The supported architecture of ``config``; a clear error for any other."""
    found = ARCHITECTURES.get(config.model_type)
    if found is None:
        raise ConfigError(f"the teacher is a {config.model_type!r} model; supported encoder "
                          f"architectures: {', '.join(ARCHITECTURES)}")
    return found


@dataclass(frozen=True)
class Dimensions:
    layers: int
    hidden: int
    heads: int
    intermediate: int
    embedding: int | None = None
    """The width of embeddings narrower or wider than the hidden states (ELECTRA's
    ``embedding_size``, projected to the hidden size), which a student keeps
    (:func:`harness.api.students.student_config`); None: they are as wide as the hidden
    states, and a student's follow its hidden size."""
    model_type: str = "bert"
    """The architecture's ``model_type`` (what a student built from these dimensions may
    copy weights from)."""


def dimensions(config: PretrainedConfig) -> Dimensions:
    """Depth, width, heads and feed-forward size of a supported config, whatever its
    class calls them (DistilBERT: ``n_layers``, ``dim``, ``n_heads``, ``hidden_dim``), and
    the width of separate embeddings (``embedding_size``, where it is not the hidden
    size)."""
    arch = architecture(config)
    sizes = [int(getattr(config, field)) for field in (
        arch.layers, arch.hidden, arch.heads, arch.intermediate)]
    embedding = getattr(config, "embedding_size", None)
    separate = None if embedding is None or int(embedding) == sizes[1] else int(embedding)
    return Dimensions(*sizes, embedding=separate, model_type=arch.model_type)


def self_attention_problem(config: PretrainedConfig) -> str | None:
    """Why the self-attention of ``config``'s architecture cannot be captured (None: it can).

    Read from the modelling class itself: it must declare its self-attention module for
    output recording and support attention backends (``AttentionInterface``), or be one the
    harness reads through hooks (:data:`harness.api.capture.HOOKED_ATTENTION`: MPNet); the
    reason given for a known architecture that does neither is :attr:`Architecture.scores`."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    from harness.api.capture import HOOKED_ATTENTION

    if config.model_type in HOOKED_ATTENTION:
        return None
    arch = ARCHITECTURES.get(config.model_type)
    model_class = MODEL_MAPPING[type(config)]
    recordable = getattr(model_class, "_can_record_outputs", None) or {}
    if "attentions" in recordable and getattr(model_class, "_supports_attention_backend",
                                              False):
        return None
    if arch is not None and arch.scores:
        return arch.scores
    return (f"{model_class.__name__} does not route its self-attention through transformers' "
            "AttentionInterface, so its pre-softmax scores cannot be captured")
