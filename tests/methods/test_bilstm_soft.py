"""BiLSTM-Soft: augmentation operations, word vocabulary and GloVe init, the BiLSTM
students, the loss terms and the recipe checks."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from harness.api.losses import gold_loss
from harness.api.method import StepInputs, TeacherView
from harness.api.registry import instantiate
from harness.assets.checkpoints import AssetNotFoundError
from harness.assets.glove import GloveVectors
from harness.common.cache import ArtifactCache
from harness.config.schema import ConfigError, parse_suite
from harness.data.features import EncodedSplit, PaddingCollator
from harness.data.tasks import get_task
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from methods.bilstm_soft import (
    KEEP,
    MASKED,
    POS_SWAP,
    AugmentationParams,
    AugmentationRates,
    BiLSTMClassifier,
    TagVocabulary,
    TangAugmenter,
    WordEncoder,
    augment_examples,
    augment_words,
    render,
)
from methods.bilstm_soft.pos import TaggedWord, tag_texts, tag_texts_cached
from methods.bilstm_soft.words import MASK, SPECIALS, WordVocabulary, embedding_matrix, tokenize
from tests.conftest import record_as_rebuilt, tiny_suite_dict


# A small tagged corpus: several words per tag, with known frequencies.
def tagged_words(*pairs: tuple[str, str]) -> list[TaggedWord]:
    """Words as written, lower-case, each followed by a space."""
    return [TaggedWord(word, tag, word) for word, tag in pairs]


CORPUS = [
    tagged_words(("the", "DT"), ("cat", "NN"), ("runs", "VBZ"), ("quickly", "RB")),
    tagged_words(("a", "DT"), ("dog", "NN"), ("sings", "VBZ"), ("slowly", "RB")),
    tagged_words(("the", "DT"), ("man", "NN"), ("walks", "VBZ"), ("very", "RB"), ("happily", "RB")),
    tagged_words(("the", "DT"), ("cat", "NN"), ("plays", "VBZ")),
]
LONG = [token for sentence in CORPUS for token in sentence] * 3  # 48 words


def tags() -> TagVocabulary:
    return TagVocabulary(CORPUS)


def test_mask_and_pos_rates_are_respected_and_exclusive_per_word():
    rates = AugmentationRates(p_mask=0.1, p_pos=0.2, p_ng=0.0, max_ngram=5)
    rng = np.random.default_rng(0)
    counts: Counter[int] = Counter()
    for _ in range(2000):
        words, operations, ngram, _ = augment_words(LONG, rng, rates, tags())
        assert ngram is None and len(words) == len(LONG) == len(operations)
        counts.update(operations)
        for (word, *_), new, operation in zip(LONG, words, operations, strict=True):
            # each word gets exactly one operation, and it shows in the output
            assert (new == MASK) == (operation == MASKED)
            if operation == KEEP:
                assert new == word
    total = sum(counts.values())  # 96k words: the standard error of a rate is ~0.001
    assert abs(counts[MASKED] / total - 0.1) < 0.005
    assert abs(counts[POS_SWAP] / total - 0.2) < 0.005
    assert abs(counts[KEEP] / total - 0.7) < 0.006


def test_pos_replacements_keep_the_tag_and_follow_the_tag_unigram_distribution():
    vocabulary = tags()
    rates = AugmentationRates(p_mask=0.0, p_pos=1.0, p_ng=0.0, max_ngram=5)
    rng = np.random.default_rng(1)
    nouns: Counter[str] = Counter()
    by_tag = {tag: set(words) for tag, words in vocabulary.words.items()}
    for _ in range(3000):
        words, operations, _, _ = augment_words(CORPUS[0], rng, rates, vocabulary)
        assert operations == [POS_SWAP] * 4
        for (old, tag, *_), new in zip(CORPUS[0], words, strict=True):
            assert new in by_tag[tag] and new != old
        nouns[words[1]] += 1
    # "cat" (the original) is avoided; "dog" and "man" appear once each in the corpus, so
    # they share the renormalised mass equally.
    assert set(nouns) == {"dog", "man"}
    assert abs(nouns["dog"] / 3000 - 0.5) < 0.04
    # Frequencies matter when sampling freely: "the" is 3 of the 4 determiners.
    rng = np.random.default_rng(2)
    drawn = Counter(vocabulary.sample("DT", rng, avoid="") for _ in range(4000))
    assert abs(drawn["the"] / 4000 - 0.75) < 0.03


def test_a_tag_with_one_word_keeps_it():
    vocabulary = TagVocabulary([tagged_words(("alone", "UH"))])
    assert vocabulary.sample("UH", np.random.default_rng(0), avoid="alone") == "alone"
    assert vocabulary.sample("XX", np.random.default_rng(0), avoid="unseen") == "unseen"


def test_ngram_sampling_rate_and_lengths():
    rates = AugmentationRates(p_mask=0.0, p_pos=0.0, p_ng=0.25, max_ngram=5)
    rng = np.random.default_rng(3)
    lengths: Counter[int] = Counter()
    original = [token.word for token in LONG]
    draws = 4000
    for _ in range(draws):
        words, _, ngram, _ = augment_words(LONG, rng, rates, tags())
        if ngram is None:
            assert words == original
            continue
        assert 1 <= ngram <= 5 and len(words) == ngram
        # a contiguous span of the sentence
        assert any(original[start:start + ngram] == words for start in range(len(original)))
        lengths[ngram] += 1
    sampled = sum(lengths.values())
    assert abs(sampled / draws - 0.25) < 0.03
    assert set(lengths) == {1, 2, 3, 4, 5}  # n uniform in 1..5
    assert all(abs(count / sampled - 0.2) < 0.05 for count in lengths.values())
    # a sentence shorter than n gives the whole sentence
    short = tagged_words(("hi", "UH"), ("there", "RB"))
    for _ in range(50):
        words, _, ngram, _ = augment_words(short, rng, AugmentationRates(0, 0, 1.0, 5), tags())
        assert ngram is not None and 1 <= len(words) <= 2


def test_augmentation_is_deterministic_per_seed_and_dedupes():
    examples = [[sentence] for sentence in CORPUS]
    params = AugmentationParams(n_iter=6)
    first = augment_examples(examples, tags(), params, seed=7)
    assert first == augment_examples(examples, tags(), params, seed=7)
    assert first != augment_examples(examples, tags(), params, seed=8)
    # One example's copies do not depend on the others (per-example generators).
    changed = augment_examples([examples[0], [CORPUS[3]], *examples[2:]], tags(), params, 7)
    for row in (0, 2, 3):
        mine = [texts for other, texts in first if other == row]
        assert mine and mine == [texts for other, texts in changed if other == row]
    for row, (text,) in first:
        copies = [texts for other, texts in first if other == row]
        assert len(copies) == len(set(copies)) <= 6
        assert text != " ".join(token.word for token in CORPUS[row])
    kept = augment_examples(examples, tags(), params.model_copy(update={"dedupe": False}), 7)
    assert len(kept) == 6 * len(CORPUS) >= len(first)


def test_pairs_augment_the_chosen_sides():
    pair = [[CORPUS[0], CORPUS[2]]]
    originals = tuple(" ".join(token.word for token in sentence) for sentence in pair[0])
    heavy = {"p_mask": 0.5, "p_pos": 0.5, "p_ng": 0.0, "n_iter": 30, "dedupe": False}
    for sides, changed in (("first", {0}), ("second", {1}), ("both", {0, 1})):
        copies = augment_examples(pair, tags(), AugmentationParams(**heavy, pair_sides=sides),
                                  seed=0)
        for _, texts in copies:
            assert {side for side in (0, 1) if texts[side] != originals[side]} == changed
    copies = augment_examples(pair, tags(), AugmentationParams(
        **{**heavy, "n_iter": 300}, pair_sides="random"), seed=0)
    kinds = Counter(frozenset(side for side in (0, 1) if texts[side] != originals[side])
                    for _, texts in copies)
    assert set(kinds) == {frozenset({0}), frozenset({1}), frozenset({0, 1})}
    assert all(70 < count < 130 for count in kinds.values())


def test_augmentation_params_are_checked():
    with pytest.raises(ValueError, match="p_mask \\+ p_pos"):
        AugmentationParams(p_mask=0.6, p_pos=0.6)
    with pytest.raises(ValueError):
        AugmentationParams(pair_sides="middle")


def test_spacy_pos_tags_are_cached_and_match_the_tokenizer(tmp_path):
    texts = ["The cat doesn't sing.", "Dogs run quickly", "The cat doesn't sing."]
    tagged = tag_texts(texts, progress=False)
    assert tagged[0] == tagged[2]
    assert [token.word for token in tagged[0]] == tokenize([texts[0]])[0]
    assert {token.word: token.tag for token in tagged[1]}["dogs"] == "NNS"
    assert {token.word: token.tag for token in tagged[0]}["cat"] == "NN"
    cache = ArtifactCache(tmp_path)
    logs: list[str] = []
    assert tag_texts_cached(texts, cache, log=logs.append, progress=False) == tagged
    assert tag_texts_cached(texts, cache, log=logs.append, progress=False) == tagged
    assert sum("tagging" in line for line in logs) == 1  # the second call read the cache


def test_tagged_words_keep_the_source_text_and_its_spacing():
    texts = ["The cat doesn't sing (loudly).", "one\ntwo  three"]
    first, second = tag_texts(texts, progress=False)
    assert [token.text for token in first] == ["The", "cat", "does", "n't", "sing", "(",
                                               "loudly", ")", "."]
    assert [token.word for token in first][:3] == ["the", "cat", "does"]
    assert [token.space for token in first] == [" ", " ", "", " ", " ", "", "", "", ""]
    # a newline or a second space (spaCy's whitespace tokens) separates words as a space
    assert [(token.text, token.space) for token in second] == [("one", " "), ("two", " "),
                                                               ("three", "")]


def test_copies_are_written_as_the_source_wrote_them():
    """The teacher labels the copies and the student reads them: a stretch the copy keeps
    whole reads as in the source ("doesn't", not spaCy's "does n't"); one with a changed word
    or cut by the n-gram is written word by word, so no fragment fuses into a new word."""
    text = "The cat doesn't sing (loudly) at a well-known Port-au-Prince club."
    sentence = tag_texts([text], progress=False)[0]
    assert render([token.text for token in sentence],
                  [token.space for token in sentence]) == text
    vocabulary = TagVocabulary([sentence])
    words = [token.word for token in sentence]
    known, au = words.index("known"), words.index("au")
    rng = np.random.default_rng(4)
    seen = Counter()
    for _ in range(600):
        copy = augment_words(sentence, rng, AugmentationRates(0.3, 0.0, 0.3, 5), vocabulary)
        student = tokenize([copy.text])[0]
        # the student reads the source's words (a masked one replaced), whole or cut
        source = [MASK if operation == MASKED else word
                  for operation, word in zip(copy.operations, words, strict=True)]
        assert any(source[start:start + len(student)] == student
                   for start in range(len(source) - len(student) + 1)), copy.text
        assert "does n't" not in copy.text
        if copy.ngram is None:
            if copy.operations[known - 2:known + 1] == [KEEP, KEEP, MASKED]:
                assert "well - [MASK]" in copy.text
                seen["broken"] += 1
            if all(operation == KEEP for operation in copy.operations[au - 2:au + 3]):
                assert "Port-au-Prince" in copy.text
                seen["whole"] += 1
    assert seen["broken"] and seen["whole"]


def test_a_replacement_is_written_in_its_most_frequent_form():
    sentences = tag_texts(["The U.S. team won.", "The U.S. team lost.", "the u.s. fans sang."],
                          progress=False)
    vocabulary = TagVocabulary(sentences)
    tag = next(token.tag for token in sentences[0] if token.word == "u.s.")
    assert vocabulary.written[tag, "u.s."] == "U.S."
    swap = AugmentationRates(0.0, 1.0, 0.0, 5)
    rng = np.random.default_rng(0)
    texts = {augment_words(sentence, rng, swap, vocabulary).text
             for sentence in sentences for _ in range(50)}
    assert not any("u.s." in copy for copy in texts)


def test_pairs_and_cut_chunks_render_without_fragments():
    """Every copy, cut or not, splits for the student into the source's own words (a
    masked or replaced one aside): no "well-", "-au-" or "[MASK]n't" word appears."""
    texts = ["It is a well-known fact that he doesn't fly to Port-au-Prince (today).",
             "She can't say it's U.S.-made, can she?"]
    tagged = tag_texts(texts, progress=False)
    vocabulary = TagVocabulary(tagged)
    source_words = {word for words in tokenize(texts) for word in words}
    rng = np.random.default_rng(1)
    for sentence in tagged:
        for _ in range(500):
            copy = augment_words(sentence, rng, AugmentationRates(0.2, 0.2, 0.5, 5),
                                 vocabulary)
            for word in tokenize([copy.text])[0]:
                assert word == MASK or word in source_words, (word, copy.text)


def test_word_vocabulary_and_tokenizer():
    assert tokenize(["I don't like [MASK] here."]) == [
        ["i", "do", "n't", "like", MASK, "here", "."]]
    vocabulary = WordVocabulary.build([["b", "a", "b"], ["c", "b", "a", MASK]])
    assert vocabulary.words == [*SPECIALS, "b", "a", "c"]
    assert vocabulary.ids(["a", "zzz", MASK]).tolist() == [4, 1, 2]
    assert vocabulary.ids([]).tolist() == [1]  # never an empty row
    assert vocabulary.ids(["a", "b", "c"], max_words=2).tolist() == [4, 3]
    rare = WordVocabulary.build([["b", "a", "b"]], min_count=2)
    assert rare.words == [*SPECIALS, "b"]


def test_copies_carry_the_teachers_mask_token_that_the_student_reads_as_its_mask_word(
        tmp_path):
    """A RoBERTa teacher reads ``<mask>`` where a word was masked, the student its [MASK]
    word; a BERT teacher's augmenter and encoder describe themselves as before."""
    from methods.bilstm_soft import teacher_mask_token
    from tests.api.test_architectures import _tokenizer

    roberta = _tokenizer("roberta", tmp_path / "bpe")
    mask = teacher_mask_token(roberta)
    assert mask == "<mask>"
    masked = AugmentationParams(p_mask=1.0, p_pos=0.0, p_ng=0.0, n_iter=1)
    [(_, (text,))] = augment_examples([[CORPUS[0]]], tags(), masked, seed=0, mask_token=mask)
    assert text == "<mask> <mask> <mask> <mask>"
    assert roberta(text)["input_ids"].count(roberta.mask_token_id) == 4
    vocabulary = WordVocabulary.build([["the", "cat"]])
    encoder = WordEncoder(vocabulary, 16, mask)
    read = encoder.encode([text, "the <mask>."], None)["words_a"]
    assert read[0].tolist() == [2, 2, 2, 2]
    assert read[1].tolist() == [vocabulary.index["the"], 2, 1]
    assert encoder.describe()["mask_token"] == "<mask>"
    augmenter = TangAugmenter(AugmentationParams(), ArtifactCache(tmp_path), mask_token=mask)
    assert augmenter.describe()["mask_token"] == "<mask>"
    bert = TangAugmenter(AugmentationParams(), ArtifactCache(tmp_path),
                         mask_token=teacher_mask_token(None))
    assert "mask_token" not in bert.describe()
    assert "mask_token" not in WordEncoder(vocabulary, 16).describe()


