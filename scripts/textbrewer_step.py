"""TextBrewer's side of `python -m benchmarks train`: the TinyBERT intermediate step in TextBrewer.

Runs inside the TextBrewer environment (`make bench-env` builds .venv-textbrewer: torch
2.13.0, textbrewer, the main environment's transformers), never in the main one.  The
harness writes a setup file (`torch.save`): the teacher's and the student's configs and
starting weights, the projections' starting weights, the layer mapping, the loss weights
and the optimiser settings.  This script builds TextBrewer's ``GeneralDistiller`` from it:

* ``intermediate_matches``: ``hidden_mse`` of the embedding output (layer 0 -> 0) and of
  each mapped Transformer layer (m -> g(m)), each with its own learnable ``linear``
  projection d' -> d (TextBrewer's ``proj``; the harness's starting weights copied in),
  and ``attention_mse`` of each mapped layer's attention map; every match gets its
  lambda times its term weight; ``inputs_mask`` is the attention mask, so both losses
  average over real tokens / real token pairs, as the harness's do;
* the attention maps the adaptors hand over are the unnormalised scores (QK^T/sqrt(d_k)
  plus the additive mask), captured by the harness's attention function
  (:mod:`harness.api.capture`, imported from the checkout: it depends on torch and
  transformers only), so both sides run the same model arithmetic;
* AdamW over the student (decay / no-decay groups as the harness makes them; TextBrewer
  adds one group per projection), transformers' linear warm-up/decay schedule, TextBrewer's
  gradient clipping (``max_grad_norm``), ``train(num_steps=...)``.

Timing: TextBrewer's ``train()`` pulls batches from the iterable it is given, one per step
(``for step, batch in tqdm(enumerate(cycle(dataloader)))``).  The iterable here yields
batches that the harness collated and saved, and stamps the clock when it hands a batch
over and when TextBrewer asks for the next one: each interval is exactly one TextBrewer
step (teacher forward under no_grad, student forward, adaptors, losses, loss logging,
backward, clipping, optimiser, scheduler, zero_grad, its progress bar).  TextBrewer's
checkpoint save (at ``ckpt_steps`` and at the last step) is never reached: the run stops
when the iterable raises after the last timed step.

Modes:

* ``serve --setup S``: for `benchmarks train`'s interleaved rounds.  Prints one JSON
  line ``{"ready": ...}`` on stdout, then for every JSON line ``{"batches": PATH}`` on
  stdin runs one step per batch in PATH (a list of dicts of tensors) and answers
  ``{"times": [seconds...], "losses": {...}}``; ``{"stop": true}`` ends it.
* ``run --setup S --batches B [--warmup W] [--steps N]``: W untimed then N timed steps,
  cycling over B's batches; prints one JSON line with the per-step times and the first
  step's losses.

Everything else (warnings, progress bars) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


class Stop(Exception):
    """Raised by the batch feeder to end TextBrewer's training loop."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["serve", "run"])
    parser.add_argument("--setup", required=True, help="setup file written by the harness")
    parser.add_argument("--batches", help="run mode: file with a list of batches")
    parser.add_argument("--warmup", type=int, default=1, help="run mode: untimed steps")
    parser.add_argument("--steps", type=int, default=5, help="run mode: timed steps")
    return parser.parse_args(argv)


def build(setup: dict):
    """Teacher, student, distiller and optimiser from the harness's setup file."""
    import torch
    import transformers
    from textbrewer import DistillationConfig, GeneralDistiller, TrainingConfig

    sys.path.insert(0, str(REPO_ROOT))
    from harness.api.capture import capture_attention_scores

    device = torch.device(setup["device"])

    def model(config_json: str, state: dict) -> torch.nn.Module:
        values = json.loads(config_json)
        config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
        built = transformers.AutoModelForSequenceClassification.from_config(config)
        built.load_state_dict(state)
        return built.to(device)

    teacher = model(setup["teacher_config"], setup["teacher_state"]).eval()
    student = model(setup["student_config"], setup["student_state"]).train()
    stack = ExitStack()
    teacher_capture = stack.enter_context(capture_attention_scores(teacher))
    student_capture = stack.enter_context(capture_attention_scores(student))

    def adaptor(capture):
        def adapt(batch, outputs):
            return {"hidden": outputs.hidden_states, "attention": capture.scores,
                    "inputs_mask": batch["attention_mask"]}
        return adapt

    lambdas, weights, mapping = setup["lambdas"], setup["weights"], setup["mapping"]
    d_student = student.config.hidden_size
    d_teacher = teacher.config.hidden_size
    matches, projected = [], []
    terms = {}  # TextBrewer's name of each match's loss -> (harness term, lambda)

    def name(feature: str, loss: str, layer_s: int, layer_t: int) -> str:
        return f"unweighted_{feature}_{loss}_{layer_s}_{layer_t}"

    if weights.get("embedding", 0.0):
        terms[name("hidden", "hidden_mse", 0, 0)] = ("embedding", lambdas[0])
        matches.append({"layer_T": 0, "layer_S": 0, "feature": "hidden", "loss": "hidden_mse",
                        "weight": lambdas[0] * weights["embedding"],
                        "proj": ["linear", d_student, d_teacher, {}]})
        projected.append(0)
    if weights.get("hidden", 0.0):
        for m, g in enumerate(mapping, start=1):
            terms[name("hidden", "hidden_mse", m, g)] = ("hidden", lambdas[m])
            matches.append({"layer_T": g, "layer_S": m, "feature": "hidden",
                            "loss": "hidden_mse", "weight": lambdas[m] * weights["hidden"],
                            "proj": ["linear", d_student, d_teacher, {}]})
            projected.append(m)
    if weights.get("attention", 0.0):
        for m, g in enumerate(mapping, start=1):
            terms[name("attention", "attention_mse", m - 1, g - 1)] = ("attention", lambdas[m])
            matches.append({"layer_T": g - 1, "layer_S": m - 1, "feature": "attention",
                            "loss": "attention_mse",
                            "weight": lambdas[m] * weights["attention"]})
    optim = setup["optim"]
    train_config = TrainingConfig(
        device=device, output_dir=setup["output_dir"], log_dir=None,
        ckpt_steps=optim["total_steps"] + 1)
    distill_config = DistillationConfig(intermediate_matches=matches, kd_loss_weight=0.0)
    distiller = GeneralDistiller(train_config, distill_config, model_T=teacher,
                                 model_S=student, adaptor_T=adaptor(teacher_capture),
                                 adaptor_S=adaptor(student_capture))
    projections = [proj for proj in distiller.projs if proj is not None]
    for proj, layer in zip(projections, projected, strict=True):
        proj.load_state_dict(setup["projections"][layer])
    decay, no_decay = [], []
    for name, parameter in student.named_parameters():
        if parameter.ndim < 2 or "LayerNorm" in name or name.endswith(".bias"):
            no_decay.append(parameter)
        else:
            decay.append(parameter)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": optim["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=optim["lr"], weight_decay=optim["weight_decay"])
    return distiller, optimizer, stack, device, terms


