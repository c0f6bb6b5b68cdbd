"""The seed spread of each model and the verdicts it supports: mean and sd over seeds, and which gaps are real.

seeds/seeds.csv (written by `lmpipe seeds`) holds one row per (model, seed), the study's own run among them. A
model's rows count while they are of the study's model: the same `identity` (the code, the params but the seed and
the data that made them: metrics/train/<model>.json's) and a study run that reproduces its committed row: bit for
bit, or within noise of it (`reproduction`: no more than REAL_GAP_SDS seed sds away). The machine and the precision
that made a row are provenance, kept beside it, not identity: a study re-made on another machine keeps its spread.
Another identity, or a run beyond noise of its row, makes the rows stale, which is said with the reason.

Two results differ only where their gap exceeds twice the larger of their sds (REAL_GAP_SDS); the n-gram baseline
is deterministic (sd 0). With one seed there is no spread, so no gap between two models is called real.

With the study's decay branches (`study.branches`), seeds/budgets.csv holds every seed's annealed result at each
budget (one row per model, seed and budget), so each point of the report's "As compute grows" has its own sd.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from lmpipe.compare import best_of
from lmpipe.io import csv_records, csv_text
from lmpipe.stats import REAL_GAP_SDS, beyond_noise, gap_is_real, mean_sd


def models_option(function):
    """The flag of `lmpipe seeds` (and of `python -m flows.seeds`, which it runs) that picks models."""
    return click.option("--models", "models", multiple=True, metavar="MODEL", help="retrain only this model's seeds "
                        "(repeatable); the other models keep their rows of seeds/seeds.csv")(function)

COLUMNS = ("model", "seed", "valid_bpb", "test_bpb", "test_word_ppl", "precision", "identity", "machine")
TEXT_COLUMNS = ("model", "precision", "identity", "machine", "test")
BUDGET_COLUMNS = ("model", "seed", "budget_flops", "train_flops", "valid_bpb", "test_bpb")
WEAT_COLUMNS = ("model", "seed", "test", "effect_size", "p_value")
MATCH = 1e-9  # a row written from eval.json's numbers equals them but for the CSV's digits: "bit for bit"
BIT_FOR_BIT, WITHIN_NOISE, DIFFERS = "bit for bit", "within noise", "differs"
STALE_IDENTITY = "made by other code, params or data than this study's (run `lmpipe seeds` again)"


@dataclass(frozen=True)
class Reproduction:
    """How far a re-made result lies from its committed value: the verdict and the distance in seed sds (None
    where there is no sd)."""
    verdict: str
    sds: float | None

    def text(self) -> str:
        return self.verdict if self.sds is None or self.verdict == BIT_FOR_BIT else f"{self.verdict}, {self.sds:.1f} sd"


def reproduction(committed: dict[str, float], now: dict[str, float],
                 sd: float | dict[str, float | None] | None) -> Reproduction:
    """The one rule for a re-made result (this machine's run of a committed seed, a fresh clone's study): every
    number equal but for digits is bit for bit; otherwise within noise while no number moved more than REAL_GAP_SDS
    of its own seed sds (the rule two models' gap is judged by), else it differs. `sd` is one sd for every number,
    or one per split (`split_sds`): a validation number is judged in the validation sd, any other in the test sd
    (the LSTM's seeds vary 2.6 times as much on valid as on test). Without an sd only equality holds."""
    moved = {k: abs(now[k] - v) for k, v in committed.items() if abs(now[k] - v) > MATCH * abs(v)}
    if not moved:
        return Reproduction(BIT_FOR_BIT, 0.0)
    sds = {k: sd.get("valid" if "valid" in k else "test") if isinstance(sd, dict) else sd for k in moved}
    if not all(sds.values()):
        return Reproduction(DIFFERS, None)
    distance = max(gap / sds[k] for k, gap in moved.items())
    return Reproduction(WITHIN_NOISE if distance <= REAL_GAP_SDS else DIFFERS, distance)


def split_sds(rows: list[dict]) -> dict[str, float | None]:
    """The sd over a model's seed rows of its valid and of its test bpb: what each re-made number is judged in."""
    values = {split: [r[f"{split}_bpb"] for r in rows if f"{split}_bpb" in r] for split in ("valid", "test")}
    return {split: mean_sd(v)[1] if v else None for split, v in values.items()}


@dataclass(frozen=True)
class Spread:
    """A model's test results over its seeds (n = 1: the study's run alone, sd unknown)."""
    n: int
    bpb: float  # mean test bits per byte
    bpb_sd: float | None
    word_ppl: float
    word_ppl_sd: float | None
    valid_bpb: float | None = None  # mean validation bits per byte

    def gap_is_real(self, other: "Spread") -> bool | None:
        """Is |self - other| in mean test bpb more than twice the larger sd? None where a spread is unknown."""
        return gap_is_real(self.bpb, self.bpb_sd, other.bpb, other.bpb_sd)

    def text(self, digits: int = 3) -> str:
        if self.bpb_sd is None:
            return f"{self.bpb:.{digits}f} (1 seed)"
        return f"{self.bpb:.{digits}f} ± {self.bpb_sd:.{digits}f} ({self.n} seeds)"


def csv_rows(rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> str:
    """seeds/seeds.csv (or, with BUDGET_COLUMNS, seeds/budgets.csv; with WEAT_COLUMNS, seeds/weat.csv): sorted by
    model, seed (and budget, or test), every digit of every number kept."""
    ordered = sorted(rows, key=lambda r: (r["model"], int(r["seed"]), float(r.get("budget_flops", 0)),
                                          r.get("test", "")))
    return csv_text([{k: (repr(float(r[k])) if isinstance(r[k], float) else r[k]) for k in columns} for r in ordered],
                    columns, newline="\n")


def read_rows(path: str | Path) -> list[dict]:
    """The rows of seeds/seeds.csv or seeds/budgets.csv, numbers as numbers; none when the file is missing."""
    return [{k: (v if k in TEXT_COLUMNS else int(v) if k == "seed" else float(v)) for k, v in r.items()}
            for r in csv_records(path)]


def budget_rows(model: str, seed: int, records: list[dict]) -> list[dict]:
    """A run's annealed results (the `budgets` records of metrics/train/<model>.json, or of a seed's run) as rows
    of seeds/budgets.csv."""
    return [{"model": model, "seed": seed, **{k: r[k] for k in BUDGET_COLUMNS[2:]}} for r in records]


def budget_sds(rows: list[dict], points: dict[str, list[dict]], study_seed: int | None,
               models: list[str]) -> dict[str, dict[float, float]]:
    """{model: {budget: the sd of its annealed test bpb over seeds}} at each budget two or more seeds have, for the
    `models` whose seed rows hold (`current`): the study's annealed numbers now (`points`,
    lmpipe.compute_curves.annealed) must reproduce the rows of `study_seed` at every budget (`reproduction`, in that
    budget's sd), else the model's budget rows are stale and unused."""
    out = {}
    for name in models:
        study = {r["budget_flops"]: r["test_bpb"] for r in points.get(name, [])}
        mine = [r for r in rows if r["model"] == name]
        own = {r["budget_flops"]: r["test_bpb"] for r in mine if r["seed"] == study_seed}
        if not study or own.keys() != study.keys():
            continue
        by_budget = {b: [r["test_bpb"] for r in mine if r["budget_flops"] == b] for b in study}
        sds = {b: mean_sd(v)[1] for b, v in by_budget.items() if len(v) > 1}
        if all(reproduction({"test_bpb": own[b]}, {"test_bpb": v}, sds.get(b)).verdict != DIFFERS
               for b, v in study.items()):
            out[name] = sds
    return out


def weat_rows(model: str, seed: int, effects: dict[str, dict]) -> list[dict]:
    """One audit's effect sizes (lmpipe.audit.effect_sizes, or metrics/weat.json's rows of a model) as rows of
    seeds/weat.csv: the tests that ran."""
    return [{"model": model, "seed": seed, "test": t, "effect_size": r["effect_size"], "p_value": r["p_value"]}
            for t, r in sorted(effects.items()) if r.get("effect_size") is not None]


@dataclass(frozen=True)
class Effect:
    """A WEAT effect size over a model's seeds."""
    n: int
    mean: float
    sd: float | None

    @property
    def beyond_noise(self) -> bool | None:
        """Is the mean more than REAL_GAP_SDS sds from zero (a sign a machine's rounding cannot flip)? None with
        one seed."""
        return beyond_noise(self.mean, self.sd)

    def text(self) -> str:
        if self.sd is None:
            return f"{self.mean:+.2f} (1 seed)"
        return f"{self.mean:+.2f} ± {self.sd:.2f} ({self.n} seeds, {'beyond' if self.beyond_noise else 'within'} noise)"


def weat_spreads(rows: list[dict], models: list[str]) -> dict[str, dict[str, Effect]]:
    """{model: {test: its effect size over the seeds}} for `models` (those whose seed rows hold: `current`), over
    the seeds that ran each test; a model with one seed's audit alone has none."""
    out = {}
    for name in models:
        by_test: dict[str, list[float]] = {}
        for r in rows:
            if r["model"] == name:
                by_test.setdefault(r["test"], []).append(r["effect_size"])
        out[name] = {t: Effect(len(v), *mean_sd(v)) for t, v in by_test.items()}
    return {n: e for n, e in out.items() if any(x.n > 1 for x in e.values())}


def study_row(model: str, seed: int, result: dict, trained: dict) -> dict:
    """The study's own run as a row: its numbers from metrics/eval.json, what made it and where from its training
    summary (metrics/train/<model>.json)."""
    return {"model": model, "seed": seed, "valid_bpb": result["valid"]["bpb"], "test_bpb": result["test"]["bpb"],
            "test_word_ppl": result["test"]["word_ppl"], "precision": trained["precision"],
            "identity": trained.get("identity", ""), "machine": trained.get("machine", "")}


def _numbers(row: dict) -> dict[str, float]:
    return {"valid_bpb": row["valid_bpb"], "test_bpb": row["test_bpb"]}


def _of_eval(result: dict) -> dict[str, float]:
    return {"valid_bpb": result["valid"]["bpb"], "test_bpb": result["test"]["bpb"]}


def current(rows: list[dict], evaluation: dict, study_seed: int,
            trained: dict[str, dict]) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """({model: its rows}, {model: why its rows are stale}) for the models of `evaluation` that have rows: a model's
    rows hold while every row has the identity of its training now (`trained`: metrics/train/<model>.json) and the
    study's run reproduces the row of `study_seed` (`reproduction`, in the sd over the model's seeds)."""
    by_model, stale = {}, {}
    for name, result in evaluation["models"].items():
        mine = [r for r in rows if r["model"] == name]
        if not mine:
            continue
        made = trained.get(name, {}).get("identity")
        own = [r for r in mine if r["seed"] == study_seed]
        if not made or any(r.get("identity") != made for r in mine):
            stale[name] = STALE_IDENTITY
        elif len(own) != 1:
            stale[name] = f"no row of the study's seed {study_seed} (run `lmpipe seeds` again)"
        elif (seen := reproduction(_numbers(own[0]), _of_eval(result), split_sds(mine))).verdict == DIFFERS:
            stale[name] = (f"this run differs from its committed row of seed {study_seed}"
                           + (f" by {seen.sds:.1f} seed sds" if seen.sds is not None else "")
                           + " (run `lmpipe seeds` again)")
        else:
            by_model[name] = mine
    return by_model, stale


def provenance(rows: list[dict], evaluation: dict, study_seed: int, trained: dict[str, dict],
               models: list[str]) -> dict[str, dict]:
    """Per model whose rows hold: the machines and precisions its seed rows were made on, this run's, and how its
    run compares with its committed row (`Reproduction`): what the report and `lmpipe reproduced` say."""
    out = {}
    for name in models:
        mine = [r for r in rows if r["model"] == name]
        own = [r for r in mine if r["seed"] == study_seed]
        if not own or name not in evaluation["models"]:
            continue
        t = trained.get(name, {})
        out[name] = {"rows": sorted({(r.get("machine") or "unrecorded", r["precision"]) for r in mine}),
                     "run": (t.get("machine") or "unrecorded", t.get("precision", "")),
                     "reproduction": reproduction(_numbers(own[0]), _of_eval(evaluation["models"][name]),
                                                  split_sds(mine))}
    return out


def spread(rows: list[dict]) -> Spread:
    bpb, ppl = mean_sd(r["test_bpb"] for r in rows), mean_sd(r["test_word_ppl"] for r in rows)
    valid = mean_sd(r["valid_bpb"] for r in rows)[0] if all("valid_bpb" in r for r in rows) else None
    return Spread(len(rows), *bpb, *ppl, valid)


def spreads(evaluation: dict, by_model: dict[str, list[dict]], baseline: str) -> dict[str, Spread]:
    """Every model's spread: over its seeds where they hold, else its one run; the baseline's sd is 0 (it has no
    seed: the same counts give the same model)."""
    out = {}
    for name, result in evaluation["models"].items():
        if name in by_model and len(by_model[name]) > 1:
            out[name] = spread(by_model[name])
        else:
            sd = 0.0 if name == baseline else None
            out[name] = Spread(1, result["test"]["bpb"], sd, result["test"]["word_ppl"], sd,
                               result.get("valid", {}).get("bpb"))
    return out


def study_spreads(path: str | Path, evaluation: dict, trained: dict[str, dict], study_seed: int | None,
                  baseline: str, models: list[str] | None = None) -> tuple[dict[str, Spread], dict[str, str]]:
    """(every model's spread, {model: why its seed rows are stale}) from seeds/seeds.csv at `path`, the study's
    eval.json and its training summaries (`trained`): what the report, the README and the benchmark show. No
    `study_seed`: no row is the study's, none used; `models` limits the rows read to params.yaml's."""
    rows = [r for r in read_rows(path) if study_seed is not None and (models is None or r["model"] in models)]
    by_model, stale = current(rows, evaluation, study_seed, trained)
    return spreads(evaluation, by_model, baseline), stale


def gap_phrase(s: Spread, other: str, o: Spread) -> str:
    """'0.022 bpb below lstm (real: more than 2 x sd 0.004)': the gap of `s` to `other`'s spread `o`, judged."""
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
            parts.append(gap_phrase(s, baseline_label, spreads_[baseline]))
        if name == best:
            runner = neural[1] if len(neural) > 1 else None
            parts.append("the best model" + (f"; {gap_phrase(s, runner, spreads_[runner])}" if runner else ""))
        else:
            parts.append(gap_phrase(s, f"the best model, {best}", spreads_[best]))
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
            f"{best_rnn}, {r.text()}: {gap_phrase(t, best_rnn, r)}.")