@pytest.mark.slow
def test_embeddings_start_from_glove_and_oov_words_are_random():
    vectors = GloveVectors()
    vocabulary = WordVocabulary([*SPECIALS, "cat", "dog", "qwzxv-not-a-word"])
    table, summary = embedding_matrix(vocabulary, vectors,
                                      torch.Generator().manual_seed(0))
    assert table.shape == (6, 50)
    assert torch.equal(table[3], torch.from_numpy(vectors.vector("cat")))
    assert torch.equal(table[4], torch.from_numpy(vectors.vector("dog")))
    assert torch.count_nonzero(table[0]) == 0  # [PAD]
    assert torch.count_nonzero(table[5]) == 50 and torch.count_nonzero(table[2]) == 50
    assert summary["found"] == 2 and summary["random"] == 3  # [UNK], [MASK], the OOV word
    assert summary["coverage"] == pytest.approx(2 / 3)


def _words(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(row) for row in rows])
    padded = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
    for index, row in enumerate(rows):
        padded[index, :len(row)] = torch.tensor(row)
    return padded, lengths


def test_single_sentence_student_shapes_and_padding_invariance():
    torch.manual_seed(0)
    model = BiLSTMClassifier(20, 6, 5, 7, num_labels=2, is_pair=False).eval()
    words, lengths = _words([[3, 4, 5], [6, 7], [8]])
    logits = model(words, lengths).logits
    assert logits.shape == (3, 2)
    wider = torch.nn.functional.pad(words, (0, 4))  # more padding changes nothing
    assert torch.allclose(model(wider, lengths).logits, logits, atol=1e-6)
    alone = model(*_words([[6, 7]])).logits
    assert torch.allclose(alone, logits[1:2], atol=1e-6)
    parameters = sum(p.numel() for p in model.parameters())
    lstm = 2 * 4 * 5 * (6 + 5 + 2)  # two directions, four gates, two bias vectors
    assert parameters == 20 * 6 + lstm + (2 * 5 * 7 + 7) + (7 * 2 + 2)


