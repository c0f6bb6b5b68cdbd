"""sweeps/reuse_grid_rows.py: committed grid rows are carried to new cache keys only after the code reproduces them."""

import importlib.util
import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from lmpipe.train import job as job_module
from tests.helpers import ROOT

spec = importlib.util.spec_from_file_location("reuse_grid_rows", ROOT / "sweeps" / "reuse_grid_rows.py")
reuse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reuse)


class Job:
    """A grid point's job whose run ends at `bpb`, kept in the row cache as the project's Job keeps a row (its
    `cached`), leaving no checkpoint folder; `trained` lists the points trained."""

    cached = job_module.Job.cached

    def __init__(self, bpb: float, trained: list | None = None, key: str = "today"):
        self.bpb, self.trained, self.key, self.ckpt_dir = bpb, [] if trained is None else trained, key, "/nonexistent"


@pytest.fixture(autouse=True)
def todays_keys(monkeypatch):
    """Each stand-in job keyed `today` and trained to its row by `Job.bpb` (what check trains)."""
    monkeypatch.setattr(reuse, "row_key", lambda job: getattr(job, "key", "today"))

    def trained_row(point, job):
        job.trained.append(point.name)
        return {"name": point.name, "model": point.model, "valid_bpb": job.bpb}, None

    monkeypatch.setattr(reuse, "trained_row", trained_row)


def points_of(jobs: dict) -> dict:
    return {name: SimpleNamespace(name=name, model=name.split("-")[0]) for name in jobs}


def committed(tmp_path, rows: dict) -> pd.DataFrame:
    path = tmp_path / "grid.csv"
    pd.DataFrame([{"name": n, "model": n.split("-")[0], "valid_bpb": b, "train_seconds": 1.0,
                   "cache_file": f"{n}-old.json"} for n, b in rows.items()]).to_csv(path, index=False)
    return reuse.committed([str(path)])


def test_rows_the_code_does_not_reproduce_are_judged_beyond_the_tolerance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = committed(tmp_path, {"gru-a": 2.5, "rnn-a": 2.75})
    gru, rnn = ("gru", str(tmp_path / "grid.csv")), ("rnn", str(tmp_path / "grid.csv"))

    def check(bpbs: dict, tolerance: float = 0.0) -> dict:
        for old in reuse.ROWS.glob("*.json") if reuse.ROWS.exists() else []:
            old.unlink()
        jobs = {name: Job(bpb) for name, bpb in bpbs.items()}
        return reuse.check(jobs, points_of(jobs), rows, list(jobs), tolerance)

    assert check({"gru-a": 2.5, "rnn-a": 2.75}) == {gru: 0.0, rnn: 0.0}
    assert check({"gru-a": 2.5, "rnn-a": 2.7500000000000004}) == {gru: 0.0, rnn: math.inf}
    held = check({"gru-a": 2.50001, "rnn-a": 2.76}, tolerance=1e-4)
    assert held[gru] == pytest.approx(1e-5) and held[rnn] == math.inf
    assert check({"gru-a": float("nan"), "rnn-a": 2.75}, 1.0) == {gru: math.inf, rnn: 0.0}
    assert json.loads((reuse.ROWS / "rnn-a-today.json").read_text())["valid_bpb"] == 2.75  # kept under today's key


