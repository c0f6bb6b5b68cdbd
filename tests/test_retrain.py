"""What a retrain refuses, and how it says so."""

from __future__ import annotations

from flows.retrain import refusal, reproduction_outputs
from tests.conftest import ROOT


def test_changes_that_a_reproduction_wrote_get_the_command_that_fixes_them(monkeypatch):
    monkeypatch.chdir(ROOT)
    written = reproduction_outputs()
    assert {"dvc.lock", "metrics/weat.json", "metrics/eval.json", "reports/study.md"} <= written
    assert not {"params.yaml", "lmpipe/muon.py", "models/gru"} & written  # code, settings, DVC-cached outputs
    line = refusal(["dvc.lock", "metrics/weat.json"])
    assert "all of them what `dvc repro` writes" in line
    assert "`git commit -m 'Study reproduced here' -- dvc.lock metrics/weat.json`" in line
    assert "`git checkout -- dvc.lock metrics/weat.json`" in line and "\n" not in line
    other = refusal(["dvc.lock", "params.yaml"])
    assert other == ("uncommitted changes to dvc.lock, params.yaml: a retrain commits its outcome on top of HEAD; "
                     "commit or stash them first")