def test_pair_student_is_siamese_with_the_paper_features():
    torch.manual_seed(0)
    model = BiLSTMClassifier(20, 6, 5, 7, num_labels=3, is_pair=True).eval()
    first, first_lengths = _words([[3, 4, 5], [6]])
    second, second_lengths = _words([[7, 8], [9, 10, 11, 12]])
    logits = model(first, first_lengths, second, second_lengths).logits
    assert logits.shape == (2, 3)
    h1, h2 = model.encode(first, first_lengths), model.encode(second, second_lengths)
    assert h1.shape == (2, 10)
    features = torch.cat([h1, h2, h1 * h2, (h1 - h2).abs()], dim=-1)
    assert torch.allclose(model.classifier(model.hidden(features)), logits, atol=1e-6)
    regression = BiLSTMClassifier(20, 6, 5, 7, num_labels=1, is_pair=True)
    assert regression(first, first_lengths, second, second_lengths).logits.shape == (2, 1)
    with pytest.raises(ValueError, match="words_b"):
        model(first, first_lengths)


def test_collator_pads_student_features_and_marks_synthetic_rows():
    split = EncodedSplit(
        name="x", input_ids=[np.array([101, 5, 102]), np.array([101, 102])],
        token_type_ids=[np.zeros(3, dtype=np.int64), np.zeros(2, dtype=np.int64)],
        labels=np.array([1, 0]), lengths=np.array([3, 2]), has_gold=np.array([True, False]))
    split = split.with_features({"words_a": [np.array([4, 5, 6]), np.array([7])]})
    batch = PaddingCollator(split)([1, 0])
    assert batch["words_a"].tolist() == [[7, 0, 0], [4, 5, 6]]
    assert batch["words_a_lengths"].tolist() == [1, 3]
    assert batch["has_gold"].tolist() == [False, True]
    with pytest.raises(ValueError, match="rows"):
        split.with_features({"words_a": [np.array([1])]})
    second = split.subset([1])  # the inference-speed sample keeps features and flags
    assert len(second) == 1 and second.features["words_a"][0].tolist() == [7]
    assert second.has_gold.tolist() == [False] and second.input_ids[0].tolist() == [101, 102]


