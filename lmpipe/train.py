"""One training loop for every neural model.

Recurrent models read the train split as `batch_size` contiguous streams, carrying (detached) hidden
state across chunks; window models (NPLM, Transformer) read windows at shuffled offsets. Each epoch's
batch plan comes from (seed, epoch) alone and the torch RNG state is checkpointed, so a run killed at
any step resumes from its last checkpoint and ends with the same weights as an uninterrupted run.

Under `torchrun --nproc-per-node N -m lmpipe.train` the global batch is split over N processes
(DistributedDataParallel: NCCL on GPUs, gloo on CPU); each process reads its own rows of every batch,
gradients are averaged, so N processes follow the curve of one process with the same batch_size.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lmpipe import distributed
from lmpipe.config import ModelParams, TrainParams
from lmpipe.errors import ConfigError
from lmpipe.evaluate import perplexities, stream_nll
from lmpipe.models import StreamLM, build_model, count_parameters
from lmpipe.splits import TokenData


def pick_device(choice: str = "auto", local_rank: int = 0) -> torch.device:
    if choice != "auto":
        return torch.device(choice)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def configure_device(device: torch.device, threads: int) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif threads:
        torch.set_num_threads(threads)  # else torch's default: the cores, or OMP_NUM_THREADS


# ---------------- batch plans: pure functions of (data, settings, seed, epoch) ----------------

def stream_plan(n_steps_total: int, settings: ModelParams, rng: np.random.Generator) -> list[tuple[int, int]]:
    """(start, length) chunks over a batchified stream; AWD-LSTM's variable BPTT when asked."""
    plan, start = [], 0
    while start < n_steps_total - 1:
        length = settings.seq_len
        if settings.variable_bptt:
            base = settings.seq_len if rng.random() < 0.95 else settings.seq_len / 2
            length = max(5, int(rng.normal(base, 5)))
        length = min(length, n_steps_total - 1 - start)
        plan.append((start, length))
        start += length
    return plan


def window_plan(n_tokens: int, settings: ModelParams, context: int, rng: np.random.Generator) -> np.ndarray:
    """Shuffled window offsets (one window = seq_len inputs + targets), as (steps, batch) rows."""
    length = settings.seq_len
    shift = int(rng.integers(0, length))
    offsets = np.arange(context + shift, n_tokens - length - 1, length)
    offsets = rng.permutation(offsets)
    usable = len(offsets) // settings.batch_size * settings.batch_size
    return offsets[:usable].reshape(-1, settings.batch_size)


def window_context(model: StreamLM) -> int:
    """Tokens before a window that a window model reads as its state during training (NPLM: n-1 - 1)."""
    return getattr(model, "context", 1) - 1


@dataclass
class TrainResult:
    model: StreamLM
    history: list[dict]
    metrics: dict
    device: str


@dataclass
class _Progress:
    epoch: int = 0
    step: int = 0
    best_loss: float = math.inf
    best_epoch: int = -1
    asgd: bool = False
    base_lr: float | None = None  # halved on plateau; frozen when ASGD takes over
    history: list = field(default_factory=list)
    bad_epochs: int = 0


def _optimizer(model, optim, device, asgd: bool):
    params = model.parameters()
    if asgd:
        return torch.optim.ASGD(params, lr=optim.lr, t0=0, lambd=0.0, weight_decay=optim.weight_decay)
    if optim.name == "sgd":
        return torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay)
    kwargs = {"fused": True} if device.type == "cuda" else {}
    cls = torch.optim.AdamW if optim.name == "adamw" else torch.optim.Adam
    return cls(params, lr=optim.lr, weight_decay=optim.weight_decay, **kwargs)


