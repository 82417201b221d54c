"""TinyBERT task distillation (methods/tinybert/__init__.py) on tiny random BERTs.

Every term is checked against its formula computed by hand, row by row over the real
tokens of a padded batch, from the models' own hidden states and query/key weights.
"""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification

from harness.api.capture import capture_attention_scores
from harness.api.context import StudentContext
from harness.api.method import Method, StepInputs, TeacherView
from harness.api.registry import instantiate
from harness.api.students import classifier_config
from harness.config.schema import ConfigError, MethodRecipe, StudentConfig
from harness.data.tasks import TaskSpec, get_task
from tests.reference_formulas import manual_attention_scores

VOCAB, HEADS = 50, 4
TEACHER_LAYERS, TEACHER_HIDDEN = 4, 32
STUDENT_LAYERS, STUDENT_HIDDEN = 2, 16
LENGTHS = (7, 4, 5)  # real tokens per row; the batch is padded to 7
LINEAR = STUDENT_HIDDEN * TEACHER_HIDDEN + TEACHER_HIDDEN  # parameters of one projection


def tiny_teacher_config() -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=TEACHER_HIDDEN,
                      num_hidden_layers=TEACHER_LAYERS, num_attention_heads=HEADS,
                      intermediate_size=64, max_position_embeddings=32)


def student_context(task: TaskSpec, heads: int = HEADS) -> StudentContext:
    shape = StudentConfig(num_layers=STUDENT_LAYERS, hidden_size=STUDENT_HIDDEN,
                          num_heads=heads, intermediate_size=32)
    return StudentContext(task=task, shape_name="tiny", shape=shape,
                          teacher_config=tiny_teacher_config())


TASK_ONLY = {"general_distillation": False, "augment": False}


def tinybert(**recipe) -> Method:
    """Task distillation alone on the plain task data, unless the recipe's params say
    otherwise (the two-stage procedure is tested apart)."""
    recipe["params"] = {**TASK_ONLY, **recipe.get("params", {})}
    return instantiate("tinybert", MethodRecipe(**recipe))


