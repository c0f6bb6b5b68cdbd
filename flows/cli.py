"""`lmpipe` command line, at the top of the house: it drives the flows (flows/) and the library (lmpipe/), which
never import it; the pipeline itself is `dvc repro`."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

from lmpipe import paths
from lmpipe import __version__
from lmpipe.config import STRATEGIES, DecodingParams, decoding_rule
from lmpipe.errors import ConfigError, LmpipeError, first_line

DESCRIPTION = """Tools around the lmpipe language-modelling study. The study itself is `dvc repro` (or `make study`);
these commands sample from its models, serve and retrain them, open its MLflow and Prefect views,
and run the experiments beside it (sweeps, the scaling grid)."""

RETRAIN_HELP = """Each retrain fetches the corpus source again and runs what a new corpus (or the given overrides)
changes as a DVC experiment in a temporary copy (dvc exp run --temp), then compares each model's
test word perplexity and bpb with its champion's in the MLflow registry.
Pass: the experiment is applied and committed (one commit; dvc push when a remote is set) and its
models become the champions. Fail (a model regressed beyond retrain.max_regression): HEAD, the
workspace and the champions stay as they were, the experiment stays for `dvc exp show`, and the
run fails naming the regressed models."""

SCHEDULE_HELP = """Serve a Prefect deployment of the `retrain` flow on a cron or interval schedule, from this project
directory.
""" + RETRAIN_HELP + """
Schedules need a Prefect server: set PREFECT_API_URL (e.g. http://prefect.example:4200/api for a
shared server, or your Prefect Cloud workspace URL); without it `lmpipe server` is started on
127.0.0.1:4200 and its UI shows the deployment and its runs. The command keeps running: it is the worker."""


def this_environment() -> dict:
    """os.environ with this interpreter's environment first on PATH: the tools it starts (dvc, uvicorn) run in it
    even when the venv is not activated."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


COMMANDS: dict = {}  # "name" or "group name" -> (add_arguments, handler, parser options), in the order of this file
GROUPS = {"ngram": "n-gram model tools", "team": "a team's servers on this machine: PostgreSQL, MLflow, Prefect"}  # commands of two words: `lmpipe ngram export-arpa`


def command(name: str, add_arguments: Callable, **options):
    """Make the function below `lmpipe <name>`; `add_arguments`, defined just above it, adds its flags."""
    def register(handler: Callable) -> Callable:
        COMMANDS[name] = (add_arguments, handler, options)
        return handler
    return register


def _server_args(p):
    p.add_argument("--port", type=int, default=4200, help="port on 127.0.0.1 (default: 4200)")
    p.add_argument("--stop", action="store_true", help="stop the server this checkout started on that port")


