"""The report's "As compute grows" in words: the grid's families ranked at each budget with the transformer's lead,
the fits and where two families change places, the study's models stopped early, and the grid against them. The
numbers are lmpipe.compute_curves'; the figure lmpipe.report_figures'."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from lmpipe import stats
from lmpipe.compute_curves import (FamilyFit, by_budget, crossings, grid_fits, leads, measured_flips, sd_at,
                                   study_budget)
from lmpipe.tables import markdown_table


def fraction(budget: float, c: float | None) -> str:
    """A budget as a share of the study's budget C: 'C/64', 'C/2.83', 'C'."""
    if not c:
        return f"{budget:.2e} FLOPs"
    ratio = c / budget
    return "C" if abs(ratio - 1) < 0.01 else f"C/{ratio:.3g}" if ratio > 1 else f"{1 / ratio:.3g} C"


def _value(p: dict) -> str:
    return f"{p['bpb']:.3f}" + (f" ± {p['sd']:.3f}" if stats.known(p["sd"]) else "")


def _verdict(real: bool | None) -> str:
    return "no seed sd to judge it" if real is None else "a real gap" if real else "within noise"


def ranking_line(at: dict[str, dict]) -> str:
    """The families best first at one budget, in words: each next one with whether its gap to the one before is
    real (beyond twice the larger seed sd), within noise, or not judged (a point of one run has no sd)."""
    order = sorted(at, key=lambda m: at[m]["bpb"])
    if not any(stats.known(p["sd"]) for p in at.values()):
        return ", then ".join(f"{m} {_value(at[m])}" for m in order) + " (one run a point: no gap judged)"
    parts = [f"{order[0]} {_value(at[order[0]])}"]
    for better, worse in zip(order, order[1:]):
        b, w = at[better], at[worse]
        parts.append(f"then {worse} {_value(w)} ({_verdict(stats.gap_is_real(b['bpb'], b['sd'], w['bpb'], w['sd']))})")
    return ", ".join(parts)



def crossing_lines(front: dict[str, list[dict]], fits: dict[str, FamilyFit], c: float | None) -> list[str]:
    """A line per measured flip of two families' order (`measured_flips`): where the two frontier curves cross
    inside it (every crossing there) when both forms survive their tests, else the two budgets it lies between."""
    lines = []
    for (a, pa), (b, pb) in itertools.combinations(sorted(front.items()), 2):
        for lo, hi in measured_flips(pa, pb):
            where = f"between {fraction(lo, c)} ({lo:.2e}) and {fraction(hi, c)} ({hi:.2e} FLOPs)"
            at = crossings(fits[a].curve, fits[b].curve, lo, hi) if fits[a].usable and fits[b].usable else []
            lines.append(f"- {a} and {b} change places {where}" + (
                f"; their curves cross at {', '.join(f'{x:.2e}' for x in at)} FLOPs" if at else ""))
    return lines


