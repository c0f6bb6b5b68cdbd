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
