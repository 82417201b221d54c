"""DistilBERT (methods/distilbert.py) on tiny random BERTs.

The loss terms are checked against their formulas computed position by position over a
padded, masked batch; initialisation against the teacher's weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel

from harness.api.context import StudentContext
from harness.api.method import StepInputs, TeacherView
from harness.api.registry import instantiate
from harness.api.students import classifier_config
from harness.assets.mlm import TiedMLMHead
from harness.common.cache import ArtifactCache
from harness.config.identity import MLM_HEAD_KIND
from harness.config.schema import ConfigError, MethodRecipe, StudentConfig
from harness.data.tasks import get_task
from harness.experiments import runner as runner_module
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from harness.training.progress_file import load_progress_file
from methods.distilbert import (
    IGNORE,
    DistilBERT,
    StudentMLMHead,
    alternate_layers,
    cosine_hidden_loss,
    mask_tokens,
)
from tests.conftest import refit_mlm_head

VOCAB, HIDDEN, HEADS = 60, 32, 4
LENGTHS = (7, 3, 5)


def distilbert(**recipe):
    return instantiate("distilbert", MethodRecipe(**recipe))


def teacher_model(layers: int = 4) -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=layers,
                                num_attention_heads=HEADS, intermediate_size=64,
                                max_position_embeddings=32))


def context(teacher: BertModel, layers: int = 2) -> StudentContext:
    shape = StudentConfig(num_layers=layers, hidden_size=HIDDEN, num_heads=HEADS,
                          intermediate_size=64)
    return StudentContext(task=get_task("sst2"), shape_name="half", shape=shape,
                          teacher_config=teacher.config, teacher_state=teacher.state_dict())


def test_alternate_layers_give_the_released_recipe_and_a_rule_for_any_depth():
    assert alternate_layers(12, 6) == [0, 2, 4, 7, 9, 11]
    assert alternate_layers(6, 3) == [0, 3, 5]
    assert alternate_layers(12, 4) == [0, 4, 7, 11]
    assert alternate_layers(6, 6) == [0, 1, 2, 3, 4, 5]
    assert alternate_layers(6, 1) == [0]
    with pytest.raises(ValueError, match="cannot take 7 layers"):
        alternate_layers(6, 7)


def test_masking_picks_fifteen_percent_of_real_tokens_and_splits_80_10_10():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, VOCAB, (400, 50), generator=generator)
    maskable = torch.ones_like(ids, dtype=torch.bool)
    maskable[:, 0] = False      # [CLS]
    maskable[:, 40:] = False    # padding
    masked, labels = mask_tokens(ids, maskable, mask_token_id=3, vocab_size=VOCAB,
                                 mask_prob=0.15, generator=generator)
    picked = labels != IGNORE
    assert not picked[~maskable].any() and torch.equal(masked[~maskable], ids[~maskable])
    assert torch.equal(labels[picked], ids[picked])
    assert torch.equal(masked[~picked], ids[~picked])
    count = int(picked.sum())
    assert abs(count / int(maskable.sum()) - 0.15) < 0.01
    to_mask = int((masked[picked] == 3).sum())
    kept = int((masked[picked] == ids[picked]).sum())
    assert abs(to_mask / count - 0.8) < 0.02
    # kept: the 10% left alone plus the random draws that hit the same id (1/60 of 10%)
    assert abs(kept / count - (0.1 + 0.1 / VOCAB)) < 0.02
    again, _ = mask_tokens(ids, maskable, 3, VOCAB, 0.15, torch.Generator().manual_seed(0))
    first, _ = mask_tokens(ids, maskable, 3, VOCAB, 0.15, torch.Generator().manual_seed(0))
    assert torch.equal(again, first)


def test_masking_always_picks_a_token_in_a_short_batch():
    ids = torch.tensor([[1, 7, 2, 0]])
    maskable = torch.tensor([[False, True, False, False]])
    _, labels = mask_tokens(ids, maskable, 3, VOCAB, 1e-6, torch.Generator().manual_seed(0))
    assert labels.tolist() == [[IGNORE, 7, IGNORE, IGNORE]]


def test_student_starts_from_the_alternate_teacher_layers_embeddings_and_head():
    teacher = teacher_model(layers=4)
    method = distilbert()
    student = method.build_student(context(teacher, layers=2))
    state, source = student.state_dict(), teacher.state_dict()
    for student_layer, teacher_layer in enumerate(alternate_layers(4, 2)):  # [0, 3]
        for name in ("attention.self.key.weight", "output.LayerNorm.bias"):
            assert torch.equal(state[f"bert.encoder.layer.{student_layer}.{name}"],
                               source[f"encoder.layer.{teacher_layer}.{name}"])
    assert not torch.equal(state["bert.encoder.layer.1.attention.self.key.weight"],
                           source["encoder.layer.1.attention.self.key.weight"])
    assert torch.equal(state["bert.embeddings.word_embeddings.weight"],
                       source["embeddings.word_embeddings.weight"])
    explicit = distilbert(params={"init": [1, 2]}).build_student(context(teacher))
    assert torch.equal(explicit.state_dict()["bert.encoder.layer.0.output.dense.weight"],
                       source["encoder.layer.1.output.dense.weight"])


def test_random_initialisation_shares_nothing_with_the_teacher():
    teacher = teacher_model(layers=4)
    student = distilbert(params={"init": "random"}).build_student(context(teacher))
    state, source = student.state_dict(), teacher.state_dict()
    for name, value in source.items():
        ours = state.get(f"bert.{name}")
        if ours is not None and ours.shape == value.shape and value.std() > 0:
            assert not torch.equal(ours, value), name


def test_a_narrower_student_or_a_bad_layer_list_is_a_config_error():
    teacher = teacher_model()
    narrow = StudentContext(task=get_task("sst2"), shape_name="narrow",
                            shape=StudentConfig(num_layers=2, hidden_size=16, num_heads=4,
                                                intermediate_size=32),
                            teacher_config=teacher.config, teacher_state=teacher.state_dict())
    with pytest.raises(ConfigError, match="teacher's hidden size"):
        distilbert().build_student(narrow)
    with pytest.raises(ConfigError, match="must list 2 teacher layers"):
        distilbert(params={"init": [0, 9]}).build_student(context(teacher))


def _general_inputs(method, *, teacher: BertModel, seed: int = 1):
    """A padded, masked batch through a 2-layer student and the teacher, as the engine
    would run the general stage."""
    generator = torch.Generator().manual_seed(seed)
    width = max(LENGTHS)
    attention = (torch.arange(width)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    ids = torch.randint(5, VOCAB, (len(LENGTHS), width), generator=generator) * attention
    labels = torch.full_like(ids, IGNORE)
    masked = ids.clone()
    for row, column in ((0, 2), (0, 5), (1, 1), (2, 3)):
        labels[row, column] = ids[row, column]
        masked[row, column] = 3
    batch = {"input_ids": masked, "attention_mask": attention,
             "token_type_ids": torch.zeros_like(ids), "mlm_labels": labels}
    student = BertForSequenceClassification(classifier_config(
        BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
                   num_attention_heads=HEADS, intermediate_size=64,
                   max_position_embeddings=32), get_task("sst2")))
    stage = method.stages(get_task("sst2"))[0]
    assert stage.is_general
    output = method.forward_student(student, batch, stage)
    with torch.no_grad():
        teacher_out = teacher(input_ids=masked, attention_mask=attention,
                              output_hidden_states=True)
    torch.manual_seed(seed)
    head = StudentMLMHead(HIDDEN, VOCAB)
    torch.nn.init.normal_(head.bias)
    method._teacher_head = TiedMLMHead(teacher.embeddings.word_embeddings.weight, HIDDEN)
    return StepInputs(batch=batch, student=output,
                      teacher=TeacherView(hidden_states=teacher_out.hidden_states),
                      task=get_task("sst2"), stage=stage,
                      extra=torch.nn.ModuleDict({"mlm_head": head}))


def test_general_terms_match_their_formulas_position_by_position():
    teacher = teacher_model(layers=2)
    method = distilbert(params={"temperature": 3.0})
    inputs = _general_inputs(method, teacher=teacher)
    values = method.compute_losses(inputs)
    labels = inputs.batch["mlm_labels"]
    student_last = inputs.student.hidden_states[-1]
    teacher_last = inputs.teacher.hidden_states[-1]
    embeddings = inputs.student.word_embeddings
    head, teacher_head = inputs.extra["mlm_head"], method._teacher_head
    kl_terms, ce_terms = [], []
    for row, column in (labels != IGNORE).nonzero().tolist():
        hidden = student_last[row, column]
        transformed = torch.nn.functional.layer_norm(
            torch.nn.functional.gelu(hidden @ head.dense.weight.T + head.dense.bias),
            (HIDDEN,), head.layer_norm.weight, head.layer_norm.bias, 1e-12)
        student_logits = transformed @ embeddings.T + head.bias
        with torch.no_grad():
            teacher_logits = teacher_head(teacher_last[row, column])
        p_teacher = torch.softmax(teacher_logits / 3.0, -1)
        log_student = torch.log_softmax(student_logits / 3.0, -1)
        kl_terms.append((p_teacher * (p_teacher.log() - log_student)).sum() * 9.0)
        ce_terms.append(-torch.log_softmax(student_logits, -1)[labels[row, column]])
    torch.testing.assert_close(values["ce"], torch.stack(kl_terms).mean())
    torch.testing.assert_close(values["mlm"], torch.stack(ce_terms).mean())
    cosines = [1 - torch.dot(student_last[r, c], teacher_last[r, c])
               / (student_last[r, c].norm() * teacher_last[r, c].norm())
               for r, length in enumerate(LENGTHS) for c in range(length)]
    torch.testing.assert_close(values["cos"], torch.stack(cosines).mean())
    total = method.total_loss(values, inputs.stage)
    torch.testing.assert_close(total, 5 * values["ce"] + 2 * values["mlm"] + values["cos"])


def test_cosine_loss_ignores_whatever_padding_holds():
    generator = torch.Generator().manual_seed(2)
    student = torch.randn(2, 5, 8, generator=generator)
    teacher = torch.randn(2, 5, 8, generator=generator)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    garbage = student.clone()
    garbage[0, 3:] = float("nan")
    assert torch.equal(cosine_hidden_loss(student, teacher, mask),
                       cosine_hidden_loss(garbage.nan_to_num(1e6), teacher, mask))
    assert torch.isfinite(cosine_hidden_loss(garbage, teacher, mask))


def test_switches_choose_terms_stages_and_what_general_distillation_depends_on():
    sst2 = get_task("sst2")
    assert [stage.name for stage in distilbert().stages(sst2)] == ["general", "finetune"]
    td = distilbert(params={"task_distillation": True, "task_alpha": 0.3})
    task_stage = td.stages(sst2)[1]
    assert task_stage.name == "task" and task_stage.teacher == "finetuned"
    assert td.stage_weights(task_stage) == pytest.approx({"ce": 0.3, "gold": 0.7})
    assert td.general_key() == distilbert().general_key()  # task-only switches
    no_cos = distilbert(disabled_losses=["cos"])
    assert no_cos.stage_weights(no_cos.stages(sst2)[0]) == {"ce": 5.0, "mlm": 2.0, "cos": 0.0}
    assert no_cos.general_key() != distilbert().general_key()
    assert distilbert(params={"init": "random"}).general_key() != distilbert().general_key()
    no_vocabulary = distilbert(params={"vocabulary_terms": False, "task_distillation": True})
    general, task = no_vocabulary.stages(sst2)
    assert no_vocabulary.stage_weights(general) == {"ce": 0.0, "mlm": 0.0, "cos": 1.0}
    assert no_vocabulary.general_key() == distilbert(disabled_losses=["ce", "mlm"]).general_key()
    # the task stage's ce reads the logits, not the vocabulary: it stays
    assert no_vocabulary.stage_weights(task) == pytest.approx({"ce": 0.5, "gold": 0.5})
    assert [s.name for s in distilbert(params={"general_distillation": False}).stages(sst2)] \
        == ["finetune"]
    with pytest.raises(ConfigError, match="every general-distillation term"):
        distilbert(disabled_losses=["ce", "mlm", "cos"]).stages(sst2)
    with pytest.raises(ConfigError, match="gold term"):
        distilbert(disabled_losses=["gold"]).stages(sst2)


def test_a_checkpoint_mlm_head_carries_over_to_the_student_head_exactly():
    """BERT checkpoints (suite glue) ship a ``cls`` head: the student's head, tied to the
    same embeddings, must compute the same vocabulary logits from it."""
    from transformers import BertForMaskedLM

    from methods.distilbert import _head_state

    torch.manual_seed(0)
    masked_lm = BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                           num_hidden_layers=1, num_attention_heads=HEADS,
                                           intermediate_size=64))
    torch.nn.init.normal_(masked_lm.cls.predictions.bias)
    head = StudentMLMHead(HIDDEN, VOCAB)
    head.load_state_dict(_head_state(masked_lm.cls))
    hidden = torch.randn(5, HIDDEN)
    embeddings = masked_lm.get_input_embeddings().weight
    torch.testing.assert_close(head(hidden, embeddings), masked_lm.cls(hidden))


def test_a_distilbert_teachers_vocabulary_layers_carry_over_to_the_student_head_exactly():
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    from harness.assets.mlm import _checkpoint_head
    from methods.distilbert import _head_state

    torch.manual_seed(0)
    masked_lm = DistilBertForMaskedLM(DistilBertConfig(
        vocab_size=VOCAB, dim=HIDDEN, n_layers=1, n_heads=HEADS, hidden_dim=64))
    torch.nn.init.normal_(masked_lm.vocab_projector.bias)
    teacher_head = _checkpoint_head(masked_lm)
    head = StudentMLMHead(HIDDEN, VOCAB, layer_norm_eps=1e-12)
    head.load_state_dict(_head_state(teacher_head))
    hidden = torch.randn(5, HIDDEN)
    torch.testing.assert_close(head(hidden, masked_lm.vocab_projector.weight),
                               teacher_head(hidden))
    assert _head_state(torch.nn.Linear(HIDDEN, VOCAB)) is None  # refused in extra_modules


@pytest.mark.e2e
def test_the_general_checkpoint_is_made_again_when_the_teachers_head_is_fitted_again(
        tiny_suite_file, tmp_path, monkeypatch):
    """The tiny teacher has no masked-LM head: the general stage starts the student's head
    from one fitted for it and distils its vocabulary distributions.  That head is cached
    under a key that names its recipe, not its weights: fitted again with other weights
    (another machine), the general checkpoint distilled from the old head is made again."""
    suite = load_suite(str(tiny_suite_file))
    cache = tmp_path / "cache"
    SuiteRunner(suite, tmp_path / "made", cache, log=lambda _: None).run_one(
        "distilbert", "stsb", seed=1)

    def entry(kind: str) -> Path:
        [found] = [path for path in (cache / kind).iterdir() if not path.name.startswith(".")]
        return found

    general, head = entry("general"), entry(MLM_HEAD_KIND)
    recorded = json.loads((general / "key.json").read_text())["made_from"]
    assert recorded == {f"{MLM_HEAD_KIND}/{head.name}":
                        ArtifactCache(cache).files_digest(MLM_HEAD_KIND, head.name)}
    refit_mlm_head(head)
    lines: list[str] = []
    again = SuiteRunner(suite, tmp_path / "again", cache, log=lines.append)
    again.cache.log = lines.append
    again.run_one("distilbert", "stsb", seed=1)
    assert any(f"general/{general.name[:16]} is damaged (it was made from another build of "
               f"{MLM_HEAD_KIND}/{head.name[:16]})" in line for line in lines), lines
    assert json.loads((general / "key.json").read_text())["made_from"] == {
        f"{MLM_HEAD_KIND}/{head.name}": ArtifactCache(cache).files_digest(MLM_HEAD_KIND, head.name)}

    # Its saved progress records the head too: a general stage killed part-way and resumed
    # after the head was fitted again starts over rather than train on both heads.
    shutil.rmtree(general)
    monkeypatch.setattr(runner_module, "GENERAL_SAVE_SECONDS", 0.0)  # after every step
    train, steps = DistilBERT.compute_losses, []

    class Killed(Exception):
        """Stands for the process being killed."""

    def killed_at_the_second_step(self, inputs):
        steps.append(inputs.stage.name)
        if len(steps) == 2:
            raise Killed
        return train(self, inputs)

    with monkeypatch.context() as patch:
        patch.setattr(DistilBERT, "compute_losses", killed_at_the_second_step)
        with pytest.raises(Killed):
            SuiteRunner(suite, tmp_path / "killed", cache, log=lambda _: None).run_one(
                "distilbert", "stsb", seed=1)
    [progress] = (cache / "partial").iterdir()
    assert steps == ["general", "general"], steps
    assert load_progress_file(progress)["made_from"] == {
        f"{MLM_HEAD_KIND}/{head.name}": ArtifactCache(cache).files_digest(MLM_HEAD_KIND, head.name)}
    refit_mlm_head(head)
    lines.clear()
    SuiteRunner(suite, tmp_path / "resumed", cache, log=lines.append).run_one(
        "distilbert", "stsb", seed=1)
    assert f"[engine] {progress}: it was saved from another build of " \
        f"{MLM_HEAD_KIND}/{head.name[:16]} (since rebuilt with other contents); starting over" \
        in lines, lines
    assert not any("resuming" in line for line in lines)
    assert json.loads((general / "key.json").read_text())["made_from"] == {
        f"{MLM_HEAD_KIND}/{head.name}": ArtifactCache(cache).files_digest(MLM_HEAD_KIND, head.name)}
