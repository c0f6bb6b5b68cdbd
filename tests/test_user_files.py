"""A user's files stay the user's: a note kept in a folder that a stage reads whole (metrics/eval, metrics/train,
plots/train, data/logprobs, models) is no input of it, so adding or editing one re-runs nothing (.dvcignore)."""

import shutil
import subprocess

import yaml

from tests.helpers import ROOT


def dvc(*args, cwd):
    return subprocess.run(["dvc", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_a_note_beside_a_stages_files_is_not_an_input_and_a_stages_own_file_is(tmp_path):
    shutil.copy(ROOT / ".dvcignore", tmp_path / ".dvcignore")
    dvc("init", "--no-scm", "-q", cwd=tmp_path)
    stages = {"score": {"cmd": "mkdir -p metrics/eval models/gru && echo 1 > metrics/eval/gru.json && echo w > "
                               "models/gru/model.pt",
                        "outs": [{"metrics/eval/gru.json": {"cache": False}}, "models/gru"]},
              "evaluate": {"cmd": "cat metrics/eval/*.json > eval.txt", "deps": ["metrics/eval"], "outs": ["eval.txt"]},
              "audit": {"cmd": "ls models > audit.txt", "deps": ["models"], "outs": ["audit.txt"]}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    dvc("repro", "-q", cwd=tmp_path)
    assert dvc("status", "--json", cwd=tmp_path).strip() == "{}"
    for note in ("metrics/eval/NOTES.txt", "models/README.md"):
        (tmp_path / note).write_text("the user's own words\n")
    assert dvc("status", "--json", cwd=tmp_path).strip() == "{}"
    (tmp_path / "metrics/eval/NOTES.txt").write_text("edited\n")
    assert dvc("status", "--json", cwd=tmp_path).strip() == "{}"
    (tmp_path / "metrics/eval/gru.json").write_text("2\n")  # a stage's own file still is an input
    assert {"score", "evaluate"} <= set(yaml.safe_load(dvc("status", "--json", cwd=tmp_path)))
