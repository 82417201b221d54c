"""Pooling of sequence-classification heads: which vector of the last layer the classifier reads.

BERT's own head reads the pooler (a dense layer with tanh over the [CLS] state), trained by
next-sentence prediction.  Sentence-embedding checkpoints such as all-MiniLM-L6-v2 were
trained through the mean of their token states instead: their [CLS] state and pooler carry
little, and a classifier that reads them starts far behind one that reads the mean (the
glue-cpu measurements in suites/glue-cpu.yaml).  ``pooling: auto`` follows the checkpoint's
own convention, read from its sentence-transformers metadata.

Modes:

* ``pooler``: BERT's pooler output (the stock ``BertForSequenceClassification``);
* ``cls``: the last layer's [CLS] state, no pooler;
* ``mean``: the mean of the last layer's states over real (unmasked) tokens, no pooler.

The mode is stored in the model config as ``classifier_pooling`` (the name ModernBERT's
config uses for the same choice), so a saved model reloads with its head through
:func:`load_sequence_classifier`.

Other encoder architectures (:mod:`harness.api.architectures`): ``pooler`` is the
architecture's own classification head, its stock ``*ForSequenceClassification`` (RoBERTa
and ELECTRA read the first token through a dense layer in their head, DeBERTa-v2 through its
ContextPooler, DistilBERT through its pre-classifier); ``cls`` and ``mean`` are the same
heads as BERT's (a dropout and a linear classifier on the first token's or the mean state,
no dense layer), :func:`pooled_classifier_class`.  ``auto`` reads a sentence-transformers
folder's pooling as for BERT, else ``pooler`` (the architecture's own head).
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    BertForSequenceClassification,
    PretrainedConfig,
)
from transformers.modeling_outputs import SequenceClassifierOutput

Pooling = Literal["auto", "cls", "pooler", "mean"]
POOLING_MODES = ("cls", "pooler", "mean")
CONFIG_KEY = "classifier_pooling"


class PoolingError(ValueError):
    """A pooling that cannot be resolved or applied; the message says what to pass."""


def _sentence_transformers_mode(folder: Path) -> str | None:
    """The pooling mode a sentence-transformers folder declares, None if it is not one."""
    modules_file = folder / "modules.json"
    if not modules_file.exists():
        return None
    modules = json.loads(modules_file.read_text())
    for module in modules:
        if not str(module.get("type", "")).endswith("Pooling"):
            continue
        config_file = folder / module.get("path", "1_Pooling") / "config.json"
        if not config_file.exists():
            raise PoolingError(f"{modules_file} names a Pooling module but {config_file} is "
                               "missing; pass pooling: cls, pooler or mean")
        config = json.loads(config_file.read_text())
        flags = {"mean": config.get("pooling_mode_mean_tokens", False),
                 "cls": config.get("pooling_mode_cls_token", False)}
        chosen = [mode for mode, on in flags.items() if on]
        others = [key for key, on in config.items()
                  if key.startswith("pooling_mode_") and on is True
                  and key not in ("pooling_mode_mean_tokens", "pooling_mode_cls_token")]
        if len(chosen) != 1 or others:
            raise PoolingError(f"{config_file}: pooling {sorted(chosen + others)} has no "
                               "classification-head equivalent here (cls or mean); pass "
                               "pooling: cls, pooler or mean")
        return chosen[0]
    return None  # a sentence-transformers folder without pooling: plain encoder output


def checkpoint_pooling(location: str | Path, revision: str | None = None) -> str:
    """The pooling a checkpoint was trained with: a sentence-transformers folder's Pooling
    module (``modules.json`` and its ``config.json``), else BERT's pooler.  ``location`` is
    a local folder or a hub id (its ``modules.json`` is looked up through the hub cache, at
    ``revision`` when given)."""
    folder = Path(str(location)).expanduser()
    if folder.is_dir():
        return _sentence_transformers_mode(folder) or "pooler"
    if str(location).startswith(("/", ".", "~")):
        raise PoolingError(f"pooling: auto: checkpoint folder {location} does not exist")
    return _hub_checkpoint_pooling(str(location), revision)


def _hub_checkpoint_pooling(repo_id: str, revision: str | None = None) -> str:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        modules = Path(hf_hub_download(repo_id, "modules.json", revision=revision))
    except EntryNotFoundError:
        return "pooler"  # no sentence-transformers metadata
    except LocalEntryNotFoundError as error:
        raise PoolingError(
            f"pooling: auto needs {repo_id!r}'s modules.json (if any) from the hub, which "
            f"cannot be reached (offline?); pass pooling: cls, pooler or mean") from error
    # The Pooling module's config lands in the same snapshot folder as modules.json.
    for module in json.loads(modules.read_text()):
        if str(module.get("type", "")).endswith("Pooling"):
            hf_hub_download(repo_id, f"{module.get('path', '1_Pooling')}/config.json",
                            revision=revision)
    return _sentence_transformers_mode(modules.parent) or "pooler"


def resolve_pooling(pooling: str, checkpoint_location: str | Path,
                    revision: str | None = None) -> str:
    """``auto`` -> the checkpoint's convention; an explicit mode is kept."""
    if pooling == "auto":
        return checkpoint_pooling(checkpoint_location, revision)
    if pooling not in POOLING_MODES:
        raise PoolingError(f"pooling {pooling!r}: expected auto or one of {POOLING_MODES}")
    return pooling


