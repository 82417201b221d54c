"""Transformer students of the teacher's architecture, built from a shape config, optionally
initialised from the teacher."""

from __future__ import annotations

import math

import torch
from pydantic import ValidationError
from torch import nn
from transformers import AutoModelForSequenceClassification, BertConfig, PretrainedConfig

from harness.api.architectures import Dimensions, architecture, dimensions
from harness.api.capture import transformer_layers
from harness.api.context import StudentContext
from harness.api.pooling import sequence_classifier_class, with_pooling
from harness.config.schema import ConfigError, StudentConfig
from harness.data.tasks import TaskSpec


def classifier_config(base: PretrainedConfig, task: TaskSpec, **changes) -> PretrainedConfig:
    """A copy of ``base`` set up for ``task``'s labels, in the task's label order."""
    config = base.__class__.from_dict({**base.to_dict(), **changes})
    config.num_labels = task.num_labels
    if task.is_regression:
        config.problem_type = "regression"
        config.id2label = {0: "score"}
        config.label2id = {"score": 0}
    else:
        config.problem_type = "single_label_classification"
        config.id2label = dict(enumerate(task.label_names))
        config.label2id = {name: index for index, name in enumerate(task.label_names)}
    return config


def evenly_spaced_layers(num_teacher_layers: int, num_student_layers: int) -> list[int]:
    """Teacher layers to copy: spread over the depth, always ending with the last layer
    (each position rounded half up, as the repository's other layer rules: 6 -> 4 gives
    1, 2, 4, 5; Python's round would give 1, 2, 3, 5)."""
    if num_student_layers > num_teacher_layers:
        raise ValueError(f"cannot take {num_student_layers} layers from a "
                         f"{num_teacher_layers}-layer teacher")
    step = num_teacher_layers / num_student_layers
    return [math.floor((index + 1) * step + 0.5) - 1 for index in range(num_student_layers)]


def student_pooling(shape: StudentConfig, teacher_pooling: str) -> str:
    """The student head's pooling: the shape's, or with ``auto`` the teacher's (resolved)."""
    return teacher_pooling if shape.pooling == "auto" else shape.pooling


def resolve_teacher_sizes(shape: StudentConfig, teacher_config: PretrainedConfig,
                          name: str = "(student)") -> StudentConfig:
    """``shape`` (the suite's ``students.<name>``) with its ``teacher`` sizes (hidden,
    heads, intermediate) set to the teacher's; a shape without them comes back as it is."""
    sizes = dimensions(teacher_config)
    try:
        return shape.with_teacher_sizes({"hidden_size": sizes.hidden, "num_heads": sizes.heads,
                                         "intermediate_size": sizes.intermediate})
    except ValidationError as error:
        problems = "; ".join(item["msg"] for item in error.errors())
        raise ConfigError(f"students.{name} with the teacher's sizes "
                          f"({', '.join(shape.teacher_sizes)}): {problems}") from None


# What a BERT student computes with as its teacher does (a copied layer must run as it ran
# in the teacher): the teacher's value, else BERT's default.
BERT_COMPUTATION = ("hidden_act", "layer_norm_eps", "hidden_dropout_prob",
                    "attention_probs_dropout_prob", "position_embedding_type")


def student_bert_config(shape: StudentConfig, teacher_config: PretrainedConfig,
                        task: TaskSpec, pooling: str = "pooler") -> PretrainedConfig:
    shape = resolve_teacher_sizes(shape, teacher_config)
    computation = {name: getattr(teacher_config, name) for name in BERT_COMPUTATION
                   if getattr(teacher_config, name, None) is not None}
    config = BertConfig(
        **computation,
        vocab_size=teacher_config.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=teacher_config.max_position_embeddings,
        type_vocab_size=getattr(teacher_config, "type_vocab_size", 2),
        pad_token_id=getattr(teacher_config, "pad_token_id", 0),
    )
    return with_pooling(classifier_config(config, task), pooling)


