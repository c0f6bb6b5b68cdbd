"""The trainer: it learns, it is deterministic, and a killed run resumes to the same weights."""

from __future__ import annotations


import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from lmpipe.config import TrainParams
from lmpipe.model_params import ModelParams
from lmpipe.errors import ConfigError, Interrupted
from lmpipe.evaluate import evaluate_lm
from lmpipe.checkpoints import checkpoint_dir, discard, prune
from lmpipe.train import Trainer, setup_process, stream_plan, window_plan
from tests.helpers import ADAMW, ROOT, SYNTHETIC_VOCAB, entry, synthetic_data

V = SYNTHETIC_VOCAB


COMMON = TrainParams(seed=7, device="auto", threads=0, log_every=5, checkpoint_every=7, eval_chunk=50,
                     evals_per_epoch=1, compile=False, precision="auto")
SETTINGS = {
    "lstm": ModelParams(**entry("rnn", {"cell": "lstm", "emb": 24, "hidden": 32, "layers": 2, "dropout": 0.1,
                                        "weight_drop": 0.2, "dropout_embedding": 0.05, "ar": 1.0, "tar": 1.0},
                                optim={**ADAMW, "name": "sgd", "lr": 10.0, "clip": 0.5, "schedule": "constant",
                                       "momentum": 0.0, "nt_asgd": True, "nonmono": 1},
                                batch_size=8, seq_len=20, variable_bptt=True, epochs=5)),
    "transformer": ModelParams(**entry("transformer", {"dim": 32, "layers": 1, "heads": 2, "block_size": 32},
                                       optim={**ADAMW, "lr": 3e-3, "warmup_steps": 5}, batch_size=8, seq_len=32,
                                       epochs=2)),
    "nplm": ModelParams(**entry("nplm", {"context": 3, "emb": 16, "hidden": 32},
                                optim={**ADAMW, "name": "adam", "lr": 3e-3, "schedule": "plateau"}, batch_size=16,
                                seq_len=16, epochs=2)),
}


# today's small-budget recipe: rotary positions, RMS norms with QK-norm, a squared-ReLU MLP, an untied zero-initialised
# head, soft-capped logits, and Muon on the hidden matrices
SETTINGS["modern"] = ModelParams(**entry(
    "transformer", {"dim": 32, "layers": 1, "heads": 2, "block_size": 32, "position": "rope", "norm": "rmsnorm",
                    "qk_norm": True, "mlp": "relu2", "tie": False, "zero_init": True, "softcap": 15.0},
    optim={**ADAMW, "name": "muon", "lr": 3e-3, "warmup_steps": 5}, batch_size=8, seq_len=32, epochs=2))

# a learning rate high enough that validation stalls after a few epochs, so averaging starts for the last ones
SETTINGS["lstm_asgd"] = SETTINGS["lstm"].model_copy(update={
    "epochs": 6, "patience": 6, "optim": SETTINGS["lstm"].optim.model_copy(update={"lr": 40.0})})


def train(tmp_path, name, settings=None, common=COMMON, data=None, **kwargs):
    return Trainer(name, settings or SETTINGS[name], common, data or synthetic_data(), tmp_path / name,
                   setup_process(common), progress_bar=False).run(**kwargs)


def revised(settings: ModelParams, **update) -> ModelParams:
    """A checked copy with some settings changed (model_copy would skip validation); a budget replaces the epochs."""
    tree = {**settings.model_dump(), **update}
    if "budget" in update:
        tree.update(epochs=None, patience=None)
    return ModelParams.model_validate(tree)


def drop_timings(history):
    return [{k: v for k, v in r.items() if "seconds" not in k and "per_sec" not in k} for r in history]


def kill_at(step):
    def on_step(done):
        if done >= step:
            raise KeyboardInterrupt(f"killed after step {done}")
    return on_step


@pytest.mark.parametrize("name", ["lstm", "transformer", "modern", "nplm"])
def test_learns_far_below_unigram(tmp_path, name):
    result = train(tmp_path, name)
    assert result.metrics["valid_ppl"] < 8  # uniform is 30; the rule makes the next token nearly certain
    assert result.metrics["epochs"] == len(result.history) == SETTINGS[name].epochs
    assert set(result.metrics) >= {"model", "n_params", "n_params_non_embedding", "epochs", "best_epoch", "valid_ppl",
                                   "tokens_per_sec", "tokens_seen", "train_flops", "flops_per_sec", "device", "seconds"}
    assert result.metrics["train_flops"] == result.metrics["tokens_seen"] * result.metrics["flops_per_token"]
    assert result.history[-1]["tokens"] == result.metrics["tokens_seen"]


