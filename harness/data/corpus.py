"""The unlabeled corpus of general distillation.

Offline default: the unique sentences of the suite's training sets (both sides of a pair;
labels are never read), plus any text files given; on machines online, a hub text dataset
(e.g. wikitext) can be added.  The corpus is fingerprinted by content, so the general
distillation it feeds is cached once for every task and seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from transformers import PreTrainedTokenizerBase

from harness.data.features import EncodedSplit
from harness.data.loading import DataFormatError, DataNotFoundError, TaskData, load_hub_dataset

if TYPE_CHECKING:  # the recipe layer sits above the data it describes
    from harness.config.schema import CorpusConfig


Item = TypeVar("Item")


@dataclass
class Corpus:
    """The corpus's unique sentences (what augmenters and masked-LM heads read) and, when
    the suite asks for sentence pairs, the (A, B) pairs general distillation reads instead
    (B is None for a source's odd last line).  ``fingerprint`` covers what distillation
    reads: the pairs when there are any, else the sentences."""

    sentences: list[str]
    fingerprint: str
    sources: list[str]
    pairs: list[tuple[str, str | None]] | None = None

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def units(self) -> int:
        """How many texts general distillation reads: pairs, or sentences."""
        return len(self.pairs) if self.pairs is not None else len(self.sentences)

    @property
    def unit_name(self) -> str:
        return "sentence pairs" if self.pairs is not None else "sentences"


def _task_sentences(data: TaskData) -> Iterable[str]:
    train = data.splits["train"]
    yield from train["text_a"]
    if data.task.is_pair:
        yield from train["text_b"]


def _normalise(line: str) -> str:
    return " ".join(line.split())


def _consecutive_pairs(lines: Iterable[str]) -> Iterable[tuple[str, str | None]]:
    """Lines 1+2, 3+4, ...: consecutive sentences of a document, as BERT's pre-training
    pairs them (segments A and B); an odd last line stands alone."""
    pending: str | None = None
    for line in lines:
        if pending is None:
            pending = line
        else:
            yield pending, line
            pending = None
    if pending is not None:
        yield pending, None


def _task_pairs(data: TaskData) -> Iterable[tuple[str, str | None]]:
    """A pair task's own (A, B) training pairs; a single-sentence task's sentences two by
    two in file order (unrelated sentences: the random B of BERT's next-sentence pairs)."""
    train = data.splits["train"]
    if data.task.is_pair:
        yield from zip(map(_normalise, train["text_a"]), map(_normalise, train["text_b"]),
                       strict=True)
    else:
        yield from _consecutive_pairs(map(_normalise, train["text_a"]))


def resolve_text_file(name: str, data_dir: Path | None) -> Path:
    """A ``corpus.text_files`` entry: an absolute path, or a path relative to the folder
    that holds the GLUE data folder (``../shared/data`` by default, so
    ``corpus/en-general.txt`` is the shared general corpus), else to the working folder."""
    path = Path(name).expanduser()
    if path.is_absolute():
        candidates = [path]
    else:
        candidates = ([data_dir.parent / path] if data_dir is not None else []) \
            + [Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(candidate) for candidate in candidates)
    if folders := [candidate for candidate in candidates if candidate.is_dir()]:
        raise DataNotFoundError(f"corpus text file {name!r} is a directory, not a text file "
                                f"(corpus.text_files in the suite: {folders[0]}); name the "
                                "files in it")
    raise DataNotFoundError(f"corpus text file {name!r} does not exist (corpus.text_files in "
                            f"the suite; tried {tried})")


def _text_file_lines(path: Path) -> Iterable[str]:
    """The file's lines, decoded as UTF-8 (a byte-order mark opening the file is not part
    of its first line); a byte that is not UTF-8 is an error naming its line and column."""
    try:
        with path.open(encoding="utf-8-sig") as handle:
            yield from handle
    except UnicodeDecodeError:
        with path.open("rb") as raw:  # the decoder reads in blocks: find the line
            for number, line in enumerate(raw, start=1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise DataFormatError(path, number, f"byte 0x{line[error.start]:02x} at "
                                          f"column {error.start + 1} is not UTF-8 (expected "
                                          "UTF-8 text)") from None
        raise


def _hub_lines(config: CorpusConfig) -> Iterable[str]:
    spec = config.hub_dataset
    assert spec is not None
    dataset = load_hub_dataset(
        spec.path, spec.name, split=spec.split,
        local_hint=(", or read local text files instead: --set corpus.hub_dataset=null "
                    "--set 'corpus.text_files=[FILE]'"))
    if spec.column not in dataset.column_names:
        raise ValueError(f"corpus.hub_dataset: {spec.path} has no column {spec.column!r}; "
                         f"it has {dataset.column_names}")
    yield from dataset[spec.column]


def build_corpus(config: CorpusConfig, tasks: list[TaskData],
                 data_dir: Path | None = None) -> Corpus:
    """Unique, whitespace-normalised lines of at least ``min_words`` words (a blank line
    never is one), in first-seen order, then a seeded sample of ``max_sentences`` if set;
    with ``pairs``, also the unique pairs (see :class:`Corpus`), sampled alike.  Short
    lines are dropped before a file's lines are paired, so a pair joins the lines that
    surround a dropped one.  Relative text files are looked up beside ``data_dir`` (see
    :func:`resolve_text_file`)."""
    seen: dict[str, None] = {}
    pairs: dict[tuple[str, str | None], None] = {}
    sources: list[str] = []

    def long_enough(text: str | None) -> bool:
        """None (no B segment), or at least ``min_words`` words: never an empty line."""
        return text is None or len(text.split()) >= config.min_words  # min_words >= 1

    def add(lines: Iterable[str], pair_them: bool = True) -> int:
        """The lines' sentences; with ``pairs``, also the lines two by two (``pair_them``).
        Returns how many lines were long enough to count."""
        kept = [text for line in lines if long_enough(text := _normalise(line))]
        for text in kept:
            seen.setdefault(text, None)
        if config.pairs and pair_them:
            add_pairs(_consecutive_pairs(kept))
        return len(kept)

    def add_pairs(new: Iterable[tuple[str, str | None]]) -> None:
        for a, b in new:
            if long_enough(a) and long_enough(b):
                pairs.setdefault((a, b), None)

    if config.task_sentences:
        for data in tasks:
            add(_task_sentences(data), pair_them=False)  # a task pairs its own way
            if config.pairs:
                add_pairs(_task_pairs(data))
            sources.append(f"task:{data.task.name}:{data.fingerprint[:12]}")
    for name in config.text_files:
        path = resolve_text_file(name, data_dir)
        if not add(_text_file_lines(path)):  # a source named in records that adds nothing
            raise DataFormatError(path, None, f"no line of at least {config.min_words} "
                                  "word(s) (corpus.min_words): the file adds nothing to the "
                                  "corpus")
        sources.append(f"file:{name}")  # as the suite names it: records stay portable
    if config.hub_dataset is not None:
        spec = config.hub_dataset
        if not add(_hub_lines(config)):
            raise ValueError(f"corpus.hub_dataset {spec.path}/{spec.name}/{spec.split}: no "
                             f"line of at least {config.min_words} word(s) "
                             "(corpus.min_words)")
        sources.append(f"hub:{spec.path}/{spec.name}/{spec.split}")
    sentences = list(seen)
    if not sentences:
        raise ValueError("the general-distillation corpus is empty: enable "
                         "corpus.task_sentences or give corpus.text_files / hub_dataset")
    sentences = _seeded_sample(sentences, config.max_sentences, config.seed)
    if not config.pairs:
        return Corpus(sentences, sentences_fingerprint(sentences), sources)
    pair_list = _seeded_sample(list(pairs), config.max_sentences, config.seed)
    fingerprint = sentences_fingerprint(f"{a}\t{'' if b is None else b}"
                                        for a, b in pair_list)
    return Corpus(sentences, f"pairs:{fingerprint}", sources, pair_list)


def _seeded_sample(items: list[Item], size: int | None, seed: int) -> list[Item]:
    """``size`` of ``items`` drawn with ``seed``, in their order; all of them when fewer."""
    if size is None or len(items) <= size:
        return items
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[i] for i in sorted(order[:size])]


def sentences_fingerprint(sentences: Iterable[str]) -> str:
    """sha256 of the sentences in order, newline-separated."""
    digest = hashlib.sha256()
    for sentence in sentences:
        digest.update(sentence.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def split_into_windows(word_ids: list[int | None] | None, length: int,
                       budget: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, end)`` ranges of at most ``budget`` of ``length`` pieces, each
    cut moved back to the start of the word it would split (a single word longer than
    ``budget`` is cut between its pieces).  ``word_ids``: the word of each piece (None: cut
    anywhere)."""
    windows, start = [], 0
    while start < length:
        end = min(start + budget, length)
        if end < length and word_ids is not None:
            cut = end
            while cut > start and word_ids[cut] == word_ids[cut - 1]:
                cut -= 1
            end = cut if cut > start else end
        windows.append((start, end))
        start = end
    return windows


def encode_corpus(corpus: Corpus, tokenizer: PreTrainedTokenizerBase, max_length: int,
                  long_lines: str = "split") -> EncodedSplit:
    """The sequences general distillation reads; labels are zeros (no stage reads them).

    Without pairs: one single-segment sequence per sentence.  With pairs: ``[CLS] A [SEP] B
    [SEP]`` with segment ids 0 and 1, as BERT's pre-training reads text.  A sequence longer
    than ``max_length`` pieces (special tokens included) is either cut (``truncate``: a
    single sentence keeps its start, a pair is cut longest side first, as the tasks' pairs
    are read) or split (``split``: a sentence into consecutive windows at word boundaries,
    so every word is seen once, as masked-LM pre-training packs long documents; a word
    longer than a window is cut between its pieces; a pair that does not fit is read as
    its two sentences, each split so)."""
    if long_lines not in ("split", "truncate"):
        raise ValueError(f"long_lines {long_lines!r}: expected split or truncate")
    if corpus.pairs is None:
        pieces, types = _encode_sentences(corpus.sentences, tokenizer, max_length, long_lines)
    else:
        pieces, types = [], []
        both = [(a, b) for a, b in corpus.pairs if b is not None]
        singles = [a for a, b in corpus.pairs if b is None]
        if both:
            encoded = tokenizer([a for a, _ in both], [b for _, b in both],
                                truncation="longest_first" if long_lines == "truncate"
                                else False, max_length=max_length,
                                return_attention_mask=False, return_token_type_ids=True,
                                verbose=False)
            for (a, b), ids, kinds in zip(both, encoded["input_ids"],
                                          encoded["token_type_ids"], strict=True):
                if len(ids) <= max_length:
                    pieces.append(ids)
                    types.append(kinds)
                else:  # split: read as two sentences
                    singles.extend((a, b))
        more_pieces, more_types = _encode_sentences(singles, tokenizer, max_length, long_lines)
        pieces += more_pieces
        types += more_types
    input_ids = [np.asarray(ids, dtype=np.int64) for ids in pieces]
    return EncodedSplit(
        name="corpus",
        input_ids=input_ids,
        token_type_ids=[np.asarray(ids, dtype=np.int64) for ids in types],
        labels=np.zeros(len(input_ids), dtype=np.int64),
        lengths=np.asarray([len(ids) for ids in input_ids], dtype=np.int64),
    )


def _encode_sentences(sentences: list[str], tokenizer: PreTrainedTokenizerBase,
                      max_length: int, long_lines: str) -> tuple[list[list[int]], list[list[int]]]:
    """Single-segment encodings of ``sentences`` (see :func:`encode_corpus`).  A long
    sentence's windows are cut from its own encoding: each keeps the special tokens around
    a run of the sentence's pieces, so a word cut between windows keeps its pieces as the
    whole sentence has them (continuation marks included)."""
    if not sentences:
        return [], []
    encoded = tokenizer(sentences, truncation=long_lines == "truncate",
                        max_length=max_length, return_attention_mask=False,
                        return_token_type_ids=True,
                        return_special_tokens_mask=long_lines == "split",
                        verbose=False)
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    pieces: list[list[int]] = []
    types: list[list[int]] = []
    for index, ids in enumerate(encoded["input_ids"]):
        kinds = encoded["token_type_ids"][index]
        if len(ids) <= max_length:  # always so with long_lines: truncate
            pieces.append(ids)
            types.append(kinds)
            continue
        # The sentence's pieces: the run between the template's special tokens.
        text_at = [at for at, special in enumerate(encoded["special_tokens_mask"][index])
                   if not special]
        first, last = text_at[0], text_at[-1] + 1
        words = encoded.word_ids(index)[first:last] if tokenizer.is_fast else None
        for start, end in split_into_windows(words, last - first, budget):
            pieces.append(ids[:first] + ids[first + start:first + end] + ids[last:])
            types.append(kinds[:first] + kinds[first + start:first + end] + kinds[last:])
    return pieces, types
