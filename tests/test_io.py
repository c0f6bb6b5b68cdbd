"""Atomic outputs: a failed write leaves nothing half-written, and a full disk names the path; the one CSV writer."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from lmpipe.errors import DiskFull
from lmpipe.io import atomic_path, csv_records, csv_text, write_text
from tests.helpers import ROOT


def test_a_full_disk_names_the_path_and_leaves_no_partial_output(tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(DiskFull) as info:
        write_text(tmp_path / "metrics/train/gru.json", "{}")
    message = str(info.value)
    assert message.startswith(f"no space left on {tmp_path / 'metrics/train/gru.json'}: needs about 2 bytes, ")
    assert message.endswith(" free (free space, then rerun: it resumes)") and "\n" not in message
    assert list((tmp_path / "metrics/train").iterdir()) == []  # the temporary file is gone too


def test_a_write_that_runs_out_of_space_part_way_leaves_no_temp_file_and_a_rerun_writes_it(tmp_path, monkeypatch):
    real = Path.write_bytes

    def half_then_full(self, data):
        real(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    dest = tmp_path / "metrics/eval.json"
    dest.parent.mkdir()
    dest.write_text("the previous run's")
    monkeypatch.setattr(Path, "write_bytes", half_then_full)
    with pytest.raises(DiskFull) as info:
        write_text(dest, "x" * 300_000)
    monkeypatch.setattr(Path, "write_bytes", real)
    assert str(info.value).startswith(f"no space left on {dest}: needs about 0.3 MB, ")  # the file, not its temp
    assert sorted(p.name for p in dest.parent.iterdir()) == ["eval.json"]
    assert dest.read_text() == "the previous run's"
    write_text(dest, "x" * 300_000)  # the rerun, with room
    assert dest.read_text() == "x" * 300_000 and sorted(p.name for p in dest.parent.iterdir()) == ["eval.json"]


def test_other_errors_pass_through_and_leave_no_partial_output(tmp_path):
    with pytest.raises(ValueError):
        with atomic_path(tmp_path / "out") as tmp:
            tmp.mkdir()
            (tmp / "half").write_text("x")
            raise ValueError("boom")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_anywhere_in_a_stage_is_one_line_naming_the_file(tmp_path):
    from flows._stage import full_disk

    said = full_disk(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "ckpt/gru-0/last.tmp")))
    assert said.startswith(f"no space left on {tmp_path / 'ckpt/gru-0/last.tmp'}: ") and said.endswith(
        " MB free (free space, then rerun: it resumes)"), said
    torch_says = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1600 vs 1494")
    assert full_disk(torch_says).startswith("no space left on a checkpoint or model file (torch.save)")
    assert full_disk(OSError(errno.EACCES, "Permission denied", "x")) is None
    assert full_disk(ValueError("x")) is None


def test_torchs_short_write_is_a_full_disk_only_where_the_disk_is_full(tmp_path, monkeypatch):
    """torch.save says "unexpected pos" or "file write failed" with no errno: the free space tells."""
    import shutil
    from collections import namedtuple

    from lmpipe.io import disk_full

    torch_says = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1600 vs 1494")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1494, 1494))
    assert str(disk_full(torch_says, tmp_path / "model.pt", need=6_300_000)) == (
        f"no space left on {tmp_path / 'model.pt'}: needs about 6.3 MB, 1 kB free (free space, then rerun: it resumes)")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 0, 10**11))
    assert disk_full(torch_says, tmp_path / "model.pt", need=6_300_000) is None  # room enough: not the disk


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


def test_a_file_of_the_users_named_as_lmpipes_stays_and_lmpipes_goes_beside_it(tmp_path, capsys):
    """A curve.csv the user wrote into the --out folder while the run trained is the user's: kept as it is, this
    run's curve beside it, said in one line; the mark lists lmpipe's files, so a later run never deletes the user's."""
    import json

    from lmpipe.io import OUT_MARK, out_dir

    dest = tmp_path / "result"
    with out_dir(dest, {"model": "gru"}) as staged:
        (staged / "model.pt").write_text("1")
        (staged / "curve.csv").write_text("lmpipe's")
        (dest / "curve.csv").write_text("the user's")  # written during the run
    assert (dest / "curve.csv").read_text() == "the user's" and (dest / "curve.lmpipe.csv").read_text() == "lmpipe's"
    said = capsys.readouterr().err.strip()
    assert said == (f"--out {dest}: curve.csv is not lmpipe's (it appeared during the run): kept as it is; this "
                    f"run's is {dest / 'curve.lmpipe.csv'}")
    assert json.loads((dest / OUT_MARK).read_text())["files"] == ["curve.lmpipe.csv", "model.pt"]
    with out_dir(dest, {"model": "gru"}) as staged:  # the next run: its own curve where it can, the user's kept
        (staged / "model.pt").write_text("2")
    assert (dest / "curve.csv").read_text() == "the user's" and not (dest / "curve.lmpipe.csv").exists()


def test_csv_text_writes_each_cell_as_python_does():
    rows = [{"model": 'a "b", c', "n": 7, "bpb": 0.1 + 0.2, "flag": True, "lr": 1e-20, "left": None},
            {"model": "x\ny", "n": None, "bpb": float("nan"), "flag": False, "lr": 3e13, "left": ""}]
    assert csv_text(rows) == ('model,n,bpb,flag,lr,left\r\n"a ""b"", c",7,0.30000000000000004,True,1e-20,\r\n'
                              '"x\ny",,nan,False,30000000000000.0,\r\n')
    assert csv_text(rows, columns=["n", "model"], newline="\n") == 'n,model\n7,"a ""b"", c"\n,"x\ny"\n'
    assert csv_text([], columns=["a", "b"]) == "a,b\r\n" and csv_text([]) == ""
    with pytest.raises(ValueError, match="not in the first row"):
        csv_text([{"a": 1}, {"a": 2, "b": 3}])


def _typed(cell: str):
    """A cell read back as the value a stage wrote: an int, a float or a bool where its text is that value's own."""
    for kind in (int, float):
        try:
            if repr(value := kind(cell)) == cell:
                return value
        except ValueError:
            pass
    return {"": None, "True": True, "False": False}.get(cell, cell)


def test_csv_text_rewrites_every_tracked_result_table_byte_for_byte():
    """The committed tables (written by the csv module before pandas) read back (csv_records) and written again are
    the same bytes: moving the writer to pandas changed no tracked output."""
    tracked = subprocess.run(["git", "ls-files", "plots/*.csv", "scaling/*.csv", "seeds/*.csv", "sweeps/**/*.csv"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    tables = [ROOT / p for p in tracked if not Path(p).name.startswith(("grid_", "prescan_"))]  # hand-made notes
    assert len(tables) >= 20
    for path in tables:
        text = path.read_bytes().decode()
        rows = [{k: _typed(v) for k, v in row.items()} for row in csv_records(path)]
        assert csv_text(rows, newline="\r\n" if "\r\n" in text else "\n") == text, path


def test_csv_records_reads_cells_as_text_and_a_missing_or_empty_file_as_no_rows(tmp_path):
    (tmp_path / "t.csv").write_text('a,b\r\n"x, ""y""",\r\nnan,0.30000000000000004\r\n')
    assert csv_records(tmp_path / "t.csv") == [{"a": 'x, "y"', "b": ""}, {"a": "nan", "b": "0.30000000000000004"}]
    (tmp_path / "empty.csv").write_text("")
    assert csv_records(tmp_path / "empty.csv") == [] and csv_records(tmp_path / "missing.csv") == []
