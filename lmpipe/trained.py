"""A trained model read back from its folder under models/: the n-gram or a neural LM, whichever the folder holds.
Apart from the evaluator (lmpipe.evaluate), which training imports, so that training never imports the n-gram."""

from __future__ import annotations

from pathlib import Path

from lmpipe.errors import ModelFileError
from lmpipe.paths import BASELINE


def load_lm(directory, device: str = "cpu"):
    """A trained model from its models/<name>/ directory: the n-gram or a neural LM (on `device`); a folder with
    neither is a one-line error naming the stage that makes it."""
    from lmpipe.models import load_model
    from lmpipe.ngram import NGramLM

    directory = Path(directory)
    if (directory / "ngram.json").exists():
        return NGramLM.load(directory)
    if (directory / "model.pt").exists():
        return load_model(directory / "model.pt", device)
    stage = BASELINE if directory.name == BASELINE else f"train@{directory.name}"  # the n-gram's stage is its name
    raise ModelFileError(f"{directory}: no trained model there (train it: dvc repro {stage})")
