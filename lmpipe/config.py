"""Typed view of params.yaml: the single source of every setting.

Unknown keys, wrong types and impossible values fail here with one line naming the key.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Literal, Optional, Union, get_args

import yaml
from pydantic import (BaseModel, ByteSize, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator,
                      model_validator)

from lmpipe.errors import ConfigError
from lmpipe.families import FAMILIES

SOURCES = ("enwiki-sample", "wikipedia-dump", "wikitext-2", "wikitext-103", "local")
# A model's name is a DVC stage (train@<name>), a folder (models/<name>), a Prefect artifact key and an MLflow
# registered model (lmpipe-<name>): lowercase letters, digits, '-' and '_', starting with a letter, which all take.
MODEL_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
RESERVED_NAMES = ("ngram", "word2vec", "cache")  # the baseline's and the audit reference's rows and folders; the
# combination's unigram cache (lmpipe.compare.CACHE)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalFiles(_Section):
    train: str
    valid: str
    test: str


class CorpusParams(_Section):
    source: Literal[SOURCES] = "enwiki-sample"
    url: Optional[str] = Field(None, description="wikipedia-dump: URL or path of the dump; wikitext-*: mirror URL")
    sha256: Optional[str] = Field(None, pattern=r"^[0-9a-f]{64}$")
    files: Optional[LocalFiles] = None
    max_articles: Optional[int] = Field(None, ge=3)
    min_article_words: int = Field(50, ge=0)

    @model_validator(mode="after")
    def _source_needs(self):
        if self.source == "wikipedia-dump" and not self.url:
            raise ValueError("corpus.source 'wikipedia-dump' needs corpus.url (a dump URL or local path)")
        if self.source == "local" and self.files is None:
            raise ValueError("corpus.source 'local' needs corpus.files with train, valid and test paths")
        return self


class SplitParams(_Section):
    seed: int = 1234
    valid: float = Field(0.1, gt=0, lt=0.5)
    test: float = Field(0.1, gt=0, lt=0.5)


class ValidateParams(_Section):
    min_words: int = Field(1000, ge=1, description="minimum words in every split")
    min_line_chars: int = Field(1, ge=1)
    max_line_chars: int = Field(20000, ge=10)
    max_oov_rate: float = Field(0.2, ge=0, le=1, description="share of valid/test words unseen in train")


class TokenizerParams(_Section):
    vocab_size: int = Field(8192, ge=260, le=2**32 - 1)
    min_frequency: int = Field(2, ge=1)
    boundary_token: str = Field("<|endoftext|>", min_length=1)


class NgramParams(_Section):
    order: int = Field(5, ge=1, le=5)
    method: Literal["kneser_ney", "add_k", "stupid_backoff"] = "kneser_ney"
    k: float = Field(0.01, gt=0, description="add_k: the pseudo-count delta")
    alpha: float = Field(0.4, gt=0, lt=1, description="stupid_backoff: the back-off factor")
    memory: ByteSize = Field(ByteSize(4 << 30), gt=0, description="the build's memory bound: bigger corpora count "
                             "in more shards and partitions (e.g. 4GiB, 512MiB)")
    workers: int = Field(0, ge=0, description="shard tasks at once on the local cores; 0 = the cores "
                         "(on a Dask/Ray orchestration.task_runner: its workers)")


class TrainParams(_Section):
    """Settings every neural model shares."""

    seed: int = 1234
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    threads: int = Field(0, ge=0, description="CPU threads; 0 = torch's default (cores, or OMP_NUM_THREADS)")
    log_every: int = Field(50, ge=1, description="steps between progress updates (the only host syncs)")
    checkpoint_every: int = Field(200, ge=1, description="steps between resumable checkpoints")
    eval_chunk: int = Field(128, ge=1, description="tokens per evaluation chunk (window stride, at most half a block)")
    evals_per_epoch: int = Field(1, ge=1, description="validation points per epoch (learning curves, early stopping)")
    compile: bool = False
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="training matmuls: auto = bf16 autocast where the device computes bf16 natively "
        "(CUDA; CPUs with AVX512-BF16 or AMX), else fp32; evaluation is always fp32")


class _OptimBase(_Section):
    """What every optimiser takes: the rate, its schedule, weight decay and clipping."""

    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    clip: float = Field(1.0, gt=0, description="gradient-norm clipping")
    schedule: Literal["constant", "cosine", "wsd", "plateau"] = Field(
        "cosine", description="wsd: warmup, stable, then a linear decay to 0 over the last decay_fraction of steps")
    warmup_steps: int = Field(0, ge=0)
    decay_fraction: Optional[float] = Field(None, gt=0, le=1, description="wsd only: the share of the run spent "
                                            "decaying (0.2 when not given)")

    @model_validator(mode="before")
    @classmethod
    def _wsd_decay_by_default(cls, data):
        if isinstance(data, dict) and data.get("schedule", "cosine") == "wsd" and data.get("decay_fraction") is None:
            return {**data, "decay_fraction": 0.2}
        return data

    @model_validator(mode="after")
    def _states_only_what_applies(self):
        _refuse_idle(self, {"decay_fraction": "decay_fraction is the wsd schedule's setting: remove it, or set "
                                              "schedule: wsd"})
        return self

    def stated_fields(self) -> set[str]:
        """The settings that do something for this optimiser and schedule."""
        return optimiser_fields(self)


class AdamParams(_OptimBase):
    name: Literal["adam", "adamw", "muon"] = Field(
        "adamw", description="muon: Muon on the hidden matrices, AdamW on embeddings, head, norms (lmpipe/optim.py)")


class SGDParams(_OptimBase):
    """SGD, and AWD-LSTM's switch to averaged SGD (NT-ASGD)."""

    name: Literal["sgd"]
    momentum: float = Field(0.0, ge=0, lt=1)
    nt_asgd: bool = Field(False, description="switch to averaged SGD when valid stops improving")
    nonmono: int = Field(2, ge=1, description="NT-ASGD: checks without improvement before averaging starts")


