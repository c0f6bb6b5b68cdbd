"""Does the default study hold its targets? Prints each target, the measured number and whether it holds.

Compute targets (metrics/train/<model>.json, params.yaml): one budget C >= 3e13 FLOPs (`study.budget`), and every
neural model's training FLOPs within 1% of it. Speed targets: every train run that made the study's models ran at
>= 100 GFLOP/s (`flops_per_sec` on its MLflow run, found by the model folder's content hash), and its decay branches
(`study.branches`) trained at most 25% more than its run (training seconds on its MLflow run: `branch_train_seconds`
against `seconds`; their wall time with each branch's validation and test passes, `branch_seconds` against
`fit_seconds`, is printed beside).
Quality targets, read as the report reads them (lmpipe.results: metrics/eval.json and the rows of seeds/seeds.csv
that still hold, a model's seed mean where they do, else its one run; metrics/combine.json), over the
compute-matched models only:
- every recurrent family and the transformer below KN-5 in test bits per byte; the best neural model's test word
  perplexity at least 15% below KN-5's; the NPLM's within 10% of KN-5's (or below);
- over 3 seeds: the transformer's mean test bpb below KN-5's by more than twice its sd, and at most 2.00; the best
  single model's mean at most 1.93;
- the best combination at most 1.82 bpb and at least 0.03 below the best single model; NPLM + KN-5 below KN-5.
Time targets: the whole default `dvc repro` within 30 minutes on the 2-core CPU machine, with `lmpipe server`
running (`--run` measures it with benchmarks/overhead.py, a forced repro in a temporary copy; `--wall-seconds N`
checks a figure measured before, e.g. `make study` timed on a fresh clone); `lmpipe seeds` within 60 minutes
(`--seeds-seconds N`). Exit status 1 when a target misses; a target whose numbers are missing is said so.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmpipe import paths, seeds, tuning_doc  # noqa: E402
from lmpipe import stats as seeds_stats  # noqa: E402
from lmpipe.compare import MATCHED, best_model, best_of, not_compute_matched, without_cache  # noqa: E402
from lmpipe.paths import BASELINE  # noqa: E402
from lmpipe.as_compute_grows import against_grid  # noqa: E402
from lmpipe.compute_curves import annealed  # noqa: E402
from lmpipe.config import load_params  # noqa: E402
from lmpipe.results import load_results  # noqa: E402
from lmpipe.scaling_report import EXPONENT_HALF_WIDTH, exponent_known, half_width, isoflop_n_opt  # noqa: E402

RECURRENT_AND_TRANSFORMER, NPLM = ("rnn", "lstm", "gru", "transformer"), "nplm"
BUDGET_SECONDS, SEEDS_BUDGET_SECONDS = 30 * 60, 60 * 60
TRANSFORMER_GOAL, BEST_SINGLE_GOAL, BEST_COMBINATION_GOAL, COMBINATION_GAIN = 2.00, 1.93, 1.82, 0.03
MIN_BUDGET, MIN_FLOPS_PER_SEC = 3e13, 100e9
BRANCH_DIVISORS = (16, 8, 4, 2, 1)
BRANCH_SHARE = 0.25  # the branches' extra training time, at most this share of the study's


def compute_targets(trained: dict, budget: float) -> list[tuple[str, str, bool]]:
    """One budget C for every neural model: C large enough, and each model's training FLOPs within 1% of it."""
    rows = [(f"study.budget C >= {MIN_BUDGET:.0e} FLOPs", f"{budget:.2e}" if budget else "none (null)",
             budget >= MIN_BUDGET)]
    if not budget:
        return rows
    for name, t in sorted(trained.items()):
        flops = t.get("train_flops", 0.0)
        rows.append((f"{name}: training FLOPs within {100 * MATCHED:g}% of C", f"{flops:.3e} ({flops / budget - 1:+.2%})",
                     abs(flops - budget) <= MATCHED * budget))
    return rows


