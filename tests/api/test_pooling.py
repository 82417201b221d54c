"""Pooling of sequence-classification heads: auto-detection from checkpoint metadata, the
three heads on tiny random BERTs, reloading, and the pooling in teachers, students and run
ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import BertConfig, BertForSequenceClassification

from harness.api.pooling import (
    PooledBertForSequenceClassification,
    PoolingError,
    checkpoint_pooling,
    load_sequence_classifier,
    mean_pool,
    resolve_pooling,
    with_pooling,
)
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from tests.conftest import MINILM_DIR, tiny_suite_dict


def tiny_config(pooling: str) -> BertConfig:
    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=32, num_labels=3,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return with_pooling(config, pooling)


def sentence_transformers_folder(root: Path, pooling: dict) -> Path:
    (root / "1_Pooling").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    (root / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 16, "pooling_mode_cls_token": False,
         "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False, **pooling}))
    return root


def test_auto_reads_the_offline_minilm_teacher_as_mean_pooled() -> None:
    assert checkpoint_pooling(MINILM_DIR) == "mean"
    assert resolve_pooling("auto", MINILM_DIR) == "mean"
    assert resolve_pooling("cls", MINILM_DIR) == "cls"  # an explicit mode is kept


def test_auto_follows_sentence_transformers_metadata_else_berts_pooler(tmp_path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    assert checkpoint_pooling(plain) == "pooler"
    with pytest.raises(PoolingError, match="does not exist"):
        checkpoint_pooling(tmp_path / "missing")
    cls = sentence_transformers_folder(tmp_path / "cls", {"pooling_mode_cls_token": True})
    assert checkpoint_pooling(cls) == "cls"
    both = sentence_transformers_folder(tmp_path / "both", {"pooling_mode_mean_tokens": True,
                                                            "pooling_mode_max_tokens": True})
    with pytest.raises(PoolingError, match=r"1_Pooling/config\.json.*pass pooling"):
        checkpoint_pooling(both)


def test_mean_and_cls_heads_ignore_padding_and_have_no_pooler() -> None:
    torch.manual_seed(0)
    ids = torch.tensor([[2, 5, 9, 4, 3]])
    padded = torch.tensor([[2, 5, 9, 4, 3, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    for pooling in ("mean", "cls"):
        model = PooledBertForSequenceClassification(tiny_config(pooling)).eval()
        assert model.bert.pooler is None
        assert not any("pooler" in name for name in model.state_dict())
        alone = model(input_ids=ids).logits
        with_padding = model(input_ids=padded, attention_mask=mask).logits
        torch.testing.assert_close(alone, with_padding, rtol=1e-5, atol=1e-5)
    mean = PooledBertForSequenceClassification(tiny_config("mean")).eval()
    cls = PooledBertForSequenceClassification(tiny_config("cls")).eval()
    cls.load_state_dict(mean.state_dict())
    assert not torch.allclose(mean(input_ids=ids).logits, cls(input_ids=ids).logits)


def test_mean_head_reads_the_masked_mean_of_the_last_layer() -> None:
    torch.manual_seed(1)
    model = PooledBertForSequenceClassification(tiny_config("mean")).eval()
    ids = torch.tensor([[2, 5, 9, 3, 0], [2, 7, 3, 0, 0]])
    mask = (ids != 0).long()
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    last = out.hidden_states[-1]
    expected = torch.stack([last[0, :4].mean(0), last[1, :3].mean(0)])
    torch.testing.assert_close(mean_pool(last, mask), expected)
    torch.testing.assert_close(out.logits, model.classifier(expected))


def test_pooler_mode_is_the_stock_bert_classifier() -> None:
    torch.manual_seed(2)
    ours = PooledBertForSequenceClassification(tiny_config("pooler")).eval()
    stock = BertForSequenceClassification(tiny_config("pooler")).eval()
    stock.load_state_dict(ours.state_dict())
    ids = torch.tensor([[2, 5, 9, 3]])
    assert torch.equal(ours(input_ids=ids).logits, stock(input_ids=ids).logits)


def test_a_saved_model_reloads_with_its_head(tmp_path) -> None:
    torch.manual_seed(3)
    model = PooledBertForSequenceClassification(tiny_config("mean")).eval()
    model.save_pretrained(tmp_path / "model")
    loaded = load_sequence_classifier(tmp_path / "model").eval()
    assert isinstance(loaded, PooledBertForSequenceClassification)
    assert loaded.pooling == "mean" and loaded.bert.pooler is None
    ids = torch.tensor([[2, 5, 9, 3]])
    assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


def test_an_already_fine_tuned_teacher_keeps_its_own_heads_pooling(tmp_path) -> None:
    """With finetune: false the checkpoint's head is the teacher's, so its pooling (not the
    folder's sentence-transformers files or a default) is what a student's auto follows."""
    from harness.assets.checkpoints import TeacherError, resolve_checkpoint
    from harness.config.schema import TeacherConfig
    from harness.teacher.preparation import teacher_pooling

    PooledBertForSequenceClassification(tiny_config("mean")).save_pretrained(tmp_path / "m")
    checkpoint = resolve_checkpoint(str(tmp_path / "m"))
    fine_tuned = TeacherConfig(checkpoint=str(tmp_path / "m"), finetune=False)
    assert teacher_pooling(checkpoint, fine_tuned) == "mean"
    assert teacher_pooling(checkpoint, fine_tuned.model_copy(update={"finetune": True})) \
        == "pooler"  # to be fine-tuned: a plain BERT folder's auto
    with pytest.raises(TeacherError, match="its head reads mean"):
        teacher_pooling(checkpoint, fine_tuned.model_copy(update={"pooling": "cls"}))


@pytest.mark.e2e
def test_runs_record_the_resolved_pooling_and_it_changes_the_run_id(
        tiny_data_dir, tiny_teacher_dir, tmp_path) -> None:
    """The tiny teacher has no sentence-transformers metadata: auto resolves to the pooler;
    a student's auto follows the teacher; an explicit mode is a different run."""
    suite_file = tmp_path / "tiny.yaml"
    suite_file.write_text(yaml.safe_dump(tiny_suite_dict(tiny_data_dir, tiny_teacher_dir)))

    def resolved(*overrides: str):
        runner = SuiteRunner(load_suite(str(suite_file), list(overrides)),
                             tmp_path / "results", tmp_path / "cache", log=lambda _: None)
        spec = runner.planner.resolve("kd", "rte", 1).spec
        return runner, spec

    runner, auto = resolved()
    assert runner.planner.teacher_pooling == "pooler" and auto["student"]["pooling"] == "pooler"
    _, teacher_mean = resolved("teacher.pooling=mean")
    assert teacher_mean["student"]["pooling"] == "mean"
    assert teacher_mean["teacher"]["key"] != auto["teacher"]["key"]
    student_name = auto["student"]["name"]
    _, student_cls = resolved(f"students.{student_name}.pooling=cls")
    assert student_cls["student"]["pooling"] == "cls"
    assert student_cls["teacher"]["key"] == auto["teacher"]["key"]
    from harness.common.cache import content_hash
    assert len({content_hash(spec) for spec in (auto, teacher_mean, student_cls)}) == 3

    runner, _ = resolved("teacher.pooling=mean")
    outcome = runner.run_one("kd", "rte", 1)
    record = json.loads(outcome.path.read_text())
    assert record["teacher"]["pooling"] == "mean"
    assert record["config"]["student"]["pooling"] == "mean"
    teacher = runner.teacher("rte").load_model()
    assert isinstance(teacher, PooledBertForSequenceClassification)
    assert teacher.pooling == "mean"