def _optimiser_kind(value) -> str:
    name = value.get("name", "adamw") if isinstance(value, dict) else getattr(value, "name", "adamw")
    return "sgd" if name == "sgd" else "adam"


def optimiser_fields(raw) -> set[str]:
    """The settings an `optim` entry (a dict or its model) takes: its type's (momentum and NT-ASGD are SGD's), and
    decay_fraction with the wsd schedule only."""
    cls = SGDParams if _optimiser_kind(raw) == "sgd" else AdamParams
    schedule = raw.get("schedule", "cosine") if isinstance(raw, dict) else raw.schedule
    return set(cls.model_fields) - (set() if schedule == "wsd" else {"decay_fraction"})


def _refuse_idle(section: BaseModel, reasons: dict[str, str]) -> None:
    """A setting given that would do nothing (not in the section's `stated_fields`) is refused, with its reason."""
    idle = sorted(name for name in section.model_fields_set - section.stated_fields()
                  if getattr(section, name) is not None)
    if idle:
        raise ValueError(reasons[idle[0]])


# One type per optimiser: a model states only the settings its optimiser uses (momentum and NT-ASGD are SGD's)
OptimParams = Annotated[Union[Annotated[AdamParams, Tag("adam")], Annotated[SGDParams, Tag("sgd")]],
                        Discriminator(_optimiser_kind)]
OPTIMISER_TAGS = ("adam", "sgd")  # the tags pydantic puts in an error's location; describe_error leaves them out


def arch_settings(family: str, arch: dict) -> BaseModel:
    """A registered family's arch with its defaults, checked: a ValueError naming the first bad setting."""
    schema = FAMILIES[family]
    unknown = sorted(set(arch) - set(schema.model_fields))
    if unknown:
        raise ValueError(f"arch has {unknown}, not settings of a {family} (allowed: {', '.join(schema.model_fields)})")
    try:
        return schema.model_validate(arch)
    except ValidationError as exc:
        raise ValueError(describe_error(exc.errors()[0], "arch")) from None


class Budget(_Section):
    """A run's length in compute instead of epochs: training tokens, or training FLOPs (lmpipe.flops)."""

    tokens: Optional[int] = Field(None, ge=1)
    flops: Optional[float] = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_of(self):
        if (self.tokens is None) == (self.flops is None):
            raise ValueError("budget needs exactly one of tokens or flops")
        return self


