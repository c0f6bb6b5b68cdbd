"""`lmpipe generate`: one prompt continued by a trained model, from models/ or the MLflow registry, with the
decoding settings of params.yaml's `evaluate` and the flags that change them."""

from __future__ import annotations

import sys
from pathlib import Path

from lmpipe import paths
from lmpipe.config import load_params
from lmpipe.decode import DecodeSettings, continuation
from lmpipe.errors import ConfigError, LmpipeError


def settings_of(evaluate, strategy: str, flags: dict) -> DecodeSettings:
    """params.yaml's decoding settings (`evaluate`) with the command's flags, each checked by its one rule
    (lmpipe.decode_rules) before any model loads; a bad one named as the flag the user typed."""
    try:
        return DecodeSettings.from_params(evaluate, strategy=strategy, **flags)
    except ConfigError as exc:
        name = str(exc).split()[0]
        raise LmpipeError(f"--{name.replace('_', '-')} {flags[name]}: {exc}") from None


def load(model: str, boundary_token: str, tokenizer_file: str | Path = paths.TOKENIZER):
    """(model, tokenizer, boundary id): a registered model (models:/lmpipe-gru@champion) with its own tokenizer, or
    a name under models/ with the study's (its boundary: params.yaml's `boundary_token`)."""
    if model.startswith("models:/"):
        from lmpipe.serving import load_bundle  # MLflow's pyfunc: imported only for a registered model
        from lmpipe.tracking.registry import registered_artifacts

        print(f"loading {model} from the MLflow registry ...", file=sys.stderr, flush=True)
        lm, tokenizer, boundary, _ = load_bundle(registered_artifacts(model))
        return lm, tokenizer, boundary
    from tokenizers import Tokenizer

    from lmpipe.trained import load_lm
    from lmpipe.tokenize import boundary_id

    if not Path(tokenizer_file).exists():
        raise LmpipeError(f"{tokenizer_file}: no tokenizer (run: dvc repro tokenize)")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    boundary = boundary_id(tokenizer, boundary_token)
    directory = Path(paths.model_dir(model))
    if not directory.exists():
        raise LmpipeError(f"{directory}: no trained model '{model}' (run: dvc repro, or give "
                          "models:/lmpipe-<name>@champion)")
    print(f"loading {directory} ...", file=sys.stderr, flush=True)
    return load_lm(directory), tokenizer, boundary


def generate(model: str, prompt: str, strategy: str, flags: dict, tokenizer_file: str | Path = paths.TOKENIZER) -> str:
    """The prompt and its continuation."""
    params = load_params()  # a params.yaml problem is its own one-line error, not a flag's
    settings = settings_of(params.evaluate, strategy, flags)
    lm, tokenizer, boundary = load(model, params.tokenizer.boundary_token, tokenizer_file)
    return prompt + continuation(lm, tokenizer, boundary, prompt, settings)
