"""The one module that builds every key (harness.config.identity): the rules for fields
added later, and versioned record migrations as the store applies them.  That the keys it
builds are the committed records' run ids is tests/experiments/test_integration.py's
test_committed_reference_records_keep_their_run_ids."""

from __future__ import annotations

import json

import pytest

from harness.common.cache import content_hash
from harness.config import identity
from harness.config.identity import (
    RECORD_VERSION,
    RecordVersionError,
    migrate_record,
    run_spec,
    teacher_logits_key,
    teacher_model_key,
    train_identity,
)
from harness.config.schema import TrainConfig
from harness.experiments.store import InvalidRecordError, ResultsStore
from tests.records import run_record


def test_training_fields_added_later_stay_out_of_keys_at_their_defaults_only():
    plain = TrainConfig().identity()
    assert not {"epoch_size", "compile", "fused_optimizer"} & set(plain)
    compiled = TrainConfig(compile=True).identity()
    assert compiled == {**plain, "compile": True}
    assert train_identity({"lr": 1e-3, "epoch_size": "task"}) == {"lr": 1e-3,
                                                                   "epoch_size": "task"}


def _run(**changes):
    values = dict(suite="s", task="rte", method="kd", seed=1, selection="best-dev",
                  student={"name": "4L"}, plugin="kd", params={}, method_key={},
                  loss_weights={"soft": 1.0}, stages={"task": {}},
                  teacher={"checkpoint": "t", "key": "k"}, data={"fingerprint": "f"})
    return run_spec(**{**values, **changes})


def test_a_run_spec_leaves_out_what_is_at_its_first_value_and_keeps_the_rest():
    first = _run()
    assert first["record_version"] == RECORD_VERSION
    assert not {"selection", "plugin", "method_key"} & set(first)
    later = _run(selection="last", plugin="kd-plain", method_key={"variant": 2})
    assert (later["selection"], later["plugin"], later["method_key"]) == (
        "last", "kd-plain", {"variant": 2})
    assert content_hash(first) != content_hash(_run(seed=2))


def test_teacher_keys_leave_out_the_default_pooling_selection_and_precision():
    base = dict(checkpoint={"name": "c"}, task="rte", data="f", finetune=True,
                training={"lr": 1.0}, seed=1, max_seq_length=128)
    pooler = teacher_model_key(**base, pooling="pooler", selection="best-dev")
    assert pooler == teacher_model_key(**base, pooling=None, selection="best-dev")
    assert pooler != teacher_model_key(**base, pooling="mean", selection="best-dev")
    assert pooler != teacher_model_key(**base, pooling="pooler", selection="last")
    # an already fine-tuned head: training, seed and selection name nothing of it
    given = {**base, "finetune": False}
    assert teacher_model_key(**given, pooling=None, selection="last") == teacher_model_key(
        **{**given, "training": {"lr": 2.0}, "seed": 7}, pooling=None, selection="best-dev")
    assert teacher_logits_key(pooler, "fp32") == pooler
    assert teacher_logits_key(pooler, "bf16") != pooler


def _document() -> dict:
    return json.loads(json.dumps(run_record().document()))


def test_a_record_of_this_version_loads_unchanged():
    document = _document()
    assert document["config"]["record_version"] == RECORD_VERSION
    assert migrate_record(document) == document


def test_an_older_record_is_migrated_step_by_step_without_touching_its_config(monkeypatch):
    document = _document()
    document["config"]["record_version"] = RECORD_VERSION - 1
    document["wall_time"] = document.pop("wall_seconds")  # as an older schema named it

    def rename_wall_time(old: dict) -> dict:
        old["wall_seconds"] = old.pop("wall_time")
        return old

    monkeypatch.setitem(identity.MIGRATIONS, RECORD_VERSION - 1, rename_wall_time)
    migrated = migrate_record(document)
    assert "wall_time" not in migrated and migrated["wall_seconds"] == _document()[
        "wall_seconds"]
    assert migrated["config"] == document["config"]


def test_a_migration_that_changes_the_config_is_refused(monkeypatch):
    document = _document()
    document["config"]["record_version"] = RECORD_VERSION - 1

    def rewrites_config(old: dict) -> dict:
        return {**old, "config": {**old["config"], "seed": 99}}

    monkeypatch.setitem(identity.MIGRATIONS, RECORD_VERSION - 1, rewrites_config)
    with pytest.raises(RecordVersionError, match="changed the record's config"):
        migrate_record(document)


def test_the_store_refuses_a_newer_or_unmigratable_record_naming_its_file(tmp_path):
    store = ResultsStore(tmp_path)
    for version, said in [(RECORD_VERSION + 1, "is newer than this harness reads"),
                          (RECORD_VERSION - 1, "has no migration"),
                          ("1", "no config.record_version")]:
        document = _document()
        document["config"]["record_version"] = version
        path = tmp_path / "s" / "kd" / "rte" / f"run-{version}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document))
        with pytest.raises(InvalidRecordError) as refused:
            store.load(path)
        assert str(refused.value).startswith(f"{path}: not a valid run record: ")
        assert said in str(refused.value)