@command("server", _server_args, help="start (or --stop) the local Prefect server the stages report to")
def _server(args) -> int:
    from flows import server

    if args.stop:
        print("stopped" if server.stop(args.port) else f"no server started by lmpipe on port {args.port}")
        return 0
    if os.environ.get("PREFECT_API_URL"):  # e.g. a team's server (lmpipe team up): the stages report there
        print(f"PREFECT_API_URL={os.environ['PREFECT_API_URL']} is set, so the stages report there: no local server "
              "started (unset it to use one)")
        return 0
    url, process = server.start(args.port)
    print(("started " if process else "already running: ") + url)
    port = "" if args.port == server.PORT else f" --port {args.port}"
    if port:
        print(f"stages find it with: export PREFECT_API_URL={url}")
    else:
        print(f"stages find it on {server.HOST}:{server.PORT} by themselves; elsewhere: export PREFECT_API_URL={url}")
    print(f"Prefect UI: {url.removesuffix('/api')}   stop with: lmpipe server --stop{port}")
    return 0


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
    """`mlflow ui` on this study's store, one worker and no job runner (a viewer needs neither), on 127.0.0.1; the
    links are printed once it answers."""
    import time

    from flows import server
    from lmpipe.config import load_params
    from lmpipe.tracking.store import relocate_store, tracking_uri

    uri, params, base = tracking_uri(), load_params(), f"http://127.0.0.1:{args.port}"
    if uri.startswith(("http://", "https://")):  # a tracking server (a team's: lmpipe team up) is its own UI
        print(f"MLFLOW_TRACKING_URI={uri} is a tracking server, whose page is the MLflow UI: no local one started")
        _print_views(uri.rstrip("/"), params)
        return 0
    if not server.port_free(args.port):
        raise LmpipeError(f"127.0.0.1:{args.port} is taken by another program (choose another: lmpipe ui --port N)")
    relocate_store()  # a copied or moved checkout: the UI serves this one's artifacts
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
               "--port", str(args.port), "--workers", "1",
               *([] if args.access_log else ["--uvicorn-opts", "--no-access-log"])]  # quiet: the links stay in view
    env = {**this_environment(), "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    print(f"starting the MLflow UI over {uri} ...", flush=True)
    process = subprocess.Popen(command, env=env, start_new_session=True)  # its own group: stopped whole, below
    signal.signal(signal.SIGTERM, interrupt)  # a service manager's stop: as Ctrl-C
    try:
        deadline = time.monotonic() + 180
        while not server.healthy(base) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if process.poll() is None:
            _print_views(base, params)
        return process.wait()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the server (its own process group) stops below
        return 0
    except Exception as exc:  # the store failed us (e.g. locked by a running study): one line, and the UI goes too
        raise LmpipeError(f"the MLflow store {uri} did not answer as expected: {first_line(str(exc))}") from None
    finally:
        server.stop_group(process)


def _print_views(base: str, params) -> None:
    """The links of `lmpipe ui`'s views of this study on the MLflow UI at `base`, and the champions."""
    from lmpipe import mlflow_views as views
    from lmpipe.compare import baseline_label
    from lmpipe.tracking.registry import champion_versions

    experiment, label = params.tracking.experiment, baseline_label(params.ngram)
    every_run = views.view_url(base, experiment, views.share(experiment, views.runs_state(label)))
    print(f"MLflow UI, every model evaluated so far, best test bpb first: {every_run}", flush=True)
    runs = views.current_runs(experiment, [paths.model_dir(m) for m in params.models] + [paths.NGRAM])
    if runs:
        best_first = views.view_url(base, experiment, views.share(experiment, views.leaderboard_state(runs, label)))
        print(f"the models this workspace holds, best test bpb first: {best_first}")
        chart = views.chart_url(base, experiment, views.share(experiment, views.chart_state(runs, label)))
        print(f"their test bpb as a chart, best first: {chart}")
        print(f"every setting and metric of them side by side: {views.compare_url(base, experiment, runs)}")
    crowned = champion_versions(params.models)
    print("champions (models:/lmpipe-<model>@champion): "
          + (", ".join(f"{m} v{v.version}" for m, v in crowned.items()) or "none yet (run the study)"), flush=True)


def interrupt(signum, frame) -> None:
    """SIGTERM handler: stop as Ctrl-C stops (KeyboardInterrupt), so every `finally` runs."""
    raise KeyboardInterrupt


def _sweep_args(p):
    p.add_argument("--model", required=True, help="an entry of params.yaml's `models`")
    p.add_argument("--trials", type=int, default=20, help="finished trials the sweep should hold (it resumes)")
    p.add_argument("--seeds", type=int, default=3, help="retrain the winner with this many other seeds")
    p.add_argument("--space", default="sweeps/space.yaml", metavar="FILE",
                   help="a YAML file of search spaces, one per model")


@command("sweep", _sweep_args, help="tune one model's settings with Optuna (trials in MLflow, outcome in sweeps/)")
def _sweep(args) -> int:
    from flows._stage import main as run_flow
    from flows.sweep import sweep

    run_flow(sweep, model=args.model, trials=args.trials, seeds=args.seeds, space_file=args.space)
    return 0


def _scaling_args(p):
    """No flags: finished runs are cached by everything that decides them, and `dvc repro` re-fits."""


@command("scaling", _scaling_args, help="run the scaling-law grid and its fits (reports/scaling.md; the study's report compares)",
         description="Train the scaling grid (params.yaml's `scaling`: every size at every budget, less a run that "
                     "would read the training tokens more than lmpipe.scaling.MAX_EPOCHS times; finished runs are "
                     "cached, so only changed points train), commit it to its frozen DVC stage "
                     "(scaling/dvc.yaml:grid), then fit it (dvc repro scaling/dvc.yaml). The study's `dvc repro` "
                     "never trains the grid: its report compares with this one, or calls it stale.")
def _scaling(args) -> int:
    """The tokens first (the grid trains on them), the grid flow, `dvc commit` of its frozen stage, then the fits."""
    env = this_environment()
    steps = [["dvc", "repro", "--quiet", "tokenize"], [sys.executable, "-m", "flows.scaling"],
             ["dvc", "commit", "--force", "--quiet", f"{paths.SCALING_PIPELINE}:grid"],
             ["dvc", "repro", paths.SCALING_PIPELINE]]
    for step in steps:
        if code := subprocess.call(step, env=env):
            return code
    print(f"report: {paths.SCALING_REPORT} (and .html); runs: {paths.RUNS}; fits: {paths.SCALING_METRICS}; "
          "the study's report compares with it: dvc repro (re-runs the report only)")
    return 0


def _seeds_args(p):
    p.add_argument("--models", nargs="+", metavar="MODEL",
                   help="retrain only these models' seeds; the other models keep their rows of seeds/seeds.csv")


@command("seeds", _seeds_args,
         help="retrain every model with the seeds of seeds.extra: mean ± sd and verdicts in the report",
         description="Retrain every model of params.yaml with each seed of `seeds.extra` (seeds/dvc.yaml; each model "
                     "trains once per extra seed, as long as in the study), score it like the evaluate stage, and "
                     "write seeds/seeds.csv, whose rows the study's report turns into mean ± sd and verdicts. "
                     "Finished runs are cached: a second call retrains only models whose settings changed.")
def _seeds(args) -> int:
    """The seeds flow, then `dvc commit` of its frozen stage: the report's seed spread, versioned."""
    env = this_environment()
    code = subprocess.call([sys.executable, "-m", "flows.seeds", *(["--models", *args.models] if args.models else [])],
                           env=env)
    if code == 0:
        code = subprocess.call(["dvc", "commit", "--force", "--quiet", f"{paths.SEEDS_PIPELINE}:seeds"], env=env)
    if code == 0:
        print(f"runs: {paths.SEEDS}; the report's seed spread and verdicts: dvc repro (re-runs the report only)")
    return code


def _check_params_args(p):
    p.add_argument("file", nargs="?", default="params.yaml", help="the params file (default: params.yaml)")
    p.add_argument("--store", action="store_true", help="also reach the MLflow tracking store (make study runs this "
                                                        "before dvc repro: a stage never fails on either after DVC "
                                                        "removed its outputs)")


@command("check-params", _check_params_args, help="validate params.yaml and say what is wrong in one line")
def _check_params(args) -> int:
    import yaml

    from lmpipe.config import load_params, unstated_settings
    from lmpipe.preflight import input_problems, output_problems

    params = load_params(args.file)
    problems = input_problems(params, args.file) + output_problems(params)
    if problems:
        raise LmpipeError("; ".join(problems))
    if args.store:  # what every stage needs before DVC removes its outputs: the tracking store answers
        from lmpipe.tracking.store import check_store, tracking_uri

        check_store(params.tracking.timeout_seconds)
        print(f"{args.file}: ok; MLflow store {tracking_uri()}: ok")
    else:
        print(f"{args.file}: ok")
    left = unstated_settings(yaml.safe_load(Path(args.file).read_text(encoding="utf-8")) or {})
    if left:  # valid, but DVC cannot see a change of these defaults
        print(f"note: {len(left)} settings are left to lmpipe's defaults, which DVC does not track; state them to "
              f"make a change of default re-run what it affects: {', '.join(left[:8])}" + (" ..." if len(left) > 8 else ""))
    return 0


def _restore_args(p):
    p.add_argument("stage", help="the stage, as DVC names it: train@gru, evaluate, scaling/dvc.yaml:grid")


@command("restore", _restore_args, help="bring back a stage's outputs that DVC removed before a run that failed "
                                        "(from DVC's cache, and git for metrics and plots)")
def _restore(args) -> int:
    """A stage's outputs from one source, never a mix: the run dvc.lock records, when that run is committed (DVC's
    cache holds its cached outputs, git the ones DVC leaves to git, `cache: false`: metrics, plots); else the commit's
    run (HEAD's dvc.lock entry for the stage, which the workspace's dvc.lock then records again): an uncommitted
    run's metrics were never in git, so its model cannot come back with them. `dvc checkout` alone restores only
    the cached outputs, as the workspace's dvc.lock records them."""
    import os

    import yaml
    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    from dvc.utils.serialize import modify_yaml

    from lmpipe.errors import first_line
    from lmpipe.git import git, git_or_empty

    try:
        repo = Repo(".")
        stages = repo.stage.collect(args.stage)
    except DvcException as exc:
        raise LmpipeError(f"{args.stage}: not a stage of this project ({first_line(str(exc))}); see: dvc stage list") from None
    cached = [os.path.relpath(o.fs_path, repo.root_dir) for s in stages for o in s.outs if o.use_cache]
    tracked = [os.path.relpath(o.fs_path, repo.root_dir) for s in stages for o in s.outs if not o.use_cache]
    source = "the run dvc.lock records"
    if tracked:  # outputs in two places: they must come from the same run
        lock_file = os.path.relpath(stages[0].dvcfile.path, repo.root_dir).removesuffix(".yaml") + ".lock"
        names = [s.name for s in stages]
        ours = (yaml.safe_load(open(lock_file, encoding="utf-8")) if os.path.exists(lock_file) else {}) or {}
        head = yaml.safe_load(git_or_empty("show", f"HEAD:{lock_file}") or "{}") or {}
        committed = {n: head.get("stages", {}).get(n) for n in names}
        if any(entry is None for entry in committed.values()):
            raise LmpipeError(f"{args.stage}: no committed run of it (HEAD's {lock_file} has none), so its "
                              f"{', '.join(tracked)} are in no git commit: make them with dvc repro -s {args.stage}")
        if any(ours.get("stages", {}).get(n) != entry for n, entry in committed.items()):
            with modify_yaml(lock_file) as lock:  # DVC's own reader and writer: the file keeps its form
                lock.setdefault("stages", {}).update(committed)
            source = f"the commit (HEAD): the run {lock_file} recorded since was not committed, and its metrics never were"
    env = this_environment()
    if cached and subprocess.call(["dvc", "checkout", "--force", "--quiet", args.stage], env=env) != 0:
        raise LmpipeError(f"dvc checkout {args.stage} failed: its outputs are not in DVC's cache (re-run it: "
                          f"dvc repro -s {args.stage})")
    known = git_or_empty("ls-files", "--", *tracked).split() if tracked else []
    if known:
        git("checkout", "HEAD", "--", *tracked)  # a failure: one line, git's reason
    left = [t for t in tracked if not any(k == t or k.startswith(t.rstrip("/") + "/") for k in known)]
    print(f"restored {args.stage} from {source}: {', '.join(cached + [t for t in tracked if t not in left])}"
          + (f"; not in git, so not restored: {', '.join(left)} (dvc repro -s {args.stage} makes them)" if left else ""))
    return 0


def _export_arpa_args(p):
    p.add_argument("--model", default=paths.NGRAM, help=f"the n-gram model's folder (default: {paths.NGRAM})")
    p.add_argument("--out", default="ngram.arpa", help="the ARPA file to write (default: ngram.arpa)")


@command("ngram export-arpa", _export_arpa_args, help="write the n-gram model as an ARPA file (KenLM, SRILM)")
def _export_arpa(args) -> int:
    from tqdm.auto import tqdm

    from lmpipe.ngram import NGramLM, arpa_counts, write_arpa

    if not (Path(args.model) / "ngram.json").exists():
        raise LmpipeError(f"{args.model}: no n-gram model there (run: dvc repro ngram)")
    model = NGramLM.load(args.model)
    if model.method != "kneser_ney":
        raise LmpipeError(f"{args.model}: ARPA needs a kneser_ney model, this one is {model.method} (set ngram.method)")
    with tqdm(total=sum(arpa_counts(model).values()), desc=f"writing {args.out}", unit=" n-grams", unit_scale=True,
              disable=not sys.stderr.isatty()) as bar:
        counts = write_arpa(model, args.out, bar.update)
    print(f"wrote {args.out}: " + ", ".join(f"{n} {k}-grams" for k, n in counts.items()))
    print("tokens are written as their ids; the boundary token is </s> (and <s> as context)")
    return 0


def _profile_args(p):
    p.add_argument("file", help="a YAML file of params to change, e.g. profiles/wikitext2-gpu.yaml or "
                                "sweeps/transformer/best.yaml")
    p.add_argument("--write", metavar="FILE", help="also write params.yaml with the profile applied to FILE "
                                                   "(for python -m lmpipe.train --params FILE)")


@command("profile", _profile_args, help="print a params profile as `-S` overrides for dvc exp run")
def _profile(args) -> int:
    import shlex

    import yaml

    from lmpipe.config import apply_overrides, parse_params, profile_overrides

    overrides = profile_overrides(yaml.safe_load(Path(args.file).read_text()))
    # check the merged params before anyone spends GPU hours on a typo
    merged = apply_overrides(yaml.safe_load(Path("params.yaml").read_text()), overrides)
    parse_params(merged, f"params.yaml + {args.file}")
    if args.write:  # the same params as one file, for runs outside DVC (python -m lmpipe.train --params FILE)
        from lmpipe.io import write_text

        write_text(args.write, yaml.safe_dump(merged, sort_keys=False))
    print(" ".join(f"-S {shlex.quote(o)}" for o in overrides))
    return 0


DECODE_FLAGS = tuple(DecodingParams.model_fields)  # max_new_tokens, temperature, top_k, ..., seed


def _generate_args(p):
    p.add_argument("--model", required=True, help="ngram, a name under models/, or a registered model: "
                                                   "models:/lmpipe-<name>@champion (or /<version>)")
    p.add_argument("--prompt", default="The history of", help="the text to continue (default: The history of)")
    p.add_argument("--strategy", default="top-p", choices=STRATEGIES, help="decoding strategy (default: top-p)")
    for name in DECODE_FLAGS:  # one definition of each setting: params.yaml's `evaluate` gives the default
        field = DecodingParams.model_fields[name]
        p.add_argument(f"--{name.replace('_', '-')}", type=field.annotation, default=None,
                       help=f"{decoding_rule(name)}; default: params.yaml evaluate.{name} ({field.default})")
    p.add_argument("--tokenizer", default=paths.TOKENIZER,
                   help=f"the study's tokenizer, for models under models/ (default: {paths.TOKENIZER}; a registered "
                        "model carries its own)")


@command("generate", _generate_args, help="continue a prompt with a trained model")
def _generate(args) -> int:
    from tokenizers import Tokenizer

    from lmpipe.config import load_params
    from lmpipe.decode import DecodeSettings, continuation
    from lmpipe.evaluate import load_lm
    from lmpipe.tokenize import boundary_id

    params = load_params()
    flags = {name: getattr(args, name) for name in DECODE_FLAGS if getattr(args, name) is not None}
    try:  # each flag by its one rule (lmpipe.config.check_decoding), before any model loads
        settings = DecodeSettings.from_params(params.evaluate, strategy=args.strategy, **flags)
    except ConfigError as exc:
        name = str(exc).split()[0]
        raise LmpipeError(f"--{name.replace('_', '-')} {flags[name]}: {exc}") from None
    if args.model.startswith("models:/"):  # a registered model, e.g. models:/lmpipe-gru@champion: its own tokenizer
        from lmpipe.serving import load_bundle  # MLflow's pyfunc: imported only for a registered model
        from lmpipe.tracking.registry import registered_artifacts

        print(f"loading {args.model} from the MLflow registry ...", file=sys.stderr, flush=True)
        model, tokenizer, boundary, _ = load_bundle(registered_artifacts(args.model))
    else:
        if not Path(args.tokenizer).exists():
            raise LmpipeError(f"{args.tokenizer}: no tokenizer (run: dvc repro tokenize)")
        tokenizer = Tokenizer.from_file(args.tokenizer)
        boundary = boundary_id(tokenizer, params.tokenizer.boundary_token)
        directory = Path(paths.model_dir(args.model))
        if not directory.exists():
            raise LmpipeError(f"{directory}: no trained model '{args.model}' (run: dvc repro, or give "
                              "models:/lmpipe-<name>@champion)")
        print(f"loading {directory} ...", file=sys.stderr, flush=True)
        model = load_lm(directory)
    print(args.prompt + continuation(model, tokenizer, boundary, args.prompt, settings))
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


def check_cron(cron: str) -> None:
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron)
    except ValidationError:
        raise LmpipeError(f'--cron {cron!r}: not a cron expression (five fields: minute hour day-of-month month '
                          'day-of-week, e.g. "0 3 * * 1" for Mondays 03:00)') from None


