"""BERT-PKD (methods/bert_pkd.py) on tiny random BERTs: the patient term and the whole loss
against hand computations, the Skip / Last mappings, initialisation from the teacher's first
k layers, and beta = 0 reproducing vanilla KD exactly through the runner."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from transformers import BertConfig, BertForSequenceClassification, BertModel

import harness.experiments.runner
from harness.api.context import StudentContext
from harness.api.method import Method, StepInputs, TeacherView
from harness.api.registry import instantiate
from harness.api.students import classifier_config, resolve_teacher_sizes
from harness.config.schema import ConfigError, MethodRecipe, StudentConfig
from harness.data.tasks import TaskSpec, get_task
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from methods.bert_pkd import patient_layers, patient_loss, pkd_last, pkd_skip
from tests.conftest import tiny_suite_dict

VOCAB, HEADS, WIDTH, FFN = 50, 4, 32, 64
TEACHER_LAYERS = 6
LENGTHS = (7, 4, 5)  # real tokens per row; the batch is padded to 7


def teacher_config() -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=TEACHER_LAYERS,
                      num_attention_heads=HEADS, intermediate_size=FFN,
                      max_position_embeddings=32)


def pretrained_state() -> dict[str, torch.Tensor]:
    """What the runner hands students: the pre-trained encoder's state dict."""
    torch.manual_seed(123)
    return {k: v.clone() for k, v in BertModel(teacher_config()).state_dict().items()}


def context(task: TaskSpec, layers: int = 3, width: int = WIDTH,
            shape_layers: list[int] | None = None) -> StudentContext:
    shape = StudentConfig(num_layers=layers, hidden_size=width, num_heads=HEADS,
                          intermediate_size=2 * width, init="teacher_layers",
                          teacher_layers=shape_layers, embedding_init="teacher")
    return StudentContext(task=task, shape_name="test", shape=shape,
                          teacher_config=teacher_config(), teacher_state=pretrained_state())


def pkd(**recipe) -> Method:
    return instantiate("bert-pkd", MethodRecipe(**recipe))


# -- mappings -------------------------------------------------------------------------------
@pytest.mark.parametrize(("teacher", "student", "skip", "last"), [
    (12, 6, [2, 4, 6, 8, 10], [7, 8, 9, 10, 11]),
    (12, 3, [4, 8], [10, 11]),
    (6, 3, [2, 4], [4, 5]),
    (12, 1, [], []),
])
def test_skip_and_last_mappings(teacher, student, skip, last):
    assert pkd_skip(student, teacher) == patient_layers(student, teacher, "skip") == skip
    assert pkd_last(student, teacher) == patient_layers(student, teacher, "last") == last


def test_explicit_mapping_is_taken_as_given():
    assert patient_layers(3, 6, [1, 5]) == [1, 5]
    assert patient_layers(6, 12, [1, 3, 5, 7, 9]) == [1, 3, 5, 7, 9]


@pytest.mark.parametrize(("student", "teacher", "mapping", "message"), [
    (5, 12, "skip", r"multiple of the student depth k=5; give an explicit list of 4"),
    (3, 6, [2], "has 1 entries; a 3-layer student has 2 intermediate"),
    (3, 6, [4, 2], "strictly increasing"),
    (3, 6, [3, 3], "strictly increasing"),
    (3, 6, [0, 2], r"\[0\] are outside 1..5"),
    (3, 6, [2, 6], r"\[6\] are outside 1..5"),
    (7, 6, "last", "cannot take its layers from a 6-layer teacher"),
    (3, 6, "uniform", "unknown PKD mapping"),
])
def test_mapping_errors(student, teacher, mapping, message):
    with pytest.raises(ValueError, match=message):
        patient_layers(student, teacher, mapping)


