"""One training run of `models.<model>` with changed settings, outside DVC and MLflow: a probe before a sweep.

Trains like the train@<model> stage (same Trainer, data and budget rules) with dotted overrides of the model's
settings, prints a JSON line per evaluation and a final line with valid and test bpb scored like the evaluate
stage. One thread by default, so two probes run side by side on 2 cores. The probes in sweeps/notes.md ran so:

    python benchmarks/probe.py --model gru --set batch_size=16 'budget={tokens: 1510000}'
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmpipe.config import load_params  # noqa: E402
from lmpipe.evaluate import evaluate_lm  # noqa: E402
from lmpipe.splits import load_tokens  # noqa: E402
from lmpipe.sweep import apply  # noqa: E402
from lmpipe.train import Trainer  # noqa: E402

CURVE = ("epoch", "step", "tokens", "valid_bpb", "train_loss", "lr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an entry of params.yaml's `models`")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="dotted settings of the model, YAML values (budget={tokens: N} replaces epochs)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    params, data = load_params(ROOT / "params.yaml"), load_tokens(ROOT / "data/tokens")
    overrides = {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.set)}
    budget = overrides.pop("budget", None)
    settings = apply(params.models[args.model], overrides, budget)
    if budget is None and "epochs" in overrides:  # epochs asked for: they replace a budget of the defaults
        settings = settings.model_copy(update={"budget": None})
    common = params.train.model_copy(update={"threads": args.threads})
    started = time.perf_counter()

    def on_eval(record):
        print(json.dumps({k: record[k] for k in CURVE} | {"wall_seconds": round(time.perf_counter() - started)}),
              flush=True)

    with tempfile.TemporaryDirectory() as ckpt:
        result = Trainer(args.model, settings, common, data, ckpt, on_eval=on_eval, progress_bar=False).run()
    scores = evaluate_lm(result.model.eval(), data, params.evaluate.chunk)
    print(json.dumps({"model": args.model, "set": args.set, "valid_bpb": scores["valid"]["bpb"],
                      "test_bpb": scores["test"]["bpb"], "test_word_ppl": scores["test"]["word_ppl"],
                      "train_seconds": result.metrics["seconds"]}), flush=True)


if __name__ == "__main__":
    main()