def _inputs(method, task_name, logits, teacher, labels, has_gold=None):
    task = get_task(task_name)
    batch = {"labels": labels}
    if has_gold is not None:
        batch["has_gold"] = has_gold
    stage = method.stages(task)[0]
    return StepInputs(batch=batch, student=type("Out", (), {"logits": logits})(),
                      teacher=TeacherView(logits=teacher), task=task, stage=stage,
                      extra=torch.nn.ModuleDict())


def test_loss_terms():
    torch.manual_seed(0)
    student, teacher = torch.randn(4, 2), torch.randn(4, 2)
    labels = torch.tensor([0, 1, 1, 0])
    has_gold = torch.tensor([True, False, True, False])
    method = instantiate("bilstm-soft")
    assert method.weights == {"gold": 0.0, "distill": 1.0}
    inputs = _inputs(method, "rte", student, teacher, labels, has_gold)
    assert torch.isclose(method.loss_distill(inputs), ((student - teacher) ** 2).mean())
    expected_gold = torch.nn.functional.cross_entropy(student[has_gold], labels[has_gold])
    assert torch.isclose(method.loss_gold(inputs), expected_gold)
    none = torch.zeros(4, dtype=torch.bool)
    assert gold_loss(student, labels, False, none).item() == 0.0
    soft = instantiate("bilstm-soft", _recipe({"distill_loss": "soft_ce"}))
    probabilities = teacher.softmax(-1)
    expected = -(probabilities * student.log_softmax(-1)).sum(-1).mean()
    assert torch.isclose(soft.loss_distill(_inputs(soft, "rte", student, teacher, labels)),
                         expected)
    # regression: MSE to the teacher's prediction
    inputs = _inputs(method, "stsb", student[:, :1], teacher[:, :1], labels.float())
    assert torch.isclose(method.loss_distill(inputs), ((student[:, 0] - teacher[:, 0]) ** 2)
                         .mean())