def student_config(shape: StudentConfig, teacher_config: PretrainedConfig, task: TaskSpec,
                   pooling: str = "pooler") -> PretrainedConfig:
    """The student's config: the teacher's architecture with the shape's depth, width, heads
    and feed-forward size (under that config class's own field names), for ``task``'s
    labels and with the head's ``pooling``.  A BERT student (of a BERT teacher, or any
    teacher's with ``architecture: bert``) is a fresh ``BertConfig`` with the teacher's
    vocabulary, activation, layer-norm epsilon, dropouts and position embeddings
    (:func:`student_bert_config`); another architecture keeps the rest of the teacher's
    config (activation, dropout, position scheme, DeBERTa-v2's relative attention, MPNet's
    relative-position buckets...)."""
    if teacher_config.model_type == "bert" or shape.architecture == "bert":
        return student_bert_config(shape, teacher_config, task, pooling)
    shape = resolve_teacher_sizes(shape, teacher_config)
    arch = architecture(teacher_config)
    teacher = teacher_config.to_dict()
    changes = {arch.layers: shape.num_layers, arch.hidden: shape.hidden_size,
               arch.heads: shape.num_heads, arch.intermediate: shape.intermediate_size,
               "architectures": None}
    # ELECTRA / DeBERTa-v2 may embed narrower than they compute: a separate embedding width
    # is kept (its projection is the student's own), an equal one follows the student.
    if teacher.get("embedding_size") == dimensions(teacher_config).hidden:
        changes["embedding_size"] = shape.hidden_size
    if "pooler_hidden_size" in teacher:  # DeBERTa-v2's ContextPooler reads the last layer
        changes["pooler_hidden_size"] = shape.hidden_size
    return with_pooling(classifier_config(teacher_config, task, **changes), pooling)


def _principal_projection(matrix: torch.Tensor, dim: int) -> torch.Tensor:
    """(d_teacher, dim) projection on the top principal directions of ``matrix``'s rows."""
    centred = matrix.float() - matrix.float().mean(dim=0, keepdim=True)
    _, _, right = torch.linalg.svd(centred, full_matrices=False)
    return right[:dim].T.contiguous()


def _even_indices(teacher_size: int, student_size: int) -> torch.Tensor:
    """``student_size`` indices spread evenly over ``range(teacher_size)``."""
    return torch.arange(student_size) * teacher_size // student_size


class WeightSelection:
    """Which of the teacher's indices a narrower student keeps along each kind of axis:
    uniform weight selection (Xu et al. 2024, "Initializing Models with Larger Ones").

    The same hidden indices serve the residual stream, the embeddings and every projection
    in and out of the attention, so a selected layer reads what the selected layer before
    it wrote. They are chosen head by head (evenly spaced heads, then evenly spaced
    dimensions inside each), so each student head is a slice of one teacher head and its
    query-key products are partial sums of that head's. Axes are told apart by the
    teacher's size: hidden or feed-forward (an axis the student keeps whole is copied)."""

    def __init__(self, teacher: Dimensions, shape: StudentConfig) -> None:
        head_size = teacher.hidden // teacher.heads
        student_head_size = shape.hidden_size // shape.num_heads
        if shape.num_heads > teacher.heads or student_head_size > head_size \
                or shape.intermediate_size > teacher.intermediate:
            raise ValueError(
                f"init: teacher_select needs a student no wider than the teacher in heads, "
                f"head size and feed-forward size; teacher {teacher.heads} x {head_size}, "
                f"{teacher.intermediate}; student {shape.num_heads} x {student_head_size}, "
                f"{shape.intermediate_size}")
        if teacher.hidden == teacher.intermediate:
            raise ValueError("init: teacher_select tells hidden from feed-forward axes by "
                             f"size; this teacher has {teacher.hidden} for both")
        heads = _even_indices(teacher.heads, shape.num_heads)
        within = _even_indices(head_size, student_head_size)
        self.indices = {
            teacher.hidden: (heads[:, None] * head_size + within[None, :]).reshape(-1),
            teacher.intermediate: _even_indices(teacher.intermediate, shape.intermediate_size),
        }
        # A per-head axis (MPNet's relative attention bias: bucket x head) keeps the heads.
        self.indices.setdefault(teacher.heads, heads)

    def __call__(self, name: str, value: torch.Tensor, target: torch.Size) -> torch.Tensor:
        """``value`` (the teacher's ``name``) cut down to the student's ``target`` shape."""
        if value.dim() != len(target):
            raise ValueError(f"init: teacher_select: {name} is {tuple(value.shape)}, the "
                             f"student's is {tuple(target)}")
        for axis, (size, wanted) in enumerate(zip(value.shape, target, strict=True)):
            if size == wanted:
                continue
            indices = self.indices.get(size)
            if indices is None or len(indices) != wanted:
                raise ValueError(f"init: teacher_select cannot cut {name}'s axis {axis} "
                                 f"from {size} to {wanted}")
            value = value.index_select(axis, indices)
        return value.clone()


