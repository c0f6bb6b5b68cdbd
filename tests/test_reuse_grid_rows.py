"""sweeps/reuse_grid_rows.py: committed grid rows are carried to new cache keys only after the code reproduces them."""

import importlib.util
import json
from types import SimpleNamespace

import pandas as pd
import pytest

from tests.helpers import ROOT

spec = importlib.util.spec_from_file_location("reuse_grid_rows", ROOT / "sweeps" / "reuse_grid_rows.py")
reuse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reuse)


def job(bpb: float):
    """A grid point's job whose run ends at `bpb` (what check trains) and leaves no checkpoint folder."""
    run = lambda: SimpleNamespace(metrics={"valid_bpb": bpb})  # noqa: E731
    return SimpleNamespace(trainer=SimpleNamespace(run=run), ckpt_dir="/nonexistent/ckpt")


def committed(tmp_path, rows: dict) -> pd.DataFrame:
    path = tmp_path / "grid.csv"
    pd.DataFrame([{"name": n, "model": n.split("-")[0], "valid_bpb": b, "train_seconds": 1.0,
                   "cache_file": f"{n}-old.json"} for n, b in rows.items()]).to_csv(path, index=False)
    return reuse.committed([str(path)])


def test_rows_the_code_does_not_reproduce_are_left_out(tmp_path, capsys):
    rows = committed(tmp_path, {"gru-a": 2.5, "rnn-a": 2.75})
    gru, rnn = ("gru", str(tmp_path / "grid.csv")), ("rnn", str(tmp_path / "grid.csv"))
    assert reuse.check({"gru-a": job(2.5), "rnn-a": job(2.75)}, rows, ["gru-a", "rnn-a"]) == {gru: 0.0, rnn: 0.0}
    assert reuse.check({"gru-a": job(2.5), "rnn-a": job(2.7500000000000004)}, rows, ["gru-a", "rnn-a"]) == {gru: 0.0}
    assert (f"rnn in {rnn[1]}: the code as it is does not reproduce these rows within 0 bpb: not carried"
            in capsys.readouterr().out)
    held = reuse.check({"gru-a": job(2.50001), "rnn-a": job(2.76)}, rows, ["gru-a", "rnn-a"], tolerance=1e-4)
    assert list(held) == [gru] and held[gru] == pytest.approx(1e-5)
    assert reuse.check({"gru-a": job(float("nan")), "rnn-a": job(2.75)}, rows, ["gru-a", "rnn-a"], 1.0) == {rnn: 0.0}


def test_carried_rows_land_under_todays_keys_marked_and_never_over_a_row_trained_since(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = committed(tmp_path, {"gru-a": 2.5, "gru-b": 2.4})
    trained = reuse.ROWS / "gru-b-k2.json"
    trained.parent.mkdir(parents=True)
    trained.write_text(json.dumps({"name": "gru-b", "valid_bpb": 2.4, "trained": "here"}))
    jobs = {"gru-a": job(2.5), "gru-b": job(2.4), "gru-new": job(2.3)}
    keys, csv = {"gru-a": "k1", "gru-b": "k2", "gru-new": "k3"}, str(tmp_path / "grid.csv")
    assert reuse.carry(jobs, keys, rows, {("rnn", csv): 0.0, ("gru", "another.csv"): 0.0}) == 0  # not held
    assert reuse.carry(jobs, keys, rows, {("gru", csv): 1e-5}) == 1
    carried = json.loads((reuse.ROWS / "gru-a-k1.json").read_text())
    assert carried["valid_bpb"] == 2.5 and carried["carried_from"] == "gru-a-old.json" and carried["name"] == "gru-a"
    assert carried["carried_within"] == 1e-5
    assert json.loads(trained.read_text())["trained"] == "here"  # a row trained under today's key stays
    assert not (reuse.ROWS / "gru-new-k3.json").exists()  # a point no CSV holds is left to lmpipe scaling
    assert "source" not in carried

    (reuse.ROWS / "gru-new-k3.json").write_text(json.dumps({"name": "gru-new", "valid_bpb": 2.3}))  # trained here
    reuse.export(tmp_path / "out.csv", jobs, keys, rows)
    exported = pd.read_csv(tmp_path / "out.csv")  # the rows trained here (gru-b, gru-new), not the one carried
    assert sorted(exported["name"]) == ["gru-b", "gru-new"] and "source" not in exported.columns
    assert list(exported.loc[exported["name"] == "gru-new", "cache_file"]) == ["gru-new-k3.json"]


def test_each_model_is_checked_once_in_each_csv_by_its_cheapest_row(tmp_path):
    """Each CSV is a grid run of its own day's code: a model's rows in two CSVs get a check row from each."""
    old, new = tmp_path / "grid_a.csv", tmp_path / "grid_b.csv"
    pd.DataFrame([{"name": "gru-a", "model": "gru", "valid_bpb": 2.5, "train_seconds": 9.0, "cache_file": "x"},
                  {"name": "gru-b", "model": "gru", "valid_bpb": 2.4, "train_seconds": 3.0, "cache_file": "x"},
                  {"name": "rnn-a", "model": "rnn", "valid_bpb": 2.6, "train_seconds": 5.0, "cache_file": "x"}]
                 ).to_csv(old, index=False)
    pd.DataFrame([{"name": "gru-c", "model": "gru", "valid_bpb": 2.3, "train_seconds": 7.0, "cache_file": "x"}]
                 ).to_csv(new, index=False)
    rows = reuse.committed([str(old), str(new)])
    assert reuse.check_rows(rows, ["gru-a", "gru-b", "gru-c", "rnn-a"]) == ["gru-b", "gru-c", "rnn-a"]


def test_a_row_made_under_todays_key_is_carried_as_it_is_and_only_it(tmp_path, monkeypatch):
    """A committed row whose cache file names today's key (the same code, params and data, another day's run) needs
    no check row; one of another key in the same CSV still does."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "grid.csv"
    pd.DataFrame([{"name": "gru-a", "model": "gru", "valid_bpb": 2.5, "train_seconds": 1.0, "cache_file": "gru-a-k1.json"},
                  {"name": "gru-b", "model": "gru", "valid_bpb": 2.4, "train_seconds": 1.0, "cache_file": "gru-b-old.json"}]
                 ).to_csv(path, index=False)
    rows, keys = reuse.committed([str(path)]), {"gru-a": "k1", "gru-b": "k2"}
    assert reuse.own_rows(keys, rows) == ["gru-a"]
    assert reuse.own_rows({"gru-a": "k9", "gru-b": "k2"}, rows) == []  # changed code: every row is checked
    mine = rows.loc[["gru-a"]]
    assert reuse.carry({"gru-a": job(9.9), "gru-b": job(9.9)}, keys, mine, {("gru", str(path)): 0.0}) == 1
    assert json.loads((reuse.ROWS / "gru-a-k1.json").read_text())["valid_bpb"] == 2.5
    assert not (reuse.ROWS / "gru-b-k2.json").exists()
