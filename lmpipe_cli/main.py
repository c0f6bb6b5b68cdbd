"""`lmpipe` command line, at the top of the house: it drives the flows (flows/) and the library (lmpipe/), which
never import it; the pipeline itself is `dvc repro`. On click: each command's flags sit on its function, and
`lmpipe --help` lists the commands in the order this file defines them (the order a user meets them)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from lmpipe_cli import server
from lmpipe import paths
from lmpipe import __version__
from lmpipe.decode_rules import STRATEGIES, DecodingParams, decoding_rule
from lmpipe.errors import ConfigError, LmpipeError
from lmpipe.set_param import bare_settings, refusal
from flows.runners import spread_options
from lmpipe.seeds import models_option
from lmpipe.sweep import sweep_options

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


class InOrder(click.Group):
    """A group that lists its commands in the order they were added, not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


@click.group(cls=InOrder, help=DESCRIPTION, context_settings={"help_option_names": ["-h", "--help"],
                                                              "show_default": True, "max_content_width": 110})
@click.version_option(__version__, "--version", prog_name="lmpipe", message="%(prog)s %(version)s")
def lmpipe() -> None:
    pass


def sentence(line: str) -> str:
    return line[:1].upper() + line[1:] + "."


def command(name: str, line: str, description: str | None = None, group: click.Group = lmpipe, **options):
    """`lmpipe <name>`: `line` in the command listing, `description` (else `line`) atop its own help."""
    return group.command(name, short_help=line, help=description or sentence(line), **options)


class TakesSettings(click.Command):
    """A command that takes settings as `-S KEY=VALUE`: a setting given another way (a bare `key=value`, `--set`)
    is one line naming -S (exit 2, as a usage error), not a usage dump."""

    def __init__(self, *args, **kwargs):
        kwargs["context_settings"] = {"ignore_unknown_options": True, "allow_extra_args": True,
                                      **kwargs.get("context_settings", {})}
        super().__init__(*args, **kwargs)

    def invoke(self, ctx: click.Context):
        if ctx.args:
            if bare_settings(ctx.args) or "--set" in ctx.args:
                click.echo(refusal(ctx.command_path, bare_settings(ctx.args)), err=True)
                ctx.exit(2)
            raise click.UsageError(f"unexpected arguments: {' '.join(ctx.args)}", ctx)
        return super().invoke(ctx)


def settings_option(help: str):
    """`-S/--set-param KEY=VALUE`, repeatable, as `dvc exp run -S` takes it; `help` says what the settings do."""
    return click.option("-S", "--set-param", "overrides", multiple=True, metavar="KEY=VALUE", help=help)


@command("check-params", "validate params.yaml and say what is wrong in one line",
         "Validate FILE, the params file (default: params.yaml), and say what is wrong in one line.")
@click.argument("file", default="params.yaml")
@click.option("--store", is_flag=True, help="also reach the MLflow tracking store (make study runs this before dvc "
                                             "repro: a stage never fails on either after DVC removed its outputs)")
def _check_params(file: str, store: bool) -> int:
    from lmpipe.preflight import check

    print(check(file, store=store))
    return 0


@command("server", "start (or --stop) the local Prefect server the stages report to")
@click.option("--port", type=int, help=f"port on 127.0.0.1 (default: {server.PORT}); given, the server starts there "
                                       "even when PREFECT_API_URL is set")
@click.option("--stop", is_flag=True, help="stop the server this checkout started on that port")
def _server(port: int | None, stop: bool) -> int:
    port_given, port = port is not None, server.PORT if port is None else port
    if stop:
        print("stopped" if server.stop(port) else f"no server started by lmpipe on port {port}")
        return 0
    set_url = os.environ.get("PREFECT_API_URL")
    if set_url and not port_given:  # e.g. a team's server (lmpipe team up): the stages report there
        print(f"PREFECT_API_URL={set_url} is set, so the stages report there: no local server started (unset it to "
              "use one, or give --port N to start one anyway)")
        return 0
    url, process = server.start(port)
    print(("started " if process else "already running: ") + url)
    flag = "" if port == server.PORT else f" --port {port}"
    if set_url and same_url(set_url, url):
        print(f"stages find it through PREFECT_API_URL={set_url}")
    elif set_url:
        print(f"PREFECT_API_URL={set_url} points elsewhere, so the stages report there; to use this server: "
              f"export PREFECT_API_URL={url}")
    elif flag:
        print(f"stages find it with: export PREFECT_API_URL={url}")
    else:
        print(f"stages find it on {server.HOST}:{server.PORT} by themselves; elsewhere: export PREFECT_API_URL={url}")
    print(f"Prefect UI: {url.removesuffix('/api')}   stop with: lmpipe server --stop{flag}")
    return 0


