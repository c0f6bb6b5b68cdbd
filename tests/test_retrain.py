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


def test_what_a_killed_retrain_left_is_removed_and_named(tmp_path, monkeypatch):
    from flows.retrain import remove_leftovers

    monkeypatch.chdir(tmp_path)
    copy = tmp_path / ".dvc/tmp/exps/standalone/tmpk1ll3d"
    (copy / "models/gru").mkdir(parents=True)
    (copy / "models/gru/model.pt").write_bytes(b"x" * 1000)
    (tmp_path / ".dvc/tmp/exps/run").mkdir(parents=True)
    (tmp_path / ".dvc/tmp/exps/run/lmpipe-retrain.run").write_text("{}")
    (tmp_path / ".dvc/tmp/exps/cache").mkdir()  # DVC's own, not a run's: stays
    assert [p.as_posix() for p in remove_leftovers()] == [
        ".dvc/tmp/exps/run/lmpipe-retrain.run", ".dvc/tmp/exps/standalone/tmpk1ll3d"]
    assert not copy.exists() and (tmp_path / ".dvc/tmp/exps/cache").is_dir()
    assert remove_leftovers() == []
