"""BERT-family students built from a shape config, optionally initialised from the teacher."""

from __future__ import annotations

import torch
from pydantic import ValidationError
from torch import nn
from transformers import BertConfig, PretrainedConfig

from harness.api.context import StudentContext
from harness.api.pooling import PooledBertForSequenceClassification, with_pooling
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
    """Teacher layers to copy: spread over the depth, always ending with the last layer."""
    if num_student_layers > num_teacher_layers:
        raise ValueError(f"cannot take {num_student_layers} layers from a "
                         f"{num_teacher_layers}-layer teacher")
    step = num_teacher_layers / num_student_layers
    return [round((index + 1) * step) - 1 for index in range(num_student_layers)]


def student_pooling(shape: StudentConfig, teacher_pooling: str) -> str:
    """The student head's pooling: the shape's, or with ``auto`` the teacher's (resolved)."""
    return teacher_pooling if shape.pooling == "auto" else shape.pooling


def resolve_teacher_sizes(shape: StudentConfig, teacher_config: PretrainedConfig,
                          name: str = "(student)") -> StudentConfig:
    """``shape`` (the suite's ``students.<name>``) with its ``teacher`` sizes (hidden,
    heads, intermediate) set to the teacher's; a shape without them comes back as it is."""
    try:
        return shape.with_teacher_sizes(teacher_config)
    except ValidationError as error:
        problems = "; ".join(item["msg"] for item in error.errors())
        raise ConfigError(f"students.{name} with the teacher's sizes "
                          f"({', '.join(shape.teacher_sizes)}): {problems}") from None


def student_bert_config(shape: StudentConfig, teacher_config: PretrainedConfig,
                        task: TaskSpec, pooling: str = "pooler") -> PretrainedConfig:
    shape = resolve_teacher_sizes(shape, teacher_config)
    config = BertConfig(
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


def _principal_projection(matrix: torch.Tensor, dim: int) -> torch.Tensor:
    """(d_teacher, dim) projection on the top principal directions of ``matrix``'s rows."""
    centred = matrix.float() - matrix.float().mean(dim=0, keepdim=True)
    _, _, right = torch.linalg.svd(centred, full_matrices=False)
    return right[:dim].T.contiguous()


def _init_embeddings(student: PooledBertForSequenceClassification, shape: StudentConfig,
                     teacher_state: dict[str, torch.Tensor]) -> None:
    prefix = "bert.embeddings." if "bert.embeddings.word_embeddings.weight" in teacher_state \
        else "embeddings."
    embeddings = student.bert.embeddings
    teacher_word = teacher_state[prefix + "word_embeddings.weight"]
    if shape.embedding_init == "teacher":
        if teacher_word.shape[1] != shape.hidden_size:
            raise ValueError("embedding_init: teacher needs the teacher's hidden size "
                             f"({teacher_word.shape[1]}), got {shape.hidden_size}; "
                             "use teacher_pca")
        projection = torch.eye(shape.hidden_size)
    else:
        projection = _principal_projection(teacher_word, shape.hidden_size)
    with torch.no_grad():
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            source = teacher_state[f"{prefix}{name}.weight"].float()
            getattr(embeddings, name).weight.copy_(source @ projection)
        if shape.embedding_init == "teacher":  # a copy keeps the teacher's normalisation too
            embeddings.LayerNorm.weight.copy_(teacher_state[prefix + "LayerNorm.weight"])
            embeddings.LayerNorm.bias.copy_(teacher_state[prefix + "LayerNorm.bias"])


def _init_layers(student: PooledBertForSequenceClassification, shape: StudentConfig,
                 teacher_state: dict[str, torch.Tensor], num_teacher_layers: int) -> None:
    layers = shape.teacher_layers or evenly_spaced_layers(num_teacher_layers, shape.num_layers)
    prefix = "bert.encoder.layer." if any(k.startswith("bert.encoder.") for k in teacher_state) \
        else "encoder.layer."
    student_state = student.state_dict()
    for student_index, teacher_index in enumerate(layers):
        if not 0 <= teacher_index < num_teacher_layers:
            raise ValueError(f"teacher layer {teacher_index} does not exist "
                             f"(teacher has {num_teacher_layers})")
        source_prefix = f"{prefix}{teacher_index}."
        target_prefix = f"bert.encoder.layer.{student_index}."
        for key, value in teacher_state.items():
            if key.startswith(source_prefix):
                target = target_prefix + key[len(source_prefix):]
                if student_state[target].shape != value.shape:
                    raise ValueError(f"init: teacher_layers needs the teacher's layer shape; "
                                     f"{key} is {tuple(value.shape)}, student "
                                     f"{target} is {tuple(student_state[target].shape)}")
                student_state[target] = value.clone()
    # The pooler (when the head reads it) comes along when the widths agree.
    pooler_prefix = prefix.replace("encoder.layer.", "pooler.")
    for key, value in teacher_state.items():
        target = "bert.pooler." + key[len(pooler_prefix):]
        if key.startswith(pooler_prefix) and target in student_state \
                and student_state[target].shape == value.shape:
            student_state[target] = value.clone()
    student.load_state_dict(student_state)


def build_bert_student(context: StudentContext) -> nn.Module:
    """The suite's student shape as a BERT sequence classifier with the context's pooling,
    initialised as asked."""
    shape = context.shape
    student = PooledBertForSequenceClassification(
        student_bert_config(shape, context.teacher_config, context.task, context.pooling)
    )
    needs_teacher = shape.init == "teacher_layers" or shape.embedding_init != "random"
    if needs_teacher:
        if context.teacher_state is None:
            raise ValueError("this student initialises from the teacher but no teacher "
                             "weights were given")
        if shape.embedding_init != "random":
            _init_embeddings(student, shape, context.teacher_state)
        if shape.init == "teacher_layers":
            _init_layers(student, shape, context.teacher_state,
                         context.teacher_config.num_hidden_layers)
    return student


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total parameters and parameters outside the embedding tables."""
    total = sum(parameter.numel() for parameter in model.parameters())
    embedding = sum(
        module.weight.numel() for module in model.modules() if isinstance(module, nn.Embedding)
    )
    return {"total": total, "non_embedding": total - embedding}
