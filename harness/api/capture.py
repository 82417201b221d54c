"""Capture unnormalised attention scores from BERT-family transformers models.

TinyBERT's attention loss fits the student's attention *scores*, QK^T / sqrt(d_k) plus the
additive padding mask, before the softmax.  transformers returns only the softmax outputs
(and with its default "sdpa" attention, nothing at all), so this module registers an
attention function, :data:`ATTN_IMPLEMENTATION`, with transformers' ``AttentionInterface``.
It computes exactly what the eager implementation computes and hands the scores to the
:class:`ScoreCapture` attached to the calling attention module, if any.  No modelling code
is forked: any model whose attention goes through ``AttentionInterface`` (BERT, RoBERTa,
ELECTRA, DistilBERT, ALBERT, ... in transformers 5.x) works, teacher or student.

MPNet's self-attention does not go through ``AttentionInterface``: its scores are
QK^T / sqrt(d_k) plus a relative position bias (computed once by ``MPNetEncoder`` and passed
to every layer) plus the padding mask.  For it, hooks on each ``MPNetSelfAttention`` and its
``q`` / ``k`` / ``v`` projections see the tensors its own forward computes with and repeat
its score arithmetic, in the same order, on them (:data:`HOOKED_ATTENTION`); the model's own
forward is left as it is.

Captured tensors live on the :class:`ScoreCapture` (per model, per forward), never in module
globals; the only global is the registration of the function itself, done lazily so that
importing this module (e.g. for :func:`padding_key_mask`) does not import transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle
    from transformers import PreTrainedModel

ATTN_IMPLEMENTATION = "harness_scores"
"""Name of the score-capturing attention function in transformers' AttentionInterface."""

_CAPTURE_ATTRIBUTE = "_harness_score_capture"
_registered = False


