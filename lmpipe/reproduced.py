"""`lmpipe reproduced`: did this machine's study reproduce the committed one? Per model and tracked result, the
committed number against this run's, the difference, the model's seed sd, and the verdict by the one rule
(lmpipe.seeds.reproduction): bit for bit, within noise (no more than REAL_GAP_SDS seed sds away) or differs; the
machines each side was made on; and the one command that keeps this machine's numbers as the study's.

The seed sd is the committed seeds/seeds.csv's (sd over a model's seeds); the n-gram has none (it is exact: the same
counts give the same model), so only bit for bit holds for it.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from lmpipe import paths
from lmpipe.paths import BASELINE
from lmpipe.git import git_or_empty
from lmpipe.seeds import BIT_FOR_BIT, DIFFERS, reproduction, split_sds
from lmpipe.results import machines_of, machines_text
from lmpipe.tables import markdown_table

KEPT = ("dvc.lock", "metrics", "plots", "reports", "seeds")  # where a study writes what git holds


def committed_json(path: str, rev: str, root: Path) -> dict:
    text = git_or_empty("show", f"{rev}:{path}", cwd=root)
    return json.loads(text) if text else {}


def workspace_json(path: str, root: Path) -> dict:
    file = root / path
    return json.loads(file.read_text()) if file.exists() else {}


def results(evaluation: dict, trained: dict[str, dict], model: str) -> dict[str, float]:
    """The tracked numbers of one model: its valid and test bpb as scored, and (a neural model) its training's own
    valid bpb, which a retrained model rewrites even where DVC skips its scoring (the verdict weighs all three)."""
    scored = evaluation.get("models", {}).get(model, {})
    found = {f"{split} bpb": scored[split]["bpb"] for split in ("valid", "test") if split in scored}
    if "valid_bpb" in trained.get(model, {}):
        found["trained valid bpb"] = trained[model]["valid_bpb"]
    return found


def seed_sds(rev: str, root: Path) -> dict[str, dict[str, float | None]]:
    """{model: the sd of its valid and of its test bpb over the committed seeds} (lmpipe.seeds.split_sds)."""
    by_model: dict[str, list[dict]] = {}
    for r in csv.DictReader(io.StringIO(git_or_empty("show", f"{rev}:{paths.SEEDS}", cwd=root))):
        by_model.setdefault(r["model"], []).append({k: float(r[k]) for k in ("valid_bpb", "test_bpb") if r.get(k)})
    return {m: split_sds(rows) for m, rows in by_model.items()}


def compare(rev: str = "HEAD", root: str | Path = ".") -> tuple[list[dict], dict[str, list[tuple[str, str]]]]:
    """(a row per model: its committed and present numbers, its seed sd and the Reproduction of all its numbers
    together; {side: [(machine, precision)]} each side was made on, as its training summaries record)."""
    root = Path(root)
    before, after = committed_json(paths.EVAL, rev, root), workspace_json(paths.EVAL, root)
    models = sorted(set(before.get("models", {})) & set(after.get("models", {})))
    trained = {side: {m: load(paths.train_metrics(m)) for m in models if m != BASELINE}
               for side, load in (("committed", lambda p: committed_json(p, rev, root)),
                                  ("this run", lambda p: workspace_json(p, root)))}
    sds = seed_sds(rev, root)
    rows = []
    for model in models:
        old, new = results(before, trained["committed"], model), results(after, trained["this run"], model)
        shared = sorted(set(old) & set(new))
        sd = 0.0 if model == BASELINE else sds.get(model, {})  # each number in its split's sd
        rows.append({"model": model, "committed": old, "now": new, "sd": sd if sd == 0.0 else sd.get("test"),
                     "verdict": reproduction({k: old[k] for k in shared}, {k: new[k] for k in shared}, sd)})
    machines = {side: machines_of(summaries.values()) for side, summaries in trained.items()}
    return rows, machines


def report(rows: list[dict], machines: dict, changed: list[str]) -> str:
    """The table (a row per model, best first), the machines, and what to do with this machine's numbers."""
    def delta(r: dict, name: str) -> str:
        return f"{r['now'][name] - r['committed'][name]:+.4f}" if name in r["now"] and name in r["committed"] else "-"

    table = markdown_table(
        ["model", "test bpb committed", "this run", "difference", "valid bpb difference", "seed sd", "verdict"],
        [[r["model"], f"{r['committed']['test bpb']:.4f}", f"{r['now']['test bpb']:.4f}", delta(r, "test bpb"),
          delta(r, "valid bpb"), "-" if r["sd"] is None else f"{r['sd']:.4f}", r["verdict"].text()]
         for r in sorted(rows, key=lambda r: r["committed"]["test bpb"])])
    where = "; ".join(f"{side} on {machines_text(pairs, 'an unrecorded machine')}" for side, pairs in machines.items())
    differs = [r["model"] for r in rows if r["verdict"].verdict == DIFFERS]
    if not rows:
        return "Nothing to compare: run the study first (make study)."
    if differs:
        verdict = (f"NOT reproduced: {', '.join(differs)} beyond noise of the committed numbers (more than twice "
                   "the seed sd; the n-gram, and a model without seeds, must match bit for bit).")
    elif all(r["verdict"].verdict == BIT_FOR_BIT for r in rows):
        verdict = "Reproduced bit for bit."
    else:
        verdict = "Reproduced within noise: every number within twice its model's seed sd of the committed one."
    lines = ["\n".join(table), "", f"Made: {where}.", verdict]
    if changed and not differs and verdict != "Reproduced bit for bit.":
        lines.append(f"These numbers are this machine's study ({len(changed)} tracked files changed); keep them with: "
                     f"git commit -m 'Study re-made here' -- {' '.join(KEPT)}")
    return "\n".join(lines)


def changed_files(root: Path) -> list[str]:
    status = git_or_empty("status", "--porcelain", "--untracked-files=no", "--", *KEPT, cwd=root)
    return [line[3:] for line in status.splitlines() if line.strip()]


def reproduced(rev: str = "HEAD", root: str | Path = ".") -> tuple[bool, str]:
    """(whether nothing differs, the text `lmpipe reproduced` prints)."""
    rows, machines = compare(rev, root)
    text = report(rows, machines, changed_files(Path(root)))
    return bool(rows) and not any(r["verdict"].verdict == DIFFERS for r in rows), text