def test_same_seed_same_metrics(tmp_path):
    first = train(tmp_path / "a", "lstm")
    second = train(tmp_path / "b", "lstm")
    assert drop_timings(first.history) == drop_timings(second.history)



def test_a_run_draws_the_same_whatever_the_process_drew_after_building_it(tmp_path):
    """Dropout draws from torch's generator: a Trainer built, then other Trainers built and other draws made (a grid
    that prepares every run before training one), still trains as one run alone does."""
    settings = revised(SETTINGS["lstm"], epochs=1)
    alone = train(tmp_path / "alone", "lstm", settings)
    data = synthetic_data()
    first = Trainer("lstm", settings, COMMON, data, tmp_path / "first", setup_process(COMMON), progress_bar=False)
    Trainer("other", SETTINGS["nplm"], COMMON, data, tmp_path / "other", setup_process(COMMON), progress_bar=False)
    torch.rand(1000)
    after = first.run()
    assert drop_timings(after.history) == drop_timings(alone.history)
    assert all(torch.equal(a, b) for a, b in zip(after.model.state_dict().values(), alone.model.state_dict().values()))

@pytest.mark.parametrize("name, step", [("lstm", 11), ("lstm", 30), ("lstm_asgd", 130), ("transformer", 9),
                                        ("modern", 9)])
def test_kill_and_resume_gives_identical_weights_and_curve(tmp_path, name, step, capsys):
    """Killed between checkpoints (every 7 steps), inside an epoch: the resumed run repeats the lost steps and
    ends with the same weights and the same learning curve, the interrupted epoch's training sums included."""
    whole = train(tmp_path / "whole", name)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "killed", name, on_step=kill_at(step))
    assert (tmp_path / "killed" / name / "last.pt").exists()
    capsys.readouterr()
    steps = []
    resumed = train(tmp_path / "killed", name, on_step=steps.append)
    said = capsys.readouterr().err
    assert "unreadable checkpoint" not in said  # it resumed, it did not start afresh
    assert steps and 1 < steps[0] <= step + 1  # from the last checkpoint before the kill
    assert re.search(rf"^resuming {name} from step {steps[0] - 1} of \d+ ", said, re.M), said  # and says so
    for (key, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), key
    assert drop_timings(resumed.history) == drop_timings(whole.history)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_finishes_the_step_saves_it_and_says_so_in_one_line(tmp_path, signum):
    """Ctrl-C (or SIGTERM) at step 11, between the checkpoints of steps 7 and 14: the stop comes after step 11,
    whose checkpoint is saved, so the resumed run repeats nothing and still ends exactly as an uninterrupted one."""
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),  # as in a terminal, also
                signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL)}  # when pytest runs as a background job
    try:
        def ctrl_c(step):
            if step == 11:
                os.kill(os.getpid(), signum)
        with pytest.raises(Interrupted, match=r"^lstm interrupted at step 11; checkpoint saved$"):
            train(tmp_path / "stopped", "lstm", on_step=ctrl_c)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        saved = torch.load(tmp_path / "stopped" / "lstm" / "last.pt", weights_only=False)
        assert saved["progress"]["step"] == 11
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    whole = train(tmp_path / "whole", "lstm")
    resumed = train(tmp_path / "stopped", "lstm")
    for (key, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), key
    assert drop_timings(resumed.history) == drop_timings(whole.history)


def test_a_finished_run_resumes_finished_until_its_outputs_are_safe_and_its_checkpoints_discarded(tmp_path):
    """A failure after the last step (a full disk, the registry) must not cost the training: the checkpoints stay
    until the caller discards them; a rerun before that trains no step and returns the same model."""
    first = train(tmp_path, "nplm")
    assert (tmp_path / "nplm" / "last.pt").exists()
    steps = []
    resumed = train(tmp_path, "nplm", on_step=steps.append)
    assert steps == [] and resumed.history == first.history
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.state_dict().values(), first.model.state_dict().values()))
    discard(tmp_path / "nplm")
    again = train(tmp_path, "nplm", on_step=steps.append)  # "dvc repro -f": the same run from scratch
    assert len(steps) > 0 and drop_timings(again.history) == drop_timings(first.history)


