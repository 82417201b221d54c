"""General distillation (corpus stages), the unlabeled corpus and cached augmented sets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from harness.api import Augmenter
from harness.api.registry import MethodRegistry
from harness.common.cache import ArtifactCache
from harness.config.schema import ConfigError, CorpusConfig
from harness.data.corpus import Corpus, build_corpus, encode_corpus, split_into_windows
from harness.data.loading import DataFormatError, DataNotFoundError, load_task
from harness.experiments.kept_students import STUDENT_KIND, kept_student
from harness.experiments.provenance import general_cache_key
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from harness.teacher.augmented import prepare_augmented
from methods.kd import VanillaKD
from tests.conftest import record_as_rebuilt, tiny_suite_dict

NO_AUGMENT = {"augment": False}


def tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir, tinybert_params=None, **extra):
    tree = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    tree["methods"] = {"tinybert": {"params": {**NO_AUGMENT, **(tinybert_params or {})}}}
    tree.update(extra)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tree))
    return load_suite(str(path))


def test_corpus_is_the_unique_training_sentences_of_both_sides_of_pairs(tiny_data_dir):
    rte = load_task("rte", data_dir=tiny_data_dir)
    corpus = build_corpus(CorpusConfig(), [rte])
    train = rte.splits["train"]
    expected = {" ".join(text.split()) for text in [*train["text_a"], *train["text_b"]]}
    assert set(corpus.sentences) == expected
    assert len(corpus.sentences) == len(expected)  # duplicates dropped
    assert corpus.sources == [f"task:rte:{rte.fingerprint[:12]}"]


def test_corpus_adds_text_files_drops_short_lines_and_samples_by_seed(tmp_path, tiny_data_dir):
    rte = load_task("rte", data_dir=tiny_data_dir)
    text = tmp_path / "extra.txt"
    text.write_text("one two\nthe extra line is here\n  the   extra line is here  \n")
    corpus = build_corpus(CorpusConfig(text_files=[str(text)]), [rte])
    assert "the extra line is here" in corpus.sentences
    assert "one two" not in corpus.sentences  # under min_words
    assert corpus.sentences.count("the extra line is here") == 1
    files_only = build_corpus(CorpusConfig(task_sentences=False, text_files=[str(text)]), [])
    assert files_only.sentences == ["the extra line is here"]
    assert files_only.fingerprint != corpus.fingerprint

    sample = build_corpus(CorpusConfig(max_sentences=10, seed=3), [rte])
    again = build_corpus(CorpusConfig(max_sentences=10, seed=3), [rte])
    other = build_corpus(CorpusConfig(max_sentences=10, seed=4), [rte])
    assert len(sample) == 10 and sample.sentences == again.sentences
    assert sample.sentences != other.sentences and set(sample.sentences) <= set(corpus.sentences)


def test_blank_lines_never_enter_the_corpus_or_its_pairs(tmp_path):
    text = tmp_path / "doc.txt"
    text.write_text("first line here\n\n   \n\t\nsecond line\n")
    corpus = build_corpus(CorpusConfig(task_sentences=False, text_files=[str(text)],
                                       min_words=1, pairs=True), [])
    assert corpus.sentences == ["first line here", "second line"]
    assert corpus.pairs == [("first line here", "second line")]


def test_a_byte_order_mark_opening_a_text_file_is_not_part_of_its_first_line(tmp_path):
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_bytes(b"the cat sat down\nthe cat sat down\nthe dog sat up\n")
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    for pairs in (False, True):
        read = [build_corpus(CorpusConfig(task_sentences=False, text_files=[str(path)],
                                          pairs=pairs), []) for path in (plain, marked)]
        assert read[1].sentences == ["the cat sat down", "the dog sat up"]
        assert read[1].fingerprint == read[0].fingerprint


def test_a_byte_that_is_not_utf8_is_an_error_naming_its_line(tmp_path):
    text = tmp_path / "latin1.txt"
    text.write_bytes(b"a first good line\nthe caf\xe9 sat down\n")
    with pytest.raises(DataFormatError, match=r"latin1\.txt:2: byte 0xe9 at column 8 is not"):
        build_corpus(CorpusConfig(task_sentences=False, text_files=[str(text)]), [])


def test_missing_corpus_file_and_empty_corpus_are_clear_errors(tmp_path):
    with pytest.raises(DataNotFoundError, match=r"corpus\.text_files"):
        build_corpus(CorpusConfig(text_files=[str(tmp_path / "nope.txt")]), [])
    with pytest.raises(ValueError, match="empty"):
        build_corpus(CorpusConfig(task_sentences=False), [])
    with pytest.raises(DataNotFoundError, match=r"is a directory, not a text file "
                                                r"\(corpus\.text_files"):
        build_corpus(CorpusConfig(text_files=[str(tmp_path)]), [])


@pytest.mark.parametrize("text", ["", "\n\n", "too short\n   \nstill short\n"])
def test_a_text_file_that_adds_no_line_is_an_error_not_a_source(tmp_path, tiny_data_dir, text):
    """Records list the corpus's sources: a file that adds nothing (empty, or every line
    under min_words) would be named there while the corpus is the tasks' alone."""
    empty = tmp_path / "empty.txt"
    empty.write_text(text)
    rte = load_task("rte", data_dir=tiny_data_dir)
    with pytest.raises(DataFormatError, match=r"empty\.txt: no line of at least 3 word\(s\) "
                                              r"\(corpus\.min_words\)"):
        build_corpus(CorpusConfig(text_files=[str(empty)], min_words=3), [rte])


