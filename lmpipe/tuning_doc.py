"""docs/tuning.md, written from the committed outcome of every sweep in `sweeps/` and the transformer's ablation
tables: what each sweep searched and found, each family's tuning effort, the ablations. Prose only: the sweeps
themselves (spaces, Optuna, the trials' table and figure) are lmpipe.sweep's."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from lmpipe import paths, stats, tuned
from lmpipe.io import csv_records
from lmpipe.sweep import SPACE_FILE, winner_spread
from lmpipe.tables import markdown_table

ABLATIONS = "benchmarks/results/transformer_ablation*.csv"  # benchmarks/transformer_ablation.py's tables


def _ablation_flops(settings: str) -> float | None:
    """An ablation row's training FLOPs, from the budget that opens its settings column."""
    budget = re.match(r"budget=\{flops: ([^}]+)\}", settings)
    return float(budget[1]) if budget else None


def _recipe(settings: str) -> dict:
    """An ablation row's settings column as {key: value}, the budget left out; a later value of a key wins."""
    return dict(item.split("=", 1) for item in re.sub(r"^budget=\{[^}]*\}\s*", "", settings).split())


def ablation_markdown(tables: list[Path]) -> list[str]:
    """The transformer ablations (benchmarks/transformer_ablation.py), one table per FLOP budget, from their CSVs."""
    if not tables:
        return []
    lines = ["## The transformer, one modern part at a time", "",
             "Written from the CSVs of `benchmarks/transformer_ablation.py`: each row trains `models.transformer` (4 x 64,",
             "128-token window) with the recipe in the CSV for the same training FLOPs and scores valid and test as the",
             "evaluate stage does, one seed (`train.seed`). Two rows ran side by side on one thread each, so a row's",
             "seconds depend on what ran beside it; its bpb does not. The machine and precision of each table, and",
             "what was decided from it: [sweeps/notes.md](../sweeps/notes.md).", ""]
    for path in tables:
        rows = csv_records(path)
        if not rows:
            continue
        first = float(rows[0]["valid_bpb"])
        base = _recipe(rows[0]["settings"])
        table = []
        for r in rows:
            settings = " ".join(f"`{k}={v}`" for k, v in _recipe(r["settings"]).items() if base.get(k) != v) or "(none)"
            table.append([r["row"], settings, f"{float(r['valid_bpb']):.4f}", f"{float(r['valid_bpb']) - first:+.4f}",
                          f"{float(r['test_bpb']):.4f}", f"{float(r['train_seconds']):.0f}"])
        flops = _ablation_flops(rows[0]["settings"])
        lines += [f"### {flops:.1e} training FLOPs ([{path.name}](../{path.as_posix()}))", ""]
        lines += markdown_table(["row", "settings other than the first row's", "valid bpb", "vs first row",
                                 "test bpb", "train s"], table) + [""]
    return lines


def sweep_outcomes(sweeps_dir: str | Path) -> list[tuple[Path, Path]]:
    """(outcome folder, its space file) of every committed sweep: sweeps/<model> of sweeps/space.yaml, and
    sweeps/<space>/<model> of sweeps/<space>.yaml."""
    sweeps_dir = Path(sweeps_dir)
    found = []
    for trials in sorted(sweeps_dir.glob("*/trials.csv")) + sorted(sweeps_dir.glob("*/*/trials.csv")):
        folder = trials.parent
        space_file = (Path(SPACE_FILE) if folder.parent == sweeps_dir
                      else sweeps_dir / f"{folder.parent.name}.yaml")
        found.append((folder, space_file))
    return found


def grid_summary(outcomes: list[tuple[Path, Path]], space_file: Path, seeds_file: Path | None = None) -> list[str]:
    """One row per model of a grid sweep: every point tried (its values, in the order of the settings) with its valid
    bpb, the best in bold, set beside the study's own run of that model at C (the mean and sd of its seeds in
    `seeds_file`, seeds/seeds.csv): a sweep of one point is a comparison with it, and the gap says whether the point
    is better beyond noise (more than twice the seeds' sd)."""
    spaces = yaml.safe_load(space_file.read_text()) or {} if space_file.exists() else {}
    studied = tuned.valid_by_model(csv_records(seeds_file) if seeds_file and seeds_file.exists() else [])
    rows = []
    for folder, file in outcomes:
        space = spaces.get(folder.name) or {}
        if file != space_file or not all("choices" in spec for spec in (space.get("space") or {"-": {}}).values()):
            continue  # not a grid
        trials = [r for r in csv_records(folder / "trials.csv") if r["state"] == "COMPLETE"]
        keys = [k for k in trials[0] if k not in tuned.NOT_SETTINGS] if trials else []
        if not keys:
            continue
        best = min(trials, key=lambda r: float(r["valid_bpb"]))
        tried = sorted(trials, key=lambda r: [_number_or_text(r[k]) for k in keys])
        cells = [f"{'**' if r is best else ''}{', '.join(_shown(r[k]) for k in keys)}: {float(r['valid_bpb']):.4f}"
                 f"{'**' if r is best else ''}" for r in tried]
        flops = {f"{float(r['train_flops']):.3g}" for r in tried}
        setting = ", ".join(f"`{k}`" for k in keys)
        rows.append([folder.name, setting, " · ".join(cells), *_beside_the_study(float(best["valid_bpb"]),
                                                                                  studied.get(folder.name, [])),
                     ", ".join(sorted(flops))])
    if not rows:
        return []
    return [f"### The same sweep for every model ({space_file.name})", "", *markdown_table(
        ["model", "setting", "value tried: valid bpb (best in bold)", "the study's run at C: valid bpb",
         "best tried minus the study's", "training FLOPs per trial"], rows), ""]