# -- the patient term -------------------------------------------------------------------------
def hidden_with_garbage(layers: int, seed: int) -> list[torch.Tensor]:
    """hidden_states-like list (embeddings + layers), padded positions full of garbage."""
    generator = torch.Generator().manual_seed(seed)
    states = []
    for _ in range(layers + 1):
        tensor = torch.randn(len(LENGTHS), max(LENGTHS), WIDTH, generator=generator)
        for row, length in enumerate(LENGTHS):
            tensor[row, length:] = 1e6 * torch.randn(max(LENGTHS) - length, WIDTH,
                                                     generator=generator)
        states.append(tensor)
    return states


def loop_patient(student: list[torch.Tensor], teacher: list[torch.Tensor],
                 mapping: list[int]) -> float:
    """sum over j of (1/B) sum over rows of sum over dims (s/|s| - t/|t|)^2, by hand."""
    total = 0.0
    for j, teacher_layer in enumerate(mapping, start=1):
        per_row = 0.0
        for row in range(len(LENGTHS)):
            s = student[j][row, 0].tolist()
            t = teacher[teacher_layer][row, 0].tolist()
            s_norm = math.sqrt(sum(x * x for x in s))
            t_norm = math.sqrt(sum(x * x for x in t))
            per_row += sum((a / s_norm - b / t_norm) ** 2 for a, b in zip(s, t, strict=True))
        total += per_row / len(LENGTHS)
    return total


def test_patient_loss_equals_the_formula_and_ignores_padding():
    student, teacher = hidden_with_garbage(3, seed=1), hidden_with_garbage(6, seed=2)
    value = patient_loss(student, teacher, [2, 4])
    expected = loop_patient(student, teacher, [2, 4])
    assert expected > 0.1
    assert value.item() == pytest.approx(expected, rel=1e-5)
    # other garbage in the padding (and in every non-[CLS] position): same value
    for states in (student, teacher):
        for tensor in states:
            tensor[:, 1:] = torch.randn_like(tensor[:, 1:]) * 1e3
    assert patient_loss(student, teacher, [2, 4]).item() == pytest.approx(expected, rel=1e-5)
    # scale does not matter (unit-normalised), the [CLS] direction does
    scaled = [tensor * 7.0 for tensor in student]
    assert patient_loss(scaled, teacher, [2, 4]).item() == pytest.approx(expected, rel=1e-5)
    student[1][0, 0] = torch.randn(WIDTH)
    assert patient_loss(student, teacher, [2, 4]).item() != pytest.approx(expected, rel=1e-5)


def test_patient_loss_mean_reduction_is_the_authors_mse():
    student, teacher = hidden_with_garbage(3, seed=3), hidden_with_garbage(6, seed=4)
    total = patient_loss(student, teacher, [1, 5])
    mean = patient_loss(student, teacher, [1, 5], reduction="mean")
    torch.testing.assert_close(mean, total / (2 * WIDTH))
    stacked = [torch.nn.functional.normalize(torch.stack([h[j][:, 0] for h, j in pairs]), dim=-1)
               for pairs in (((student, 1), (student, 2)), ((teacher, 1), (teacher, 5)))]
    torch.testing.assert_close(mean, torch.nn.functional.mse_loss(*stacked))


