"""`lmpipe diff [A] [B]`: how each model's test bpb moved between two versions of the study, judged against its seed
noise by the report's rule (a gap is real beyond REAL_GAP_SDS times the larger seed sd), with the compute each side
had. `dvc metrics diff` and MLflow's compare give the raw deltas; this says which of them mean something.

A side is a git revision, a DVC experiment's name (`dvc exp show` lists them), or the workspace; it is read from the
per-model rows `dvc metrics show` prints (metrics/models/, lmpipe.summaries: test bpb, its seed sd, training
TFLOPs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lmpipe import paths, summaries
from lmpipe.paths import BASELINE
from lmpipe.errors import LmpipeError
from lmpipe.git import git_or_empty
from lmpipe.tables import markdown_table
from lmpipe.stats import REAL_GAP_SDS, beyond_noise

WORKSPACE = "workspace"
COMPUTE_MATCH = 0.01  # the report's rule: compute within 1% is the same budget


def resolve(side: str, root: Path) -> str:
    """The commit of a revision or of a DVC experiment's name; WORKSPACE as itself; else one line."""
    if side == WORKSPACE:
        return side
    commit = git_or_empty("rev-parse", "--verify", "--quiet", f"{side}^{{commit}}", cwd=root)
    if commit:
        return commit
    refs = git_or_empty("for-each-ref", "--format=%(objectname) %(refname)", "refs/exps", cwd=root).splitlines()
    named = [ref.split()[0] for ref in refs if ref.split()[1].rsplit("/", 1)[-1] == side]
    if len(named) == 1:
        return named[0]
    raise LmpipeError(f"{side}: neither a git revision nor a DVC experiment of this repository (dvc exp show lists "
                      f"them; {WORKSPACE} is the working tree)" if not named else
                      f"{side}: {len(named)} DVC experiments have this name: give one's commit instead")


def rows(side: str, root: Path) -> dict[str, dict]:
    """{model: its metrics/models row} at `side` (a commit from `resolve`, or WORKSPACE)."""
    folder = paths.SUMMARIES
    if side == WORKSPACE:
        files = {p.stem: p.read_text() for p in sorted((root / folder).glob("*.json"))}
    else:
        names = git_or_empty("ls-tree", "--name-only", f"{side}:{folder}", cwd=root).split()
        files = {Path(n).stem: git_or_empty("show", f"{side}:{folder}/{n}", cwd=root) for n in names if n.endswith(".json")}
    if not files:
        raise LmpipeError(f"{side[:12]}: no {folder}/*.json there (a study before per-model rows, or none run yet)")
    return {summaries.model_of(stem): summaries.normalised(json.loads(text)) for stem, text in files.items()}


@dataclass(frozen=True)
class Change:
    model: str
    before: float | None  # test bpb
    after: float | None
    sd: float | None  # the larger seed sd of the two sides
    flops: tuple[float | None, float | None]  # training TFLOPs, each side

    @property
    def delta(self) -> float | None:
        return None if self.before is None or self.after is None else self.after - self.before

    @property
    def verdict(self) -> str:
        if self.before is None or self.after is None:
            return "only in " + ("B" if self.before is None else "A")
        if self.delta == 0:
            return "unchanged"
        if self.sd is None:
            return "no seed sd: run lmpipe seeds"
        if not beyond_noise(self.delta, self.sd):
            return "within noise"
        return "real: better" if self.delta < 0 else "real: worse"  # bits per byte: lower is better

    @property
    def matched(self) -> bool:
        a, b = self.flops
        return a is None or b is None or abs(a - b) <= COMPUTE_MATCH * max(a, b)


def changes(a: dict[str, dict], b: dict[str, dict]) -> list[Change]:
    """One Change per model of either side, the largest real change first."""
    out = []
    for model in sorted(set(a) | set(b)):
        ra, rb = a.get(model, {}), b.get(model, {})
        sds = [0.0] if model == BASELINE else [r["sd"] for r in (ra, rb) if r.get("sd") is not None]
        out.append(Change(model, ra.get("bpb"), rb.get("bpb"), max(sds) if sds else None,
                          (ra.get("tflop"), rb.get("tflop"))))
    return sorted(out, key=lambda c: (not c.verdict.startswith("real"), -abs(c.delta or 0.0), c.model))


def _number(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(found: list[Change], a: str, b: str, markdown: bool = False) -> str:
    """The changes as a table (Markdown with `markdown`, for a PR comment), with a line per warning below it."""
    head = ["model", f"test bpb {a}", f"test bpb {b}", "change", f"noise ({REAL_GAP_SDS:g} x sd)", "verdict",
            "TFLOPs A -> B"]  # the n-gram is deterministic: its sd is 0
    body = [[c.model, _number(c.before, ".4f"), _number(c.after, ".4f"), _number(c.delta, "+.4f"),
             _number(None if c.sd is None else REAL_GAP_SDS * c.sd, ".4f"), c.verdict,
             f"{_number(c.flops[0], '.1f')} -> {_number(c.flops[1], '.1f')}"] for c in found]
    if markdown:
        lines = markdown_table(head, body)
    else:
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *body]]
    unmatched = [c.model for c in found if not c.matched]
    if unmatched:
        lines += ["", f"Warning: not compute-matched ({', '.join(unmatched)}): the two sides trained with training "
                      "FLOPs more than 1% apart, so a change mixes the setting with the budget."]
    return "\n".join(lines)


def diff(a: str = "HEAD", b: str = WORKSPACE, root: str | Path = ".", markdown: bool = False) -> str:
    """The table of `lmpipe diff A B`."""
    root = Path(root)
    return table(changes(rows(resolve(a, root), root), rows(resolve(b, root), root)), a, b, markdown)