def _recipe(params: dict):
    from harness.config.schema import MethodRecipe

    return MethodRecipe(params=params)


def test_stages_follow_the_switches():
    task = get_task("rte")
    augmented = instantiate("bilstm-soft").stages(task)[0]
    assert augmented.data == "augmented" and augmented.teacher == "finetuned"
    plain = instantiate("bilstm-soft", _recipe({"augment": False})).stages(task)[0]
    assert plain.data == "task" and plain.teacher_outputs == {"logits"}
    gold_only = instantiate("bilstm-soft", _recipe({"alpha": 1.0, "augment": False}))
    stage = gold_only.stages(task)[0]
    assert stage.teacher == "none" and stage.loss_terms == ("gold",)
    with pytest.raises(ValueError, match="no gold labels"):
        instantiate("bilstm-soft", _recipe({"alpha": 1.0})).stages(task)


@pytest.mark.e2e
def test_student_kinds_are_checked_against_methods(tiny_data_dir, tiny_teacher_dir, tmp_path):
    tree = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    tree["methods"]["bilstm-bert"] = {"base": "bilstm-soft", "student": "tiny"}
    tree["methods"]["kd-on-bilstm"] = {"base": "kd", "student": "tiny-bilstm"}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError) as info:  # checked when the suite loads
        load_suite(str(path))
    assert [line.strip() for line in str(info.value).splitlines()[1:]] == [
        "methods.bilstm-bert.student: 'tiny' is a bert student; bilstm-soft builds bilstm "
        "students",
        "methods.kd-on-bilstm.student: 'tiny-bilstm' is a bilstm student; kd builds bert "
        "students"]
    # and again when a run resolves (a suite built in code skips the loading)
    runner = SuiteRunner(parse_suite(str(path)), tmp_path / "r", tmp_path / "c",
                         log=lambda _: None)
    with pytest.raises(ConfigError, match="'tiny' is of kind 'bert'; bilstm-soft builds "
                                          "bilstm students"):
        runner.planner.resolve("bilstm-bert", "rte", 1)
    with pytest.raises(ConfigError, match="kind 'bilstm'; kd builds bert"):
        runner.planner.resolve("kd-on-bilstm", "rte", 1)
    del tree["methods"]["bilstm-bert"], tree["methods"]["kd-on-bilstm"]
    tree["students"]["tiny-bilstm"]["hidden_sise"] = 3
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match=r"students\.tiny-bilstm\.hidden_sise: unknown key"):
        load_suite(str(path))