class ModelParams(_Section):
    """One entry of `models`: its family, architecture and how it trains. A setting stands only where it does
    something: `variable_bptt` on recurrent families, the SGD settings with SGD (OptimParams), and a run's length is
    the study's budget unless the entry states `epochs` (with `patience`) or a `budget` of its own, not both."""

    family: str = Field(description="a registered family (lmpipe.families): nplm, rnn, transformer, ...")
    arch: dict = Field(default_factory=dict)
    optim: OptimParams = AdamParams()
    batch_size: int = Field(32, ge=1)
    seq_len: int = Field(64, ge=2, description="BPTT length (recurrent) or window length (nplm, transformer)")
    variable_bptt: Optional[bool] = Field(None, description="recurrent only: AWD-LSTM's random BPTT lengths, lr "
                                          "rescaled (false when not given)")
    epochs: Optional[int] = Field(None, ge=1, description="train this many epochs, stopping early (patience), "
                                  "instead of the study's budget: not compute-matched")
    patience: Optional[int] = Field(None, ge=1, description="with epochs only: evaluations without a better valid "
                                    "loss before stopping (3 when not given)")
    budget: Optional[Budget] = Field(None, description="train for this many tokens or FLOPs instead of the study's "
                                     "budget: not compute-matched")
    max_steps_per_epoch: Optional[int] = Field(None, ge=1, description="cap for quick runs")

    @model_validator(mode="before")
    @classmethod
    def _defaults_that_apply(cls, data):
        """patience with epochs, variable_bptt on a recurrent family: their defaults, where they apply."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("epochs") is not None and data.get("patience") is None:
            data["patience"] = 3
        if data.get("family") in FAMILIES and FAMILIES[data["family"]].recurrent and data.get("variable_bptt") is None:
            data["variable_bptt"] = False
        return data

    @model_validator(mode="after")
    def _fits_family(self):
        """A registered family; one run length at most, and no setting that would do nothing; an arch it takes."""
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} is not registered (have: {', '.join(FAMILIES)}; "
                             "register yours in lmpipe/families.py FAMILIES)")
        if self.epochs is not None and self.budget is not None:
            raise ValueError("states both epochs and budget: a run's length is one of them (remove one)")
        _refuse_idle(self, {
            "patience": "patience stops a run of `epochs` early; a budget trains to its end (remove it)",
            "variable_bptt": f"variable_bptt is a recurrent model's setting, not a {self.family}'s (remove it)"})
        arch = arch_settings(self.family, self.arch)
        if self.family == "transformer" and self.seq_len > arch.block_size:
            raise ValueError("seq_len must not exceed arch.block_size for a transformer")
        return self

    @property
    def length_stated(self) -> bool:
        """Whether the entry states its run's length (epochs, or a budget of its own); else the study's budget."""
        return self.epochs is not None or self.budget is not None

    def stated_fields(self) -> set[str]:
        """The settings that do something for this entry: what params.yaml states for it, and nothing else."""
        off = {"epochs", "patience"} if self.epochs is None else set()
        off |= {"budget"} if self.budget is None else set()
        off |= set() if FAMILIES[self.family].recurrent else {"variable_bptt"}
        return set(type(self).model_fields) - off


Strategy = Literal["greedy", "beam", "top-k", "top-p", "typical", "sample"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


MAX_NEW_TOKENS = 1024  # new tokens one call may ask for: params.yaml, a flag of `lmpipe generate`, a served request
MAX_SEED = 2**63 - 1  # a decoding seed: numpy's seed entropy, and MLflow's `long`


class DecodingParams(_Section):
    """Every decoding setting with its one rule. params.yaml's `evaluate` is one (parsed as YAML), and so is each
    call's set of settings (`check_decoding`: `lmpipe generate`'s flags, a served request's params, DecodeSettings)."""
    max_new_tokens: int = Field(40, ge=1, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, gt=0)
    top_k: int = Field(40, ge=1)
    top_p: float = Field(0.9, gt=0, le=1)
    typical_p: float = Field(0.9, gt=0, le=1)
    beam_size: int = Field(5, ge=1)
    seed: int = Field(0, ge=0, le=MAX_SEED)


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