def same_url(a: str, b: str) -> bool:
    """Whether two Prefect API URLs name the same local server (localhost is 127.0.0.1; a trailing / aside)."""
    def norm(url: str) -> str:
        return url.strip().rstrip("/").replace("://localhost:", f"://{server.HOST}:")

    return norm(a) == norm(b)


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


class DecodingOption(click.Option):
    """A decoding setting of `generate`: its default is params.yaml's `evaluate` where the command runs, so its
    help reads that file when shown, not when this module loads."""

    def get_help_record(self, ctx: click.Context):
        defaults, name = evaluate_defaults(), self.name
        default = f"{defaults[name]} (params.yaml evaluate.{name})" if name in defaults else f"params.yaml evaluate.{name}"
        self.help = f"{decoding_rule(name)}; default: {default}"
        return super().get_help_record(ctx)


def decoding_options(function):
    """One flag per decoding setting (`DecodingParams`), unset unless given: params.yaml's `evaluate` fills it."""
    for name in reversed(DECODE_FLAGS):
        field = DecodingParams.model_fields[name]
        function = click.option(f"--{name.replace('_', '-')}", name, cls=DecodingOption, type=field.annotation,
                                default=None, help=decoding_rule(name))(function)
    return function


@command("generate", "continue a prompt with a trained model")
@click.option("--model", required=True, help="ngram, a name under models/, or a registered model: "
                                             "models:/lmpipe-<name>@champion (or /<version>)")
@click.option("--prompt", default="The history of", help="the text to continue")
@click.option("--strategy", default="top-p", type=click.Choice(STRATEGIES), help="decoding strategy")
@decoding_options
@click.option("--tokenizer", default=paths.TOKENIZER, help="the study's tokenizer, for models under models/ (a "
                                                           "registered model carries its own)")
def _generate(model: str, prompt: str, strategy: str, tokenizer: str, **decoding) -> int:
    from lmpipe_cli.generate import generate

    print(generate(model, prompt, strategy, {k: v for k, v in decoding.items() if v is not None}, tokenizer))
    return 0


@command("ui", "open the MLflow UI on this study's tracking store (127.0.0.1)")
@click.option("--port", type=int, default=5000, help="port on 127.0.0.1")
@click.option("--access-log", is_flag=True, help="print the web server's line per request (default: off)")
def _ui(port: int, access_log: bool) -> int:
    from lmpipe_cli.ui import open_ui

    return open_ui(port, access_log)


@command("plan", "before a run: the stages `dvc exp run -S ...` would re-run, their training FLOPs and minutes on "
                 "this machine", cls=TakesSettings)
@settings_option("a setting as `dvc exp run -S` takes it (repeatable); none: what `dvc repro` would run")
def _plan(overrides: tuple[str, ...]) -> int:
    from lmpipe_cli.plan import plan

    try:
        print(plan(list(overrides)))
    except ConfigError as exc:
        raise LmpipeError(str(exc)) from None
    return 0


@command("diff", "how each model's test bpb moved from A to B, real or within seed noise, and the compute each "
                 "side had", description="How each model's test bpb moved from A (a git revision or DVC experiment "
                                         "name; default: HEAD) to B (another, or the working tree; default: "
                                         "workspace), real or within seed noise, and the compute each side had.")
@click.argument("a", default="HEAD")
@click.argument("b", default="workspace")
@click.option("--md", is_flag=True, help="a Markdown table, for a pull request's comment")
def _diff(a: str, b: str, md: bool) -> int:
    from lmpipe.diff import diff

    print(diff(a, b, markdown=md))
    return 0