def test_checkpoints_are_keyed_by_the_data(tmp_path):
    chosen = {"train": COMMON.model_dump(), "model": SETTINGS["lstm"].model_dump(mode="json")}
    same = checkpoint_dir(tmp_path, "lstm", chosen, synthetic_data(0).fingerprint)
    assert same == checkpoint_dir(tmp_path, "lstm", chosen, synthetic_data(0).fingerprint)
    assert same != checkpoint_dir(tmp_path, "lstm", chosen, synthetic_data(1).fingerprint)  # other tokens, same sizes
    assert same != checkpoint_dir(tmp_path, "lstm", {**chosen, "train": {**chosen["train"], "seed": 8}},
                                  synthetic_data(0).fingerprint)


def test_changed_data_never_resumes(tmp_path):
    """A run killed on one corpus, then started on another: its checkpoint is not touched, training starts fresh."""
    chosen = {"train": COMMON.model_dump(), "model": SETTINGS["lstm"].model_dump(mode="json")}
    old_dir = checkpoint_dir(tmp_path, "lstm", chosen, synthetic_data(0).fingerprint)
    with pytest.raises(KeyboardInterrupt):
        Trainer("lstm", SETTINGS["lstm"], COMMON, synthetic_data(0), old_dir, setup_process(COMMON), progress_bar=False).run(
            on_step=kill_at(20))
    new_data = synthetic_data(1)
    new_dir = checkpoint_dir(tmp_path, "lstm", chosen, new_data.fingerprint)
    result = Trainer("lstm", SETTINGS["lstm"], COMMON, new_data, new_dir, setup_process(COMMON), progress_bar=False).run()
    fresh = train(tmp_path / "fresh", "lstm", data=synthetic_data(1))
    assert drop_timings(result.history) == drop_timings(fresh.history)
    assert (old_dir / "last.pt").exists()


def test_unreadable_checkpoint_starts_afresh_with_one_line(tmp_path, capsys):
    (tmp_path / "nplm").mkdir()
    (tmp_path / "nplm" / "last.pt").write_bytes(b"torn")
    result = train(tmp_path, "nplm")
    fresh = train(tmp_path / "fresh", "nplm")
    assert drop_timings(result.history) == drop_timings(fresh.history)
    message = capsys.readouterr().err.strip().splitlines()
    assert len(message) == 1 and "unreadable checkpoint" in message[0] and "last.pt" in message[0]


def test_pruning_keeps_the_newest_runs_of_the_model_and_touches_nothing_else(tmp_path):
    """Only folders lmpipe marked as runs of the model are its: a user's folder whose name looks like a run's
    (`gru-202611270900`, a timestamp), another model's runs and anything outside the root survive."""
    import os

    from lmpipe.checkpoints import make_dir

    root = tmp_path / "ckpt"
    runs = [make_dir(root / f"gru-{i:012x}", "gru") for i in range(6)]
    for i, run in enumerate(runs):
        os.utime(run, (i, i))
    strangers = [root / "gru-202611270900", root / "gru-notes", root / "gru-0000000000zz", tmp_path / "gru-000000000009",
                 make_dir(root / "lstm-000000000001", "lstm")]
    for path in strangers:
        path.mkdir(exist_ok=True)
    (root / "gru-202611270900" / "mine.txt").write_text("a user's folder, named like a run")
    keep = make_dir(root / "gru-ffffffffffff", "gru")
    assert sorted(p.name for p in prune(keep, "gru")) == [f"gru-{i:012x}" for i in range(4)]
    left = {p.name for p in root.iterdir()}
    assert left == {"gru-000000000004", "gru-000000000005", "gru-ffffffffffff", "gru-202611270900", "gru-notes",
                    "gru-0000000000zz", "lstm-000000000001"}
    assert all(path.exists() for path in strangers)
    assert prune(tmp_path / "lmpipe-y", "lmpipe") == []  # a root of strangers: prunes nothing


def test_a_training_run_marks_its_checkpoint_folder_as_its_own(tmp_path):
    import json

    from lmpipe.checkpoints import MARK

    with pytest.raises(KeyboardInterrupt):
        train(tmp_path, "nplm", on_step=kill_at(8))
    assert json.loads((tmp_path / "nplm" / MARK).read_text())["model"] == "nplm"


