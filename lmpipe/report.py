"""The study report: one Markdown file and a self-contained HTML twin (figures embedded), from the metrics files."""

from __future__ import annotations

import base64
import csv
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import markdown  # noqa: E402

BASELINE = "ngram"


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _curves(plots_dir: Path) -> dict[str, list[dict]]:
    curves = {}
    for path in sorted(plots_dir.glob("*.csv")):
        with open(path) as f:
            curves[path.stem] = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return curves


def learning_curves_figure(curves: dict, baseline_ppl: float | None, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in curves.items():
        ax.plot([r["epoch"] for r in rows], [r["valid_ppl"] for r in rows], marker="o", label=name)
    if baseline_ppl:
        ax.axhline(baseline_ppl, color="gray", linestyle="--", label="n-gram (KN-5) valid")
    ax.set(xlabel="epoch", ylabel="valid perplexity (per BPE token)", yscale="log", title="Learning curves")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def perplexity_figure(models: dict, out: Path) -> None:
    names = sorted(models, key=lambda n: models[n]["test"]["word_ppl"])
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5))
    colours = ["gray" if n == BASELINE else "tab:blue" for n in names]
    ax.barh(names, [models[n]["test"]["word_ppl"] for n in names], color=colours)
    ax.set(xlabel="test word perplexity (lower is better)", xscale="log", title="Test perplexity per word")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def weat_heatmap(results: dict, out: str | Path) -> None:
    """Models x tests, effect size as colour; '*' marks p < 0.05, grey cells lacked coverage."""
    import numpy as np

    models = list(results)
    tests = sorted({t for r in results.values() for t in r}, key=lambda t: (len(t), t))
    grid = np.array([[results[m].get(t, {}).get("effect_size") or np.nan for t in tests] for m in models], dtype=float)
    fig, ax = plt.subplots(figsize=(1.0 * len(tests) + 2, 0.5 * len(models) + 1.5))
    cmap = plt.get_cmap("RdBu_r").copy()
    cmap.set_bad("lightgray")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-2, vmax=2)
    for i, m in enumerate(models):
        for j, t in enumerate(tests):
            r = results[m].get(t, {})
            if r.get("effect_size") is not None:
                mark = "*" if r["p_value"] < 0.05 else ""
                ax.text(j, i, f"{r['effect_size']:.2f}{mark}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(tests)), tests, rotation=45, ha="right")
    ax.set_yticks(range(len(models)), models)
    ax.set_title("WEAT effect size (* p < 0.05; grey: insufficient coverage)")
    fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _corpus_section(corpus, validation, tokenize) -> list[str]:
    lines = ["## Corpus", ""]
    if corpus:
        lines += [f"Source: `{corpus['source']}`.", "", "| split | articles | lines | words | chars |", "|---|---|---|---|---|"]
        lines += [f"| {s} | {v['articles']} | {v['lines']} | {v['words']} | {v['chars']} |" for s, v in corpus["splits"].items()]
    if validation:
        verdict = "passed" if validation["success"] else f"FAILED ({validation['failed']} failures)"
        lines += ["", f"Validation (Great Expectations): {validation['evaluated']} expectations, {verdict}."]
    if tokenize:
        lines += ["", "## Tokenizer", "",
                  f"Byte-level BPE, vocabulary {tokenize['vocab_size']}; tokens per word: "
                  + ", ".join(f"{s} {tokenize['tokens'][s] / tokenize['words'][s]:.2f}" for s in tokenize["tokens"]) + "."]
    return lines


def _perplexity_section(evaluation) -> list[str]:
    models = evaluation["models"]
    names = sorted(models, key=lambda n: models[n]["test"]["word_ppl"])
    lines = ["## Perplexity", "", "Sorted by test word perplexity; the same total loss normalised per BPE token, "
             "per whitespace word and per UTF-8 byte, so the n-gram and the neural models compare fairly.", "",
             "| model | params | valid ppl | test ppl | test word ppl | test bits/byte |", "|---|---|---|---|---|---|"]
    for n in names:
        r = models[n]
        label = f"{n} (baseline)" if n == BASELINE else n
        lines.append(f"| {label} | {r['n_params']:,} | {r['valid']['ppl']:.1f} | {r['test']['ppl']:.1f} | "
                     f"{r['test']['word_ppl']:.1f} | {r['test']['bpb']:.3f} |")
    if BASELINE in models:
        best = next(n for n in names if n != BASELINE) if len(names) > 1 else None
        if best:
            beats = models[best]["test"]["word_ppl"] < models[BASELINE]["test"]["word_ppl"]
            lines += ["", f"Best neural model: **{best}**, which {'beats' if beats else 'does not beat'} the "
                          f"Kneser-Ney baseline on test word perplexity."
                      + ("" if beats else " The learning curves below show how far training got in the budget.")]
    return lines


def _weat_section(weat) -> list[str]:
    lines = ["## Bias audit (WEAT)", ""]
    if not weat:
        return lines + ["The audit stage has not run yet."]
    tests = sorted({t for m in weat["models"].values() for t in m}, key=lambda t: (len(t), t))
    lines += ["Effect size d (one-sided permutation p) and words used per set X/Y/A/B; a test runs only when "
              "every set keeps enough words of the training text.", "",
              "| model | " + " | ".join(tests) + " |", "|---" * (len(tests) + 1) + "|"]
    for name, results in weat["models"].items():
        cells = []
        for t in tests:
            r = results.get(t, {})
            used = "/".join(str(r.get(f"{role}_words", "?")) for role in "xyab")
            if r.get("effect_size") is not None:
                cells.append(f"{r['effect_size']:.2f} (p={r['p_value']:.3f}) [{used}]")
            else:
                cells.append(f"{r.get('status', 'n/a')} [{used}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if weat.get("word_form"):
        lines += ["", f"Word vectors: {weat['word_form']}."]
    return lines


def build_report(root: str | Path, out_dir: str | Path) -> Path:
    """Write study.md, study.html and figures/ under `out_dir` from the metrics under `root`."""
    root, out_dir = Path(root), Path(out_dir)
    figures = out_dir / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    corpus, validation = _read_json(root / "metrics/corpus.json"), _read_json(root / "metrics/validation.json")
    tokenize, evaluation = _read_json(root / "metrics/tokenize.json"), _read_json(root / "metrics/eval.json")
    weat = _read_json(root / "metrics/weat.json")
    curves = _curves(root / "plots/train")
    lines = ["# lmpipe study", ""] + _corpus_section(corpus, validation, tokenize) + [""]
    if evaluation:
        lines += _perplexity_section(evaluation) + [""]
        perplexity_figure(evaluation["models"], figures / "perplexity.png")
        lines += ["![Test word perplexity](figures/perplexity.png)", ""]
    if curves:
        baseline = evaluation["models"].get(BASELINE, {}).get("valid", {}).get("ppl") if evaluation else None
        learning_curves_figure(curves, baseline, figures / "learning_curves.png")
        lines += ["## Learning curves", "", "![Learning curves](figures/learning_curves.png)", ""]
    samples = root / "reports/samples.md"
    if samples.exists():
        lines += [re.sub(r"^(#+) ", r"#\1 ", samples.read_text(), flags=re.M)]  # one level down
    lines += _weat_section(weat)
    heatmap = root / "plots/weat/heatmap.png"
    if weat and heatmap.exists():
        (figures / "weat.png").write_bytes(heatmap.read_bytes())
        lines += ["", "![WEAT heatmap](figures/weat.png)"]
    text = "\n".join(lines) + "\n"
    (out_dir / "study.md").write_text(text, encoding="utf-8")
    html = markdown.markdown(text, extensions=["tables"])
    html = re.sub(r'src="(figures/[^"]+\.png)"', lambda m: 'src="data:image/png;base64,'
                  + base64.b64encode((out_dir / m.group(1)).read_bytes()).decode() + '"', html)
    style = "body{font-family:sans-serif;max-width:960px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
    (out_dir / "study.html").write_text(f"<!doctype html><meta charset='utf-8'><title>lmpipe study</title>"
                                        f"<style>{style}</style>{html}", encoding="utf-8")
    return out_dir / "study.md"