def padded_batch(task: TaskSpec, seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    width = max(LENGTHS)
    attention_mask = (torch.arange(width)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    input_ids = torch.randint(1, VOCAB, (len(LENGTHS), width), generator=generator)
    labels = (torch.rand(len(LENGTHS), generator=generator) * 5 if task.is_regression
              else torch.randint(0, task.num_labels, (len(LENGTHS),), generator=generator))
    return {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask,
            "token_type_ids": torch.zeros_like(input_ids), "labels": labels}


class Setup:
    """Method, teacher, student and projections for one task, all in eval mode."""

    def __init__(self, task_name: str = "rte", **recipe) -> None:
        self.task = get_task(task_name)
        self.method = tinybert(**recipe)
        context = student_context(self.task)
        torch.manual_seed(0)
        self.teacher = BertForSequenceClassification(
            classifier_config(tiny_teacher_config(), self.task)).eval()
        self.student = self.method.build_student(context).eval()
        self.extra = self.method.extra_modules(context)
        with torch.no_grad():  # logits of a few units, so the temperature matters
            self.teacher.classifier.weight.mul_(100.0)
            self.student.classifier.weight.mul_(100.0)
        self.batch = padded_batch(self.task)
        self.stages = {stage.name: stage for stage in self.method.stages(self.task)}

    def teacher_view(self) -> TeacherView:
        """What the engine hands the method: hidden states, captured scores, logits."""
        with capture_attention_scores(self.teacher) as capture, torch.inference_mode():
            out = self.teacher(**model_inputs(self.batch), output_hidden_states=True)
        return TeacherView(logits=out.logits, hidden_states=out.hidden_states,
                           attention_scores=capture.scores)

    def step_inputs(self, stage_name: str, student: torch.nn.Module | None = None,
                    extra: torch.nn.Module | None = None) -> StepInputs:
        stage = self.stages[stage_name]
        output = self.method.forward_student(self.student if student is None else student,
                                              self.batch, stage)
        return StepInputs(batch=self.batch, student=output, teacher=self.teacher_view(),
                          task=self.task, stage=stage,
                          extra=self.extra if extra is None else extra)

    def losses(self, stage_name: str) -> dict[str, torch.Tensor]:
        return self.method.compute_losses(self.step_inputs(stage_name))


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids")}


# -- the formulas, by hand ---------------------------------------------------------------
def manual_scores(model: BertForSequenceClassification, hidden_states, layer: int
                  ) -> torch.Tensor:
    """(batch, heads, L, L) Q_i K_i^T / sqrt(d_k) of Transformer layer ``layer`` (1-based)."""
    attention = model.bert.encoder.layer[layer - 1].attention.self
    hidden = hidden_states[layer - 1]
    return manual_attention_scores(attention, hidden, HEADS)


def token_mse(student: torch.Tensor, teacher: torch.Tensor, projection) -> torch.Tensor:
    """Squared error over the real tokens x teacher dims of every row, divided by their count."""
    total, count = torch.zeros(()), 0
    for row, length in enumerate(LENGTHS):
        difference = projection(student[row, :length]) - teacher[row, :length]
        total = total + difference.pow(2).sum()
        count += length * teacher.shape[-1]
    return total / count


def score_mse(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """(1/h) sum_i MSE_i, each head's MSE over the (query, key) pairs of real tokens."""
    per_head = []
    for head in range(HEADS):
        total, count = torch.zeros(()), 0
        for row, length in enumerate(LENGTHS):
            difference = (student[row, head, :length, :length]
                          - teacher[row, head, :length, :length])
            total = total + difference.pow(2).sum()
            count += length * length
        per_head.append(total / count)
    return sum(per_head) / HEADS


def expected_terms(setup: Setup, teacher_layers: list[int], lambdas: list[float],
                   temperature: float, shared: bool) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        student = setup.student(**model_inputs(setup.batch), output_hidden_states=True)
        teacher = setup.teacher(**model_inputs(setup.batch), output_hidden_states=True)

        def projection(layer: int):
            if shared:
                return setup.extra["shared"]
            return setup.extra["embedding" if layer == 0 else f"hidden{layer}"]

        pairs = list(enumerate(teacher_layers, start=1))
        probabilities = F.softmax(teacher.logits / temperature, dim=-1)
        log_probabilities = F.log_softmax(student.logits / temperature, dim=-1)
        return {
            "embedding": lambdas[0] * token_mse(student.hidden_states[0],
                                                teacher.hidden_states[0], projection(0)),
            "hidden": sum(lambdas[m] * token_mse(student.hidden_states[m],
                                                 teacher.hidden_states[g], projection(m))
                          for m, g in pairs),
            "attention": sum(lambdas[m] * score_mse(
                manual_scores(setup.student, student.hidden_states, m),
                manual_scores(setup.teacher, teacher.hidden_states, g)) for m, g in pairs),
            "prediction": lambdas[-1] * -(probabilities * log_probabilities).sum(-1).mean(),
        }


def assert_terms_match(setup: Setup, expected: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        values = {**setup.losses("intermediate"), **setup.losses("prediction")}
    assert set(values) == set(expected)
    for name, value in values.items():
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-7, msg=name)


# -- term values ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["separate-W", "shared-W"])
def test_every_term_equals_its_formula_on_a_padded_batch(shared: bool):
    lambdas = [0.5, 1.0, 2.0, 3.0]  # embeddings, layers 1 and 2, prediction
    setup = Setup(params={"temperature": 2.0, "layer_weights": lambdas,
                          "shared_projection": shared})
    expected = expected_terms(setup, [2, 4], lambdas, temperature=2.0, shared=shared)
    assert all(value > 0 for value in expected.values())
    assert_terms_match(setup, expected)


@pytest.mark.slow
@pytest.mark.parametrize(("mapping", "teacher_layers"), [
    ("uniform", [2, 4]), ("top", [3, 4]), ("bottom", [1, 2]), ([1, 3], [1, 3])])
def test_mapping_selects_the_intended_teacher_layers(mapping, teacher_layers):
    setup = Setup(params={"mapping": mapping})
    assert setup.method._mapping(setup.step_inputs("intermediate")) == teacher_layers
    assert_terms_match(setup, expected_terms(setup, teacher_layers, [1.0] * 4, temperature=1.0,
                                             shared=False))


def test_regression_prediction_fits_the_teacher_prediction_not_the_gold_score():
    setup = Setup("stsb")
    teacher_scores = setup.teacher_view().logits.squeeze(-1)
    setup.batch["labels"] = teacher_scores + 10.0  # gold far from the teacher
    with torch.no_grad():
        (value,) = setup.losses("prediction").values()
        student_scores = setup.student(**model_inputs(setup.batch)).logits.squeeze(-1)
    torch.testing.assert_close(value, (student_scores - teacher_scores).pow(2).mean())
    assert value < (student_scores - setup.batch["labels"]).pow(2).mean() - 50


# -- switching terms off ------------------------------------------------------------------
def test_stages_intermediate_then_prediction_with_what_each_asks_of_the_teacher():
    intermediate, prediction = tinybert().stages(get_task("rte"))
    assert intermediate.name == "intermediate" and not intermediate.evaluate
    assert set(intermediate.loss_terms) == {"embedding", "attention", "hidden"}
    assert intermediate.teacher == "finetuned"
    assert intermediate.teacher_outputs == {"hidden_states", "attention_scores"}
    assert prediction.name == "prediction" and prediction.evaluate
    assert prediction.loss_terms == ("prediction",) and prediction.teacher_outputs == {"logits"}


@pytest.mark.parametrize("recipe", [{"disabled_losses": ["attention"]},
                                    {"loss_weights": {"attention": 0.0}}],
                         ids=["disabled", "weight-0"])
def test_a_switched_off_term_is_not_computed_nor_its_inputs(recipe, monkeypatch):
    setup = Setup(**recipe)
    assert setup.stages["intermediate"].teacher_outputs == {"hidden_states"}

    def must_not_run(_inputs):
        raise AssertionError("the attention term was computed")

    monkeypatch.setattr(setup.method, "loss_attention", must_not_run)
    inputs = setup.step_inputs("intermediate")
    assert inputs.student.attention_scores is None
    assert set(setup.method.compute_losses(inputs)) == {"embedding", "hidden"}


def test_without_embedding_and_hidden_terms_no_hidden_states_and_no_projections():
    setup = Setup(disabled_losses=["embedding", "hidden"])
    assert setup.stages["intermediate"].teacher_outputs == {"attention_scores"}
    assert len(setup.extra) == 0
    inputs = setup.step_inputs("intermediate")
    assert inputs.student.hidden_states is None
    assert set(setup.method.compute_losses(inputs)) == {"attention"}


def test_intermediate_stage_is_left_out_when_all_its_terms_are_off():
    method = tinybert(disabled_losses=["embedding", "attention", "hidden"])
    assert [stage.name for stage in method.stages(get_task("rte"))] == ["prediction"]


def test_without_the_prediction_term_the_head_learns_from_gold_labels():
    intermediate, prediction = tinybert(disabled_losses=["prediction"]).stages(get_task("rte"))
    assert intermediate.name == "intermediate"
    assert prediction.loss_terms == ("gold",) and prediction.teacher == "none"
    assert prediction.data == "task" and prediction.evaluate


@pytest.mark.parametrize(("augmented_stages", "intermediate_data", "prediction_data"), [
    (None, "augmented", "augmented"),
    (["intermediate"], "augmented", "task"),
    (["prediction"], "task", "augmented"),
])
def test_augmented_stages_choose_which_task_stage_reads_the_augmented_set(
        augmented_stages, intermediate_data, prediction_data):
    params = {"augment": True}
    if augmented_stages is not None:
        params["augmented_stages"] = augmented_stages
    intermediate, prediction = tinybert(params=params).stages(get_task("rte"))
    assert (intermediate.data, prediction.data) == (intermediate_data, prediction_data)
    assert prediction.teacher == "finetuned" and prediction.loss_terms == ("prediction",)


def test_augmented_stages_at_its_default_leaves_earlier_run_ids_alone():
    """The option came after the committed tinybert records: at its default it is not in
    the params a run id hashes; set, it is, and it reads back."""
    dumped = tinybert(params={"augment": True}).params.model_dump()
    assert "augmented_stages" not in dumped and dumped["augment"] is True
    narrowed = tinybert(params={"augmented_stages": ["intermediate"]}).params
    assert narrowed.model_dump()["augmented_stages"] == ["intermediate"]
    assert type(narrowed).model_validate(narrowed.model_dump()) == narrowed


@pytest.mark.e2e
def test_run_ids_follow_the_corpus_a_masked_lm_head_is_fitted_on(tiny_suite_file, tmp_path):
    """Without general distillation nothing else puts the corpus in a run id, yet masked-LM
    candidates come from a head fitted on it (the tiny teacher has none): another corpus
    makes other copies, so another run. GloVe candidates do not read it."""
    from harness.experiments.runner import SuiteRunner
    from harness.experiments.suites import load_suite

    def run_id(candidates: str, corpus_task: str) -> str:
        suite = load_suite(str(tiny_suite_file), overrides=[
            "methods.tinybert.params.general_distillation=false",
            f"methods.tinybert.params.augmentation.candidates={candidates}",
            f"corpus.tasks=[{corpus_task}]"])
        runner = SuiteRunner(suite, tmp_path / "r", tmp_path / "c", log=lambda _: None)
        return runner.planner.run_id("tinybert", "rte", 1)

    assert run_id("mlm", "rte") != run_id("mlm", "stsb")
    assert run_id("glove", "rte") == run_id("glove", "stsb")


def test_augmented_stages_cannot_be_empty_or_name_another_stage():
    for stages in ([], ["general"]):
        with pytest.raises(ConfigError, match="augmented_stages"):
            tinybert(params={"augmented_stages": stages})


def test_gold_term_cannot_be_switched_off_when_it_is_what_trains_the_head():
    with pytest.raises(ConfigError, match="classifier"):
        tinybert(disabled_losses=["prediction", "gold"]).stages(get_task("rte"))


# -- projections, shapes, errors ------------------------------------------------------------
@pytest.mark.parametrize(("recipe", "parameters"), [
    ({}, (STUDENT_LAYERS + 1) * LINEAR),  # W_e and one W_h per student layer
    ({"params": {"shared_projection": True}}, LINEAR),
    ({"disabled_losses": ["embedding"]}, STUDENT_LAYERS * LINEAR),
    ({"disabled_losses": ["hidden"]}, LINEAR),
    ({"params": {"shared_projection": True}, "disabled_losses": ["embedding", "hidden"]}, 0),
])
def test_projection_parameter_counts(recipe, parameters):
    extra = tinybert(**recipe).extra_modules(student_context(get_task("rte")))
    assert sum(parameter.numel() for parameter in extra.parameters()) == parameters
    assert all(isinstance(module, torch.nn.Linear) for module in extra.values())


def test_unequal_head_counts_are_a_clear_error_unless_attention_is_off():
    context = student_context(get_task("rte"), heads=2)
    with pytest.raises(ConfigError, match=r"as many heads as the teacher \(4\), not 2"):
        tinybert().build_student(context)
    student = tinybert(disabled_losses=["attention"]).build_student(context)
    assert student.config.num_attention_heads == 2


@pytest.mark.parametrize(("params", "message"), [
    ({"layer_weights": [1.0, 1.0]}, "needs 4"),
    ({"mapping": [1, 2, 3]}, "has 3 entries"),
    ({"mapping": [2, 5]}, "outside 1..4"),
])
def test_mapping_and_layer_weights_are_checked_before_training(params, message):
    with pytest.raises(ConfigError, match=message):
        tinybert(params=params).build_student(student_context(get_task("rte")))


def test_unknown_parameters_and_terms_are_refused():
    with pytest.raises(ConfigError, match="unknown parameter"):
        tinybert(params={"temprature": 2.0})
    with pytest.raises(ConfigError, match="unknown loss term"):
        tinybert(disabled_losses=["attn"])


# -- training conditions ---------------------------------------------------------------------
def test_bf16_autocast_gives_finite_terms_and_gradients():
    setup = Setup()
    setup.student.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = setup.losses("intermediate")
        total = setup.method.total_loss(values)
    total.backward()
    assert set(values) == {"embedding", "attention", "hidden"}
    assert all(torch.isfinite(value) for value in values.values())
    assert setup.student.bert.encoder.layer[1].attention.self.query.weight.grad.abs().sum() > 0
    assert setup.extra["hidden2"].weight.grad.abs().sum() > 0
    assert setup.student.config._attn_implementation == "sdpa"  # restored after the forward


def test_ddp_wrapped_student_is_seen_unwrapped_and_trained():
    """Under DDP the engine hands the method a view of the student (attributes of the model,
    calls through the wrapper) and the projections as they are (never wrapped)."""
    from torch import distributed
    from torch.nn.parallel import DistributedDataParallel

    from harness.training.engine import method_view

    setup = Setup()
    with tempfile.NamedTemporaryFile() as store:
        distributed.init_process_group("gloo", init_method=f"file://{store.name}", rank=0,
                                       world_size=1)
        try:
            # The intermediate stage leaves the pooler and the classifier unused.
            wrapped = DistributedDataParallel(setup.student.train(),
                                              find_unused_parameters=True)
            inputs = setup.step_inputs("intermediate",
                                       student=method_view(wrapped, setup.student),
                                       extra=setup.extra)
            values = setup.method.compute_losses(inputs)
            setup.method.total_loss(values).backward()
        finally:
            distributed.destroy_process_group()
    assert len(inputs.student.attention_scores) == STUDENT_LAYERS
    assert setup.student.bert.encoder.layer[0].attention.self.key.weight.grad.abs().sum() > 0
    assert setup.extra["embedding"].weight.grad.abs().sum() > 0