def test_a_checkpoint_that_loads_but_does_not_fit_is_set_aside_and_training_restarts(tmp_path, capsys):
    other = Trainer("nplm", revised(SETTINGS["nplm"], arch={"context": 3, "emb": 8, "hidden": 32}), COMMON,
                    synthetic_data(), tmp_path / "nplm", setup_process(COMMON), progress_bar=False)
    other._save()  # a whole checkpoint of another shape where this run's should be
    result = train(tmp_path, "nplm")
    fresh = train(tmp_path / "fresh", "nplm")
    assert drop_timings(result.history) == drop_timings(fresh.history)
    assert (tmp_path / "nplm" / "last.rejected").exists()
    message = capsys.readouterr().err.strip().splitlines()
    assert len(message) == 1 and "set aside" in message[0] and "last.pt" in message[0]


def test_budget_in_tokens_sets_the_run_length_and_the_schedule_anneals_to_it(tmp_path):
    settings = revised(SETTINGS["transformer"], budget={"tokens": 8 * 32 * 30})
    common = COMMON.model_copy(update={"evals_per_epoch": 3})
    result = train(tmp_path, "transformer", settings=settings, common=common)
    assert result.history[-1]["step"] == 30 and result.metrics["tokens_seen"] == 8 * 32 * 30
    assert result.history[-1]["lr"] < 0.01 * settings.optim.lr  # cosine annealed to ~0 at the budget's end
    steps = [h["step"] for h in result.history]
    assert steps == sorted(steps) and len(steps) >= 3 and steps[-1] == 30


def test_a_budget_trains_to_its_end_where_epochs_would_stop_early(tmp_path):
    """Early stopping cut budgeted runs before their schedule annealed (the study's transformer stopped at 71% of
    its FLOPs): under a budget the run spends all of it and keeps its best weights; without one, patience holds."""
    diverging = {"optim": {**ADAMW, "lr": 0.5, "clip": 100.0, "schedule": "constant"}, "patience": 1}
    common = COMMON.model_copy(update={"evals_per_epoch": 4})
    stopped = train(tmp_path / "epochs", "nplm", settings=revised(SETTINGS["nplm"], epochs=3, **diverging),
                    common=common)
    budget = stopped.metrics["tokens_seen"] * 3
    assert len(stopped.history) < 12  # a rate this high stops improving: early stopping ends the run
    spent = train(tmp_path / "budget", "nplm", common=common,
                  settings=revised(SETTINGS["nplm"], budget={"tokens": budget}, optim=diverging["optim"]))
    assert spent.metrics["tokens_seen"] >= budget
    kept = evaluate_lm(spent.model, synthetic_data(), chunk=COMMON.eval_chunk)["valid"]["bpb"]
    best = min(h["valid_bpb"] for h in spent.history)
    assert kept == pytest.approx(best, rel=1e-6) and best < spent.history[-1]["valid_bpb"]  # the best weights, kept


def test_budget_under_variable_bptt_ends_at_the_budget_not_short_of_it(tmp_path):
    """Steps of random length: the run ends at the first step that reaches the budget (it ended ~3% short when the
    step count assumed seq_len tokens per step), and the schedule anneals to exactly that step."""
    budget = 8 * 20 * 40
    settings = revised(SETTINGS["lstm"], budget={"tokens": budget},
                       optim={**ADAMW, "lr": 3e-3, "clip": 0.5, "schedule": "wsd", "decay_fraction": 0.5})
    result = train(tmp_path, "lstm", settings=settings)
    longest = 8 * (20 + 5 * 6)  # a step's batch times a generous bound on one variable BPTT length
    assert budget <= result.metrics["tokens_seen"] < budget + longest
    assert result.history[-1]["lr"] < 0.1 * settings.optim.lr  # annealed to its last step, the one that reached the budget


def test_precision_auto_uses_bf16_only_where_the_device_computes_it_natively():
    from lmpipe.train import autocast_dtype, native_bf16

    cpu = torch.device("cpu")
    assert autocast_dtype("fp32", cpu) is None and autocast_dtype("bf16", cpu) is torch.bfloat16
    assert autocast_dtype("auto", cpu) == (torch.bfloat16 if native_bf16(cpu) else None)
    assert autocast_dtype("auto", torch.device("cuda")) is torch.bfloat16


