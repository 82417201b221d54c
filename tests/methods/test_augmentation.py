"""TinyBERT augmentation: determinism, rows, replacement rate, candidate sources, and the
batched path against the one-forward-per-word reference."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from harness.api.context import AugmentContext
from harness.api.registry import instantiate
from harness.assets.checkpoints import Checkpoint, resolve_checkpoint
from harness.assets.glove import GloveVectors
from harness.assets.mlm import MaskedLM, MLMHeadConfig, load_masked_lm
from harness.common.cache import ArtifactCache, content_hash
from harness.config.identity import MLM_HEAD_KIND
from harness.config.schema import MethodRecipe
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from harness.teacher.augmented import AugmentedSet
from methods.tinybert.augmentation import (
    AugmentParams,
    ContextualAugmenter,
    augment_per_word_loop,
    cased_like,
)
from tests.assets.test_mlm import write_tiny_mlm
from tests.conftest import MINILM_DIR, WORDS, refit_mlm_head

MULTI = "xylophonist"  # five word pieces in the MiniLM vocabulary
MULTI_NEIGHBOURS = ["marimbist", "vibraphonist", "glockenspielist"]


def make_examples(count: int = 12, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)

    def sentence() -> str:
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 9))]
        words.insert(rng.randrange(len(words)), MULTI)
        return " ".join(words).capitalize() + "."

    return [(sentence(), sentence()) for _ in range(count)]


@pytest.fixture(scope="module")
def glove_file(tmp_path_factory) -> Path:
    """Every example word has neighbours; the multi-piece word's are recognisable."""
    rng = np.random.default_rng(0)
    rows = {word: rng.normal(size=8) for word in [*WORDS, "."]}
    base = rng.normal(size=8)
    rows[MULTI] = base
    for index, word in enumerate(MULTI_NEIGHBOURS):
        rows[word] = base + 0.01 * (index + 1) * rng.normal(size=8)
    path = tmp_path_factory.mktemp("glove") / "tiny.txt"
    path.write_text("".join(f"{w} " + " ".join(f"{v:.5f}" for v in vec) + "\n"
                            for w, vec in rows.items()))
    return path


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MINILM_DIR)


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory, tokenizer):
    folder = write_tiny_mlm(tmp_path_factory.mktemp("mlm"))
    cache = ArtifactCache(tmp_path_factory.mktemp("cache"))
    corpus = [text for example in make_examples(30, seed=1) for text in example]
    return load_masked_lm(resolve_checkpoint(str(folder)), corpus, cache,
                          MLMHeadConfig(eval_sentences=10), log=lambda _: None,
                          tokenizer=tokenizer, device="cpu")


def augmenter(tokenizer, masked_lm, glove_file, **params) -> ContextualAugmenter:
    settings = AugmentParams(**{"copies": 4, "top_k": 5, "batch_size": 7, **params})
    return ContextualAugmenter(tokenizer, settings, GloveVectors(glove_file), masked_lm)


@pytest.mark.slow
def test_deterministic_under_a_seed_and_different_across_seeds(tokenizer, masked_lm,
                                                               glove_file):
    examples = make_examples()
    first = augmenter(tokenizer, masked_lm, glove_file).augment(examples, 3, progress=False)
    fresh = augmenter(tokenizer, masked_lm, glove_file).augment(examples, 3, progress=False)
    assert first == fresh
    other = augmenter(tokenizer, masked_lm, glove_file).augment(examples, 4, progress=False)
    assert other != first


@pytest.mark.slow
def test_every_row_gets_exactly_its_copies_and_other_fields_are_untouched(tokenizer,
                                                                         masked_lm,
                                                                         glove_file):
    examples = make_examples()
    out = augmenter(tokenizer, masked_lm, glove_file, copies=5).augment(examples, 0,
                                                                       progress=False)
    assert [row for row, _ in out] == [row for row in range(len(examples)) for _ in range(5)]
    for row, fields in out:
        assert len(fields) == 2
        assert fields[1] == examples[row][1]  # fields="first": the second sentence stays
    both = augmenter(tokenizer, masked_lm, glove_file, fields="all").augment(
        examples, 0, progress=False)
    assert any(fields[1] != examples[row][1] for row, fields in both)