@command("reproduced", "after `make study`: each model's numbers against the committed ones, bit for bit, within "
                       "seed noise or differs, and the machines",
         description="After `make study`: each model's numbers against those of REV (the committed study; default: "
                     "HEAD), bit for bit, within seed noise or differs, and the machines.")
@click.argument("rev", default="HEAD")
def _reproduced(rev: str) -> int:
    from lmpipe.reproduced import reproduced

    ok, text = reproduced(rev)
    print(text)
    return 0 if ok else 1


@command("serve", "answer prompts over HTTP with a registered model (MLflow's scoring protocol; requests checked "
                  "and bounded)")
@click.option("--model", required=True, help="a model's name (gru), or its registry URI as `generate` takes it: "
                                             "models:/lmpipe-gru@champion (or /<version>)")
@click.option("--alias", default="champion", help="registry alias or version number, for a name")
@click.option("--port", type=int, default=5001, help="port on 127.0.0.1")
def _serve(model: str, alias: str, port: int) -> int:
    """A registered model over HTTP on 127.0.0.1, in this process: requests checked and bounded (lmpipe.serve_app)."""
    from lmpipe.serve_app import named, serve

    return serve(*named(model, alias), port)


@command("retrain", "retrain now: a DVC experiment, applied only when no model regressed", RETRAIN_HELP,
         cls=TakesSettings)
@settings_option("a setting for the experiment as `dvc exp run -S` takes it, e.g. -S models.gru.optim.lr=0.003 "
                 "(repeatable)")
def _retrain(overrides: tuple[str, ...]) -> int:
    from flows._stage import main as run_flow
    from lmpipe_cli.retrain import retrain

    run_flow(retrain, overrides=list(overrides) or None)
    return 0


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise click.BadParameter(f"{text!r} is not a number of seconds > 0 (e.g. 86400 for daily)")
    return value


@command("schedule", "serve the retraining flow on a cron schedule", SCHEDULE_HELP)
@click.option("--cron", help='cron expression, e.g. "0 3 * * 1" (Mondays 03:00)')
@click.option("--interval", type=positive_seconds, metavar="SECONDS",
              help="or every SECONDS seconds from now (e.g. 86400: daily)")
@click.option("--name", default="lmpipe-retrain", help="deployment name")
def _schedule(cron: str | None, interval: float | None, name: str) -> int:
    from lmpipe_cli.schedule import serve_schedule

    if (cron is None) == (interval is None):
        raise click.UsageError("give one of --cron or --interval")
    return serve_schedule(name, cron=cron, interval=interval)


@command("seeds", "retrain every model with the seeds of seeds.extra: mean ± sd and verdicts in the report",
         "Retrain every model of params.yaml with each seed of `seeds.extra` (seeds/dvc.yaml; each model trains once "
         "per extra seed, as long as in the study), score it like the evaluate stage, and write seeds/seeds.csv, "
         "whose rows the study's report turns into mean ± sd and verdicts. Finished runs are cached: a second call "
         "retrains only models whose settings changed.")
@models_option
@spread_options
def _seeds(models: tuple[str, ...], workers: int | None, address: str | None) -> int:
    from flows import runners
    from lmpipe_cli import frozen

    return frozen.seeds(list(models) or None, runners.flags(workers, address))


@command("sweep", "tune one model's settings with Optuna (trials in MLflow, outcome in sweeps/)")
@sweep_options
def _sweep(model: str, trials: int, seeds: int, space: str) -> int:
    from flows._stage import main as run_flow
    from flows.sweep import sweep

    run_flow(sweep, model=model, trials=trials, seeds=seeds, space_file=space)
    return 0


@command("scaling", "run the scaling-law grid and its fits (reports/scaling.md; the study's report compares)",
         "Train the scaling grid (params.yaml's `scaling`: every size at every budget, less a run that would read "
         "the training tokens more than lmpipe.scaling.MAX_EPOCHS times; finished runs are cached, so only changed "
         "points train), commit it to its frozen DVC stage (scaling/dvc.yaml:grid), then fit it (dvc repro "
         "scaling/dvc.yaml). The study's `dvc repro` never trains the grid: its report compares with this one, or "
         "calls it stale.")
@spread_options
def _scaling(workers: int | None, address: str | None) -> int:
    from flows import runners
    from lmpipe_cli import frozen

    return frozen.scaling(runners.flags(workers, address))


