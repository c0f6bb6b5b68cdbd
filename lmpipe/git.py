"""The project's one way to ask git: a command's output, and what a failure means to the caller."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lmpipe.errors import LmpipeError


def git(*args: str, cwd: str | Path | None = None) -> str:
    """`git <args>`'s output; a failure is an LmpipeError of one line (git's last line of complaint)."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise LmpipeError(f"git {' '.join(args)} failed: " + (done.stderr.strip().splitlines() or ["no output"])[-1])
    return done.stdout


def git_or_empty(*args: str, cwd: str | Path | None = None) -> str:
    """`git <args>`'s output stripped, or '' where git fails or is absent (code outside a git checkout)."""
    try:
        return git(*args, cwd=cwd).strip()
    except (LmpipeError, OSError):
        return ""