def _beside_the_study(best: float, seeds: list[float]) -> list[str]:
    """The study's run (its seeds' mean and sd) and the best tried point's gap to it, judged by the seeds' sd."""
    if not seeds:
        return ["-", "-"]
    mean, sd = stats.mean_sd(seeds)
    if sd is None:
        return [f"{mean:.4f} (one seed)", f"{best - mean:+.4f} (no sd to judge it)"]
    verdict = ("beyond noise: more" if stats.beyond_noise(best - mean, sd) else "within noise: not more")
    return [f"{mean:.4f} ± {sd:.4f} ({len(seeds)} seeds)",
            f"{best - mean:+.4f} ({verdict} than {stats.REAL_GAP_SDS:g} x sd {sd:.4f})"]


def effort(outcomes: list[tuple[Path, Path]], ablations: list[Path]) -> dict[str, dict]:
    """{family: {runs, flops, settings, sources}}: how much tuning each family's settings came from, the runs of its
    sweeps and (the transformer's) ablations, their training FLOPs and the settings they varied. Reruns of a winner
    with other seeds are not counted: they measure noise, they choose nothing."""
    counted: dict[str, dict] = {}

    def add(model: str, source: str, runs: int, flops: float, settings: list[str]) -> None:
        entry = counted.setdefault(model, {"runs": 0, "flops": 0.0, "settings": {}, "sources": []})
        entry["runs"] += runs
        entry["flops"] += flops
        entry["settings"].update(dict.fromkeys(settings))
        entry["sources"].append(f"{source} ({runs})")

    for folder, _ in outcomes:
        trials = csv_records(folder / "trials.csv")
        varied = [k for k in (trials[0] if trials else {}) if "." in k or k == "batch_size"]
        add(folder.name, folder.as_posix(), len(trials), sum(float(r["train_flops"] or 0) for r in trials), varied)
    for path in ablations:
        rows = csv_records(path)
        varied = list(dict.fromkeys(k for r in rows for k in _recipe(r["settings"])))
        add("transformer", path.as_posix(), len(rows), sum(_ablation_flops(r["settings"]) or 0.0 for r in rows), varied)
    return counted


def committed_effort(root: str | Path = ".") -> dict[str, dict]:
    """`effort` of the committed sweeps and ablations under `root`, as docs/tuning.md counts them."""
    ablations = Path(root) / ABLATIONS
    return effort(sweep_outcomes(Path(root) / "sweeps"), sorted(ablations.parent.glob(ablations.name)))


def effort_markdown(counted: dict[str, dict]) -> list[str]:
    """The effort per family (`effort`) as docs/tuning.md's table, most runs first, and whether it is equal."""
    if not counted:
        return []
    table = [[model, str(e["runs"]), f"{e['flops']:.2e}", ", ".join(f"`{k}`" for k in e["settings"]),
              ", ".join(e["sources"])] for model, e in sorted(counted.items(), key=lambda item: -item[1]["runs"])]
    fewest = min(e["runs"] for e in counted.values())
    return ["## Tuning effort per family", "",
            "The runs each family's settings were chosen from (every sweep trial and ablation row, pruned trials "
            "included; reruns of a winner with other seeds measure noise and are not counted), their training FLOPs "
            "and the settings they varied. Every family also has the scaling grid's sizes at every budget "
            "(`lmpipe scaling`), which tries widths alike for all. "
            + ("The effort is equal." if all(e["runs"] == fewest for e in counted.values()) else
               f"The effort is not equal: from {fewest} to {max(e['runs'] for e in counted.values())} runs. A family "
               "tuned over more settings may owe part of its lead to them: a gap no larger than what one of those "
               "settings moved its own loss is about tuning as much as about the family."), "",
            *markdown_table(["family", "runs", "training FLOPs", "settings varied", "from (runs)"], table), ""]