def test_bf16_training_learns_and_stays_deterministic(tmp_path):
    common = COMMON.model_copy(update={"precision": "bf16"})
    first = train(tmp_path / "a", "transformer", common=common)
    second = train(tmp_path / "b", "transformer", common=common)
    assert first.metrics["valid_ppl"] < 8
    assert drop_timings(first.history) == drop_timings(second.history)
    fp32 = train(tmp_path / "c", "transformer", common=COMMON.model_copy(update={"precision": "fp32"}))
    assert drop_timings(fp32.history) != drop_timings(first.history)  # the setting reaches the training steps


def test_wsd_schedule_warms_up_holds_then_decays_linearly_to_zero():
    from lmpipe.model_params import AdamParams
    from lmpipe.train.trainer import _lr_factor

    optim = AdamParams(**{**ADAMW, "schedule": "wsd", "warmup_steps": 10, "decay_fraction": 0.25})
    factors = [_lr_factor(optim, step, 100) for step in range(100)]
    assert factors[0] == 0.1 and factors[9] == 1.0  # warmup
    assert set(factors[10:76]) == {1.0}  # stable
    assert factors[76:] == [(100 - s) / 25 for s in range(76, 100)]  # linear decay, 0.04 at the last step
    cosine = [_lr_factor(AdamParams(**{**ADAMW, "warmup_steps": 10}), step, 100) for step in range(100)]
    assert sum(factors) > sum(cosine)  # more steps at a high rate for the same run length


def test_budget_in_flops_matches_the_same_budget_in_tokens(tmp_path):
    from lmpipe.flops import train_flops_per_token
    from lmpipe.models import arch_with_defaults

    base = SETTINGS["nplm"]
    per_token = train_flops_per_token("nplm", arch_with_defaults("nplm", base.arch), V, base.seq_len)
    by_tokens = train(tmp_path / "t", "nplm", settings=revised(base, budget={"tokens": 16 * 16 * 25}))
    by_flops = train(tmp_path / "f", "nplm",
                     settings=revised(base, budget={"flops": 16 * 16 * 25 * per_token}))
    assert drop_timings(by_flops.history) == drop_timings(by_tokens.history)
    assert by_flops.metrics["train_flops"] == 16 * 16 * 25 * per_token


def test_nt_asgd_switches_when_validation_stalls(tmp_path):
    history = train(tmp_path, "lstm_asgd").history
    losses = [h["valid_loss"] for h in history]
    switched = [h["asgd"] for h in history]
    # averaging starts right after the first epoch whose loss is no better than the best before it
    for i in range(1, len(history)):
        expected = int(any(losses[j] > min(losses[:j]) for j in range(1, i)))
        assert switched[i] == expected
    assert switched[0] == 0 and switched[-1] == 1  # the switch happened, and not before the evidence


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


@pytest.mark.parametrize("name, update", [("lstm", {}), ("lstm", {"variable_bptt": False}),
                                          ("lstm", {"variable_bptt": False, "max_steps_per_epoch": 7}),
                                          ("transformer", {}), ("nplm", {}), ("nplm", {"max_steps_per_epoch": 9})])
def test_a_run_of_endless_epochs_counts_its_steps_as_its_plans_have_them_without_building_them(tmp_path, name, update,
                                                                                              monkeypatch):
    """The schedule's length is the epochs' steps: counted without building each epoch's plan where the length is
    known beforehand (a run of 100000 epochs starts at once, not after minutes of plans), the same count as the
    plans'."""
    settings = revised(SETTINGS[name], **update)
    trainer = Trainer(name, settings, COMMON, synthetic_data(), tmp_path / name, setup_process(COMMON),
                      progress_bar=False)
    assert [trainer._epoch_steps(e) for e in range(30)] == [len(trainer._epoch_plan(e)) for e in range(30)]
    assert trainer.total_steps == sum(len(trainer._epoch_plan(e)) for e in range(settings.epochs))
    if not settings.variable_bptt:
        built = []
        monkeypatch.setattr(Trainer, "_epoch_plan", lambda self, epoch, plan=Trainer._epoch_plan: built.append(epoch)
                            or plan(self, epoch))
        endless = Trainer(name, revised(settings, epochs=100000, patience=100000), COMMON, synthetic_data(),
                          tmp_path / "endless", setup_process(COMMON), progress_bar=False)
        assert endless.total_steps >= 100000 * min(trainer._epoch_steps(e) for e in range(30))
        assert built == [0]  # the first epoch's plan alone, for steps_per_epoch