def with_pooling(config: PretrainedConfig, pooling: str) -> PretrainedConfig:
    """``config`` with the head's pooling set (in place; returned for chaining)."""
    if pooling not in POOLING_MODES:
        raise PoolingError(f"pooling {pooling!r} is not resolved; expected one of "
                           f"{POOLING_MODES}")
    setattr(config, CONFIG_KEY, pooling)
    return config


def config_pooling(config: PretrainedConfig) -> str:
    """The head's pooling recorded in ``config``; models saved without it used the pooler."""
    return getattr(config, CONFIG_KEY, None) or "pooler"


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``hidden`` (batch, length, width) over the positions the mask keeps."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class PooledBertForSequenceClassification(BertForSequenceClassification):
    """``BertForSequenceClassification`` whose classifier reads the pooling its config names.

    With ``pooler`` it is the stock model; with ``cls`` or ``mean`` it has no pooler (its
    weights, unused, would otherwise count as parameters and receive no gradient)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.pooling = config_pooling(config)
        if self.pooling not in POOLING_MODES:
            raise PoolingError(f"{CONFIG_KEY} {self.pooling!r}: expected one of {POOLING_MODES}")
        if self.pooling != "pooler":
            self.bert.pooler = None

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
                position_ids=None, inputs_embeds=None, labels=None, **kwargs):
        if self.pooling == "pooler":
            return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                                   token_type_ids=token_type_ids, position_ids=position_ids,
                                   inputs_embeds=inputs_embeds, labels=labels, **kwargs)
        kwargs.pop("return_dict", None)
        outputs = self.bert(input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids, position_ids=position_ids,
                            inputs_embeds=inputs_embeds, return_dict=True, **kwargs)
        return _classify(self, outputs, attention_mask, labels)


class _PooledEncoderMixin:
    """A sequence classifier over any encoder whose head reads the [CLS] (first) state or the
    mean of the last layer's states: dropout, then one linear layer, as BERT's ``cls`` and
    ``mean`` heads.  Mixed into the architecture's ``*PreTrainedModel`` by
    :func:`pooled_classifier_class`, so the encoder sits under the architecture's own
    ``base_model_prefix`` and loads from (and saves as) its checkpoints."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.pooling = config_pooling(config)
        if self.pooling not in ("cls", "mean"):
            raise PoolingError(f"{type(self).__name__} reads cls or mean, not "
                               f"{self.pooling!r}")
        encoder_class = self._encoder_class
        options = ({"add_pooling_layer": False}
                   if "add_pooling_layer" in inspect.signature(encoder_class).parameters
                   else {})
        setattr(self, self.base_model_prefix, encoder_class(config, **options))
        self._forwards_token_types = "token_type_ids" in inspect.signature(
            encoder_class.forward).parameters
        width = int(getattr(config, "hidden_size", None) or config.dim)
        dropout = next((value for value in (
            getattr(config, "classifier_dropout", None),
            getattr(config, "hidden_dropout_prob", None),
            getattr(config, "seq_classif_dropout", None)) if value is not None), 0.1)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(width, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
                position_ids=None, inputs_embeds=None, labels=None, **kwargs):
        kwargs.pop("return_dict", None)
        if token_type_ids is not None and self._forwards_token_types:
            kwargs["token_type_ids"] = token_type_ids
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        outputs = getattr(self, self.base_model_prefix)(
            input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
            return_dict=True, **kwargs)
        return _classify(self, outputs, attention_mask, labels)


