"""reports/scaling.md and its HTML twin: the grid's runs, the fits with their uncertainty, and the figures
(lmpipe.scaling_figures draws them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path


from lmpipe import stats
from lmpipe.html_page import html_page
from lmpipe.scaling import MAX_EPOCHS, frontier, power_law
from lmpipe.scaling_figures import isoflop_figure, law_contours_figure, loss_vs_compute_figure
from lmpipe.tables import markdown_table

ONE_SEED = "one seed a run"


def seeds_phrase(spread: list[dict]) -> str:
    """How many seeds a point has, for the families' sentences (`seed_spread` of the fitted points)."""
    if not spread:
        return ONE_SEED
    return f"the mean of {_most_seeds(spread)} seeds a point at {_budgets(spread)} and one seed at the others"


def _most_seeds(spread: list[dict]) -> int:
    return max(s["seeds"] for s in spread)


def _budgets(spread: list[dict]) -> str:
    return "1 budget" if len(spread) == 1 else f"{len(spread)} budgets"


def seeds_markdown(spread: list[dict]) -> list[str]:
    """The seed sd of a run at each budget whose points ran with several seeds, and what is left of it in a mean."""
    if not spread:
        return []
    return ["## Seeds", "",
            "At these budgets every size ran with each of train.seed and scaling.seeds.extra, and a point is its runs' "
            "mean; a run's seed sd is pooled over the budget's points:", ""] + markdown_table(
        ["C (FLOPs)", "seeds", "points", "seed sd of a run (bpb)", "sd of a point's mean"],
        [[f"{s['budget']:.1e}", s["seeds"], s["points"], f"{s['sd']:.4f}", f"{s['sd'] / math.sqrt(s['seeds']):.4f}"]
         for s in spread]) + [""]


def caveats(spread: list[dict], dips: Sequence[tuple[float, str, float]] = ()) -> str:
    """How far to trust the grid: its seeds first, the minima that lie far below their runs (vertex_dips), then what
    every size's shared settings and the narrow N do."""
    budgets = ", ".join(f"{s['budget']:.1e}" for s in spread)
    seeds = (
        "Each point is one training run with one seed, train.seed, and a size keeps that seed's initial weights and "
        "data order at every budget. A second seed (sweeps/grid_seed_check.py: each budget's best size and its two "
        "neighbours; sweeps/notes.md) moved single runs at the three smallest budgets (up to 9.4e11 FLOPs) by "
        "several times the study's seed spread at its budget (reports/study.md, 'Seeds and verdicts'), each size by "
        "about the same at each of them, and at the larger budgets by about the study's spread. So at the smallest "
        "budgets a seed's luck moves a family's minimum in steps as its best size changes, and an exponent's "
        "interval, which takes the minima's scatter as independent, can understate its uncertainty, for the "
        "families whose target reads met too." if not spread else
        f"At {budgets} FLOPs a point is the mean of {_most_seeds(spread)} runs with different seeds "
        "(the Seeds table): there a size keeps its seed's initial weights and data order at every budget, so one "
        "seed's luck would move a family's minimum in steps as its best size changes (sweeps/notes.md); the mean "
        "cuts that luck by the root of the seeds' number. At the other budgets a point is one run with train.seed, "
        "where a second seed moved the runs around the minima by about the study's seed spread (reports/study.md, "
        "'Seeds and verdicts'; sweeps/grid_seed_check.py). An exponent's interval comes from the seeds: a bootstrap "
        "over each point's runs, where a point of one run borrows the noise the seeded points measured (so it "
        "assumes that noise holds at every budget), widened to the spread between three ways of fitting it.")
    return seeds + dips_sentence(dips) + (
        " Every size trains with its family's default settings (learning rate, batch, dropout), not settings tuned "
        "per size, which can bend the profiles. Runs longer than an epoch repeat data, which the law's D term does "
        "not model. The grid spans a narrow range of N (the 8,192-token embedding is most of a small model's "
        "parameters), so the law's constants trade off against each other: read the bootstrap intervals before "
        "the point values, and any prediction at 10x and 100x the largest budget as an extrapolation of the "
        "exponents, not a measurement. The budgets are far below the default study's trainings (`train_flops` in "
        "metrics/train/), so runs here can trail the n-gram baseline where the study's models beat it; which "
        "family is ahead at equal compute can change as compute grows.")


DIP = 0.01  # bpb: a minimum this far below its best run rests on the parabola's curvature more than on a run


