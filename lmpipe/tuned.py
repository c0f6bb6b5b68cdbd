"""Settings found better at the study's budget than the study's own: a one-setting sweep at C (lmpipe.paths.
TUNING_AT_C: the rate, the width, the optimiser, the dropout, alike across families) whose best point beats the
model's run at C, its seeds' mean valid bpb (seeds/seeds.csv), by more than twice their sd. A verdict about such a family is a
verdict about the study's settings, not the family's best found: the report says so beside the verdicts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lmpipe import stats
from lmpipe.io import csv_records

NOT_SETTINGS = ("number", "state", "valid_bpb", "evaluations", "tokens_seen", "train_flops", "seconds")


@dataclass(frozen=True)
class Better:
    """A sweep's best point at C against the study's run of the same model."""
    model: str
    source: str  # the sweep's outcome folder
    setting: str  # its values, as `dvc exp run -S` takes them (without the models.<model> prefix)
    valid_bpb: float
    study_bpb: float  # the study's seeds' mean
    study_sd: float

    def text(self) -> str:
        return (f"{self.model}: `{self.setting}` ({self.source}) gave valid bpb {self.valid_bpb:.4f} at C against the "
                f"study's {self.study_bpb:.4f} ± {self.study_sd:.4f}, {self.study_bpb - self.valid_bpb:.3f} lower "
                f"(more than {stats.REAL_GAP_SDS:g} x sd)")


def valid_by_model(seed_rows: list[dict]) -> dict[str, list[float]]:
    """Each model's valid bpb over its seeds (rows of seeds/seeds.csv): the study's run at C, set beside a sweep."""
    valid: dict[str, list[float]] = {}
    for row in seed_rows:
        valid.setdefault(row["model"], []).append(float(row["valid_bpb"]))
    return valid


def better_found(root: str | Path, sweeps: tuple[str, ...], seed_rows: list[dict], budget_flops: float) -> list[Better]:
    """Each model's sweep points at `budget_flops` (within 1%) under `root`/`sweeps` that beat its seeds' mean (from
    `seed_rows`, the study's current rows) beyond noise, the largest gain first; none without several seeds."""
    valid = valid_by_model(seed_rows)
    found = []
    for folder in (Path(root) / sweep / model for sweep in sweeps for model in sorted(valid)):
        trials = [r for r in csv_records(folder / "trials.csv") if r["state"] == "COMPLETE"
                  and abs(float(r["train_flops"]) / budget_flops - 1) < 0.01] if (folder / "trials.csv").exists() else []
        mean, sd = stats.mean_sd(valid[folder.name])
        if not trials or not stats.known(sd):
            continue
        best = min(trials, key=lambda r: float(r["valid_bpb"]))
        gap = float(best["valid_bpb"]) - mean
        if gap < 0 and stats.beyond_noise(gap, sd):
            setting = " ".join(f"{k}={v}" for k, v in best.items() if k not in NOT_SETTINGS)
            found.append(Better(folder.name, folder.relative_to(root).as_posix(), setting, float(best["valid_bpb"]),
                                mean, sd))
    return sorted(found, key=lambda b: b.valid_bpb - b.study_bpb)