@command("profile", "print a params profile as `-S` overrides for dvc exp run",
         "Print FILE, a YAML file of params to change (e.g. profiles/wikitext2-gpu.yaml or "
         "sweeps/transformer/best.yaml), as `-S` overrides for dvc exp run.")
@click.argument("file")
@click.option("--write", metavar="FILE", help="also write params.yaml with the profile applied to FILE (for python "
                                              "-m lmpipe.train --params FILE)")
def _profile(file: str, write: str | None) -> int:
    from lmpipe.overrides import profile_flags

    print(profile_flags(file, write))
    return 0


@command("restore", "bring back a stage's outputs that DVC removed before a run that failed (from DVC's cache, and "
                    "git for metrics and plots)",
         "Bring back the outputs of STAGE (as DVC names it: train@gru, evaluate, scaling/dvc.yaml:grid) that DVC "
         "removed before a run that failed (from DVC's cache, and git for metrics and plots).")
@click.argument("stage")
def _restore(stage: str) -> int:
    from lmpipe_cli.restore import restore

    print(restore(stage))
    return 0


@lmpipe.group("ngram", cls=InOrder, short_help="n-gram model tools", help="N-gram model tools.")
def ngram() -> None:
    pass


@command("export-arpa", "write the n-gram model as an ARPA file (KenLM, SRILM)", group=ngram)
@click.option("--model", default=paths.NGRAM, help="the n-gram model's folder")
@click.option("--out", default="ngram.arpa", help="the ARPA file to write")
def _export_arpa(model: str, out: str) -> int:
    from lmpipe.ngram.arpa import export

    print(export(model, out))
    return 0


@lmpipe.group("team", cls=InOrder, short_help="a team's servers on this machine: PostgreSQL, MLflow, Prefect",
              help="A team's servers on this machine: PostgreSQL, MLflow, Prefect.")
def team() -> None:
    pass


def team_dir(function):
    return click.option("--dir", "folder", type=click.Path(path_type=Path), default=Path(".team"),
                        help="the folder of the team's database, artifacts, DVC remote and logs")(function)


def team_ports(function):
    from lmpipe_cli.team import PORTS

    for name, port in reversed(PORTS.items()):
        function = click.option(f"--{name}-port", f"{name}_port", type=int, default=port,
                                help=f"{name} on 127.0.0.1")(function)
    return function


@command("up", "start a PostgreSQL cluster, an MLflow server and a Prefect server on it, for every clone of the "
               "team (docs/scale-out.md)", group=team)
@team_dir
@team_ports
def _team_up(folder: Path, **ports) -> int:
    from lmpipe_cli import team as servers

    started = servers.up(folder, {name: ports[f"{name}_port"] for name in servers.PORTS})
    print(f"up: PostgreSQL on {servers.HOST}:{started.ports['postgres']}, MLflow {started.mlflow_url}, "
          f"Prefect {started.prefect_url.removesuffix('/api')} (their data and logs in {folder}/)")
    print("in each clone of the team (the MLflow UI is the server's page; `lmpipe ui` is not needed):")
    print("\n".join(f"  {line}" for line in started.exports()))
    print(f"stop them with: lmpipe team down{'' if folder == Path('.team') else f' --dir {folder}'}")
    return 0


@command("down", "stop the servers `lmpipe team up` started (their data stays)", group=team)
@team_dir
def _team_down(folder: Path) -> int:
    from lmpipe_cli import team as servers

    stopped = servers.down(folder)
    print(f"stopped: {', '.join(stopped)}" if stopped else f"no team servers running from {folder}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run `lmpipe` with `argv` (else sys.argv), returning the exit status: a usage mistake 2 with click's lines,
    the project's own errors 1 with one line; a library's error keeps its traceback."""
    # `.venv/bin/lmpipe retrain` from cron or a service, the venv not activated: the tools every command starts (dvc,
    # and the stages' `python -m flows.<stage>` under it, mlflow, uvicorn) are this interpreter's, as under `make`
    os.environ["PATH"] = server.this_environment()["PATH"]
    try:
        code = lmpipe.main(argv, prog_name="lmpipe", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except LmpipeError as exc:  # the project's own errors only: a library's error keeps its traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0

