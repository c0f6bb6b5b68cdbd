"""Dotted overrides in DVC's own grammar: `dvc exp run -S` parses them with Hydra's override parser and applies them
to params.yaml in struct mode, so lmpipe's checks, plans and profiles read an override exactly as DVC will apply it
(`key=value` changes a setting the file holds, `+key=value` adds one, `++key=value` either; a dict value merges).
The runs outside the stages (python -m lmpipe.train, seeds, sweeps, the grid, benchmarks) take theirs as a dict of
dotted keys (`with_overrides`), merged the same way (OmegaConf).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pydantic import ValidationError

from lmpipe.config import parse_params
from lmpipe.errors import ConfigError, describe_error
from lmpipe.model_params import ModelParams, optimiser_type


def _parsed(item: str, where: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides([item])[0]
    except OverrideParseException:
        raise ConfigError(f"{where} {item!r}: expected KEY=VALUE in DVC's -S syntax (e.g. optim.lr=0.003, "
                          "'budget={tokens: 1000}'; quote text with spaces or symbols: key='a b')") from None


def assignments(items: list[str], where: str = "-S") -> dict[str, Any]:
    """`[+[+]]dotted.key=value` strings as {dotted key: value}, the values typed as DVC types them."""
    out = {}
    for item in items:
        parsed = _parsed(item, where)
        if parsed.is_delete() or parsed.value_type is None or parsed.is_sweep_override():
            raise ConfigError(f"{where} {item!r}: expected KEY=VALUE (a deletion or a sweep is not a setting)")
        out[parsed.key_or_group] = parsed.value()
    return out


def apply_overrides(tree: dict, items: list[str], where: str = "-S") -> dict:
    """`tree` (a params file as loaded) with the overrides applied as `dvc exp run -S` applies them
    (dvc.utils.hydra.apply_overrides, on data instead of a file): a new dict; a ConfigError names the first override
    DVC would refuse, and how to write it."""
    from dvc.utils.collections import to_omegaconf
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    config = OmegaConf.create(to_omegaconf(tree), flags={"allow_objects": True})
    OmegaConf.set_struct(config, True)
    for item in items:
        parsed = _parsed(item, where)
        try:
            ConfigLoaderImpl._apply_overrides_to_config([parsed], config)
        except ConfigCompositionException as exc:
            key, reason = parsed.key_or_group, str(exc).splitlines()[0]
            if reason.startswith("Could not override"):
                reason = (f"the params have no {key}" + (f" (did you mean {close}?)" if (close := nearest(tree, key))
                          else f" (DVC's -S changes only the settings the file holds; add it with '+{item}')"))
            elif "already at" in reason:
                reason = f"{key} is already set (change it with '{item.lstrip('+')}')"
            raise ConfigError(f"{where} {item!r}: {reason}") from None
    return OmegaConf.to_object(config)


def nearest(tree: dict, key: str) -> str | None:
    """The dotted key of `tree` that `key` most likely misspells (its last part, among its parent's keys), or None."""
    import difflib

    *parents, last = key.split(".")
    for part in parents:
        tree = tree.get(part) if isinstance(tree, dict) else None
    close = (difflib.get_close_matches(last, [k for k in tree if isinstance(k, str)], n=1, cutoff=0.6)
             if isinstance(tree, dict) else [])
    return ".".join([*parents, close[0]]) if close else None


def check_overrides(path: str | Path, items: list[str] | None) -> None:
    """params.yaml with `-S` overrides applied, checked as DVC would run them: a typo fails here, before DVC runs
    (and deletes the outputs of) any stage."""
    if items:
        merged = apply_overrides(yaml.safe_load(Path(path).read_text(encoding="utf-8")), items)
        parse_params(merged, f"{path} with {' '.join(items)}")


def value_text(value) -> str:
    """A value as DVC's -S reads it back: dicts and lists inline, text quoted where the grammar needs it."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        try:
            if _parsed(f"k={value}", "").value() == value:
                return value
        except ConfigError:
            pass
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return repr(value)


WHOLE = ("arch", "optim", "overrides")  # a profile's settings that are one value each: they merge as a whole


def profile_overrides(tree: dict, prefix: str = "") -> list[str]:
    """A profile's leaves as `++key=value` overrides for `dvc exp run -S` (set whether or not params.yaml holds the
    key; `arch`, `optim` and `overrides` stay one value each)."""
    out = []
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key not in WHOLE:
            out += profile_overrides(value, f"{name}.")
        else:
            out.append(f"++{name}={value_text(value)}")
    return out


def profile_flags(file: str | Path, write: str | Path | None = None, params_file: str = "params.yaml") -> str:
    """`lmpipe profile`: a params profile as `-S` flags for dvc exp run, checked against params.yaml merged with it
    first (before anyone spends GPU hours on a typo); `write`: that merged file too (for python -m lmpipe.train
    --params)."""
    import shlex

    overrides = profile_overrides(yaml.safe_load(Path(file).read_text()))
    merged = apply_overrides(yaml.safe_load(Path(params_file).read_text()), overrides)
    parse_params(merged, f"{params_file} + {file}")
    if write:
        from lmpipe.io import write_text

        write_text(write, yaml.safe_dump(merged, sort_keys=False))
    return " ".join(f"-S {shlex.quote(o)}" for o in overrides)


def nested(overrides: dict, tree: dict | None = None) -> dict:
    """Dotted settings written into a (copy of a) nested tree, a dict value merging into the one there (OmegaConf):
    {"optim.lr": 1} -> {"optim": {"lr": 1}}."""
    from omegaconf import OmegaConf

    config = OmegaConf.create(tree or {})
    for key, value in overrides.items():
        OmegaConf.update(config, key, value, merge=True)
    return OmegaConf.to_container(config)


def with_overrides(base: ModelParams, overrides: dict, budget: dict | None = None) -> ModelParams:
    """`base` with dotted overrides applied, validated as params.yaml would be: the one override function of every
    run (the stages' through lmpipe.train.job.configure_run, python -m lmpipe.train, seeds, sweeps, the scaling grid,
    benchmarks). A budget
    ({tokens: N} or {flops: F}) sets the run's length; epochs given without one replace the base's budget."""
    overrides = dict(overrides)
    budget = overrides.pop("budget", budget)
    tree = nested(overrides, base.model_dump(mode="json"))
    if budget is not None:
        tree["budget"] = budget
        tree.pop("epochs", None), tree.pop("patience", None)
    elif "epochs" in overrides:
        tree.pop("budget", None)
    if "optim" in tree:  # a run that changes the optimiser or schedule drops what only the old one used
        optim, given = tree["optim"], {key.removeprefix("optim.") for key in overrides if key.startswith("optim.")}
        idle = set(optim) - set(optimiser_type(optim).model_fields)
        if optim.get("schedule") != "wsd":
            idle.add("decay_fraction")
        tree["optim"] = {k: v for k, v in optim.items() if k not in idle - given}
    try:
        return ModelParams.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(f"settings {overrides}: {describe_error(exc.errors()[0])}") from None
