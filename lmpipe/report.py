"""The study report: one Markdown file and a self-contained HTML twin (figures embedded), from the metrics files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from lmpipe import paths, tuned
from lmpipe import seeds as seed_spread
from lmpipe.as_compute_grows import against_grid, section as compute_section
from lmpipe.compute_curves import annealed, grid_fits
from lmpipe.context_use import LEVEL_SDS, baseline_identity, current, read_curves
from lmpipe.compare import (CACHE, MATCHED, best_model, best_of, gap, gap_header, gap_text, scored,
                            without_cache)
from lmpipe.paths import BASELINE
from lmpipe.html_page import html_page
from lmpipe.io import csv_records, csv_text, write_text
from lmpipe.report_figures import bpb_figure, compute_figure, learning_curves_figure, position_figure
from lmpipe.tables import markdown_table
from lmpipe.results import load_results, machines_text, read_json, si


def _curves(plots_dir: Path) -> dict[str, list[dict]]:
    curves = {}
    for path in sorted(plots_dir.glob("*.csv")):
        curves[path.stem] = [{k: float(v) for k, v in row.items()} for row in csv_records(path)]
    return curves


def compute_curves_csv(curves: dict[str, list[dict]], points: dict[str, list[dict]] | None = None) -> str:
    """Every model's validation bpb against the training FLOPs spent, one CSV with a `model` column: its annealed
    results at each budget where it has them (`points`, lmpipe.compute_curves.annealed), else its learning curve's
    mid-run points."""
    points = points or {}
    rows = [{"model": name, "flops": r["train_flops"], "valid_bpb": r["valid_bpb"]}
            for name, records in points.items() for r in records]
    rows += [{"model": name, "flops": r["flops"], "valid_bpb": r["valid_bpb"]}
             for name, records in curves.items() if name not in points for r in records if "flops" in r]
    return csv_text(rows) or "model,flops,valid_bpb\n"


def _corpus_section(corpus, validation, tokenize) -> list[str]:
    lines = ["## Corpus", ""]
    if corpus:
        lines += [f"Source: `{corpus['source']}`.", ""] + markdown_table(
            ["split", "articles", "lines", "words", "chars"],
            [[s, v["articles"], v["lines"], v["words"], v["chars"]] for s, v in corpus["splits"].items()])
    if validation:
        verdict = "passed" if validation["success"] else f"FAILED ({validation['failed']} failures)"
        lines += ["", f"Validation (Great Expectations): {validation['evaluated']} expectations, {verdict}."]
    if tokenize:
        lines += ["", "## Tokenizer", "",
                  f"Byte-level BPE, vocabulary {tokenize['vocab_size']}; tokens per word: "
                  + ", ".join(f"{s} {tokenize['tokens'][s] / tokenize['words'][s]:.2f}" for s in tokenize["tokens"]) + "."]
    return lines


def _precision_note(trained: dict) -> str:
    """How the neural models trained (`train.precision`): their matmuls in bf16 autocast, or in fp32."""
    kinds = sorted({t["precision"] for t in trained.values() if "precision" in t})
    if not kinds:
        return ""
    how = {"bf16": "matmuls in bf16 autocast", "fp32": "in fp32"}
    return "; training " + " or ".join(how[k] for k in kinds) + ", evaluation in fp32"


def compute_line(trained: dict, budget_flops: float | None, unmatched: list[str]) -> str:
    """The study's headline on compute: the one budget every neural model trained, and any exception."""
    if budget_flops is None or not trained:
        return ""
    matched = [n for n in trained if n not in unmatched]
    line = (f"**Equal compute**: {'every neural model' if not unmatched else ', '.join(matched) or 'no model'} trained "
            f"{si(budget_flops)} FLOPs (`study.budget`, within {100 * MATCHED:g}%), so the verdicts below compare the "
            "families, not how much compute each got.")
    if unmatched:
        line += (" Not compute-matched, shown but left out of every verdict: " + ", ".join(
            f"{n} ({si(trained[n].get('train_flops', 0.0))} FLOPs)" for n in unmatched) + ".")
    return line


