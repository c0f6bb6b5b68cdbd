"""The trainer: it learns, it is deterministic, and a killed run resumes to the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmpipe.config import ModelParams, TrainParams
from lmpipe.splits import Split, TokenData
from lmpipe.train import Trainer, stream_plan, window_plan

V = 30


def synthetic_data(seed=0) -> TokenData:
    """A learnable stream: token t+1 = (t * 7 + 3) % V most of the time, boundaries every ~20 tokens."""
    rng = np.random.default_rng(seed)

    def stream(n):
        out, t = [], 1
        for _ in range(n):
            t = (t * 7 + 3) % (V - 1) + 1 if rng.random() < 0.9 else int(rng.integers(1, V))
            out.append(0 if rng.random() < 0.05 else t)
        return np.array(out, dtype=np.uint16)

    splits = {name: Split(name, stream(n), n // 4, n * 3) for name, n in (("train", 6000), ("valid", 800), ("test", 800))}
    return TokenData(V, 0, splits)


COMMON = TrainParams(seed=7, log_every=5, checkpoint_every=7, eval_chunk=50)
SETTINGS = {
    "lstm": ModelParams(family="rnn", arch={"cell": "lstm", "emb": 24, "hidden": 32, "layers": 2, "dropout": 0.1,
                                            "weight_drop": 0.2, "dropout_embedding": 0.05, "ar": 1.0, "tar": 1.0},
                        optim={"name": "sgd", "lr": 10.0, "clip": 0.5, "schedule": "constant", "nt_asgd": True,
                               "nonmono": 1},
                        batch_size=8, seq_len=20, variable_bptt=True, epochs=5),
    "transformer": ModelParams(family="transformer", arch={"dim": 32, "layers": 1, "heads": 2, "block_size": 32},
                               optim={"name": "adamw", "lr": 3e-3, "warmup_steps": 5}, batch_size=8, seq_len=32,
                               epochs=2),
    "nplm": ModelParams(family="nplm", arch={"context": 3, "emb": 16, "hidden": 32},
                        optim={"name": "adam", "lr": 3e-3, "schedule": "plateau"}, batch_size=16, seq_len=16, epochs=2),
}


# a learning rate high enough that validation stalls after epoch 3, so averaging starts for epoch 4
SETTINGS["lstm_asgd"] = SETTINGS["lstm"].model_copy(update={
    "epochs": 4, "optim": SETTINGS["lstm"].optim.model_copy(update={"lr": 40.0})})


def train(tmp_path, name, **kwargs):
    return Trainer(name, SETTINGS[name], COMMON, synthetic_data(), tmp_path / name, progress_bar=False).run(**kwargs)


@pytest.mark.parametrize("name", ["lstm", "transformer", "nplm"])
def test_learns_far_below_unigram(tmp_path, name):
    result = train(tmp_path, name)
    assert result.metrics["valid_ppl"] < 8  # uniform is 30; the rule makes the next token nearly certain
    assert result.metrics["epochs"] == len(result.history) == SETTINGS[name].epochs
    assert set(result.metrics) >= {"model", "n_params", "epochs", "best_epoch", "valid_ppl", "tokens_per_sec",
                                   "device", "seconds"}


def test_same_seed_same_metrics(tmp_path):
    first = train(tmp_path / "a", "lstm")
    second = train(tmp_path / "b", "lstm")
    drop_timings = lambda h: [{k: v for k, v in r.items() if "seconds" not in k and "per_sec" not in k} for r in h]  # noqa: E731
    assert drop_timings(first.history) == drop_timings(second.history)


@pytest.mark.parametrize("name, kill_at", [("lstm", 11), ("lstm", 30), ("lstm_asgd", 130), ("transformer", 9)])
def test_kill_and_resume_gives_identical_weights(tmp_path, name, kill_at):
    whole = train(tmp_path / "whole", name)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "killed", name, stop_after_step=kill_at)
    resumed = train(tmp_path / "killed", name)
    for (key, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), key
    assert resumed.metrics["valid_ppl"] == whole.metrics["valid_ppl"]


def test_nt_asgd_switches_when_validation_stalls(tmp_path):
    history = train(tmp_path, "lstm_asgd").history
    losses = [h["valid_loss"] for h in history]
    switched = [h["asgd"] for h in history]
    # averaging starts right after the first epoch whose loss is no better than the best before it
    for i in range(1, len(history)):
        expected = int(any(losses[j] > min(losses[:j]) for j in range(1, i)))
        assert switched[i] == expected
    assert switched == [0, 0, 0, 1]


def test_batch_plans_cover_the_data_without_overlap():
    settings = SETTINGS["lstm"]
    plan = stream_plan(1000, settings, np.random.default_rng(0))
    starts = [s for s, _ in plan]
    assert starts[0] == 0 and all(a + n == b for (a, n), b in zip(plan, starts[1:]))
    assert plan[-1][0] + plan[-1][1] == 999 and len({n for _, n in plan}) > 3  # variable lengths
    windows = window_plan(5000, SETTINGS["transformer"], context=0, rng=np.random.default_rng(0))
    flat = np.sort(windows.ravel())
    assert windows.shape[1] == 8 and np.all(np.diff(flat) >= 32)  # whole batches of non-overlapping windows
    assert flat[-1] + 33 <= 5000 and len(flat) >= 5000 // 32 - 8 - 1  # at most one partial batch is left out
