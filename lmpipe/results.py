"""The study's committed results, read in one place for whoever shows them (the report, the README's table)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lmpipe import paths
from lmpipe import seeds as seed_spread
from lmpipe.compare import not_compute_matched
from lmpipe.paths import BASELINE
from lmpipe.compute_curves import annealed


def read_json(path: Path):
    """A metrics file's content, or None where the stage that writes it has not run."""
    return json.loads(path.read_text()) if path.exists() else None


def made_on(machine: str, precision: str) -> str:
    """Where a number was made, as every table says it: 'AMD family 26, AVX512-BF16 (bf16)'; empty where the machine is
    not recorded."""
    machine = "" if machine == "unrecorded" else machine
    return f"{machine} ({precision})" if machine and precision else machine


def machines_text(pairs, unrecorded: str = "") -> str:
    """Several (machine, precision) pairs, each as `made_on` says it, the unrecorded left out (`unrecorded` where none
    is recorded)."""
    return "; ".join(filter(None, (made_on(m, p) for m, p in pairs))) or unrecorded


def machines_of(summaries) -> list[tuple[str, str]]:
    """The (machine, precision) pairs that training summaries (metrics/train/<model>.json) record, each once."""
    return sorted({(t.get("machine") or "unrecorded", t.get("precision", "")) for t in summaries})


def si(x: float) -> str:
    """A FLOP count as '3.00e13'."""
    return f"{x:.2e}".replace("e+", "e")


@dataclass(frozen=True)
class Results:
    evaluation: dict | None  # metrics/eval.json
    combined: dict | None  # metrics/combine.json
    trained: dict[str, dict]  # metrics/train/<model>.json, of the models asked for
    unmatched: list[str]  # models whose training FLOPs are off the study's budget (or stated exceptions)
    spreads: dict  # model -> its seed spread (lmpipe.seeds), where an evaluation exists
    stale: dict[str, str]  # model -> why its seed rows do not hold (another identity, or a run beyond noise)
    budget_sds: dict  # model -> {budget: seed sd of its annealed test bpb}, where seeds/budgets.csv gives one
    scaling: dict | None  # metrics/scaling.json: the scaling grid's best runs, and whether it is current
    provenance: dict  # model -> where its seed rows and this run were made, and this run against its row
    weat_effects: dict  # model -> {test: its WEAT effect size over the seeds (lmpipe.seeds.Effect)}


def load_results(root: str | Path, models: Sequence[str] | None = None, study_seed: int | None = None,
                 budget_flops: float | None = None, budget_exceptions: Sequence[str] = ()) -> Results:
    """What the metrics under `root` say of `models` (every model with files when None): their evaluation and
    combinations, their training, which are not compute-matched, and their seed spread with the study's own run
    (`study_seed`) among the seeds."""
    root = Path(root)
    evaluation, combined = read_json(root / paths.EVAL), read_json(root / paths.COMBINE)
    trained = {p.stem: read_json(p) for p in sorted((root / paths.TRAIN_METRICS).glob("*.json"))}
    if models is not None:
        trained = {name: t for name, t in trained.items() if name in models}
    unmatched = not_compute_matched(trained, budget_flops, budget_exceptions)
    spreads, stale, budget_sds, provenance, weat_effects = {}, {}, {}, {}, {}
    if evaluation:
        spreads, stale = seed_spread.study_spreads(root / paths.SEEDS, evaluation, trained, study_seed, BASELINE,
                                                   list(models) if models is not None else None)
        held = [n for n, s in spreads.items() if s.n > 1]
        budget_sds = seed_spread.budget_sds(seed_spread.read_rows(root / paths.SEED_BUDGETS), annealed(trained),
                                            study_seed, held)
        provenance = seed_spread.provenance(seed_spread.read_rows(root / paths.SEEDS), evaluation, study_seed,
                                            trained, held)
        weat_effects = seed_spread.weat_spreads(seed_spread.read_rows(root / paths.SEED_WEAT), held)
    return Results(evaluation, combined, trained, unmatched, spreads, stale, budget_sds,
                   read_json(root / paths.SCALING_METRICS), provenance, weat_effects)
