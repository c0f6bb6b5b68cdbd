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


def test_a_row_made_under_todays_key_is_carried_as_it_is_and_the_rest_of_its_csv_is_still_checked(tmp_path,
                                                                                                  monkeypatch):
    """A committed row whose cache file names today's key (the same code, params and data, another day's run) needs no
    check row and is marked so; a row of another key in the same CSV is carried only by its own check."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "grid.csv"
    pd.DataFrame([{"name": n, "model": "gru", "valid_bpb": b, "train_seconds": t, "cache_file": f}
                  for n, b, t, f in [("gru-a", 2.5, 1.0, "gru-a-k1.json"), ("gru-b", 2.4, 2.0, "gru-b-old.json"),
                                     ("gru-c", 2.3, 3.0, "gru-c-old.json")]]).to_csv(path, index=False)
    rows, trained = reuse.committed([str(path)]), []

    def job_of(name: str, bpb: float):
        return SimpleNamespace(trainer=SimpleNamespace(run=lambda: trained.append(name) or SimpleNamespace(
            metrics={"valid_bpb": bpb})), ckpt_dir="/nonexistent/ckpt")

    jobs = {"gru-a": job_of("gru-a", 9.9), "gru-b": job_of("gru-b", 2.4), "gru-c": job_of("gru-c", 2.3)}
    monkeypatch.setattr(reuse, "keys_of", lambda jobs: {"gru-a": "k1", "gru-b": "k2", "gru-c": "k3"})
    assert reuse.own_rows({"gru-a": "k9", "gru-b": "k2"}, rows) == []  # changed code: every row is checked
    line = reuse.reuse(jobs, rows, None, 0.0)
    assert trained == ["gru-b"]  # the cheapest row of another key: the own row is never retrained
    assert line.startswith("1 rows made under today's keys carried as they are; reproduced: gru in ")
    assert line.endswith("; 2 rows carried into .cache/lmpipe/scaling/runs; 0 points of the grid have no committed row")
    own = json.loads((reuse.ROWS / "gru-a-k1.json").read_text())
    assert own["valid_bpb"] == 2.5 and own["same_key"] is True and "carried_within" not in own
    assert json.loads((reuse.ROWS / "gru-c-k3.json").read_text())["carried_within"] == 0.0
    assert reuse.reuse(jobs, rows, ["gru-a"], 0.0).startswith("0 rows made")  # kept, and named rows of its own key
    assert trained == ["gru-b"]  # are not retrained either


@pytest.mark.parametrize("given", ["0", "-1", "two"])
def test_workers_below_one_are_refused_instead_of_running_one_after_another(given):
    with pytest.raises(reuse.argparse.ArgumentTypeError, match="a whole number of at least 1"):
        reuse.at_least_one(given)
    assert reuse.at_least_one("2") == 2
