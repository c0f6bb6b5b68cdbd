"""How much of a default model's result is its seed? Retrain `models.<model>` of params.yaml with other seeds.

Trains the model exactly as its train@<model> stage does (same settings, same data, same budget) but with
train.seed + 1, + 2, ..., scores valid and test like the evaluate stage, and prints one line per seed plus the
spread, next to the KN-5 baseline of metrics/eval.json. One thread per process: run several side by side.

    python benchmarks/seed_spread.py --model gru --seeds 1236 1237
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmpipe.config import load_params  # noqa: E402
from lmpipe.evaluate import evaluate_lm  # noqa: E402
from lmpipe.splits import load_tokens  # noqa: E402
from lmpipe.train import Trainer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    args = parser.parse_args()
    params, data = load_params(ROOT / "params.yaml"), load_tokens(ROOT / "data/tokens")
    baseline = json.loads((ROOT / "metrics/eval.json").read_text())["models"]["ngram"]
    for seed in args.seeds:
        common = params.train.model_copy(update={"seed": seed})
        with tempfile.TemporaryDirectory() as ckpt:
            result = Trainer(args.model, params.models[args.model], common, data, ckpt, progress_bar=False).run()
        scores = evaluate_lm(result.model.eval(), data, params.evaluate.chunk)
        print(json.dumps({"model": args.model, "seed": seed, "valid_bpb": scores["valid"]["bpb"],
                          "test_bpb": scores["test"]["bpb"], "test_word_ppl": scores["test"]["word_ppl"],
                          "kn5_test_bpb": baseline["test"]["bpb"], "kn5_test_word_ppl": baseline["test"]["word_ppl"],
                          "seconds": result.metrics["seconds"]}), flush=True)


if __name__ == "__main__":
    main()