def _schedule_args(p):
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help='cron expression, e.g. "0 3 * * 1" (Mondays 03:00)')
    when.add_argument("--interval", type=positive_seconds, metavar="SECONDS",
                      help="or every SECONDS seconds from now (e.g. 86400: daily)")
    p.add_argument("--name", default="lmpipe-retrain", help="deployment name")


@command("schedule", _schedule_args, help="serve the retraining flow on a cron schedule", description=SCHEDULE_HELP,
         formatter_class=argparse.RawDescriptionHelpFormatter)
def _schedule(args) -> int:
    """Serve the retrain deployment on the project's Prefect server. Prefect reads PREFECT_API_URL once, when it is
    first imported, so the server is settled before anything imports Prefect: a temporary server cannot schedule."""
    from flows import server

    ours = not os.environ.get("PREFECT_API_URL")
    if ours:
        os.environ["PREFECT_API_URL"] = server.api_url()
    if args.cron:
        check_cron(args.cron)  # imports Prefect, which now reads the server's URL
    if ours:
        if server.start()[1]:
            print(f"started the project's Prefect server: {server.api_url()} (stop it with: lmpipe server --stop)",
                  flush=True)
    elif not server.healthy(os.environ["PREFECT_API_URL"], timeout=5):
        raise LmpipeError(f"PREFECT_API_URL={os.environ['PREFECT_API_URL']} does not answer: a schedule needs a "
                          "running Prefect server (start one: lmpipe server, or unset PREFECT_API_URL)")
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    from flows.retrain import retrain
    from lmpipe.config import load_params

    timeout = load_params().retrain.timeout
    when = f"cron '{args.cron}'" if args.cron else f"every {args.interval:g} s"
    print(f"serving deployment 'retrain/{args.name}' on {when} via {os.environ['PREFECT_API_URL']}"
          f" (one retrain at a time, a firing during one is cancelled; each may run {timeout:g} s; Ctrl-C stops it)",
          flush=True)
    from prefect.runner import Runner

    runner = Runner(name=args.name, pause_on_shutdown=True)  # what Flow.serve builds
    runner.add_flow(retrain.with_options(timeout_seconds=timeout), name=args.name, cron=args.cron,
                    interval=args.interval, paused=False, concurrency_limit=ConcurrencyLimitConfig(
                        limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW))
    # Prefect's own SIGTERM handler stops polling but leaves a running retrain training: SIGTERM (systemd,
    # supervisord, Docker) does what Ctrl-C does instead, which stops the retrain, its DVC run and its copy
    runner.handle_sigterm = as_ctrl_c
    # started with SIGINT ignored (nohup, a background job of a script), the retrain Prefect spawns would inherit
    # that and shrug off as_ctrl_c's SIGINT: Python's Ctrl-C handler here, so a spawned child starts with its own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        asyncio.run(runner.start())
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM through as_ctrl_c
        pass
    print(f"stopped serving 'retrain/{args.name}'", flush=True)
    return 0


