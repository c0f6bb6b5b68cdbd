"""`-S KEY=VALUE` (`--set-param`): the one way every command that takes settings takes them, as `dvc exp run -S`
does. The flag of `python -m lmpipe.train` and the flows run as scripts (`python -m flows.study`, `python -m
lmpipe_cli.retrain`) is defined here, and the refusal every one of them shares, `lmpipe plan` and `lmpipe retrain` too
(lmpipe_cli.main.TakesSettings): a setting given another way (a bare `key=value`, `--set`) is one line naming `-S`, not a
usage dump."""

from __future__ import annotations

import argparse

DEST = "overrides"  # where the settings land on the parsed arguments: a list, in the order given
_PROG = "_settings_prog"  # set on the arguments of a parser that takes -S: its name, for the one-line refusal


def refusal(prog: str, given: list[str] | None = None) -> str:
    """The one line for settings given another way than -S; `given`: what was typed, shown as -S would take it."""
    example = " e.g. " + " ".join(f"-S {item}" for item in given) if given else ""
    return f"{prog}: give settings as -S key=value (as dvc exp run -S){';' + example if example else ''}"


class _OtherSyntax(argparse.Action):
    """`--set key=value ...`: refused in one line naming -S."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.exit(2, refusal(parser.prog, [v for v in values or [] if "=" in v]) + "\n")


def add_set_param(parser: argparse.ArgumentParser, help: str) -> None:
    """Add `-S/--set-param KEY=VALUE` (repeatable) to `parser`, `help` saying what the settings do there; `--set`
    is refused in one line (it would otherwise pass as an abbreviation of --set-param, taking one value of many)."""
    parser.add_argument("-S", "--set-param", dest=DEST, action="append", default=[], metavar="KEY=VALUE", help=help)
    parser.add_argument("--set", nargs="*", action=_OtherSyntax, help=argparse.SUPPRESS)
    parser.set_defaults(**{_PROG: parser.prog})


def bare_settings(extras: list[str]) -> list[str]:
    """The arguments argparse did not take that read as a setting: `key=value`, `+key=value`."""
    return [item for item in extras if "=" in item and not item.startswith("-")]


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, except that a bare `key=value` given to a command that takes -S is one line naming
    -S (exit 2, as argparse's own usage errors)."""
    args, extras = parser.parse_known_args(argv)
    prog = getattr(args, _PROG, None)
    if extras and prog and bare_settings(extras):
        parser.exit(2, refusal(prog, bare_settings(extras)) + "\n")
    if extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    if prog:
        delattr(args, _PROG)
    return args
