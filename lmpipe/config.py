"""Typed view of params.yaml: the single source of every setting, and its reading.

Every setting is a required field: params.yaml states each, so DVC sees it (a default here would be a setting DVC
cannot see). A model's entry is lmpipe.model_params', the decoding settings' rules lmpipe.decode_rules'. Unknown,
missing, mistyped and impossible settings fail here with one line naming the key (lmpipe.errors.describe_error).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import ByteSize, ConfigDict, Field, ValidationError, field_validator, model_validator

from lmpipe.decode_rules import DecodingParams, Strategy
from lmpipe.errors import ConfigError, describe_error, meant
from lmpipe.model_params import Budget, ModelParams, Section
from lmpipe.paths import BASELINE, WORD2VEC

SOURCES = ("enwiki-sample", "wikipedia-dump", "wikitext-2", "wikitext-103", "local")
# A model's name is a DVC stage (train@<name>), a folder (models/<name>), a Prefect artifact key and an MLflow
# registered model (lmpipe-<name>): lowercase letters, digits, '-' and '_', starting with a letter, which all take.
MODEL_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
RESERVED_NAMES = (BASELINE, Path(WORD2VEC).name, "cache")  # the baseline's and the audit reference's rows and
# folders; the combination's unigram cache (lmpipe.compare.CACHE)


class LocalFiles(Section):
    train: str
    valid: str
    test: str


class CorpusParams(Section):
    source: Literal[SOURCES]
    url: Optional[str] = Field(description="wikipedia-dump: URL or path of the dump; wikitext-*: mirror URL")
    sha256: Optional[str] = Field(pattern=r"^[0-9a-f]{64}$")
    files: Optional[LocalFiles]
    max_articles: Optional[int] = Field(ge=3)
    min_article_words: int = Field(ge=0)

    @model_validator(mode="after")
    def _source_needs(self):
        if self.source == "wikipedia-dump" and not self.url:
            raise ValueError("corpus.source 'wikipedia-dump' needs corpus.url (a dump URL or local path)")
        if self.source == "local" and self.files is None:
            raise ValueError("corpus.source 'local' needs corpus.files with train, valid and test paths")
        return self


class SplitParams(Section):
    seed: int
    valid: float = Field(gt=0, lt=0.5)
    test: float = Field(gt=0, lt=0.5)


class ValidateParams(Section):
    min_words: int = Field(ge=1, description="minimum words in every split")
    min_line_chars: int = Field(ge=1)
    max_line_chars: int = Field(ge=10)
    max_oov_rate: float = Field(ge=0, le=1, description="share of valid/test words unseen in train")


class TokenizerParams(Section):
    vocab_size: int = Field(ge=260, le=2**32 - 1)
    min_frequency: int = Field(ge=1)
    boundary_token: str = Field(min_length=1)


class NgramParams(Section):
    order: int = Field(ge=1, le=5)
    method: Literal["kneser_ney", "add_k", "stupid_backoff"]
    k: float = Field(gt=0, description="add_k: the pseudo-count delta")
    alpha: float = Field(gt=0, lt=1, description="stupid_backoff: the back-off factor")
    memory: ByteSize = Field(gt=0, description="the build's memory bound: bigger corpora count in more shards and "
                             "partitions (e.g. 4GiB, 512MiB)")
    workers: int = Field(ge=0, description="shard tasks at once on the local cores; 0 = the cores (on a Dask/Ray "
                         "orchestration.task_runner: its workers)")


class TrainParams(Section):
    """Settings every neural model shares."""

    seed: int
    device: Literal["auto", "cpu", "cuda", "mps"]
    threads: int = Field(ge=0, description="CPU threads; 0 = torch's default (cores, or OMP_NUM_THREADS)")
    log_every: int = Field(ge=1, description="steps between progress updates (the only host syncs)")
    checkpoint_every: int = Field(ge=1, description="steps between resumable checkpoints")
    eval_chunk: int = Field(ge=1, description="tokens per evaluation chunk (window stride, at most half a block)")
    evals_per_epoch: int = Field(ge=1, description="validation points per epoch (learning curves, early stopping)")
    compile: bool
    precision: Literal["auto", "fp32", "bf16"] = Field(
        description="training matmuls: auto = bf16 autocast where the device computes bf16 natively (CUDA; CPUs "
        "with AVX512-BF16 or AMX), else fp32; evaluation is always fp32")


class EvaluateParams(DecodingParams):
    chunk: int = Field(ge=1, description="tokens per step; the transformer's sliding-window stride")
    prompts: list[str]
    strategies: list[Strategy]


class CombineParams(Section):
    cache_windows: list[int] = Field(min_length=1, description="windows W tried for the unigram cache (the last W "
                                     "tokens); the one with the best valid likelihood is kept")

    @field_validator("cache_windows")
    @classmethod
    def _positive(cls, windows: list[int]) -> list[int]:
        if any(w < 1 for w in windows):
            raise ValueError("every cache window must be at least 1 token")
        return windows


class Word2VecParams(Section):
    vector_size: int = Field(ge=2)
    window: int = Field(ge=1)
    min_count: int = Field(ge=1)
    epochs: int = Field(ge=1)
    sg: Literal[0, 1]
    seed: int


class AuditParams(Section):
    min_count: int = Field(ge=1, description="drop words rarer than this in the training text")
    min_words: int = Field(ge=2, description="fewer words than this in any set: insufficient_coverage")
    max_permutations: int = Field(ge=10)
    seed: int
    embedding: Literal["input", "output"]
    custom_tests: Optional[str] = Field(description="YAML file of extra tests: {id: {X: [...], Y:, A:, B:}}")
    word2vec: Word2VecParams


class RetrainParams(Section):
    max_regression: float = Field(ge=0, description="fail when a model's test word ppl grows more than this")
    timeout: float = Field(gt=0, description="seconds a retrain may run before Prefect ends it (TimedOut)")


class TrackingParams(Section):
    experiment: str = Field(min_length=1)
    timeout_seconds: float = Field(gt=0, description="how long a stage waits for the tracking server at its start")


class OrchestrationParams(Section):
    task_runner: Literal["sequential", "dask", "ray"] = Field(
        description="how the study flow runs the train@<model> stages: one by one, or in parallel")
    address: Optional[str] = Field(description="a running Dask scheduler / Ray cluster; null starts a local one")
    workers: int = Field(ge=1, description="local cluster: worker processes (one model each at a time)")


class ScalingFitParams(Section):
    bootstrap: int = Field(ge=0, description="resamplings of the runs for the fitted constants' intervals")
    seed: int
    huber_delta: float = Field(gt=0, description="Huber loss threshold on log-loss (Hoffmann et al.: 1e-3)")


class SeedsParams(Section):
    """The seed spread (seeds/dvc.yaml, `lmpipe seeds`): every model retrained with these seeds beside `train.seed`."""

    extra: list[int] = Field(description="train.seed values of the extra runs")

    @field_validator("extra")
    @classmethod
    def _distinct(cls, extra: list[int]) -> list[int]:
        if len(set(extra)) != len(extra):
            raise ValueError(f"seeds {extra} repeat a seed: each run needs its own")
        return extra


class ScalingSeedsParams(SeedsParams):
    """Extra runs of the grid's points where one seed's luck decides the minima: at the smallest budgets a size keeps
    its seed's offset at every budget (sweeps/notes.md). A point's loss is its runs' mean."""

    extra: list[int] = Field(description="train.seed of each extra run of a point, beside train.seed")
    budgets: list[float] = Field(description="the budgets of scaling.budgets whose every size runs with each extra "
                                 "seed")