def _lr_factor(optim, step: int, total: int) -> float:
    if optim.warmup_steps and step < optim.warmup_steps:
        return (step + 1) / optim.warmup_steps
    if optim.schedule == "cosine":
        progress = (step - optim.warmup_steps) / max(1, total - optim.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return 1.0


class _Averaged:
    """Swap ASGD's averaged weights in for evaluation and saving, as AWD-LSTM does."""

    def __init__(self, model, optimizer, active: bool):
        self.model, self.optimizer, self.active, self.saved = model, optimizer, active, {}

    def __enter__(self):
        if self.active:
            for p in self.model.parameters():
                state = self.optimizer.state.get(p, {})
                if "ax" in state:
                    self.saved[p] = p.detach().clone()
                    p.data.copy_(state["ax"])
        return self

    def __exit__(self, *exc):
        for p, value in self.saved.items():
            p.data.copy_(value)


class Trainer:
    """Train one model; `run()` resumes from `ckpt_dir/last.pt` when it exists."""

    def __init__(self, name: str, settings: ModelParams, common: TrainParams, data: TokenData,
                 ckpt_dir: str | Path, on_epoch: Callable[[dict], None] | None = None, progress_bar: bool = True):
        self.name, self.settings, self.common, self.data = name, settings, common, data
        self.ckpt_dir = Path(ckpt_dir)
        self.on_epoch = on_epoch or (lambda metrics: None)
        self.ranks = ranks = distributed.launched()
        if settings.batch_size % ranks.world:
            raise ConfigError(f"models.{name}.batch_size: {settings.batch_size} does not split over {ranks.world} "
                              f"processes (make it a multiple of {ranks.world})")
        self.progress_bar = progress_bar and ranks.main
        self.device = pick_device(common.device, ranks.local)
        configure_device(self.device, common.threads or (max(1, (os.cpu_count() or 1) // ranks.local_world)
                                                         if ranks.world > 1 else 0))
        distributed.join(ranks, self.device)
        torch.manual_seed(common.seed)  # the same initial weights in every process
        self.model = build_model(settings.family, settings.arch, data.vocab_size, data.boundary).to(self.device)
        forward = self.model
        if ranks.world > 1:
            torch.manual_seed(common.seed + ranks.rank)  # each process its own dropout masks
            forward = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.forward = torch.compile(forward) if common.compile else forward
        self.train_tokens = torch.from_numpy(
            np.concatenate([[data.boundary], data.splits["train"].tokens.astype(np.int64)]))
        self.progress = _Progress()
        self.optimizer = _optimizer(self.model, settings.optim, self.device, asgd=False)
        self.progress.base_lr = settings.optim.lr
        self.state = None  # carried hidden state (recurrent models)

    # ---------- batches ----------
    def _epoch_plan(self, epoch: int):
        rng = np.random.default_rng([self.common.seed, epoch])
        if self.model.recurrent:
            columns = len(self.train_tokens) // self.settings.batch_size
            plan = stream_plan(columns, self.settings, rng)
        else:
            plan = list(window_plan(len(self.train_tokens), self.settings, window_context(self.model), rng))
        if self.settings.max_steps_per_epoch:
            plan = plan[: self.settings.max_steps_per_epoch]
        return plan

    def _rows(self) -> slice:
        """This process's rows of every global batch."""
        per = self.settings.batch_size // self.ranks.world
        return slice(self.ranks.rank * per, (self.ranks.rank + 1) * per)

    def _batch(self, item):
        """(inputs, targets, window state or None) on the device: this process's rows of the batch."""
        if self.model.recurrent:
            start, length = item
            columns = len(self.train_tokens) // self.settings.batch_size
            data = self.train_tokens[: columns * self.settings.batch_size].view(self.settings.batch_size, columns)
            data = data[self._rows()]
            x, y = data[:, start:start + length], data[:, start + 1:start + 1 + length]
            return x.to(self.device), y.to(self.device), None
        context = window_context(self.model)
        index = torch.from_numpy(item[self._rows()])[:, None] + torch.arange(-context, self.settings.seq_len + 1)[None, :]
        windows = self.train_tokens[index].to(self.device)
        return windows[:, context:-1], windows[:, context + 1:], (windows[:, :context] if context > 0 else None)

    def _steps_total(self) -> int:
        return self.settings.epochs * len(self._epoch_plan(0))

    # ---------- checkpoints ----------
    def _last(self) -> Path:
        """The resumable checkpoint: one per process (each has its own RNG and hidden state)."""
        return self.ckpt_dir / ("last.pt" if self.ranks.main else f"last.rank{self.ranks.rank}.pt")

    def _save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "progress": self.progress.__dict__,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None,
            "state": self.state,
        }, tmp)
        os.replace(tmp, path)

    def _resume(self) -> bool:
        path = self._last()
        if not path.exists():
            return False
        ckpt = torch.load(path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(ckpt["model"])
        self.progress = _Progress(**ckpt["progress"])
        self.optimizer = _optimizer(self.model, self.settings.optim, self.device, self.progress.asgd)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["torch_rng"].cpu())
        if ckpt["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
        self.state = ckpt["state"]
        return True

    # ---------- the loop ----------
    def _valid(self) -> dict:
        split = self.data.splits["valid"]
        with _Averaged(self.model, self.optimizer, self.progress.asgd):
            nll, n = stream_nll(self.model, split.tokens, self.common.eval_chunk, self.device)
        return perplexities(nll, n, split.words, split.bytes)

    def _train_step(self, x, y, state, lr: float):
        if self.model.recurrent:
            state = self.model.detach_state(self.state)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda")
        with autocast:
            logits, new_state = self.forward(x, state)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            objective = loss + self.model.extra_loss()
        if self.model.recurrent:
            self.state = new_state
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.optim.clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        return loss.detach(), grad_norm.detach(), x.numel() * self.ranks.world

    def run(self, stop_after_step: int | None = None) -> TrainResult:
        """Train to the end (or raise KeyboardInterrupt after global step `stop_after_step`, for tests)."""
        self._resume()
        total_steps = self._steps_total()
        steps_per_epoch = len(self._epoch_plan(0))
        optim = self.settings.optim
        global_step = self.progress.epoch * steps_per_epoch + self.progress.step
        while self.progress.epoch < self.settings.epochs:
            epoch = self.progress.epoch
            plan = self._epoch_plan(epoch)
            if self.progress.step == 0:
                self.state = None
            self.model.train()
            loss_sum = torch.zeros((), device=self.device)
            norm_sum = torch.zeros((), device=self.device)
            tokens, started, counted = 0, time.perf_counter(), 0
            bar = tqdm(total=len(plan), initial=self.progress.step, desc=f"{self.name} epoch {epoch + 1}",
                       disable=not self.progress_bar, leave=False)
            for index in range(self.progress.step, len(plan)):
                x, y, state = self._batch(plan[index])
                lr = self.progress.base_lr
                if not self.progress.asgd:
                    lr *= _lr_factor(optim, global_step, total_steps)
                if self.model.recurrent and self.settings.variable_bptt:
                    lr *= x.size(1) / self.settings.seq_len  # AWD-LSTM: shorter sequences, smaller steps
                loss, norm, n = self._train_step(x, y, state, lr)
                loss_sum += loss
                norm_sum += norm
                tokens += n
                counted += 1
                global_step += 1
                self.progress.step = index + 1
                if (index + 1) % self.common.log_every == 0:  # the only host sync in the loop
                    bar.set_postfix(loss=f"{float(loss_sum) / counted:.3f}",
                                    tok_s=f"{tokens / (time.perf_counter() - started):.0f}")
                bar.update(1)
                if (index + 1) % self.common.checkpoint_every == 0 and index + 1 < len(plan):
                    self._save(self._last())
                if stop_after_step is not None and global_step >= stop_after_step:
                    self._save(self._last())
                    raise KeyboardInterrupt(f"stopped after step {global_step}")
            bar.close()
            seconds = time.perf_counter() - started
            loss_sum = distributed.mean(loss_sum, self.ranks)
            self._end_epoch(epoch, float(loss_sum) / max(counted, 1), float(norm_sum) / max(counted, 1),
                            tokens / max(seconds, 1e-9), seconds)
            if self.progress.bad_epochs >= self.settings.patience:
                break
        return self._finish()

    def _end_epoch(self, epoch: int, train_loss: float, grad_norm: float, tokens_per_sec: float, seconds: float):
        valid = self._valid()
        optim = self.settings.optim
        record = {
            "epoch": epoch + 1, "train_loss": train_loss, "train_ppl": math.exp(min(train_loss, 50)),
            "valid_loss": valid["loss"], "valid_ppl": valid["ppl"], "valid_word_ppl": valid["word_ppl"],
            "valid_bpb": valid["bpb"], "lr": self.optimizer.param_groups[0]["lr"], "grad_norm": grad_norm,
            "tokens_per_sec": tokens_per_sec, "epoch_seconds": seconds, "asgd": int(self.progress.asgd),
        }
        history = self.progress.history
        history.append(record)
        improved = valid["loss"] < self.progress.best_loss
        if improved:
            self.progress.best_loss, self.progress.best_epoch, self.progress.bad_epochs = valid["loss"], epoch + 1, 0
            with _Averaged(self.model, self.optimizer, self.progress.asgd):
                self.ckpt_dir.mkdir(parents=True, exist_ok=True)
                if self.ranks.main:
                    torch.save(self.model.state_dict(), self.ckpt_dir / "best.pt")
        else:
            self.progress.bad_epochs += 1
        losses = [h["valid_loss"] for h in history]
        if (optim.name == "sgd" and optim.nt_asgd and not self.progress.asgd
                and len(losses) > optim.nonmono and losses[-1] > min(losses[:-optim.nonmono])):
            self.progress.asgd = True  # NT-ASGD: validation stopped improving, start averaging
            self.optimizer = _optimizer(self.model, optim, self.device, asgd=True)
        elif optim.schedule == "plateau" and not improved and not self.progress.asgd:
            self.progress.base_lr *= 0.5  # halve on plateau
        self.progress.epoch, self.progress.step = epoch + 1, 0
        self._save(self._last())
        if self.ranks.main:
            self.on_epoch(record)

    def _finish(self) -> TrainResult:
        distributed.barrier(self.ranks)  # best.pt is written by the main process
        self.model.load_state_dict(torch.load(self.ckpt_dir / "best.pt", map_location=self.device, weights_only=True))
        history = self.progress.history
        best = history[self.progress.best_epoch - 1]
        metrics = {
            "model": self.name,
            "family": self.settings.family,
            "n_params": count_parameters(self.model),
            "epochs": len(history),
            "best_epoch": self.progress.best_epoch,
            "valid_ppl": best["valid_ppl"],
            "valid_word_ppl": best["valid_word_ppl"],
            "valid_bpb": best["valid_bpb"],
            "tokens_per_sec": float(np.mean([h["tokens_per_sec"] for h in history])),
            "device": self.device.type,
            "seconds": float(sum(h["epoch_seconds"] for h in history)),
        }
        return TrainResult(self.model, history, metrics, self.device.type)


def code_version() -> str:
    """A hash of the training code (this module and the models): changed code never resumes an old run."""
    import hashlib

    here = Path(__file__).parent
    digest = hashlib.sha256()
    for path in [Path(__file__), here / "distributed.py", *sorted((here / "models").glob("*.py"))]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def checkpoint_dir(root: str | Path, model: str, chosen: dict, world: int = 1) -> Path:
    """Where a run's resumable checkpoints live: keyed by its params and code (and the process count,
    which shapes them), so only the very same run resumes."""
    from lmpipe.config import params_hash

    key = params_hash({**chosen, "code": code_version()})
    return Path(root) / (f"{model}-{key}" + ("" if world == 1 else f"-x{world}"))


def run_settings(params, model: str, params_file: str, ckpt_root: str | Path):
    """(settings, the params that define the run, its checkpoint directory) for `models.<model>`."""
    if model not in params.models:
        raise ConfigError(f"{params_file}: models has no entry {model!r} (have: {', '.join(params.models) or 'none'})")
    settings = params.models[model]
    chosen = {"train": params.section("train"), "model": settings.model_dump(mode="json")}
    return settings, chosen, checkpoint_dir(ckpt_root, model, chosen, distributed.launched().world)


def main(argv: list[str] | None = None) -> None:
    """Train one model of params.yaml without orchestration: `python -m lmpipe.train` or `torchrun ... -m lmpipe.train`."""
    import argparse
    import json
    import sys

    from lmpipe.config import load_params
    from lmpipe.errors import LmpipeError
    from lmpipe.io import atomic_path, write_json
    from lmpipe.models import save_model
    from lmpipe.splits import load_tokens

    parser = argparse.ArgumentParser(prog="python -m lmpipe.train", description=main.__doc__)
    parser.add_argument("--model", required=True, help="an entry of params.yaml's `models`")
    parser.add_argument("--out", required=True, help="directory for model.pt, metrics.json and history.json")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--checkpoints", default=".cache/lmpipe/ckpt", help="root of the resumable checkpoints")
    args = parser.parse_args(argv)
    ranks = distributed.launched()
    try:
        params = load_params(args.params)
        settings, _, ckpt_dir = run_settings(params, args.model, args.params, args.checkpoints)
        on_epoch = lambda record: print(json.dumps(record), flush=True)  # noqa: E731
        result = Trainer(args.model, settings, params.train, load_tokens(), ckpt_dir, on_epoch=on_epoch).run()
    except LmpipeError as exc:
        sys.exit(f"error: {exc}" if ranks.main else 1)  # one line, from one process
    finally:
        distributed.leave(ranks)
    if ranks.main:
        with atomic_path(args.out) as tmp:
            tmp.mkdir()
            save_model(result.model, settings.family, settings.arch, tmp / "model.pt")
            write_json(tmp / "metrics.json", {**result.metrics, "processes": ranks.world})
            write_json(tmp / "history.json", result.history)


if __name__ == "__main__":
    main()