# -- the whole loss on one batch ---------------------------------------------------------------
def padded_batch(task: TaskSpec) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    width = max(LENGTHS)
    mask = (torch.arange(width)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    input_ids = torch.randint(1, VOCAB, (len(LENGTHS), width), generator=generator)
    labels = (torch.rand(len(LENGTHS), generator=generator) * 5 if task.is_regression
              else torch.randint(0, task.num_labels, (len(LENGTHS),), generator=generator))
    return {"input_ids": input_ids * mask, "attention_mask": mask,
            "token_type_ids": torch.zeros_like(input_ids), "labels": labels}


@pytest.mark.parametrize("task_name", ["rte", "stsb"])
def test_whole_pkd_loss_equals_a_direct_computation(task_name):
    task = get_task(task_name)
    alpha, temperature, beta = 0.3, 4.0, 50.0
    method = pkd(params={"alpha": alpha, "temperature": temperature, "beta": beta})
    torch.manual_seed(0)
    teacher = BertForSequenceClassification(classifier_config(teacher_config(), task)).eval()
    student = method.build_student(context(task)).eval()
    with torch.no_grad():  # logits of a few units, so the temperature matters
        teacher.classifier.weight.mul_(30.0)
        student.classifier.weight.mul_(30.0)
    batch = padded_batch(task)
    model_inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    (stage,) = method.stages(task)
    assert stage.teacher_outputs == {"logits", "hidden_states"}
    with torch.no_grad():
        t_out = teacher(**model_inputs, output_hidden_states=True)
        s_out = method.forward_student(student, batch, stage)
        inputs = StepInputs(batch=batch, student=s_out, teacher=TeacherView(
            logits=t_out.logits, hidden_states=t_out.hidden_states), task=task, stage=stage,
            extra=torch.nn.ModuleDict())
        values = method.compute_losses(inputs)
        total = method.total_loss(values, stage)

    s_logits, t_logits = s_out.logits.double(), t_out.logits.double()
    if task.is_regression:
        gold = (s_logits.squeeze(-1) - batch["labels"].double()).pow(2).mean()
        soft = (s_logits.squeeze(-1) - t_logits.squeeze(-1)).pow(2).mean()
    else:
        gold = -torch.log_softmax(s_logits, -1)[torch.arange(3), batch["labels"]].mean()
        p_t = torch.softmax(t_logits / temperature, -1)
        kl = (p_t * (p_t.log() - torch.log_softmax(s_logits / temperature, -1))).sum(-1)
        soft = temperature**2 * kl.mean()
    patient = loop_patient(list(s_out.hidden_states), list(t_out.hidden_states), [2, 4])
    assert set(values) == {"gold", "soft", "patient"}
    assert values["gold"].item() == pytest.approx(gold.item(), rel=1e-5)
    assert values["soft"].item() == pytest.approx(soft.item(), rel=1e-5)
    assert soft.item() > 1e-3 and patient > 1e-3
    assert values["patient"].item() == pytest.approx(patient, rel=1e-5)
    expected = (1 - alpha) * gold.item() + alpha * soft.item() + beta * patient
    assert total.item() == pytest.approx(expected, rel=1e-5)


def test_the_patient_term_trains_the_lower_layers_and_leaves_the_top_to_the_logits():
    task = get_task("rte")
    method = pkd(disabled_losses=["gold", "soft"])
    student = method.build_student(context(task))
    teacher = BertForSequenceClassification(classifier_config(teacher_config(), task)).eval()
    batch = padded_batch(task)
    (stage,) = method.stages(task)
    with torch.no_grad():
        t_out = teacher(**{k: batch[k] for k in ("input_ids", "attention_mask")},
                        output_hidden_states=True)
    inputs = StepInputs(batch=batch, student=method.forward_student(student, batch, stage),
                        teacher=TeacherView(hidden_states=t_out.hidden_states), task=task,
                        stage=stage, extra=torch.nn.ModuleDict())
    method.total_loss(method.compute_losses(inputs), stage).backward()
    layers = student.bert.encoder.layer
    assert layers[1].output.dense.weight.grad.abs().sum() > 0
    assert layers[2].output.dense.weight.grad is None  # the top layer: logits only


# -- stages and weights -------------------------------------------------------------------------
def test_weights_come_from_alpha_and_beta():
    method = pkd(params={"alpha": 0.7, "beta": 500.0})
    assert method.weights == {"gold": pytest.approx(0.3), "soft": 0.7, "patient": 500.0}
    assert pkd(loss_weights={"patient": 2.0}).weights["patient"] == 2.0


@pytest.mark.parametrize("recipe", [{"params": {"beta": 0.0}}, {"disabled_losses": ["patient"]},
                                    {"loss_weights": {"patient": 0.0}}])
def test_without_the_patient_term_no_teacher_forward(recipe):
    (stage,) = pkd(**recipe).stages(get_task("rte"))
    assert stage.teacher == "finetuned" and stage.teacher_outputs == {"logits"}


# -- student initialisation -----------------------------------------------------------------------
def layer_tensors(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def assert_layer_is_copy(student, teacher_state, student_index, teacher_index, equal=True):
    ours = layer_tensors(student.state_dict(), f"bert.encoder.layer.{student_index}.")
    theirs = layer_tensors(teacher_state, f"encoder.layer.{teacher_index}.")
    assert ours.keys() == theirs.keys() and ours
    same = all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert same == equal, (student_index, teacher_index)


def test_student_copies_the_teachers_first_k_layers_not_the_shapes_choice():
    task = get_task("rte")
    ctx = context(task, layers=3, shape_layers=[1, 3, 5])  # the shape's own pick is ignored
    student = pkd().build_student(ctx)
    state = ctx.teacher_state
    for index in range(3):
        assert_layer_is_copy(student, state, index, index)
        assert_layer_is_copy(student, state, index, 2 * index + 1, equal=False)
    assert_layer_is_copy(student, state, 2, 3, equal=False)  # layer 4 of 6 is not copied
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings",
                 "LayerNorm"):
        ours = getattr(student.bert.embeddings, name).weight
        assert torch.equal(ours, state[f"embeddings.{name}.weight"])
    assert student.config.num_hidden_layers == 3


def test_explicit_teacher_layers_are_copied():
    ctx = context(get_task("rte"), layers=3)
    student = pkd(params={"teacher_layers": [5, 0, 2]}).build_student(ctx)
    for index, teacher_index in enumerate([5, 0, 2]):
        assert_layer_is_copy(student, ctx.teacher_state, index, teacher_index)
    assert_layer_is_copy(student, ctx.teacher_state, 0, 0, equal=False)


@pytest.mark.parametrize(("recipe", "ctx_args", "message"), [
    ({}, {"width": 16}, r"copies teacher layers whole.*hidden_size 16 \(the teacher's: 32\)"),
    ({"params": {"teacher_layers": [0, 1]}}, {}, r"must name 3 teacher layers"),
    ({"params": {"teacher_layers": [0, 1, 6]}}, {}, r"in 0..5"),
    ({}, {"layers": 4}, r"mapping: .*multiple of the student depth k=4"),
    ({"params": {"mapping": [2, 6]}}, {}, r"outside 1..5"),
    ({}, {"layers": 1}, "no intermediate layer"),
])
def test_bad_recipes_fail_when_building_the_student(recipe, ctx_args, message):
    with pytest.raises(ConfigError, match=message):
        pkd(**recipe).build_student(context(get_task("rte"), **ctx_args))


def test_a_one_layer_student_and_an_uneven_depth_work_without_the_patient_term():
    assert pkd(params={"beta": 0.0}).build_student(context(get_task("rte"), layers=1))
    student = pkd(params={"mapping": [1, 2, 4]}).build_student(
        context(get_task("rte"), layers=4))
    assert student.config.num_hidden_layers == 4


# -- beta = 0 is vanilla KD, through the runner ---------------------------------------------------
@pytest.mark.e2e
def test_beta_zero_reproduces_vanilla_kd_exactly(tmp_path, tiny_data_dir, tiny_teacher_dir,
                                                 monkeypatch):
    tree = tiny_suite_dict(tiny_data_dir, tiny_teacher_dir, steps=4)
    same = {"alpha": 0.4, "temperature": 3.0}
    tree["methods"].update({
        "kd-wide": {"base": "kd", "student": "tiny-wide", "params": same},
        "pkd-beta0": {"base": "bert-pkd", "student": "tiny-wide",
                      "params": {**same, "beta": 0.0}},
        "pkd-beta100": {"base": "bert-pkd", "student": "tiny-wide",
                        "params": {**same, "beta": 100.0}},
    })
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(tree))
    runner = SuiteRunner(load_suite(str(path)), tmp_path / "results", tmp_path / "cache",
                         log=lambda _: None)
    assert runner.suite.student_for("kd-wide")[1].teacher_layers == [0, 1]  # the first k

    predictions: list[torch.Tensor] = []
    real_predict = harness.experiments.runner.predict_logits

    def recording_predict(*args, **kwargs):
        logits = real_predict(*args, **kwargs)
        predictions.append(torch.as_tensor(logits).clone())
        return logits

    monkeypatch.setattr(harness.experiments.runner, "predict_logits", recording_predict)
    # The inference-speed passes (the teacher's only in a task's first run) are timing,
    # not training arithmetic: leave them out of the recorded predictions.
    monkeypatch.setattr(runner, "_inference_speed", lambda *args, **kwargs: {})
    for task in ("rte", "stsb"):
        runs = {}
        for name in ("kd-wide", "pkd-beta0", "pkd-beta100"):
            predictions.clear()
            record = runner.store.load(runner.run_one(name, task, seed=1).path)
            assert record.finished
            runs[name] = (record, list(predictions))
        (kd, kd_pred), (zero, zero_pred), (full, full_pred) = runs.values()
        assert zero.config["loss_weights"]["patient"] == 0.0
        assert zero.final_losses == kd.final_losses
        assert zero.dev == kd.dev and zero.main_score == kd.main_score
        assert zero.stages[0].history == kd.stages[0].history
        assert len(zero_pred) == len(kd_pred) > 0
        assert all(torch.equal(a, b) for a, b in zip(zero_pred, kd_pred, strict=True))
        # ... and the patient term does change training, so this test can fail
        assert set(full.final_losses) == {"gold", "soft", "patient", "total"}
        assert full.final_losses["gold"] != kd.final_losses["gold"]
        assert not torch.equal(full_pred[-1], kd_pred[-1])


