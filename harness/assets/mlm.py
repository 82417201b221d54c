"""Masked-LM word candidates for a checkpoint, with or without its own MLM head.

A checkpoint that ships a masked-LM head (``cls.predictions.*`` for BERT, ``lm_head`` for
RoBERTa, DistilBERT's ``vocab_*`` layers) uses it.  One
that does not (the offline MiniLM teacher is a bare ``BertModel``) gets a head FITTED on
top of its frozen encoder: the BERT head shape (dense d->d, GELU, LayerNorm) and a
decoder whose weight is the checkpoint's own word-embedding matrix (tied, frozen) plus a
learnable bias, trained with BERT's 15% masking (80% [MASK], 10% random, 10% kept) on a
corpus of sentences.  Its top-k recall and top-1 accuracy on held-out masked tokens are
measured and stored with it, so a weak head is visible in every record that uses it.

Fitted heads are cached (:class:`~harness.common.cache.ArtifactCache`, kind ``mlm_head``) under
the hash of the checkpoint's identity, the corpus and the fit configuration.
"""

from __future__ import annotations

import functools
import json
import math
import pickle
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from transformers import AutoModel, AutoModelForMaskedLM, PreTrainedTokenizerBase

from harness.assets.checkpoints import Checkpoint, load_tokenizer, reading
from harness.assets.word_pieces import piece_convention
from harness.common.cache import ArtifactCache
from harness.common.progress import progress_bar
from harness.config.identity import MLM_HEAD_KIND, mlm_head_key
from harness.data.corpus import sentences_fingerprint

HeadSource = Literal["checkpoint_head", "fitted_head"]


