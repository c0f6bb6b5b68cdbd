"""`lmpipe diff`: each model's change in test bpb between two versions of the study, judged against seed noise."""

from __future__ import annotations

import json
import subprocess

import pytest

from lmpipe.diff import diff
from lmpipe.errors import LmpipeError
from tests.helpers import table_rows


def commit(root, rows: dict, message: str) -> str:
    folder = root / "metrics/models"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    for model, row in rows.items():
        (folder / f"{model}.json").write_text(json.dumps(row))
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def row(bpb, sd=0.002, tflop=30.0):
    return {"test_bpb": bpb, "bpb_sd": sd, "tflop": tflop}


@pytest.fixture
def study(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    first = commit(tmp_path, {"gru": row(1.959), "lstm": row(1.946), "ngram": {"test_bpb": 2.048}}, "study")
    return tmp_path, first


def test_a_change_beyond_twice_the_seed_sd_is_real_and_one_within_is_noise(study):
    root, first = study
    commit(root, {"gru": row(1.950), "lstm": row(1.945, sd=0.001), "ngram": {"test_bpb": 2.048}}, "lr changed")
    out = diff(first, "HEAD", root).splitlines()
    assert out[1].split()[:7] == ["gru", "1.9590", "1.9500", "-0.0090", "0.0040", "real:", "better"]
    assert out[2].split()[:7] == ["lstm", "1.9460", "1.9450", "-0.0010", "0.0040", "within", "noise"]
    assert out[3].split()[:6] == ["ngram", "2.0480", "2.0480", "+0.0000", "0.0000", "unchanged"]
    assert not any(line.startswith("Warning") for line in out)


def test_the_workspace_against_head_by_default_and_markdown_for_a_pull_request(study, monkeypatch):
    root, _ = study
    (root / "metrics/models/gru.json").write_text(json.dumps(row(1.970, tflop=40.0)))
    (root / "metrics/models/nplm.json").write_text(json.dumps(row(2.065)))
    monkeypatch.chdir(root)
    out = diff(markdown=True).splitlines()
    rows = table_rows(out)
    assert rows[0][:4] == ["model", "test bpb HEAD", "test bpb workspace", "change"]
    assert rows[1] == ["gru", "1.9590", "1.9700", "+0.0110", "0.0040", "real: worse", "30.0 -> 40.0"]
    assert ["nplm", "-", "2.0650", "-", "0.0040", "only in B", "- -> 30.0"] in rows
    assert out[-1].startswith("Warning: not compute-matched (gru)")


def test_a_dvc_experiment_by_its_name_and_a_bad_side_in_one_line(study):
    root, first = study
    exp = commit(root, {"gru": row(1.990), "lstm": row(1.946), "ngram": {"test_bpb": 2.048}}, "exp")
    subprocess.run(["git", "-C", str(root), "update-ref", f"refs/exps/{first[:2]}/{first[2:]}/eager-fish", exp],
                   check=True)
    subprocess.run(["git", "-C", str(root), "reset", "-q", "--hard", first], check=True)
    assert diff("HEAD", "eager-fish", root).splitlines()[1].split()[:7] == [
        "gru", "1.9590", "1.9900", "+0.0310", "0.0040", "real:", "worse"]
    with pytest.raises(LmpipeError, match="^no-such: neither a git revision nor a DVC experiment"):
        diff("no-such", "HEAD", root)
