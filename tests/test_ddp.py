"""DDP under torchrun: 2 gloo processes on CPU follow one process's loss curve for the same global batch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.helpers import ADAMW, entry, project_params, synthetic_data

MODELS = {
    "lstm": entry("rnn", {"cell": "lstm", "emb": 24, "hidden": 32, "layers": 2, "ar": 1.0, "tar": 1.0},
                  optim={**ADAMW, "name": "sgd", "lr": 10.0, "clip": 0.5, "schedule": "constant", "momentum": 0.0,
                         "nt_asgd": False, "nonmono": 2},
                  batch_size=8, seq_len=20, variable_bptt=True, epochs=3),
    "transformer": entry("transformer", {"dim": 32, "layers": 1, "heads": 2, "block_size": 32, "dropout": 0.0},
                         optim={**ADAMW, "lr": 3e-3, "warmup_steps": 5}, batch_size=8, seq_len=32, epochs=3),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A project directory holding a tokenized synthetic corpus and params for two models."""
    root = tmp_path_factory.mktemp("ddp")
    data = synthetic_data()
    (root / "data/tokens").mkdir(parents=True)
    for name, split in data.splits.items():
        np.save(root / f"data/tokens/{name}.npy", split.tokens)
    (root / "data/tokens/counts.json").write_text(json.dumps({
        "vocab_size": data.vocab_size, "boundary_id": data.boundary,
        "words": {n: s.words for n, s in data.splits.items()}, "bytes": {n: s.bytes for n, s in data.splits.items()}}))
    # fp32: the test checks the gradient averaging, and bf16 rounds a 4-row batch otherwise than an 8-row one
    train = {"seed": 7, "log_every": 5, "eval_chunk": 50, "evals_per_epoch": 1, "precision": "fp32"}
    (root / "params.yaml").write_text(yaml.safe_dump(project_params(train=train, models=MODELS)))
    return root


def train(workdir: Path, model: str, processes: int, check: bool = True) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    args = ([sys.executable] if processes == 1 else launcher) + ["-m", "lmpipe.train", "--model", model,
                                                               "--out", f"out/{model}-{processes}"]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}  # loopback only
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
def test_two_gloo_processes_follow_the_single_process_curve(workdir, model):
    train(workdir, model, 1)
    train(workdir, model, 2)
    one = pd.read_csv(workdir / f"out/{model}-1/curve.csv").to_dict("records")
    two = pd.read_csv(workdir / f"out/{model}-2/curve.csv").to_dict("records")
    assert len(one) == len(two) == MODELS[model]["epochs"]
    for a, b in zip(one, two):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)
        assert b["valid_loss"] == pytest.approx(a["valid_loss"], rel=1e-3)
    assert one[-1]["valid_loss"] < one[0]["valid_loss"] - 0.1  # it is a learning curve, not a flat line
    metrics = json.loads((workdir / f"out/{model}-2/metrics.json").read_text())
    written = json.loads((workdir / f"out/{model}-2/lmpipe-output.json").read_text())
    assert written["processes"] == 2 and metrics["valid_ppl"] == pytest.approx(
        json.loads((workdir / f"out/{model}-1/metrics.json").read_text())["valid_ppl"], rel=1e-3)
    assert not list((workdir / ".cache/lmpipe/ckpt").glob(f"{model}-*"))  # finished runs drop their checkpoints


def test_a_batch_that_does_not_split_is_one_clear_line(workdir):
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["models"]["odd"] = {**MODELS["transformer"], "batch_size": 7}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    done = train(workdir, "odd", 2, check=False)
    assert done.returncode != 0
    assert "error: models.odd.batch_size: 7 does not split over 2 processes (make it a multiple of 2)" in done.stderr
    assert not (workdir / "out/odd-2").exists()
    shutil.rmtree(workdir / "out", ignore_errors=True)


@pytest.mark.slow
def test_one_command_trains_a_model_with_other_settings_seed_and_budget(workdir):
    """python -m lmpipe.train -S/--seed/--budget --score: the probe before a sweep, deterministic on CPU."""
    def probe(*extra):
        done = subprocess.run([sys.executable, "-m", "lmpipe.train", "--model", "transformer", "--threads", "1",
                               "--score", "--budget", "{tokens: 4096}", *extra], cwd=workdir, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        *evaluations, scores = [json.loads(line) for line in done.stdout.splitlines()]
        return evaluations, {k: v for k, v in scores.items() if k != "train_seconds"}

    evaluations, scores = probe("-S", "optim.lr=0.01", "--seed", "3")
    assert evaluations[-1]["tokens"] == 4096 and scores["seed"] == 3 and scores["set"] == ["optim.lr=0.01"]
    assert 0 < scores["valid_bpb"] < 20 and 0 < scores["test_bpb"] < 20
    assert probe("-S", "optim.lr=0.01", "--seed", "3")[1] == scores  # the same run, the same numbers
    assert probe("-S", "optim.lr=0.01", "--seed", "4")[1]["test_bpb"] != scores["test_bpb"]
    assert probe("--seed", "3")[1]["test_bpb"] != scores["test_bpb"]  # the lr override took
    bad = subprocess.run([sys.executable, "-m", "lmpipe.train", "--model", "transformer", "-S", "arch.nonsense=1"],
                         cwd=workdir, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [bad.stderr.strip()]
    assert "arch" in bad.stderr and "nonsense" in bad.stderr


def test_sigterm_stops_the_training_command_in_one_line_and_keeps_the_checkpoint(workdir):
    """`python -m lmpipe.train` stopped by SIGTERM (or Ctrl-C) finishes its step, saves it, and says how to resume in
    one line: no traceback."""
    import signal

    run = subprocess.Popen([sys.executable, "-m", "lmpipe.train", "--model", "transformer", "--threads", "1",
                            "--budget", "{tokens: 10000000}", "--checkpoints", "ckpt-sigterm"], cwd=workdir,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert json.loads(run.stdout.readline())["step"] > 0  # the first evaluation: training is under way
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1
    assert re.fullmatch(r"transformer interrupted at step \d+; checkpoint saved; the same command resumes\n", stderr)
    assert list((workdir / "ckpt-sigterm").glob("transformer-*/last.pt"))
