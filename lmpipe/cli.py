"""`lmpipe` command line: helpers around the pipeline (the pipeline itself is `dvc repro`)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from lmpipe.errors import LmpipeError


def _server(args) -> int:
    from flows import server

    if args.stop:
        print("stopped" if server.stop(args.port) else f"no server started by lmpipe on port {args.port}")
        return 0
    url, process = server.start(args.port)
    print(("started " if process else "already running: ") + url)
    print(f"stages find it on 127.0.0.1:{server.PORT} by themselves; elsewhere: export PREFECT_API_URL={url}")
    print(f"Prefect UI: {url.removesuffix('/api')}   stop with: lmpipe server --stop")
    return 0


def _ui(args) -> int:
    from lmpipe.tracking import tracking_uri

    uri = tracking_uri()
    print(f"MLflow UI on http://127.0.0.1:{args.port} over {uri}")
    command = ["mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(args.port)]
    return subprocess.call(command, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})


def _check_params(args) -> int:
    from lmpipe.config import load_params

    load_params(args.file)
    print(f"{args.file}: ok")
    return 0


def _export_arpa(args) -> int:
    from lmpipe.ngram import NGramLM, write_arpa

    if not (Path(args.model) / "ngram.json").exists():
        raise LmpipeError(f"{args.model}: no n-gram model there (run: dvc repro ngram)")
    model = NGramLM.load(args.model)
    if model.method != "kneser_ney":
        raise LmpipeError(f"{args.model}: ARPA needs a kneser_ney model, this one is {model.method} (set ngram.method)")
    counts = write_arpa(model, args.out)
    print(f"wrote {args.out}: " + ", ".join(f"{n} {k}-grams" for k, n in counts.items()))
    print("tokens are written as their ids; the boundary token is </s> (and <s> as context)")
    return 0


def profile_overrides(tree: dict, prefix: str = "") -> list[str]:
    """A profile's leaves as `key=value` overrides for `dvc exp run -S` (inline dicts stay one value)."""
    import yaml

    out = []
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key not in ("arch", "optim"):
            out += profile_overrides(value, f"{name}.")
        else:
            out.append(f"{name}={yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix('...').strip()}")
    return out


def _profile(args) -> int:
    import shlex

    import yaml

    from lmpipe.config import apply_overrides, load_params

    overrides = profile_overrides(yaml.safe_load(Path(args.file).read_text()))
    # check the merged params before anyone spends GPU hours on a typo
    merged = apply_overrides(yaml.safe_load(Path("params.yaml").read_text()), overrides)
    probe = Path(".cache/lmpipe/profile-check.yaml")
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(yaml.safe_dump(merged))
    load_params(probe)
    print(" ".join(f"-S {shlex.quote(o)}" for o in overrides))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmpipe", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    server = commands.add_parser("server", help="start (or --stop) the local Prefect server the stages report to")
    server.add_argument("--port", type=int, default=4200)
    server.add_argument("--stop", action="store_true")
    server.set_defaults(run=_server)
    ui = commands.add_parser("ui", help="open the MLflow UI on this study's tracking store (127.0.0.1)")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(run=_ui)
    ngram = commands.add_parser("ngram", help="n-gram model tools").add_subparsers(dest="ngram_command", required=True)
    export = ngram.add_parser("export-arpa", help="write the n-gram model as an ARPA file (KenLM, SRILM)")
    export.add_argument("--model", default="models/ngram")
    export.add_argument("--out", default="ngram.arpa")
    export.set_defaults(run=_export_arpa)
    profile = commands.add_parser("profile", help="print a params profile as `-S` overrides for dvc exp run")
    profile.add_argument("file")
    profile.set_defaults(run=_profile)
    check = commands.add_parser("check-params", help="validate params.yaml and say what is wrong in one line")
    check.add_argument("file", nargs="?", default="params.yaml")
    check.set_defaults(run=_check_params)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except LmpipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