def score_capturing_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention that also records the pre-softmax scores.

    Same arithmetic, in the same order, as transformers' BERT ``eager_attention_forward``,
    so outputs are bit-identical to ``attn_implementation="eager"``.  ``query``/``key``/
    ``value`` are (batch, heads, length, head_dim); ``attention_mask`` is the additive
    (batch, 1, q_len, k_len) mask built by :func:`transformers.masking_utils.eager_mask`
    (0 for visible keys, the dtype's minimum for padded ones) or None when nothing is padded.
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    capture: ScoreCapture | None = getattr(module, _CAPTURE_ATTRIBUTE, None)
    if capture is not None:
        capture._record(scores, query, key, value)
    weights = nn.functional.softmax(scores, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


def register_score_attention() -> None:
    """Make :data:`ATTN_IMPLEMENTATION` a valid ``attn_implementation`` (idempotent).

    Registers the attention function *and* the eager mask builder under the same name:
    transformers 5.x builds no padding mask at all for an implementation that has no mask
    function registered in ``AttentionMaskInterface``, so padding would be silently ignored.
    Call it before ``from_pretrained(..., attn_implementation=ATTN_IMPLEMENTATION)``;
    :func:`capture_attention_scores` calls it itself.
    """
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, score_capturing_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
    _registered = True


PROJECTIONS = ("queries", "keys", "values")
"""What :class:`ScoreCapture` can keep besides the scores: the self-attention's query, key and
value vectors, (batch, heads, length, head_dim) each, as the attention function receives
them (after the projections, split into heads)."""


class ScoreCapture:
    """Attention scores (and, when asked, query / key / value vectors) of one model's latest
    forward pass.

    ``scores[i]`` is the (batch, heads, q_len, k_len) score tensor of Transformer layer
    ``layers[i]`` (numbered 1..N as in TinyBERT, 0 being the embeddings), in layer order.
    Scores include the additive padding mask: padded keys hold a huge negative value (the
    dtype's minimum), so compare them only on real tokens (:func:`token_pair_mask`).
    The list is replaced at the start of every forward of the model, so a reference kept
    from an earlier step stays valid.  Tensors keep their autograd history (student) or none
    (teacher under ``torch.no_grad``).  ``queries``, ``keys`` and ``values`` are lists like
    ``scores``, filled for the names in ``record`` (:data:`PROJECTIONS`) and empty otherwise.
    """

    def __init__(self, num_layers: int, layers: Iterable[int] | None = None,
                 record: Iterable[str] = ()) -> None:
        self.record = frozenset(record)
        unknown = self.record - set(PROJECTIONS)
        if unknown:
            raise ValueError(f"cannot record {sorted(unknown)}; choose from {PROJECTIONS}")
        self.queries: list[torch.Tensor] = []
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.num_layers = num_layers
        self.layers: tuple[int, ...] = (tuple(range(1, num_layers + 1)) if layers is None
                                        else tuple(sorted(set(layers))))
        bad = [layer for layer in self.layers if not 1 <= layer <= num_layers]
        if bad:
            raise ValueError(f"layers {bad} out of range: the model has Transformer layers "
                             f"1..{num_layers}")
        self._wanted = frozenset(self.layers)
        self.scores: list[torch.Tensor] = []
        self._calls = 0
        self._recording = False

    def layer(self, number: int) -> torch.Tensor:
        """Scores of Transformer layer ``number`` (1-based) from the latest forward."""
        if number not in self._wanted:
            raise KeyError(f"layer {number} is not captured; captured layers: {self.layers}")
        if len(self.scores) != len(self.layers):
            raise RuntimeError("no complete forward pass captured yet")
        return self.scores[self.layers.index(number)]

    def _start(self) -> None:
        self.scores = []
        self.queries, self.keys, self.values = [], [], []
        self._calls = 0
        self._recording = True

    def _record(self, scores: torch.Tensor, query: torch.Tensor | None = None,
                key: torch.Tensor | None = None, value: torch.Tensor | None = None) -> None:
        # Outside a forward of the root model (e.g. activation-checkpoint recomputation
        # during backward) nothing is recorded.
        if not self._recording:
            return
        self._calls += 1
        if self._calls in self._wanted:
            self.scores.append(scores)
            for name, tensor in (("queries", query), ("keys", key), ("values", value)):
                if name in self.record:
                    getattr(self, name).append(tensor)

    def by_layer(self, what: str = "scores") -> list[torch.Tensor | None]:
        """``scores`` / ``queries`` / ``keys`` / ``values`` of Transformer layers 1..N (list
        index n - 1), None for a layer not captured."""
        captured = dict(zip(self.layers, getattr(self, what), strict=False))
        return [captured.get(number) for number in range(1, self.num_layers + 1)]

    def _finish(self) -> None:
        self._recording = False
        if self._calls != self.num_layers:
            raise RuntimeError(
                f"captured attention scores from {self._calls} attention calls, expected "
                f"{self.num_layers}: the model does not route all its self-attention through "
                f"transformers' AttentionInterface")

    def finish_early(self, depth: int) -> None:
        """End a forward that was stopped after Transformer layer ``depth`` (see
        :func:`harness.teacher.outputs.forward_to_depth`): the model's own end-of-forward
        hook did not run, so check here that every layer up to ``depth`` was seen."""
        self._recording = False
        if self._calls != depth:
            raise RuntimeError(f"captured attention scores from {self._calls} attention "
                               f"calls in a forward stopped after layer {depth}")
        if len(self.scores) != sum(1 for layer in self.layers if layer <= depth):
            raise RuntimeError("attention scores of a captured layer are missing")


def _self_attention_class(model: nn.Module) -> type[nn.Module]:
    """The self-attention module class, as declared for transformers' output recording."""
    recordable = getattr(model, "_can_record_outputs", None) or {}
    target = recordable.get("attentions")
    target = getattr(target, "target_class", target)  # an OutputRecorder or a class
    if not isinstance(target, type):
        raise TypeError(f"{type(model).__name__} declares no self-attention module "
                        "(_can_record_outputs['attentions']); cannot capture its scores")
    return target


def transformer_layers(model: nn.Module) -> list[nn.Module]:
    """The model's Transformer layer modules in forward order (layer n is index n - 1), as
    declared for transformers' hidden-state recording (``_can_record_outputs``), or, for a
    model that declares none (DeBERTa-v2), its encoder's ``layer`` list.  Hooks on them see
    what ``output_hidden_states`` returns, which a model that transforms a layer's output
    outside the layer (DeBERTa-v2's convolution after layer 1) would break: it is refused."""
    config = getattr(model, "config", None)
    recordable = getattr(model, "_can_record_outputs", None) or {}
    target = recordable.get("hidden_states")
    target = getattr(target, "target_class", target)
    if isinstance(target, type):
        layers = [module for module in model.modules() if isinstance(module, target)]
    else:
        encoder = getattr(getattr(model, "base_model", model), "encoder", None)
        found = getattr(encoder, "layer", None)
        if not isinstance(found, nn.ModuleList) or getattr(encoder, "conv", None) is not None:
            raise TypeError(f"{type(model).__name__} declares no Transformer layer module "
                            "(_can_record_outputs['hidden_states']) and has no plain "
                            "encoder.layer list whose outputs are its hidden states")
        layers = list(found)
    expected = getattr(config, "num_hidden_layers", len(layers))
    if len(layers) != expected:
        raise TypeError(f"{type(model).__name__}: found {len(layers)} {target.__name__} "
                        f"modules, expected {expected}")
    return layers


def _mpnet_score_hooks(module: nn.Module, capture: ScoreCapture) -> list[RemovableHandle]:
    """Hooks on one ``MPNetSelfAttention`` that record its scores as its forward computes
    them: the ``q`` / ``k`` / ``v`` projections' outputs split into heads as it splits them
    (``view`` then ``transpose(1, 2)``), QK^T / sqrt(d_k), plus the ``position_bias`` and
    the additive ``attention_mask`` it was called with, in that order (the bias added in
    place, as it adds it, so the dtype under autocast is its own)."""
    seen: dict[str, torch.Tensor | None] = {}

    def before(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        given = dict(zip(("hidden_states", "attention_mask", "position_bias"), args,
                         strict=False)) | kwargs
        seen["mask"], seen["bias"] = given.get("attention_mask"), given.get("position_bias")

    def projection(name: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: tuple, output: torch.Tensor) -> None:
            seen[name] = output
        return hook

    def after(_module: nn.Module, _args: tuple, _output: object) -> None:
        found = dict(seen)
        seen.clear()
        if not capture._recording:
            return
        head_size = module.attention_head_size
        query, key, value = (found[name].view(*found[name].shape[:-1], -1, head_size)
                             .transpose(1, 2) for name in ("q", "k", "v"))
        scores = torch.matmul(query, key.transpose(-1, -2))
        scores = scores / math.sqrt(head_size)
        if found["bias"] is not None:
            scores += found["bias"]
        if found["mask"] is not None:
            scores = scores + found["mask"]
        capture._record(scores, query, key, value)

    return [module.register_forward_pre_hook(before, with_kwargs=True),
            *(getattr(module, name).register_forward_hook(projection(name))
              for name in ("q", "k", "v")),
            module.register_forward_hook(after)]


def _mpnet_attention() -> type[nn.Module]:
    from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

    return MPNetSelfAttention


HOOKED_ATTENTION: dict[str, tuple[Callable[[], type[nn.Module]],
                                  Callable[[nn.Module, ScoreCapture], list[RemovableHandle]]]]
HOOKED_ATTENTION = {"mpnet": (_mpnet_attention, _mpnet_score_hooks)}
"""Architectures (``model_type``) whose self-attention does not go through
``AttentionInterface`` and is read through hooks instead: its module class, and the hooks
that record one module's scores (and queries, keys, values) into a :class:`ScoreCapture`."""


@contextmanager
def capture_attention_scores(model: PreTrainedModel, layers: Sequence[int] | None = None,
                             record: Iterable[str] = ()) -> Iterator[ScoreCapture]:
    """Within the block, every forward of ``model`` records its attention scores (and the
    query / key / value vectors named in ``record``, see :data:`PROJECTIONS`).

    Switches ``model`` to :data:`ATTN_IMPLEMENTATION` (restoring its previous attention
    implementation on exit) and attaches a :class:`ScoreCapture` to its self-attention
    modules; an architecture of :data:`HOOKED_ATTENTION` (MPNet) keeps its own attention
    and is read through hooks on those modules instead.  ``layers`` restricts capture to
    some Transformer layers (1-based, as returned by
    :func:`harness.api.layer_mapping.layer_map`) to save memory; by default all are kept.
    Each captured score tensor is an extra (batch, heads, L, L) activation kept alive until
    the next forward.
    """
    hooked = HOOKED_ATTENTION.get(getattr(model.config, "model_type", ""))
    attention_class = hooked[0]() if hooked else _self_attention_class(model)
    attention_modules = [module for module in model.modules()
                         if isinstance(module, attention_class)]
    if not attention_modules:
        raise TypeError(f"{type(model).__name__} has no {attention_class.__name__} modules")
    if any(hasattr(module, _CAPTURE_ATTRIBUTE) for module in attention_modules):
        raise RuntimeError("attention scores of this model are already being captured")

    capture = ScoreCapture(model.config.num_hidden_layers, layers, record)
    previous_implementation = model.config._attn_implementation
    switch = hooked is None and previous_implementation != ATTN_IMPLEMENTATION
    if hooked is None:
        register_score_attention()
        if switch:
            model.set_attn_implementation(ATTN_IMPLEMENTATION)
        if model.config._attn_implementation != ATTN_IMPLEMENTATION:
            raise TypeError(f"{type(model).__name__} cannot switch its attention "
                            "implementation (it does not use transformers' AttentionInterface)")
    hooks = [
        model.register_forward_pre_hook(lambda _module, _args: capture._start()),
        model.register_forward_hook(lambda _module, _args, _output: capture._finish()),
    ]
    for module in attention_modules:
        setattr(module, _CAPTURE_ATTRIBUTE, capture)
        if hooked:
            hooks += hooked[1](module, capture)
    try:
        yield capture
    finally:
        for hook in hooks:
            hook.remove()
        for module in attention_modules:
            delattr(module, _CAPTURE_ATTRIBUTE)
        if switch:
            model.set_attn_implementation(previous_implementation)


def padding_key_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, length) 1/0 padding mask -> bool (batch, 1, 1, length), True for real keys.

    Broadcasts against (batch, heads, q_len, k_len) score tensors.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"expected a (batch, length) attention mask, got shape "
                         f"{tuple(attention_mask.shape)}")
    return attention_mask.bool()[:, None, None, :]


def token_pair_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Bool (batch, 1, length, length): True where both query and key are real tokens."""
    keys = padding_key_mask(attention_mask)
    return keys & keys.transpose(-1, -2)
