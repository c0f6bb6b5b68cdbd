"""A trained LM as MLflow pyfunc models, read with the safe loader (tensors and JSON, never a pickle):

- `TextGenerator`: prompts in, continuations out, as `lmpipe generate` prints them; the registered `lmpipe-<m>`
  model, which `lmpipe serve` (lmpipe.serve_app) answers over HTTP;
- `TokenLogits`: int64 token ids (batch, time) in, float32 next-token logits (batch, time, vocab) out.

Each is logged as code (MLflow's models-from-code: lmpipe/pyfunc/*.py), so loading one unpickles nothing.
`check_request` is the one check of a scoring request, against the limits below, before any model work.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel

from lmpipe.decode_rules import STRATEGIES, DecodingParams
from lmpipe.errors import ConfigError
from lmpipe.decode import DecodeSettings, continuations

# A request's limits, checked before any model work (`check_request`; README, "Operate it"): a 1 MB prompt (~250k
# tokens) once took 40 s and 8.7 GB for one new token. Generation reads a prompt once and steps the model's state a
# token at a time (lmpipe.decode.Contexts), in memory bounded by the prompt (a recurrent state, a window's keys).
MAX_PROMPTS = 16  # prompts a request may hold
MAX_PROMPT_TOKENS = 4096  # tokens of one prompt (with the study's tokenizer)
MAX_PROMPT_BYTES = 32 * 1024  # UTF-8 bytes of one prompt, checked before it is tokenized: 8 bytes a token
MAX_BODY_BYTES = 1024 * 1024  # bytes of a request's body: 16 such prompts with room for JSON's \u escapes
# A request's work, in steps of generation: each new token of each prompt (of each beam) is one step of the model's
# carried state, and a prompt is read once, in one pass, about 64 of its tokens to a step. The budget keeps the
# costliest request these limits allow near 10 s on the 2-core machine (benchmarks/serve.py; README, "Operate it").
PROMPT_TOKENS_PER_STEP = 64
MAX_WORK = 2048
REQUEST_PARAMS = ("strategy", *DecodingParams.model_fields)  # every setting `lmpipe generate` takes, by one rule
INPUT_FORMATS = ("inputs", "dataframe_records", "dataframe_split")  # MLflow's scoring protocol, one column: prompt


class BadRequest(ValueError):
    """A request the server refuses before any model work: one line that names the field and the limit, never
    quotes the input; `status` is its HTTP status (400, or 413 for a request over a size limit)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _kind(value) -> str:
    """A JSON value's kind, for a message that must not quote the value itself."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _name(key) -> str:
    """A field name as a message may show it: short, so a hostile name is not echoed."""
    text = repr(str(key))
    return text if len(text) <= 40 else text[:36] + "...'"


def _integer(value) -> bool:
    from numbers import Integral

    return isinstance(value, Integral) and not isinstance(value, bool)


def request_settings(defaults: DecodeSettings, params: Mapping | None) -> DecodeSettings:
    """A request's settings on top of the model's defaults; an unknown or bad one is a BadRequest of one line."""
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise BadRequest(f"params must be an object of {', '.join(REQUEST_PARAMS)}, not {_kind(params)}")
    unknown = [k for k in params if k not in REQUEST_PARAMS]
    if unknown:
        raise BadRequest(f"params.{_name(unknown[0])[1:-1]} is not a setting of this model: use "
                         f"{', '.join(REQUEST_PARAMS)}")
    given = {k: v for k, v in params.items() if v is not None}
    if "strategy" in given and given["strategy"] not in STRATEGIES:
        raise BadRequest(f"strategy must be one of {', '.join(STRATEGIES)}")
    numbers = {k: (int(v) if _integer(v) else v) for k, v in given.items() if k != "strategy"}  # numpy's ints too
    try:
        return replace(defaults, **{**given, **numbers})  # each setting by its one rule (DecodeSettings checks them)
    except ConfigError as exc:
        raise BadRequest(str(exc)) from None


def check_prompts(prompts, count_tokens: Callable[[str], int] | None = None, field: str = "prompt",
                  max_prompts: int | None = MAX_PROMPTS) -> list[str]:
    """`prompts` if it is a non-empty list of at most `max_prompts` strings, each within MAX_PROMPT_BYTES and (with
    `count_tokens`) MAX_PROMPT_TOKENS; else a BadRequest (413 over a limit). Cheap checks first."""
    if not isinstance(prompts, list):
        raise BadRequest(f"{field} must be a list of strings, not {_kind(prompts)}")
    if not prompts:
        raise BadRequest(f"{field} is empty: give at least one prompt")
    if max_prompts is not None and len(prompts) > max_prompts:
        raise BadRequest(f"{field} holds {len(prompts)} prompts: at most {max_prompts} a request", 413)
    for i, prompt in enumerate(prompts, 1):
        if not isinstance(prompt, str):
            raise BadRequest(f"prompt {i} is {_kind(prompt)}: each prompt must be a string")
    for i, prompt in enumerate(prompts, 1):
        try:
            size = len(prompt.encode("utf-8"))
        except UnicodeEncodeError:
            raise BadRequest(f"prompt {i} is not valid Unicode (it holds a lone surrogate)") from None
        if size > MAX_PROMPT_BYTES:
            raise BadRequest(f"prompt {i} has {size} bytes: at most {MAX_PROMPT_BYTES} (UTF-8) a prompt", 413)
    if count_tokens:
        prompt_tokens(prompts, count_tokens)
    return prompts


def prompt_tokens(prompts: list[str], count_tokens: Callable[[str], int]) -> list[int]:
    """The tokens of each prompt, each within MAX_PROMPT_TOKENS (else a BadRequest, 413)."""
    counts = []
    for i, prompt in enumerate(prompts, 1):
        counts.append(count_tokens(prompt))
        if counts[-1] > MAX_PROMPT_TOKENS:
            raise BadRequest(f"prompt {i} has {counts[-1]} tokens: at most {MAX_PROMPT_TOKENS} a prompt", 413)
    return counts


def work(counts: list[int], settings: DecodeSettings) -> int:
    """The steps of generation prompts of `counts` tokens ask for under `settings` (see MAX_WORK)."""
    beams = settings.beam_size if settings.strategy == "beam" else 1
    return sum(-(-n // PROMPT_TOKENS_PER_STEP) + settings.max_new_tokens * beams for n in counts)


SHAPES = {"inputs": '{"prompt": [strings]}', "dataframe_records": '[{"prompt": string}, ...]',
          "dataframe_split": '{"columns": ["prompt"], "data": [[string], ...]}'}


def _prompts_of(form: str, value) -> list:
    """The prompts of a request's input `value` given in `form` (one of INPUT_FORMATS), as a list of whatever the
    client sent: `check_prompts` checks them."""
    wrong = BadRequest(f"{form} must be {SHAPES[form]}, not {_kind(value)}")
    if form == "inputs":
        if not isinstance(value, Mapping):
            raise wrong
        if "prompt" not in value:
            raise BadRequest(f"inputs must be {SHAPES[form]}: it has no prompt")
        extra = [k for k in value if k != "prompt"]
        if extra:
            raise BadRequest(f"inputs has an unknown column {_name(extra[0])}: the model reads one, prompt")
        return value["prompt"]
    if form == "dataframe_records":
        if not isinstance(value, list):
            raise wrong
        if len(value) > MAX_PROMPTS:  # before looking at each
            raise BadRequest(f"dataframe_records holds {len(value)} prompts: at most {MAX_PROMPTS} a request", 413)
        if not all(isinstance(r, Mapping) and list(r) == ["prompt"] for r in value):
            raise BadRequest(f"dataframe_records must be {SHAPES[form]}: each record has one field, prompt")
        return [r["prompt"] for r in value]
    if not (isinstance(value, Mapping) and set(value) <= {"columns", "data", "index"} and
            value.get("columns") == ["prompt"] and isinstance(value.get("data"), list)):
        raise BadRequest(f"dataframe_split must be {SHAPES[form]}")
    if len(value["data"]) > MAX_PROMPTS:
        raise BadRequest(f"dataframe_split holds {len(value['data'])} prompts: at most {MAX_PROMPTS} a request", 413)
    if not all(isinstance(row, list) and len(row) == 1 for row in value["data"]):
        raise BadRequest(f"dataframe_split must be {SHAPES[form]}: each row holds one prompt")
    return [row[0] for row in value["data"]]


def check_request(body, count_tokens: Callable[[str], int], defaults: DecodeSettings | None = None
                  ) -> tuple[list[str], dict, int]:
    """(prompts, params, work) of a parsed MLflow scoring request (POST /invocations), or a BadRequest of one line:
    exactly one of INPUT_FORMATS holding 1 to MAX_PROMPTS string prompts within the limits above, `params` with known
    settings only (`request_settings`), and at most MAX_WORK steps of work. Every check is cheap; the tokens are
    counted last, of checked prompts."""
    if not isinstance(body, Mapping):
        raise BadRequest(f"the body must be a JSON object with one of {', '.join(INPUT_FORMATS)}, not {_kind(body)}")
    unknown = [k for k in body if k not in (*INPUT_FORMATS, "params")]
    if unknown:
        raise BadRequest(f"unknown field {_name(unknown[0])}: a request has one of {', '.join(INPUT_FORMATS)}, "
                         "and params")
    forms = [f for f in INPUT_FORMATS if f in body]
    if len(forms) != 1:
        raise BadRequest(f"a request has exactly one of {', '.join(INPUT_FORMATS)}, not {len(forms)}")
    form = forms[0]
    prompts = check_prompts(_prompts_of(form, body[form]), field="inputs.prompt" if form == "inputs" else form)
    params = {} if body.get("params") is None else body["params"]
    settings = request_settings(defaults or DecodeSettings(), params)
    steps = work(prompt_tokens(prompts, count_tokens), settings)
    if steps > MAX_WORK:
        raise BadRequest(f"the request asks for {steps} steps of generation (prompts x (prompt tokens / "
                         f"{PROMPT_TOKENS_PER_STEP} + new tokens, x beams for beam)): at most {MAX_WORK} a request; "
                         "send fewer prompts or ask for fewer new tokens", 413)
    return prompts, {k: v for k, v in params.items() if v is not None}, steps


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
    """Continuations of prompts (column `prompt`); params: the strategy and every decoding setting (REQUEST_PARAMS).
    Bad params: HTTP 400."""

    def load_context(self, context):
        self.lm, self.tokenizer, self.boundary, self.defaults = load_bundle(context.artifacts)

    def count_tokens(self, prompt: str) -> int:
        return len(self.tokenizer.encode(prompt, add_special_tokens=False).ids)

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

        prompts = model_input["prompt"].tolist() if isinstance(model_input, pd.DataFrame) else list(model_input)
        try:
            settings = request_settings(self.defaults, params)
            check_prompts(prompts, self.count_tokens, max_prompts=None)  # a server limits the count
        except BadRequest as exc:
            raise MlflowException(str(exc), error_code=INVALID_PARAMETER_VALUE) from None
        return pd.DataFrame({"continuation": continuations(self.lm, self.tokenizer, self.boundary, prompts, settings)})


class TokenLogits(PythonModel):
    """Raw next-token logits of token ids, as the model computes them."""

    def load_context(self, context):
        self.lm = load_bundle(context.artifacts)[0]

    def predict(self, context, model_input: np.ndarray, params: dict | None = None) -> np.ndarray:
        import torch

        with torch.no_grad():
            logits, _, _ = self.lm(torch.as_tensor(np.asarray(model_input, dtype=np.int64)))
        return logits.float().numpy()


def signatures(vocab_size: int, defaults: DecodeSettings):
    """{text, logits}: the two models' signatures (the text model's params with the study's defaults)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

    def spec(name: str) -> ParamSpec:
        value = getattr(defaults, name)
        value = value[0] if isinstance(value, tuple) else value  # a seed the library made of several numbers
        return ParamSpec(name, "long" if DecodingParams.model_fields[name].annotation is int else "double", value)

    text = ModelSignature(Schema([ColSpec("string", "prompt")]), Schema([ColSpec("string", "continuation")]),
                          params=ParamSchema([ParamSpec("strategy", "string", defaults.strategy),
                                              *(spec(name) for name in DecodingParams.model_fields)]))
    logits = ModelSignature(Schema([TensorSpec(np.dtype(np.int64), (-1, -1))]),
                            Schema([TensorSpec(np.dtype(np.float32), (-1, -1, vocab_size))]))
    return {"text": text, "logits": logits}
