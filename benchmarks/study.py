"""Does the default study hold its targets? Prints each target, the measured number and whether it holds.

Quality targets (issue "The study must earn its conclusions"), read from metrics/eval.json of the last run:
every recurrent family and the transformer below KN-5 in test bits per byte; the best neural model's test
word perplexity at least 15% below KN-5's; the NPLM's within 10% of KN-5's (or below).
Time target: the whole default `dvc repro` within 30 minutes on the 2-core CPU machine, with `lmpipe server`
running. `--run` measures it with benchmarks/overhead.py (a forced repro in a temporary copy, ~30 min);
`--wall-seconds N` checks a figure measured before. Exit status 1 when a target misses.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE, RECURRENT_AND_TRANSFORMER, NPLM = "ngram", ("rnn", "lstm", "gru", "transformer"), "nplm"
BUDGET_SECONDS = 30 * 60


def quality_targets(models: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, holds) rows from metrics/eval.json's models."""
    kn = models[BASELINE]["test"]
    rows = []
    for name in RECURRENT_AND_TRANSFORMER:
        if name in models:
            bpb = models[name]["test"]["bpb"]
            rows.append((f"{name}: test bpb below KN-5's {kn['bpb']:.4f}", f"{bpb:.4f} ({bpb - kn['bpb']:+.4f})",
                         bpb < kn["bpb"]))
    neural = {n: r for n, r in models.items() if n != BASELINE}
    best = min(neural, key=lambda n: neural[n]["test"]["word_ppl"])
    ratio = neural[best]["test"]["word_ppl"] / kn["word_ppl"]
    rows.append((f"best neural ({best}): test word ppl >= 15% below KN-5's {kn['word_ppl']:.0f}",
                 f"{neural[best]['test']['word_ppl']:.0f} ({100 * (ratio - 1):+.1f}%)", ratio <= 0.85))
    if NPLM in models:
        ratio = models[NPLM]["test"]["word_ppl"] / kn["word_ppl"]
        rows.append((f"nplm: test word ppl within 10% of KN-5's {kn['word_ppl']:.0f}",
                     f"{models[NPLM]['test']['word_ppl']:.0f} ({100 * (ratio - 1):+.1f}%)", ratio <= 1.10))
    return rows


def measured_wall_seconds() -> float:
    """The default study's forced `dvc repro`, timed by benchmarks/overhead.py in a temporary copy."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/overhead.py")], capture_output=True, text=True,
                          check=True)
    print(done.stdout, end="")
    return float(re.search(r"dvc repro --force: ([\d.]+) s wall", done.stdout).group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="time a whole forced dvc repro (about 30 minutes)")
    parser.add_argument("--wall-seconds", type=float, help="a wall time measured before, to check against 30 min")
    args = parser.parse_args()
    models = json.loads((ROOT / "metrics/eval.json").read_text())["models"]
    rows = quality_targets(models)
    wall = measured_wall_seconds() if args.run else args.wall_seconds
    if wall is not None:
        rows.append(("whole default dvc repro within 30 min", f"{wall / 60:.1f} min", wall <= BUDGET_SECONDS))
    width = max(len(r[0]) for r in rows)
    for target, measured, holds in rows:
        print(f"{target:<{width}}  {measured:>18}  {'holds' if holds else 'MISSED'}")
    return 0 if all(r[2] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
