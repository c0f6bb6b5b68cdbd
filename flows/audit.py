"""audit stage: WEAT on every neural model's embeddings and on the word2vec reference.

Outputs metrics/weat.json (the numbers: effect size, p-value, words per set), reports/weat_words.json (each
test's title and which words it kept or dropped, with their training counts), plots/weat/heatmap.png, data/embeddings/<name>.txt (the audited vectors in
word2vec text format, keyed by the word as listed). Each model's MLflow run gets weat_<test>_d/_p.
"""

from lmpipe.blas import pin_kernel

pin_kernel()  # before NumPy loads: the same BLAS kernels, so the same bytes, on every CPU of a kind

from pathlib import Path

import numpy as np
from prefect import flow, get_run_logger, task
from tokenizers import Tokenizer

from lmpipe import paths
from flows._stage import PARAMS_FILE, drop_removed, main, stage_run
from lmpipe import tracking
from lmpipe.audit import audit, load_tests, model_lookup, weat_heatmap, word_counts, write_word2vec_text
from lmpipe.config import load_params
from lmpipe.io import atomic_path, write_json
from lmpipe.models import load_model

METRICS, HEATMAP, EMBEDDINGS = paths.WEAT, paths.WEAT_HEATMAP, paths.EMBEDDINGS
DETAILS = paths.WEAT_WORDS  # which words each test kept or dropped, with their training counts
DETAIL_KEYS = ("title", "coverage", "dropped", "frequency")  # too bulky for `dvc metrics show`


def lookups(params) -> dict:
    """name -> word form -> vector (or None), for every neural model and the word2vec reference."""
    from gensim.models import KeyedVectors

    tokenizer = Tokenizer.from_file(paths.TOKENIZER)
    out = {}
    for name in params.models:
        out[name] = model_lookup(load_model(f"{paths.model_dir(name)}/model.pt"), tokenizer, params.audit.embedding)
    vectors = KeyedVectors.load_word2vec_format(f"{paths.WORD2VEC}/word2vec.bin", binary=True)
    out["word2vec"] = lambda form: vectors[form].astype(np.float64) if form in vectors.key_to_index else None
    return out


@task
def run_audit(params) -> dict:
    counts = word_counts(Path(paths.TRAIN_TEXT).read_text(encoding="utf-8"))
    tests = load_tests(params.audit.custom_tests)
    results = {}
    with atomic_path(EMBEDDINGS) as tmp:
        tmp.mkdir()
        for name, lookup in lookups(params).items():
            results[name], used = audit(lookup, counts, tests, params.audit.min_count, params.audit.min_words,
                                        params.audit.max_permutations, params.audit.seed)
            write_word2vec_text(used, tmp / f"{name}.txt")
            sizes = [abs(r["effect_size"]) for r in results[name].values() if r["status"] == "ok"]
            get_run_logger().info(f"{name}: {len(sizes)} of {len(tests)} tests with enough words"
                                  + (f", mean |d| {sum(sizes) / len(sizes):.2f}" if sizes else ""))
    return results


@flow(name="audit")
def audit_flow() -> dict:
    params = load_params(PARAMS_FILE)
    drop_removed(list(params.models))  # a removed model's outputs, before DVC hashes models/
    with stage_run("audit", params, ["audit"]):
        results = run_audit(params)
        form = "leading-space BPE form (' word'), mean of piece embeddings; word2vec: whole words"
        numbers = {m: {t: {k: v for k, v in r.items() if k not in DETAIL_KEYS} for t, r in tests.items()}
                   for m, tests in results.items()}
        details = {m: {t: {k: r[k] for k in DETAIL_KEYS if k in r} for t, r in tests.items()}
                   for m, tests in results.items()}
        write_json(METRICS, {"models": numbers, "word_form": form, "embedding": params.audit.embedding})
        write_json(DETAILS, {"models": details})
        Path(HEATMAP).parent.mkdir(parents=True, exist_ok=True)
        weat_heatmap(results, HEATMAP)
        tracking.log_artifacts(METRICS)
        tracking.log_artifacts(DETAILS)
        tracking.log_artifacts(HEATMAP)
        for name, by_test in results.items():
            metrics = {f"weat_{t}_{k}": r[v] for t, r in by_test.items() if r["status"] == "ok"
                       for k, v in (("d", "effect_size"), ("p", "p_value"))}
            tracking.log_metrics({f"{name}.{k}": v for k, v in metrics.items()})  # on the audit's own run
    return results


if __name__ == "__main__":
    main(audit_flow)