def teacher_fit_problem(shape: StudentConfig, teacher: Dimensions) -> str | None:
    """Why ``shape`` (its ``teacher`` sizes resolved) cannot start from this teacher as its
    ``init`` and ``embedding_init`` say (layers it does not have, copies of another width);
    None: it can, or it starts from random weights.  Needs the teacher's config only, so a
    run is refused before the teacher is fine-tuned."""
    if shape.architecture == "bert" and teacher.model_type != "bert" \
            and (shape.init, shape.embedding_init) != ("random", "random"):
        return (f"architecture: bert builds a BERT student, which cannot start from the "
                f"weights of a {teacher.model_type} teacher (other modules, other position "
                "scheme); set init and embedding_init to random, or build the student of "
                "the teacher's architecture (architecture: teacher)")
    if shape.init != "random":
        if shape.teacher_layers is not None:
            missing = [index for index in shape.teacher_layers
                       if not 0 <= index < teacher.layers]
            if missing:
                return (f"teacher_layers {missing} do not exist in a {teacher.layers}-layer "
                        f"teacher (layers 0..{teacher.layers - 1})")
        elif shape.num_layers > teacher.layers:
            return (f"a {shape.num_layers}-layer student cannot take {shape.num_layers} "
                    f"layers of a {teacher.layers}-layer teacher")
    sizes = {"hidden_size": (shape.hidden_size, teacher.hidden),
             "num_heads": (shape.num_heads, teacher.heads),
             "intermediate_size": (shape.intermediate_size, teacher.intermediate)}
    if shape.init == "teacher_layers":
        wrong = [f"{name} {ours} (the teacher's: {theirs})"
                 for name, (ours, theirs) in sizes.items() if ours != theirs]
        if wrong:
            return ("init: teacher_layers copies teacher layers whole, so the student needs "
                    f"the teacher's sizes: {', '.join(wrong)}; use init: teacher_select for "
                    "a narrower student, or the size 'teacher'")
    if "teacher_select" in (shape.init, shape.embedding_init):
        try:
            WeightSelection(teacher, shape)
        except ValueError as error:
            return str(error)
    if teacher.embedding is not None:  # the student keeps the teacher's embedding width
        return None
    if shape.embedding_init == "teacher" and shape.hidden_size != teacher.hidden:
        return (f"embedding_init: teacher copies the teacher's embeddings, so hidden_size "
                f"must be the teacher's ({teacher.hidden}), not {shape.hidden_size}; use "
                "teacher_pca or teacher_select")
    if shape.embedding_init == "teacher_pca" and shape.hidden_size > teacher.hidden:
        return (f"embedding_init: teacher_pca projects the teacher's {teacher.hidden}-wide "
                f"embeddings on their top directions, so it cannot give {shape.hidden_size}")
    return None


def _exact_copy(name: str, value: torch.Tensor, target: torch.Size) -> torch.Tensor:
    if value.shape != target:
        raise ValueError(f"init: teacher_layers needs the teacher's layer shape; {name} is "
                         f"{tuple(value.shape)}, the student's is {tuple(target)}")
    return value.clone()


def _teacher_prefix(student: nn.Module, teacher_state: dict[str, torch.Tensor], path: str
                    ) -> str:
    """How ``teacher_state`` names the base model's ``path``: with the architecture's
    ``base_model_prefix`` (a task model's state) or without (a bare encoder's)."""
    prefixed = f"{student.base_model_prefix}."
    return prefixed if any(key.startswith(prefixed + path) for key in teacher_state) else ""


def _init_embeddings(student: nn.Module, shape: StudentConfig,
                     teacher_state: dict[str, torch.Tensor],
                     selection: WeightSelection | None) -> None:
    """The embedding tables from the teacher's: copied (``teacher``), projected on the
    principal directions of its word embeddings (``teacher_pca``) or sub-selected
    (``teacher_select``, with ``selection``); with ``teacher`` and ``teacher_select`` the
    embeddings' other weights (LayerNorm, a projection) come along too."""
    prefix = _teacher_prefix(student, teacher_state, "embeddings.") + "embeddings."
    embeddings = student.base_model.embeddings
    if shape.embedding_init == "teacher_select":
        assert selection is not None
        with torch.no_grad():
            for name, parameter in embeddings.named_parameters():
                source = teacher_state.get(prefix + name)
                if source is not None:
                    parameter.copy_(selection(prefix + name, source, parameter.shape))
        return
    teacher_word = teacher_state[prefix + "word_embeddings.weight"]
    width = embeddings.word_embeddings.weight.shape[1]
    if shape.embedding_init == "teacher":
        if teacher_word.shape[1] != width:
            raise ValueError("embedding_init: teacher needs the teacher's hidden size "
                             f"({teacher_word.shape[1]}), got {shape.hidden_size}; "
                             "use teacher_pca or teacher_select")
        projection = torch.eye(width)
    else:
        projection = _principal_projection(teacher_word, width)
    tables = [name for name in ("word_embeddings", "position_embeddings",
                                "token_type_embeddings")
              if isinstance(getattr(embeddings, name, None), nn.Embedding)
              and f"{prefix}{name}.weight" in teacher_state]
    with torch.no_grad():
        for name in tables:
            source = teacher_state[f"{prefix}{name}.weight"].float()
            getattr(embeddings, name).weight.copy_(source @ projection)
        if shape.embedding_init == "teacher":  # a copy keeps the teacher's normalisation too
            copied = {f"{name}.weight" for name in tables}
            for name, parameter in embeddings.named_parameters():
                source = teacher_state.get(prefix + name)
                if name not in copied and source is not None \
                        and source.shape == parameter.shape:
                    parameter.copy_(source)


