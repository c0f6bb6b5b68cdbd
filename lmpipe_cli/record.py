"""After `dvc repro`: MLflow runs for the stages DVC skipped because git already held their outputs.

    python -m lmpipe_cli.record          (the last step of `make study`)

A fresh clone has every `cache: false` output in git (metrics/eval.json, metrics/combine.json, the report,
metrics/models). When the models reproduce bit for bit, DVC finds those stages up to date and skips them, so the
clone's MLflow store would lack their runs, the study run's headline numbers, the views' rows and the registry cards
the publish stage writes.
Each such stage whose outputs no run of this store made (`tracking.run_of_output`) runs again with `dvc repro --force
--single-item`: it writes the same bytes, so git and dvc.lock stay as they were. A store that has them: nothing runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flows._stage import PARAMS_FILE, git_tracked_outputs
from lmpipe import dvc_files, tracking
from lmpipe.config import load_params
from lmpipe.errors import LmpipeError, first_line


def unrecorded_stages(pipeline: str = "dvc.yaml") -> list[str]:
    """The stages of `pipeline`, in its order, whose outputs git holds and no MLflow run of this store made."""
    experiment = load_params(PARAMS_FILE).tracking.experiment
    stages = dvc_files.pipeline_stages(pipeline)
    missing = []
    for stage in stages:
        outputs = git_tracked_outputs(stage, pipeline)
        if outputs and all(Path(p).exists() for p in outputs) and tracking.run_of_output(experiment, outputs) is None:
            missing.append(stage)
    return missing


def record() -> list[str]:
    """Run each unrecorded stage again (in the pipeline's order: evaluate, combine, report, publish); the stages it
    ran."""
    missing = unrecorded_stages()
    for stage in missing:
        print(f"{stage}: DVC skipped it (git holds its outputs), so MLflow has no run of it here: running it again",
              flush=True)
        if subprocess.call(["dvc", "repro", "--force", "--single-item", stage]) != 0:
            raise LmpipeError(f"dvc repro --force --single-item {stage} failed (its error is above)")
    return missing


if __name__ == "__main__":
    try:
        record()
    except LmpipeError as error:
        sys.exit(f"error: {first_line(error)}")
