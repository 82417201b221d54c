"""What changes a key: every key the harness computes, built in one place.

A key is a :func:`~harness.common.cache.content_hash` (SHA-256 of canonical JSON) of a
*spec*: a mapping of everything that makes the thing it names what it is.  This module owns
each spec's fields, the versions that enter them, and the rules for fields added after
records and cache entries existed: such a field is left out of its spec while at its
default, so what was made without it keeps its key, and any other value makes a new one.

Keys built here:

- a run's id (:func:`run_spec`; the planner fills in the values),
- a fine-tuned teacher's cache entry and its logits at another precision
  (:func:`teacher_model_key`, :func:`teacher_logits_key`),
- a general checkpoint (:func:`general_spec`) and its cache entry with the code that
  distils it (:func:`general_cache_key`),
- one cached teacher array (:func:`intermediates_key`),
- a fitted masked-LM head (:func:`mlm_head_key`),
- word vectors as a run id holds them (:func:`vectors_in_run_id`).

It also owns the record's version and its migrations (:func:`migrate_record`).  The table
of what each key hashes is docs/architecture.md, "What changes a run id"."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from harness.common.cache import CACHE_VERSION, content_hash

RECORD_VERSION = 1
"""The version of the run record's schema; part of every run id."""

GENERAL_VERSION = 1
"""The version of general checkpoints' key."""

INTERMEDIATES_KIND = "teacher_intermediates"
INTERMEDIATES_VERSION = 1
MLM_HEAD_KIND = "mlm_head"

LATER_TRAIN_FIELDS: dict[str, Any] = {"epoch_size": "data", "compile": False,
                                      "fused_optimizer": False}
"""Training settings added after record version 1, with their defaults: they stay out of a
stage's identity while at them (:func:`train_identity`)."""


LATER_STUDENT_FIELDS: dict[str, Any] = {"architecture": "teacher"}
"""Student shape fields added after record version 1, with their defaults: they stay out of
a shape's identity (its ``model_dump``, which run ids and general keys hash) while at them
(:func:`student_identity`)."""


def student_identity(values: Mapping[str, Any]) -> dict[str, Any]:
    """A student shape's fields as keys hold them: every field, less those of
    :data:`LATER_STUDENT_FIELDS` while at their defaults."""
    return {name: value for name, value in values.items()
            if not (name in LATER_STUDENT_FIELDS and value == LATER_STUDENT_FIELDS[name])}


def train_identity(values: Mapping[str, Any]) -> dict[str, Any]:
    """A stage's training settings as keys hold them: every field, less those of
    :data:`LATER_TRAIN_FIELDS` while at their defaults."""
    return {name: value for name, value in values.items()
            if not (name in LATER_TRAIN_FIELDS and value == LATER_TRAIN_FIELDS[name])}


def selection_entry(selection: str) -> dict[str, str]:
    """Checkpoint selection in a run id or teacher key: ``best-dev``, the protocol of the
    first records, is the key without it; ``last`` enters it."""
    return {"selection": selection} if selection != "best-dev" else {}


def run_spec(*, suite: str, task: str, method: str, seed: int, selection: str,
             student: dict[str, Any], plugin: str, params: dict[str, Any],
             method_key: dict[str, Any], loss_weights: dict[str, float],
             stages: dict[str, dict[str, Any]], teacher: dict[str, Any],
             data: dict[str, Any]) -> dict[str, Any]:
    """A run's configuration without its general checkpoint and corpus (the planner adds
    those: ``general``, ``init_from``, ``corpus``, ``intermediate_cache``).  ``student``:
    the shape's name and fields (or a plugin kind's ``run_identity()``) and its pooling;
    ``plugin`` enters only when it is not the method's name, ``method_key`` only when not
    empty; ``stages``: each stage's :func:`train_identity`; ``teacher``: its checkpoint's
    name and :func:`teacher_model_key` (or logits key); ``data``: source, fingerprint,
    ``max_train_examples``, ``subsample_seed``, ``max_seq_length``."""
    return {
        "record_version": RECORD_VERSION,
        "suite": suite,
        "task": task,
        "method": method,
        "seed": seed,
        **selection_entry(selection),
        "student": student,
        **({"plugin": plugin} if plugin != method else {}),
        "params": params,
        **({"method_key": method_key} if method_key else {}),
        "loss_weights": loss_weights,
        "stages": stages,
        "teacher": teacher,
        "data": data,
    }