def decay_share(params, name: str) -> float:
    """The FLOPs a model's decay branches train, as a share of its run's: each branch to C/k decays over the model's
    `decay_fraction` of C/k from the run's state at its decay start (0.23 at 0.25 with branches 16, 8, 4, 2; 0.47 at
    the RNN's 0.5); 0 for a model without branches (a run length of its own). At the run's own speed, its branches'
    seconds are this share of the run's."""
    settings = params.model_settings(name)
    budgets = params.branches_of(settings)
    return settings.optim.decay_fraction * sum(budgets) / params.study.flops if budgets else 0.0


def speed_targets(names: list[str], experiment: str, decays_need: dict[str, float]) -> list[tuple[str, str, bool]]:
    """Each study model's training FLOP/s, from the MLflow run that made the model now in models/<name>; with the
    decay branches (`decays_need`: each model's share of its run's FLOPs that its branches' decays train, none
    without branches), their training seconds (`branch_train_seconds`: the decays' steps) against the run's own
    (`seconds`), per model and over the study, each with the wall-time share beside it (`branch_seconds`, every
    branch's validation and test passes in, against `fit_seconds`) and, per model, the share its decays need."""
    from lmpipe import tracking
    from lmpipe.machine import cpu_kind

    rows, spent = [], dict.fromkeys(("seconds", "branch_train_seconds", "fit_seconds", "branch_seconds"), 0.0)
    here = cpu_kind()  # the runs are this machine's, in its store

    def measured(m: dict) -> tuple[float, str]:
        share = m["branch_train_seconds"] / m["seconds"]
        wall = m["branch_seconds"] / m["fit_seconds"]
        return share, (f"{m['branch_train_seconds']:.0f} of {m['seconds']:.0f} s ({share:.0%}); wall time with "
                       f"their evaluations {m['branch_seconds']:.0f} of {m['fit_seconds']:.0f} s ({wall:.0%})")

    for name in names:
        run_id = tracking.run_of_output(experiment, ROOT / "models" / name)
        metrics = tracking.tracker().client.get_run(run_id).data.metrics if run_id else {}
        rate = metrics.get("flops_per_sec")
        rows.append((f"{name}: training >= {MIN_FLOPS_PER_SEC / 1e9:.0f} GFLOP/s (its MLflow run)",
                     "no run found" if rate is None else f"{rate / 1e9:.1f} G on {here}", (rate or 0) >= MIN_FLOPS_PER_SEC))
        if name in decays_need and all(metrics.get(k) for k in spent):
            for k in spent:
                spent[k] += metrics[k]
            share, text = measured(metrics)
            text += f"; its decays alone are {decays_need[name]:.0%} of its FLOPs"
            rows.append((f"{name}: its decay branches train <= {BRANCH_SHARE:.0%} of its training time", text,
                         share <= BRANCH_SHARE))
    if decays_need:
        share, text = measured(spent) if spent["seconds"] else (None, "no branch_train_seconds on the runs")
        rows.append((f"decay branches train <= {BRANCH_SHARE:.0%} of the study's training time", text,
                     share is not None and share <= BRANCH_SHARE))
    return rows