@pytest.mark.e2e
def test_run_records_the_vocabulary_vectors_and_speed(tiny_suite_file, tmp_path):
    runner = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "r", tmp_path / "c",
                         log=lambda _: None)
    record = json.loads(runner.run_one("bilstm-soft", "rte", seed=1).path.read_text())
    assert record["status"] == "finished" and record["student_shape"] == "tiny-bilstm"
    encoder = record["student_encoder"]
    assert encoder["kind"] == "words" and encoder["vocabulary_size"] > len(SPECIALS)
    assert record["student_init"]["embeddings"]["dim"] == 50
    augmentation = record["augmentation"]
    assert augmentation["original_rows"] == 48 and 0 < augmentation["synthetic_rows"] <= 48
    speed = record["inference"]
    assert speed["student_examples_per_second"] > 0 and speed["teacher_examples_per_second"] > 0
    assert speed["speedup"] == pytest.approx(speed["teacher_seconds"] / speed["student_seconds"])
    assert record["parameters"]["total"] - record["parameters"]["non_embedding"] == (
        encoder["vocabulary_size"] * 50)


def test_a_glove_text_file_sets_the_embedding_width(tmp_path):
    """The path used for the paper's 300-d vectors: any GloVe text file, its own width."""
    path = tmp_path / "vectors.txt"
    path.write_text("cat 1 2 3 4\ndog 0.5 0.5 0.5 0.5\n")
    vocabulary = WordVocabulary([*SPECIALS, "dog", "emu"])
    table, summary = embedding_matrix(vocabulary, GloveVectors(path))
    assert table.shape == (5, 4) and table[3].tolist() == [0.5] * 4
    assert summary["vectors"]["source"] == "file" and summary["found"] == 1


@pytest.mark.e2e
def test_missing_word_vectors_stop_the_run_before_any_cell_trains(tiny_data_dir,
                                                                 tiny_teacher_dir, tmp_path):
    """The student shape names its word vectors; a missing file is named before the first
    cell (kd here, which needs nothing missing) and before any teacher is fine-tuned."""
    tree = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    missing = tmp_path / "glove.840B.300d.txt"
    tree["students"]["tiny-bilstm"]["word_vectors"] = str(missing)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(tree))
    runner = SuiteRunner(load_suite(str(path)), tmp_path / "r", tmp_path / "c",
                         log=lambda _: None)
    expected = (r"students\.tiny-bilstm \(methods\.bilstm-soft\): the GloVe text file "
                + re.escape(str(missing)) + " does not exist")
    with pytest.raises(AssetNotFoundError, match=expected):
        runner.run(["kd", "bilstm-soft"], ["rte"], [1])
    assert not list((tmp_path / "r").glob("**/*.json"))
    assert not (tmp_path / "c" / "teachers").exists()
    with pytest.raises(AssetNotFoundError, match=expected):  # one cell, as a grid worker
        runner.run_one("bilstm-soft", "rte", seed=1)
    missing.write_text("cat 1 2 3 4\n")
    runner.planner.check_assets(["bilstm-soft"], ["rte"])