def _init_layers(student: nn.Module, shape: StudentConfig,
                 teacher_state: dict[str, torch.Tensor], num_teacher_layers: int,
                 selection: WeightSelection | None) -> None:
    """The chosen teacher layers into the student's, found through the architecture's
    layer list (``encoder.layer``, DistilBERT's ``transformer.layer``...): copied, or cut
    down by ``selection``. The base model's weights outside the embeddings and the layers
    (BERT's pooler, DeBERTa-v2's relative position embeddings) come along where the shapes
    agree, or where ``selection`` can cut them."""
    fit = selection or _exact_copy
    layers = shape.teacher_layers or evenly_spaced_layers(num_teacher_layers, shape.num_layers)
    base = student.base_model
    names = {id(module): name for name, module in base.named_modules()}
    layer_list = names[id(transformer_layers(base)[0])].rsplit(".", 1)[0]
    source_root = _teacher_prefix(student, teacher_state, layer_list + ".")
    target_root = f"{student.base_model_prefix}."
    student_state = student.state_dict()
    for student_index, teacher_index in enumerate(layers):
        if not 0 <= teacher_index < num_teacher_layers:
            raise ValueError(f"teacher layer {teacher_index} does not exist "
                             f"(teacher has {num_teacher_layers})")
        source_prefix = f"{source_root}{layer_list}.{teacher_index}."
        target_prefix = f"{target_root}{layer_list}.{student_index}."
        for key, value in teacher_state.items():
            if key.startswith(source_prefix):
                target = target_prefix + key[len(source_prefix):]
                student_state[target] = fit(key, value, student_state[target].shape)
    # The pooler (when the head reads it) comes along.
    for key, value in teacher_state.items():
        if not key.startswith(source_root):
            continue
        rest = key[len(source_root):]
        if rest.startswith(("embeddings.", f"{layer_list}.")):
            continue
        target = target_root + rest
        if target not in student_state:
            continue
        if student_state[target].shape == value.shape:
            student_state[target] = value.clone()
        elif selection is not None:
            student_state[target] = selection(key, value, student_state[target].shape)
    student.load_state_dict(student_state)


def new_sequence_classifier(config: PretrainedConfig) -> nn.Module:
    """A randomly initialised sequence classifier with the head ``config``'s pooling names."""
    model_class = sequence_classifier_class(config)
    if model_class is AutoModelForSequenceClassification:
        return model_class.from_config(config)
    return model_class(config)


def build_encoder_student(context: StudentContext) -> nn.Module:
    """The suite's student shape as a sequence classifier of the teacher's architecture
    (:mod:`harness.api.architectures`) with the context's pooling, initialised as asked."""
    shape = context.shape
    student = new_sequence_classifier(
        student_config(shape, context.teacher_config, context.task, context.pooling))
    if shape.init == "random" and shape.embedding_init == "random":
        return student
    if context.teacher_state is None:
        raise ValueError("this student initialises from the teacher but no teacher "
                         "weights were given")
    teacher = dimensions(context.teacher_config)
    sized = resolve_teacher_sizes(shape, context.teacher_config)
    if problem := teacher_fit_problem(sized, teacher):
        raise ValueError(problem)
    selects = "teacher_select" in (shape.init, shape.embedding_init)
    selection = WeightSelection(teacher, sized) if selects else None
    if shape.embedding_init != "random":
        _init_embeddings(student, shape, context.teacher_state, selection)
    if shape.init != "random":
        _init_layers(student, shape, context.teacher_state, teacher.layers,
                     selection if shape.init == "teacher_select" else None)
    return student


build_bert_student = build_encoder_student
"""The name :func:`build_encoder_student` had when students were BERT only."""


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total parameters and parameters outside the embedding tables."""
    total = sum(parameter.numel() for parameter in model.parameters())
    embedding = sum(
        module.weight.numel() for module in model.modules() if isinstance(module, nn.Embedding)
    )
    return {"total": total, "non_embedding": total - embedding}