def quality_targets(spreads: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, holds) rows from each model's test numbers as the report and every other table give them
    (lmpipe.results): the mean over its seeds where they hold, else its one run; the measured column says which."""
    kn = spreads[BASELINE]
    rows = []
    for name in RECURRENT_AND_TRANSFORMER:
        if name in spreads:
            s = spreads[name]
            rows.append((f"{name}: test bpb below KN-5's {kn.bpb:.4f}", f"{s.text(4)}: {s.bpb - kn.bpb:+.4f}",
                         s.bpb < kn.bpb))
    best = best_of({n: s.bpb for n, s in spreads.items()}, BASELINE)
    if best is None:  # no compute-matched neural model
        return rows
    change = spreads[best].word_ppl / kn.word_ppl - 1
    rows.append((f"best model ({best}): test word ppl >= 15% below KN-5's {kn.word_ppl:.0f}",
                 f"{spreads[best].word_ppl:.0f} ({100 * change:+.1f}%, {of(spreads[best])})", change <= -0.15))
    if NPLM in spreads:
        ratio = spreads[NPLM].word_ppl / kn.word_ppl
        rows.append((f"nplm: test word ppl within 10% of KN-5's {kn.word_ppl:.0f}",
                     f"{spreads[NPLM].word_ppl:.0f} ({100 * (ratio - 1):+.1f}%, {of(spreads[NPLM])})", ratio <= 1.10))
    return rows


def of(spread) -> str:
    """What a number is: a mean over seeds, or one run."""
    return f"mean of {spread.n} seeds" if spread.n > 1 else "1 seed"


def seed_targets(evaluation: dict, seeds_csv: Path, study_seed: int, trained: dict) -> list[tuple[str, str, bool]]:
    """The targets that need the seed spread: mean ± sd over the seeds that still hold."""
    spreads, stale = seeds.study_spreads(seeds_csv, evaluation, trained, study_seed, BASELINE)
    kn = evaluation["models"][BASELINE]["test"]["bpb"]
    out = []
    if "transformer" in spreads:
        t = spreads["transformer"]
        holds = t.n >= 3 and kn - t.bpb > seeds.REAL_GAP_SDS * t.bpb_sd and t.bpb <= TRANSFORMER_GOAL
        out.append((f"transformer: mean test bpb over 3 seeds below KN-5 by > 2 sd, <= {TRANSFORMER_GOAL:.2f}",
                    t.text(4), holds))
    best = best_of({n: s.bpb for n, s in spreads.items()}, BASELINE)
    out.append((f"best single ({best}): mean test bpb over 3 seeds <= {BEST_SINGLE_GOAL:.2f}", spreads[best].text(4),
                spreads[best].n >= 3 and spreads[best].bpb <= BEST_SINGLE_GOAL))
    if stale:
        out.append(("seed rows that hold this study's runs (lmpipe seeds)",
                    "stale: " + "; ".join(f"{m}: {why}" for m, why in sorted(stale.items())), False))
    return out


def combination_targets(models: dict, combined: dict) -> list[tuple[str, str, bool]]:
    """A combination is one run, so it is set against the best model's own run (metrics/eval.json), as the report
    sets it, not against a seed mean."""
    kn = models[BASELINE]["test"]["bpb"]
    single = best_model(models)
    out = []
    trained = without_cache(combined)
    for which, rows in (("best combination", combined), ("the same, of the trained models alone", trained)):
        if not rows or (rows is trained and len(trained) == len(combined)):
            continue  # no cache row: the first line said it
        best = best_model(rows)
        bpb, gain = rows[best]["test"]["bpb"], models[single]["test"]["bpb"] - rows[best]["test"]["bpb"]
        out.append((f"{which} ({best}): test bpb <= {BEST_COMBINATION_GOAL:.2f}, >= {COMBINATION_GAIN:.2f} below "
                    f"the best single run ({single})", f"{bpb:.4f} (-{gain:.4f})", bpb <= BEST_COMBINATION_GOAL
                    and gain >= COMBINATION_GAIN))
    pair = next((n for n in combined if set(combined[n]["weights"]) == {NPLM, BASELINE}), None)
    if pair:
        out.append((f"{pair}: test bpb below KN-5's {kn:.4f}", f"{combined[pair]['test']['bpb']:.4f}",
                    combined[pair]["test"]["bpb"] < kn))
    return out


def annealed_targets(trained: dict, budget: float, budget_sds: dict,
                     divisors=BRANCH_DIVISORS) -> list[tuple[str, str, bool]]:
    """Every neural model's annealed points (`budgets` of metrics/train/<model>.json): one at each of C/16 .. C, its
    training FLOPs within 1% of that budget, and a seed sd at each (seeds/budgets.csv, `lmpipe seeds`)."""
    rows = []
    wanted = [budget / k for k in divisors]
    for name, t in sorted(trained.items()):
        points = {r["budget_flops"]: r["train_flops"] for r in t.get("budgets", [])}
        off = [b for b in wanted if b not in points or abs(points[b] - b) > MATCHED * b]
        rows.append((f"{name}: annealed points at C/16, C/8, C/4, C/2, C (each within {100 * MATCHED:g}%)",
                     f"{len(wanted) - len(off)} of {len(wanted)}", not off))
        with_sd = [b for b in points if b in budget_sds.get(name, {})]
        rows.append((f"{name}: a seed sd at each annealed point", f"{len(with_sd)} of {len(wanted)}",
                     len(with_sd) >= len(wanted)))
    return rows


def scaling_targets(points: dict, report: str) -> list[tuple[str, str, bool]]:
    """The scaling grid's targets (metrics/scaling.json): every family's IsoFLOP minimum inside its sizes at every
    budget; N_opt's exponent known to within +-0.1 (90%) for at least three families; and the report's comparison
    of the grid with the study's annealed points at the budgets both have."""
    path = ROOT / "metrics/scaling.json"
    if not path.exists():
        return [("the scaling grid (lmpipe scaling)", "no grid", False)]
    scaling = json.loads(path.read_text())
    families = scaling["families"]
    edge = [f"{m} {p['budget']:.1e}" for m, a in sorted(families.items()) for p in a["isoflop"] if not p["bracketed"]]
    lines = {m: isoflop_n_opt(a) for m, a in families.items()}
    half = {m: h for m, line in lines.items() if (h := half_width(line)) is not None}
    narrow = [m for m, line in lines.items() if exponent_known(line)]
    rows = [(f"grid: {len(families)} families, >= 3 budgets up to 1e13 FLOPs",
             f"{len(families)}, {scaling['grid']['min_budget']:.2e}..{scaling['grid']['max_budget']:.2e}",
             len(families) == 5 and len({p["budget"] for a in families.values() for p in a["isoflop"]}) >= 3),
            ("grid: IsoFLOP minimum bracketed at every budget of every family",
             "all" if not edge else f"not at {', '.join(edge)}", not edge),
            (f"grid: N_opt exponent (IsoFLOP minima) known to +-{EXPONENT_HALF_WIDTH:g} (90%), >= 3 families",
             ", ".join(f"{m} +-{h:.3f}" for m, h in sorted(half.items())) or "none", len(narrow) >= 3)]
    compared = against_grid(points, scaling)
    verdict = "no shared budget" if not compared or "not compared" in compared[0] else "compared"
    rows.append(("the report compares the grid with the study at the budgets both have",
                 verdict + ("" if compared and compared[0] in report else ", not in report"),
                 verdict == "compared" and compared[0] in report))
    return rows