class MLMHeadConfig(BaseModel):
    """How to fit (and evaluate) a masked-LM head when the checkpoint has none."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    use_checkpoint_head: bool = True
    """Use the checkpoint's own MLM head when it has one (False: always fit one)."""
    steps: int = Field(600, ge=0)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(5e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_fraction: float = Field(0.05, ge=0, le=1)
    mask_prob: float = Field(0.15, gt=0, lt=1)
    max_length: int = Field(64, ge=8)
    eval_sentences: int = Field(1000, ge=1)
    """Held-out sentences (taken from the corpus, never trained on) for recall / top-1."""
    recall_k: int = Field(15, ge=1)
    bias_init: Literal["unigram", "zeros"] = "unigram"
    """Start the output bias at the log unigram frequency of the training sentences."""
    seed: int = 0


class TiedMLMHead(nn.Module):
    """BERT-shaped MLM head, hidden states -> vocabulary logits, decoder tied to embeddings.

    ``decoder.weight`` IS the given embedding parameter (not a copy), so the head follows
    the encoder's vocabulary space and adds only ``d*d + 3d + vocab`` parameters.
    """

    def __init__(self, word_embeddings: nn.Parameter, hidden_size: int,
                 layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        vocab_size, embedding_size = word_embeddings.shape
        self.dense = nn.Linear(hidden_size, embedding_size)
        self.activation = nn.GELU()
        self.layer_norm = nn.LayerNorm(embedding_size, eps=layer_norm_eps)
        self.decoder = nn.Linear(embedding_size, vocab_size, bias=False)
        self.decoder.weight = word_embeddings
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.normal_(self.dense.weight, std=0.02)
        nn.init.zeros_(self.dense.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.layer_norm(self.activation(self.dense(hidden)))) + self.bias

    def own_state(self) -> dict[str, torch.Tensor]:
        """The head's own weights (what the cache stores): everything but the tied decoder."""
        return {name: value.detach().cpu().clone() for name, value in self.state_dict().items()
                if name != "decoder.weight"}

    def load_own_state(self, state: dict[str, torch.Tensor]) -> None:
        result = self.load_state_dict(state, strict=False)
        if list(result.missing_keys) != ["decoder.weight"] or result.unexpected_keys:
            raise ValueError(f"fitted MLM head state does not match: missing "
                             f"{result.missing_keys}, unexpected {result.unexpected_keys}")


class _DistilBertHead(nn.Module):
    """DistilBERT's MLM layers as one hidden -> logits module."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.transform = model.vocab_transform
        self.activation = model.activation
        self.layer_norm = model.vocab_layer_norm
        self.projector = model.vocab_projector

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.projector(self.layer_norm(self.activation(self.transform(hidden))))


def _checkpoint_head(model: nn.Module) -> nn.Module | None:
    """A ``*ForMaskedLM`` model's head as one hidden -> logits module: BERT's (and
    DeBERTa-v2's legacy) ``cls``, RoBERTa's ``lm_head``, DistilBERT's layers; None for
    another (ELECTRA's generator head, DeBERTa-v2's ``lm_predictions``: a head is fitted)."""
    if hasattr(model, "cls"):
        return model.cls
    if model.config.model_type == "roberta" and hasattr(model, "lm_head"):
        return model.lm_head
    if all(hasattr(model, name) for name in ("vocab_transform", "vocab_layer_norm",
                                              "vocab_projector", "activation")):
        return _DistilBertHead(model)
    return None


def vocabulary_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """Ids the tokenizer can give: its length, or past it its highest vocabulary id."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)


def banned_candidate_ids(tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """Vocabulary mask of ids that are never word candidates: special and bracketed tokens
    (``[CLS]``, ``[unused12]``, ``<mask>``...) and pieces that do not start a word in the
    tokenizer's convention (:mod:`harness.assets.word_pieces`): WordPiece continuations
    (``##ing``); for byte-level BPE and SentencePiece every piece without the word-start
    marker (``Ġ``, ``▁``), the bare marker, and byte-level pieces that are part of a
    character (they decode to U+FFFD)."""
    convention = piece_convention(tokenizer)
    vocab = tokenizer.get_vocab()
    banned = torch.zeros(vocabulary_size(tokenizer), dtype=torch.bool)
    for token, index in vocab.items():
        if not convention.starts_word(token) or (
                token.startswith("[") and token.endswith("]")) or (
                token.startswith("<") and token.endswith(">")):
            banned[index] = True
        elif convention.kind == "word_start":
            surface = tokenizer.convert_tokens_to_string([token]).strip()
            banned[index] = not surface or "\ufffd" in surface
    banned[list(tokenizer.all_special_ids)] = True
    return banned


class MaskedLM:
    """A frozen encoder plus an MLM head (the checkpoint's or a fitted one), for inference."""

    def __init__(self, encoder: nn.Module, head: nn.Module, tokenizer: PreTrainedTokenizerBase,
                 source: HeadSource, summary: dict[str, Any], key: str | None = None,
                 from_cache: bool = False) -> None:
        self.encoder = encoder.eval()
        self.head = head.eval()
        self.tokenizer = tokenizer
        self.source = source
        self.summary = summary
        self.key = key
        self.from_cache = from_cache
        self.forwards = 0
        """Encoder forward passes run by :meth:`top_k` (for benchmarks)."""

    @functools.cached_property
    def banned(self) -> torch.Tensor:
        """:func:`banned_candidate_ids` of the tokenizer, made when :meth:`top_k` first
        asks: a head read for its logits alone (DistilBERT's teacher head) needs no word
        convention of its tokenizer."""
        return banned_candidate_ids(self.tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.encoder.parameters()).device

    def to(self, device: str | torch.device) -> MaskedLM:
        self.encoder.to(device)
        self.head.to(device)
        return self

    @torch.inference_mode()
    def logits_at(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  positions: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                  all_positions: bool = False) -> torch.Tensor:
        """Vocabulary logits ``[batch, vocab]`` at one position per row.

        Only the selected positions go through the head: the vocabulary projection of
        every position would cost about as much as the encoder itself (MiniLM) or a
        quarter of it (BERT-base).  ``all_positions``: project every position first, as
        a ``*ForMaskedLM`` model's forward does (the authors' augmentation script: the
        faithful cost of its one forward per word), then pick the row's position.
        ``attention_mask`` None: no padding anywhere.
        """
        device = self.device
        inputs = {"input_ids": input_ids.to(device)}
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask.to(device)
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids.to(device)
        hidden = self.encoder(**inputs).last_hidden_state
        rows = torch.arange(hidden.shape[0], device=device)
        if all_positions:
            return self.head(hidden)[rows, positions.to(device)].float()
        return self.head(hidden[rows, positions.to(device)]).float()

    @torch.inference_mode()
    def top_k(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
              mask_positions: torch.Tensor, k: int,
              exclude_ids: torch.Tensor | None = None,
              token_type_ids: torch.Tensor | None = None,
              all_positions: bool = False) -> torch.Tensor:
        """The ``k`` most likely candidate ids ``[batch, k]`` at each row's masked position.

        Special/bracketed tokens and pieces that do not start a word
        (:func:`banned_candidate_ids`) are never returned; ``exclude_ids``
        (``[batch]`` or ``[batch, n]``, negative entries ignored) removes more ids per row,
        e.g. the masked word itself.  ``all_positions``: see :meth:`logits_at`.
        """
        logits = self.logits_at(input_ids, attention_mask, mask_positions, token_type_ids,
                                all_positions)
        self.forwards += 1
        vocab = logits.shape[1]
        banned = self.banned[:vocab]
        if vocab > banned.numel():  # ids past the tokenizer's (a padded embedding matrix)
            banned = torch.cat([banned, banned.new_ones(vocab - banned.numel())])
        banned = banned.to(logits.device)
        logits = logits.masked_fill(banned, -torch.inf)
        if exclude_ids is not None:
            exclude = exclude_ids.to(logits.device)
            if exclude.dim() == 1:
                exclude = exclude[:, None]
            valid = exclude >= 0
            rows = torch.arange(logits.shape[0], device=logits.device)[:, None].expand_as(exclude)
            logits[rows[valid], exclude[valid]] = -torch.inf
        return logits.topk(min(k, vocab), dim=1).indices.cpu()

    def made_from(self) -> list[tuple[str, str]]:
        """The cache entry (kind, key) whose files its predictions read: a fitted head's,
        whose weights (``head.pt``) a fit on another machine or thread count makes other;
        none for the checkpoint's own head, whose weights come from the checkpoint (its
        entry holds a summary only).  An entry computed with this masked LM records it as
        a source (:meth:`~harness.common.cache.ArtifactCache.build`'s ``made_from``)."""
        if self.source == "fitted_head" and self.key is not None:
            return [(MLM_HEAD_KIND, self.key)]
        return []

    def describe(self) -> dict[str, Any]:
        keys = ("recall_at_k", "k", "top1", "eval_tokens", "steps", "corpus_sentences")
        return {"source": self.source, "key": self.key,
                **{key: self.summary.get(key) for key in keys}}


# --------------------------------------------------------------------------- loading


@contextmanager
def _quiet_transformers():
    """Silence transformers' load report (a bare encoder loaded as MaskedLM lists every
    missing head weight: that is expected here and inspected through loading info)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def head_key(checkpoint: Checkpoint, corpus: Sequence[str], config: MLMHeadConfig,
             source: HeadSource) -> str:
    return mlm_head_key(checkpoint=checkpoint.identity, source=source,
                        corpus=sentences_fingerprint(corpus), config=config.model_dump())


def load_masked_lm(checkpoint: Checkpoint, corpus: Sequence[str], cache: ArtifactCache,
                   config: MLMHeadConfig | None = None, log: Callable[[str], None] = print,
                   tokenizer: PreTrainedTokenizerBase | None = None,
                   device: str | torch.device | None = None) -> MaskedLM:
    """The checkpoint's masked LM: its own head if it has one, else a fitted (cached) head.

    ``corpus``: sentences to fit the head on (duplicates are dropped, order kept) and to
    take the held-out evaluation slice from.  The checkpoint's own head is evaluated on
    the same held-out slice (the summary is cached too).
    """
    config = config or MLMHeadConfig()
    tokenizer = tokenizer or load_tokenizer(checkpoint)
    corpus = list(dict.fromkeys(sentence for sentence in corpus if sentence.strip()))
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    encoder, head = _encoder_and_head(checkpoint, config)
    encoder.requires_grad_(False)
    encoder.eval().to(device)
    request = _HeadRequest(checkpoint, corpus, cache, config, log)
    if head is not None:
        return _checkpoint_head_lm(request, encoder, head.to(device), tokenizer)
    return _fitted_head_lm(request, encoder, tokenizer, device)


@dataclass(frozen=True)
class _HeadRequest:
    """What a masked LM's head is read, evaluated or fitted for, and where it is cached."""

    checkpoint: Checkpoint
    corpus: list[str]
    cache: ArtifactCache
    config: MLMHeadConfig
    log: Callable[[str], None]


def _encoder_and_head(checkpoint: Checkpoint,
                      config: MLMHeadConfig) -> tuple[nn.Module, nn.Module | None]:
    """The checkpoint's encoder and its own masked-LM head: None where it has none (a model
    type without a masked-LM class, head weights missing) or ``use_checkpoint_head`` is off."""
    with _quiet_transformers(), reading(checkpoint):
        try:
            model, info = AutoModelForMaskedLM.from_pretrained(
                checkpoint.location, output_loading_info=True, **checkpoint.load_kwargs)
        except ValueError:  # a model type without a masked-LM class
            model, info = None, None
    if model is None:
        with _quiet_transformers(), reading(checkpoint):
            return AutoModel.from_pretrained(checkpoint.location, **checkpoint.load_kwargs), None
    prefix = f"{model.base_model_prefix}."
    missing_head = [key for key in info["missing_keys"] if not key.startswith(prefix)]
    if not missing_head and config.use_checkpoint_head:
        return model.base_model, _checkpoint_head(model)
    return model.base_model, None


def _checkpoint_head_lm(request: _HeadRequest, encoder: nn.Module, head: nn.Module,
                        tokenizer: PreTrainedTokenizerBase) -> MaskedLM:
    """The masked LM with the checkpoint's own head, its held-out summary cached."""
    checkpoint, corpus, cache, config = (request.checkpoint, request.corpus, request.cache,
                                         request.config)
    head.requires_grad_(False)
    key = head_key(checkpoint, corpus, config, "checkpoint_head")
    masked_lm = MaskedLM(encoder, head, tokenizer, "checkpoint_head", {}, key)
    if cache.has(MLM_HEAD_KIND, key):
        masked_lm.summary = _read_summary(cache, key)
        masked_lm.from_cache = True
    else:
        summary = {"source": "checkpoint_head", "checkpoint": checkpoint.spec,
                   "corpus_sentences": len(corpus), "steps": 0, "seconds": 0.0}
        if corpus:
            _, held_out = _split(corpus, config)
            summary.update(evaluate_head(masked_lm, held_out, config))
        with cache.build(MLM_HEAD_KIND, key, {"checkpoint": checkpoint.spec,
                                          "source": "checkpoint_head"}) as scratch:
            (scratch / "summary.json").write_text(json.dumps(summary, indent=2))
        masked_lm.summary = summary
    request.log(f"[mlm] {checkpoint.spec}: using the checkpoint's MLM head"
                f"{_recall_text(masked_lm.summary)}")
    return masked_lm


def _fitted_head_lm(request: _HeadRequest, encoder: nn.Module,
                    tokenizer: PreTrainedTokenizerBase, device: torch.device) -> MaskedLM:
    """The masked LM with a head tied to the encoder's word embeddings: read from the cache,
    else fitted on the corpus, evaluated on its held-out slice and cached."""
    checkpoint, corpus, cache, config = (request.checkpoint, request.corpus, request.cache,
                                         request.config)
    embeddings = encoder.get_input_embeddings().weight
    hidden_size = encoder.config.hidden_size
    eps = getattr(encoder.config, "layer_norm_eps", 1e-12)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        fitted = TiedMLMHead(embeddings, hidden_size, eps).to(device)
    key = head_key(checkpoint, corpus, config, "fitted_head")
    if cache.has(MLM_HEAD_KIND, key):
        path = cache.path(MLM_HEAD_KIND, key)
        fitted.load_own_state(_read_head_state(path / "head.pt", device))
        summary = _read_summary(cache, key)
        request.log(f"[mlm] {checkpoint.spec}: fitted MLM head from the cache"
                    f"{_recall_text(summary)} ({path})")
        return MaskedLM(encoder, fitted, tokenizer, "fitted_head", summary, key, from_cache=True)

    if len(corpus) < 2:
        raise ValueError(f"{checkpoint.spec} has no masked-LM head and the corpus to fit one "
                         f"has {len(corpus)} sentences: pass the task's training sentences "
                         f"(or a checkpoint with an MLM head)")
    request.log(f"[mlm] {checkpoint.spec} has no masked-LM head: fitting one tied to its word "
                f"embeddings on {len(corpus)} sentences ({config.steps} steps x "
                f"{config.batch_size})")
    summary = fit_head(encoder, fitted, tokenizer, corpus, config, request.log)
    summary["checkpoint"] = checkpoint.spec
    masked_lm = MaskedLM(encoder, fitted, tokenizer, "fitted_head", summary, key)
    _, held_out = _split(corpus, config)
    summary.update(evaluate_head(masked_lm, held_out, config))
    with cache.build(MLM_HEAD_KIND, key, {"checkpoint": checkpoint.spec,
                                      "source": "fitted_head"}) as scratch:
        torch.save(fitted.own_state(), scratch / "head.pt")
        (scratch / "summary.json").write_text(json.dumps(summary, indent=2))
    request.log(f"[mlm] fitted head{_recall_text(summary)} in {summary['seconds']:.0f}s; "
                f"cached at {cache.path(MLM_HEAD_KIND, key)}")
    return masked_lm


def _read_head_state(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """A fitted head's weights, as ``torch.load`` reads them with ``weights_only``: tensors
    and containers only, never an object a pickle could build (one that holds anything
    else is refused, naming the file)."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as error:
        # The line naming what the file asked for (torch's first advises loading it unsafely).
        named = [line.strip() for line in str(error).splitlines() if "GLOBAL" in line]
        raise ValueError(f"{path}: refused, it holds more than tensors "
                         f"({named[0] if named else 'not weights only'}); remove the entry "
                         f"{path.parent} to fit the head again") from error


def _read_summary(cache: ArtifactCache, key: str) -> dict[str, Any]:
    return json.loads((cache.path(MLM_HEAD_KIND, key) / "summary.json").read_text())


def _recall_text(summary: dict[str, Any]) -> str:
    if summary.get("recall_at_k") is None:
        return ""
    return (f": held-out recall@{summary['k']} {summary['recall_at_k']:.3f}, top-1 "
            f"{summary['top1']:.3f} ({summary['eval_tokens']} masked tokens)")


# --------------------------------------------------------------------------- fitting


def _split(corpus: Sequence[str], config: MLMHeadConfig) -> tuple[list[str], list[str]]:
    """(training, held-out) sentences: a seeded shuffle, held-out at most a fifth."""
    order = np.random.default_rng(config.seed).permutation(len(corpus))
    held = min(config.eval_sentences, max(1, len(corpus) // 5))
    return [corpus[i] for i in order[held:]], [corpus[i] for i in order[:held]]


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, :len(row)] = torch.tensor(row)
        mask[index, :len(row)] = 1
    return ids, mask


def _maskable(ids: torch.Tensor, attention: torch.Tensor, special: torch.Tensor) -> torch.Tensor:
    return attention.bool() & ~special[ids]


def _special_mask(tokenizer: PreTrainedTokenizerBase, vocab: int) -> torch.Tensor:
    special = torch.zeros(vocab, dtype=torch.bool)
    special[[i for i in tokenizer.all_special_ids if i < vocab]] = True
    return special


def fit_head(encoder: nn.Module, head: TiedMLMHead, tokenizer: PreTrainedTokenizerBase,
             corpus: Sequence[str], config: MLMHeadConfig,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train ``head`` (encoder frozen) with 15% masking, 80/10/10; returns a summary."""
    started = time.perf_counter()
    device = next(head.parameters()).device
    train, _ = _split(corpus, config)
    encoded = tokenizer(train, truncation=True, max_length=config.max_length)["input_ids"]
    vocab = head.bias.shape[0]
    special = _special_mask(tokenizer, vocab)
    if config.bias_init == "unigram":
        _unigram_bias(head, encoded, special)
    optimizer, scheduler = _head_optimizer(head, config)
    generator = torch.Generator().manual_seed(config.seed)
    order = torch.randperm(len(encoded), generator=generator)
    cursor = 0
    losses: list[float] = []
    head.train()
    encoder.eval()
    bar = progress_bar(range(config.steps), desc="fit MLM head", unit="step", leave=False,
               disable=config.steps < 50)
    for _ in bar:
        if cursor + config.batch_size > len(order):
            order, cursor = torch.randperm(len(encoded), generator=generator), 0
        batch = [encoded[i] for i in order[cursor:cursor + config.batch_size].tolist()]
        cursor += config.batch_size
        ids, attention = _pad(batch, tokenizer.pad_token_id or 0)
        inputs, chosen = _mask_for_training(ids, attention, special, tokenizer.mask_token_id,
                                            config.mask_prob, generator)
        with torch.no_grad():
            hidden = encoder(input_ids=inputs.to(device),
                             attention_mask=attention.to(device)).last_hidden_state
        logits = head(hidden[chosen.to(device)])
        loss = nn.functional.cross_entropy(logits, ids[chosen].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if len(losses) % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    head.eval()
    window = max(1, min(20, len(losses) // 5))
    return {
        "source": "fitted_head",
        "steps": config.steps,
        "batch_size": config.batch_size,
        "corpus_sentences": len(corpus),
        "train_sentences": len(train),
        "loss_start": float(np.mean(losses[:window])) if losses else None,
        "loss_end": float(np.mean(losses[-window:])) if losses else None,
        "seconds": time.perf_counter() - started,
        "config": config.model_dump(),
        "torch_threads": torch.get_num_threads(),
    }


def _unigram_bias(head: TiedMLMHead, encoded: Sequence[Sequence[int]],
                  special: torch.Tensor) -> None:
    """Start the head's bias at the training tokens' log frequencies (special tokens as
    unseen ones, with the same +0.1 smoothing)."""
    vocab = head.bias.shape[0]
    counts = np.bincount(np.fromiter((i for row in encoded for i in row), dtype=np.int64),
                         minlength=vocab)[:vocab].astype(np.float64)
    counts[special.numpy()] = 0
    with torch.no_grad():
        head.bias.copy_(torch.from_numpy(np.log((counts + 0.1) / (counts + 0.1).sum())))


def _head_optimizer(head: TiedMLMHead, config: MLMHeadConfig
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the head's trainable parameters (no decay on vectors) and a linear
    warm-up then linear decay to zero over ``config.steps``."""
    trainable = [p for p in head.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.dim() > 1]
    no_decay = [p for p in trainable if p.dim() <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)
    warmup = max(1, int(config.warmup_fraction * config.steps))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (config.steps - step) / max(1, config.steps - warmup))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def _mask_for_training(ids: torch.Tensor, attention: torch.Tensor, special: torch.Tensor,
                       mask_token_id: int, mask_prob: float, generator: torch.Generator
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the inputs, the chosen positions) of a padded batch: each real, non-special token
    (``special``: a flag per vocabulary entry) chosen with ``mask_prob`` (where none in the
    batch is, the first of each row), then replaced by [MASK] 80% of the time, by a random
    token 10%, and kept 10%."""
    maskable = _maskable(ids, attention, special)
    chosen = (torch.rand(ids.shape, generator=generator) < mask_prob) & maskable
    if not chosen.any():
        chosen = maskable & (torch.cumsum(maskable, 1) == 1)  # one token per row
    inputs = ids.clone()
    roll = torch.rand(ids.shape, generator=generator)
    inputs[chosen & (roll < 0.8)] = mask_token_id
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = torch.randint(len(special), (int(swap.sum()),), generator=generator)
    return inputs, chosen


@torch.no_grad()
def evaluate_head(masked_lm: MaskedLM, sentences: Sequence[str], config: MLMHeadConfig,
                  batch_size: int = 64) -> dict[str, Any]:
    """Recall@k and top-1 on held-out tokens masked with [MASK] (15%, at least one per
    sentence), over the whole vocabulary (nothing excluded), with two baselines: chance
    (k / vocab) and the k most frequent tokens of the held-out sentences."""
    tokenizer = masked_lm.tokenizer
    encoded = tokenizer(list(sentences), truncation=True,
                        max_length=config.max_length)["input_ids"]
    vocab = vocabulary_size(tokenizer)
    special = _special_mask(tokenizer, vocab)
    generator = torch.Generator().manual_seed(config.seed + 1)
    k = config.recall_k
    hits = top1 = total = 0
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    targets_all: list[torch.Tensor] = []
    for start in range(0, len(order), batch_size):
        rows = [encoded[i] for i in order[start:start + batch_size]]
        ids, attention = _pad(rows, tokenizer.pad_token_id or 0)
        maskable = _maskable(ids, attention, special)
        chosen = (torch.rand(ids.shape, generator=generator) < config.mask_prob) & maskable
        first = maskable & (torch.cumsum(maskable, 1) == 1)
        chosen |= first & ~chosen.any(1, keepdim=True)
        row_index, column = chosen.nonzero(as_tuple=True)
        if len(row_index) == 0:
            continue
        inputs = ids.masked_fill(chosen, tokenizer.mask_token_id)
        device = masked_lm.device
        hidden = masked_lm.encoder(input_ids=inputs.to(device),
                                   attention_mask=attention.to(device)).last_hidden_state
        logits = masked_lm.head(hidden[row_index.to(device), column.to(device)]).float().cpu()
        targets = ids[row_index, column]
        top = logits.topk(k, dim=1).indices
        hits += int((top == targets[:, None]).any(1).sum())
        top1 += int((top[:, 0] == targets).sum())
        total += len(targets)
        targets_all.append(targets)
    result: dict[str, Any] = {"k": k, "eval_sentences": len(encoded), "eval_tokens": total,
                              "recall_at_k": hits / total if total else math.nan,
                              "top1": top1 / total if total else math.nan,
                              "chance_recall_at_k": k / vocab}
    if targets_all:
        # Frequency baseline: always guess the k most frequent tokens of the held-out
        # sentences themselves (an optimistic baseline: it has seen the held-out counts).
        targets = torch.cat(targets_all)
        counts = torch.bincount(torch.tensor(
            [i for row in encoded for i in row], dtype=torch.long), minlength=vocab)[:vocab]
        counts[special] = 0
        frequent = counts.topk(k).indices
        result["unigram_recall_at_k"] = float(torch.isin(targets, frequent).float().mean())
        result["unigram_top1"] = float((targets == frequent[0]).float().mean())
    return result
