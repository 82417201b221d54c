"""What a run's TensorBoard event files hold, read back with TensorBoard's own reader: every
scalar tag with its number of points and its first and last step, and the run id among the
run's hyper-parameters.

    python scripts/tensorboard_tags.py runs/glue-cpu/kd/rte/<student>-seed1-<run id>
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2


def load(folder: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep all
    accumulator.Reload()
    return accumulator


def hparams(run_dir: Path) -> dict[str, object]:
    """``add_hparams`` writes them to a folder of its own inside the run's."""
    found: dict[str, object] = {}
    for events in sorted(run_dir.glob("*/events.out.tfevents.*")):
        content = load(events.parent).PluginTagToContent("hparams").get(
            "_hparams_/session_start_info")
        if content is not None:
            info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
            found.update({key: value.string_value if value.HasField("string_value")
                          else value.number_value for key, value in info.hparams.items()})
    return found


RUN_DIR = ("a run's folder under --log-dir, by default runs/ beside the results store: "
           "<suite>/<method>/<task>/<student>-seed<N>-<run id>")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    summary, _, usage = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(description=summary, epilog=f"example:\n{usage}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help=RUN_DIR)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    run_dir = parse_args(argv).run_dir
    if not run_dir.is_dir():
        sys.exit(f"{run_dir}: no such folder ({RUN_DIR})")
    scalars = load(run_dir)
    tags = sorted(scalars.Tags()["scalars"])
    if not tags:
        sys.exit(f"{run_dir}: no scalars (not a run folder of `--log-with tensorboard`?)")
    print(f"{'tag':<40} {'points':>6} {'first':>7} {'last':>7}")
    for tag in tags:
        steps = [event.step for event in scalars.Scalars(tag)]
        print(f"{tag:<40} {len(steps):>6} {steps[0]:>7} {steps[-1]:>7}")
    params = hparams(run_dir)
    print(f"\n{len(params)} hyper-parameters; run_id {params.get('run_id')}")


if __name__ == "__main__":
    main()