def vertex_dips(rows: list[dict], analysis: dict) -> list[tuple[float, str, float]]:
    """How far each bracketed minimum lies below its budget's best run, (dip in bpb, model, budget), largest first.
    A parabola through three runs whose neighbours sit at unequal distances in size (a size added between) has a
    steep side, which can put its vertex below all three."""
    best = {(model, f["budget"]): f["valid_bpb"] for model, runs in frontier(rows).items() for f in runs}
    return sorted(((best[model, p["budget"]] - p["loss_opt"], model, p["budget"]) for model, a in analysis.items()
                   for p in a["isoflop"] if p["bracketed"]), reverse=True)


def dips_sentence(dips: Sequence[tuple[float, str, float]]) -> str:
    """The caveat for the minima that lie well below every run (vertex_dips), or none when none does."""
    deep = [d for d in dips if d[0] > DIP]
    if not deep:
        return ""
    named = ", ".join(f"{model} at {budget:.1e} ({dip:.3f})" for dip, model, budget in deep)
    return (f" A minimum is the vertex of a parabola through three runs, and {len(deep)} of {len(dips)} lie more than "
            f"{DIP} bpb below their budget's best run: {named}. There the best run's neighbours sit at unequal "
            "distances in size, and N_opt rests on three runs' curvature more than on a measured loss; the "
            "exponents' intervals do not carry that.")


def _count(span: tuple[int, int]) -> str:
    return f"{span[0]}" if span[0] == span[1] else f"{span[0]} to {span[1]}"


def _ci(pair) -> str:
    return f"[{pair[0]:.3g}, {pair[1]:.3g}]" if pair else "-"


def methods_phrase(methods: dict | None) -> str:
    """Each fitting method's N_opt exponent, for the exponents' list."""
    if not methods:
        return ""
    return "; by method: " + ", ".join(f"{m['name']} {m['exponent']:.2f}" if m["exponent"] is not None
                                        else f"{m['name']} none" for m in methods.values())


def _ci_of(line: dict) -> str:
    """A power law's 90% interval, as the report prints it beside the exponent."""
    return f" [{line['interval'][0]:.2f}, {line['interval'][1]:.2f}]" if "interval" in line else ""


EXPONENT_HALF_WIDTH = 0.1  # the target for N_opt's exponent: its 90% interval within +-0.1


def isoflop_n_opt(family: dict) -> dict | None:
    """The line through a family's bracketed IsoFLOP minima (approach 2): N_opt's exponent, with its interval and
    the minima's scatter from three budgets on; None with fewer than two."""
    return family["isoflop_exponents"]["n_opt"] if family["isoflop_exponents"] else None


def half_width(line: dict | None) -> float | None:
    """Half the 90% interval of a power law's exponent; None without one (fewer than three points)."""
    return (line["interval"][1] - line["interval"][0]) / 2 if line and "interval" in line else None


def exponent_known(line: dict | None) -> bool:
    """The target: N_opt's exponent, measured by the IsoFLOP minima, known to +-EXPONENT_HALF_WIDTH (its 90%
    interval that narrow)."""
    half = half_width(line)
    return half is not None and half < EXPONENT_HALF_WIDTH


def precision_sentence(line: dict | None, bracketed: int, budgets: list[float], seeds: str = ONE_SEED,
                       minima: list[dict] = ()) -> str:
    """Whether N_opt's exponent is known (`exponent_known`), and if not, the reason the grid gives. `minima`: the
    bracketed IsoFLOP minima the line went through, whose two halves `bend` compares."""
    target = f"(target +-{EXPONENT_HALF_WIDTH:g})"
    half = half_width(line)
    if half is None:
        return (f"With {bracketed} of its {len(budgets)} IsoFLOP minima inside the sizes tried, its exponent has no "
                f"interval {target}: missed.")
    if exponent_known(line):
        return (f"Its exponent is known to +-{half:.3f} {target}: met, from {seeds} (see 'How far to "
                "trust this').")
    if bracketed < len(budgets):
        why = (f"only {bracketed} of its {len(budgets)} IsoFLOP minima lie inside the sizes tried, so the runs pin the "
               "optimum's move poorly")
    else:
        why = f"its minima scatter about the line by {100 * (math.exp(line['scatter']) - 1):.0f}% in N ({seeds}"
        bent = bend(minima)
        why += f"): {bent}" if bent else (
            "; a size keeps its seed's luck at every budget, and the profile is flat near its minimum)")
    return f"Its exponent's interval is +-{half:.3f} {target}: missed, as {why}."


