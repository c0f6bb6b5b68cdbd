"""A trained LM as MLflow pyfunc models, read with the safe loader (tensors and JSON, never a pickle):

- `TextGenerator`: prompts in, continuations out, as `lmpipe generate` prints them; the registered `lmpipe-<m>`
  model, so `mlflow models serve -m models:/lmpipe-<m>@champion` answers text over HTTP;
- `TokenLogits`: int64 token ids (batch, time) in, float32 next-token logits (batch, time, vocab) out.

Each is logged as code (MLflow's models-from-code: lmpipe/pyfunc/*.py), so loading one unpickles nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

from lmpipe.config import STRATEGIES
from lmpipe.decode import DecodeSettings, generate
from lmpipe.tokenize import decode_stream

MAX_NEW_TOKENS = 1024  # a request's ceiling: generation is one forward per token
REQUEST_PARAMS = ("strategy", "max_new_tokens", "seed")


def continuation(lm, tokenizer, boundary: int, prompt: str, settings: DecodeSettings) -> str:
    """The text `lm` adds to `prompt` (line breaks where it emits the boundary token)."""
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    new = generate(lm, ids, settings, boundary)
    return decode_stream(tokenizer, np.array(new + [boundary]), boundary)[:-1]


def request_settings(defaults: DecodeSettings, params: Mapping | None) -> DecodeSettings:
    """A request's settings on top of the model's defaults; a bad value is a ValueError of one line."""
    given = {k: v for k, v in (params or {}).items() if k in REQUEST_PARAMS and v is not None}
    if "strategy" in given and given["strategy"] not in STRATEGIES:
        raise ValueError(f"strategy {given['strategy']!r} is unknown: use one of {', '.join(STRATEGIES)}")
    if "max_new_tokens" in given and not 1 <= int(given["max_new_tokens"]) <= MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens {given['max_new_tokens']} is out of range: use 1 to {MAX_NEW_TOKENS}")
    if "seed" in given and int(given["seed"]) < 0:
        raise ValueError(f"seed {given['seed']} is negative: use a number >= 0")
    return replace(defaults, **{k: (v if k == "strategy" else int(v)) for k, v in given.items()})


def bundle_files(model_dir: str | Path, tokenizer: str | Path, defaults: DecodeSettings, scratch: Path) -> dict[str, str]:
    """The artifacts a pyfunc model carries: the model's folder, the tokenizer, and its decoding defaults."""
    decode = scratch / "decode.json"
    decode.write_text(json.dumps(asdict(defaults)))
    return {"model": str(model_dir), "tokenizer": str(tokenizer), "decode": str(decode)}


def load_bundle(artifacts: Mapping[str, str]):
    """(lm, tokenizer, boundary id, default settings) from a pyfunc model's artifacts (or their local copies)."""
    from tokenizers import Tokenizer

    from lmpipe.models import load_model

    settings = json.loads(Path(artifacts["decode"]).read_text())
    settings["seed"] = tuple(settings["seed"]) if isinstance(settings["seed"], list) else settings["seed"]
    lm = load_model(Path(artifacts["model"]) / "model.pt")  # tensors and JSON only (weights_only=True)
    return lm, Tokenizer.from_file(str(artifacts["tokenizer"])), lm.boundary, DecodeSettings(**settings)


class TextGenerator(PythonModel):
    """Continuations of prompts (column `prompt`); params strategy, max_new_tokens, seed. Bad params: HTTP 400."""

    def load_context(self, context):
        self.lm, self.tokenizer, self.boundary, self.defaults = load_bundle(context.artifacts)

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        try:
            settings = request_settings(self.defaults, params)
        except ValueError as exc:
            raise MlflowException(str(exc), error_code=INVALID_PARAMETER_VALUE) from None
        prompts = model_input["prompt"].tolist() if isinstance(model_input, pd.DataFrame) else list(model_input)
        return pd.DataFrame({"continuation": [continuation(self.lm, self.tokenizer, self.boundary, str(p), settings)
                                              for p in prompts]})


class TokenLogits(PythonModel):
    """Raw next-token logits of token ids, as the model computes them."""

    def load_context(self, context):
        self.lm = load_bundle(context.artifacts)[0]

    def predict(self, context, model_input: np.ndarray, params: dict | None = None) -> np.ndarray:
        import torch

        with torch.no_grad():
            logits, _ = self.lm(torch.as_tensor(np.asarray(model_input, dtype=np.int64)))
        return logits.float().numpy()


def signatures(vocab_size: int, defaults: DecodeSettings):
    """{text, logits}: the two models' signatures (the text model's params with the study's defaults)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

    text = ModelSignature(Schema([ColSpec("string", "prompt")]), Schema([ColSpec("string", "continuation")]),
                          params=ParamSchema([ParamSpec("strategy", "string", defaults.strategy),
                                              ParamSpec("max_new_tokens", "long", defaults.max_new_tokens),
                                              ParamSpec("seed", "long", defaults.seed if isinstance(defaults.seed, int)
                                                        else defaults.seed[0])]))
    logits = ModelSignature(Schema([TensorSpec(np.dtype(np.int64), (-1, -1))]),
                            Schema([TensorSpec(np.dtype(np.float32), (-1, -1, vocab_size))]))
    return {"text": text, "logits": logits}
