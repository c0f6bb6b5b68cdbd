"""What the scaling grid was made from (scaling/made_with.json): the grid writes it beside its runs; the study's
report reads it to say whether the grid is still the study's (same data and settings) before comparing with it.
Kept out of lmpipe.scaling so that the grid's fits depend on the grid alone, not on every study setting."""

from __future__ import annotations

import json
from pathlib import Path

from lmpipe import paths
from lmpipe.splits import load_tokens


def made_with(params, data) -> dict:
    """What the grid's runs were trained from, besides the code: the token data, the `train` section, the settings
    of each family it starts from and its own `scaling` section (the fits' settings aside)."""
    return {"data": data.fingerprint, "train": params.section("train"),
            "models": {m: params.models[m].model_dump(mode="json", exclude_none=True) for m in params.scaling.models},
            "scaling": grid_settings(params)}


def grid_settings(params) -> dict:
    """The `scaling` section as it decides the grid's runs: the fits' settings aside, and `around_best` only where it
    lists a budget (an empty one adds no run, so a grid made before it existed is still the grid)."""
    section = params.section("scaling")
    return {k: v for k, v in section.items() if k != "fit" and (k != "around_best" or v)}


def changed_since(recorded: dict | None, now: dict) -> list[str]:
    """What differs between the grid's record and now, as the user would name it: 'data/tokens', 'train',
    'models.lstm', 'scaling'; everything when there is no record."""
    if not recorded:
        return [f"the grid's record ({paths.GRID_MADE_WITH} is missing)"]
    names = {"data": paths.TOKENS, "train": "train", "scaling": "scaling"}
    changed = [names[k] for k in ("data", "train", "scaling") if recorded.get(k) != now[k]]
    families = sorted(set(recorded.get("models", {})) | set(now["models"]))
    return changed + [f"models.{m}" for m in families if recorded.get("models", {}).get(m) != now["models"].get(m)]


def stale(params) -> list[str]:
    """What the committed grid was made from that the study (params, data/tokens) no longer is; nothing when there
    is no grid to compare with."""
    if not Path(paths.SCALING_METRICS).exists():
        return []
    made = Path(paths.GRID_MADE_WITH)
    return changed_since(json.loads(made.read_text()) if made.exists() else None, made_with(params, load_tokens()))