def check_decoding(changes: dict, defaults: DecodingParams | None = None) -> DecodingParams:
    """`changes` on top of `defaults`, each checked by its rule, strictly (a whole number must be an int: not a string,
    a float or a bool). A ConfigError names the first bad setting and its rule, never its value (a served request's
    value is a stranger's input)."""
    base = (defaults or DecodingParams()).model_dump(include=set(DecodingParams.model_fields))
    try:
        return DecodingParams.model_validate({**base, **changes}, strict=True)
    except ValidationError as exc:
        name = str(exc.errors()[0]["loc"][0])
        raise ConfigError(f"{name} must be {decoding_rule(name)}") from None


class EvaluateParams(DecodingParams):
    chunk: int = Field(128, ge=1, description="tokens per step; the transformer's sliding-window stride")
    prompts: list[str] = Field(default_factory=lambda: ["The history of", "In 1999, the", "Anarchism is"])
    strategies: list[Strategy] = Field(
        default_factory=lambda: ["greedy", "beam", "top-k", "top-p", "typical"])


class CombineParams(_Section):
    cache_windows: list[int] = Field(default_factory=lambda: [50, 100, 200, 500, 1000, 2000], min_length=1,
                                     description="windows W tried for the unigram cache (the last W tokens); the "
                                                 "one with the best valid likelihood is kept")

    @field_validator("cache_windows")
    @classmethod
    def _positive(cls, windows: list[int]) -> list[int]:
        if any(w < 1 for w in windows):
            raise ValueError("every cache window must be at least 1 token")
        return windows


class Word2VecParams(_Section):
    vector_size: int = Field(100, ge=2)
    window: int = Field(5, ge=1)
    min_count: int = Field(5, ge=1)
    epochs: int = Field(5, ge=1)
    sg: Literal[0, 1] = 1
    seed: int = 1234


class AuditParams(_Section):
    min_count: int = Field(5, ge=1, description="drop words rarer than this in the training text")
    min_words: int = Field(4, ge=2, description="fewer words than this in any set: insufficient_coverage")
    max_permutations: int = Field(100_000, ge=10)
    seed: int = 0
    embedding: Literal["input", "output"] = "input"
    custom_tests: Optional[str] = Field(None, description="YAML file of extra tests: {id: {X: [...], Y:, A:, B:}}")
    word2vec: Word2VecParams = Word2VecParams()


class RetrainParams(_Section):
    max_regression: float = Field(0.05, ge=0, description="fail when a model's test word ppl grows more than this")
    timeout: float = Field(7200, gt=0, description="seconds a retrain may run before Prefect ends it (TimedOut)")


class TrackingParams(_Section):
    experiment: str = Field("lmpipe", min_length=1)
    timeout_seconds: float = Field(10, gt=0, description="how long a stage waits for the tracking server at its start")


class OrchestrationParams(_Section):
    task_runner: Literal["sequential", "dask", "ray"] = Field(
        "sequential", description="how the study flow runs the train@<model> stages: one by one, or in parallel")
    address: Optional[str] = Field(None, description="a running Dask scheduler / Ray cluster; null starts a local one")
    workers: int = Field(2, ge=1, description="local cluster: worker processes (one model each at a time)")


class ScalingFitParams(_Section):
    bootstrap: int = Field(200, ge=0, description="resamplings of the runs for the fitted constants' intervals")
    seed: int = 0
    huber_delta: float = Field(1e-3, gt=0, description="Huber loss threshold on log-loss (Hoffmann et al.: 1e-3)")


class ScalingParams(_Section):
    """The scaling-law grid (scaling/dvc.yaml): every size of each listed model at every compute budget."""

    models: dict[str, list[dict]] = Field(
        default_factory=dict, description="an entry of `models` -> its sizes, each a dict of arch overrides")
    budgets: list[float] = Field(default_factory=list, description="training FLOPs of each run")
    overrides: dict = Field(default_factory=dict, description="dotted settings for every run, e.g. batch_size: 16")
    evals_per_epoch: int = Field(1, ge=1)
    fit: ScalingFitParams = ScalingFitParams()

    @model_validator(mode="after")
    def _budgets_positive(self):
        if any(b <= 0 for b in self.budgets):
            raise ValueError("budgets must be positive FLOP counts")
        return self