def row_label(name: str, unmatched: Sequence[str] = ()) -> str:
    """A model's name in a results table: the baseline and any model off the study's budget say so."""
    if name == BASELINE:
        return f"{name} (baseline)"
    return f"{name} (not compute-matched)" if name in unmatched else name


def answer_lines(spreads: dict, combined: dict | None, evaluation: dict | None, label: str,
                 unmatched: Sequence[str] = ()) -> list[str]:
    """The report's first lines: the best compute-matched model with its margin over the next and over the baseline
    (seed means and sds, judged by lmpipe.seeds' rule), and what combining the models adds."""
    judged = {n: s for n, s in spreads.items() if n not in unmatched}
    best = best_of({n: s.bpb for n, s in judged.items()})
    if best is None:
        return []
    s, ranked = judged[best], sorted((n for n in judged if n not in (BASELINE, best)), key=lambda n: judged[n].bpb)
    parts = [f"**Best model: {best}**, test {s.text()} bpb"]
    if ranked:
        parts.append(seed_spread.gap_phrase(s, ranked[0], judged[ranked[0]]))
    if BASELINE in judged:
        bpb, word_ppl = gap(s, judged[BASELINE])
        parts.append(seed_spread.gap_phrase(s, f"the {label} baseline", judged[BASELINE])
                     + f", a word perplexity {100 * abs(word_ppl):.1f}% {'lower' if word_ppl < 0 else 'higher'}")
    lines = [", ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if parts[2:] else "") + "."]
    if combined and combined.get("models") and evaluation:
        name, single = best_model(combined["models"]), evaluation["models"][best]["test"]["bpb"]
        c = combined["models"][name]["test"]
        lines.append(f"**Combined**: interpolating {name} gives {c['bpb']:.3f} test bpb, {single - c['bpb']:.3f} "
                     f"below {best}'s run alone ({single:.3f}; weights fitted on valid, one run of each model).")
    return lines


def _perplexity_section(evaluation, trained: dict, label: str, unmatched: list[str], spreads: dict) -> list[str]:
    """The results table: each model with the compute it had, and its test numbers and gap to the baseline from one
    source, the seed means where seeds hold (`spreads`)."""
    models = evaluation["models"]
    lines = ["## Perplexity", "", "Sorted by test bits per byte. The same total loss normalised per UTF-8 byte (bpb), "
             "per whitespace word and per BPE token, so the n-gram and the neural models compare fairly whatever "
             "their tokenization. Every bpb, word perplexity and gap here is a mean over the model's seeds (the "
             "seeds column; seeds/seeds.csv) where it has them, else its one run; the gap to the baseline is the "
             "difference in bpb (negative: better), the change in word perplexity in brackets. Compute: parameters "
             "without embeddings, training tokens seen and training FLOPs (analytic, `lmpipe/flops.py`)"
             + _precision_note(trained) + "; the seconds each took are on the model's MLflow run (they differ from "
             "run to run, so no tracked file holds them).", ""]
    rows, kn = [], spreads.get(BASELINE)
    for n in sorted(models, key=lambda n: spreads[n].bpb):
        r, t, s = models[n], trained.get(n, {}), spreads[n]
        compute = ([f"{r['n_params']:,} ({t['n_params_non_embedding']:,})", f"{t['tokens_seen']:,} "
                    f"({t['epochs']:.1f} ep.)", si(t["train_flops"])]
                   if "train_flops" in t else [f"{r['n_params']:,}", "-", "-"])
        sd = f" ± {s.bpb_sd:.3f}" if s.bpb_sd and n != BASELINE else ""
        valid = "-" if s.valid_bpb is None else f"{s.valid_bpb:.3f}"
        rows.append([row_label(n, unmatched), *compute, "-" if n == BASELINE else s.n, valid, f"{s.bpb:.3f}{sd}",
                     f"{s.word_ppl:,.0f}", gap_text(s, kn) if kn and n != BASELINE else "-"])
    lines += markdown_table(["model", "params (non-emb.)", "tokens seen", "train FLOPs", "seeds", "valid bpb",
                             "test bpb", "test word ppl", gap_header(label)], rows)
    neural = [n for n in models if n != BASELINE and n not in unmatched]
    if kn and neural:
        behind = [n for n in neural if spreads[n].bpb >= kn.bpb]
        lines += ["", (f"Behind the baseline in bpb: {', '.join(behind)}." if behind
                       else "Every neural model is ahead of the baseline in bpb.")
                  + " Which of these gaps are real is in *Seeds and verdicts* below."]
    if neural:
        lines += ["", "Each neural model is registered in MLflow as `lmpipe-<model>`; `models:/lmpipe-<model>@champion` "
                      "is the version the first study or the last passing retrain made (`lmpipe ui` prints each "
                      "champion's version: registry state, which this reproducible report does not hold)."]
    return lines


def _combine_section(combined: dict, evaluation: dict, label: str, unmatched: list[str] = ()) -> list[str]:
    """The interpolated models against the single ones: what mixing adds, with weights fitted on valid only."""
    models, rows = evaluation["models"], combined["models"]
    single = best_model({n: r for n, r in models.items() if n not in unmatched})
    kn = models.get(BASELINE)
    windows = [r["cache_window"] for r in rows.values() if "cache_window" in r]
    cache = (f" The row with `{CACHE}` adds a unigram cache to all the models: each token's share of the "
             f"{windows[0]} tokens before it (the window of `combine.cache_windows` with the best valid likelihood), "
             "no training (Kuhn & De Mori 1990).") if windows else ""
    lines = ["## Combined models", "", "Per-token linear interpolation of the models' probabilities (the same BPE "
             "stream), weights fitted by EM on the valid split only and scored once on test (`lmpipe/combine.py`): "
             "the runs `models/` holds, one seed each, so every number here is one run's." + cache, ""]
    table = []
    for name, r in sorted(rows.items(), key=lambda kv: kv[1]["test"]["bpb"]):
        weights = ", ".join(f"{m} {w:.2f}" for m, w in r["weights"].items())
        gain = f"{r['test']['bpb'] - models[single]['test']['bpb']:+.3f}" if single else "-"
        versus = gap_text(scored(r), scored(kn)) if kn else "-"
        table.append([name, weights, f"{r['valid']['bpb']:.3f}", f"{r['test']['bpb']:.3f}",
                      f"{r['test']['word_ppl']:,.0f}", gain, versus])
    lines += markdown_table(["combination", "weights", "valid bpb", "test bpb", "test word ppl",
                             "vs best single (bpb)", gap_header(label)], table)
    matched = {name: r for name, r in rows.items() if not set(r["weights"]) & set(unmatched)}
    if matched and single:
        best = best_model(matched)
        lines += ["", f"Best combination: **{best}**, test {rows[best]['test']['bpb']:.3f} bpb against the best single "
                      f"model's ({single}) {models[single]['test']['bpb']:.3f}."]
        trained = without_cache(matched)
        if CACHE in rows[best]["weights"] and trained:
            alone = best_model(trained)
            lines[-1] += f" Without the cache, the best is {alone}: {rows[alone]['test']['bpb']:.3f}."
    return lines


def provenance_lines(provenance: dict[str, dict]) -> list[str]:
    """Where the seed rows and this run were made, and how far this run lies from its committed row: a spread made
    on one machine holds for a run on another while the run is within noise of its row (lmpipe.seeds)."""
    if not provenance:
        return []
    rows = sorted({pair for p in provenance.values() for pair in p["rows"]})
    runs = sorted({p["run"] for p in provenance.values()})
    judged = {name: p["reproduction"] for name, p in sorted(provenance.items())}
    if all(r.verdict == seed_spread.BIT_FOR_BIT for r in judged.values()):
        reproduced = "reproduces every model's committed row of its seed bit for bit"
    else:
        reproduced = ("against its committed row of the same seed, in that model's seed sds: "
                      + ", ".join(f"{name} {r.text()}" for name, r in judged.items()))
    unknown = "an unrecorded machine"
    return [f"Seed rows made on {machines_text(rows, unknown)}; this run on {machines_text(runs, unknown)}, "
            f"which {reproduced}."]


def _seeds_section(spreads: dict, stale: dict[str, str], label: str, unmatched: list[str] = (),
                   families: dict[str, str] | None = None, provenance: dict | None = None,
                   better: Sequence[tuned.Better] = ()) -> list[str]:
    """Mean ± sd over seeds per model and one verdict per model: which of its gaps exceed the noise; the families'
    verdict; the settings found better at C than a model's own, which its verdicts do not have."""
    lines = ["## Seeds and verdicts", "", "Each neural model trained with `train.seed` and the seeds of `seeds.extra` "
             "(`lmpipe seeds`, seeds/seeds.csv), everything else equal. Two results differ only where their gap "
             f"exceeds {seed_spread.REAL_GAP_SDS:g} times the larger seed sd; otherwise they are within noise. "
             f"{label} is deterministic (sd 0). The means are the *Perplexity* table's.", ""]
    single = sorted(n for n, s in spreads.items() if n != BASELINE and s.bpb_sd is None)
    judged = {n: s for n, s in spreads.items() if n not in unmatched}
    lines += [""] + [f"- {v}" for v in seed_spread.verdicts(judged, BASELINE, label)]
    if families and (verdict := seed_spread.family_verdict(judged, families)):
        lines += ["", verdict]
    if better:
        lines += ["", "Settings found better at C than the study's own (one setting changed, the study's budget: "
                      "sweeps/equal_*, docs/tuning.md), so the verdicts above that name these models are about the "
                      "study's settings, not the best each family has shown; the study's models do not have them "
                      "yet:", ""] + [f"- {b.text()}" for b in better]
    if single:
        lines += ["", f"One seed so far for {', '.join(single)}: no spread to judge their gaps by, so none of them is "
                      "called real or noise (`lmpipe seeds` measures it)."]
    if provenance:
        lines += [""] + provenance_lines(provenance)
    if stale:
        lines += ["", "Stale seed runs, not shown: " + "; ".join(f"{name}, {why}" for name, why in sorted(stale.items()))
                  + "."]
    return lines


SHOWN_STRATEGY = "top-p"  # the one strategy the report shows per model (the first where the study has no top-p)


def condensed_samples(text: str) -> list[str]:
    """reports/samples.md in brief: its settings and diversity table, then each model's samples under one strategy;
    every strategy stays in samples.md, which the section links."""
    head, *sections = re.split(r"^## (?=\S)", text, flags=re.M)
    lines = ["## Decoding samples", "", f"One strategy per model here ({SHOWN_STRATEGY} where the study has it); "
             "every model under every strategy: [samples.md](samples.md).", ""]
    lines += [ln for ln in head.splitlines() if ln.startswith("Prompts:")]
    for section in sections:
        title, *strategies = re.split(r"^### ", section, flags=re.M)
        if title.startswith("Diversity"):
            lines += ["", "### Diversity per strategy (mean over models)", ""]
            lines += [ln for ln in title.splitlines() if ln.startswith("|")]
            continue
        by_name = {part.splitlines()[0].strip(): part for part in strategies}
        shown = SHOWN_STRATEGY if SHOWN_STRATEGY in by_name else next(iter(by_name), None)
        if shown:
            lines += ["", f"**{title.strip()}** ({shown})", ""]
            lines += [ln for ln in by_name[shown].splitlines() if ln.startswith("- ")]
    return lines


def _position_section(curves: dict, stale: list[str], label: str) -> list[str]:
    """Loss by context position: how it was measured, each model's loss in bins of positions that double in width,
    where each levels off and what the window's second half still gains (each against the scatter between
    positions), the figure, and the models whose curve is not of their training now."""
    lines = ["## Loss by context position", ""]
    if curves:
        window, machines = len(next(iter(curves.values())).nats), sorted({c.trained_on for c in curves.values()} - {""})
        seeds = sorted({c.seeds for c in curves.values()})
        bands = ("one seed a model, so no seed band yet (`python -m flows.position --seeds DIR` with the seeds' "
                 "models gives each its band)" if seeds == [1] else "the figure's bands: ± one sd over each model's "
                 "seeds")
        order = sorted(curves.values(), key=lambda c: (-c.levels_off_at, c.bins()[-1][2], c.model))
        named = lambda c: f"{label} n-gram" if c.model == BASELINE else c.model  # noqa: E731
        spans = [f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b, _, _ in order[0].bins()]
        rows = [[named(c), *(f"{mean:.3f}" for _, _, mean, _ in c.bins()), str(c.levels_off_at),
                 "{:+.3f} ± {:.3f}".format(c.late_gain[0], LEVEL_SDS * c.late_gain[1])] for c in order]
        scatter = sorted(c.scatter for c in curves.values())
        lines += [f"Test loss in nats per token against the number of tokens a model has read in its {window}-token "
                  "window, every window read from an empty context (a zero state, a fresh window, the n-gram's "
                  "history cut at the window's start; Kaplan et al. 2020, Fig. 7), averaged over bins of positions "
                  f"that double in width; {bands}. Scored by `python -m flows.position`"
                  + (f", of models trained on {'; '.join(machines)}" if machines else "") + ".", "",
                  *markdown_table(["model", *(f"{s} read" for s in spans), "levels off after",
                                   "second half's gain"], rows), "",
                  f"One position's loss scatters by {scatter[0]:.2f}-{scatter[-1]:.2f} nats with the tokens that "
                  "happen to sit there (its sd over the window's second half), so a bin's sd is that over the root "
                  f"of its width. A model levels off after the tokens read where its bins stop differing from the "
                  f"last one by more than {LEVEL_SDS:g} sds of the gap; the second half's gain is the "
                  f"{spans[-2]} bin less the {spans[-1]} one, ± {LEVEL_SDS:g} sds. A bin of one position shows "
                  f"only gaps above about {LEVEL_SDS * scatter[-1]:.2f} nats, so a model's levelling off within the "
                  "first few tokens read is as early as this reading can place it. "
                  + _context_reading(order, named), "", "![Loss by context position](figures/position.png)", ""]
    if stale:
        lines += [f"Not shown: {', '.join(stale)}: no curve of the training that made the model now "
                  "(`python -m flows.position` scores them).", ""]
    return lines


def _context_reading(order: list, named) -> str:
    """One sentence: which models keep using their context longest, and whether any still gains (or does worse)
    in the window's second half beyond noise."""
    longest = [c for c in order if c.levels_off_at == order[0].levels_off_at]
    gains = [named(c) for c in order if c.late_gain[0] > LEVEL_SDS * c.late_gain[1]]
    rises = [named(c) for c in order if -c.late_gain[0] > LEVEL_SDS * c.late_gain[1]]
    late = ([f"{', '.join(gains)} still gain{'s' if len(gains) == 1 else ''} in the window's second half"] if gains
            else []) + ([f"{', '.join(rises)} {'does' if len(rises) == 1 else 'do'} worse there than before it"]
                        if rises else [])
    return (f"Gaining longest: {' and '.join(named(c) for c in longest)}, up to {longest[0].levels_off_at} tokens "
            "read; " + ("; ".join(late) if late else "no model gains or loses beyond noise in the window's second "
                        "half") + ".")


def weat_adjusted_p(results: dict) -> dict[str, float]:
    """Benjamini-Hochberg adjusted p-values (scipy) over the tests a model could run: {test: q}."""
    from scipy.stats import false_discovery_control

    ran = sorted(t for t, r in results.items() if r.get("p_value") is not None)
    if not ran:
        return {}
    return dict(zip(ran, (float(q) for q in false_discovery_control([results[t]["p_value"] for t in ran]))))


def _weat_section(weat, details=None, effects: dict | None = None) -> list[str]:
    """One row per test (named), one column per model: narrow enough for a page; where seeds/weat.csv holds a
    model's seeds (`effects`), each cell gives the effect size over them, and whether it lies beyond their noise."""
    lines = ["## Bias audit (WEAT)", ""]
    if not weat:
        return lines + ["The audit stage has not run yet."]
    models = list(weat["models"])
    tests = sorted({t for m in weat["models"].values() for t in m}, key=lambda t: (len(t), t))
    some = (details or {}).get("models", {}).get(models[0], {})
    adjusted = {name: weat_adjusted_p(weat["models"][name]) for name in models}
    ran = {name: len(a) for name, a in adjusted.items()}
    counts = (f"{next(iter(ran.values()))} for every model" if len(set(ran.values())) == 1
              else ", ".join(f"{n} for {m}" for m, n in ran.items()))
    lines += [f"{len(tests)} tests per model; a test runs where each of its word sets keeps `audit.min_words` words in "
              f"the training text; tests that ran: {counts}. Each cell: effect "
              "size d, its one-sided permutation p-value, and q, the p-value adjusted for the tests that model ran "
              "(Benjamini-Hochberg): read a test as significant only where q < 0.05. Where a test could not run, the "
              "words each set X/Y/A/B kept. Which words were kept or dropped, with their counts: "
              "`reports/weat_words.json`.", ""]
    rows = []
    for t in tests:
        cells = []
        for name in models:
            r = weat["models"][name].get(t, {})
            if r.get("effect_size") is not None:
                over = (effects or {}).get(name, {}).get(t)
                cells.append(f"{r['effect_size']:.2f} (p={r['p_value']:.3f}, q={adjusted[name][t]:.3f})"
                             + (f"; seeds {over.text()}" if over else ""))
            else:
                cells.append("n/a [" + "/".join(str(r.get(f"{role}_words", "?")) for role in "xyab") + "]")
        title = some.get(t, {}).get("title")
        rows.append([f"{t}: {title}" if title else t, *cells])
    lines += markdown_table(["test", *models], rows)
    seeded = sorted(n for n in models if (effects or {}).get(n))
    if seeded:
        lines += ["", f"Over the seeds (seeds/weat.csv: {', '.join(seeded)}): the mean effect size ± its sd; an effect "
                      f"is the model's only where the mean lies more than {seed_spread.REAL_GAP_SDS:g} sds from zero "
                      "(beyond noise); within noise, its sign in one run, this one included, is the seed's and the "
                      "machine's rounding, not the model's."]
    else:
        lines += ["", "No seed spread of the effect sizes yet (`lmpipe seeds` audits every seed's model): a single "
                      "run's effect size moves with its seed and its machine's rounding far more than its bpb does."]
    if weat.get("word_form"):
        lines += ["", f"Word vectors: {weat['word_form']}."]
    return lines


def dvc_plots_template(vega_lite: str = "5.21") -> str:
    """The page `dvc plots show` fills (`.dvc/config` plots.html_template) with Vega, Vega-Lite and vega-embed inlined
    from vl-convert's bundle (BSD-3-Clause), so every plot draws offline; DVC's own page loads them from a CDN."""
    import vl_convert

    bundle = vl_convert.javascript_bundle(vl_version=vega_lite)  # sets window.vegaEmbed, which DVC's plot divs call
    return ("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n{refresh_tag}\n<title>lmpipe plots</title>\n"
            f"<script>{bundle}</script>\n<style>table {{ border-spacing: 15px; }}</style>\n</head>\n"
            "<body>\n{plot_divs}\n</body>\n</html>\n")


def build_report(root: str | Path, out_dir: str | Path, models: list[str] | None = None,
                 experiment: str | None = None, study_seed: int | None = None, *, label: str,
                 made_from: str | None = None, budget_flops: float | None = None,
                 budget_exceptions: Sequence[str] = (), grid_stale: Sequence[str] = ()) -> Path:
    """Write study.md, study.html and figures/ under `out_dir` from the metrics under `root`;
    `models` (params.yaml's) limits the per-model files read, so a removed model's leftovers never show;
    `experiment` names the `dvc exp run` that made them, so its report never passes for the study's; `study_seed`
    (train.seed) picks the study's own run out of seeds/seeds.csv; `label` names the n-gram baseline; `made_from`
    names the settings and data at the top; `budget_flops` (study.budget) is the compute every neural model
    should have had, `budget_exceptions` the models with epochs or a budget of their own: a model that had other compute is
    marked and left out of the verdicts; `grid_stale` names what the scaling grid was made from that the study no
    longer is (lmpipe.grid_record.changed_since), so the report does not compare with it."""
    root, out_dir = Path(root), Path(out_dir)
    figure_dir = out_dir / "figures"
    figure_dir.mkdir(parents=True, exist_ok=True)
    results = load_results(root, models, study_seed, budget_flops, budget_exceptions)
    evaluation, combined, trained, unmatched = results.evaluation, results.combined, results.trained, results.unmatched
    corpus, validation = read_json(root / paths.CORPUS_METRICS), read_json(root / paths.VALIDATION_METRICS)
    tokenize = read_json(root / paths.TOKENIZE_METRICS)
    weat, weat_words = read_json(root / paths.WEAT), read_json(root / paths.WEAT_WORDS)
    curves = _curves(root / paths.CURVES)
    if models is not None:
        curves = {name: rows for name, rows in curves.items() if name in models}
    points = annealed(trained)
    write_text(root / paths.COMPUTE_CURVES, compute_curves_csv(curves, points))
    lines = ["# lmpipe study", ""]
    if experiment:
        lines += [f"**Experiment `{experiment}`** (`dvc exp run`): these are its results, not the study's committed "
                  "ones (`dvc exp show` compares them).", ""]
    spreads, stale = results.spreads, results.stale
    answer = answer_lines(spreads, combined, evaluation, label, unmatched) if evaluation else []
    for line in answer + [compute_line(trained, budget_flops, unmatched)]:  # the answer first, one paragraph a line
        lines += [line, ""] if line else []
    if made_from:
        lines += [f"Made from {made_from}. Each MLflow run of the study names the code's commit.", ""]
    if evaluation:
        lines += _perplexity_section(evaluation, trained, label, unmatched, spreads) + [""]
        bpb_figure(spreads, figure_dir / "bpb.png", label)
        lines += ["![Test bits per byte](figures/bpb.png)", ""]
        if combined:
            lines += _combine_section(combined, evaluation, label, unmatched) + [""]
    lines += _corpus_section(corpus, validation, tokenize) + [""]
    if evaluation:
        families = {name: t.get("family", "") for name, t in trained.items()}
        held = [r for r in seed_spread.read_rows(root / paths.SEEDS) if r["model"] in spreads and r["model"] not in stale]
        better = tuned.better_found(root, paths.TUNING_AT_C, held, budget_flops) if budget_flops else []
        lines += _seeds_section(spreads, stale, label, unmatched, families, results.provenance, better) + [""]
    if points:
        at_c = {name: {rows[-1]["budget_flops"]: results.spreads[name].bpb_sd} for name, rows in points.items()
                if name in results.spreads and results.spreads[name].bpb_sd is not None}  # the seed spread at C
        sds = {name: at_c.get(name, {}) | results.budget_sds.get(name, {}) for name in points}
        ngram = evaluation["models"].get(BASELINE, {}).get("test", {}).get("bpb") if evaluation else None
        fitted = grid_fits(results.scaling, grid_stale)
        compute_figure(points, sds, (label, ngram) if ngram else None, figure_dir / "compute.png", *fitted)
        lines += compute_section(points, sds, "compute.png", results.scaling, grid_stale, fitted) + [""]
    if grid := against_grid(points, results.scaling, grid_stale):
        lines += grid + [""]
    if curves:
        baseline = evaluation["models"].get(BASELINE, {}).get("valid", {}).get("bpb") if evaluation else None
        learning_curves_figure(curves, baseline, figure_dir / "learning_curves.png", label)
        lines += ["## Learning curves", "", "Validation bits per byte at every evaluation, against epochs and against "
                  f"the training FLOPs spent so far; the dashed line is the {label} baseline on the same split.", "",
                  "![Learning curves](figures/learning_curves.png)", ""]
    if position := read_curves(root / paths.POSITION_CURVES):
        identities = {name: t.get("identity", "") for name, t in trained.items()}
        shown, missing = current(position, {BASELINE: baseline_identity(evaluation), **identities})
        if shown:
            position_figure(shown, figure_dir / "position.png", label)
        lines += _position_section(shown, missing, label)
    samples = root / paths.SAMPLES
    if samples.exists():
        lines += condensed_samples(samples.read_text(encoding="utf-8")) + [""]
    lines += _weat_section(weat, weat_words, results.weat_effects if evaluation else None)
    text = "\n".join(lines) + "\n"
    (out_dir / "study.md").write_text(text, encoding="utf-8")
    (out_dir / "study.html").write_text(html_page(text, out_dir, "lmpipe study"), encoding="utf-8")
    return out_dir / "study.md"