# -- the suites' recipes -------------------------------------------------------------------------
def test_glue_cpu_pkd_differs_from_kd_3l_only_by_the_patient_term():
    suite = load_suite("glue-cpu")
    kd, pkd_recipe = suite.recipe("kd-3L"), suite.recipe("bert-pkd")
    assert suite.student_for("bert-pkd") == suite.student_for("kd-3L")
    for task in suite.tasks:  # the same task-stage budget, resolved
        assert (suite.train_config(task, *pkd_recipe.stage_overrides(task, "task"))
                == suite.train_config(task, *kd.stage_overrides(task, "task")))
    for name in ("bert-pkd", "bert-pkd-last", "bert-pkd-beta0"):
        method = instantiate(suite.plugin(name), suite.recipe(name), "mrpc")
        assert {k: method.weights[k] for k in ("gold", "soft")} == instantiate(
            "kd", kd, "mrpc").weights
    assert instantiate("bert-pkd", suite.recipe("bert-pkd-beta0")).weights["patient"] == 0.0
    assert instantiate("bert-pkd", suite.recipe("bert-pkd-last")).params.mapping == "last"


def test_glue_pkd_recipes_use_the_papers_students():
    suite = load_suite("glue")
    for name, layers, mapping in (("bert-pkd", 6, [2, 4, 6, 8, 10]), ("bert-pkd-3L", 3, [4, 8])):
        shape = suite.student_for(name)[1]
        assert shape.teacher_sizes  # widths follow the teacher, bert-base's here
        shape = resolve_teacher_sizes(shape, BertConfig())
        assert (shape.num_layers, shape.hidden_size, shape.num_heads) == (layers, 768, 12)
        method = instantiate(suite.plugin(name), suite.recipe(name), "rte")
        assert patient_layers(layers, 12, method.params.mapping) == mapping
        assert method.weights == {"gold": pytest.approx(0.3), "soft": 0.7, "patient": 500.0}