class StudyParams(_Section):
    """What the families are compared at: one training compute budget for every neural model."""

    budget: Optional[Budget] = Field(None, description="every model's training FLOPs; an entry of "
                                     "`models` with a budget of its own is an exception, marked 'not compute-matched' "
                                     "in the report; null: each model by its own epochs or budget, no equal compute")
    branches: list[float] = Field([], description="divisors k of the budget: each model on the study's budget also "
                                  "gives its annealed result at C/k, by a decay branch from its stable phase (wsd; "
                                  "Hägele et al. 2024), e.g. [16, 8, 4, 2]; [] for none")

    @model_validator(mode="after")
    def _compute(self):
        if self.budget is not None and self.budget.flops is None:
            raise ValueError("budget must be {flops: F}: the study compares the families at equal training compute")
        if self.branches and self.budget is None:
            raise ValueError("branches divide the study's budget: set study.budget, or branches: []")
        if any(k <= 1 for k in self.branches) or len(set(self.branches)) < len(self.branches):
            raise ValueError(f"branches {self.branches}: each a divisor above 1 (C/k is a smaller budget), once")
        return self

    @property
    def branch_budgets(self) -> list[float]:
        """The smaller budgets C/k, smallest first."""
        return sorted(self.budget.flops / k for k in self.branches) if self.budget is not None else []

    @property
    def flops(self) -> float | None:
        """C, the training FLOPs every model gets (None: no study budget)."""
        return self.budget.flops if self.budget is not None else None


class SeedsParams(_Section):
    """The seed spread (seeds/dvc.yaml, `lmpipe seeds`): every model retrained with these seeds beside `train.seed`."""

    extra: list[int] = Field(default_factory=lambda: [1, 2], description="train.seed values of the extra runs")

    @field_validator("extra")
    @classmethod
    def _distinct(cls, extra: list[int]) -> list[int]:
        if len(set(extra)) != len(extra):
            raise ValueError(f"seeds {extra} repeat a seed: each run needs its own")
        return extra


class Params(_Section):
    corpus: CorpusParams = CorpusParams()
    split: SplitParams = SplitParams()
    validate_: ValidateParams = Field(ValidateParams(), alias="validate")
    tokenizer: TokenizerParams = TokenizerParams()
    ngram: NgramParams = NgramParams()
    train: TrainParams = TrainParams()
    study: StudyParams = StudyParams()
    models: dict[str, ModelParams] = Field(default_factory=dict)
    evaluate: EvaluateParams = EvaluateParams()
    combine: CombineParams = CombineParams()
    audit: AuditParams = AuditParams()
    retrain: RetrainParams = RetrainParams()
    tracking: TrackingParams = TrackingParams()
    orchestration: OrchestrationParams = OrchestrationParams()
    scaling: ScalingParams = ScalingParams()
    seeds: SeedsParams = SeedsParams()

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("models")
    @classmethod
    def _model_names(cls, models: dict) -> dict:
        for name in models:
            if not MODEL_NAME.fullmatch(name):
                raise ValueError(f"model name {name!r}: use lowercase letters, digits, '-' and '_', starting with a "
                                 "letter, at most 40 characters (it names a DVC stage, a folder and an MLflow model)")
            if name in RESERVED_NAMES:
                raise ValueError(f"model name {name!r} is taken by the study's own {name} (choose another name)")
        return models

    @model_validator(mode="after")
    def _scaling_models_exist(self):
        missing = [m for m in self.scaling.models if m not in self.models]
        if missing:
            raise ValueError(f"scaling.models names {missing}, not entries of `models` (have: {', '.join(self.models)})")
        return self

    @model_validator(mode="after")
    def _every_model_has_a_length(self):
        if self.study.budget is None:
            lengthless = [name for name, entry in self.models.items() if not entry.length_stated]
            if lengthless:
                raise ValueError(f"models.{lengthless[0]} states neither epochs nor budget, and study.budget is null: "
                                 "give the study a budget, or the model one of its own")
        return self

    @model_validator(mode="after")
    def _seeds_apart_from_the_study(self):
        if self.train.seed in self.seeds.extra:
            raise ValueError(f"seeds.extra holds train.seed {self.train.seed}: the study's own run is already one "
                             "of the seeds (choose other values)")
        return self

    def model_settings(self, name: str) -> ModelParams:
        """models.<name> as it trains: at the study's budget unless the entry states epochs or a budget of its own."""
        entry = self.models[name]
        if entry.length_stated:
            return entry
        return entry.model_copy(update={"budget": self.study.budget})

    def budget_exceptions(self) -> list[str]:
        """The entries of `models` with a run length of their own (epochs or a budget): not compute-matched, whatever
        FLOPs they reach."""
        return [name for name, entry in self.models.items() if entry.length_stated]

    def section(self, name: str) -> dict:
        """One params section as plain data, as DVC sees it (for logging and hashing)."""
        return self.model_dump(mode="json", by_alias=True)[name]


