"""The method API: everything a method plugin imports (``from harness.api import ...``).

A plugin declares its parameters, loss terms, stages, student and search space against
these names; the engine, the teacher stage, the runner and the reports do the rest. The
import contracts in ``pyproject.toml`` keep ``methods/`` on this side of the core (plus the
shared assets of :mod:`harness.assets`).
"""

from harness.api.architectures import ARCHITECTURES, Dimensions, dimensions
from harness.api.capture import capture_attention_scores, token_pair_mask
from harness.api.context import (
    AugmentContext,
    Augmenter,
    ExportedStudent,
    StudentContext,
    StudentEncoder,
    StudentKindConfig,
)
from harness.api.layer_mapping import layer_map, layer_weights
from harness.api.losses import (
    attention_score_loss,
    embedding_loss,
    gold_loss,
    hidden_loss,
    soft_cross_entropy,
    soft_kl,
    soft_target_loss,
    teacher_regression_loss,
)
from harness.api.method import (
    GOLD,
    STUDENT_OUTPUTS,
    TEACHER_OUTPUTS,
    LossTerm,
    Method,
    MethodParams,
    Stage,
    StepInputs,
    StudentOutputs,
    TeacherLayers,
    TeacherView,
)
from harness.api.registry import register_method
from harness.api.students import (
    build_bert_student,
    build_encoder_student,
    evenly_spaced_layers,
    teacher_fit_problem,
)
from harness.common.cache import ArtifactCache, content_hash
from harness.common.progress import progress_bar
from harness.config.schema import ConfigError, StudentConfig
from harness.data.tasks import TaskSpec

__all__ = [
    "ARCHITECTURES",
    "GOLD",
    "STUDENT_OUTPUTS",
    "TEACHER_OUTPUTS",
    "ArtifactCache",
    "AugmentContext",
    "Augmenter",
    "ConfigError",
    "Dimensions",
    "ExportedStudent",
    "LossTerm",
    "Method",
    "MethodParams",
    "Stage",
    "StepInputs",
    "StudentConfig",
    "StudentContext",
    "StudentEncoder",
    "StudentKindConfig",
    "StudentOutputs",
    "TaskSpec",
    "TeacherLayers",
    "TeacherView",
    "attention_score_loss",
    "build_bert_student",
    "build_encoder_student",
    "capture_attention_scores",
    "content_hash",
    "dimensions",
    "embedding_loss",
    "evenly_spaced_layers",
    "gold_loss",
    "hidden_loss",
    "layer_map",
    "layer_weights",
    "progress_bar",
    "register_method",
    "soft_cross_entropy",
    "soft_kl",
    "soft_target_loss",
    "teacher_fit_problem",
    "teacher_regression_loss",
    "token_pair_mask",
]