def test_muon_takes_the_hidden_matrices_and_adamw_the_embeddings_head_norms_and_biases():
    from lmpipe.models import build_model
    from lmpipe.optim import muon_split

    for arch in ({"dim": 16, "layers": 2, "heads": 2, "block_size": 8}, {"dim": 16, "layers": 1, "heads": 2,
                                                                           "block_size": 8, "tie": False}):
        model = build_model("transformer", arch, V, 0)
        matrices, rest = muon_split(model, V)
        names = {id(p): n for n, p in model.named_parameters()}
        assert sorted(names[id(p)] for p in matrices) == sorted(
            f"blocks.{i}.{m}.weight" for i in range(arch["layers"]) for m in ("qkv", "proj", "mlp.0", "mlp.2"))
        assert {names[id(p)] for p in rest} >= {"embed.weight", "pos.weight", "ln_f.weight", "blocks.0.qkv.bias"}
        assert len(matrices) + len(rest) == len(list(model.parameters()))  # a tied head counted once


@pytest.mark.parametrize("name", ["transformer", "modern"])
def test_a_compiled_training_run_matches_the_eager_one(tmp_path, name):
    """train.compile: torch.compile (inductor on the CPU) trains the same model as eager execution, within float
    tolerance: the path the GPU profiles rely on, run here first. Without dropout: inductor draws its own masks."""
    short = revised(SETTINGS[name], epochs=1, max_steps_per_epoch=6, arch={**SETTINGS[name].arch, "dropout": 0.0})
    eager = train(tmp_path / "eager", name, settings=short)
    compiled = train(tmp_path / "compiled", name, settings=short, common=COMMON.model_copy(update={"compile": True}))
    for (key, a), (_, b) in zip(eager.model.state_dict().items(), compiled.model.state_dict().items()):
        if key.endswith("qkv.bias"):  # softmax ignores the key's bias (with QK-norm the query's nearly so), so their
            continue  # gradients are rounding noise that Adam turns into lr-sized steps of either sign; in bf16 on an
            # H100 the value bias moved 2.3e-3 too (docs/benchmarks.md); the valid bpb below covers them all
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3, msg=key)  # looser: Muon orthogonalises in bf16 on a bf16 CPU
    assert compiled.metrics["valid_bpb"] == pytest.approx(eager.metrics["valid_bpb"], rel=1e-5)


def test_every_run_outside_the_stages_is_set_up_by_one_function():
    """configure_run: python -m lmpipe.train, seeds, sweeps and the scaling grid change a model's settings, its
    budget and the train section the same way, validated as params.yaml is."""

    from lmpipe.config import load_params
    from lmpipe.overrides import assignments
    from lmpipe.errors import ConfigError
    from lmpipe.train import configure_run

    params = load_params(ROOT / "params.yaml")
    changes = assignments(["optim.lr=0.003", "arch.layers=2"])
    settings, common = configure_run(params, "gru", changes, {"tokens": 1000}, {"seed": 7})
    assert settings.optim.lr == 0.003 and settings.arch["layers"] == 2 and settings.budget.tokens == 1000
    assert settings.optim.clip == params.models["gru"].optim.clip and common.seed == 7
    assert common.eval_chunk == params.train.eval_chunk
    by_epochs, _ = configure_run(params, "gru", {"epochs": 2, "patience": 1})  # they replace the model's budget
    assert by_epochs.budget is None and (by_epochs.epochs, by_epochs.patience) == (2, 1)
    with pytest.raises(ConfigError, match=r"a run of `epochs` needs patience"):  # stated, as in params.yaml
        configure_run(params, "gru", {"epochs": 2})
    with pytest.raises(ConfigError, match="models has no entry 'gpt'"):
        configure_run(params, "gpt")
    with pytest.raises(ConfigError, match=r"train \{'seed': 'x'\}: seed"):
        configure_run(params, "gru", train={"seed": "x"})
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        assignments(["optim.lr"])