@pytest.mark.slow
def test_chunking_does_not_change_the_output(tokenizer, masked_lm, glove_file):
    examples = make_examples()
    whole = augmenter(tokenizer, masked_lm, glove_file).augment(examples, 9, progress=False)
    chunked = augmenter(tokenizer, masked_lm, glove_file, chunk_examples=5).augment(
        examples, 9, progress=False)
    assert whole == chunked


@pytest.mark.slow
@pytest.mark.parametrize("candidates", ["glove", "mlm"])
def test_replacement_rate_matches_p(tokenizer, masked_lm, glove_file, candidates):
    examples = make_examples(20, seed=2)
    aug = augmenter(tokenizer, masked_lm, glove_file, copies=40, p_replace=0.25,
                    candidates=candidates)
    changed = total = 0
    for row, fields in aug.augment(examples, 1, progress=False):
        original = aug.words(examples[row][0])
        new = fields[0].split(" ")
        assert len(new) == len(original)  # one word for one word
        changed += sum(a != b for a, b in zip(original, new, strict=True))
        total += len(original)
    assert total > 5000
    assert abs(changed / total - 0.25) < 0.025
    never = augmenter(tokenizer, masked_lm, glove_file, p_replace=0.0)
    for row, fields in never.augment(examples, 1, progress=False):
        assert fields[0] == " ".join(never.words(examples[row][0]))


def test_single_pieces_get_mlm_candidates_and_multi_pieces_glove(tokenizer, masked_lm,
                                                                glove_file):
    aug = augmenter(tokenizer, masked_lm, glove_file, p_replace=1.0, copies=6)
    text = f"The cat plays the {MULTI} quickly."
    found = aug.word_candidates(text)
    words = aug.words(text)
    assert [c.word for c in found] == words
    multi = words.index(MULTI)
    assert found[multi].source == "glove"
    assert set(found[multi].candidates[:3]) == set(MULTI_NEIGHBOURS)
    for position, word in enumerate(words):
        if position == multi:
            continue
        assert found[position].source == "mlm"
        assert len(found[position].candidates) == 5 and word not in found[position].candidates
        assert not any(c.startswith(("##", "[")) for c in found[position].candidates)
    glove_neighbours = GloveVectors(glove_file).nearest([MULTI], 5)[MULTI]
    for _, fields in aug.augment([(text,)], 0, progress=False):
        new_words = fields[0].split(" ")
        assert new_words[multi] in glove_neighbours
        for position, new in enumerate(new_words):
            assert new in found[position].candidates


def test_glove_only_uses_neighbours_for_every_word(tokenizer, glove_file, tmp_path):
    """Built through the plugin's hook, as a run builds it: GloVe candidates need no
    masked-LM head, so the suite's corpus (slow to tokenise) is never loaded."""
    nowhere = Checkpoint("nowhere", str(tmp_path / "no-model"), {"none": True})
    corpus_loads: list[int] = []

    def corpus() -> list[str]:
        corpus_loads.append(1)
        return []

    tinybert = instantiate("tinybert", MethodRecipe(params={"augmentation": {
        "candidates": "glove", "glove_path": str(glove_file)}}))
    aug = tinybert.augmenter(AugmentContext(nowhere, tokenizer, corpus, ArtifactCache(tmp_path),
                                            log=lambda _: None))
    assert aug.masked_lm is None and aug.describe()["source"] == "glove_only"
    assert not corpus_loads
    assert all(c.source == "glove" for c in aug.word_candidates("the cat plays ."))


@pytest.mark.slow
def test_batched_equals_the_per_word_loop(tokenizer, masked_lm, glove_file):
    examples = make_examples(10, seed=5)
    for fields in ("first", "all"):
        batched = augmenter(tokenizer, masked_lm, glove_file, fields=fields)
        reference = augmenter(tokenizer, masked_lm, glove_file, fields=fields)
        fast = batched.augment(examples, 11, progress=False)
        fast_forwards = batched.stats["mlm_forwards"]
        slow = augment_per_word_loop(reference, examples, 11, progress=False)
        assert fast == slow
        assert fast_forwards < reference.stats["mlm_forwards"]


