"""publish stage, the last: the study's numbers where people read them beside the report, each from the one source the
report's tables use (lmpipe.results: a model's mean over its seeds where they hold, else its one run).

- metrics/models/: the rows `dvc metrics show` lists, best first (lmpipe.summaries);
- one MLflow run per model under this stage's run: the rows of the views `lmpipe ui` links to (lmpipe.mlflow_views),
  with the labels and a description a person reads;
- each registered version's card: its description and tags (score@<model> registered it);
- the study run's headline numbers and the report, after which it ends the study run: its duration is the study's.

It writes no other stage's run: a model's training run keeps what its training and scoring gave it.
"""

from prefect import flow

from flows._stage import PARAMS_FILE, log_report, main, stage_run
from lmpipe import paths, summaries, tracking
from lmpipe import mlflow_views as views
from lmpipe.compare import baseline_label, best_model, gap, scored
from lmpipe.config import load_params
from lmpipe.paths import BASELINE
from lmpipe.results import load_results, machines_text, made_on


def headline(models: dict, unmatched: list[str] = ()) -> dict:
    """Each model's test bpb and word perplexity, and the best compute-matched neural model's margin over the n-gram
    baseline."""
    out = {f"{name}.test_{key}": r["test"][key] for name, r in models.items() for key in ("bpb", "word_ppl")}
    best = best_model({n: r for n, r in models.items() if n not in unmatched})
    if BASELINE in models and best:
        out["best_test_bpb"] = models[best]["test"]["bpb"]
        out["best_vs_baseline_bpb"] = gap(scored(models[best]), scored(models[BASELINE]))[0]
    return out


def describe(name: str, shown, trained: dict) -> str:
    """A model's description (the MLflow UI shows it first): what it is and how it did, in the report's numbers
    (`shown`: its seed spread, lmpipe.seeds.Spread)."""
    line = f"**{name}**: test {shown.text()} bpb, word perplexity {shown.word_ppl:,.0f}"
    if "train_flops" in trained:
        line += (f"; trained on {trained['tokens_seen'] / 1e6:.2f}M tokens ({trained['epochs']:.1f} epochs), "
                 f"{trained['train_flops'] / 1e12:.1f} TFLOPs, {trained['n_params'] / 1e6:.2f}M parameters")
    return line + "."


def seed_sentence(name: str, seeds: int, stale: dict[str, str]) -> str:
    """What a registry card adds of the seed noise where its numbers are one run's: why there is no spread (a person
    must not read one seed's number as a mean); nothing where they are a mean over seeds (the card says so)."""
    if seeds > 1 or name == BASELINE:
        return ""
    if name in stale:
        return f" No seed spread: seeds/seeds.csv's rows of it are {stale[name]}."
    return " No seed spread yet: one seed (`lmpipe seeds` trains more)."


def provenance(name: str, results) -> str:
    """Where the model and its seeds' rows were made and how its run lies from its seed's committed row, in seed sds
    (lmpipe.seeds: the machine and the precision are provenance, not identity): a card read anywhere says which
    machines its numbers come from. The machines only where recorded."""
    made, trained = results.provenance.get(name), results.trained.get(name, {})
    run = made_on(trained.get("machine", ""), trained.get("precision", ""))
    if made is None:
        return f" Trained on {run}." if run else ""
    rows = machines_text(made["rows"])
    said = [part for part in (f"trained on {run}" if run else "", f"its seeds' rows on {rows}" if rows else "") if part]
    said.append(f"against its seed's committed row: {made['reproduction'].text()}")
    text = "; ".join([", ".join(said[:-1]), said[-1]] if len(said) > 1 else said)
    return f" {text[0].upper()}{text[1:]}."


def publish_model(params, name: str, results, under: str) -> None:
    """One model's row of the MLflow views, a run of its own under this stage's run (`under`), and the card of its
    registered versions."""
    label, spread = baseline_label(params.ngram), results.spreads[name]
    baseline, trained = results.spreads[BASELINE], results.trained.get(name, {})
    test = results.evaluation["models"][name]["test"]
    experiment = params.tracking.experiment
    made_by = tracking.run_of_output(experiment, paths.model_dir(name)) or ""
    size = trained.get("n_params", results.evaluation["models"][name].get("n_params", 0))
    shown = views.labels(name, spread, (label, baseline), size, trained.get("train_flops"))
    note = describe(name, spread, trained) + provenance(name, results)
    tags = {tracking.NOTE: note, **shown, tracking.runs.ROLE: views.PUBLISHED, views.MODEL: name, views.MADE_BY: made_by,
            views.MODEL_HASH: tracking.output_hash(paths.model_dir(name))}
    with tracking.runs.run(experiment, name, tags=tags, parent_run_id=under):
        tracking.log_metrics({**{f"test_{k}": v for k, v in test.items()}, views.SORT_METRIC: spread.bpb})
    if name == BASELINE:
        return
    seeds, sd = spread.n, spread.bpb_sd
    commit = tracking.tracker().client.get_run(made_by).data.tags.get("mlflow.source.git.commit", "") if made_by else ""
    versus, digest = shown[f"vs {label}"], tracking.runs.study_key(PARAMS_FILE).params_digest
    card = (f"{note} Against {label}: {versus}, word perplexity {spread.word_ppl:,.0f} against "
            f"{baseline.word_ppl:,.0f}.{seed_sentence(name, seeds, results.stale)} "
            f"Trained at commit {commit[:12] or '(none)'} from params.yaml sha256 {digest}.")
    tracking.registry.describe_versions(tracking.registry.registered_name(name), paths.model_dir(name), card, {
        "test_bpb": f"{spread.bpb:.4f}", "test_bpb_sd": "unknown" if sd is None else f"{sd:.4f}",
        "seeds": str(seeds), f"vs_{label}_bpb": versus.split()[0], "test_word_ppl": f"{spread.word_ppl:.1f}",
        "train_flops": f"{trained['train_flops']:.3e}" if "train_flops" in trained else "-",
        "n_params": str(trained.get("n_params", "")), "git_commit": commit, "params_sha256": digest,
        "trained_on": made_on(trained.get("machine", ""), trained.get("precision", "")) or "-"})


@flow(name="publish")
def publish() -> str:
    params = load_params(PARAMS_FILE)
    results = load_results(".", list(params.models), params.train.seed, params.study.flops, params.budget_exceptions())
    with stage_run("publish", params, []) as run:
        path = summaries.write(".", results.spreads, results.trained, baseline_label(params.ngram))
        for name in results.evaluation["models"]:
            publish_model(params, name, results, run.info.run_id)
        study = tracking.runs.parent_run_id(run)
        if study:  # the study's headline numbers and its report on its parent run, where the MLflow UI opens
            log_report(study)
            tracking.log_metrics(headline(results.evaluation["models"], results.unmatched), run_id=study)
            tracking.runs.end_study_run(study)  # the last stage: the parent's duration is the study's
    return str(path)


if __name__ == "__main__":
    main(publish)