@pytest.mark.e2e
def test_a_run_does_not_depend_on_whether_the_augmented_set_was_cached(tiny_suite_file,
                                                                       tmp_path):
    """Making the copies (and loading the teacher to label them) uses the global RNG; it
    happens before the run is seeded, so a cold-cache run trains exactly like a warm one."""
    runner = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "r", tmp_path / "c",
                         log=lambda _: None)
    cold = runner.run_one("bilstm-soft", "rte", seed=1).path
    first = json.loads(cold.read_text())
    cold.unlink()
    fresh = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "r", tmp_path / "c",
                        log=lambda _: None)
    second = json.loads(fresh.run_one("bilstm-soft", "rte", seed=1).path.read_text())
    assert second["stages"][0]["history"] == first["stages"][0]["history"]
    assert second["dev"] == first["dev"]


@pytest.mark.e2e
def test_run_ids_follow_the_augmentation_version_and_tagger(tiny_suite_file, tmp_path,
                                                            monkeypatch):
    """A record of copies written otherwise (another augmentation version or tagger) is not
    taken for a run of these; runs without copies keep their ids."""
    import methods.bilstm_soft as plugin
    import methods.bilstm_soft.pos as pos

    def run_ids() -> tuple[str, str]:
        suite = load_suite(str(tiny_suite_file), overrides=[
            "methods.bilstm-plain.base=bilstm-soft",
            "methods.bilstm-plain.params.augment=false"])
        runner = SuiteRunner(suite, tmp_path / "r", tmp_path / "c", log=lambda _: None)
        return (runner.planner.run_id("bilstm-soft", "rte", 1),
                runner.planner.run_id("bilstm-plain", "rte", 1))

    augmented, plain = run_ids()
    monkeypatch.setattr(plugin, "AUGMENTATION_VERSION", plugin.AUGMENTATION_VERSION + 1)
    newer, same_plain = run_ids()
    assert newer != augmented and same_plain == plain
    real_version = pos.importlib.metadata.version
    # a spaCy patch release changes neither tags nor tokens: the ids stay
    monkeypatch.setattr(pos.importlib.metadata, "version", lambda package: (
        real_version(package) + "99" if package == "spacy" else real_version(package)))
    assert run_ids() == (newer, plain)
    # another release of the tagger's model (spaCy's own release also splits the plain
    # runs' words otherwise: see the next test)
    monkeypatch.setattr(pos.importlib.metadata, "version", lambda package: (
        "0.0-other" if package.startswith("en-core-web") else real_version(package)))
    other_tagger, same_plain = run_ids()
    assert other_tagger not in (augmented, newer) and same_plain == plain


@pytest.mark.e2e
def test_run_ids_follow_the_word_vectors_content_and_the_tokenizer_release(
        tiny_data_dir, tiny_teacher_dir, tmp_path, monkeypatch):
    """A BiLSTM run reads its word vectors and spaCy's tokenizer: other vectors (a file's
    content, wherever it lies; another release of the package) or another tokenizer
    release give another run id.  The release the shipped records were made with adds
    nothing, so their ids stay."""
    import harness.assets.glove as glove
    import methods.bilstm_soft.words as words

    def run_id(vectors: Path | None) -> str:
        tree = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
        tree["students"]["tiny-bilstm"]["word_vectors"] = str(vectors) if vectors else None
        path = tmp_path / "suite.yaml"
        path.write_text(yaml.safe_dump(tree))
        runner = SuiteRunner(load_suite(str(path)), tmp_path / "r", tmp_path / "c",
                             log=lambda _: None)
        return runner.planner.run_id("bilstm-soft", "rte", 1)

    package = run_id(None)
    first = tmp_path / "a" / "vectors.txt"
    first.parent.mkdir()
    first.write_text("cat 1 2 3 4\n")
    from_file = run_id(first)
    assert from_file != package
    copy = tmp_path / "b" / "vectors.txt"
    copy.parent.mkdir()
    copy.write_text(first.read_text())
    assert run_id(copy) == from_file  # content, not location
    first.write_text("cat 1 2 3 5\n")  # same name and size, other vectors
    assert run_id(first) not in (from_file, package)

    real_version = glove.importlib.metadata.version
    monkeypatch.setattr(glove.importlib.metadata, "version", lambda name: (
        "1.0.1" if name == glove.PACKAGE else real_version(name)))
    other_release = run_id(None)
    assert other_release != package
    monkeypatch.setattr(glove.importlib.metadata, "version", real_version)
    assert run_id(None) == package

    spacy_version = real_version("spacy")
    monkeypatch.setattr(words.importlib.metadata, "version", lambda name: (
        spacy_version + "99" if name == "spacy" else real_version(name)))
    assert run_id(None) == package  # a patch release splits words alike
    monkeypatch.setattr(words.importlib.metadata, "version", lambda name: (
        "9.1.0" if name == "spacy" else real_version(name)))
    assert run_id(None) not in (package, other_release)