def _classify(model: nn.Module, outputs: Any, attention_mask: torch.Tensor | None,
              labels: torch.Tensor | None) -> SequenceClassifierOutput:
    """The head of a ``cls`` or ``mean`` classifier over an encoder's ``outputs``: pool the
    last layer (its first state, or the mean over real tokens), dropout, the linear layer;
    the loss as Hugging Face's sequence classifiers compute it (MSE for one output)."""
    hidden = outputs.last_hidden_state
    pooled = hidden[:, 0] if model.pooling == "cls" else mean_pool(hidden, attention_mask)
    logits = model.classifier(model.dropout(pooled))
    loss = None
    if labels is not None:
        if model.num_labels == 1:
            loss = nn.functional.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
        else:
            loss = nn.functional.cross_entropy(logits.view(-1, model.num_labels),
                                               labels.view(-1))
    return SequenceClassifierOutput(loss=loss, logits=logits,
                                    hidden_states=outputs.hidden_states,
                                    attentions=outputs.attentions)


@functools.cache
def _pooled_class_for(config_class: type) -> type:
    from transformers import PreTrainedModel
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    encoder_class = MODEL_MAPPING[config_class]
    pretrained = next((base for base in encoder_class.__mro__[1:]
                       if issubclass(base, PreTrainedModel) and base is not PreTrainedModel),
                      None)
    if pretrained is None:
        raise PoolingError(f"{encoder_class.__name__} has no pre-trained base class to "
                           "build a pooled classifier on")
    name = encoder_class.__name__.removesuffix("Model")
    return type(f"Pooled{name}ForSequenceClassification", (_PooledEncoderMixin, pretrained),
                {"_encoder_class": encoder_class, "__module__": __name__})


def pooled_classifier_class(config: PretrainedConfig) -> type:
    """The ``cls`` / ``mean`` sequence classifier of ``config``'s architecture (BERT's is
    :class:`PooledBertForSequenceClassification`)."""
    if config.model_type == "bert":
        return PooledBertForSequenceClassification
    return _pooled_class_for(type(config))


def sequence_classifier_class(config: PretrainedConfig) -> type:
    """The class that builds ``config``'s model with the head its pooling names."""
    if config.model_type == "bert":
        return PooledBertForSequenceClassification
    if config_pooling(config) == "pooler":
        return AutoModelForSequenceClassification
    return pooled_classifier_class(config)


def load_sequence_classifier(location: str | Path, config: PretrainedConfig | None = None,
                             **kwargs) -> nn.Module:
    """A sequence classifier from a checkpoint, with the pooling its (or the given) config
    names: a fine-tuned teacher saved by the harness reloads with the head it trained.
    ``kwargs`` go to ``from_pretrained`` (a hub checkpoint's ``revision`` to both loads)."""
    if config is None:
        config = AutoConfig.from_pretrained(
            location, **({"revision": kwargs["revision"]} if "revision" in kwargs else {}))
    return sequence_classifier_class(config).from_pretrained(location, config=config, **kwargs)
