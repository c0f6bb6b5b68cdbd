"""`lmpipe plan -S ...`: the stages an override would re-run, from DVC's own status and graph, before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

DVC = str(Path(sys.executable).parent / "dvc")
PIPELINE = """stages:
  gru:
    cmd: python -c "open('gru.txt', 'w').write('g')"
    params: [models.gru]
    outs: [gru.txt]
  lstm:
    cmd: python -c "open('lstm.txt', 'w').write('l')"
    params: [models.lstm.optim]
    outs: [lstm.txt]
  join:
    cmd: python -c "open('join.txt', 'w').write('j')"
    deps: [gru.txt, lstm.txt, fit.txt]
    outs: [join.txt]
"""
FITS = """stages:
  fit:
    wdir: ..
    cmd: python -c "open('fit.txt', 'w').write('f')"
    params: [models.gru]
    outs: [fit.txt]
  apart:
    wdir: ..
    cmd: python -c "open('apart.txt', 'w').write('a')"
    params: [models.gru]
    outs: [apart.txt]
"""


@pytest.fixture
def reproduced(tmp_path, monkeypatch):
    """A tiny DVC project, reproduced: every stage up to date."""
    for command in (["git", "init", "-q"], [DVC, "init", "-q"]):
        subprocess.run(command, cwd=tmp_path, check=True)
    (tmp_path / "dvc.yaml").write_text(PIPELINE)
    (tmp_path / "params.yaml").write_text("models:\n  gru: {optim: {lr: 0.005}}\n  lstm: {optim: {lr: 0.004}}\n")
    (tmp_path / "fits").mkdir()  # a second pipeline, as scaling/dvc.yaml's: a stage join reads (as the report reads
    # the scaling fit's) and one no stage of dvc.yaml reads, which `dvc repro` leaves alone
    (tmp_path / "fits/dvc.yaml").write_text(FITS)
    subprocess.run([DVC, "repro", "-q"], cwd=tmp_path, check=True)
    subprocess.run([DVC, "repro", "-q", "fits/dvc.yaml:apart"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_override_plans_the_stages_that_track_it_and_those_below(reproduced):
    from lmpipe_cli.plan import planned_stages

    assert planned_stages() == []
    assert sorted(planned_stages(changes={"models.gru.optim.lr": 0.003})) == ["fits/dvc.yaml:fit", "gru", "join"]
    assert planned_stages(changes={"models.gru.optim.lr": 0.003})[-1] == "join"  # as `dvc repro` orders them
    assert planned_stages(changes={"models.lstm": {"optim": {"lr": 0.001}}}) == ["lstm", "join"]
    assert planned_stages(changes={"models.rnn.optim.lr": 0.1}) == []
    (reproduced / "lstm.txt").unlink()  # what dvc status finds changed plans too
    assert planned_stages() == ["lstm", "join"]


def test_only_an_override_that_changes_a_value_moves_it():
    import yaml

    from lmpipe_cli.plan import moved

    params = ROOT / "params.yaml"
    lr = yaml.safe_load(params.read_text())["models"]["gru"]["optim"]["lr"]
    assert moved([f"models.gru.optim.lr={lr * 2}"], params)[0] == {"models.gru.optim.lr": lr * 2}
    assert moved([f"models.gru.optim.lr={lr}"], params)[0] == {}  # DVC would re-run nothing for it


def test_the_plan_says_the_training_it_holds_and_the_rate_it_assumes(mlflow_store):  # a store with no runs
    """The FLOPs are the model's budget and its decay branches' decays; the assumed rate is the bf16 machine's, or
    fp32's (FP32_SLOWER times lower) where this machine trains in fp32."""
    from lmpipe_cli.plan import DEFAULT_FLOPS_PER_S, FP32_SLOWER, summary
    from lmpipe.config import load_params
    from lmpipe.train import autocast_dtype, pick_device

    params = load_params(ROOT / "params.yaml")
    text = summary(["train@gru", "score@gru", "evaluate"], params)
    decays = params.models["gru"].optim.decay_fraction * sum(params.study.branch_budgets)
    flops = params.study.flops + decays
    assert params.study.branches and decays > 0.1 * params.study.flops  # the committed study has branches
    bf16 = autocast_dtype(params.train.precision, pick_device(params.train.device)) is not None
    rate = DEFAULT_FLOPS_PER_S if bf16 else DEFAULT_FLOPS_PER_S / FP32_SLOWER
    assert text.splitlines()[0] == "3 stage(s) would run: train@gru, score@gru, evaluate"
    assert text.splitlines()[1] == (f"training: 1 model(s), {flops:.2e} FLOPs ({params.study.flops:.2e} for the "
                                    f"runs, {decays:.2e} for their decay branches, study.branches), about "
                                    f"{flops / rate / 60:.0f} min "
                                    f"at {rate / 1e9:.0f} GFLOP/s (assumed: no training has finished on this machine "
                                    "yet" + ("" if bf16 else ", and it trains in fp32") + ")")
    assert summary([], params) == "nothing would run: every stage is up to date"


def test_a_change_to_one_models_setting_leaves_the_scaling_fits_alone():
    """In the project's own pipelines: `-S models.gru.optim.lr=...` moves gru's training and the report (which says
    whether the scaling grid is still the study's), never the grid's fits, whose bootstraps take ~40 min on 2 cores."""
    from dvc.repo import Repo

    from lmpipe_cli.plan import tracks

    with Repo(str(ROOT)) as repo:
        moving = {s.addressing for s in repo.index.stages if tracks(s, {"models.gru.optim.lr": 0.003})}
        fit = next(s for s in repo.index.stages if s.addressing == "scaling/dvc.yaml:fit")
    assert {"train@gru", "report"} <= moving
    assert "scaling/dvc.yaml:fit" not in moving and not tracks(fit, {"train.seed": 1})
    assert tracks(fit, {"scaling.fit.bootstrap": 10})


def test_the_plan_refuses_a_local_corpus_file_it_cannot_read_in_one_line(tmp_path, params_file, monkeypatch):
    """`lmpipe plan -S corpus.source=local ...` names the missing file as check-params does, before any stage."""
    from lmpipe_cli.plan import plan
    from lmpipe.errors import ConfigError

    (tmp_path / "train.txt").write_text("a b c\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        plan(["corpus.source=local", "corpus.files={train: train.txt, valid: gone.txt, test: train.txt}"])
    assert str(caught.value) == ("params.yaml: corpus.files.valid: gone.txt: no such file or directory (name a "
                                 "readable file)")