@pytest.mark.slow
def test_long_sentences_are_windowed_around_the_mask(tokenizer, masked_lm, glove_file):
    aug = augmenter(tokenizer, masked_lm, glove_file, max_length=16)
    text = " ".join(f"{WORDS[i % len(WORDS)]}" for i in range(60))
    sentence = aug._sentence(text)
    for position in (0, 30, 59):
        ids, at = aug._masked_sequence(sentence, position)
        assert len(ids) == 16 and ids[at] == tokenizer.mask_token_id
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    out = aug.augment([(text,)], 0, progress=False)
    assert len(out) == 4


def test_describe_names_the_source_and_is_hashable(tokenizer, masked_lm, glove_file):
    description = augmenter(tokenizer, masked_lm, glove_file).describe()
    assert description["source"] == "checkpoint_head"
    assert description["mlm"]["source"] == "checkpoint_head"
    assert description["params"]["copies"] == 4
    assert content_hash(description) == content_hash(
        augmenter(tokenizer, masked_lm, glove_file).describe())


def test_params_reject_unknown_keys():
    with pytest.raises(ValueError):
        AugmentParams(copys=3)
    assert AugmentParams().copies == 20 and AugmentParams().p_replace == 0.4
    assert AugmentParams().top_k == 15 and AugmentParams().fields == "first"


@pytest.mark.slow
def test_authors_word_filter_keeps_stop_words_and_punctuation_and_matches_the_loop(
        tokenizer, masked_lm, glove_file):
    """words="authors": only a-z words outside the script's stop-word list are replaced;
    batched and per-word loop still agree copy for copy."""
    examples = make_examples(10, seed=6)
    batched = augmenter(tokenizer, masked_lm, glove_file, words="authors", p_replace=0.9)
    reference = augmenter(tokenizer, masked_lm, glove_file, words="authors", p_replace=0.9)
    fast = batched.augment(examples, 2, progress=False)
    assert fast == augment_per_word_loop(reference, examples, 2, progress=False)
    kept = {"the", "a", "is", "was", "not", "very", "."}
    for row, fields in fast:
        original = batched.words(examples[row][0])
        new = fields[0].split(" ")
        for old, word in zip(original, new, strict=True):
            if old.lower() in kept:
                assert word == old
    assert any(fields[0] != " ".join(batched.words(examples[row][0])) for row, fields in fast)
    found = batched.word_candidates("The cat is very happy .")
    assert [c.source for c in found] == ["none", "mlm", "none", "none", "mlm", "none"]
    assert found[0].candidates == ()
    # the loop computed candidates only for the words that may change
    everything = augmenter(tokenizer, masked_lm, glove_file, p_replace=0.9)
    augment_per_word_loop(everything, examples, 2, progress=False)
    assert reference.stats["mlm_forwards"] < everything.stats["mlm_forwards"]


def test_a_later_option_at_its_default_leaves_the_params_dump_and_run_ids_alone():
    default = AugmentParams().model_dump()
    assert "words" not in default
    assert set(default) == {"copies", "p_replace", "top_k", "candidates", "fields",
                            "mlm_head", "batch_size", "max_length", "chunk_examples",
                            "glove_path"}
    assert AugmentParams(words="authors").model_dump()["words"] == "authors"
    assert AugmentParams.model_validate(AugmentParams(words="authors").model_dump()).words \
        == "authors"


def test_the_head_at_every_position_gives_the_masked_positions_candidates(tokenizer,
                                                                           masked_lm):
    """The faithful per-word cost (head over the whole sequence, as BertForMaskedLM) and
    the batched path's head at the masked position only pick the same candidates."""
    ids = tokenizer(["the cat plays the guitar quickly .", "a dog sings ."],
                    padding=True, return_tensors="pt")
    masked = ids["input_ids"].clone()
    positions = torch.tensor([2, 3])
    masked[torch.arange(2), positions] = tokenizer.mask_token_id
    only = masked_lm.top_k(masked, ids["attention_mask"], positions, 8)
    every = masked_lm.top_k(masked, ids["attention_mask"], positions, 8, all_positions=True)
    assert torch.equal(only, every)
    single = masked_lm.top_k(masked[:1], None, positions[:1], 8, all_positions=True)
    assert torch.equal(single, only[:1])


