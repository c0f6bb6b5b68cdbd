"""The decoding settings and their rules, one definition for params.yaml's `evaluate`, `lmpipe generate`'s flags, a
served request's params and lmpipe.decode.DecodeSettings. torch-free: the CLI and params load without it."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmpipe.errors import ConfigError

Strategy = Literal["greedy", "beam", "top-k", "top-p", "typical", "sample"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


MAX_NEW_TOKENS = 1024  # new tokens one call may ask for: params.yaml, a flag of `lmpipe generate`, a served request
MAX_SEED = 2**63 - 1  # a decoding seed: numpy's seed entropy, and MLflow's `long`


class DecodingParams(BaseModel):
    """Every decoding setting with its one rule: params.yaml's `evaluate` states each, and each call's settings
    (`lmpipe generate`'s flags, a served request's params, lmpipe.decode.DecodeSettings) are checked by the same
    rules (`check_decoding`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # as every section of params.yaml (lmpipe.config)
    max_new_tokens: int = Field(ge=1, le=MAX_NEW_TOKENS)
    temperature: float = Field(gt=0)
    top_k: int = Field(ge=1)
    top_p: float = Field(gt=0, le=1)
    typical_p: float = Field(gt=0, le=1)
    beam_size: int = Field(ge=1)
    no_repeat_ngram: int = Field(ge=0)  # n: no n tokens in a row twice in a text (with its prompt); 0: off
    seed: int = Field(ge=0, le=MAX_SEED)


def decoding_rule(name: str) -> str:
    """A decoding setting's rule in words, from its field: 'a whole number from 1 to 1024', 'a number above 0 and at
    most 1'."""
    field = DecodingParams.model_fields[name]
    bounds = {key: getattr(m, key) for m in field.metadata for key in ("ge", "gt", "le", "lt") if hasattr(m, key)}
    words = {"ge": "of at least {}", "gt": "above {}", "le": "at most {}", "lt": "below {}"}
    if field.annotation is int and {"ge", "le"} <= set(bounds):
        return f"a whole number from {bounds['ge']} to {bounds['le']}"
    kind = "a whole number" if field.annotation is int else "a number"
    return " and ".join([f"{kind} {words[k].format(v)}" if i == 0 else words[k].format(v)
                         for i, (k, v) in enumerate(bounds.items())]) or kind


def check_decoding(settings: dict) -> DecodingParams:
    """Every decoding setting, each checked by its rule, strictly (a whole number must be an int: not a string, a
    float or a bool). A ConfigError names the first bad setting and its rule, never its value (a served request's
    value is a stranger's input)."""
    try:
        return DecodingParams.model_validate(settings, strict=True)
    except ValidationError as exc:
        name = str(exc.errors()[0]["loc"][0])
        raise ConfigError(f"{name} must be {decoding_rule(name)}") from None