def test_a_decay_branch_is_the_standalone_run_of_its_budget_bit_for_bit(tmp_path):
    """Under wsd the run at budget B is the run at C up to B's decay start: a branch resumes a copy of C's state
    there and decays to B. Its weights and last point equal B's run from scratch, and the run at C is unchanged by
    it. The branch validates once in its decay, at its end (`curve=False`): the points between cost time only."""
    from lmpipe.model_params import Budget

    wsd = {**ADAMW, "name": "muon", "lr": 3e-3, "warmup_steps": 5, "schedule": "wsd", "decay_fraction": 0.25}
    big, small = (revised(SETTINGS["modern"], budget={"tokens": n}, optim=wsd) for n in (9000, 3000))
    often = COMMON.model_copy(update={"evals_per_epoch": 12})  # points inside the small run's decay
    main = Trainer("modern", big, often, synthetic_data(), tmp_path / "main", setup_process(often), progress_bar=False)
    start = main.decay_start(Budget(tokens=3000))
    assert 5 < start < main.total_steps // 3
    branched = main.run(branches={start: tmp_path / "branch"})
    every_step = often.model_copy(update={"checkpoint_every": 1})  # where it is saved changes no number

    def branch_trainer():
        return Trainer("modern", small, every_step, synthetic_data(), tmp_path / "branch", setup_process(every_step),
                       progress_bar=False)

    first, killed = [], branch_trainer()
    with pytest.raises(KeyboardInterrupt):  # killed once it has a checkpoint of its own
        killed.run(on_step=lambda step: (first.append(step), kill_at(start + 1)(step)), curve=False)
    assert first == [start + 1]  # it trained its decay alone
    trainer, steps = branch_trainer(), []
    branch = trainer.run(on_step=steps.append, curve=False)
    assert steps[0] == start + 2  # resumed from its own checkpoint, which kept the parent's seconds at the branch point
    assert 0 < trainer.progress.branched_seconds == killed.progress.branched_seconds < branch.metrics["seconds"]
    assert main.progress.branched_seconds == 0.0  # the parent is no branch
    alone = train(tmp_path / "alone", "modern", settings=small, common=often)
    unbranched = train(tmp_path / "unbranched", "modern", settings=big, common=often)
    decaying = [r for r in alone.history if r["step"] > start]
    assert len(decaying) >= 2  # the standalone run validates within its decay as well as at its end
    assert drop_timings(branch.history[:-1]) == drop_timings(alone.history[:-len(decaying)])  # the parent's points
    valid = [k for k in alone.history[-1] if k.startswith("valid_")] + ["step", "tokens", "flops", "epoch", "lr"]
    assert {k: branch.history[-1][k] for k in valid} == {k: alone.history[-1][k] for k in valid}  # its one point
    assert drop_timings(branched.history) == drop_timings(unbranched.history)
    for (ours, theirs) in ((branch, alone), (branched, unbranched)):
        for (key, a), (_, b) in zip(ours.model.state_dict().items(), theirs.model.state_dict().items()):
            assert torch.equal(a, b), key
    assert branch.metrics["valid_bpb"] == alone.metrics["valid_bpb"]
    assert branch.metrics["tokens_seen"] == alone.metrics["tokens_seen"] >= 3000


def test_a_branch_needs_wsd_and_a_smaller_budget(tmp_path):
    from lmpipe.model_params import Budget

    cosine = Trainer("modern", revised(SETTINGS["modern"], budget={"tokens": 9000}), COMMON, synthetic_data(),
                     tmp_path / "c", setup_process(COMMON), progress_bar=False)
    with pytest.raises(ConfigError, match="wsd schedule"):
        cosine.decay_start(Budget(tokens=3000))
    wsd = {**ADAMW, "name": "muon", "lr": 3e-3, "warmup_steps": 5, "schedule": "wsd", "decay_fraction": 0.25}
    run = Trainer("modern", revised(SETTINGS["modern"], budget={"tokens": 9000}, optim=wsd), COMMON, synthetic_data(),
                  tmp_path / "w", setup_process(COMMON), progress_bar=False)
    with pytest.raises(ConfigError, match="not smaller"):
        run.decay_start(Budget(tokens=9000))


def _short_write(real, name: str, nth: int, error: BaseException):
    """torch.save that, on its `nth` save to a file called `name`, writes half the bytes and then fails as a full
    disk does."""
    import io
    from pathlib import Path

    seen = []

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)) and Path(f).name == name:
            seen.append(f)
            if len(seen) == nth:
                buffer = io.BytesIO()
                real(obj, buffer)
                Path(f).write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                raise error
        return real(obj, f, *args, **kwargs)
    return save


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1600 vs 1494")],
                         ids=["errno", "torch"])