def test_carried_rows_land_under_todays_keys_marked_and_never_over_a_row_trained_since(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = committed(tmp_path, {"gru-a": 2.5, "gru-b": 2.4})
    trained = reuse.ROWS / "gru-b-k2.json"
    trained.parent.mkdir(parents=True)
    trained.write_text(json.dumps({"name": "gru-b", "valid_bpb": 2.4, "trained": "here"}))
    jobs = {"gru-a": Job(2.5), "gru-b": Job(2.4), "gru-new": Job(2.3)}
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
    jobs = {"gru-a": Job(9.9, trained, "k1"), "gru-b": Job(2.4, trained, "k2"), "gru-c": Job(2.3, trained, "k3")}
    assert reuse.own_rows({"gru-a": "k9", "gru-b": "k2"}, rows) == []  # changed code: every row is checked
    line = reuse.reuse(jobs, points_of(jobs), rows, None, 0.0)
    assert trained == ["gru-b"]  # the cheapest row of another key: the own row is never retrained
    assert line.startswith("1 rows made under today's keys carried as they are; reproduced: gru in ")
    assert line.endswith("; 1 rows carried into .cache/lmpipe/scaling/runs; 0 points of the grid have no committed row")
    own = json.loads((reuse.ROWS / "gru-a-k1.json").read_text())
    assert own["valid_bpb"] == 2.5 and own["same_key"] is True and "carried_within" not in own
    assert json.loads((reuse.ROWS / "gru-c-k3.json").read_text())["carried_within"] == 0.0
    check_row = json.loads((reuse.ROWS / "gru-b-k2.json").read_text())  # the check, kept as a row of today's key
    assert check_row["valid_bpb"] == 2.4 and "carried_from" not in check_row
    assert reuse.reuse(jobs, points_of(jobs), rows, ["gru-a"], 0.0).startswith("0 rows made")  # kept, and named
    assert trained == ["gru-b"]  # rows of its own key are not retrained either


def test_a_committed_rerun_under_todays_key_checks_the_csv_of_the_row_it_replaced(tmp_path, monkeypatch, capsys):
    """A row of today's key in a later CSV that replaced a row of another key is that earlier CSV's check, made
    already: its model's rows there are carried with no training, or (beyond the tolerance) left out."""
    monkeypatch.chdir(tmp_path)
    old, new = tmp_path / "grid_a.csv", tmp_path / "grid_b.csv"
    pd.DataFrame([{"name": n, "model": n.split("-")[0], "valid_bpb": b, "train_seconds": 1.0, "cache_file": f"{n}-old.json"}
                  for n, b in [("gru-a", 2.5), ("gru-b", 2.4), ("rnn-a", 2.6), ("rnn-b", 2.7), ("lstm-a", 2.2)]]
                 ).to_csv(old, index=False)
    pd.DataFrame([{"name": n, "model": n.split("-")[0], "valid_bpb": b, "train_seconds": 1.0, "cache_file": f"{n}-{k}.json"}
                  for n, b, k in [("gru-a", 2.5, "ka"), ("rnn-a", 2.6000001, "kr")]]).to_csv(new, index=False)
    csvs = [str(old), str(new)]
    rows, trained = reuse.committed(csvs), []
    keys = {"gru-a": "ka", "gru-b": "kb", "rnn-a": "kr", "rnn-b": "kc", "lstm-a": "kl"}
    jobs = {name: Job(rows.loc[name, "valid_bpb"], trained, key) for name, key in keys.items()}
    keys["gru-new"], jobs["gru-new"] = "kn", Job(2.0, trained, "kn")  # a point no CSV holds
    planned = reuse.dry_run(keys, rows, None, 0.0, reuse.replaced(csvs))
    assert planned == ("1 check rows to train (1 s of training as committed); 2 rows made under today's keys and 2 "
                       "models' CSVs checked by committed reruns need none; 1 points of the grid have no committed row")
    assert f"lstm-a: {old}, 1 s" in capsys.readouterr().out
    assert trained == [] and not reuse.ROWS.exists()  # a dry run trains and writes nothing
    line = reuse.reuse(jobs, points_of(jobs), rows, None, 0.0, earlier=reuse.replaced(csvs))
    assert trained == ["lstm-a"]  # only the model with no rerun of today's key is checked by training
    assert line.endswith("; 1 points of the grid have no committed row")
    assert f"reproduced: gru in {old} (within 0.0e+00 bpb), lstm in {old} (within 0.0e+00 bpb);" in line
    assert f"rnn in {old}: the code as it is does not reproduce these rows within 0 bpb" in capsys.readouterr().out
    assert json.loads((reuse.ROWS / "gru-b-kb.json").read_text())["carried_from"] == "gru-b-old.json"
    assert not (reuse.ROWS / "rnn-b-kc.json").exists()  # lmpipe scaling retrains it
    held = reuse.checked_before(rows, reuse.replaced(csvs), ["gru-a", "rnn-a"], tolerance=1e-6)
    assert held[("gru", str(old))] == 0.0 and held[("rnn", str(old))] == pytest.approx(1e-7)


@pytest.mark.parametrize("given", ["0", "-1", "two"])
def test_workers_below_one_are_refused_instead_of_running_one_after_another(given):
    with pytest.raises(reuse.argparse.ArgumentTypeError, match="a whole number of at least 1"):
        reuse.at_least_one(given)
    assert reuse.at_least_one("2") == 2


def test_a_later_csv_replaces_a_row_by_the_date_in_its_name_not_its_place_in_the_alphabet(tmp_path):
    """grid_seeds_2026-12-01.csv sorts after grid_2026-12-07.csv, yet a rerun committed in the later one replaces it."""
    seeds, rerun = tmp_path / "grid_seeds_2026-12-01.csv", tmp_path / "grid_2026-12-07b.csv"
    for path, bpb, key in ((seeds, 2.5, "old"), (rerun, 2.5000001, "today")):
        pd.DataFrame([{"name": "gru-a-seed1", "model": "gru", "valid_bpb": bpb, "train_seconds": 1.0,
                       "cache_file": f"gru-a-seed1-{key}.json"}]).to_csv(path, index=False)
    csvs = sorted([str(seeds), str(rerun)])  # as the shell's glob gives them
    assert reuse.committed(csvs).loc["gru-a-seed1", "source"] == str(rerun)
    assert list(reuse.replaced(csvs)["source"]) == [str(seeds)]


def test_missing_tokens_are_one_line_naming_the_file_and_the_stage_to_run(monkeypatch):
    """Run before the tokenize stage: one line that says which file is missing and what makes it, no traceback."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(reuse.sys, "argv", ["reuse_grid_rows.py", "--dry-run"])
    real = reuse.load_tokens
    monkeypatch.setattr(reuse, "load_tokens", lambda: real(ROOT / "no-such-folder"))
    with pytest.raises(SystemExit) as ended:
        reuse.main()
    said = str(ended.value.code)
    assert said.startswith("error: ") and "counts.json: missing" in said and "dvc repro tokenize" in said, said
    assert "\n" not in said
