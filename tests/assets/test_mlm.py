"""Masked-LM candidates: checkpoint heads, fitted tied heads, evaluation and caching."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoTokenizer, BertConfig, BertForMaskedLM

from harness.assets.checkpoints import resolve_checkpoint
from harness.assets.mlm import (
    MaskedLM,
    MLMHeadConfig,
    TiedMLMHead,
    banned_candidate_ids,
    head_key,
    load_masked_lm,
)
from harness.common.cache import ArtifactCache
from tests.conftest import MINILM_DIR

SUBJECTS = ["the cat", "the dog", "the man", "the woman"]
PATTERNS = [("plays the", ["guitar", "piano"]), ("sings a", ["song"]),
            ("walks in the", ["park"]), ("is very", ["happy", "sad"])]


def tiny_corpus(count: int = 160, seed: int = 0) -> list[str]:
    """Sentences whose last word is predictable from the verb before it."""
    rng = random.Random(seed)
    sentences = []
    for index in range(count):
        verb, objects = PATTERNS[index % len(PATTERNS)]
        subject = rng.choice(SUBJECTS)
        sentences.append(f"{subject} {verb} {rng.choice(objects)} number {index} .")
    return sentences


def write_tiny_mlm(path: Path, hidden: int = 32) -> Path:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=2 * hidden,
                        max_position_embeddings=128)
    BertForMaskedLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(MINILM_DIR).save_pretrained(path)
    return path


FAST = MLMHeadConfig(steps=80, batch_size=16, lr=3e-2, eval_sentences=40,
                     max_length=32)


@pytest.fixture(scope="module")
def fitted(tiny_teacher_dir, tmp_path_factory):
    cache = ArtifactCache(tmp_path_factory.mktemp("cache"))
    checkpoint = resolve_checkpoint(str(tiny_teacher_dir))
    logs: list[str] = []
    masked_lm = load_masked_lm(checkpoint, tiny_corpus(), cache, FAST, log=logs.append,
                               device="cpu")
    return masked_lm, checkpoint, cache, logs


@pytest.mark.slow
def test_a_checkpoint_without_head_gets_a_fitted_tied_head(fitted, tiny_teacher_dir):
    masked_lm, _, _, logs = fitted
    assert masked_lm.source == "fitted_head" and not masked_lm.from_cache
    assert isinstance(masked_lm.head, TiedMLMHead)
    embeddings = masked_lm.encoder.get_input_embeddings().weight
    assert masked_lm.head.decoder.weight is embeddings  # tied, not a copy
    assert not any(p.requires_grad for p in masked_lm.encoder.parameters())
    original = AutoModel.from_pretrained(tiny_teacher_dir)
    for name, value in original.state_dict().items():  # the encoder did not move
        if name in masked_lm.encoder.state_dict():
            torch.testing.assert_close(masked_lm.encoder.state_dict()[name], value)
    assert any("fitting" in line for line in logs)


def test_the_fitted_head_learns(fitted):
    summary = fitted[0].summary
    assert summary["loss_end"] < summary["loss_start"] - 0.3
    assert summary["eval_tokens"] > 20
    assert summary["recall_at_k"] > 20 * summary["chance_recall_at_k"]
    # it uses the context: better than always guessing the most frequent token
    assert summary["top1"] > summary["unigram_top1"] + 0.05
    assert 0.0 <= summary["top1"] <= summary["recall_at_k"] <= 1.0
    assert summary["steps"] == FAST.steps and summary["seconds"] > 0


def test_the_fitted_head_is_cached_and_reused(fitted):
    masked_lm, checkpoint, cache, _ = fitted
    logs: list[str] = []
    again = load_masked_lm(checkpoint, tiny_corpus(), cache, FAST, log=logs.append,
                           device="cpu")
    assert again.from_cache and again.key == masked_lm.key
    assert not any("fitting" in line for line in logs)
    assert again.summary == masked_lm.summary
    for name, value in masked_lm.head.own_state().items():
        torch.testing.assert_close(again.head.own_state()[name], value)
    # what changes the head changes the key
    assert head_key(checkpoint, tiny_corpus()[:-1], FAST, "fitted_head") != masked_lm.key
    changed = FAST.model_copy(update={"steps": 61})
    assert head_key(checkpoint, tiny_corpus(), changed, "fitted_head") != masked_lm.key


@pytest.mark.slow
def test_a_checkpoint_with_a_head_uses_it(tmp_path):
    folder = write_tiny_mlm(tmp_path / "mlm")
    checkpoint = resolve_checkpoint(str(folder))
    cache = ArtifactCache(tmp_path / "cache")
    masked_lm = load_masked_lm(checkpoint, tiny_corpus(40), cache, FAST, log=lambda _: None,
                               device="cpu")
    assert masked_lm.source == "checkpoint_head"
    assert not isinstance(masked_lm.head, TiedMLMHead)
    reference = BertForMaskedLM.from_pretrained(folder)
    ids = torch.tensor([[101, 1996, 103, 2003, 102]])
    expected = reference(input_ids=ids).logits[0, 2]
    got = masked_lm.logits_at(ids, torch.ones_like(ids), torch.tensor([2]))[0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert "recall_at_k" in masked_lm.summary
    again = load_masked_lm(checkpoint, tiny_corpus(40), cache, FAST, log=lambda _: None)
    assert again.from_cache and again.summary == masked_lm.summary
    forced = load_masked_lm(checkpoint, tiny_corpus(40), cache,
                            FAST.model_copy(update={"use_checkpoint_head": False}),
                            log=lambda _: None)
    assert forced.source == "fitted_head"


def test_top_k_never_returns_pieces_specials_or_excluded_ids(tiny_teacher_dir):
    tokenizer = AutoTokenizer.from_pretrained(MINILM_DIR)
    encoder = AutoModel.from_pretrained(tiny_teacher_dir)
    head = TiedMLMHead(encoder.get_input_embeddings().weight, encoder.config.hidden_size)
    vocab = tokenizer.get_vocab()
    favourites = ["##ing", "[CLS]", "[unused5]", "cat", "dog", "piano"]
    with torch.no_grad():
        for rank, token in enumerate(favourites):
            head.bias[vocab[token]] = 1000.0 - rank
    masked_lm = MaskedLM(encoder, head, tokenizer, "fitted_head", {})
    ids = torch.tensor([[101, 1996, 103, 102], [101, 103, 102, 0]])
    attention = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    top = masked_lm.top_k(ids, attention, torch.tensor([2, 1]), 2,
                          torch.tensor([vocab["cat"], -1]))
    assert tokenizer.convert_ids_to_tokens(top[0].tolist()) == ["dog", "piano"]
    assert tokenizer.convert_ids_to_tokens(top[1].tolist()) == ["cat", "dog"]
    banned = banned_candidate_ids(tokenizer)
    assert banned[vocab["##ing"]] and banned[vocab["[MASK]"]] and not banned[vocab["cat"]]


def test_top_k_bans_the_ids_of_a_padded_vocabulary(tiny_teacher_dir):
    """A model whose embedding matrix is padded past its tokenizer (DeBERTa-v3's 128,100
    rows for 128,001 tokens) never offers the padding ids as words."""
    tokenizer = AutoTokenizer.from_pretrained(MINILM_DIR)
    encoder = AutoModel.from_pretrained(tiny_teacher_dir)
    encoder.resize_token_embeddings(len(tokenizer) + 6)
    head = TiedMLMHead(encoder.get_input_embeddings().weight, encoder.config.hidden_size)
    with torch.no_grad():
        head.bias[len(tokenizer):] = 1000.0  # the padding rows would win
        head.bias[tokenizer.get_vocab()["cat"]] = 500.0
    masked_lm = MaskedLM(encoder, head, tokenizer, "fitted_head", {})
    top = masked_lm.top_k(torch.tensor([[101, 103, 102]]), torch.ones(1, 3, dtype=torch.long),
                          torch.tensor([1]), 1)
    assert tokenizer.convert_ids_to_tokens(top[0].tolist()) == ["cat"]


def test_a_corpus_is_needed_to_fit(tiny_teacher_dir, tmp_path):
    checkpoint = resolve_checkpoint(str(tiny_teacher_dir))
    with pytest.raises(ValueError, match="no masked-LM head"):
        load_masked_lm(checkpoint, [], ArtifactCache(tmp_path), FAST, log=lambda _: None)


def test_config_rejects_unknown_keys():
    with pytest.raises(ValueError):
        MLMHeadConfig(step=3)
