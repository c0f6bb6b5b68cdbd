"""The seed spread of each model and the verdicts it supports: mean and sd over seeds, and which gaps are real.

seeds/seeds.csv (written by `lmpipe seeds`) holds one row per (model, seed), the study's own run among them. A
model's rows count only while that own run is still the study's: the row of `train.seed` must carry the numbers
metrics/eval.json holds now, trained at the same precision. A model retrained since (new settings, new data, new
code that changed its numbers) has a stale spread, which is said and not shown.

Two results differ only where their gap exceeds twice the larger of their sds (REAL_GAP_SDS); the n-gram baseline
is deterministic (sd 0). With one seed there is no spread, so no gap between two models is called real.

With the study's decay branches (`study.branches`), seeds/budgets.csv holds every seed's annealed result at each
budget (one row per model, seed and budget), so each point of the report's "As compute grows" has its own sd.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from lmpipe.compare import best_of
from lmpipe.io import csv_records, csv_text


def add_arguments(parser) -> None:
    """The flags of `lmpipe seeds` (and of `python -m flows.seeds`, which it runs)."""
    parser.add_argument("--models", nargs="+", metavar="MODEL",
                        help="retrain only these models' seeds; the other models keep their rows of seeds/seeds.csv")

COLUMNS = ("model", "seed", "valid_bpb", "test_bpb", "test_word_ppl", "precision")
BUDGET_COLUMNS = ("model", "seed", "budget_flops", "train_flops", "valid_bpb", "test_bpb")
REAL_GAP_SDS = 2.0
MATCH = 1e-9  # the study's row must carry eval.json's numbers: written from them, so equal but for the CSV's digits


@dataclass(frozen=True)
class Spread:
    """A model's test results over its seeds (n = 1: the study's run alone, sd unknown)."""
    n: int
    bpb: float  # mean test bits per byte
    bpb_sd: float | None
    word_ppl: float
    word_ppl_sd: float | None

    def gap_is_real(self, other: "Spread") -> bool | None:
        """Is |self - other| in mean test bpb more than twice the larger sd? None where a spread is unknown."""
        if self.bpb_sd is None or other.bpb_sd is None:
            return None
        return abs(self.bpb - other.bpb) > REAL_GAP_SDS * max(self.bpb_sd, other.bpb_sd)

    def text(self, digits: int = 3) -> str:
        if self.bpb_sd is None:
            return f"{self.bpb:.{digits}f} (1 seed)"
        return f"{self.bpb:.{digits}f} ± {self.bpb_sd:.{digits}f} ({self.n} seeds)"


def csv_rows(rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> str:
    """seeds/seeds.csv (or, with BUDGET_COLUMNS, seeds/budgets.csv): sorted by model, seed (and budget), every
    digit of every number kept."""
    ordered = sorted(rows, key=lambda r: (r["model"], int(r["seed"]), float(r.get("budget_flops", 0))))
    return csv_text([{k: (repr(float(r[k])) if isinstance(r[k], float) else r[k]) for k in columns} for r in ordered],
                    columns, newline="\n")


def read_rows(path: str | Path) -> list[dict]:
    """The rows of seeds/seeds.csv or seeds/budgets.csv, numbers as numbers; none when the file is missing."""
    return [{k: (v if k in ("model", "precision") else int(v) if k == "seed" else float(v)) for k, v in r.items()}
            for r in csv_records(path)]


def budget_rows(model: str, seed: int, records: list[dict]) -> list[dict]:
    """A run's annealed results (the `budgets` records of metrics/train/<model>.json, or of a seed's run) as rows
    of seeds/budgets.csv."""
    return [{"model": model, "seed": seed, **{k: r[k] for k in BUDGET_COLUMNS[2:]}} for r in records]


def budget_sds(rows: list[dict], points: dict[str, list[dict]], study_seed: int | None,
               models: list[str]) -> dict[str, dict[float, float]]:
    """{model: {budget: the sd of its annealed test bpb over seeds}} at each budget two or more seeds have, for the
    `models` whose seed rows hold (`current`): the rows of `study_seed` must also carry the study's annealed
    numbers now (`points`, lmpipe.compute_curves.annealed), else the model's budget rows are stale and unused."""
    out = {}
    for name in models:
        study = {r["budget_flops"]: r["test_bpb"] for r in points.get(name, [])}
        mine = [r for r in rows if r["model"] == name]
        own = {r["budget_flops"]: r["test_bpb"] for r in mine if r["seed"] == study_seed}
        if not study or own.keys() != study.keys() or any(abs(own[b] - v) > MATCH * abs(v) for b, v in study.items()):
            continue
        by_budget = {b: [r["test_bpb"] for r in mine if r["budget_flops"] == b] for b in study}
        out[name] = {b: statistics.stdev(v) for b, v in by_budget.items() if len(v) > 1}
    return out


def study_row(model: str, seed: int, result: dict, precision: str) -> dict:
    """The study's own run as a row: its numbers from metrics/eval.json."""
    return {"model": model, "seed": seed, "valid_bpb": result["valid"]["bpb"], "test_bpb": result["test"]["bpb"],
            "test_word_ppl": result["test"]["word_ppl"], "precision": precision}


