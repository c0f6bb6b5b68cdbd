"""The scheduled `retrain` flow. A retrain is a DVC experiment, so only a passing gate changes what users read.

1. The corpus source is fetched again into a scratch folder; a new dump is pinned as `corpus.sha256=<its hash>`.
2. `dvc exp run --temp` runs the study in a temporary copy: DVC re-runs exactly the stages that the new corpus (or the
   given overrides) change, and every model it retrains registers a new `challenger` version in MLflow.
3. The gate compares each model's test word perplexity and bpb with its champion's (the n-gram's with HEAD's).
   - Fail: the experiment stays for `dvc exp show` / `dvc exp diff`; HEAD, the workspace and the champions are as
     they were; the flow run ends Failed, naming the regressed models and by how much.
   - Pass: `dvc exp apply`, one git commit of what the experiment changed, `dvc push` when a DVC remote is set, and
     the experiment's versions become the champions.
The retrain's MLflow parent run carries the comparison table and the decision as tags.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows import paths
from flows._stage import CACHE_DIR, PARAMS_FILE, main
from flows.study import stage_env, dvc, one_study
from lmpipe import tracking
from lmpipe.compare import changed, compare_eval, comparison_markdown, describe, metrics_of
from lmpipe.config import load_params
from lmpipe.corpus.sources import corpus_sha256, fetch_corpus
from lmpipe.errors import LmpipeError

DECISION, EXPERIMENT, COMPARISON = "lmpipe.retrain.decision", "lmpipe.retrain.experiment", "lmpipe.retrain.comparison"
REGRESSED, COMMIT = "lmpipe.retrain.regressed", "lmpipe.retrain.commit"


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise LmpipeError(f"git {' '.join(args)} failed: " + (done.stderr.strip().splitlines() or ["no output"])[-1])
    return done.stdout


def uncommitted() -> list[str]:
    """Tracked files changed but not committed: a retrain commits on top of HEAD, so it starts from a clean one."""
    return [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]


def fetched_sha256(corpus) -> str | None:
    """The source's corpus as it is now, pinned the way `corpus.sha256` pins it (fetched into a scratch folder)."""
    Path(CACHE_DIR).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="retrain-fetch-") as scratch:
        fetch_corpus(corpus.model_copy(update={"sha256": None}), Path(scratch) / "raw", Path(scratch) / "downloads")
        return corpus_sha256(Path(scratch) / "raw")


def experiment_ref(name: str) -> str:
    """The git ref DVC keeps the experiment under (refs/exps/../<baseline>/<name>)."""
    refs = [r for r in git("for-each-ref", "--format=%(refname)", "refs/exps").split() if r.endswith(f"/{name}")]
    if not refs:
        raise LmpipeError(f"dvc exp run left no experiment named {name} (see: dvc exp show)")
    return refs[0]


def commit_message(name: str, rows: list[dict], max_regression: float) -> str:
    moved = changed(rows)
    head = (f"retrain {name}: {', '.join(r['model'] for r in moved)} retrained within "
            f"retrain.max_regression={max_regression:g}" if moved else f"retrain {name}: no model's numbers changed")
    return "\n".join([head, "", *(f"- {describe(r)}" for r in moved)]) + "\n"


def apply(name: str, ref: str, message: str, env: dict) -> str:
    """The experiment into the workspace and into one commit (pushed to the DVC remote when there is one)."""
    files = git("diff", "--name-only", "HEAD", ref).split()
    dvc(["exp", "apply", name], env)
    git("add", "--", *files)
    identity = [] if git_identity() else ["-c", "user.name=lmpipe retrain", "-c", "user.email=lmpipe@localhost"]
    git(*identity, "commit", "-q", "-m", message)
    if dvc(["remote", "list"], env).strip():
        dvc(["push"], env)
    return git("rev-parse", "HEAD").strip()


def git_identity() -> bool:
    return subprocess.run(["git", "config", "user.email"], capture_output=True).returncode == 0


@flow(name="retrain")
def retrain(overrides: list[str] | None = None) -> dict:
    """Retrain what a refreshed corpus (or `overrides`, e.g. models.gru.epochs=4) changes, as a DVC experiment;
    apply and commit it, and promote its models, only when no model regressed beyond retrain.max_regression."""
    params = load_params(PARAMS_FILE)
    limit, log = params.retrain.max_regression, get_run_logger()
    with one_study():
        dirty = uncommitted()
        if dirty:
            raise LmpipeError(f"uncommitted changes to {', '.join(dirty[:4])}: a retrain commits its outcome on "
                              "top of HEAD; commit or stash them first")
        parent = tracking.start_study_run(params.tracking.experiment, PARAMS_FILE, "retrain")
        env = stage_env(parent)
        sets = list(overrides or [])
        pinned = fetched_sha256(params.corpus)
        if pinned != corpus_sha256(paths.RAW):
            log.info("the source has a new corpus: sha256 %s", pinned)
            sets.append(f"corpus.sha256={pinned}")
        if not sets and not json.loads(dvc(["status", "--json", "dvc.yaml"], env) or "{}"):
            tracking.set_tags(parent, {DECISION: "unchanged"})
            create_markdown_artifact("# Retraining\n\nThe corpus and the pipeline are unchanged: nothing to retrain.\n",
                                     key="retrain-comparison", description="nothing changed")
            return {"decision": "unchanged"}
        name = f"retrain-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
        dvc(["exp", "run", "--temp", "--name", name, *[a for s in sets for a in ("-S", s)]], env)
        ref = experiment_ref(name)
        head = json.loads(Path(paths.EVAL).read_text()) if Path(paths.EVAL).exists() else None
        before = {**metrics_of(head), **tracking.champion_metrics(params.models)}
        rows, regressed = compare_eval(before, metrics_of(json.loads(git("show", f"{ref}:{paths.EVAL}"))), limit)
        table = comparison_markdown(rows, regressed, limit)
        create_markdown_artifact(table, key="retrain-comparison", description="test metrics, champion vs challenger")
        tracking.set_tags(parent, {DECISION: "failed" if regressed else "passed", EXPERIMENT: name,
                                   COMPARISON: table, REGRESSED: ",".join(regressed)})
        if regressed:
            raise LmpipeError(f"{name} regressed beyond retrain.max_regression={limit:g}: "
                              + "; ".join(describe(r) for r in rows if r["model"] in regressed)
                              + f"; nothing applied (inspect it: dvc exp show, dvc exp diff HEAD {name})")
        commit = apply(name, ref, commit_message(name, rows, limit), env)
        champions = tracking.promote_experiment(name)
        tracking.set_tags(parent, {COMMIT: commit})
    log.info("applied %s as %s; champions now: %s", name, commit[:12], champions)
    return {"decision": "passed", "experiment": name, "commit": commit, "rows": rows, "champions": champions}


if __name__ == "__main__":
    main(retrain, overrides=sys.argv[1:] or None)
