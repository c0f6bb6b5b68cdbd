"""lmpipe/tuned.py: a setting found better at C than the study's own, beyond the seeds' noise, is named."""

from __future__ import annotations

import pytest

from lmpipe import tuned

HEADER = "number,state,valid_bpb,optim.name,evaluations,tokens_seen,train_flops,seconds\n"


def sweep(root, folder: str, model: str, rows: str) -> None:
    path = root / folder / model
    path.mkdir(parents=True)
    (path / "trials.csv").write_text(HEADER + rows)


def seeds(model: str, *values: float) -> list[dict]:
    return [{"model": model, "seed": i, "valid_bpb": v} for i, v in enumerate(values)]


def test_only_a_point_at_the_studys_budget_better_beyond_twice_the_seeds_sd_is_named(tmp_path):
    sweep(tmp_path, "sweeps/opt", "rnn", "0,COMPLETE,2.2209,muon,8,1,3.0e13,1\n")
    sweep(tmp_path, "sweeps/opt", "nplm", "0,COMPLETE,2.2933,muon,8,1,3.0e13,1\n")  # worse: within noise
    sweep(tmp_path, "sweeps/opt", "gru", "0,COMPLETE,2.1000,adamw,8,1,1.5e13,1\n")  # another budget
    sweep(tmp_path, "sweeps/opt", "lstm", "0,PRUNED,2.1000,adamw,8,1,3.0e13,1\n")  # not finished
    rows = seeds("rnn", 2.2608, 2.2681, 2.2648) + seeds("nplm", 2.2884, 2.2975, 2.2921) + seeds("gru", 2.19, 2.20) \
        + seeds("lstm", 2.17, 2.171) + seeds("transformer", 2.10)  # one seed: no sd, nothing judged
    sweep(tmp_path, "sweeps/opt", "transformer", "0,COMPLETE,2.0,muon,8,1,3.0e13,1\n")
    found = tuned.better_found(tmp_path, ("sweeps/opt", "sweeps/none"), rows, 3e13)
    assert [(b.model, b.setting, b.source) for b in found] == [("rnn", "optim.name=muon", "sweeps/opt/rnn")]
    assert found[0].study_bpb == pytest.approx(2.26457, abs=1e-5) and found[0].study_sd == pytest.approx(0.00365,
                                                                                                       abs=1e-5)
    assert found[0].text() == ("rnn: `optim.name=muon` (sweeps/opt/rnn) gave valid bpb 2.2209 at C against the "
                               "study's 2.2646 ± 0.0037, 0.044 lower (more than 2 x sd)")