def test_encoded_corpus_is_single_segment_and_truncated(tiny_data_dir, tiny_teacher_dir):
    from transformers import AutoTokenizer

    corpus = build_corpus(CorpusConfig(), [load_task("rte", data_dir=tiny_data_dir)])
    split = encode_corpus(corpus, AutoTokenizer.from_pretrained(tiny_teacher_dir), 10,
                          long_lines="truncate")
    assert len(split) == len(corpus) and split.lengths.max() <= 10
    assert all(not ids.any() for ids in split.token_type_ids)


def test_long_lines_are_split_at_word_boundaries_and_every_piece_is_kept(tiny_teacher_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    line = ("unbelievably extraordinary circumstances notwithstanding the committee "
            "deliberated interminably about characteristically unremarkable propositions")
    short = "a short line of words"
    corpus = Corpus([line, short], "fingerprint", [])
    split = encode_corpus(corpus, tokenizer, 12)
    pieces = tokenizer(line, add_special_tokens=False)["input_ids"]
    windows = [ids[1:-1].tolist() for ids in split.input_ids[:-1]]
    assert len(windows) > 1 and split.lengths.max() <= 12
    assert [piece for window in windows for piece in window] == pieces  # each once, in order
    for window in windows[1:]:  # no window starts inside a word
        assert not tokenizer.convert_ids_to_tokens(window[0]).startswith("##")
    assert all(ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
               for ids in split.input_ids)
    assert split.input_ids[-1][1:-1].tolist() == tokenizer(short, add_special_tokens=False)[
        "input_ids"]


def test_a_word_longer_than_a_window_keeps_its_pieces_across_windows(tiny_teacher_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    line = "hello supercalifragilisticexpialidociousness antidisestablishmentarianism world"
    pieces = tokenizer(line, add_special_tokens=False)["input_ids"]
    for pairs in (None, [(line, "a short line")]):  # a long pair is read as its sentences
        corpus = Corpus([] if pairs else [line], "fingerprint", [], pairs=pairs)
        split = encode_corpus(corpus, tokenizer, 6)
        windows = [ids[1:-1].tolist() for ids in split.input_ids][:-1 if pairs else None]
        assert split.lengths.max() <= 6
        # every piece once, in order, continuation marks ("##...") included
        assert [piece for window in windows for piece in window] == pieces
        assert tokenizer.convert_ids_to_tokens(windows[2][0]).startswith("##")
        assert all(ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
                   for ids in split.input_ids)


def test_split_into_windows_cuts_inside_a_word_only_when_it_is_longer_than_a_window():
    words = [0, 0, 0, 1, 1, 2, 2, 2, 2, 2]
    assert split_into_windows(words, 10, 4) == [(0, 3), (3, 5), (5, 9), (9, 10)]
    assert split_into_windows(None, 10, 4) == [(0, 4), (4, 8), (8, 10)]


def test_paired_corpus_keeps_task_pairs_and_pairs_file_lines_in_order(tmp_path, tiny_data_dir):
    rte = load_task("rte", data_dir=tiny_data_dir)
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    for split in ("train", "dev"):
        (tmp_path / "glue" / "SST-2" / f"{split}.tsv").write_text(
            "sentence\tlabel\nthe film is a joy\t1\na dull , lifeless mess\t0\n"
            "warm and very funny\t1\n")
    sst2 = load_task("sst2", data_dir=tmp_path / "glue")
    text = tmp_path / "doc.txt"
    text.write_text("the first line of it\nthe second line of it\nno\n"
                    "the third line of it\nthe odd last line\n")
    singles = build_corpus(CorpusConfig(text_files=[str(text)]), [rte, sst2])
    paired = build_corpus(CorpusConfig(text_files=[str(text)], pairs=True), [rte, sst2])
    assert paired.sentences == singles.sentences  # what augmenters and MLM heads read
    assert paired.fingerprint != singles.fingerprint
    train = rte.splits["train"]
    rte_pairs = {(" ".join(a.split()), " ".join(b.split()))
                 for a, b in zip(train["text_a"], train["text_b"], strict=True)}
    assert rte_pairs <= set(paired.pairs)
    sentences = [" ".join(text.split()) for text in sst2.splits["train"]["text_a"]]
    assert (sentences[0], sentences[1]) in paired.pairs  # unrelated sentences, two by two
    # The short line is dropped before pairing; the odd last line stands alone.
    assert paired.pairs[-2:] == [("the first line of it", "the second line of it"),
                                 ("the third line of it", "the odd last line")]
    odd = build_corpus(CorpusConfig(task_sentences=False, text_files=[str(text)], pairs=True,
                                    min_words=4), [])
    assert odd.pairs == [("the first line of it", "the second line of it"),
                         ("the third line of it", "the odd last line")]
    alone = build_corpus(CorpusConfig(task_sentences=False, text_files=[str(text)], pairs=True,
                                      min_words=5), [])
    assert alone.pairs == [("the first line of it", "the second line of it"),
                           ("the third line of it", None)]
    assert alone.units == 2 and alone.unit_name == "sentence pairs"


def test_encoded_pairs_carry_two_segments_and_long_pairs_lose_no_word(tiny_teacher_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    long = ("unbelievably extraordinary circumstances notwithstanding the committee "
            "deliberated interminably about characteristically unremarkable propositions")
    corpus = Corpus([], "fingerprint", [], pairs=[("a short line", "and its neighbour"),
                                                  (long, "a short line"), ("alone here", None)])
    split = encode_corpus(corpus, tokenizer, 16)
    first = split.input_ids[0].tolist()
    assert first == tokenizer("a short line", "and its neighbour")["input_ids"]
    assert split.token_type_ids[0].tolist() == tokenizer("a short line", "and its neighbour")[
        "token_type_ids"]
    assert split.token_type_ids[0][-1] == 1 and split.token_type_ids[0][0] == 0
    assert split.lengths.max() <= 16
    # The pair that does not fit is read as its two sentences, the long one in windows.
    rest = [ids[1:-1].tolist() for ids in split.input_ids[1:]]
    words = [piece for ids in rest for piece in ids]
    expected = [tokenizer(text, add_special_tokens=False)["input_ids"]
                for text in ("alone here", long, "a short line")]
    assert words == [piece for ids in expected for piece in ids]
    assert all(not ids.any() for ids in split.token_type_ids[1:])

    cut = encode_corpus(corpus, tokenizer, 16, long_lines="truncate")
    assert len(cut) == 3 and cut.lengths.max() <= 16
    assert cut.input_ids[1].tolist() == tokenizer(long, "a short line", truncation=
                                                  "longest_first", max_length=16)["input_ids"]


def test_relative_text_files_are_found_beside_the_data_folder(tmp_path, tiny_data_dir):
    data = tmp_path / "data"
    (data / "glue").mkdir(parents=True)
    (data / "corpus").mkdir()
    (data / "corpus" / "general.txt").write_text("one line of general english text\n")
    corpus = build_corpus(CorpusConfig(task_sentences=False,
                                       text_files=["corpus/general.txt"]), [], data / "glue")
    assert corpus.sentences == ["one line of general english text"]
    assert corpus.sources == ["file:corpus/general.txt"]  # portable: no machine path
    with pytest.raises(DataNotFoundError, match=r"corpus/missing.txt.*tried .*data/corpus"):
        build_corpus(CorpusConfig(text_files=["corpus/missing.txt"]), [], data / "glue")


@pytest.mark.e2e
def test_general_distillation_runs_once_and_every_task_and_seed_starts_from_it(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    suite = tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir)
    messages: list[str] = []
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=messages.append)
    outcomes = [runner.run_one("tinybert", task, seed) for task, seed in
                (("rte", 1), ("stsb", 1), ("rte", 2))]
    assert [outcome.status for outcome in outcomes] == ["finished"] * 3
    assert sum(message.startswith("[general] tinybert") for message in messages) == 1
    (entry,) = (tmp_path / "cache" / "general").iterdir()
    records = [runner.store.load(outcome.path) for outcome in outcomes]
    assert {record.general_distillation["key"] for record in records} == {entry.name}
    general = records[0].general_distillation
    assert general["corpus_sentences"] == len(runner.planner.corpus())
    assert general["corpus"] == suite.corpus.model_dump(mode="json")  # what it was read with
    assert set(general["final_losses"]) == {"embedding", "attention", "hidden", "total"}
    assert [stage.name for stage in records[0].stages] == ["intermediate", "prediction"]

    # A fresh process reuses the cached general TinyBERT instead of training it again.
    messages.clear()
    fresh = SuiteRunner(suite, tmp_path / "other-results", tmp_path / "cache",
                        log=messages.append)
    assert fresh.run_one("tinybert", "rte", 3).status == "finished"
    assert not any(message.startswith("[general] tinybert") for message in messages)


@pytest.mark.e2e
def test_general_distillation_on_sentence_pairs_is_its_own_checkpoint(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    singles = SuiteRunner(tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir),
                          tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    paired_suite = tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                              corpus={"pairs": True, "max_seq_length": 32})
    paired = SuiteRunner(paired_suite, tmp_path / "results", tmp_path / "cache",
                         log=lambda _: None)
    assert (paired.planner.run_id("tinybert", "rte", 1)
            != singles.planner.run_id("tinybert", "rte", 1))
    outcome = paired.run_one("tinybert", "rte", 1)
    assert outcome.status == "finished"
    general = paired.store.load(outcome.path).general_distillation
    corpus = paired.planner.corpus()
    assert general["corpus_pairs"] == corpus.units == len(corpus.pairs)
    assert general["corpus_sentences"] == len(corpus.sentences) > corpus.units
    assert general["corpus_sequences"] >= corpus.units


@pytest.mark.e2e
def test_a_general_checkpoint_written_on_a_gpu_loads_on_a_machine_without_one(
        tmp_path, monkeypatch):
    """General distillation is the step worth a GPU; its checkpoint then starts students on
    CPU machines too.  The files here are written as a GPU's tensors are (storages tagged
    cuda:0), which torch.load cannot place on a machine without CUDA unless told where."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    trained = BertForSequenceClassification(config)
    body = {name: value for name, value in trained.state_dict().items()
            if name.startswith("bert.")}
    extra = torch.nn.ModuleDict({"proj": torch.nn.Linear(16, 32)})
    with monkeypatch.context() as patched:
        patched.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(body, tmp_path / "student_body.pt")
        torch.save(extra.state_dict(), tmp_path / "extra.pt")
    torch.manual_seed(1)
    student = BertForSequenceClassification(config)
    fresh_extra = torch.nn.ModuleDict({"proj": torch.nn.Linear(16, 32)})
    SuiteRunner._load_general(student, fresh_extra, tmp_path)
    for name, value in body.items():
        assert torch.equal(student.state_dict()[name], value), name
    assert torch.equal(fresh_extra.proj.weight, extra.proj.weight)


@pytest.mark.e2e
def test_loading_the_general_body_copies_it_and_keeps_a_fresh_head(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    suite = tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir)
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    plan = runner.planner.resolve("tinybert", "rte", 1)
    method, spec, stage_configs = plan.method, plan.spec, plan.stage_configs
    context = runner._student_context(spec["student"]["name"],
                                      runner.planner.prepare_task("rte").task)
    general = [stage for stage in method.stages(context.task) if stage.is_general]
    summary = runner._general_distillation(method, context, general, stage_configs)
    torch.manual_seed(123)
    student, extra = method.build_student(context), method.extra_modules(context)
    head_before = student.classifier.weight.detach().clone()
    runner._load_general(student, extra, tmp_path / "cache" / "general" / summary["key"])
    body = torch.load(tmp_path / "cache" / "general" / summary["key"] / "student_body.pt")
    saved_extra = torch.load(tmp_path / "cache" / "general" / summary["key"] / "extra.pt")
    state = student.state_dict()
    assert body and all(name.startswith("bert.") for name in body)
    for name, value in body.items():
        torch.testing.assert_close(state[name], value)
    for name, value in saved_extra.items():
        torch.testing.assert_close(extra.state_dict()[name], value)
    torch.testing.assert_close(student.classifier.weight, head_before)
    # the cache keys the checkpoint by the run's general key and the code that distils it
    assert summary["key"] == general_cache_key(spec["general"]["key"], type(method))


@pytest.mark.e2e
def test_task_stage_ablations_share_one_general_checkpoint_and_the_mapping_does_not(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    def general_key(**recipe):
        tree = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
        recipe["params"] = {**NO_AUGMENT, **recipe.get("params", {})}
        tree["methods"] = {"tinybert": recipe}
        path = tmp_path / "suite.yaml"
        path.write_text(yaml.safe_dump(tree))
        runner = SuiteRunner(load_suite(str(path)), tmp_path / "r", tmp_path / "c",
                             log=lambda _: None)
        return runner.planner.resolve("tinybert", "rte", 1).spec["general"]["key"]

    full = general_key()
    assert general_key(disabled_losses=["attention", "hidden"]) == full
    assert general_key(params={"temperature": 3.0}) == full
    assert general_key(params={"task_distillation": False}) == full
    assert general_key(params={"mapping": "top"}) != full
    assert general_key(params={"mapping": "top", "general_mapping": "uniform"}) == full
    assert general_key(stages={"general": {"lr": 1e-4}}) != full


@pytest.mark.e2e
def test_without_general_distillation_no_general_stage_runs(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    suite = tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                       tinybert_params={"general_distillation": False})
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    record = runner.store.load(runner.run_one("tinybert", "rte", 1).path)
    assert "general_distillation" not in record
    assert not (tmp_path / "cache" / "general").exists()


@pytest.mark.e2e
def test_without_task_distillation_the_general_student_is_fine_tuned_on_gold_labels(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    suite = tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                       tinybert_params={"task_distillation": False})
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    record = runner.store.load(runner.run_one("tinybert", "rte", 1).path)
    assert [stage.name for stage in record.stages] == ["finetune"]
    assert set(record.final_losses) == {"gold", "total"}
    assert record.general_distillation is not None


class ReversingAugmenter:
    """A deterministic stand-in for a real augmenter: each copy reverses the word order of
    the first field (enough to check the caching, labelling and bookkeeping around it)."""

    def __init__(self, copies: int) -> None:
        self.copies = copies
        self.calls = 0

    def describe(self):
        return {"kind": "reverse", "copies": self.copies}

    def augment(self, examples, seed, progress=True):
        self.calls += 1
        return [(row, (" ".join(reversed(fields[0].split())), *fields[1:]))
                for row, fields in enumerate(examples) for _ in range(self.copies)]

    def made_from(self):
        return []  # it reads no cache entry


class UntracedAugmenter:
    """An augmenter without :meth:`~harness.api.Augmenter.made_from`: its copies would be
    trusted after the entries they came from were rebuilt."""

    def describe(self):
        return {"kind": "untraced"}

    def augment(self, examples, seed, progress=True):
        return []


class UntracedKD(VanillaKD):
    name = "untraced-kd"

    def augmenter(self, context) -> UntracedAugmenter:
        return UntracedAugmenter()


class UntracedByProtocolKD(VanillaKD):
    """Annotated with the protocol only: registering cannot see the class it builds."""

    name = "untraced-protocol-kd"

    def augmenter(self, context) -> Augmenter | None:
        return UntracedAugmenter()


@pytest.mark.e2e
def test_an_augmenter_without_made_from_is_refused_when_the_plugin_loads_or_builds_it(
        tmp_path, tiny_suite_file):
    """Augmenter.made_from is part of the protocol (without it, copies would be trusted
    after their sources were rebuilt): a plugin whose augmenter() is annotated with a class
    lacking it is not registered; one annotated with the protocol is refused when the
    runner builds it, before any copy is made."""
    with pytest.raises(TypeError, match=r"test_general\.py: UntracedKD\.augmenter\(\): "
                       r"augmenter (tests\.)?test_general\.UntracedAugmenter lacks "
                       r"made_from\(\) of the Augmenter protocol"):
        MethodRegistry().register(UntracedKD)
    assert MethodRegistry().register(UntracedByProtocolKD) is UntracedByProtocolKD
    runner = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "results",
                         tmp_path / "cache", log=lambda _: None)
    method = UntracedByProtocolKD(VanillaKD.Params(), {})
    with pytest.raises(ValueError, match=r"untraced-protocol-kd: augmenter "
                       r"(tests\.)?test_general\.UntracedAugmenter lacks made_from\(\)"):
        runner.augmented(method, "rte")
    assert not (tmp_path / "cache" / "augmented").exists()


@pytest.mark.e2e
def test_augmented_set_is_cached_labelled_by_the_teacher_and_keeps_source_labels(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    suite = tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir)
    runner = SuiteRunner(suite, tmp_path / "results", tmp_path / "cache", log=lambda _: None)
    prepared = runner.planner.prepare_task("rte")
    teacher = runner.teacher("rte")
    augmenter = ReversingAugmenter(copies=2)

    def make():
        return prepare_augmented(
            data=prepared.data, train_split=prepared.splits["train"], augmenter=augmenter,
            teacher=teacher, tokenizer=runner.planner.tokenizer, max_length=prepared.max_length,
            cache=runner.cache, accelerator=runner.accelerator, inference_batch_size=16,
            seed=0, log=lambda _: None)

    augmented = make()
    original = len(prepared.splits["train"])
    assert len(augmented.split) == 3 * original
    assert augmented.summary["synthetic_rows"] == 2 * original
    np.testing.assert_array_equal(augmented.split.labels,
                                  prepared.splits["train"].labels[augmented.source_rows])
    np.testing.assert_array_equal(augmented.teacher_logits[:original], teacher.logits("train"))
    # The teacher's logits on a synthetic row are its prediction on that row's text.
    model = teacher.load_model().eval()
    row = original + 5
    with torch.inference_mode():
        ids = torch.tensor(augmented.split.input_ids[row])[None]
        types = torch.tensor(augmented.split.token_type_ids[row])[None]
        direct = model(input_ids=ids, token_type_ids=types).logits[0].numpy()
    np.testing.assert_allclose(augmented.teacher_logits[row], direct, atol=1e-4)

    again = make()
    assert augmenter.calls == 1  # the second call read the cache
    np.testing.assert_array_equal(again.teacher_logits, augmented.teacher_logits)


@pytest.mark.e2e
def test_tinybert_trains_on_augmented_copies_labelled_by_the_teacher(
        tmp_path, tiny_suite_file):
    runner = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "results",
                         tmp_path / "cache", log=lambda _: None, save_students=True)
    record = runner.store.load(runner.run_one("tinybert", "rte", 1).path)
    augmentation = record.augmentation
    # The kept student records what it was trained from: the teacher, its general
    # checkpoint, the copies and the teacher's logits on them.
    assert set(_made_from(tmp_path / "cache" / STUDENT_KIND / record.run_id)) == {
        f"teachers/{record.teacher.key}", f"general/{record.general_distillation['key']}",
        f"augmented/{augmentation['key']}",
        f"augmented_logits/{augmentation['logits_key']}"}
    rows = record.data.train_examples
    assert augmentation["original_rows"] == rows
    assert augmentation["synthetic_rows"] == rows  # one copy each
    assert augmentation["augmenter"]["source"] == "fitted_head"  # the tiny teacher has none
    assert [stage.name for stage in record.stages] == ["intermediate", "prediction"]
    # Seeds share the synthetic set: a second seed makes no new copies.
    before = sorted(path.name for path in (tmp_path / "cache" / "augmented").iterdir())
    runner.run_one("tinybert", "rte", 2)
    assert sorted(path.name for path in (tmp_path / "cache" / "augmented").iterdir()) == before


@pytest.mark.e2e
def test_init_from_starts_other_methods_from_the_same_general_checkpoint(
        tmp_path, tiny_data_dir, tiny_teacher_dir):
    """kd and finetune with init_from: tinybert share tinybert's general checkpoint (one
    general distillation) and start from its body; their own heads start fresh."""
    suite = tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir)
    tree = suite.model_dump(exclude_unset=True)
    tree["methods"]["kd-general"] = {"base": "kd", "init_from": "tinybert"}
    tree["methods"]["finetune-general"] = {"base": "finetune", "init_from": "tinybert",
                                           "stages": {"task": {"max_steps": 1, "lr": 1e-9}}}
    path = tmp_path / "init-from.yaml"
    path.write_text(yaml.safe_dump(tree))
    messages: list[str] = []
    runner = SuiteRunner(load_suite(str(path)), tmp_path / "results", tmp_path / "cache",
                         log=messages.append, save_students=True)
    tinybert = runner.planner.resolve("tinybert", "rte", 1).spec
    kd = runner.planner.resolve("kd-general", "rte", 1).spec
    assert kd["general"] == {"key": tinybert["general"]["key"], "from": "tinybert"}
    plain_kd = runner.planner.resolve("kd", "rte", 1).spec
    assert "general" not in plain_kd
    record = runner.store.load(runner.run_one("finetune-general", "rte", 1).path)
    kd_record = runner.store.load(runner.run_one("kd-general", "stsb", 1).path)
    assert sum(message.startswith("[general] tinybert") for message in messages) == 1
    (entry,) = (tmp_path / "cache" / "general").iterdir()
    assert record.general_distillation["key"] == entry.name
    assert record.general_distillation["from"] == "tinybert"
    # One step at lr 1e-9 leaves the body where the general checkpoint put it.
    body = torch.load(entry / "student_body.pt", weights_only=True)
    student, _ = runner._build_student(*_finetune_context(runner, "finetune-general", "rte"))
    runner._load_general(student, torch.nn.ModuleDict(), entry)
    for name, value in body.items():
        assert torch.equal(student.state_dict()[name], value), name
    # The kept students record what they were trained from (finetune reads no teacher)
    # and are not taken for the run's once the general checkpoint is rebuilt otherwise.
    kept = {run.run_id: tmp_path / "cache" / STUDENT_KIND / run.run_id
            for run in (record, kd_record)}
    assert set(_made_from(kept[record.run_id])) == {f"general/{entry.name}"}
    assert set(_made_from(kept[kd_record.run_id])) == {
        f"general/{entry.name}", f"teachers/{kd_record.teacher.key}"}
    torch.save({name: value + 1 for name, value in body.items()}, entry / "student_body.pt")
    record_as_rebuilt(entry)
    messages.clear()
    cache = ArtifactCache(tmp_path / "cache", log=messages.append)
    assert kept_student(cache, record.run_id) is None
    assert kept_student(cache, kd_record.run_id) is None
    assert sum(f"made from another build of general/{entry.name[:16]}" in message
               for message in messages) == 2, messages


def _made_from(entry: Path) -> dict[str, str | None]:
    return json.loads((entry / "key.json").read_text()).get("made_from", {})



def _finetune_context(runner, method_name, task_name):
    from harness.api.registry import instantiate
    from harness.data.tasks import get_task

    recipe = runner.suite.recipe(method_name)
    method = instantiate(runner.suite.plugin(method_name), recipe, task_name)
    shape = recipe.student or runner.suite.default_student
    return method, runner._student_context(shape, get_task(task_name))


@pytest.mark.e2e
def test_init_from_is_checked_before_anything_runs(tmp_path, tiny_data_dir, tiny_teacher_dir):
    tree = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)
    tree["methods"] = {"tinybert": {"params": NO_AUGMENT},
                       "kd": {"init_from": "tinybrt"}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match=r"methods\.kd\.init_from 'tinybrt'"):
        load_suite(str(path))
    student = next(iter(tree["students"]))
    tree["students"]["other"] = dict(tree["students"][student])
    tree["methods"]["kd"] = {"init_from": "tinybert", "student": "other"}
    path.write_text(yaml.safe_dump(tree))
    runner = SuiteRunner(load_suite(str(path)), tmp_path / "r", tmp_path / "c",
                         log=lambda _: None)
    with pytest.raises(ConfigError, match=r"methods\.kd\.init_from: tinybert distils student"):
        runner.planner.resolve("kd", "rte", 1)
    tree["methods"]["tinybert"] = {"params": {**NO_AUGMENT, "general_distillation": False}}
    tree["methods"]["kd"] = {"init_from": "tinybert"}
    path.write_text(yaml.safe_dump(tree))
    runner = SuiteRunner(load_suite(str(path)), tmp_path / "r", tmp_path / "c",
                         log=lambda _: None)
    with pytest.raises(ConfigError, match="no general"):
        runner.planner.resolve("kd", "rte", 1)


@pytest.mark.e2e
def test_every_damaged_cache_entry_is_rebuilt_and_the_run_repeats(tiny_suite_file, tmp_path,
                                                                  tiny_data_dir):
    """A tinybert run fills the cache with every kind of entry (teacher, augmented copies
    and their labels, masked-LM head, general checkpoint); one file of each entry is then
    truncated.  The next run reports each damaged entry, rebuilds it, and scores the same."""
    cache = tmp_path / "cache"
    first = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "r1", cache,
                        log=lambda _: None).run_one("tinybert", "rte", seed=1)
    damaged = {}
    for entry in sorted(cache.glob("*/*")):
        files = [path for path in entry.rglob("*") if path.is_file()
                 and path.name not in {"key.json", "COMPLETE"}]
        if entry.name.startswith(".") or not files:
            continue
        victim = max(files, key=lambda path: path.stat().st_size)
        victim.write_bytes(victim.read_bytes()[:victim.stat().st_size // 2])
        damaged[entry.parent.name] = entry.name
    assert {"teachers", "augmented", "augmented_logits", "general"} <= set(damaged)
    messages: list[str] = []
    again = SuiteRunner(load_suite(str(tiny_suite_file)), tmp_path / "r2", cache,
                        log=messages.append).run_one("tinybert", "rte", seed=1)
    assert again.status == "finished" and again.main_score == first.main_score
    record = again.path.read_text()  # portable: no path of this machine in it
    assert str(tiny_data_dir) not in record and str(tmp_path) not in record
    for kind, key in damaged.items():
        assert any(line.startswith(f"[cache] {kind}/{key[:16]} is damaged") for line in
                   messages), (kind, [line for line in messages if "[cache]" in line])


@pytest.mark.e2e
def test_a_corpus_task_without_data_names_corpus_tasks(tmp_path, tiny_data_dir,
                                                      tiny_teacher_dir):
    """The general corpus reads every task of corpus.tasks (else the suite's): a task
    whose files are missing says so, and how to name only the tasks one has."""
    from harness.data.loading import DataNotFoundError

    suite = tiny_suite(tmp_path, tiny_data_dir, tiny_teacher_dir,
                       corpus={"tasks": ["rte", "qqp"]})
    runner = SuiteRunner(suite, tmp_path / "r", tmp_path / "c", log=lambda _: None)
    with pytest.raises(DataNotFoundError) as info:
        runner.planner.run_id("tinybert", "rte", 1)
    message = str(info.value)
    assert "qqp" in message.lower() and "corpus.tasks" in message
    assert "reads the training sentences of rte, qqp" in message