def halves(minima: list[dict]) -> tuple[dict, dict] | None:
    """The power law of N_opt over the smaller half of the budgets and over the larger half (the middle budget in
    the larger), each with its interval: from six minima on, None before."""
    if len(minima) < 6:
        return None
    k = len(minima) // 2
    return tuple(power_law([p["budget"] for p in half], [p["n_opt"] for p in half])
                 for half in (minima[:k], minima[k:]))


def bend(minima: list[dict]) -> str | None:
    """The bend in words, each half's exponent and interval, where the minima bend: the two halves' 90% intervals
    lie apart, so no one power of C fits them all; None where they do not (or fewer than six minima)."""
    two = halves(minima)
    if two is None:
        return None
    low, high = two
    if not (low["interval"][1] < high["interval"][0] or high["interval"][1] < low["interval"][0]):
        return None
    k = len(minima) // 2
    return (f"they move as N_opt ~ C^{low['exponent']:.2f} over the {k} smallest budgets and C^{high['exponent']:.2f} "
            f"over the {len(minima) - k} largest (90% intervals {low['interval'][0]:.2f} to {low['interval'][1]:.2f} "
            f"and {high['interval'][0]:.2f} to {high['interval'][1]:.2f}, apart), so the optimum does not move as one "
            "power of C over these budgets, and a line through them all leaves a wide interval")


def law_check(family: dict) -> str:
    """The law's lack-of-fit test against the seed replicates, and whether the fit is degenerate, in words."""
    fit = family.get("law_fit")
    test = ("no lack-of-fit test (no point has several seeds)" if not fit else stats.LackOfFit(
        fit["f"], fit["p"], fit["df_lack"], fit["df_pure"]).text())
    return test + ("; degenerate (an exponent at the bound of its search, or a floor E near 0)"
                   if family.get("law_degenerate") else "")


def law_usable(family: dict) -> bool:
    """Neither rejected by its lack-of-fit test nor degenerate: only such a law gives intervals and predictions."""
    return not family.get("law_degenerate") and not (family.get("law_fit") or {}).get("rejected")


def law_sentence(family: dict) -> str:
    """The fitted law's N_opt exponent (approach 3), and whether its interval holds the minima's; a law its
    replicates reject, or a degenerate one, is said to be so, and its exponent is not read as a measurement."""
    ci, line = family["law_exponent_intervals"].get("a"), isoflop_n_opt(family)
    if not law_usable(family):
        return (f"The fitted law L(N, D) is {law_check(family)}, so its N_opt ~ C^{family['law_exponents']['a']:.2f} "
                "is not a measurement and it is used for no interval or prediction.")
    text = f"The fitted law puts N_opt ~ C^{family['law_exponents']['a']:.2f}"
    if ci:
        text += f" (90% interval {ci[0]:.2f} to {ci[1]:.2f})"
        if line and not ci[0] <= line["exponent"] <= ci[1]:
            text += (", which does not hold the minima's exponent: the law does not describe these runs well enough "
                     "to measure it")
    holdout = family["holdout"]["mean_abs_relative_error"]
    return text + (f"; fitted without the largest budget, it predicts those runs to within {100 * holdout:.1f}% on "
                   "average." if holdout is not None else ".")


def findings(analysis: dict, best: list[dict], baseline: tuple[str, float] | None, seeds: str = ONE_SEED) -> list[str]:
    """What the grid shows, in sentences computed from it (the report's summary)."""
    out = []
    winners = sorted({b["model"] for b in best})
    top = best[-1]
    per_budget = ", ".join(f"{b['budget']:.1e}: {b['model']}" for b in best)
    out.append(f"At the largest budget ({top['budget']:.1e} FLOPs) the best run is {top['model']} {top['size']} at "
               f"{top['valid_bpb']:.4f} bpb" + (f", {top['valid_bpb'] - baseline[1]:+.4f} against {baseline[0]}" if baseline else "")
               + f"; {'the same family wins' if len(winners) == 1 else 'the winning family changes'} across budgets "
               f"({per_budget}).")
    for model, a in analysis.items():
        minima = [p for p in a["isoflop"] if p["bracketed"]]
        bracketed = len(minima)
        if bracketed == len(a["isoflop"]):
            where = "inside the sizes tried at every budget"
        elif bracketed == 0:
            edges = " or ".join(sorted({p["edge"] for p in a["isoflop"]}))
            beyond = {"smallest": "below the smallest", "largest": "above the largest"}.get(edges, "outside the")
            where = (f"at no budget inside the sizes tried: the best run is always the {edges} size, so N_opt lies "
                     f"{beyond} size tried and the IsoFLOP exponents are not measured by this grid")
        else:
            where = f"inside the sizes tried at {bracketed} of {len(a['isoflop'])} budgets"
        line = isoflop_n_opt(a)
        measured = (f" Its minima grow as N_opt ~ C^{line['exponent']:.2f}" + (
            f" (90% interval {line['interval'][0]:.2f} to {line['interval'][1]:.2f}, from the {bracketed} bracketed "
            "budgets, across three fitting methods and the bootstrap over seeds)" if "interval" in line else "")
            + "." if line else "")
        shares = [p["bracketed_share"] for p in a["isoflop"] if p.get("bracketed_share") is not None]
        if shares:
            measured += (f" Redrawn with the seeds' noise, its minima stay inside the sizes tried in "
                         f"{100 * min(shares):.0f}% to {100 * max(shares):.0f}% of draws.")
        out.append(f"{model}: the IsoFLOP minimum lies {where}.{measured} "
                   f"{precision_sentence(line, bracketed, [p['budget'] for p in a['isoflop']], seeds, minima)} "
                   f"{law_sentence(a)}")
    return out


