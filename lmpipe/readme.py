"""The README's results table, generated from the committed metrics (never typed by hand):

    python -m lmpipe.readme README.md       # rewrites the block between RESULTS_BEGIN and RESULTS_END
"""

from __future__ import annotations

from pathlib import Path

from lmpipe.compare import CACHE, baseline_label, best_model, gap_header, gap_text, without_cache
from lmpipe.paths import BASELINE
from lmpipe.config import load_params
from lmpipe.tables import markdown_table
from lmpipe.report import row_label
from lmpipe.results import load_results, machines_of, machines_text, si

RESULTS_BEGIN = "<!-- results: generated from metrics/ and seeds/seeds.csv by `python -m lmpipe.readme README.md` -->"
RESULTS_END = "<!-- end of results -->"
SOURCE_NOTE = ("Test bpb, word perplexity and the gap to the baseline are means over a model's seeds where it has them "
               "(seeds/seeds.csv), else its one run; the gap is the difference in bpb (negative: better), with the "
               "change in word perplexity in brackets.")


def results_markdown(root: str | Path, study_seed: int, label: str, budget_flops: float | None = None,
                     budget_exceptions: list[str] = ()) -> str:
    """The README's results table, from the committed metrics: each model's test bpb (mean ± sd where seeds
    hold), word perplexity and gap to the baseline from the same numbers, and its compute (a model off the study's
    budget marked); then the best combination."""
    results = load_results(root, None, study_seed, budget_flops, budget_exceptions)
    combined, trained, spreads, unmatched = results.combined, results.trained, results.spreads, results.unmatched
    lines = [f"Every neural model trained {si(budget_flops)} FLOPs (`study.budget`): the families compare at equal "
             "compute" + (f"; not compute-matched: {', '.join(unmatched)}." if unmatched else "."), ""] if budget_flops else []
    lines += [SOURCE_NOTE, ""]
    if machines := machines_text(machines_of(trained.values())):
        lines += [f"Trained on {machines}. A study re-made on another machine gives other last digits: on the "
                  "machines tried it landed within seed noise of these (docs/benchmarks.md); `lmpipe reproduced` "
                  "says how far, model by model.", ""]
    rows = []
    for name in sorted(spreads, key=lambda n: spreads[n].bpb):
        t, s = trained.get(name, {}), spreads[name]
        bpb = f"{s.bpb:.3f}" + (f" ± {s.bpb_sd:.3f} ({s.n} seeds)" if s.n > 1 else "")
        versus = "-" if name == BASELINE else gap_text(s, spreads[BASELINE])
        compute = ([f"{t['tokens_seen']:,} ({t['epochs']:.1f} ep.)", si(t["train_flops"])] if "train_flops" in t
                   else ["-", "-"])
        rows.append([row_label(name, unmatched), bpb, f"{s.word_ppl:,.0f}", versus, *compute])
    lines += markdown_table(["model", "test bpb", "test word ppl", gap_header(label), "tokens seen",
                             "train FLOPs"], rows)
    if combined and combined["models"]:
        best = best_model(combined["models"])
        c = combined["models"][best]
        lines += ["", f"Best combination: {best}, test {c['test']['bpb']:.3f} bpb, word ppl {c['test']['word_ppl']:,.0f} "
                      f"(weights fitted on valid: " + ", ".join(f"{m} {w:.2f}" for m, w in c["weights"].items()) + ")."]
        trained = without_cache(combined["models"])
        if "cache_window" in c and trained:  # the cache is no trained model: the best without it too
            alone = best_model(trained)
            lines[-1] += (f" `{CACHE}` is a unigram cache of the last {c['cache_window']} tokens; without it, the best "
                          f"is {alone}: {trained[alone]['test']['bpb']:.3f} bpb.")
    return "\n".join(lines) + "\n"


def sync_results(readme: str | Path, root: str | Path = ".", params_file: str | Path = "params.yaml") -> bool:
    """Rewrite the results block of `readme` from the metrics under `root`; True when it changed."""
    params = load_params(params_file)
    path = Path(readme)
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(RESULTS_BEGIN, 1)
    _, tail = rest.split(RESULTS_END, 1)
    block = results_markdown(root, params.train.seed, baseline_label(params.ngram), params.study.flops,
                             params.budget_exceptions())
    new = f"{head}{RESULTS_BEGIN}\n{block}{RESULTS_END}{tail}"
    path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    import sys

    print("changed" if sync_results(sys.argv[1] if len(sys.argv) > 1 else "README.md") else "up to date")
