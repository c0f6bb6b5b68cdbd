"""dvc.yaml and dvc.lock as the project's own code reads them, in one place: a pipeline's stages as written, and the
runs a lock file records. What DVC decides from them (the graph, what re-runs) is asked of DVC itself (`dvc.repo.Repo`:
lmpipe_cli/progress.py, lmpipe_cli/restore.py, lmpipe_cli/retrain.py), and what is written back goes through DVC's
round-trip writer (`dvc.utils.serialize.modify_yaml`), which keeps a file's form; reading is the C YAML loader's (a
lock of ~25 stages in milliseconds, where DVC's round-trip reader takes seconds)."""

from __future__ import annotations

from pathlib import Path

import yaml
from yaml import YAMLError  # noqa: F401  (what a reader of a torn file catches)


def pipeline_stages(pipeline: str | Path = "dvc.yaml") -> dict:
    """A pipeline file's stages as written, {name: entry} (a `foreach` stage under its own name, unexpanded)."""
    return (_load(Path(pipeline).read_text(encoding="utf-8")) or {}).get("stages", {})


def locked_stages(text: str) -> dict:
    """The runs a lock file records, {stage: entry}, from its text (the file's, or a commit's: `git show`)."""
    return (_load(text) or {}).get("stages", {})


def _load(text: str):
    return yaml.load(text, Loader=yaml.CSafeLoader)