def current(rows: list[dict], evaluation: dict, study_seed: int, precisions: dict[str, str]) -> tuple[dict, list[str]]:
    """({model: its rows}, the models whose rows are stale) for the models of `evaluation` that have rows: a model's
    rows hold while its `study_seed` row equals eval.json's numbers and every row has the study's precision."""
    by_model, stale = {}, []
    for name, result in evaluation["models"].items():
        mine = [r for r in rows if r["model"] == name]
        if not mine:
            continue
        own = [r for r in mine if r["seed"] == study_seed]
        fresh = (len(own) == 1 and all(abs(own[0][k] - v) <= MATCH * abs(v) for k, v in (
            ("valid_bpb", result["valid"]["bpb"]), ("test_bpb", result["test"]["bpb"]),
            ("test_word_ppl", result["test"]["word_ppl"])))
                 and all(r["precision"] == precisions.get(name, r["precision"]) for r in mine))
        if fresh:
            by_model[name] = mine
        else:
            stale.append(name)
    return by_model, stale


def spread(rows: list[dict]) -> Spread:
    bpb, ppl = [r["test_bpb"] for r in rows], [r["test_word_ppl"] for r in rows]
    sd = (lambda xs: statistics.stdev(xs)) if len(rows) > 1 else (lambda xs: None)
    return Spread(len(rows), statistics.fmean(bpb), sd(bpb), statistics.fmean(ppl), sd(ppl))


def spreads(evaluation: dict, by_model: dict[str, list[dict]], baseline: str) -> dict[str, Spread]:
    """Every model's spread: over its seeds where they hold, else its one run; the baseline's sd is 0 (it has no
    seed: the same counts give the same model)."""
    out = {}
    for name, result in evaluation["models"].items():
        if name in by_model and len(by_model[name]) > 1:
            out[name] = spread(by_model[name])
        else:
            sd = 0.0 if name == baseline else None
            out[name] = Spread(1, result["test"]["bpb"], sd, result["test"]["word_ppl"], sd)
    return out


def study_spreads(path: str | Path, evaluation: dict, precisions: dict[str, str], study_seed: int | None,
                  baseline: str, models: list[str] | None = None) -> tuple[dict[str, Spread], list[str]]:
    """(every model's spread, the models whose seed rows are stale) from seeds/seeds.csv at `path` and the study's
    eval.json: what the report, the README and the benchmark show. No `study_seed`: no row is the study's, none used;
    `models` limits the rows read to params.yaml's."""
    rows = [r for r in read_rows(path) if study_seed is not None and (models is None or r["model"] in models)]
    by_model, stale = current(rows, evaluation, study_seed, precisions)
    return spreads(evaluation, by_model, baseline), stale


def _gap(name: str, s: Spread, other: str, o: Spread) -> str:
    gap = s.bpb - o.bpb
    where = f"{abs(gap):.3f} bpb {'below' if gap < 0 else 'above'} {other}"
    real = s.gap_is_real(o)
    if real is None:  # one seed: no spread to judge it by (the report says so once)
        return where
    larger = max(s.bpb_sd, o.bpb_sd)
    return where + (f" (real: more than {REAL_GAP_SDS:g} x sd {larger:.3f})" if real
                    else f" (within noise: not more than {REAL_GAP_SDS:g} x sd {larger:.3f})")


def verdicts(spreads_: dict[str, Spread], baseline: str, baseline_label: str) -> list[str]:
    """One sentence per neural model: its mean test bpb with the seed sd, its margin against the baseline and
    against the best model, and whether each gap is real."""
    best = best_of({n: s.bpb for n, s in spreads_.items()}, baseline)
    if best is None:
        return []
    neural = sorted((n for n in spreads_ if n != baseline), key=lambda n: spreads_[n].bpb)
    lines = []
    for name in neural:
        s = spreads_[name]
        parts = [f"**{name}**: test {s.text()} bpb"]
        if baseline in spreads_:
            parts.append(_gap(name, s, baseline_label, spreads_[baseline]))
        if name == best:
            runner = neural[1] if len(neural) > 1 else None
            parts.append("the best model" + (f"; {_gap(name, s, runner, spreads_[runner])}" if runner else ""))
        else:
            parts.append(_gap(name, s, f"the best model, {best}", spreads_[best]))
        lines.append(", ".join(parts[:2]) + "; " + "; ".join(parts[2:]) + ".")
    return lines


def family_verdict(spreads_: dict[str, Spread], families: dict[str, str]) -> str | None:
    """The transformer against the best recurrent model (family `rnn`: Elman, LSTM, GRU), with the seed sd: the
    study's one sentence on the question its families raise. None without both."""
    recurrent = {n: s for n, s in spreads_.items() if families.get(n) == "rnn"}
    transformers = {n: s for n, s in spreads_.items() if families.get(n) == "transformer"}
    if not recurrent or not transformers:
        return None
    best_rnn = min(recurrent, key=lambda n: recurrent[n].bpb)
    best_t = min(transformers, key=lambda n: transformers[n].bpb)
    t, r = transformers[best_t], recurrent[best_rnn]
    return (f"Transformer against the recurrent family: {best_t} {t.text()} against the best recurrent model, "
            f"{best_rnn}, {r.text()}: {_gap(best_t, t, best_rnn, r)}.")