def near(a: float, b: float) -> bool:
    """Two budgets the same within the compute-matching tolerance."""
    return abs(a / b - 1) <= MATCHED


def compute_optimal_targets(budget: float, seed_rows: list[dict], report: str) -> list[tuple[str, str, bool]]:
    """The compute-optimal answer up to the study's budget C: the committed grid (metrics/scaling.json) holds every
    family at C/2 and C, each family's best size there with three seeds; the study's model at C is the grid's best
    size there or within noise of it (its seeds' valid bpb against the grid's); every family had the same tuning runs
    (docs/tuning.md's count); the report draws the loss by context position."""
    path = ROOT / "metrics/scaling.json"
    scaling = json.loads(path.read_text()) if path.exists() else {"families": {}, "frontier": {}}
    wanted = (budget / 2, budget)
    reached = {m: [b for b in wanted if any(near(p["budget"], b) for p in a["isoflop"])]
               for m, a in scaling["families"].items()}
    largest = max((p["budget"] for a in scaling["families"].values() for p in a["isoflop"]), default=0.0)
    missing = [f"{m} at C/{budget / b:g}" for m, got in sorted(reached.items()) for b in wanted if b not in got]
    seeded = [(m, p) for m, points in scaling["frontier"].items() for p in points
              if any(near(p["budget"], b) for b in wanted) and p.get("seeds", 1) >= 3]
    rows = [("grid: every family at C/2 and at C (lmpipe scaling)",
             "all" if len(reached) == 5 and not missing else f"largest budget C/{budget / largest:.2f}" if largest
             else "no grid", len(reached) == 5 and not missing),
            ("grid: 3 seeds at each family's best size at C/2 and at C", f"{len(seeded)} of 10", len(seeded) == 10)]
    at_c = {m: p for m, p in seeded if near(p["budget"], budget) and any(r["model"] == m for r in seed_rows)}
    study = {m: seeds_stats.mean_sd(r["valid_bpb"] for r in seed_rows if r["model"] == m) for m in at_c}
    apart = [m for m, p in at_c.items() if seeds_stats.gap_is_real(study[m][0], study[m][1], p["valid_bpb"],
                                                                   p.get("seed_sd")) and study[m][0] > p["valid_bpb"]]
    rows.append(("the study's models at C: the grid's best size, or within noise of it",
                 ("behind the grid's best: " + ", ".join(apart)) if apart else f"{len(at_c)} of 5 compared",
                 len(at_c) == 5 and not apart))
    runs = {m: e["runs"] for m, e in tuning_doc.committed_effort(ROOT).items()}
    rows.append(("tuning: the same runs at C for every family (docs/tuning.md)",
                 ", ".join(f"{m} {n}" for m, n in sorted(runs.items(), key=lambda i: -i[1])),
                 len(set(runs.values())) == 1))
    rows.append(("the report draws the loss by context position", "yes" if "## Loss by context position" in report
                 else "no (python -m flows.position, then dvc repro)", "## Loss by context position" in report))
    return rows


