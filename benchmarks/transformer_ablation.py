"""The transformer from the GPT-2 recipe to today's, one change at a time, at one FLOP budget.

Each row adds one modern part to the row it builds on (lmpipe/models/transformer.py, lmpipe/optim.py) and trains
`models.transformer` of params.yaml with `python -m lmpipe.train --score` (the Trainer, data and evaluation of the
study, outside DVC and MLflow), two rows side by side on one thread each. Rows already in the CSV are kept, so a
run that stops resumes. Prints the table sweeps/notes.md holds.

    python benchmarks/transformer_ablation.py --budget 2e13 --out benchmarks/results/transformer_ablation_2e13.csv \
        --only "rotary + Muon" "rotary + Muon + ReLU^2 MLP"
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmpipe.paths import CACHE_DIR  # noqa: E402

# The 2019 recipe, stated whole so that the rows mean the same whatever params.yaml's transformer is today
GPT2 = ["arch.position=learned", "arch.norm=layernorm", "arch.qk_norm=false", "arch.mlp=gelu", "arch.tie=true",
        "arch.zero_init=false", "arch.softcap=0.0", "optim.name=adamw"]
# (row name, the row it builds on, the settings it adds; a later value of a setting replaces an earlier one). The
# chain of the first rows adds every part in turn; the study-budget rows build on the best row found before them.
STEPS = [
    ("GPT-2 recipe (2019)", None, GPT2),
    ("+ rotary positions", "GPT-2 recipe (2019)", ["arch.position=rope"]),
    ("+ RMSNorm and QK-norm", "+ rotary positions", ["arch.norm=rmsnorm", "arch.qk_norm=true"]),
    ("+ ReLU^2 MLP", "+ RMSNorm and QK-norm", ["arch.mlp=relu2"]),
    ("+ untied zero-init head", "+ ReLU^2 MLP", ["arch.tie=false", "arch.zero_init=true"]),
    ("+ logit soft-cap 15", "+ untied zero-init head", ["arch.softcap=15.0"]),
    ("+ Muon", "+ logit soft-cap 15", ["optim.name=muon"]),
    ("+ the tied head again (no zero-init)", "+ Muon", ["arch.tie=true", "arch.zero_init=false"]),
    ("- Muon (AdamW again)", "+ the tied head again (no zero-init)", ["optim.name=adamw"]),
    ("rotary + Muon", "+ rotary positions", ["optim.name=muon"]),
    ("rotary + Muon + ReLU^2 MLP", "rotary + Muon", ["arch.mlp=relu2"]),
]
COLUMNS = ("row", "settings", "valid_bpb", "test_bpb", "test_word_ppl", "train_seconds")


def rows(budget: float) -> list[tuple[str, list[str]]]:
    """Each row's whole recipe (the CSV's settings column): its base row's settings, then its own."""
    recipes = {}
    for name, base, adds in STEPS:
        recipes[name] = (recipes[base] if base else [f"budget={{flops: {budget:g}}}"]) + adds
    return list(recipes.items())


def probe(settings: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "lmpipe.train", "--model", "transformer", "--threads", "1", "--score",
                           "--checkpoints", str(ROOT / CACHE_DIR / "ablation"),
                           *(arg for setting in settings for arg in ("-S", setting))],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"probe failed: {settings}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=5e12, help="training FLOPs of every row")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/transformer_ablation.csv"))
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--only", nargs="*", metavar="ROW", help="run these rows alone (default: every row)")
    args = parser.parse_args()
    out = Path(args.out)
    done = {r["row"]: r for r in csv.DictReader(out.open())} if out.exists() else {}
    todo = [(name, settings) for name, settings in rows(args.budget)
            if name not in done and (not args.only or name in args.only)]

    def run(item):
        name, settings = item
        result = probe(settings)
        return {"row": name, "settings": " ".join(settings), **{k: result[k] for k in COLUMNS[2:]}}

    with ThreadPoolExecutor(args.parallel) as pool:
        for row in pool.map(run, todo):
            done[row["row"]] = row
            order = [name for name, _ in rows(args.budget)]
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("w", newline="") as f:
                writer = csv.DictWriter(f, COLUMNS)
                writer.writeheader()
                writer.writerows(done[name] for name in order if name in done)
            print(json.dumps(row), flush=True)
    print("| row | valid bpb | test bpb | train s |\n|---|---|---|---|")
    for name, _ in rows(args.budget):
        if name in done:
            r = done[name]
            print(f"| {name} | {float(r['valid_bpb']):.4f} | {float(r['test_bpb']):.4f} | {float(r['train_seconds']):.0f} |")


if __name__ == "__main__":
    main()
