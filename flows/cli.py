"""`lmpipe` command line, at the top of the house: it drives the flows (flows/) and the library (lmpipe/), which
never import it; the pipeline itself is `dvc repro`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from flows import server
from lmpipe import paths
from lmpipe import __version__
from lmpipe.decode_rules import STRATEGIES, DecodingParams, decoding_rule
from lmpipe.errors import ConfigError, LmpipeError
from lmpipe.set_param import add_set_param, parse_args

DESCRIPTION = """Tools around the lmpipe language-modelling study. The study itself is `dvc repro` (or `make study`);
these commands sample from its models, serve and retrain them, open its MLflow and Prefect views,
and run the experiments beside it (sweeps, the scaling grid)."""

RETRAIN_GATE = """Pass: the experiment is applied and committed (one commit; dvc push when a remote is set) and its
models become the champions. Fail (a model regressed beyond retrain.max_regression): HEAD, the
workspace and the champions stay as they were, the experiment stays for `dvc exp show`, and the
run fails naming the regressed models."""

RETRAIN_HELP = """Each retrain fetches the corpus source again and runs what a new corpus (or the settings given
with -S key=value, as dvc exp run -S takes them) changes as a DVC experiment in a temporary copy
(dvc exp run --temp), then compares each model's test word perplexity and bpb with its champion's
in the MLflow registry.
""" + RETRAIN_GATE

SCHEDULE_HELP = """Serve a Prefect deployment of the `retrain` flow on a cron or interval schedule, from this project
directory.
Each retrain fetches the corpus source again and runs what a new corpus changes as a DVC experiment
in a temporary copy (dvc exp run --temp), then compares each model's test word perplexity and bpb
with its champion's in the MLflow registry.
""" + RETRAIN_GATE + """
Schedules need a Prefect server: set PREFECT_API_URL (e.g. http://prefect.example:4200/api for a
shared server, or your Prefect Cloud workspace URL); without it `lmpipe server` is started on
127.0.0.1:4200 and its UI shows the deployment and its runs. The command keeps running: it is the worker."""


COMMANDS: dict = {}  # "name" or "group name" -> (add_arguments, handler, parser options), in the order of this file
GROUPS = {"ngram": "n-gram model tools", "team": "a team's servers on this machine: PostgreSQL, MLflow, Prefect"}  # commands of two words: `lmpipe ngram export-arpa`


def command(name: str, add_arguments: Callable, **options):
    """Make the function below `lmpipe <name>`; `add_arguments`, defined just above it, adds its flags."""
    def register(handler: Callable) -> Callable:
        COMMANDS[name] = (add_arguments, handler, options)
        return handler
    return register


def _server_args(p):
    p.add_argument("--port", type=int, help="port on 127.0.0.1 (default: 4200); given, the server starts there even "
                                            "when PREFECT_API_URL is set")
    p.add_argument("--stop", action="store_true", help="stop the server this checkout started on that port")


@command("server", _server_args, help="start (or --stop) the local Prefect server the stages report to")
def _server(args) -> int:
    port_given, args.port = args.port is not None, server.PORT if args.port is None else args.port
    if args.stop:
        print("stopped" if server.stop(args.port) else f"no server started by lmpipe on port {args.port}")
        return 0
    set_url = os.environ.get("PREFECT_API_URL")
    if set_url and not port_given:  # e.g. a team's server (lmpipe team up): the stages report there
        print(f"PREFECT_API_URL={set_url} is set, so the stages report there: no local server started (unset it to "
              "use one, or give --port N to start one anyway)")
        return 0
    url, process = server.start(args.port)
    print(("started " if process else "already running: ") + url)
    port = "" if args.port == server.PORT else f" --port {args.port}"
    if set_url and same_url(set_url, url):
        print(f"stages find it through PREFECT_API_URL={set_url}")
    elif set_url:
        print(f"PREFECT_API_URL={set_url} points elsewhere, so the stages report there; to use this server: "
              f"export PREFECT_API_URL={url}")
    elif port:
        print(f"stages find it with: export PREFECT_API_URL={url}")
    else:
        print(f"stages find it on {server.HOST}:{server.PORT} by themselves; elsewhere: export PREFECT_API_URL={url}")
    print(f"Prefect UI: {url.removesuffix('/api')}   stop with: lmpipe server --stop{port}")
    return 0


def same_url(a: str, b: str) -> bool:
    """Whether two Prefect API URLs name the same local server (localhost is 127.0.0.1; a trailing / aside)."""
    def norm(url: str) -> str:
        return url.strip().rstrip("/").replace("://localhost:", f"://{server.HOST}:")

    return norm(a) == norm(b)


def _team_dir(p):
    p.add_argument("--dir", type=Path, default=Path(".team"), help="the folder of the team's database, artifacts, "
                   "DVC remote and logs")


def _team_up_args(p):
    from flows.team import PORTS

    _team_dir(p)
    for name, port in PORTS.items():
        p.add_argument(f"--{name}-port", type=int, default=port, help=f"{name} on 127.0.0.1")


@command("team up", _team_up_args, help="start a PostgreSQL cluster, an MLflow server and a Prefect server on it, "
                                        "for every clone of the team (docs/scale-out.md)")
def _team_up(args) -> int:
    from flows import team

    ports = {name: getattr(args, f"{name}_port") for name in team.PORTS}
    started = team.up(args.dir, ports)
    print(f"up: PostgreSQL on {team.HOST}:{started.ports['postgres']}, MLflow {started.mlflow_url}, "
          f"Prefect {started.prefect_url.removesuffix('/api')} (their data and logs in {args.dir}/)")
    print("in each clone of the team (the MLflow UI is the server's page; `lmpipe ui` is not needed):")
    print("\n".join(f"  {line}" for line in started.exports()))
    print(f"stop them with: lmpipe team down{'' if args.dir == Path('.team') else f' --dir {args.dir}'}")
    return 0


@command("team down", _team_dir, help="stop the servers `lmpipe team up` started (their data stays)")
def _team_down(args) -> int:
    from flows import team

    stopped = team.down(args.dir)
    print(f"stopped: {', '.join(stopped)}" if stopped else f"no team servers running from {args.dir}/")
    return 0


def _ui_args(p):
    p.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default: 5000)")
    p.add_argument("--access-log", action="store_true", help="print the web server's line per request (default: off)")


@command("ui", _ui_args, help="open the MLflow UI on this study's tracking store (127.0.0.1)")
def _ui(args) -> int:
    from flows.ui import open_ui

    return open_ui(args.port, args.access_log)


def _sweep_args(p):
    from lmpipe.sweep import add_arguments

    add_arguments(p)


@command("sweep", _sweep_args, help="tune one model's settings with Optuna (trials in MLflow, outcome in sweeps/)")
def _sweep(args) -> int:
    from flows._stage import main as run_flow
    from flows.sweep import sweep

    run_flow(sweep, model=args.model, trials=args.trials, seeds=args.seeds, space_file=args.space)
    return 0


def _scaling_args(p):
    """Finished runs are cached by everything that decides them, and `dvc repro` re-fits: the flags only spread the
    runs (flows.runners.add_arguments)."""
    from flows import runners

    runners.add_arguments(p)


@command("scaling", _scaling_args, help="run the scaling-law grid and its fits (reports/scaling.md; the study's report compares)",
         description="Train the scaling grid (params.yaml's `scaling`: every size at every budget, less a run that "
                     "would read the training tokens more than lmpipe.scaling.MAX_EPOCHS times; finished runs are "
                     "cached, so only changed points train), commit it to its frozen DVC stage "
                     "(scaling/dvc.yaml:grid), then fit it (dvc repro scaling/dvc.yaml). The study's `dvc repro` "
                     "never trains the grid: its report compares with this one, or calls it stale.")
def _scaling(args) -> int:
    from flows import frozen, runners

    return frozen.scaling(runners.flags(args.workers, args.address))


def _seeds_args(p):
    from flows import runners
    from lmpipe.seeds import add_arguments  # its flags, defined once for `lmpipe seeds` and python -m flows.seeds

    add_arguments(p)
    runners.add_arguments(p)


@command("seeds", _seeds_args,
         help="retrain every model with the seeds of seeds.extra: mean ± sd and verdicts in the report",
         description="Retrain every model of params.yaml with each seed of `seeds.extra` (seeds/dvc.yaml; each model "
                     "trains once per extra seed, as long as in the study), score it like the evaluate stage, and "
                     "write seeds/seeds.csv, whose rows the study's report turns into mean ± sd and verdicts. "
                     "Finished runs are cached: a second call retrains only models whose settings changed.")
def _seeds(args) -> int:
    from flows import frozen, runners

    return frozen.seeds(args.models, runners.flags(args.workers, args.address))


def _check_params_args(p):
    p.add_argument("file", nargs="?", default="params.yaml", help="the params file (default: params.yaml)")
    p.add_argument("--store", action="store_true", help="also reach the MLflow tracking store (make study runs this "
                                                        "before dvc repro: a stage never fails on either after DVC "
                                                        "removed its outputs)")


@command("check-params", _check_params_args, help="validate params.yaml and say what is wrong in one line")
def _check_params(args) -> int:
    from lmpipe.preflight import check

    print(check(args.file, store=args.store))
    return 0


def _restore_args(p):
    p.add_argument("stage", help="the stage, as DVC names it: train@gru, evaluate, scaling/dvc.yaml:grid")


@command("restore", _restore_args, help="bring back a stage's outputs that DVC removed before a run that failed "
                                        "(from DVC's cache, and git for metrics and plots)")
def _restore(args) -> int:
    from flows.restore import restore

    print(restore(args.stage))
    return 0


def _export_arpa_args(p):
    p.add_argument("--model", default=paths.NGRAM, help=f"the n-gram model's folder (default: {paths.NGRAM})")
    p.add_argument("--out", default="ngram.arpa", help="the ARPA file to write (default: ngram.arpa)")


@command("ngram export-arpa", _export_arpa_args, help="write the n-gram model as an ARPA file (KenLM, SRILM)")
def _export_arpa(args) -> int:
    from lmpipe.ngram.arpa import export

    print(export(args.model, args.out))
    return 0


def _profile_args(p):
    p.add_argument("file", help="a YAML file of params to change, e.g. profiles/wikitext2-gpu.yaml or "
                                "sweeps/transformer/best.yaml")
    p.add_argument("--write", metavar="FILE", help="also write params.yaml with the profile applied to FILE "
                                                   "(for python -m lmpipe.train --params FILE)")


@command("profile", _profile_args, help="print a params profile as `-S` overrides for dvc exp run")
def _profile(args) -> int:
    from lmpipe.overrides import profile_flags

    print(profile_flags(args.file, args.write))
    return 0


DECODE_FLAGS = tuple(DecodingParams.model_fields)  # max_new_tokens, temperature, top_k, ..., seed


def evaluate_defaults(path: str | Path = "params.yaml") -> dict:
    """The decoding settings of params.yaml's `evaluate` here, for `generate --help` to show as values; {} where
    the file cannot be read (the help then names where the defaults come from)."""
    import yaml

    try:
        section = yaml.safe_load(Path(path).read_text(encoding="utf-8")).get("evaluate")
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        return {}
    if not isinstance(section, dict):
        return {}
    return {name: section[name] for name in DECODE_FLAGS
            if isinstance(section.get(name), (int, float)) and not isinstance(section.get(name), bool)}


def _generate_args(p):
    p.add_argument("--model", required=True, help="ngram, a name under models/, or a registered model: "
                                                   "models:/lmpipe-<name>@champion (or /<version>)")
    p.add_argument("--prompt", default="The history of", help="the text to continue (default: The history of)")
    p.add_argument("--strategy", default="top-p", choices=STRATEGIES, help="decoding strategy (default: top-p)")
    defaults = evaluate_defaults()
    for name in DECODE_FLAGS:  # one definition of each setting: params.yaml's `evaluate` gives the default
        field = DecodingParams.model_fields[name]
        default = (f"{defaults[name]} (params.yaml evaluate.{name})" if name in defaults
                   else f"params.yaml evaluate.{name}")
        p.add_argument(f"--{name.replace('_', '-')}", type=field.annotation, default=None,
                       help=f"{decoding_rule(name)}; default: {default}")
    p.add_argument("--tokenizer", default=paths.TOKENIZER,
                   help=f"the study's tokenizer, for models under models/ (default: {paths.TOKENIZER}; a registered "
                        "model carries its own)")


@command("generate", _generate_args, help="continue a prompt with a trained model")
def _generate(args) -> int:
    from flows.generate import generate

    flags = {name: getattr(args, name) for name in DECODE_FLAGS if getattr(args, name) is not None}
    print(generate(args.model, args.prompt, args.strategy, flags, args.tokenizer))
    return 0


def _serve_args(p):
    p.add_argument("--model", required=True, help="a model's name (gru), or its registry URI as `generate` takes it: "
                                                   "models:/lmpipe-gru@champion (or /<version>)")
    p.add_argument("--alias", default="champion", help="registry alias or version number, for a name (default: "
                                                       "champion)")
    p.add_argument("--port", type=int, default=5001, help="port on 127.0.0.1 (default: 5001)")


@command("serve", _serve_args, help="answer prompts over HTTP with a registered model (MLflow's scoring protocol; "
                                    "requests checked and bounded)")
def _serve(args) -> int:
    """A registered model over HTTP on 127.0.0.1, in this process: requests checked and bounded (lmpipe.serve_app)."""
    from lmpipe.serve_app import named, serve

    return serve(*named(args.model, args.alias), args.port)


def _schedule_args(p):
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help='cron expression, e.g. "0 3 * * 1" (Mondays 03:00)')
    when.add_argument("--interval", type=positive_seconds, metavar="SECONDS",
                      help="or every SECONDS seconds from now (e.g. 86400: daily)")
    p.add_argument("--name", default="lmpipe-retrain", help="deployment name")


@command("schedule", _schedule_args, help="serve the retraining flow on a cron schedule", description=SCHEDULE_HELP,
         formatter_class=argparse.RawDescriptionHelpFormatter)
def _schedule(args) -> int:
    from flows.schedule import serve_schedule

    return serve_schedule(args.name, cron=args.cron, interval=args.interval)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0 (e.g. 86400 for daily)")
    return value


def _retrain_args(p):
    add_set_param(p, "a setting for the experiment as `dvc exp run -S` takes it, e.g. -S models.gru.optim.lr=0.003 "
                     "(repeatable)")


@command("retrain", _retrain_args, help="retrain now: a DVC experiment, applied only when no model regressed",
         description=RETRAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
def _retrain(args) -> int:
    from flows._stage import main as run_flow
    from flows.retrain import retrain

    run_flow(retrain, overrides=args.overrides or None)
    return 0


def _diff_args(p):
    p.add_argument("a", nargs="?", default="HEAD", help="a git revision or DVC experiment name (default: HEAD)")
    p.add_argument("b", nargs="?", default="workspace", help="another, or the working tree (default: workspace)")
    p.add_argument("--md", action="store_true", help="a Markdown table, for a pull request's comment")


@command("diff", _diff_args, help="how each model's test bpb moved from A to B, real or within seed noise, and "
                                  "the compute each side had")
def _diff(args) -> int:
    from lmpipe.diff import diff

    print(diff(args.a, args.b, markdown=args.md))
    return 0


def _reproduced_args(p):
    p.add_argument("rev", nargs="?", default="HEAD", help="the committed study to compare with (default: HEAD)")


@command("reproduced", _reproduced_args, help="after `make study`: each model's numbers against the committed ones, "
                                              "bit for bit, within seed noise or differs, and the machines")
def _reproduced(args) -> int:
    from lmpipe.reproduced import reproduced

    ok, text = reproduced(args.rev)
    print(text)
    return 0 if ok else 1


def _plan_args(p):
    add_set_param(p, "a setting as `dvc exp run -S` takes it (repeatable); none: what `dvc repro` would run")


@command("plan", _plan_args, help="before a run: the stages `dvc exp run -S ...` would re-run, their training FLOPs "
                                  "and minutes on this machine")
def _plan(args) -> int:
    from flows.plan import plan

    try:
        print(plan(args.overrides))
    except ConfigError as exc:
        raise LmpipeError(str(exc)) from None
    return 0


class Help(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every flag's help ends with its default where it has one and does not say it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS) \
                and "default" not in text:
            text += f" (default: {action.default})"
        return text


# `lmpipe --help` lists the commands in the order a user meets them: the study, its models, then its variations.
ORDER = ("check-params", "server", "generate", "ui", "plan", "diff", "reproduced", "serve", "retrain", "schedule", "seeds", "sweep",
         "scaling", "profile", "restore", "ngram export-arpa", "team up", "team down")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmpipe", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"lmpipe {__version__}")
    commands, groups = parser.add_subparsers(dest="command", required=True), {}
    for name in sorted(COMMANDS, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
        add_arguments, handler, options = COMMANDS[name]
        options = {"description": options["help"][:1].upper() + options["help"][1:] + ".", **options,
                   "formatter_class": Help}
        group, _, name = name.rpartition(" ")  # "ngram export-arpa": a command of the group `lmpipe ngram`
        if group and group not in groups:
            groups[group] = commands.add_parser(
                group, help=GROUPS[group], description=GROUPS[group][:1].upper() + GROUPS[group][1:] + ".",
                formatter_class=Help).add_subparsers(dest=f"{group}_command", required=True)
        sub = (groups[group] if group else commands).add_parser(name, **options)
        add_arguments(sub)
        sub.set_defaults(run=handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    # `.venv/bin/lmpipe retrain` from cron or a service, the venv not activated: the tools every command starts (dvc,
    # and the stages' `python -m flows.<stage>` under it, mlflow, uvicorn) are this interpreter's, as under `make`
    os.environ["PATH"] = server.this_environment()["PATH"]
    args = parse_args(build_parser(), argv)  # a setting given as a bare key=value: one line naming -S
    try:
        return args.run(args)
    except LmpipeError as exc:  # the project's own errors only: a library's error keeps its traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