@pytest.mark.slow
def test_the_authors_input_is_masked_then_original_sentence(tokenizer, masked_lm, glove_file):
    aug = augmenter(tokenizer, masked_lm, glove_file)
    sentence = aug._sentence("the cat plays .")
    ids, types, at = aug._authors_sequence(sentence, 1)
    masked, masked_at = aug._masked_sequence(sentence, 1)
    assert at == masked_at and ids[:len(masked)] == masked and ids[at] == tokenizer.mask_token_id
    original = tokenizer("the cat plays .", add_special_tokens=False)["input_ids"]
    assert ids[len(masked):] == [*original, tokenizer.sep_token_id]
    assert types == [0] * len(masked) + [1] * (len(original) + 1)
    out = augment_per_word_loop(aug, make_examples(3), 0, progress=False, authors_input=True)
    assert len(out) == 3 * 4


def test_copies_from_a_checkpoints_own_head_or_glove_name_no_cache_entry(tokenizer, masked_lm,
                                                                         glove_file):
    """The checkpoint's own head comes with its weights (its entry holds a summary only),
    GloVe vectors are named by content: neither is a cache entry the copies are made from."""
    assert augmenter(tokenizer, masked_lm, glove_file).made_from() == []
    assert augmenter(tokenizer, None, glove_file, candidates="glove").made_from() == []


@pytest.mark.e2e
def test_copies_are_made_again_when_their_fitted_head_is_fitted_again_otherwise(
        tiny_suite_file, tmp_path):
    """The tiny teacher has no masked-LM head: the copies' candidates come from one fitted
    for it, cached under a key that names its recipe, not its weights.  Fitted again with
    other weights (another machine), it gives other candidates, and the copies made with
    the old head are made again rather than served beside it."""
    suite = load_suite(str(tiny_suite_file))
    cache = tmp_path / "cache"

    def augmented(log) -> AugmentedSet:
        runner = SuiteRunner(suite, tmp_path / "results", cache, log=log)
        runner.cache.log = log
        return runner.augmented(instantiate(suite.plugin("tinybert"),
                                            suite.recipe("tinybert"), "rte"), "rte")

    first = augmented(lambda _: None)
    head, text = first.summary["augmenter"]["mlm"]["key"], first.summary["key"]
    assert first.summary["augmenter"]["source"] == "fitted_head"
    refit_mlm_head(cache / MLM_HEAD_KIND / head)
    lines: list[str] = []
    again = augmented(lines.append)
    assert again.summary["key"] == text
    assert any(f"augmented/{text[:16]} is damaged (it was made from another build of "
               f"{MLM_HEAD_KIND}/{head[:16]})" in line for line in lines), lines
    recorded = json.loads((cache / "augmented" / text / "key.json").read_text())["made_from"]
    assert recorded == {f"{MLM_HEAD_KIND}/{head}":
                        ArtifactCache(cache).files_digest(MLM_HEAD_KIND, head)}


# -- tokenizers that mark word starts: byte-level BPE (RoBERTa), SentencePiece (DeBERTa-v2) --
SOURCE = "The cat's happy, (very) sad! walks"
SOURCE_WORDS = ["The", "cat", "'", "s", "happy", ",", "(", "very", ")", "sad", "!", "walks"]


@pytest.fixture(scope="module")
def marker_tokenizers(tmp_path_factory) -> dict:
    """The architecture tests' offline tokenizers of those kinds."""
    from tests.api.test_architectures import _tokenizer, sentencepiece_tokenizer

    return {"bpe": _tokenizer("roberta", tmp_path_factory.mktemp("bpe")),
            "sentencepiece": sentencepiece_tokenizer()}