def combined_models() -> dict:
    """metrics/combine.json's combinations ({} before the combine stage ran)."""
    combine = ROOT / "metrics/combine.json"
    return json.loads(combine.read_text())["models"] if combine.exists() else {}


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
    parser.add_argument("--seeds-seconds", type=float, help="the wall time of `lmpipe seeds`, to check against 60 min")
    args = parser.parse_args()
    params, evaluation = load_params(ROOT / "params.yaml"), json.loads((ROOT / "metrics/eval.json").read_text())
    trained = {name: json.loads((ROOT / f"metrics/train/{name}.json").read_text()) for name in params.models}
    budget = params.study.flops or 0.0
    decays_need = {name: share for name in params.models if (share := decay_share(params, name))}
    rows = compute_targets(trained, budget) + speed_targets(list(params.models), params.tracking.experiment, decays_need)
    unmatched = not_compute_matched(trained, budget, params.budget_exceptions())  # shown above, left out of every verdict below
    models = {name: r for name, r in evaluation["models"].items() if name not in unmatched}
    evaluation = {**evaluation, "models": models}
    combined = {name: r for name, r in combined_models().items() if not set(r["weights"]) & set(unmatched)}
    results = load_results(ROOT, list(params.models), params.train.seed)  # as the report reads them
    rows += quality_targets({n: s for n, s in results.spreads.items() if n not in unmatched})
    rows += seed_targets(evaluation, ROOT / paths.SEEDS, params.train.seed, trained)
    budget_sds = results.budget_sds
    rows += annealed_targets({n: t for n, t in trained.items() if n not in unmatched}, budget, budget_sds)
    report = (ROOT / "reports/study.md").read_text(encoding="utf-8")
    rows += scaling_targets(annealed(trained), report)
    rows += compute_optimal_targets(budget, seeds.read_rows(ROOT / paths.SEEDS), report)
    if combined:
        rows += combination_targets(models, combined)
    else:
        rows.append(("combined models (the combine stage)", "not run yet", False))
    wall = measured_wall_seconds() if args.run else args.wall_seconds
    if wall is not None:
        rows.append(("whole default dvc repro within 30 min", f"{wall / 60:.1f} min", wall <= BUDGET_SECONDS))
    if args.seeds_seconds is not None:
        rows.append(("lmpipe seeds within 60 min", f"{args.seeds_seconds / 60:.1f} min",
                     args.seeds_seconds <= SEEDS_BUDGET_SECONDS))
    width = max(len(r[0]) for r in rows)
    for target, measured, holds in rows:
        print(f"{target:<{width}}  {measured:>18}  {'holds' if holds else 'MISSED'}")
    return 0 if all(r[2] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
