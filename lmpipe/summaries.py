"""metrics/models/: the rows `dvc metrics show` prints, one small file per model, best first.

DVC lists a metrics folder's files by path, so each file is named by its model's rank: `1-transformer.json`,
`2-lstm.json`, ... (zero-padded past nine models). Each holds three numbers from the report's one source (the seed
spreads, lmpipe.seeds): `bpb`, the test bits per byte (the mean over the seeds where they hold, else the one run);
`sd`, their sd (absent with one seed); `vs_<baseline>`, the gap to the baseline in bpb (lmpipe.compare.gap); and
`tflop`, the training compute, which `lmpipe diff` judges compute-matching by. Few keys keep `dvc exp show
--only-changed` within a terminal's width; the rest is in metrics/eval.json, the report and MLflow."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lmpipe import paths
from lmpipe.compare import gap
from lmpipe.io import atomic_path
from lmpipe.paths import BASELINE


def gap_key(label: str) -> str:
    """'vs_kn5' for the baseline 'KN-5': the gap's key, named after the baseline as the report's column is."""
    return "vs_" + re.sub(r"[^a-z0-9]+", "", label.lower())


def file_names(spreads: dict) -> dict[str, str]:
    """{model: its file name}, ranked by the bpb the file holds (best first; ties by name)."""
    ranked = sorted(spreads, key=lambda n: (spreads[n].bpb, n))
    width = len(str(len(ranked)))
    return {name: f"{rank:0{width}d}-{name}.json" for rank, name in enumerate(ranked, 1)}


def model_of(stem: str) -> str:
    """The model a summary file is of: '3-gru' -> 'gru' (and 'gru' -> 'gru', as files were named before ranks)."""
    rank, _, name = stem.partition("-")
    return name if rank.isdigit() and name else stem


def rows(spreads: dict, trained: dict, label: str) -> dict[str, dict]:
    """{file name: its row} for every model with a spread (`trained`: metrics/train/<model>.json, for the FLOPs)."""
    kn, out = spreads.get(BASELINE), {}
    for name, file in file_names(spreads).items():
        s, row = spreads[name], {"bpb": round(spreads[name].bpb, 4)}
        if s.n > 1 and s.bpb_sd is not None:
            row["sd"] = round(s.bpb_sd, 4)
        if kn and name != BASELINE:
            row[gap_key(label)] = round(gap(s, kn)[0], 4)
        if "train_flops" in (trained.get(name) or {}):
            row["tflop"] = round(trained[name]["train_flops"] / 1e12, 1)
        out[file] = row
    return out


def write(root: str | Path, spreads: dict, trained: dict, label: str) -> Path:
    """metrics/models/ under `root`, whole: a model no longer shown leaves no file behind."""
    with atomic_path(Path(root) / paths.SUMMARIES) as tmp:
        tmp.mkdir()
        for file, row in rows(spreads, trained, label).items():
            (tmp / file).write_text(json.dumps(row, indent=2) + "\n")
    return Path(root) / paths.SUMMARIES


def normalised(row: dict) -> dict:
    """A row of any version of the study as {bpb, sd, tflop}: files written before ranks said `test_bpb` and
    `bpb_sd`."""
    return {"bpb": row.get("bpb", row.get("test_bpb")), "sd": row.get("sd", row.get("bpb_sd")),
            "tflop": row.get("tflop")}