def test_a_full_disk_mid_checkpoint_is_one_line_keeps_the_last_good_checkpoint_and_the_rerun_resumes(
        tmp_path, monkeypatch, error):
    import shutil
    from collections import namedtuple

    from lmpipe.checkpoints import Checkpoint
    from lmpipe.errors import DiskFull

    whole = train(tmp_path / "whole", "nplm")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))
    monkeypatch.setattr(torch, "save", _short_write(torch.save, "last.tmp", 2, error))
    folder = tmp_path / "full" / "nplm"
    with pytest.raises(DiskFull) as info:
        train(tmp_path / "full", "nplm")
    monkeypatch.undo()
    said = str(info.value)
    assert re.fullmatch(rf"no space left on {re.escape(str(folder / 'last.pt'))}: needs about [\d.]+ (kB|MB), 4 kB "
                        r"free \(free space, then rerun: it resumes\)", said), said
    assert not list(folder.glob("*.tmp"))  # no partial file left to fill the disk further
    Checkpoint.load(folder / "last.pt", torch.device("cpu"))  # the previous checkpoint, whole
    steps = []
    resumed = train(tmp_path / "full", "nplm", on_step=steps.append)
    assert steps and steps[0] > 1  # resumed, not from scratch
    assert drop_timings(resumed.history) == drop_timings(whole.history)
    for (key, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), key


def test_train_out_on_a_full_disk_is_one_line_leaves_no_partial_file_and_the_rerun_writes_it(tmp_path, monkeypatch,
                                                                                             capsys):
    """python -m lmpipe.train --out: the model file cannot be written; the line names the folder, nothing half-written
    stays, the checkpoints do, and the same command then writes the outputs without training again."""
    import lmpipe.train.__main__ as cli
    from lmpipe.train.job import Job

    job = Job("nplm", SETTINGS["nplm"], COMMON, synthetic_data(), tmp_path / "ckpt")
    monkeypatch.setattr(cli, "prepare", lambda *args, **kwargs: job)
    out = tmp_path / "result"
    argv = ["--model", "nplm", "--params", str(ROOT / "params.yaml"), "--out", str(out)]
    with monkeypatch.context() as patched:
        patched.setattr(torch, "save", _short_write(torch.save, "model.pt", 1, OSError(28, "No space left on device")))
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
    said = str(info.value.code)
    assert re.fullmatch(rf"error: no space left on {re.escape(str(out))}: needs about [\d.]+ (kB|MB), [\d,.]+ (kB|MB) "
                        r"free \(free space, then rerun: it resumes\)", said), said
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "result"]
    assert (job.ckpt_dir / "last.pt").exists()  # the finished run is kept
    capsys.readouterr()
    cli.main(argv)
    assert capsys.readouterr().out == ""  # no evaluation printed: nothing trained again
    assert sorted(p.name for p in out.iterdir()) == ["curve.csv", "lmpipe-output.json", "metrics.json", "model.pt"]
    assert not job.ckpt_dir.exists()


def test_the_training_command_takes_settings_as_dvc_does_with_S(tmp_path, monkeypatch):
    """python -m lmpipe.train -S KEY=VALUE (repeatable), a key of models.<model> with or without that prefix, as
    `dvc exp run -S` takes it; the run gets them as dotted settings of the model."""
    import lmpipe.train.__main__ as cli
    from lmpipe.errors import LmpipeError

    seen = {}

    def prepare(params, model, ckpt_root, *, overrides, **kwargs):
        seen.update(model=model, overrides=overrides)
        raise LmpipeError("stop here")

    monkeypatch.setattr(cli, "prepare", prepare)
    with pytest.raises(SystemExit) as info:
        cli.main(["--model", "gru", "--params", str(ROOT / "params.yaml"), "-S", "optim.lr=0.003",
                  "--set-param", "models.gru.arch.layers=2", "-S", "+models.gru.epochs=3"])
    assert info.value.code == "error: stop here"
    assert seen == {"model": "gru", "overrides": {"optim.lr": 0.003, "arch.layers": 2, "epochs": 3}}


@pytest.mark.parametrize("given", [["optim.lr=0.003"], ["--set", "optim.lr=0.003"], ["--set=optim.lr=0.003"]])
def test_the_training_command_refuses_another_settings_syntax_in_one_line_naming_S(given):
    done = subprocess.run([sys.executable, "-m", "lmpipe.train", "--model", "gru", *given], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "python -m lmpipe.train: give settings as -S key=value (as dvc exp run -S); e.g. -S optim.lr=0.003"]
