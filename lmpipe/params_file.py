"""params.yaml edited as a person edits it: only the changed values are rewritten, in place, so its layout, its
comments and its inline maps stay as they are (ruamel.yaml finds where each value is written; a YAML dump, DVC's
included, would rewrap the whole file and write `null` as nothing)."""

from __future__ import annotations

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from lmpipe.errors import ConfigError
from lmpipe.overrides import apply_overrides, assignments


def edit_params(text: str, overrides: list[str]) -> str:
    """`text` (a params.yaml) with `dotted.key=yaml value` overrides applied as `dvc exp run -S` applies them, each
    value rewritten where it stands. A change that cannot be made in place (a new key, a block-style section) is a
    ConfigError; the result always loads to the same settings as the overrides applied to the loaded file."""
    edited = text
    for key, value in assignments(overrides).items():
        for path, leaf in _leaves(yaml.safe_load(edited), key.split("."), value):
            edited = _replace(edited, path, leaf)
    expected = apply_overrides(yaml.safe_load(text), overrides)
    if yaml.safe_load(edited) != expected:
        raise ConfigError(f"params.yaml: {', '.join(overrides)} could not be written in place")
    return edited


def _leaves(tree, path: list[str], value):
    """(path, value) pairs to write: a dict value merges into an existing map key by key, as `-S` merges it."""
    node = tree
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(value, dict) and isinstance(node, dict) and value:
        for key, inner in value.items():
            yield from _leaves(tree, [*path, str(key)], inner)
    else:
        yield path, value


def _flow(value) -> str:
    """A value as one line of YAML, inline maps and lists in flow style ({tokens: 20000})."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _replace(text: str, path: list[str], value) -> str:
    loader = YAML()
    document = loader.load(text)
    parent = document
    for part in path[:-1]:
        parent = parent.get(part) if isinstance(parent, CommentedMap) else None
    last = path[-1]
    if not isinstance(parent, CommentedMap) or last not in parent:
        raise ConfigError(f"params.yaml: {'.'.join(path)} is not in the file; add it by hand")
    current = parent[last]
    if isinstance(current, (CommentedMap, CommentedSeq)) and not current.fa.flow_style():
        raise ConfigError(f"params.yaml: {'.'.join(path)} is a block; edit it by hand")
    line, column = parent.lc.value(last)
    lines = text.splitlines(keepends=True)
    row = lines[line]
    end = _token_end(row, column, inline=bool(parent.fa.flow_style()))
    if end is None:  # a flow map or list that runs over several lines
        raise ConfigError(f"params.yaml: {'.'.join(path)} spans lines; edit it by hand")
    lines[line] = row[:column] + _flow(value) + row[end:]
    return "".join(lines)


def _token_end(row: str, start: int, inline: bool) -> int | None:
    """Where the value that starts at row[start] ends: its closing bracket, or the end of a plain or quoted scalar
    (before a comment, the line's end, or, inside a flow map, the next `,` or `}`)."""
    opening = row[start]
    if opening in "{[":
        depth = 0
        for i in range(start, len(row)):
            depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(row[i], 0)
            if depth == 0:
                return i + 1
        return None
    if opening in "'\"":
        close = row.find(opening, start + 1)
        return None if close < 0 else close + 1
    stops = [len(row.rstrip("\r\n"))]
    comment = row.find(" #", start)
    if comment >= 0:
        stops.append(comment)
    if inline:
        stops += [i for i in (row.find(",", start), row.find("}", start), row.find("]", start)) if i >= 0]
    end = min(stops)
    while end > start and row[end - 1] == " ":
        end -= 1
    return end