def teacher_model_key(*, checkpoint: dict[str, Any], task: str, data: str, finetune: bool,
                      training: dict[str, Any], seed: int, max_seq_length: int,
                      pooling: str | None, selection: str) -> str:
    """A fine-tuned teacher's cache entry (and, at fp32 logits, the key run ids name).
    Training settings and seed enter only when the harness fine-tunes it; BERT's
    ``pooler`` (or no pooling: an already fine-tuned head) and ``best-dev`` selection stay
    out."""
    return content_hash({
        "kind": "teacher",
        "cache_version": CACHE_VERSION,
        "checkpoint": checkpoint,
        "task": task,
        "data": data,
        "finetune": finetune,
        "training": training if finetune else None,
        "seed": seed if finetune else None,
        "max_seq_length": max_seq_length,
        **({"pooling": pooling} if pooling not in (None, "pooler") else {}),
        **(selection_entry(selection) if finetune else {}),
    })


def teacher_logits_key(model_key: str, inference_precision: str) -> str:
    """The teacher key at an inference precision: fp32 logits keep the model's key; another
    precision keys an entry of its own that holds only the logits."""
    if inference_precision == "fp32":
        return model_key
    return content_hash({"kind": "teacher_logits", "cache_version": CACHE_VERSION,
                         "model": model_key, "inference_precision": inference_precision})


def general_spec(*, method: str, method_key: dict[str, Any], student: dict[str, Any],
                 teacher: dict[str, Any], corpus: dict[str, Any],
                 stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A general checkpoint's configuration: the distilling method and its
    ``general_key()``, the student's shape and pooling, the teacher checkpoint's identity,
    the corpus (fingerprint, ``max_seq_length``, ``long_lines``, seed, and ``pairs`` when
    on) and each general stage's :func:`train_identity`."""
    return {"kind": "general", "version": GENERAL_VERSION, "method": method,
            "method_key": method_key, "student": student, "teacher": teacher,
            "corpus": corpus, "stages": stages}


def general_cache_key(general_key: str, plugin_digest: str, core_digest: str) -> str:
    """A general checkpoint's cache entry: its key with the code that distils it, so that
    other code distils a checkpoint of its own."""
    return content_hash({"general": general_key,
                         "code": {"plugin": plugin_digest, "core": core_digest}})


def intermediates_key(*, teacher_key: str, rows: str, precision: str, output: str,
                      layer: int) -> str:
    """One cached teacher array: one output (``hidden`` or ``scores``) of one layer on one
    set of rows (a digest of their token ids), in float16."""
    return content_hash({"kind": INTERMEDIATES_KIND, "version": INTERMEDIATES_VERSION,
                         "teacher": teacher_key, "rows": rows, "precision": precision,
                         "output": output, "layer": layer, "dtype": "float16"})


def mlm_head_key(*, checkpoint: dict[str, Any], source: str, corpus: str,
                 config: dict[str, Any]) -> str:
    """A masked-LM head fitted on a checkpoint: its identity, where the head comes from,
    the corpus sentences' fingerprint and the head's settings."""
    return content_hash({"kind": MLM_HEAD_KIND, "cache_version": CACHE_VERSION,
                         "checkpoint": checkpoint, "source": source, "corpus": corpus,
                         "config": config})


def vectors_in_run_id(identity: dict[str, Any], shipped: dict[str, Any]) -> dict[str, Any]:
    """Word vectors as a run id holds them: nothing for the ``shipped`` release (the ids
    of runs that read it hold no vectors field), the identity of any other."""
    return {} if identity == shipped else identity


Migration = Callable[[dict[str, Any]], dict[str, Any]]

MIGRATIONS: dict[int, Migration] = {}
"""Record version -> the function that rewrites a record document of that version into
the next version's schema.  A migration may add, rename or reshape the record's own fields
but never its ``config``: the run id is the hash of the configuration as it was run."""


class RecordVersionError(ValueError):
    """A record this checkout cannot read: from a newer harness, or without a migration."""


def record_version(document: Mapping[str, Any]) -> int:
    """The schema version a record document was written in (its configuration's
    ``record_version``)."""
    config = document.get("config")
    version = config.get("record_version") if isinstance(config, Mapping) else None
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordVersionError("no config.record_version (an integer)")
    return version


def migrate_record(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` in the current schema: each :data:`MIGRATIONS` step from its version
    up to :data:`RECORD_VERSION` applied in turn.  A record of a newer version, or of an
    older one without a migration, is refused; so is a migration that changed
    ``config``."""
    version = record_version(document)
    if version > RECORD_VERSION:
        raise RecordVersionError(f"record version {version} is newer than this harness "
                                 f"reads ({RECORD_VERSION}); update the harness")
    config = document["config"]
    while version < RECORD_VERSION:
        if version not in MIGRATIONS:
            raise RecordVersionError(f"record version {version} has no migration to "
                                     f"{version + 1}")
        document = MIGRATIONS[version](dict(document))
        if document.get("config") != config:
            raise RecordVersionError(f"the migration from record version {version} "
                                     "changed the record's config (its run id's content)")
        version += 1
    return document