def frontier_section(front: dict[str, list[dict]], fits: dict[str, FamilyFit], c: float | None) -> list[str]:
    """The compute-optimal answer in lines, from the grid's frontier and its fits (lmpipe.compute_curves.grid_fits)."""
    budgets = sorted({p["budget"] for rows in front.values() for p in rows})
    top = budgets[-1]
    reach = (f"The grid reaches the study's budget C = {c:.2e} FLOPs." if c and top >= 0.99 * c else
             f"The grid stops at {fraction(top, c)} ({top:.2e} FLOPs), below the study's budget C"
             + (f" = {c:.2e} FLOPs" if c else "") + ": no grid point measures the ranking at C itself.")
    lines = ["Which family is best at each compute budget, each at its own best size: the scaling grid "
             "(reports/scaling.md) trains several sizes of every family at each budget, and a family's point is its "
             "best size there, the mean of its seeds where it has several (± their sd). Validation bits per byte "
             "(lower is better). A gap is real when it is more than twice the larger seed sd; a point of one run "
             f"has no sd, so no gap to it is judged. {reach}", "",
             "Ranking at each budget (validation bpb):", ""]
    lines += [f"- {fraction(b, c)} ({b:.2e} FLOPs): {ranking_line(at)}" for b, at in by_budget(front).items()]
    lead = leads(front)
    if lead:
        lines += ["", f"The transformer's lead over the best recurrent family (its validation bpb minus the "
                  "transformer's; positive: the transformer is better):", ""]
        lines += [f"- {fraction(b, c)}: {gap:+.3f} over {best} ({_verdict(real)})" for b, best, gap, real in lead]
    lines += ["", "A curve L(C) = E + A (C / C_max)^-alpha through each family's points, tested for lack of fit "
              "against the seed replicates (the means' distance from the curve against the spread between seeds); "
              "a rejected form (p below 0.05) gives no interval and places no crossing. Intervals from a bootstrap over "
              "the seed replicates, refitting each draw:", ""]
    lines += [fits[m].text(m) for m in front]
    flips = crossing_lines(front, fits, c)
    lines += ["", "Where two families change places inside the measured budgets (the order flips beyond noise):", "",
              *(flips or ["- nowhere: no two families' order flips beyond noise between budgets that judge it"])]
    return lines


def ranking(points: dict[str, list[dict]], sds: dict[str, dict[float, float]], c: float | None = None) -> list[str]:
    """A line per budget: the study's models best first by test bpb, in words (`ranking_line`)."""
    at_budget: dict[float, dict[str, dict]] = {}
    for name, rows in points.items():
        for r in rows:
            sd = sd_at(sds, name, r["budget_flops"])
            at_budget.setdefault(r["budget_flops"], {})[name] = {"bpb": r["test_bpb"],
                                                                  "sd": sd if math.isfinite(sd) else None}
    return [f"- {fraction(b, c)} ({b:.2e} FLOPs): {ranking_line(at)}" for b, at in sorted(at_budget.items())]


def section(points: dict[str, list[dict]], sds: dict[str, dict[float, float]], figure: str,
            scaling: dict | None = None, stale: Sequence[str] = (),
            fitted: tuple[dict[str, list[dict]], dict[str, FamilyFit]] | None = None) -> list[str]:
    """The report's "As compute grows": the compute-optimal answer from the grid's frontier (`scaling`:
    metrics/scaling.json; `stale`: what it was trained from that differs now; `fitted`: its frontier and fits, as
    grid_fits makes them, where the caller has them already), then the study's models stopped early, a learning
    curve at fixed size, beside the figure named `figure` in figures/."""
    c = study_budget(points)
    lines = ["## As compute grows", ""]
    if scaling and "frontier" in scaling:
        if stale:
            answer = [f"The scaling grid was trained from other {', '.join(stale)} than this study, so it does not "
                      "answer for it (run `lmpipe scaling` again)."]
        else:
            answer = frontier_section(*(fitted or grid_fits(scaling)), c)
        lines += ["### The compute-optimal answer: each family at its best size", "", *answer, ""]
    lines += [f"![Loss against compute](figures/{figure})", "",
              "### The study's models stopped early: a learning curve at fixed size", "",
              "Each study model keeps the one size and the settings tuned for the full budget C, and is stopped early "
              "at a fraction of C: its learning rate, held constant for most of training, is brought down to zero "
              "over a short final stretch ending at that budget (a branch of the run; Hägele et al. 2024), which "
              "gives the loss a run of that budget from scratch would (tests/test_train.py). This shows how a model "
              "of one size improves with training, not which family is best at that compute: a smaller model "
              "trained to a small budget does better (the scaling grid's best sizes). So no curve is "
              "fitted to these points and no crossing is read from them. Test bits per byte, ± the seed sd where "
              "seeds measured it (`lmpipe seeds` with the branches).", "",
              "Ranking at each budget (test bpb):", "", *ranking(points, sds, c)]
    return lines


def _near(a: float, b: float, tolerance: float = 0.01) -> bool:
    return abs(a - b) <= tolerance * max(a, b)


