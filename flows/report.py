"""report stage: reports/study.md and a self-contained reports/study.html, logged to the study's MLflow run;
metrics/models/<model>.json (what `dvc metrics show` lists) and the offline page of `dvc plots show`."""

import json
from pathlib import Path

from prefect import flow, task

from lmpipe import paths
from flows._stage import PARAMS_FILE, drop_removed, main, stage_run
from lmpipe import grid_record, tracking
from lmpipe.compare import baseline_label, best_model, gap, not_compute_matched, scored
from lmpipe.paths import BASELINE
from lmpipe.config import load_params
from lmpipe.errors import LmpipeError
from lmpipe.io import write_text
from lmpipe.report import build_report, dvc_plots_template

OUT_DIR = paths.REPORTS  # study.md, study.html, figures/ (beside validation/ and samples.md of earlier stages)
EVAL, PLOTS_TEMPLATE = paths.EVAL, paths.PLOTS_TEMPLATE


def headline(models: dict, unmatched: list[str] = ()) -> dict:
    """Each model's test bpb and word perplexity, and the best compute-matched neural model's margin over the n-gram
    baseline."""
    out = {f"{name}.test_{key}": r["test"][key] for name, r in models.items() for key in ("bpb", "word_ppl")}
    best = best_model({n: r for n, r in models.items() if n not in unmatched})
    if BASELINE in models and best:
        out["best_test_bpb"] = models[best]["test"]["bpb"]
        out["best_vs_baseline_bpb"] = gap(scored(models[best]), scored(models[BASELINE]))[0]
    return out


def made_from(params_file: str | Path = PARAMS_FILE) -> str:
    """What the numbers were made from, by content: params.yaml's digest (the one MLflow's study key carries) and the
    corpus's. Not the code's commit, which goes on every MLflow run (`mlflow.source.git.commit`): a code change that
    leaves the numbers as they were then leaves the report as it was too."""
    digest = tracking.runs.study_key(params_file).params_digest
    corpus = json.loads(Path(paths.CORPUS_METRICS).read_text()) if Path(paths.CORPUS_METRICS).exists() else {}
    line = f"the settings in `params.yaml` (sha256 `{digest}`; `dvc params diff` compares)"
    if train := corpus.get("sha256", {}).get("train.txt"):
        line += f" and the corpus `{corpus['source']}` (train.txt sha256 `{train[:12]}`)"
    return line


def describe(name: str, shown, trained: dict) -> str:
    """A model run's description (the MLflow UI shows it first): what it is and how it did, in the report's numbers
    (`shown`: its seed spread, lmpipe.seeds.Spread)."""
    line = f"**{name}**: test {shown.text()} bpb, word perplexity {shown.word_ppl:,.0f}"
    if "train_flops" in trained:
        line += (f"; trained on {trained['tokens_seen'] / 1e6:.2f}M tokens ({trained['epochs']:.1f} epochs), "
                 f"{trained['train_flops'] / 1e12:.1f} TFLOPs, {trained['n_params'] / 1e6:.2f}M parameters")
    return line + "."


