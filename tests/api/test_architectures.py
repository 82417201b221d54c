"""Every supported encoder architecture as teacher and student, for every method: tiny random
configs (2 layers, width 32, 4 heads; MPNet with its 32 relative-position buckets) saved as
Hugging Face folders with a tokenizer of the architecture's kind, run end to end through
the harness's own runner, each cell finishing with a finite score or refused, before
training, with the reason the code documents (docs/architectures.md is generated from the
same decision).  Attention scores are checked against the eager implementation of each
architecture, heads and students against a save and reload."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest
import torch
import yaml
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    DebertaV2Config,
    DistilBertConfig,
    ElectraConfig,
    PretrainedConfig,
    RobertaConfig,
)

from harness.api.architectures import ARCHITECTURES, dimensions, self_attention_problem
from harness.api.capture import capture_attention_scores, transformer_layers
from harness.api.context import StudentContext
from harness.api.pooling import load_sequence_classifier, sequence_classifier_class
from harness.api.registry import registry
from harness.api.students import build_encoder_student
from harness.config.schema import ConfigError, StudentConfig
from harness.data.tasks import get_task
from harness.experiments.compatibility import matrix, matrix_markdown
from harness.experiments.kept_students import kept_student
from harness.experiments.planner import Variation
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from harness.teacher.outputs import forward_to_depth
from tests.conftest import MINILM_DIR, WORDS, tiny_suite_dict

DOC = Path(__file__).resolve().parents[2] / "docs" / "architectures.md"
HIDDEN, LAYERS, HEADS = 32, 2, 4
METHODS = registry.names()


def tiny_config(model_type: str, vocab_size: int = 30522) -> PretrainedConfig:
    """A 2-layer, width-32, 4-head config of ``model_type`` (DeBERTa-v2 with its
    disentangled relative attention on, as DeBERTa-v3 checkpoints have it)."""
    common = {"vocab_size": vocab_size, "max_position_embeddings": 130}
    if model_type == "distilbert":
        return DistilBertConfig(dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                hidden_dim=2 * HIDDEN, **common)
    shape = {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
             "intermediate_size": 2 * HIDDEN, **common}
    if model_type == "roberta":
        return RobertaConfig(type_vocab_size=1, pad_token_id=1, bos_token_id=0,
                             eos_token_id=2, **shape)
    if model_type == "electra":
        return ElectraConfig(embedding_size=HIDDEN, **shape)
    if model_type == "deberta-v2":
        return DebertaV2Config(relative_attention=True, position_biased_input=False,
                               pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
                               position_buckets=16, norm_rel_ebd="layer_norm",
                               type_vocab_size=0, **shape)
    return AutoConfig.for_model(model_type, **shape)


def sentencepiece_tokenizer():
    """A SentencePiece (Unigram, Metaspace ``▁``) fast tokenizer with DeBERTa-v2's special
    tokens, trained here on the test sentences' words (no hub, no sentencepiece package)."""
    from tokenizers import SentencePieceUnigramTokenizer
    from transformers import DebertaV2TokenizerFast

    specials = {"pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                "unk_token": "[UNK]", "mask_token": "[MASK]"}
    rng = random.Random(0)
    unigram = SentencePieceUnigramTokenizer()
    # Many sentences: Unigram keeps a whole word as a piece once it is seen often enough.
    unigram.train_from_iterator([" ".join(rng.sample(WORDS, 10)) + "." for _ in range(200)],
                                vocab_size=300, special_tokens=list(specials.values()),
                                unk_token="[UNK]")
    return DebertaV2TokenizerFast(tokenizer_object=unigram._tokenizer, bos_token="[CLS]",
                                  eos_token="[SEP]", **specials)


def _tokenizer(model_type: str, folder: Path):
    """The architecture's tokenizer kind: byte-level BPE for RoBERTa (trained here on the
    test sentences' words), the MiniLM WordPiece vocabulary for the others."""
    if model_type == "roberta":
        from tokenizers import ByteLevelBPETokenizer
        from transformers import RobertaTokenizer

        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator([" ".join(WORDS) + ". " + " ".join(reversed(WORDS)) + "."],
                                vocab_size=600, min_frequency=1,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        folder.mkdir(parents=True, exist_ok=True)
        bpe.save_model(str(folder))
        return RobertaTokenizer(vocab=str(folder / "vocab.json"),
                                merges=str(folder / "merges.txt"))
    if model_type == "distilbert":
        from transformers import DistilBertTokenizer

        return DistilBertTokenizer(vocab=str(MINILM_DIR / "vocab.txt"))
    if model_type == "electra":
        from transformers import ElectraTokenizer

        return ElectraTokenizer(vocab=str(MINILM_DIR / "vocab.txt"))
    if model_type == "mpnet":
        return mpnet_tokenizer()
    return AutoTokenizer.from_pretrained(MINILM_DIR)


def mpnet_tokenizer():
    """MPNet's WordPiece tokenizer laid out as all-mpnet-base-v2's: ``<s>``, ``<pad>``,
    ``</s>``, ``<unk>`` at 0-3 (``<pad>`` at MPNet's padding index 1), the bert-base-uncased
    vocabulary after them, ``<mask>`` last (30,527 entries)."""
    from transformers import MPNetTokenizer

    words = (MINILM_DIR / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab = {token: index for index, token in enumerate(
        ["<s>", "<pad>", "</s>", "<unk>", *words, "<mask>"])}
    return MPNetTokenizer(vocab=vocab)


def write_tiny_encoder(path: Path, model_type: str) -> Path:
    """A random-weight pre-trained encoder of ``model_type`` with its tokenizer, saved as a
    standard Hugging Face folder (what a hub checkpoint looks like)."""
    tokenizer = _tokenizer(model_type, path / "bpe")
    torch.manual_seed(0)
    AutoModel.from_config(tiny_config(model_type, len(tokenizer))).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def teachers(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("encoders")
    return {model_type: write_tiny_encoder(root / model_type, model_type)
            for model_type in ARCHITECTURES}


@pytest.fixture(scope="module")
def runners(teachers, tiny_data_dir, tmp_path_factory) -> dict[str, SuiteRunner]:
    """One runner per architecture (its teacher fine-tuned once): RTE only, 2 steps a
    stage; the default student reads the mean of its states, the teacher-width one its
    first token, the teacher the architecture's own head (pooling: auto)."""
    made = {}
    for model_type, folder in teachers.items():
        root = tmp_path_factory.mktemp(model_type)
        suite = tiny_suite_dict(tiny_data_dir, folder, steps=2)
        suite["tasks"] = ["rte"]
        suite["students"]["tiny"]["pooling"] = "mean"
        suite["students"]["tiny-wide"]["pooling"] = "cls"
        path = root / "suite.yaml"
        path.write_text(yaml.safe_dump(suite))
        made[model_type] = SuiteRunner(load_suite(str(path)), root / "results", root / "cache",
                                       log=lambda _: None, save_students=True)
    return made


@pytest.fixture(scope="module")
def expected(teachers) -> dict[tuple[str, str], str | None]:
    """What the code decides for the tiny configs (the docs table reads default configs)."""
    configs = {model_type: AutoConfig.from_pretrained(folder)
               for model_type, folder in teachers.items()}
    return matrix(configs, METHODS)


def test_the_documented_matrix_is_the_one_the_code_decides(expected) -> None:
    assert expected == matrix({model_type: AutoConfig.for_model(model_type)
                               for model_type in ARCHITECTURES}, METHODS)
    assert matrix_markdown(METHODS) in DOC.read_text(), \
        "docs/architectures.md is stale: paste harness.api.architectures.matrix_markdown()"
    refused = {cell for cell, reason in expected.items() if reason is not None}
    assert refused == {("deberta-v2", "minilm"), ("deberta-v2", "tinybert")}
    # DeBERTa-v2's tinybert is refused for its attention scores alone, not its augmentation
    assert "self-attention" in expected["deberta-v2", "tinybert"]


@pytest.mark.e2e
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_every_method_runs_or_is_refused_before_training(model_type, method, runners,
                                                          expected) -> None:
    runner = runners[model_type]
    reason = expected[model_type, method]
    if reason is not None:
        name = ARCHITECTURES[model_type].name
        with pytest.raises(ConfigError, match=rf"{re.escape(method)} cannot distil a "
                                              rf"{re.escape(name)} teacher") as refused:
            runner.run_one(method, "rte", seed=1)
        assert reason in str(refused.value)
        assert not list(runner.store.root.rglob(f"{method}/**/*.json"))  # nothing recorded
        return
    outcome = runner.run_one(method, "rte", seed=1)
    assert outcome.status == "finished", outcome
    assert math.isfinite(outcome.main_score)
    record = outcome.record
    assert all(math.isfinite(value) for stage in record.stages
               for value in stage.final_losses.values())
    kept = kept_student(runner.cache, record.run_id)
    if method != "bilstm-soft":  # a Transformer student of the teacher's architecture
        assert record.config["student"]["pooling"] in ("mean", "cls")
        assert record.teacher.pooling == "pooler"
        assert AutoConfig.from_pretrained(kept).model_type == model_type
        assert type(load_sequence_classifier(kept)).__name__.startswith("Pooled")


def _padded_batch(vocab: int, pad: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (3, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = pad
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_captured_scores_are_those_of_the_eager_attention(model_type) -> None:
    """softmax(captured scores) is the eager implementation's attention distribution on every
    real query and key (no mock: the architecture's own modelling code in both forwards);
    DeBERTa-v2's cannot be captured and says why."""
    config = tiny_config(model_type, vocab_size=120)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    batch = _padded_batch(120, config.pad_token_id or 0)
    problem = self_attention_problem(config)
    if model_type == "deberta-v2":
        assert "disentangled" in problem
        with pytest.raises(TypeError, match="self-attention"), \
                capture_attention_scores(model):
            pass
        return
    assert problem is None
    with torch.no_grad():
        eager = model(**batch, output_attentions=True).attentions
        with capture_attention_scores(model) as captured:
            model(**batch)
    real = batch["attention_mask"].bool()
    pairs = real[:, None, :, None] & real[:, None, None, :]
    assert len(captured.scores) == len(eager) == LAYERS
    for scores, probabilities in zip(captured.scores, eager, strict=True):
        recomputed = torch.softmax(scores, dim=-1)
        assert torch.allclose(recomputed.expand_as(probabilities)[pairs.expand_as(probabilities)],
                              probabilities[pairs.expand_as(probabilities)], atol=1e-6)


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_a_forward_stopped_early_sees_the_models_hidden_states(model_type) -> None:
    """The live teacher's early stop (used when a method names the layers it reads) hooks
    the architecture's layer list; its states are ``output_hidden_states``'s."""
    config = tiny_config(model_type, vocab_size=120)
    torch.manual_seed(0)
    model = AutoModel.from_config(config).eval()
    assert len(transformer_layers(model)) == LAYERS
    batch = _padded_batch(120, config.pad_token_id or 0)
    with torch.no_grad():
        full = model(**batch, output_hidden_states=True).hidden_states
        early = forward_to_depth(model, batch, {0, 1}, depth=1)
    for layer in (0, 1):
        assert torch.equal(early[layer], full[layer])


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["pooler", "cls", "mean"])
@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_students_of_each_architecture_build_init_save_and_reload(model_type, pooling,
                                                                  tmp_path) -> None:
    """A student of the teacher's config class with the shape's sizes under its own field
    names, its embeddings and chosen layers copied from the teacher, reloads with its head."""
    teacher_config = tiny_config(model_type, vocab_size=120)
    torch.manual_seed(0)
    teacher = AutoModel.from_config(teacher_config)
    state = {name: value.detach().clone() for name, value in teacher.state_dict().items()}
    shape = StudentConfig(num_layers=1, hidden_size=HIDDEN, num_heads=HEADS,
                          intermediate_size=2 * HIDDEN, init="teacher_layers",
                          teacher_layers=[1], embedding_init="teacher")
    student = build_encoder_student(StudentContext(get_task("rte"), "s", shape,
                                                   teacher_config, state, pooling=pooling))
    config = student.config
    assert type(config) is type(teacher_config)
    assert dimensions(config).layers == 1 and dimensions(config).hidden == HIDDEN
    assert isinstance(student, sequence_classifier_class(config)) or pooling == "pooler"
    base = student.base_model
    # the student's only layer is the teacher's second one, its embeddings the teacher's
    student_layer = dict(transformer_layers(base)[0].named_parameters())
    for name, value in dict(transformer_layers(teacher)[1].named_parameters()).items():
        assert torch.equal(student_layer[name], value), name
    for name, value in teacher.embeddings.named_parameters():
        assert torch.equal(dict(base.embeddings.named_parameters())[name], value), name
    # a narrower student takes the teacher's principal directions
    narrow = StudentConfig(num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32,
                           embedding_init="teacher_pca")
    small = build_encoder_student(StudentContext(get_task("stsb"), "s", narrow,
                                                 teacher_config, state, pooling=pooling))
    assert dimensions(small.config).hidden == 16 and small.config.num_labels == 1
    # or keeps every other dimension of each head and feed-forward unit, layers included
    selected = build_encoder_student(StudentContext(
        get_task("rte"), "s", narrow.model_copy(update={
            "num_heads": HEADS, "init": "teacher_select", "embedding_init": "teacher_select",
            "teacher_layers": [1]}), teacher_config, state, pooling=pooling))
    word = selected.base_model.embeddings.word_embeddings.weight
    assert torch.equal(word, teacher.embeddings.word_embeddings.weight[:, ::2])
    selected_layer = [value for _, value in transformer_layers(selected.base_model)[0]
                      .named_parameters()]
    teacher_layer = [value for _, value in transformer_layers(teacher)[1].named_parameters()]
    biases = [(mine, theirs) for mine, theirs in zip(selected_layer, teacher_layer, strict=True)
              if mine.dim() == 1]
    assert biases and all(torch.equal(mine, theirs[::2]) for mine, theirs in biases)
    # saved and reloaded (as the teacher stage caches a fine-tuned teacher), same logits
    student.eval().save_pretrained(tmp_path)
    loaded = load_sequence_classifier(tmp_path).eval()
    assert type(loaded) is type(student)
    batch = _padded_batch(120, teacher_config.pad_token_id or 0)
    with torch.no_grad():
        assert torch.allclose(loaded(**batch).logits, student(**batch).logits, atol=1e-6)


@pytest.mark.e2e
def test_tinybert_without_attention_scores_runs_on_deberta(runners) -> None:
    """The refusal is about reading scores, not about DeBERTa-v2: TinyBERT without the
    attention term and without general distillation (whose objective includes it) runs."""
    outcome = runners["deberta-v2"].run_one("tinybert", "rte", seed=1, variation=Variation.of(
        overrides={"params.general_distillation": False, "params.augment": False,
                   "loss_weights.attention": 0.0}))
    assert outcome.status == "finished" and math.isfinite(outcome.main_score)
    assert [stage.name for stage in outcome.record.stages] == ["intermediate", "prediction"]


def test_a_roberta_checkpoints_own_masked_lm_head_is_used(teachers, tmp_path) -> None:
    """RoBERTa's ``lm_head`` predicts the vocabulary (DistilBERT's vocabulary terms) and
    starts DistilBERT's student head; no head is fitted."""
    from transformers import RobertaForMaskedLM

    from harness.assets.checkpoints import resolve_checkpoint
    from harness.assets.mlm import load_masked_lm
    from harness.common.cache import ArtifactCache
    from methods.distilbert import _head_state

    folder = tmp_path / "roberta-mlm"
    tokenizer = AutoTokenizer.from_pretrained(teachers["roberta"])
    torch.manual_seed(0)
    model = RobertaForMaskedLM(tiny_config("roberta", len(tokenizer)))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    masked_lm = load_masked_lm(resolve_checkpoint(str(folder)), [" ".join(WORDS)] * 5,
                               ArtifactCache(tmp_path / "cache"), log=lambda _: None,
                               device="cpu")
    assert masked_lm.source == "checkpoint_head"
    assert type(masked_lm.head).__name__ == "RobertaLMHead"
    state = _head_state(masked_lm.head)
    assert torch.equal(state["dense.weight"], model.lm_head.dense.weight)
    assert torch.equal(state["bias"], model.lm_head.bias)


@pytest.mark.parametrize("pooling", ["pooler", "cls", "mean"])
@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_a_teacher_head_of_each_pooling_loads_the_pretrained_encoder(model_type, pooling,
                                                                     teachers) -> None:
    """What the teacher stage fine-tunes: the pre-trained encoder under the head its
    pooling names, every encoder weight loaded from the checkpoint (none left random)."""
    from harness.api.pooling import with_pooling
    from harness.api.students import classifier_config

    folder = teachers[model_type]
    config = with_pooling(classifier_config(AutoConfig.from_pretrained(folder),
                                            get_task("rte")), pooling)
    model, info = sequence_classifier_class(config).from_pretrained(
        folder, config=config, output_loading_info=True)
    prefix = f"{model.base_model_prefix}."
    assert not [key for key in info["missing_keys"] if key.startswith(prefix)]
    loaded = model.base_model.state_dict()
    encoder = AutoModel.from_pretrained(folder).state_dict()
    # only a pooler the head does not read is left out (cls / mean; RoBERTa's own head)
    assert {name.split(".")[0] for name in set(encoder) - set(loaded)} <= {"pooler"}
    for name, value in loaded.items():
        assert torch.equal(encoder[name], value), name


def test_exporting_a_pooled_student_of_another_architecture_is_refused(tmp_path) -> None:
    """Its stock class would load with a random head: refused, with what to do instead."""
    import json

    from harness.experiments.student_export import ExportError, _make_loadable

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta",
                                                      "classifier_pooling": "mean"}))
    with pytest.raises(ExportError, match="pooling: pooler"):
        _make_loadable(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "roberta", "classifier_pooling": "pooler",
        "architectures": ["RobertaForSequenceClassification"]}))
    assert "trust_remote_code" not in _make_loadable(tmp_path)