class AroundBest(Section):
    """A budget past the full grid, where each family trains only the sizes around its best: the best size there
    and its neighbours (a full grid at the largest budgets would spend most of its compute far from any minimum)."""

    budget: float = Field(gt=0, description="training FLOPs of each run")
    models: dict[str, list[dict]] = Field(description="a family of scaling.models -> the sizes it runs at this "
                                          "budget, each a dict of arch overrides")


class ScalingParams(Section):
    """The scaling-law grid (scaling/dvc.yaml): every size of each listed model at every compute budget, and at the
    budgets of `around_best` the sizes each lists."""

    models: dict[str, list[dict]] = Field(description="an entry of `models` -> its sizes, each a dict of arch "
                                          "overrides")
    budgets: list[float] = Field(description="training FLOPs of each run")
    overrides: dict = Field(description="dotted settings for every run, e.g. batch_size: 16")
    evals_per_epoch: int = Field(ge=1)
    precision: Literal["auto", "fp32", "bf16"] = Field(
        description="every grid run's training precision, the same on every machine, so that rows trained on "
        "different machines belong to one grid (auto: each machine's own, as train.precision)")
    seeds: ScalingSeedsParams
    fit: ScalingFitParams
    around_best: list[AroundBest] = Field(default=[], description="budgets where each family runs only the sizes "
                                          "listed: its best size there and its neighbours")

    @model_validator(mode="after")
    def _budgets_of_the_grid(self):
        """Positive budgets, each either the full grid's or around_best's; families and seeded budgets of the grid."""
        if any(b <= 0 for b in self.budgets):
            raise ValueError("budgets must be positive FLOP counts")
        focused = [a.budget for a in self.around_best]
        if twice := sorted({b for b in focused if b in self.budgets or focused.count(b) > 1}):
            raise ValueError(f"around_best budget {', '.join(f'{b:g}' for b in twice)}: already a budget of the grid "
                             "(a budget is either in budgets, every size, or once in around_best)")
        if strays := sorted({m for a in self.around_best for m in a.models if m not in self.models}):
            raise ValueError(f"around_best names {', '.join(strays)}, not a family of scaling.models (add it there)")
        if stray := [b for b in self.seeds.budgets if b not in self.budgets + focused]:
            raise ValueError(f"seeds.budgets {', '.join(f'{b:g}' for b in stray)}: not in budgets (name budgets of "
                             "the grid)")
        return self

    def all_sizes(self) -> dict[str, list[dict]]:
        """Every size the grid runs of each family, at any budget: its sizes, then those only around_best names."""
        sizes = {model: list(listed) for model, listed in self.models.items()}
        for entry in self.around_best:
            for model, listed in entry.models.items():
                sizes[model] += [size for size in listed if size not in sizes[model]]
        return sizes



