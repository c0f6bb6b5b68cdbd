"""check-params says what a stage would fail on after DVC had removed its outputs, before `dvc repro` starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from lmpipe.config import Params
from lmpipe.preflight import input_problems, output_problems
from tests.helpers import ROOT, project_params


def local(tmp_path, **files) -> Params:
    return Params.model_validate(project_params(corpus={"source": "local", "files": {
        split: str(tmp_path / files.get(split, f"{split}.txt")) for split in ("train", "valid", "test")}}))


def test_a_local_corpus_file_that_is_missing_is_named_with_its_field(tmp_path):
    for split in ("train", "valid"):
        (tmp_path / f"{split}.txt").write_text("text\n")
    assert input_problems(local(tmp_path)) == [
        f"params.yaml: corpus.files.test: {tmp_path / 'test.txt'}: no such file or directory (name a readable file)"]
    (tmp_path / "test.txt").write_text("text\n")
    assert input_problems(local(tmp_path)) == []
    (tmp_path / "valid.txt").unlink()
    (tmp_path / "valid.txt").mkdir()  # a folder where a file should be
    assert input_problems(local(tmp_path))[0].startswith("params.yaml: corpus.files.valid: ")


def test_check_params_refuses_a_missing_local_file_in_one_line_before_dvc_runs(tmp_path):
    tree = yaml.safe_load((ROOT / "params.yaml").read_text())
    tree["corpus"] = {**tree["corpus"], "source": "local",
                      "files": {s: str(tmp_path / f"{s}.txt") for s in ("train", "valid", "test")}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tree))
    done = subprocess.run([sys.executable, "-m", "lmpipe_cli", "check-params"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "corpus.files.train" in done.stderr and "no such file or directory" in done.stderr


def test_an_output_folder_that_cannot_be_written_is_named(tmp_path):
    params = Params.model_validate(project_params())
    (tmp_path / "metrics").mkdir()
    (tmp_path / "models").write_text("a file where the models go")
    assert output_problems(params, tmp_path) == [
        f"{tmp_path / 'models'}: is a file where the study writes a folder (move it away)"]
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder: the permission half needs another user")
    (tmp_path / "models").unlink()
    (tmp_path / "models").mkdir(mode=0o555)
    assert "cannot be written" in output_problems(params, tmp_path)[0]
