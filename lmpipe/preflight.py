"""What a stage would fail on after DVC had already removed its outputs, checked before `dvc repro` starts.

DVC deletes a stage's outputs before it runs the stage; a stage that then fails on a missing input file or a folder
it cannot write has cost what it had made (`lmpipe restore` brings it back, but only from a cache that holds it).
`lmpipe check-params` (which `make study` runs first) says these in one line each instead.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from lmpipe import paths
from lmpipe.config import Params, load_params
from lmpipe.errors import LmpipeError

OUTPUT_FOLDERS = ("data", "models", "metrics", "plots", "reports")  # where dvc.yaml's stages write


def input_problems(params: Params, file: str = "params.yaml") -> list[str]:
    """Corpus files a local source names that cannot be read."""
    corpus, found = params.corpus, []
    named = {}
    if corpus.source == "local":
        named = {f"corpus.files.{split}": path for split, path in corpus.files.model_dump().items()}
    elif corpus.source == "wikipedia-dump" and "://" not in corpus.url:
        named = {"corpus.url": corpus.url}
    for field, path in named.items():
        try:
            with open(path, "rb") as handle:
                handle.read(1)
        except OSError as exc:
            found.append(f"{file}: {field}: {path}: {exc.strerror.lower()} (name a readable file)")
    return found


def output_problems(params: Params, root: str | Path = ".") -> list[str]:
    """Output folders (and each model's folder) that exist but cannot take a new file."""
    root, found = Path(root), []
    folders = [root / f for f in OUTPUT_FOLDERS] + [root / paths.model_dir(m) for m in params.models]
    for folder in folders:
        if not folder.exists():
            continue
        if not folder.is_dir():
            found.append(f"{folder}: is a file where the study writes a folder (move it away)")
            continue
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            found.append(f"{folder}: cannot be written ({exc.strerror.lower()}): DVC would remove the outputs there "
                         f"and the stage then fail (make it writable: chmod -R u+w {folder})")
    return found


def check(file: str = "params.yaml", store: bool = False) -> str:
    """`lmpipe check-params`: the params file, the inputs and output folders it names, and with `store` the MLflow
    tracking store (what every stage needs before DVC removes its outputs); every problem in one line."""
    params = load_params(file)
    problems = input_problems(params, file) + output_problems(params)
    if problems:
        raise LmpipeError("; ".join(problems))
    if not store:
        return f"{file}: ok"
    from lmpipe.tracking.store import prepare_store, tracking_uri

    prepare_store(params.tracking.timeout_seconds)
    return f"{file}: ok; MLflow store {tracking_uri()}: ok"