@pytest.mark.e2e
def test_tinybert_run_ids_follow_the_glove_vectors_of_its_candidates(tiny_suite_file,
                                                                     tmp_path, monkeypatch):
    """TinyBERT's augmented copies draw candidates from GloVe: another release joins the
    ids of the runs that train on them, not of the runs without copies."""
    import harness.assets.glove as glove

    def run_ids() -> tuple[str, str]:
        suite = load_suite(str(tiny_suite_file), overrides=[
            "methods.tinybert-plain.base=tinybert",
            "methods.tinybert-plain.params.augment=false"])
        runner = SuiteRunner(suite, tmp_path / "r", tmp_path / "c", log=lambda _: None)
        return (runner.planner.run_id("tinybert", "rte", 1),
                runner.planner.run_id("tinybert-plain", "rte", 1))

    augmented, plain = run_ids()
    real_version = glove.importlib.metadata.version
    monkeypatch.setattr(glove.importlib.metadata, "version", lambda name: (
        "2.0.0" if name == glove.PACKAGE else real_version(name)))
    other, same_plain = run_ids()
    assert other != augmented and same_plain == plain


def test_missing_spacy_pipeline_is_named_before_anything_runs(tmp_path):
    """Augmenting tags every text with a spaCy pipeline: a missing one is named, with what
    to install, by the check a run makes before its first cell."""
    assert instantiate("bilstm-soft").missing_assets() is None  # the default pipeline
    missing = instantiate("bilstm-soft", _recipe(
        {"augmentation": {"pos_model": "en_core_web_nonexistent"}}))
    assert missing.missing_assets() == ("POS tagging needs the spaCy model "
                                        "'en_core_web_nonexistent': install the spaCy "
                                        "pipeline 'en_core_web_nonexistent'")
    assert instantiate("bilstm-soft", _recipe(
        {"augment": False, "augmentation": {"pos_model": "en_core_web_nonexistent"}})
    ).missing_assets() is None
    folder = tmp_path / "pipeline"
    folder.mkdir()  # a pipeline's folder, as spacy.load also takes
    assert instantiate("bilstm-soft", _recipe(
        {"augmentation": {"pos_model": str(folder)}})).missing_assets() is None


@pytest.mark.e2e
def test_copies_are_made_again_when_their_pos_tags_are_made_again_otherwise(tiny_suite_file,
                                                                           tmp_path):
    """The copies swap words for words of the same POS tag, read from the cached tags; tags
    made again otherwise (a pipeline named by its folder is keyed by that name, not by its
    weights) make other copies, so the copies made from the old tags are made again."""
    suite = load_suite(str(tiny_suite_file))
    cache = tmp_path / "cache"

    def augmented(log):
        runner = SuiteRunner(suite, tmp_path / "results", cache, log=log)
        runner.cache.log = log
        return runner.augmented(instantiate(suite.plugin("bilstm-soft"),
                                            suite.recipe("bilstm-soft"), "rte"), "rte")

    text = augmented(lambda _: None).summary["key"]
    [tags] = [entry for entry in (cache / "pos").iterdir() if not entry.name.startswith(".")]
    lines = (tags / "tags.jsonl").read_text().splitlines()
    (tags / "tags.jsonl").write_text("".join(
        json.dumps([[word, "NN", written, space] for word, _, written, space
                    in json.loads(line)]) + "\n" for line in lines))
    record_as_rebuilt(tags)
    logs: list[str] = []
    assert augmented(logs.append).summary["key"] == text
    assert any(f"augmented/{text[:16]} is damaged (it was made from another build of "
               f"pos/{tags.name[:16]})" in line for line in logs), logs
    recorded = json.loads((cache / "augmented" / text / "key.json").read_text())["made_from"]
    assert recorded == {f"pos/{tags.name}": ArtifactCache(cache).files_digest("pos", tags.name)}