class StudyParams(Section):
    """What the families are compared at: one training compute budget for every neural model."""

    budget: Optional[Budget] = Field(description="every model's training FLOPs; an entry of `models` with a budget "
                                     "of its own is an exception, marked 'not compute-matched' in the report; null: "
                                     "each model by its own epochs or budget, no equal compute")
    branches: list[float] = Field(description="divisors k of the budget: each model on the study's budget also gives "
                                  "its annealed result at C/k, by a decay branch from its stable phase (wsd; Hägele "
                                  "et al. 2024), e.g. [16, 8, 4, 2]; [] for none")

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


class Params(Section):
    corpus: CorpusParams
    split: SplitParams
    validate_: ValidateParams = Field(alias="validate")
    tokenizer: TokenizerParams
    ngram: NgramParams
    train: TrainParams
    study: StudyParams
    models: dict[str, ModelParams]
    evaluate: EvaluateParams
    combine: CombineParams
    audit: AuditParams
    retrain: RetrainParams
    tracking: TrackingParams
    orchestration: OrchestrationParams
    scaling: ScalingParams
    seeds: SeedsParams

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
    def _across_sections(self):
        """What one section asks of another: the grid's models exist, every model has a run length, the extra seeds
        are not the study's own."""
        missing = [m for m in self.scaling.models if m not in self.models]
        if missing:
            raise ValueError(f"scaling.models names {missing}, not entries of `models` (have: {', '.join(self.models)})")
        lengthless = [name for name, entry in self.models.items() if not entry.length_stated]
        if self.study.budget is None and lengthless:
            raise ValueError(f"models.{lengthless[0]} states neither epochs nor budget, and study.budget is null: "
                             "give the study a budget, or the model one of its own")
        for section, extra in (("seeds", self.seeds.extra), ("scaling.seeds", self.scaling.seeds.extra)):
            if self.train.seed in extra:
                raise ValueError(f"{section}.extra holds train.seed {self.train.seed}: the run of train.seed is "
                                 "already one of the seeds (choose other values)")
        return self

    def model_settings(self, name: str) -> ModelParams:
        """models.<name> as it trains: at the study's budget unless the entry states epochs or a budget of its own."""
        entry = self.models[name]
        if entry.length_stated:
            return entry
        return entry.model_copy(update={"budget": self.study.budget})

    def branches_of(self, settings: ModelParams) -> list[float]:
        """The budgets C/k a run of `settings` decays to by branches (`study.branches`): a run on the study's budget
        has them, one with a length of its own none."""
        on_study_budget = self.study.budget is not None and settings.budget == self.study.budget
        return self.study.branch_budgets if on_study_budget else []

    def budget_exceptions(self) -> list[str]:
        """The entries of `models` with a run length of their own (epochs or a budget): not compute-matched, whatever
        FLOPs they reach."""
        return [name for name, entry in self.models.items() if entry.length_stated]

    def section(self, name: str) -> dict:
        """One params section as plain data, as DVC sees it (for logging and hashing)."""
        return self.model_dump(mode="json", by_alias=True)[name]


def params_hash(*sections: dict) -> str:
    """Short stable hash of some params: keys runs and checkpoints to a configuration."""
    blob = json.dumps(sections, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


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
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")  # a misspelt key says why first
        misspelt = meant(errors[0], errors)  # the key it misspells is missing too: one mistake, said once
        rest = [e for e in errors[1:] if e is not misspelt]
        also = f"; also {describe_error(rest[0])}" if rest else ""
        more = f" (and {len(rest) - 1} more)" if len(rest) > 1 else ""
        instead = str(misspelt["loc"][-1]) if misspelt else None
        raise ConfigError(f"{source}: {describe_error(errors[0], instead=instead)}{also}{more}") from None