def against_grid(points: dict[str, list[dict]], scaling: dict | None, stale: Sequence[str] = ()) -> list[str]:
    """The scaling grid's frontier (each family's best size at a budget, metrics/scaling.json) against the study's
    annealed points at the budgets both have: per budget each family's valid bpb in both and the two rankings. The
    grid trains apart from the study with its own recipe, so where the budgets do not meet nothing is compared; nor
    where it was made from other data or settings than the study's (`stale` names them: lmpipe.grid_record)."""
    if not scaling or "frontier" not in scaling:
        return []
    e = lambda x: f"{x:.2e}"  # noqa: E731
    grid, frontier = scaling["grid"], scaling["frontier"]
    budgets = sorted({row["budget"] for rows in frontier.values() for row in rows})
    seeded = scaling.get("seed_spread") or []  # the budgets whose points are means of several seeds
    seeds = (f"one seed a run but at {len(seeded)} of them, where a point is the mean of "
             f"{max(s['seeds'] for s in seeded)} seeds" if seeded else "one seed a run")
    name = (f"The scaling grid (reports/scaling.md: {', '.join(sorted(frontier))} at {len(budgets)} budgets from "
            f"{e(budgets[0])} to {e(budgets[-1])} FLOPs, several sizes each, {seeds}, its own recipe: "
            + ", ".join(f"{k} {v}" for k, v in grid["overrides"].items()) + ")")
    if stale:
        return [f"{name}: not compared, as it was trained from other {', '.join(stale)} than this study "
                "(run `lmpipe scaling` again)."]
    pairs = []  # (budget, model, study valid bpb, grid's best run)
    for model, rows in sorted(points.items()):
        for r in rows:
            best = next((g for g in frontier.get(model, []) if _near(g["budget"], r["budget_flops"])), None)
            if best is not None:
                pairs.append((best["budget"], model, r["valid_bpb"], best))
    if not pairs:
        return [f"{name}: not compared, as the study has no annealed result at its budgets (`study.branches` "
                "gives them)."]
    lines = [f"{name}, against the study's models stopped early at the budgets both have. Validation bpb: the study's "
             "model (one size, tuned at its largest budget) and the grid's best size (a size at the edge of the grid's "
             "sizes is marked *: the grid's optimum may lie beyond it).", ""]
    lines += markdown_table(
        ["C (FLOPs)", "model", "study", "grid's best size", "grid", "study − grid"],
        [[e(budget), model, f"{study:.4f}", f"{best['size']}{'*' if best['edge'] else ''} "
          f"({best['n_params'] / 1e6:.2f}M)", f"{best['valid_bpb']:.4f}", f"{study - best['valid_bpb']:+.4f}"]
         for budget, model, study, best in sorted(pairs, key=lambda p: (p[0], p[2]))])
    lines.append("")
    for budget in sorted({p[0] for p in pairs}):
        at = [p for p in pairs if p[0] == budget]
        if len(at) < 2:
            continue
        study_order = [p[1] for p in sorted(at, key=lambda p: p[2])]
        grid_order = [p[1] for p in sorted(at, key=lambda p: p[3]["valid_bpb"])]
        same = "the same order" if study_order == grid_order else "another order"
        lines.append(f"- At {e(budget)} FLOPs the study ranks {', then '.join(study_order)}; the grid's best sizes "
                     f"rank {', then '.join(grid_order)}: {same}.")
    gaps = [p[2] - p[3]["valid_bpb"] for p in pairs]
    ahead = sum(g > 0 for g in gaps)
    runs = ("the study one seed, the grid one or a mean of several"
            if any(_near(p[0], s["budget"]) for p in pairs for s in seeded) else "one seed each")
    lines.append(f"- The grid's best size is below the study's model at {ahead} of {len(gaps)} points (mean gap "
                 f"{np.mean(gaps):+.4f} bpb, study − grid): {runs}, so a gap within the study's seed sd is noise.")
    return lines