def scaling_markdown(rows: list[dict], analysis: dict, best: list[dict], baseline: tuple[str, float] | None,
                     meta: dict) -> str:
    """The report's text: what was run, what the fits say, and how far to trust them."""
    spread = meta.get("seed_spread", [])
    runs = f"{meta['runs']} runs, {len(rows)} points" if meta.get("runs", len(rows)) > len(rows) else f"{len(rows)} runs"
    lines = ["# lmpipe scaling study", "",
             f"{runs}: {_count(meta['sizes'])} sizes of each of {', '.join(analysis)} at each of "
             f"{meta['budgets']} compute budgets C from {meta['min_budget']:.1e} to {meta['max_budget']:.1e} training "
             f"FLOPs, on the default pipeline's tokens ({meta['train_tokens']:,} training tokens per epoch). A size "
             f"whose run would read those tokens more than {MAX_EPOCHS} times is left out at that budget (so many "
             "repeats make the data, not the size, decide the loss). Every run ends at its budget with "
             "its learning-rate schedule annealed to it; its tokens D follow from C and the size. Loss is validation "
             "bits per byte (bpb); N counts all parameters; FLOPs are lmpipe.flops' analytic count. "
             f"Compute of the grid: {meta['flops']:.2e} training FLOPs on {meta['device']} (its wall time: the "
             "scaling run in MLflow)." + (f" At {_budgets(spread)} every size ran with several seeds, and a point is "
                                          "their mean (the Seeds section)." if spread else ""), ""]
    if baseline:
        lines += [f"{baseline[0]} on the same split: {baseline[1]:.4f} bpb.", ""]
    lines += ["## What the grid shows", ""] + [f"- {f}" for f in findings(analysis, best, baseline, seeds_phrase(spread))] + [""]
    lines += ["## Best run at each budget", ""] + markdown_table(
        ["C (FLOPs)", "best", "N", "D (tokens)", "valid bpb"],
        [[f"{b['budget']:.1e}", f"{b['model']} {b['size']}", f"{b['n_params']:,}", f"{b['tokens']:,}",
          f"{b['valid_bpb']:.4f}"] for b in best])
    lines += ["", "![Loss against compute](scaling/loss_vs_compute.png)", "",
              "## IsoFLOP profiles (Hoffmann et al.'s approach 2)", "",
              "At each budget a parabola in log N through the best run and its two neighbours in size; its minimum N_opt "
              "(a star: it lies between those neighbours), or a cross where the best run sits at the edge of the grid and "
              "the true optimum lies outside it; D_opt = C / (6 N_opt), and its epochs, the times it reads the training "
              "tokens. Local, not through every run: over a 32x range of sizes a profile is not a parabola, and a far "
              "run would tilt a global fit's vertex.", ""]
    lines += markdown_table(
        ["model", "C", "N_opt", "D_opt", "epochs", "bpb at N_opt", "bracketed"],
        [[model, f"{p['budget']:.1e}", f"{p['n_opt']:,.0f}", f"{p['d_opt']:,.0f}",
          f"{p['d_opt'] / meta['train_tokens']:.2f}", f"{p['loss_opt']:.4f}", "yes" if p["bracketed"] else "no"]
         for model, a in analysis.items() for p in a["isoflop"]]) + [""]
    for model, a in analysis.items():
        e = a["isoflop_exponents"]
        lines.append(f"- {model}: " + (f"N_opt ~ C^{e['n_opt']['exponent']:.2f}{_ci_of(e['n_opt'])}, D_opt ~ "
                                        f"C^{e['d_opt']['exponent']:.2f}{_ci_of(e['d_opt'])} (from the "
                                        f"{sum(p['bracketed'] for p in a['isoflop'])} bracketed budgets)"
                                        + methods_phrase(e.get("methods"))
                                        if e else "fewer than two bracketed minima: no exponent"))
    lines += ["", "An exponent's interval spans its three fitting methods (the parabola's vertex through the seed "
              "means, the vertex through train.seed's runs alone, the best size without a parabola) and each "
              "method's 90% bootstrap interval over the seed replicates: the spread between methods is part of "
              "its uncertainty."]
    lines += ["", "![IsoFLOP profiles](scaling/isoflop.png)", "",
              "## The fitted law L(N, D) = E + A / N^alpha + B / D^beta (approach 3)", "",
              f"Huber loss (delta {meta['huber_delta']:g}) on log-loss, L-BFGS from a grid of starts. Each law is "
              "tested for lack of fit against the seed replicates (the means' residual from the law against the "
              "noise between seeds, in log-loss); a law the test rejects (p below 0.05), or a degenerate one, gives no "
              f"interval and no prediction. 90% intervals from {meta['bootstrap']} draws of a bootstrap over the "
              "seed replicates, refitting each draw.", ""]
    laws = []
    for model, a in analysis.items():
        law, ci, ex, exci = a["law"], a["law_intervals"], a["law_exponents"], a["law_exponent_intervals"]
        laws.append([model, *(f"{law[k]:.3g} {_ci(ci.get(k))}" for k in ("E", "A", "alpha", "B", "beta")),
                     f"{ex['a']:.2f} {_ci(exci.get('a'))}", f"{ex['b']:.2f} {_ci(exci.get('b'))}", law_check(a)])
    lines += markdown_table(["model", "E", "A", "alpha", "B", "beta", "N_opt ~ C^a", "D_opt ~ C^b", "lack of fit"],
                            laws)
    predicted = [[model, f"{p['budget']:.1e} ({k})", f"{p['loss']:.4f} {_ci(p['interval'])}", f"{p['n_opt']:,.0f}"]
                 for model, a in analysis.items() for k, p in a["predictions"].items()]
    refused = [model for model, a in analysis.items() if not a["predictions"]]
    lines += ["", "Predicted loss at the compute-optimal size, beyond the grid" + (
        f" (none for {', '.join(refused)}: its law is rejected or degenerate):" if refused else ":"), ""]
    lines += markdown_table(["model", "C", "predicted bpb (90% interval)", "N_opt"], predicted) if predicted else []
    lines += ["", "![Fitted L(N, D)](scaling/law.png)", "",
              "## Does the law predict a run it has not seen?", "",
              "Refitted without the largest budget's runs, the law's prediction for them:", ""] + markdown_table(
        ["model", "run", "measured bpb", "predicted", "relative error"],
        [[model, h["name"], f"{h['measured']:.4f}", f"{h['predicted']:.4f}", f"{100 * h['relative_error']:+.1f}%"]
         for model, a in analysis.items() for h in a["holdout"]["runs"]]) + [""]
    for model, a in analysis.items():
        if a["holdout"]["mean_abs_relative_error"] is not None:
            lines.append(f"- {model}: mean absolute error {100 * a['holdout']['mean_abs_relative_error']:.1f}% "
                         f"at C = {a['holdout']['budget']:.1e}.")
    lines += ["", *seeds_markdown(spread), "## How far to trust this", "",
              caveats(spread, vertex_dips(rows, analysis)), ""]
    return "\n".join(lines) + "\n"


def write_scaling_report(rows, analysis, best, baseline, meta, out_dir: str | Path) -> Path:
    """reports/scaling.md, reports/scaling.html (figures embedded) and reports/scaling/*.png."""
    out_dir = Path(out_dir)
    figure_dir = out_dir / "scaling"
    figure_dir.mkdir(parents=True, exist_ok=True)
    loss_vs_compute_figure(rows, baseline, figure_dir / "loss_vs_compute.png")
    isoflop_figure(rows, analysis, figure_dir / "isoflop.png")
    law_contours_figure(rows, analysis, figure_dir / "law.png")
    text = scaling_markdown(rows, analysis, best, baseline, meta)
    (out_dir / "scaling.md").write_text(text, encoding="utf-8")
    (out_dir / "scaling.html").write_text(html_page(text, out_dir, "lmpipe scaling study"), encoding="utf-8")
    return out_dir / "scaling.md"
