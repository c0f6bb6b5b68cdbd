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
import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lmpipe import checkpoints, distributed
from lmpipe.checkpoints import Checkpoint
from lmpipe.config import TrainParams
from lmpipe.model_params import Budget, ModelParams, OptimParams
from lmpipe.errors import ConfigError, Interrupted
from lmpipe.evaluate import perplexities, stream_nll
from lmpipe.optim import MuonAdamW
from lmpipe.process import keep_freed_memory
from lmpipe.flops import peak_flops, train_flops_per_token
from lmpipe.models import (StreamLM, arch_with_defaults, build_model, count_non_embedding_parameters,
                           count_parameters)
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


def native_bf16(device: torch.device) -> bool:
    """Whether the device multiplies bf16 matrices natively (else bf16 autocast is emulated and slower)."""
    if device.type == "cuda":
        return True
    if device.type == "cpu":  # oneDNN's bf16 kernels; torch exposes the check only as private helpers
        return any(getattr(torch.cpu, check, lambda: False)()
                   for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return False


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of training steps (None: plain fp32). On this project's 2-core AVX512-BF16 CPU, bf16
    trains the default models faster (docs/benchmarks.md; benchmarks/train_throughput.py --precision)."""
    if precision == "bf16" or (precision == "auto" and native_bf16(device)):
        return torch.bfloat16
    return None


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


def window_offsets(n_tokens: int, length: int, context: int, shift: int) -> np.ndarray:
    """Where an epoch's windows (length inputs + targets) start, in order: after the context, shifted by `shift`."""
    return np.arange(context + shift, n_tokens - length - 1, length)


def window_plan(n_tokens: int, settings: ModelParams, context: int, rng: np.random.Generator) -> np.ndarray:
    """Shuffled window offsets (one window = seq_len inputs + targets), as (steps, batch) rows."""
    length = settings.seq_len
    offsets = rng.permutation(window_offsets(n_tokens, length, context, int(rng.integers(0, length))))
    usable = len(offsets) // settings.batch_size * settings.batch_size
    return offsets[:usable].reshape(-1, settings.batch_size)


def window_context(model: StreamLM) -> int:
    """Tokens before a window that a window model reads as its state during training (NPLM: n-1 - 1)."""
    return getattr(model, "context", 1) - 1


def _one_ahead(batches):
    """Yield each item once the next one is made: the next batch is gathered, pinned and its copy queued before this
    step's work is queued, so on a GPU the host prepares it while the device still runs the steps queued before."""
    batches = iter(batches)
    upcoming = next(batches, None)
    while upcoming is not None:
        current, upcoming = upcoming, next(batches, None)
        yield current


@dataclass
class TrainResult:
    model: StreamLM
    settings: ModelParams
    history: list[dict]
    metrics: dict
    device: str


@dataclass
class _Progress:
    """Where a run stands, saved in every checkpoint: a resumed run continues exactly where it stopped."""

    epoch: int = 0  # the epoch being trained (0-based)
    index: int = 0  # batches of that epoch done
    step: int = 0  # optimiser steps done in all
    tokens_seen: int = 0
    best_loss: float = math.inf
    best_epoch: float = -1.0
    bad_evals: int = 0
    asgd: bool = False
    base_lr: float | None = None  # halved on plateau; frozen when ASGD takes over
    history: list = field(default_factory=list)
    # sums since the last evaluation, so a resumed stretch reports what an uninterrupted one would
    loss_sum: torch.Tensor | None = None
    norm_sum: torch.Tensor | None = None
    steps_summed: int = 0
    tokens_summed: int = 0
    seconds: float = 0.0
    branched_seconds: float = 0.0  # a decay branch's: its parent's training seconds at the branch point

    @property
    def trained_seconds(self) -> float:
        """Training seconds so far: the evaluated stretches' and the current one's."""
        return sum(h["train_seconds"] for h in self.history) + self.seconds

    def reset_sums(self, device) -> None:
        self.loss_sum, self.norm_sum = torch.zeros((), device=device), torch.zeros((), device=device)
        self.steps_summed, self.tokens_summed, self.seconds = 0, 0, 0.0


def _lr_factor(optim, step: int, total: int) -> float:
    if optim.warmup_steps and step < optim.warmup_steps:
        return (step + 1) / optim.warmup_steps
    if optim.schedule == "cosine":
        progress = (step - optim.warmup_steps) / max(1, total - optim.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    if optim.schedule == "wsd":  # Hu et al. 2024 (MiniCPM): the rate stays high for longer than under cosine
        decay_steps = max(1, round(optim.decay_fraction * total))
        return min(1.0, max(0.0, (total - step) / decay_steps))
    return 1.0


@dataclass(frozen=True)
class Schedule:
    """The learning rate as a pure function of the progress record: nothing else sets the optimiser's rate."""

    optim: OptimParams
    total_steps: int  # the step the schedule anneals to
    bptt: int | None  # seq_len where the rate scales with variable BPTT lengths (AWD-LSTM), else None

    def lr(self, p: _Progress, length: int) -> float:
        """The rate of step `p.step` over `length` positions: the schedule's, or frozen under ASGD."""
        lr = p.base_lr if p.asgd else p.base_lr * _lr_factor(self.optim, p.step, self.total_steps)
        if self.bptt:
            lr *= length / self.bptt  # shorter sequences, smaller steps
        return lr


class _Stopwatch:
    """Training time only: the lap so far goes to the progress record whenever the loop pauses."""

    def __init__(self, progress: _Progress):
        self.progress, self.started = progress, time.perf_counter()

    @contextmanager
    def paused(self):
        self.progress.seconds += time.perf_counter() - self.started
        yield
        self.started = time.perf_counter()


class _StopRequest:
    """Ctrl-C or SIGTERM while training: finish the step, save a checkpoint, then stop (a second Ctrl-C stops at
    once). Only in the main thread of a single process: DDP ranks would stop at different steps."""

    def __init__(self, active: bool):
        self.active = active and threading.current_thread() is threading.main_thread()
        self.requested, self.previous = False, {}

    def __enter__(self):
        if self.active:
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) not in (signal.SIG_IGN, None):  # a background job ignores Ctrl-C: keep that
                    self.previous[sig] = signal.signal(sig, self._request)
        return self

    def _request(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


@contextmanager
def _averaged(model, optimizer, active: bool):
    """Swap ASGD's averaged weights in for evaluation and saving, as AWD-LSTM does."""
    saved = {p: p.detach().clone() for p in model.parameters() if active and "ax" in optimizer.state.get(p, {})}
    for p in saved:
        p.data.copy_(optimizer.state[p]["ax"])
    try:
        yield
    finally:
        for p, value in saved.items():
            p.data.copy_(value)


def setup_process(common: TrainParams) -> torch.device:
    """Process-wide setup before each Trainer is built (`Job.trainer`: a run's, and each decay branch's, which
    sets the same values again): freed memory kept in the process, the device and its threads, the DDP group under
    torchrun, and torch's global RNG seeded from `train.seed`. The
    Trainer built next draws the model's initial weights, then its dropout masks, from that RNG: build it right
    after this call."""
    keep_freed_memory()
    ranks = distributed.launched()
    device = pick_device(common.device, ranks.local)
    configure_device(device, common.threads or (max(1, (os.cpu_count() or 1) // ranks.local_world)
                                                if ranks.world > 1 else 0))
    distributed.join(ranks, device)
    torch.manual_seed(common.seed)  # the same initial weights in every process
    return device


def summary(name: str, settings: ModelParams, model: StreamLM, p: _Progress, flops_per_token: float,
            device: torch.device, precision: str) -> dict:
    """What a finished run reports: its size, its best validation point, the compute it had and how fast it ran
    (with MFU on a GPU: achieved FLOP/s over the device's bf16 peak)."""
    best = next(h for h in p.history if h["epoch"] == p.best_epoch)
    seconds = float(p.trained_seconds)  # a run ends on an evaluation: nothing since it
    flops = float(p.tokens_seen * flops_per_token)
    metrics = {
        "model": name, "family": settings.family, "n_params": count_parameters(model),
        "n_params_non_embedding": count_non_embedding_parameters(model),
        "epochs": p.history[-1]["epoch"], "evaluations": len(p.history), "best_epoch": p.best_epoch,
        "valid_ppl": best["valid_ppl"], "valid_word_ppl": best["valid_word_ppl"], "valid_bpb": best["valid_bpb"],
        "tokens_seen": p.tokens_seen, "flops_per_token": flops_per_token, "train_flops": flops,
        "tokens_per_sec": p.tokens_seen / max(seconds, 1e-9), "flops_per_sec": flops / max(seconds, 1e-9),
        "device": device.type, "precision": precision, "seconds": seconds,
    }
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = peak_flops(name)
        metrics.update(device_name=name, mfu=metrics["flops_per_sec"] / peak if peak else None)
    return metrics


class Trainer:
    """Train one model on the device `setup_process` prepared; `run()` resumes from `ckpt_dir/last.pt` when it exists.

    `ckpt_dir` must be keyed by everything that determines the run (`checkpoint_dir` does that):
    a checkpoint found there is trusted to belong to this very run.
    """

    def __init__(self, name: str, settings: ModelParams, common: TrainParams, data: TokenData,
                 ckpt_dir: str | Path, device: torch.device, progress_bar: bool = True):
        self.name, self.settings, self.common, self.data = name, settings, common, data
        self.ckpt_dir, self.device = Path(ckpt_dir), device
        self.ranks = distributed.launched()
        if not settings.length_stated:
            raise ConfigError(f"models.{name}: no run length: state its epochs or a budget (or give the study one)")
        if settings.batch_size % self.ranks.world:
            raise ConfigError(f"models.{name}.batch_size: {settings.batch_size} does not split over "
                              f"{self.ranks.world} processes (make it a multiple of {self.ranks.world})")
        self.progress_bar = progress_bar and self.ranks.main
        self._build_model()
        self._size_run()
        self.progress = _Progress(base_lr=settings.optim.lr)
        self.progress.reset_sums(self.device)
        self.optimizer = self._build_optimizer(asgd=False)
        self.hidden = None  # the recurrent state carried across chunks
        self.fresh_rng = self._rng_states()  # where a run from step 0 starts, whatever the process draws before it

    # ---------- building: the model, the run's length and plans, the optimiser ----------
    def _build_model(self) -> None:
        """The model (initial weights: the next draws of the RNG setup_process seeded), the module a training step
        calls (DDP-wrapped, compiled) and the training precision."""
        self.model = build_model(self.settings.family, self.settings.arch, self.data.vocab_size,
                                 self.data.boundary).to(self.device)
        step_module = self.model
        if self.ranks.world > 1:
            torch.manual_seed(self.common.seed + self.ranks.rank)  # each process its own dropout masks
            step_module = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.step_module = torch.compile(step_module) if self.common.compile else step_module
        self.autocast = autocast_dtype(self.common.precision, self.device)

    def _size_run(self) -> None:
        """The training stream, FLOPs per token, the run's length in steps and its learning-rate schedule."""
        s, per = self.settings, self.settings.batch_size // self.ranks.world
        self.train_tokens = torch.from_numpy(
            np.concatenate([[self.data.boundary], self.data.splits["train"].tokens.astype(np.int64)]))
        columns = len(self.train_tokens) // s.batch_size  # recurrent models read batch_size contiguous streams
        self.streams = self.train_tokens[: columns * s.batch_size].view(s.batch_size, columns)
        self.rows = slice(self.ranks.rank * per, (self.ranks.rank + 1) * per)  # this process's rows of each batch
        self.flops_per_token = train_flops_per_token(s.family, arch_with_defaults(s.family, s.arch),
                                                     self.data.vocab_size, s.seq_len,
                                                     count_non_embedding_parameters(self.model))
        self.steps_per_epoch = len(self._epoch_plan(0))
        self.total_steps = self._total_steps()
        self.schedule = Schedule(s.optim, self.total_steps,
                                 s.seq_len if self.model.recurrent and s.variable_bptt else None)

    def _epoch_rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.common.seed, epoch])

    def _epoch_plan(self, epoch: int):
        rng = self._epoch_rng(epoch)
        if self.model.recurrent:
            plan = stream_plan(self.streams.size(1), self.settings, rng)
        else:
            plan = list(window_plan(len(self.train_tokens), self.settings, window_context(self.model), rng))
        if self.settings.max_steps_per_epoch:
            plan = plan[: self.settings.max_steps_per_epoch]
        return plan

    def _epoch_steps(self, epoch: int) -> int:
        """len(self._epoch_plan(epoch)), without building the plan where its length is known beforehand: the same
        for every epoch of fixed-length chunks, the window offsets' count for windows. A run of many epochs (an
        endless one, epochs: 100000) then starts training at once instead of after minutes of plans."""
        s = self.settings
        if self.model.recurrent and s.variable_bptt:
            return len(self._epoch_plan(epoch))
        if self.model.recurrent:
            steps = -(-(self.streams.size(1) - 1) // s.seq_len)  # stream_plan's chunks
        else:
            shift = int(self._epoch_rng(epoch).integers(0, s.seq_len))  # window_plan's first draw
            steps = len(window_offsets(len(self.train_tokens), s.seq_len, window_context(self.model), shift)) \
                // s.batch_size
        return min(steps, s.max_steps_per_epoch) if s.max_steps_per_epoch else steps

    def _total_steps(self, budget: Budget | None = None) -> int:
        """The run's length in optimiser steps, which the schedule anneals to: the steps of its epochs, or of the
        epoch plans (pure functions of seed and epoch) until its budget's tokens or FLOPs are seen - exact under
        variable BPTT too, where steps differ in length (counting seq_len-long steps would end a budget short).
        Given `budget`, the length a run of that budget would have, with these settings otherwise."""
        budget = budget or self.settings.budget
        if budget is None:
            return sum(self._epoch_steps(epoch) for epoch in range(self.settings.epochs))
        tokens = budget.tokens if budget.tokens is not None else budget.flops / self.flops_per_token
        steps, seen, epoch = 0, 0, 0
        while True:
            plan = self._epoch_plan(epoch)
            if not len(plan):
                return max(1, steps)
            seen_after = seen + np.cumsum(self._step_tokens(plan))
            reached = int(np.searchsorted(seen_after, tokens))  # the first step after which `tokens` are seen
            if reached < len(plan):
                return steps + reached + 1
            steps, seen, epoch = steps + len(plan), int(seen_after[-1]), epoch + 1

    def decay_start(self, budget: Budget) -> int:
        """The steps a run of the smaller `budget` (these settings otherwise) takes before its decay begins. Under
        `wsd` the two runs are the same up to there, step for step: the same batches, the same rate (warmup, then
        flat), the same evaluations. So that run's decay can branch from this one (Hägele et al. 2024)."""
        optim = self.settings.optim
        if optim.schedule != "wsd" or self.settings.budget is None:
            raise ConfigError(f"models.{self.name}: decay branches need a budget and the wsd schedule "
                              f"(have {optim.schedule}{'' if self.settings.budget else ', no budget'})")
        def start(total: int) -> int:  # the step the wsd schedule of a run of `total` steps starts its decay
            return total - max(1, round(optim.decay_fraction * total))

        total = self._total_steps(budget)
        if total >= self.total_steps or start(total) > start(self.total_steps):
            raise ConfigError(f"models.{self.name}: a branch of {budget} is not smaller than the run it branches from")
        return start(total)

    def _build_optimizer(self, asgd: bool) -> torch.optim.Optimizer:
        """The configured optimiser, or averaged SGD once NT-ASGD has switched (its rate is set at every step)."""
        optim, params = self.settings.optim, self.model.parameters()
        if asgd:
            return torch.optim.ASGD(params, lr=optim.lr, t0=0, lambd=0.0, weight_decay=optim.weight_decay)
        if optim.name == "sgd":
            return torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay)
        if optim.name == "muon":
            return MuonAdamW(self.model, self.data.vocab_size, optim.lr, optim.weight_decay,
                             ns_dtype=self.autocast or torch.float32)  # the training precision: see lmpipe.muon
        kwargs = {"fused": True} if self.device.type == "cuda" else {}
        cls = torch.optim.AdamW if optim.name == "adamw" else torch.optim.Adam
        return cls(params, lr=optim.lr, weight_decay=optim.weight_decay, **kwargs)

    def _rng_states(self) -> tuple:
        """The random generators' states that dropout and the like draw from: the CPU's, and CUDA's on a GPU."""
        return torch.get_rng_state(), torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None

    # ---------- the loop, in the order it runs ----------
    def run(self, on_eval: Callable[[dict], None] | None = None,
            on_step: Callable[[int], None] | None = None, branches: dict[int, Path] | None = None,
            curve: bool = True) -> TrainResult:
        """Resume, then train to the budget (or the epochs' end, or early stopping), an epoch at a time.
        `on_eval(record)` gets each learning-curve point (main process only); `on_step(step)` is called after every
        optimiser step (tests interrupt a run from there). `branches` maps a step count to a checkpoint folder: once
        that many steps are done (and what is due after the step), the run's whole state is saved there as a
        checkpoint, from which the run of a smaller budget whose decay starts there resumes (`decay_start`).
        `curve=False` validates at the budget's end only: a decay branch, whose result is its last point (its
        validation falls all through a decay), spends no time on the points between."""
        self.on_eval, self.on_step = on_eval or (lambda record: None), on_step or (lambda step: None)
        self.curve = curve or self.settings.budget is None  # a run of epochs needs its curve to stop early
        self.branches = dict(branches or {})
        self._resume()
        with _StopRequest(active=self.ranks.world == 1) as stop:
            while not self._done():
                self._train_epoch(stop)
        return self._finish()

    def _resume(self) -> None:
        """The run from its last checkpoint, or from step 0 with the generators as the Trainer was built: a run's
        draws do not depend on what else the process drew in between (another Trainer built, a model evaluated)."""
        path = checkpoints.last_path(self.ckpt_dir, self.ranks.rank)
        if not path.exists():
            return self._set_rng_states(*self.fresh_rng)
        initial = {k: v.clone() for k, v in self.model.state_dict().items()}
        try:
            ckpt = Checkpoint.load(path, self.device)
            progress = _Progress(**ckpt.progress)
            self.model.load_state_dict(ckpt.model)
            optimizer = self._build_optimizer(progress.asgd)
            optimizer.load_state_dict(ckpt.optimizer)
        except Exception as exc:  # a torn, foreign or ill-fitting file: set it aside, start afresh
            aside = path.with_suffix(".rejected")
            os.replace(path, aside)
            print(f"{path}: unreadable checkpoint ({type(exc).__name__}), set aside as {aside.name}; "
                  f"training {self.name} from the start", file=sys.stderr)
            self.model.load_state_dict(initial)  # load_state_dict may have copied some tensors before it failed
            return self._set_rng_states(*self.fresh_rng)
        self.optimizer, self.progress = optimizer, progress
        if self.ranks.main:
            print(f"resuming {self.name} from step {progress.step} of {self.total_steps} ({path})", file=sys.stderr,
                  flush=True)
        self._set_rng_states(ckpt.torch_rng, ckpt.cuda_rng)
        self.hidden = ckpt.hidden

    def _set_rng_states(self, cpu: torch.Tensor, cuda: list | None) -> None:
        torch.set_rng_state(cpu.cpu())
        if cuda is not None:
            torch.cuda.set_rng_state_all([state.cpu() for state in cuda])  # a checkpoint's are loaded onto the device

    def _done(self) -> bool:
        """The budget is spent; or, without a budget, all epochs are done or validation stopped improving (early
        stopping). A budget is trained to its end: its schedule anneals there, and the study compares models at
        equal compute; the best weights are kept either way."""
        p = self.progress
        if self.settings.budget is not None:
            return p.step >= self.total_steps
        return p.epoch >= self.settings.epochs or p.bad_evals >= self.settings.patience

    def _train_epoch(self, stop: _StopRequest) -> None:
        """The current epoch from where the run stands: a step per batch, each followed by what is due (outside the
        clock); a stop request is honoured after the step, with a checkpoint."""
        p = self.progress
        plan = self._epoch_plan(p.epoch)
        if p.index == 0:
            self.hidden = None  # each epoch starts its streams afresh
        self.model.train()
        clock = _Stopwatch(p)
        with tqdm(total=len(plan), initial=p.index, desc=f"{self.name} epoch {p.epoch + 1}",
                  disable=not self.progress_bar, leave=False) as bar:
            for x, y, context in self._batches(plan, p.index):
                self._count(*self._train_step(x, y, context), x.numel())
                self._show(bar)
                with clock.paused():
                    if self._after_step(len(plan)) and self._done():
                        return
                self.on_step(p.step)
                if stop.requested:
                    with clock.paused():
                        self._save()
                    raise Interrupted(f"{self.name} interrupted at step {p.step}; checkpoint saved")

    def _batches(self, plan, start: int):
        """The epoch's batches from `start` on, on the device, this process's rows only:
        (inputs, targets, what precedes the inputs: a window's context, or None). On a GPU each batch is copied
        from pinned memory without blocking, one batch ahead of the step that uses it (nanoGPT's get_batch)."""
        return _one_ahead(self._host_batches(plan, start))

    def _host_batches(self, plan, start: int):
        if self.model.recurrent:
            data = self.streams[self.rows]
            for begin, length in plan[start:]:
                chunk = self._to_device(data[:, begin:begin + 1 + length])  # inputs and targets in one copy
                yield chunk[:, :-1], chunk[:, 1:], None
            return
        context = window_context(self.model)
        span = torch.arange(-context, self.settings.seq_len + 1)[None, :]
        for offsets in plan[start:]:
            windows = self._to_device(self.train_tokens[torch.from_numpy(offsets[self.rows])[:, None] + span])
            yield windows[:, context:-1], windows[:, context + 1:], (windows[:, :context] if context > 0 else None)

    def _step_tokens(self, plan) -> np.ndarray:
        """Training tokens of each step of an epoch plan (all processes together)."""
        if self.model.recurrent:
            return np.array([length for _, length in plan]) * self.settings.batch_size
        return np.full(len(plan), self.settings.batch_size * self.settings.seq_len)

    def _to_device(self, batch: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return batch.pin_memory().to(self.device, non_blocking=True)
        return batch.to(self.device)

    def _train_step(self, x: torch.Tensor, y: torch.Tensor, context: torch.Tensor | None):
        """One optimiser step: forward (a recurrent model reads on from the state the last chunk left), the loss
        and the model's own regularisers, backward, clipping, the scheduled rate. (loss, gradient norm), on the
        device: reading them would wait for the step."""
        before = self.model.detach_state(self.hidden) if self.model.recurrent else context
        with torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            logits, hidden, aux = self.step_module(x, before)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            objective = loss + aux
        if self.model.recurrent:
            self.hidden = hidden
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.optim.clip)
        for group in self.optimizer.param_groups:
            group["lr"] = self.schedule.lr(self.progress, x.size(1))
        self.optimizer.step()
        return loss, grad_norm

    def _count(self, loss: torch.Tensor, grad_norm: torch.Tensor, tokens: int) -> None:
        """One optimiser step done: the sums the next evaluation reports (on the device: no host sync)."""
        p, tokens = self.progress, tokens * self.ranks.world
        p.loss_sum += loss.detach()
        p.norm_sum += grad_norm.detach()
        p.steps_summed += 1
        p.tokens_summed += tokens
        p.tokens_seen += tokens
        p.index, p.step = p.index + 1, p.step + 1

    def _show(self, bar) -> None:
        bar.update(1)
        if self.progress_bar and self.progress.step % self.common.log_every == 0:  # the loop's only host sync
            bar.set_postfix(loss=f"{float(self.progress.loss_sum) / self.progress.steps_summed:.3f}")

    def _after_step(self, plan_length: int) -> bool:
        """Whether an evaluation was due, and it ran (it keeps the best weights and checkpoints); else a plain
        checkpoint every `checkpoint_every` steps. The epoch's last step rolls the run over to the next epoch first,
        so a checkpoint taken there resumes at the next epoch's start."""
        p = self.progress
        due = self._eval_due(plan_length)
        if p.index == plan_length:
            p.epoch, p.index = p.epoch + 1, 0
        branch = self.branches.get(p.step)
        if due:
            self._evaluate(plan_length, branch)
        elif p.step % self.common.checkpoint_every == 0 or branch:
            self._save(branch)
        return due

    def _eval_due(self, plan_length: int) -> bool:
        """After evals_per_epoch evenly spaced steps of each epoch (its last step one), and at the budget's end
        (there alone without a `curve`)."""
        p, n = self.progress, self.common.evals_per_epoch
        return (self.curve and p.index in {round(plan_length * k / n) for k in range(1, n + 1)}
                or self.settings.budget is not None and p.step >= self.total_steps)

    # ---------- evaluation and checkpoints ----------
    def _evaluate(self, plan_length: int, branch: Path | None = None) -> None:
        """Validate, record a learning-curve point, keep the best weights, adapt the schedule, checkpoint."""
        p = self.progress
        valid = self._valid()
        train_loss = float(distributed.mean(p.loss_sum, self.ranks)) / max(p.steps_summed, 1)
        record = {
            "epoch": round(p.epoch + p.index / plan_length, 4), "step": p.step, "tokens": p.tokens_seen,
            "flops": float(p.tokens_seen * self.flops_per_token),
            "train_loss": train_loss, "train_ppl": math.exp(min(train_loss, 50)),
            "valid_loss": valid["loss"], "valid_ppl": valid["ppl"], "valid_word_ppl": valid["word_ppl"],
            "valid_bpb": valid["bpb"], "lr": self.optimizer.param_groups[0]["lr"],
            "grad_norm": float(p.norm_sum) / max(p.steps_summed, 1),
            "tokens_per_sec": p.tokens_summed / max(p.seconds, 1e-9), "train_seconds": p.seconds,
            "asgd": int(p.asgd),
        }
        p.history.append(record)
        improved = valid["loss"] < p.best_loss
        if improved:
            p.best_loss, p.best_epoch, p.bad_evals = valid["loss"], record["epoch"], 0
            with _averaged(self.model, self.optimizer, p.asgd):
                checkpoints.make_dir(self.ckpt_dir, self.name)
                if self.ranks.main:
                    checkpoints.save(self.model.state_dict(), checkpoints.best_path(self.ckpt_dir))
        else:
            p.bad_evals += 1
        self._adapt(improved)
        if self.ranks.main:
            self.on_eval(record)  # before the sums reset: a crash here repeats this point on resume
        p.reset_sums(self.device)
        self._save(branch)

    def _valid(self) -> dict:
        split = self.data.splits["valid"]
        with _averaged(self.model, self.optimizer, self.progress.asgd):
            nll, n = stream_nll(self.model, split.tokens, self.common.eval_chunk, self.device)
        self.model.train()
        return perplexities(nll, n, split.words, split.bytes)

    def _adapt(self, improved: bool) -> None:
        """NT-ASGD: start averaging once validation stops improving; else the plateau schedule halves the rate."""
        p, optim = self.progress, self.settings.optim
        losses = [h["valid_loss"] for h in p.history]
        if (optim.name == "sgd" and optim.nt_asgd and not p.asgd
                and len(losses) > optim.nonmono and losses[-1] > min(losses[:-optim.nonmono])):
            p.asgd = True
            self.optimizer = self._build_optimizer(asgd=True)
        elif optim.schedule == "plateau" and not improved and not p.asgd:
            p.base_lr *= 0.5

    def _save(self, branch: Path | None = None) -> None:
        """The resumable checkpoint; given a `branch` folder, a copy of the run's state there first (with the best
        weights so far), so that a checkpoint of this run past the branch point means the branch is saved."""
        state = Checkpoint(self.model.state_dict(), self.optimizer.state_dict(), vars(self.progress),
                           *self._rng_states(), self.hidden)
        if branch is not None:  # a folder its branch's run made (and marked)
            branch.mkdir(parents=True, exist_ok=True)
            if self.ranks.main and checkpoints.best_path(self.ckpt_dir).exists():
                shutil.copyfile(checkpoints.best_path(self.ckpt_dir), checkpoints.best_path(branch))
            # the branch's own checkpoints keep what it started from, however often it resumes
            replace(state, progress={**state.progress, "branched_seconds": self.progress.trained_seconds}).save(
                checkpoints.last_path(branch, self.ranks.rank))
        checkpoints.make_dir(self.ckpt_dir, self.name)
        state.save(checkpoints.last_path(self.ckpt_dir, self.ranks.rank))

    def _finish(self) -> TrainResult:
        """Load the best weights and summarise the run. The checkpoints stay until the caller has written its outputs
        (`checkpoints.discard`): a run that finished but failed after it resumes finished, without training again."""
        distributed.barrier(self.ranks)  # best.pt is written by the main process
        self.model.load_state_dict(torch.load(checkpoints.best_path(self.ckpt_dir), map_location=self.device,
                                              weights_only=True))
        distributed.barrier(self.ranks)
        precision = "bf16" if self.autocast is not None else "fp32"
        metrics = summary(self.name, self.settings, self.model, self.progress, self.flops_per_token, self.device,
                          precision)
        return TrainResult(self.model, self.settings, self.progress.history, metrics, self.device.type)