def unstated_settings(raw: dict, model: type[BaseModel] = Params, where: str = "") -> list[str]:
    """Settings the raw params leave to a default in this file, which DVC cannot see: params.yaml states every one
    that does something (tests/test_graph.py holds the project's file to it; `lmpipe check-params` names any left
    out). `arch` is the exception (its defaults are its family's, in lmpipe/families.py), and so is a budget's
    other half. A model entry or an optimiser states only its settings that apply (`stated_fields`)."""
    if not isinstance(raw, dict) or model is Budget:
        return []
    applying = set(model.model_fields)
    if model is ModelParams:
        with contextlib.suppress(ValidationError):
            applying = ModelParams.model_validate(raw).stated_fields()
    missing = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        if name not in applying:
            continue
        if key not in raw:
            missing.append(f"{where}{key}")
        elif name == "optim" and model is ModelParams:
            missing += _unstated_optim(raw[key], f"{where}{key}.")
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            missing += unstated_settings(raw[key], field.annotation, f"{where}{key}.")
    if model is Params:
        for name, entry in (raw.get("models") or {}).items():
            missing += unstated_settings(entry, ModelParams, f"models.{name}.")
    return missing


def _unstated_optim(raw, where: str) -> list[str]:
    return sorted(f"{where}{name}" for name in optimiser_fields(raw) - set(raw)) if isinstance(raw, dict) else []


def params_hash(*sections: dict) -> str:
    """Short stable hash of some params: keys runs and checkpoints to a configuration."""
    blob = json.dumps(sections, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def describe_error(error: dict, within: str = "") -> str:
    """One pydantic error as `key: message (got value)`, the key inside `within` (a section's name)."""
    parts = [str(p) for p in error["loc"]
             if p not in OPTIMISER_TAGS and not str(p).startswith(("function-after", "function-before"))]
    key = ".".join(filter(None, [within, *parts])) or "(top level)"
    key = key.replace("validate_", "validate")
    if error["type"] == "extra_forbidden" and set(error["loc"]) & set(OPTIMISER_TAGS):
        if "sgd" in error["loc"]:
            return f"'{key}' is not a setting of SGD (remove it or fix its spelling)"
        return f"'{key}' is not a setting of adam, adamw and muon (remove it; momentum and nt_asgd are SGD's)"
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}' (remove it or fix its spelling)"
    message = error["msg"].removeprefix("Value error, ")
    got = error.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
    return f"{key}: {message}{shown}"


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and check params.yaml; raise ConfigError with a one-line message on any problem. The same text is parsed
    once per process (a stage's entry point checks it, then its flow reads it: one Params, frozen)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found (run from the project root, or pass the params file)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text (save it as UTF-8)") from None
    return _parsed(str(path), text)


@functools.lru_cache(maxsize=4)
def _parsed(path: str, text: str) -> Params:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML{yaml_error_place(exc)} (fix the syntax)") from None
    return parse_params(raw, Path(path))


def yaml_error_place(exc: yaml.YAMLError) -> str:
    """' at line L, column C: problem'. A scanner error (a key without ':', an unclosed quote) is only noticed on
    a later line; the token it was reading starts on the line to fix, so that line is named."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "syntax error"
    if isinstance(exc, yaml.scanner.ScannerError) and exc.context_mark is not None:
        mark, problem = exc.context_mark, f"{problem} ({exc.context})"
    return f" at line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else f": {problem}"


def parse_params(raw, source: str | Path = "params") -> Params:
    """Check already-read params (e.g. params.yaml with overrides applied); `source` names them in errors."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: must be a mapping of sections (corpus, split, ...), got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"{source}: {describe_error(errors[0])}{more}") from None
