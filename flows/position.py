"""Loss by context position for every model of the study and KN-5 (lmpipe/position.py): writes plots/position.csv.

    python -m flows.position [--window N] [--seeds DIR] [--out CSV] [--device DEVICE]

Reads params.yaml (the models), data/tokens (the test split) and models/<name>/ for the n-gram and each model of
params.yaml; every one must be there (a missing one stops the command in one line naming it, before any scoring).
The window is the longest of --window, every model's seq_len and the transformer's block, so that the transformer's
whole block is on the curve. With --seeds, DIR/<model>-seed<k>/model.pt are more seeds of <model>: its row per
position is then the mean over its seeds with their sd (the band); without, one run and no sd.

Not a stage of the study (it would add an evaluation pass per model to every `dvc repro`): run by hand once the
models exist, like `lmpipe seeds` (docs/operations.md). Each row names what made its model: the training's identity
and the machine and precision it trained in; the report shows the curves of the study's models as they are, and names the
models whose curve is of another training (stale: run it again).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from lmpipe import paths

POSITION_CURVES = paths.POSITION_CURVES
COLUMNS = ("model", "position", "nats", "sd", "seeds", "identity", "trained_on")  # what made the model scored (its
# metrics/train/<model>.json): the report shows a curve only while it is of the study's model, and says where it ran
PARAMS_FILE = "params.yaml"


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m flows.position", description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=0,
                        help="tokens per window, at least (default: the longest seq_len or transformer block)")
    parser.add_argument("--seeds", metavar="DIR", help="folders <model>-seed<k>/ of more seeds of the models")
    parser.add_argument("--out", default=POSITION_CURVES, help=f"the CSV to write (default {POSITION_CURVES})")
    parser.add_argument("--device", default=None, help="where the neural models run (default: params' train.device)")
    parser.add_argument("--chunk", type=int, default=None, help="tokens per step (default: params' evaluate.chunk)")
    return parser.parse_args(argv)


def seed_dirs(root: str | None, name: str) -> list[Path]:
    """The folders of `name`'s other seeds under `root` (<name>-seed<k>), in seed order."""
    if not root:
        return []
    pattern = re.compile(rf"{re.escape(name)}-seed(\d+)")
    found = [(int(m.group(1)), p) for p in Path(root).iterdir() if (m := pattern.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def curve_rows(name: str, curves: list, identity: str = "", trained_on: str = "") -> list[dict]:
    """One row per position: the mean over the seeds' curves and their sd (empty with one seed), with what made the
    model: its training's identity and the machine and precision it trained in."""
    from lmpipe.position import seed_bands

    mean, sd = seed_bands(curves)
    return [{"model": name, "position": p, "nats": round(float(m), 6), "sd": None if s != s else round(float(s), 6),
             "seeds": len(curves), "identity": identity, "trained_on": trained_on}
            for p, (m, s) in enumerate(zip(mean, sd))]


def trained_from(name: str) -> tuple[str, str]:
    """What made models/<name>, as its metrics/train summary records it: the training's identity, and the machine
    and precision it trained in; for the n-gram, which has no summary and rounds alike everywhere, its results in
    metrics/eval.json and no machine."""
    import json

    if name == paths.BASELINE:
        from lmpipe.context_use import baseline_identity

        evaluation = Path(paths.EVAL)
        return baseline_identity(json.loads(evaluation.read_text()) if evaluation.exists() else None), ""
    summary = Path(paths.train_metrics(name))
    if not summary.exists():
        return "", ""
    made = json.loads(summary.read_text())
    return made.get("identity", ""), ", ".join(made[k] for k in ("machine", "precision") if made.get(k))


def position_curves(args: argparse.Namespace) -> list[dict]:
    from lmpipe.config import load_params
    from lmpipe.trained import load_lm
    from lmpipe.position import loss_by_position
    from lmpipe.splits import load_tokens
    from lmpipe.train import pick_device

    params = load_params(PARAMS_FILE)
    names = [paths.BASELINE, *params.models]
    # every model loads before any is scored: a missing one fails at once, not after an hour of the others
    models = {name: [load_lm(d, "cpu") for d in [Path(paths.model_dir(name)), *seed_dirs(args.seeds, name)]]
              for name in names}
    test = load_tokens(paths.TOKENS).splits["test"].tokens
    window = max([args.window, *(params.models[n].seq_len for n in params.models),
                  *(m.block_size for runs in models.values() for m in runs if hasattr(m, "block_size"))])
    device = pick_device(args.device or params.train.device)
    chunk = args.chunk or params.evaluate.chunk
    rows = []
    for name, runs in models.items():
        curves = [loss_by_position(m if not hasattr(m, "to") else m.to(device), test, window, device, chunk)
                  for m in runs]
        rows += curve_rows(name, curves, *trained_from(name))
        print(f"{name}: {len(runs)} seed(s), {len(test) // window} windows of {window}: position 0 "
              f"{rows[-window]['nats']:.3f} nats, position {window - 1} {rows[-1]['nats']:.3f}", flush=True)
    return rows


def curves_text(rows: list[dict]) -> str:
    """Curve rows as plots/position.csv holds them (its columns, Unix line ends): this command's and a restamp's."""
    from lmpipe.io import csv_text

    return csv_text(rows, COLUMNS, newline="\n")


def main(argv: list[str] | None = None) -> None:
    from lmpipe.errors import LmpipeError
    from lmpipe.io import write_text

    args = arguments(argv)
    try:
        rows = position_curves(args)
        write_text(args.out, curves_text(rows))
    except (LmpipeError, FileNotFoundError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