class Feeder:
    """The iterable handed to ``distiller.train``: yields the given batches one step each
    and times every step from the hand-over to the next request."""

    def __init__(self, commands, report, device, seed: int) -> None:
        self.commands = commands  # iterator of lists of batches
        self.report = report
        self.device = device
        self.seed = seed
        self.losses: dict | None = None
        self.first_losses: dict | None = None

    def clock(self) -> float:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def __iter__(self):
        import torch

        first = True
        for batches in self.commands:
            times = []
            for batch in batches:
                if first:  # the dropout masks of the other sides' first step
                    torch.manual_seed(self.seed)
                    first = False
                started = self.clock()
                yield batch
                times.append(self.clock() - started)
            self.report({"times": times, "losses": self.first_losses})
        raise Stop


def record_losses(distiller, feeder: Feeder, terms: dict) -> None:
    """Keep the first step's loss values (TextBrewer already logs them every step), summed
    per harness term: lambda times each match's unweighted loss."""
    original = distiller.write_loss

    def write_loss(total_loss, writer_step, losses_dict=None):
        original(total_loss, writer_step, losses_dict)
        if feeder.first_losses is None:
            values: dict[str, float] = {}
            for key, value in (losses_dict or {}).items():
                term, weight = terms[key]
                values[term] = values.get(term, 0.0) + weight * float(value)
            ordered = ("embedding", "attention", "hidden")
            feeder.first_losses = {term: values[term] for term in ordered if term in values}
            feeder.first_losses["total"] = float(total_loss)

    distiller.write_loss = write_loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The protocol owns the real stdout; anything printed by libraries goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    import textbrewer
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    setup = torch.load(args.setup, weights_only=True)
    torch.manual_seed(setup.get("seed", 0))
    distiller, optimizer, stack, device, terms = build(setup)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "textbrewer": textbrewer.__version__, "threads": torch.get_num_threads()}

    def send(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    def load(path: str) -> list:
        return torch.load(path, weights_only=True)

    if args.mode == "serve":
        def commands():
            for line in sys.stdin:
                message = json.loads(line)
                if message.get("stop"):
                    return
                yield load(message["batches"])
        send({"ready": True, **versions})
        report = send
    else:
        if not args.batches:
            raise SystemExit("run mode needs --batches")
        if args.warmup < 0 or args.steps < 1:
            raise SystemExit("--warmup must be >= 0 and --steps >= 1")
        pool = load(args.batches)
        cycled = [pool[i % len(pool)] for i in range(args.warmup + args.steps)]
        plan = ([cycled[:args.warmup]] if args.warmup else []) + [cycled[args.warmup:]]
        results: list[dict] = []

        def commands():
            yield from plan

        report = results.append
    feeder = Feeder(commands(), report, device, setup.get("seed", 0))
    record_losses(distiller, feeder, terms)
    optim = setup["optim"]
    from transformers import get_linear_schedule_with_warmup

    try:
        with stack, distiller:
            distiller.train(optimizer, feeder, num_steps=optim["total_steps"],
                            scheduler_class=get_linear_schedule_with_warmup,
                            scheduler_args={"num_warmup_steps": optim["warmup_steps"],
                                            "num_training_steps": optim["total_steps"]},
                            max_grad_norm=optim["max_grad_norm"],
                            output_hidden_states=True)  # passed to both models' forward
    except Stop:
        pass
    if args.mode == "run":
        times = results[-1]["times"]
        send({**versions, "times": times, "median_ms": 1e3 * statistics.median(times),
              "losses": feeder.first_losses})
    return 0


if __name__ == "__main__":
    sys.exit(main())