def as_ctrl_c(signum=None, frame=None) -> None:
    """SIGTERM as the terminal's Ctrl-C: SIGINT to the other processes of this one's group (a retrain Prefect runs),
    then to this one, whose handler (asyncio's, while the runner runs) cancels the runner cleanly."""
    import psutil

    group = os.getpgrp()
    for child in psutil.Process().children(recursive=True):
        try:
            if os.getpgid(child.pid) == group:
                child.send_signal(signal.SIGINT)
        except (psutil.Error, ProcessLookupError):
            continue
    signal.raise_signal(signal.SIGINT)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0 (e.g. 86400 for daily)")
    return value


def _retrain_args(p):
    p.add_argument("overrides", nargs="*", help="params overrides for the experiment, e.g. models.gru.optim.lr=0.003")


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


def _plan_args(p):
    p.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting as `dvc exp run -S` takes it (repeatable); none: what `dvc repro` would run")


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
ORDER = ("check-params", "server", "generate", "ui", "plan", "diff", "serve", "retrain", "schedule", "seeds", "sweep",
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
            groups[group] = commands.add_parser(group, help=GROUPS[group]).add_subparsers(
                dest=f"{group}_command", required=True)
        sub = (groups[group] if group else commands).add_parser(name, **options)
        add_arguments(sub)
        sub.set_defaults(run=handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except LmpipeError as exc:  # the project's own errors only: a library's error keeps its traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