def _number_or_text(value: str) -> tuple:
    """A CSV cell as a sort key: numbers by value, before any text."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def _shown(value: str) -> str:
    kind, number, text = _number_or_text(value)
    return f"{number:g}" if kind == 0 else text


def tuning_markdown(sweeps_dir: str | Path) -> str:
    """docs/tuning.md: per swept model its space, trials, the best settings and the seed spread of the winner."""
    sweeps_dir = Path(sweeps_dir)
    lines = ["# Tuning", "",
             "Written by `lmpipe sweep` (flows/sweep.py) from the committed outcome of each sweep in `sweeps/`.",
             "Each trial trains one model of `params.yaml` with some settings drawn from a space file by Optuna",
             "(TPE seeded from the trial number; a space of choices only is a grid, every point once), for a fixed",
             "budget of tokens or training FLOPs - never seconds - so a sweep re-runs to the same trials. Hyperband",
             "stops trials whose validation bits per byte (bpb) trail at an evaluation, where the space allows it.",
             "A winner retrained with other seeds at the same budget says how much of a margin is noise.", "",
             "**One set of settings per family, at every budget.** Each family's settings were chosen at the study's "
             "budget C (the equal-compute sweeps below) and are used unchanged at the smaller budgets C/k that the "
             "study's decay branches give (`study.branches`): a branch is its run up to its decay start, so it "
             "cannot have settings of its own. What that may cost the smaller budgets: a width chosen for C is "
             "likely too wide for C/16 (the NPLM at C was 0.14 bpb better at half its width: an optimum moves "
             "with compute), and a rate tuned for a long stable phase may not be the best for a short one. So "
             "an annealed point below C is an upper bound on that family's best loss at that budget; the scaling "
             "grid (`lmpipe scaling`), which sizes each run for its budget, gives the other side.", ""]
    outcomes = sweep_outcomes(sweeps_dir)
    ablations = sorted(Path(ABLATIONS).parent.glob(Path(ABLATIONS).name))
    lines += effort_markdown(effort(outcomes, ablations))
    for space_file in dict.fromkeys(file for _, file in outcomes):
        spaces = yaml.safe_load(space_file.read_text()) or {} if space_file.exists() else {}
        lines += [f"## Sweeps of [{space_file.as_posix()}](../{space_file.as_posix()})", ""]
        lines += _leading_comment(space_file)
        lines += grid_summary(outcomes, space_file, sweeps_dir.parent / paths.SEEDS)
        for folder, _ in (o for o in outcomes if o[1] == space_file):
            lines += _sweep_section(folder, spaces.get(folder.name, {}))
    lines += ablation_markdown(ablations)
    if (sweeps_dir / "notes.md").exists():  # hand-kept, dated: linked, never copied (a copy goes stale)
        lines += ["## Probes outside the sweeps", "", "Single runs outside the sweeps, ablations, and why each default "
                  f"is what it is: the dated log [{sweeps_dir.name}/notes.md](../{sweeps_dir.name}/notes.md).", ""]
    return "\n".join(lines) + "\n"


def _leading_comment(space_file: Path) -> list[str]:
    """What a space file says of itself: its first comment block, as a paragraph."""
    said = []
    for line in space_file.read_text(encoding="utf-8").splitlines() if space_file.exists() else []:
        if not line.startswith("#"):
            break
        said.append(line.lstrip("#").strip())
    return [" ".join(said).strip(), ""] if any(said) else []


def _sweep_section(folder: Path, space: dict) -> list[str]:
    model, rel = folder.name, folder.as_posix()
    rows, seeds = csv_records(folder / "trials.csv"), csv_records(folder / "seeds.csv")
    best_yaml = (folder / "best.yaml").read_text() if (folder / "best.yaml").exists() else ""
    states = [r["state"] for r in rows]
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    best = min(complete, key=lambda r: float(r["valid_bpb"])) if complete else None
    lines = [f"### {model} ({rel})", "",
             f"{len(rows)} trials ({states.count('COMPLETE')} complete, {states.count('PRUNED')} pruned); "
             f"budget per trial: {_describe_budget(space.get('budget') or {})}.", ""]
    lines += markdown_table(["setting", "searched"],
                            [[f"`{k}`", _describe_range(v)] for k, v in (space.get("space") or {}).items()])
    if best:
        lines += ["", f"Best: trial {best['number']}, valid bpb **{float(best['valid_bpb']):.4f}**."]
    if best and best_yaml:
        lines += ["", "```yaml", best_yaml.strip(), "```"]
    if seeds:
        values = [float(best["valid_bpb"])] + [float(r["valid_bpb"]) for r in seeds]
        spread = winner_spread(values)
        lines += ["", f"Seed spread of the winner ({spread['n']} seeds: {', '.join(f'{v:.4f}' for v in values)}): "
                      f"mean {spread['mean']:.4f}, standard deviation {spread['std']:.4f}, "
                      f"range {spread['max'] - spread['min']:.4f} bpb."]
    if (folder / "trials.png").exists():
        lines += ["", f"![valid bpb per trial of {model}](../{rel}/trials.png)"]
    return lines + [""]


def _describe_budget(budget: dict) -> str:
    return ", ".join(f"{float(v):.3g} training {k}" for k, v in budget.items()) or "not given"


def _describe_range(spec: dict) -> str:
    if "choices" in spec:
        return "one of " + ", ".join(str(c) for c in spec["choices"])
    return f"{spec['low']} to {spec['high']}" + (" (log scale)" if spec.get("log") else "")
