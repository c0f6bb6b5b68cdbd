"""What every training entry point does around the loop: `prepare` a run, `job.trainer.run()`, `publish` what it made.

The five entry points (the train stage, the seeds, the scaling grid, a sweep's trials and `python -m lmpipe.train`)
differ only in what they change of params.yaml's settings and where their results go; the steps are these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from lmpipe import checkpoints, distributed, tracking
from lmpipe.checkpoints import checkpoint_dir, prune, run_key
from lmpipe.config import Params, TrainParams
from lmpipe.errors import ConfigError, describe_error
from lmpipe.model_params import ModelParams
from lmpipe.overrides import with_overrides
from lmpipe.io import atomic_path, csv_text, payload_bytes, without_timings, write_json, write_text
from lmpipe.models import save_model
from lmpipe.splits import TokenData, load_tokens
from lmpipe.train.trainer import Trainer, TrainResult, setup_process


def prepare(params: Params, model: str, ckpt_root: str | Path, *, overrides: dict | None = None,
            budget: dict | None = None, train: dict | None = None, data: TokenData | None = None,
            params_file: str = "params.yaml", progress_bar: bool = False) -> Job:
    """`models.<model>` of params.yaml with this run's changes (dotted settings, a budget, fields of `train` such as
    the seed; `configure_run` checks them), the token data, and the run's checkpoint folder under
    `ckpt_root`. A typo fails here, before any training."""
    settings, common = configure_run(params, model, overrides, budget, train, params_file)
    return Job(model, settings, common, data if data is not None else load_tokens(), Path(ckpt_root), progress_bar)


def configure_run(params: Params, model: str, overrides: dict | None = None, budget: dict | None = None,
                  train: dict | None = None, params_file: str = "params.yaml") -> tuple[ModelParams, TrainParams]:
    """(`models.<model>`, the `train` section) with a run's changes: dotted settings of the model, a budget, and
    fields of `train` such as the seed. Every run is set up here: the study's stages, seeds, sweeps, the scaling grid
    and python -m lmpipe.train through `prepare`, the benchmarks directly."""
    if model not in params.models:
        raise ConfigError(f"{params_file}: models has no entry {model!r} (have: {', '.join(params.models) or 'none'})")
    settings = with_overrides(params.model_settings(model), overrides or {}, budget)
    try:
        common = TrainParams.model_validate({**params.train.model_dump(), **(train or {})})
    except ValidationError as exc:
        raise ConfigError(f"train {train}: {describe_error(exc.errors()[0])}") from None
    return settings, common


def row_file(folder: str | Path, name: str, key: str) -> Path:
    """Where a finished run's row is kept under its key (`Job.cached`); the grid's tools look for it there too."""
    return Path(folder) / f"{name}-{key}.json"


@dataclass
class Job:
    """One training run, set up: its settings, its data, its checkpoint folder (keyed by everything that decides
    the run, so only the same run resumes there) and its Trainer."""

    name: str
    settings: ModelParams
    common: TrainParams
    data: TokenData
    ckpt_root: Path
    progress_bar: bool = False

    @property
    def chosen(self) -> dict:
        """The settings that define the run: its MLflow params and its checkpoint key."""
        return {"train": self.common.model_dump(mode="json"), "model": self.settings.model_dump(mode="json")}

    def key(self, **extra) -> str:
        """What decides this run's result (`checkpoints.run_key`), with `extra`, e.g. the precision it trains in."""
        return run_key(self.chosen, self.data.fingerprint, **extra)

    def identity(self, **extra) -> str:
        """What made this run's numbers, its seed aside (`key` without `train.seed`): the same for every seed of one
        study's model, on any machine. The seeds' rows hold while the study's training has it (lmpipe.seeds)."""
        chosen = {**self.chosen, "train": {k: v for k, v in self.chosen["train"].items() if k != "seed"}}
        return run_key(chosen, self.data.fingerprint, **extra)

    def cached(self, folder: Path, name: str, key: str, train: Callable[[], dict],
               reused: Callable[[dict], None]) -> dict:
        """This run's row, kept in `folder` under `key` (`key(...)`, with what else the row depends on): read back
        (and `reused` told) when an identical run finished before, else `train()`ed, kept, and its checkpoints
        dropped. The seeds and the scaling grid resume by it."""
        done = row_file(folder, name, key)
        if done.exists():
            row = json.loads(done.read_text())
            reused(row)
            return row
        row = train()
        write_json(done, row)
        checkpoints.discard(self.ckpt_dir)
        return row

    @cached_property
    def ckpt_dir(self) -> Path:
        return checkpoint_dir(self.ckpt_root, self.name, self.chosen, self.data.fingerprint,
                              distributed.launched().world)

    @cached_property
    def trainer(self) -> Trainer:
        """Built on first use, right after the process setup that seeds its initial weights: a caller that finds
        the run's result cached never builds one. Older runs' checkpoints of the model (abandoned settings) go first."""
        if distributed.launched().main:
            prune(self.ckpt_dir, self.name)
        return Trainer(self.name, self.settings, self.common, self.data, self.ckpt_dir, setup_process(self.common),
                       progress_bar=self.progress_bar)

    def branch(self, flops: float) -> Job:
        """The run of this one's settings at the smaller budget of `flops` training FLOPs: a run of its own (its
        settings, checkpoint folder, result), which a decay branch of this run gives without training its stable
        phase again (`run(branches=...)`; Hägele et al. 2024)."""
        return Job(f"{self.name}@{flops:.3g}", with_overrides(self.settings, {}, {"flops": flops}), self.common,
                   self.data, self.ckpt_root, self.progress_bar)

    def run(self, on_eval=None, branches: list[Job] = ()) -> TrainResult:
        """Train (resuming where a checkpoint is). Each of `branches` (`branch`) gets this run's state at the step
        where its own decay starts, as its checkpoint: its `run()` then resumes there and decays to its budget, and
        ends exactly as its run from scratch would."""
        points = {self.trainer.decay_start(b.settings.budget): checkpoints.make_dir(b.ckpt_dir, b.name)
                  for b in branches}
        return self.trainer.run(on_eval=on_eval, branches=points)


@dataclass(frozen=True)
class Outputs:
    """Where a trained model's files go: its folder (model.pt), its metrics (JSON) and its learning curve (CSV)."""

    model_dir: str | Path
    metrics: str | Path
    curve: str | Path


def publish(run, result: TrainResult, out: Outputs | None = None) -> None:
    """What a finished run leaves: its files at `out` (timings left out: they differ from run to run), and all its
    MLflow `run` records (None: an untracked run; `tracking.record_training`). Call it before
    `checkpoints.discard`: a failure here resumes the finished run instead of training it again."""
    if out is not None:
        with atomic_path(out.model_dir, need=payload_bytes(result.model.state_dict())) as tmp:
            tmp.mkdir()
            save_model(result.model, result.settings.family, result.settings.arch, tmp / "model.pt")
        write_json(out.metrics, without_timings(result.metrics))
        write_text(out.curve, csv_text([without_timings(r) for r in result.history]))
    if run is not None:
        tracking.record_training(run.info.run_id, result.metrics, out and out.curve, out and out.model_dir)
