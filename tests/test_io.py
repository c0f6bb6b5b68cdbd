"""Atomic outputs: a failed write leaves nothing half-written, and a full disk names the path."""

from __future__ import annotations

import errno
import os

import pytest

from lmpipe.errors import DiskFull
from lmpipe.io import atomic_path, write_text


def test_a_full_disk_names_the_path_and_leaves_no_partial_output(tmp_path, monkeypatch):
    real = os.replace

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(DiskFull) as info:
        write_text(tmp_path / "metrics/train/gru.json", "{}")
    monkeypatch.setattr(os, "replace", real)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'metrics/train/gru.json'}: no space left on device (")
    assert "\n" not in message
    assert list((tmp_path / "metrics/train").iterdir()) == []  # the temporary file is gone too


def test_other_errors_pass_through_and_leave_no_partial_output(tmp_path):
    with pytest.raises(ValueError):
        with atomic_path(tmp_path / "out") as tmp:
            tmp.mkdir()
            (tmp / "half").write_text("x")
            raise ValueError("boom")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_anywhere_in_a_stage_is_one_line_naming_the_file():
    from flows._stage import full_disk

    assert full_disk(OSError(errno.ENOSPC, "No space left on device", ".cache/lmpipe/ckpt/gru-0/last.tmp")) == (
        ".cache/lmpipe/ckpt/gru-0/last.tmp: no space left on device; free some space and run again (a training "
        "stage resumes from its checkpoint)")
    torch_says = RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                              "data/0: file write failed")
    assert full_disk(torch_says).startswith("a checkpoint or model file (torch.save): no space left on device")
    assert full_disk(OSError(errno.EACCES, "Permission denied", "x")) is None
    assert full_disk(ValueError("x")) is None


@pytest.mark.parametrize("where", [".", "..", "sub/.."])
def test_the_working_directory_and_the_folders_above_it_are_never_replaced(tmp_path, monkeypatch, where):
    from lmpipe.errors import LmpipeError

    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "mine.txt").write_text("the user's")
    monkeypatch.chdir(project)
    with pytest.raises(LmpipeError, match="is the working directory or a folder above it"):
        with atomic_path(where) as tmp:
            tmp.mkdir()
    assert (project / "mine.txt").read_text() == "the user's" and (project / "sub").is_dir()


@pytest.mark.parametrize("out", [".", "theirs", "a-file"])
def test_train_out_refuses_a_folder_of_the_users_before_any_training(tmp_path, out):
    import subprocess
    import sys

    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    (tmp_path / "a-file").write_text("mine")
    done = subprocess.run([sys.executable, "-m", "lmpipe.train", "--model", "gru", "--out", out], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # no params.yaml here: it fails first
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"error: python -m lmpipe.train --out {out}: ")
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "mine" and (tmp_path / "a-file").read_text() == "mine"


def test_out_accepts_a_new_or_empty_folder_or_lmpipes_own_result(tmp_path):
    from lmpipe.io import OUT_MARK, check_out_dir

    (tmp_path / "empty").mkdir()
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / OUT_MARK).write_text("{}")
    (tmp_path / "earlier" / "model.pt").write_text("x")
    for ok in ("new", "empty", "earlier"):
        check_out_dir(tmp_path / ok, "python -m lmpipe.train")


def test_out_replaces_only_the_files_lmpipe_wrote_there(tmp_path):
    """--out writes its files into the user's folder one by one: a file the user put there, before or during the
    run, survives; a file an earlier --out wrote and this one did not is removed; the mark lists what is lmpipe's."""
    import json

    from lmpipe.io import OUT_MARK, out_dir

    dest = tmp_path / "result"
    with out_dir(dest, {"model": "gru"}) as staged:
        (staged / "model.pt").write_text("1")
        (staged / "old-only.csv").write_text("1")
    assert json.loads((dest / OUT_MARK).read_text()) == {"model": "gru", "files": ["model.pt", "old-only.csv"]}
    (dest / "notes.txt").write_text("mine")
    with out_dir(dest, {"model": "gru"}) as staged:
        (staged / "model.pt").write_text("2")
        (dest / "during.txt").write_text("mine too")  # written by the user while the run trains
    assert sorted(p.name for p in dest.iterdir()) == ["during.txt", OUT_MARK, "model.pt", "notes.txt"]
    assert (dest / "model.pt").read_text() == "2" and (dest / "notes.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left
    try:
        with out_dir(dest, {"model": "gru"}) as staged:
            (staged / "model.pt").write_text("3")
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert (dest / "model.pt").read_text() == "2"  # a failed run changes nothing
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