def tiny_masked_lm(tokenizer) -> MaskedLM:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=16,
                                       num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32)).eval()
    return MaskedLM(model.bert, model.cls, tokenizer, "checkpoint_head", {})


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
def test_word_start_tokenizers_split_words_and_filter_candidates(kind, marker_tokenizers,
                                                                glove_file) -> None:
    """Words are the source's own characters (punctuation split off, case kept); masked-LM
    candidates are word-start pieces written without their marker, and only a one-piece
    word whose piece starts a word gets them; copies keep the source's spacing."""
    tokenizer = marker_tokenizers[kind]
    marker = {"bpe": "\u0120", "sentencepiece": "\u2581"}[kind]
    masked_lm = tiny_masked_lm(tokenizer)
    vocab = tokenizer.get_vocab()
    allowed = {token for token, index in vocab.items() if not masked_lm.banned[index]}
    assert allowed and all(token.startswith(marker) and len(token) > 1 for token in allowed)
    assert f"{marker}cat" in allowed and f"{marker}sad" in allowed
    assert "s" in vocab and "s" not in allowed  # a piece without the marker never stands alone

    made = augmenter(tokenizer, masked_lm, glove_file, candidates="mlm", top_k=5,
                     copies=40, p_replace=0.5)
    assert made.words(SOURCE) == SOURCE_WORDS
    found = {c.word: c for c in made.word_candidates(SOURCE)}
    assert found["sad"].source == "mlm" and found["cat"].source == "mlm"
    assert found["The"].source == "glove"  # several pieces (and no marker on BPE's first word)
    words = {tokenizer.convert_tokens_to_string([token]).strip() for token in allowed}
    for candidates in found.values():
        if candidates.source == "mlm":
            assert len(candidates.candidates) == 5
            assert set(candidates.candidates) <= words - {candidates.word}
    copies = [fields[0] for _, fields in made.augment([(SOURCE,)], seed=0, progress=False)]
    shape = re.compile(r"(\S+) (\w+)'(\w+) (\w+), \((\w+)\) (\w+)! (\w+)")
    assert all(shape.fullmatch(copy) for copy in copies), copies
    assert len(set(copies)) > 10


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
def test_a_cased_tokenizers_glove_candidates_take_the_words_case(kind, marker_tokenizers,
                                                                 glove_file, tokenizer) -> None:
    """GloVe 6B's words are lower-cased: where the tokenizer keeps case, a capitalised
    word's candidates are capitalised and a word in capitals gets capitals, in the copies
    as in the candidate lists, by the batched procedure and the per-word loop alike.  An
    uncased vocabulary's words are lower-cased already: its candidates are GloVe's own,
    and its copies' description (their cache key) has no glove_case entry."""
    made = augmenter(marker_tokenizers[kind], None, glove_file, candidates="glove", top_k=5,
                     copies=30, p_replace=0.6)
    assert made.keeps_case and made.describe()["glove_case"] == "the word's"
    text = "The CAT walks"
    found = {c.word: c.candidates for c in made.word_candidates(text)}
    lower = GloveVectors(glove_file).nearest(["the", "cat", "walks"], 5)
    assert found["The"] == tuple(word.capitalize() for word in lower["the"])
    assert found["CAT"] == tuple(word.upper() for word in lower["cat"])
    assert found["walks"] == tuple(lower["walks"])
    copies = made.augment([(text,)], seed=0, progress=False)
    assert copies == augment_per_word_loop(made, [(text,)], 0, progress=False)
    firsts = {fields[0].split()[0] for _, fields in copies}
    seconds = {fields[0].split()[1] for _, fields in copies}
    assert len(firsts) > 2 and all(word[0].isupper() and word[1:].islower()
                                   for word in firsts), firsts
    assert len(seconds) > 2 and all(word.isupper() for word in seconds), seconds

    uncased = augmenter(tokenizer, None, glove_file, candidates="glove", top_k=5)
    assert not uncased.keeps_case and "glove_case" not in uncased.describe()
    assert {c.word: c.candidates for c in uncased.word_candidates(text)}["the"] == \
        tuple(lower["the"])
    assert cased_like("Paris", "London") == "London"  # a cased vector file's own case
    assert cased_like("I", "you") == "You" and cased_like("x", "y") == "y"


def test_a_masked_lm_read_for_its_logits_needs_no_word_convention() -> None:
    """DistilBERT reads a teacher's masked-LM head for its vocabulary distributions alone:
    a tokenizer whose pieces follow none of the word-start conventions (a word-level
    vocabulary here) loads and evaluates; only asking for word candidates is refused."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    from harness.assets.mlm import evaluate_head

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "down", "."]
    backend = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]",
                                        unk_token="[UNK]", cls_token="[CLS]",
                                        sep_token="[SEP]", mask_token="[MASK]")
    masked_lm = tiny_masked_lm(tokenizer)
    result = evaluate_head(masked_lm, ["the cat sat down .", "the cat sat ."],
                           MLMHeadConfig(recall_k=2))
    assert result["eval_tokens"] >= 2 and result["chance_recall_at_k"] == 2 / len(words)
    with pytest.raises(TypeError, match="word boundaries are unknown"):
        masked_lm.top_k(torch.tensor([[2, 5, 4, 3]]), None, torch.tensor([2]), 2)