def label_each_model_run(params, models: dict) -> None:
    """Every model's own MLflow run (found by the content hash of models/<model>) carries its test numbers, a
    description and the labels the MLflow views show (lmpipe.mlflow_views.labels), whichever stages re-ran: DVC
    skips `score@<model>` when a retrained model hashes the same. The versions of its files in the registry (score@
    registers them) get the same numbers as description and tags, with the training commit and the settings'
    digest: the registry page says why a version is the champion."""
    from lmpipe import mlflow_views as views
    from lmpipe.seeds import study_spreads

    label = baseline_label(params.ngram)
    trained = {n: json.loads(Path(paths.train_metrics(n)).read_text()) for n in models if n in params.models}
    spreads, stale = study_spreads(paths.SEEDS, {"models": models}, trained, params.train.seed, BASELINE,
                               list(params.models))
    digest, baseline = tracking.runs.study_key(PARAMS_FILE).params_digest, spreads[BASELINE]
    for name, result in models.items():
        run_id = tracking.run_of_output(params.tracking.experiment, paths.model_dir(name))
        if not run_id:
            continue
        t, spread = trained.get(name, {}), spreads[name]
        sd, seeds = (spread.bpb_sd, spread.n) if name != BASELINE else (None, 1)
        size = t.get("n_params", result.get("n_params", 0))
        shown = views.labels(name, spread, (label, baseline), size, t.get("train_flops"))
        note = describe(name, spread, t)
        tracking.record_results(run_id, {**result["test"], views.SORT_METRIC.removeprefix("test_"): spread.bpb},
                                {tracking.NOTE: note, **shown, views.RANKED: "yes"})
        commit = tracking.tracker().client.get_run(run_id).data.tags.get("mlflow.source.git.commit", "")
        versus = shown[f"vs {label}"]
        card = (f"{note} Against {label}: {versus}, word perplexity {spread.word_ppl:,.0f} against "
                f"{baseline.word_ppl:,.0f}.{seed_sentence(name, seeds, stale)} "
                f"Trained at commit {commit[:12] or '(none)'} from params.yaml sha256 {digest}.")
        tracking.registry.describe_versions(tracking.registry.registered_name(name), paths.model_dir(name), card, {
            "test_bpb": f"{spread.bpb:.4f}", "test_bpb_sd": "unknown" if sd is None else f"{sd:.4f}",
            "seeds": str(seeds), f"vs_{label}_bpb": versus.split()[0],
            "test_word_ppl": f"{spread.word_ppl:.1f}",
            "train_flops": f"{t['train_flops']:.3e}" if "train_flops" in t else "-",
            "n_params": str(t.get("n_params", "")), "git_commit": commit, "params_sha256": digest})


def seed_sentence(name: str, seeds: int, stale: dict[str, str]) -> str:
    """What a registry card adds of the seed noise where its numbers are one run's: why there is no spread (a person
    must not read one seed's number as a mean); nothing where they are a mean over seeds (the card says so)."""
    if seeds > 1 or name == BASELINE:
        return ""
    if name in stale:
        return f" No seed spread: seeds/seeds.csv's rows of it are {stale[name]}."
    return " No seed spread yet: one seed (`lmpipe seeds` trains more)."


def check_covers(models: list[str]) -> None:
    """The evaluation must hold exactly the study's models: a stale row is worse than none."""
    evaluated = set(json.loads(Path(EVAL).read_text())["models"]) - {BASELINE}
    if evaluated != set(models):
        raise LmpipeError(f"{EVAL} covers {sorted(evaluated)}, params.yaml's models are {sorted(models)} "
                          "(run the whole pipeline: dvc repro)")


def trained_metrics(models: list[str]) -> dict:
    return {name: json.loads(Path(paths.train_metrics(name)).read_text()) for name in models}


@task
def write_report(params) -> str:
    models = list(params.models)
    check_covers(models)
    for path in drop_removed(models):
        print(f"removed {path}: its model is no longer in params.yaml", flush=True)
    write_text(PLOTS_TEMPLATE, dvc_plots_template())
    return str(build_report(".", OUT_DIR, models, tracking.experiment_tags().get(tracking.EXPERIMENT),
                            study_seed=params.train.seed, label=baseline_label(params.ngram), made_from=made_from(),
                            budget_flops=params.study.flops, budget_exceptions=params.budget_exceptions(),
                            grid_stale=grid_record.stale(params)))


@flow(name="report")
def report() -> str:
    params = load_params(PARAMS_FILE)
    with stage_run("report", params, []) as run:
        path = write_report(params)
        study = tracking.runs.parent_run_id(run)
        for run_id in [None] + ([study] if study else []):  # the report stage's run, and the study run where a study is compared
            for name, where in (("study.md", "report"), ("study.html", "report"), ("figures", "report/figures")):
                tracking.log_artifacts(f"{OUT_DIR}/{name}", where, run_id=run_id)
        evaluated = json.loads(Path(EVAL).read_text())["models"]
        label_each_model_run(params, evaluated)
        if study:  # the study's headline numbers on its parent run, where the MLflow UI opens
            unmatched = not_compute_matched(trained_metrics(list(params.models)), params.study.flops,
                                            params.budget_exceptions())
            tracking.log_metrics(headline(evaluated, unmatched), run_id=study)
            tracking.runs.end_study_run(study)  # the last stage: the parent's duration is the study's
    return path


if __name__ == "__main__":
    main(report)
