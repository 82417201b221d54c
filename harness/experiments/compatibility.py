"""Which methods can distil which encoder architectures (:mod:`harness.api.architectures`):
the check every run passes when it is resolved, before anything trains, and the
architecture x method table of docs/architectures.md (:func:`matrix_markdown`; a test keeps
the two in sync)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from harness.api.architectures import ARCHITECTURES, Architecture, self_attention_problem
from harness.api.method import SELF_ATTENTION_OUTPUTS, Method, Stage
from harness.config.schema import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def _attention_outputs(stages: Iterable[Stage]) -> list[str]:
    found: set[str] = set()
    for stage in stages:
        found |= (set(stage.teacher_outputs) | set(stage.student_outputs)) \
            & SELF_ATTENTION_OUTPUTS
    return sorted(found)


def method_architecture_problem(method: Method, stages: Iterable[Stage],
                                config: PretrainedConfig, student_kind: str = "bert"
                                ) -> str | None:
    """Why ``method`` with these ``stages`` cannot distil a teacher of ``config``'s
    architecture into a student of ``student_kind`` (``bert``: a Transformer of the
    teacher's architecture); None when it can.  Stages that read inside an attention that
    cannot be captured come first, then the method's own
    :meth:`~harness.api.method.Method.architecture_problem`."""
    arch = ARCHITECTURES.get(config.model_type)
    if arch is None:
        if student_kind == "bert":
            return (f"Transformer students are built for the architectures "
                    f"{', '.join(ARCHITECTURES)}, not {config.model_type!r}")
        arch = Architecture(config.model_type, config.model_type)
    needs = _attention_outputs(stages)
    if needs:
        reason = self_attention_problem(config)
        if reason is not None:
            return f"its stages read {', '.join(needs)} from inside the self-attention, and " \
                   f"{arch.name}: {reason}"
    return method.architecture_problem(config)


def check_method_architecture(method_name: str, method: Method, stages: Iterable[Stage],
                              config: PretrainedConfig, student_kind: str = "bert") -> None:
    """Refuse (ConfigError) a method that cannot work with the teacher's architecture."""
    problem = method_architecture_problem(method, stages, config, student_kind)
    if problem is not None:
        known = ARCHITECTURES.get(config.model_type)
        name = known.name if known is not None else config.model_type
        raise ConfigError(f"methods.{method_name}: {method.name} cannot distil a "
                          f"{name} teacher ({config.model_type}): {problem}")


# -- the documented matrix ---------------------------------------------------------------------
def matrix(configs: dict[str, PretrainedConfig], method_names: Iterable[str]
           ) -> dict[tuple[str, str], str | None]:
    """(architecture, method) -> the refusal reason, None where the method runs, for each
    method's default recipe (every default stage)."""
    from harness.api.registry import instantiate
    from harness.data.tasks import get_task

    task = get_task("rte")
    cells: dict[tuple[str, str], str | None] = {}
    for model_type, config in configs.items():
        for name in method_names:
            method = instantiate(name)
            cells[model_type, name] = method_architecture_problem(
                method, method.stages(task), config, method.student_kinds[0])
    return cells


def default_configs() -> dict[str, PretrainedConfig]:
    """A default config of each supported architecture (what :func:`matrix` reads)."""
    from transformers import AutoConfig

    return {model_type: AutoConfig.for_model(model_type) for model_type in ARCHITECTURES}


def matrix_markdown(method_names: Iterable[str]) -> str:
    """The architecture x method table of docs/architectures.md."""
    names = list(method_names)
    cells = matrix(default_configs(), names)
    lines = ["| architecture | " + " | ".join(f"`{name}`" for name in names) + " |",
             "|---|" + "---|" * len(names)]
    reasons: dict[str, int] = {}
    for model_type, arch in ARCHITECTURES.items():
        row = []
        for name in names:
            reason = cells[model_type, name]
            if reason is None:
                row.append("pass")
            else:
                number = reasons.setdefault(reason, len(reasons) + 1)
                row.append(f"refused ({number})")
        lines.append(f"| {arch.name} (`{model_type}`) | " + " | ".join(row) + " |")
    lines.append("")
    lines.extend(f"({number}) {reason}." for reason, number in reasons.items())
    return "\n".join(lines) + "\n"
