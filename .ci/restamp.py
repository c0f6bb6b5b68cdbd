"""Stamp the study's training identities into its committed results, after a change shown not to change them.

    python .ci/restamp.py [--machine NAME]       (needs data/tokens: dvc repro tokenize)

A seed row holds while its identity (lmpipe.train.job.Job.identity: the training code, the params but the seed,
the data) is the study's training's (lmpipe.seeds). For a maintainer, beside .ci/relock.py: after an edit to the
training code that tests show changes no number, each model's identity in metrics/train/<model>.json, in its rows
of seeds/seeds.csv and in its loss-by-position curve (plots/position.csv) moves to the one the code computes now, and
dvc.lock records the rewritten summaries. A model whose rows carry another identity than its summary (retrained
since) is left alone, and said. `--machine` names the machine that made rows which record none.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flows.position import curves_text
from flows.train import CKPT_ROOT, made_by, study_branches
from lmpipe import paths
from lmpipe.config import load_params
from lmpipe.io import csv_records, write_json, write_text
from lmpipe.seeds import COLUMNS, csv_rows, read_rows
from lmpipe.splits import load_tokens
from lmpipe.train.job import prepare


def restamp(machine: str | None) -> list[str]:
    params, data = load_params("params.yaml"), load_tokens()
    rows, done = read_rows(paths.SEEDS), []
    curves = csv_records(paths.POSITION_CURVES)  # each cell as written: only identities move; none without the file
    for model in params.models:
        job = prepare(params, model, CKPT_ROOT, data=data, params_file="params.yaml")
        identity = made_by(job, study_branches(params, job))["identity"]
        summary_file = Path(paths.train_metrics(model))
        summary = json.loads(summary_file.read_text())
        old = summary.get("identity", "")
        mine = [r for r in rows if r["model"] == model]
        if any(r.get("identity", "") != old for r in mine):
            print(f"{model}: its seed rows carry another identity than metrics/train/{model}.json: left alone")
            continue
        for r in mine:
            r.update(identity=identity, machine=r.get("machine") or machine or "")
        for curve in curves:
            if curve["model"] == model and curve["identity"] == old:
                curve["identity"] = identity
        write_json(summary_file, {**summary, "identity": identity,
                                  "machine": summary.get("machine") or machine or ""})
        done.append(model)
    write_text(paths.SEEDS, csv_rows([{c: r.get(c, "") for c in COLUMNS} for r in rows]))
    if curves:
        write_text(paths.POSITION_CURVES, curves_text(curves))
    return done


def relock_summaries(models: list[str]) -> None:
    """dvc.lock's hashes of the rewritten summaries (git holds them, `cache: false`), and of seeds/seeds.csv."""
    from dvc.repo import Repo

    wanted = {str(Path(paths.train_metrics(m)).resolve()) for m in models} | {str(Path(paths.SEEDS).resolve())}
    with Repo() as repo, repo.lock:
        for stage in repo.index.stages:
            outs = [o for o in stage.outs if not o.use_cache and o.fs_path in wanted]
            for out in outs:
                out.save()
            if outs and all(o.hash_info for o in stage.outs):
                stage.dvcfile.dump(stage, update_pipeline=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", help="the machine that made rows which record none")
    stamped = restamp(parser.parse_args().machine)
    relock_summaries(stamped)
    print("restamped:", ", ".join(stamped) or "nothing")
