"""Every path of the study's files, written once, here: what the stages read and write, and what the report and the
README read back. dvc.yaml is the map of which stage reads and writes which; tests/test_graph.py holds the two
together: each data path in dvc.yaml (all pipelines) is one of these, and no other module of flows/ or lmpipe/ spells
a path out."""

import os

# Outside DVC's outputs (DVC deletes those before a stage runs), git-ignored. CACHE: the checkout's own state (the
# study's lock, the Prefect server's pid and log, the n-gram's shards). CACHE_DIR: resumable runs (downloads,
# checkpoints, cached rows); a retrain's stages run in a temporary copy and are given the checkout's own
# (lmpipe_cli/retrain.py), so an interrupted retrain keeps its training.
CACHE = ".cache/lmpipe"
CACHE_DIR = os.environ.get("LMPIPE_CACHE_DIR", CACHE)

RAW = "data/raw"  # the corpus as fetched, with its manifest
CLEAN = "data/clean"  # {train,valid,test}.txt
TRAIN_TEXT = f"{CLEAN}/train.txt"
TOKENS = "data/tokens"  # tokenizer.json, {split}.npy, counts.json
TOKENIZER = f"{TOKENS}/tokenizer.json"
TRAIN_TOKENS = f"{TOKENS}/train.npy"
WORD2VEC = "data/word2vec"  # the audit's reference embedding
EMBEDDINGS = "data/embeddings"  # the audited vectors, one file per model
LOGPROBS = "data/logprobs"  # <model>.npz: each token's log-probability on valid and test (what `combine` mixes)

MODELS = "models"  # every language model of the study, one folder each
BASELINE = "ngram"  # the study's baseline model: its folder, its row in metrics/eval.json, its stages (ngram, score_ngram)
NGRAM = f"{MODELS}/{BASELINE}"

CORPUS_METRICS = "metrics/corpus.json"
VALIDATION_METRICS = "metrics/validation.json"
VALIDATION_DOCS = "reports/validation"  # Great Expectations' data docs
TOKENIZE_METRICS = "metrics/tokenize.json"
NGRAM_METRICS = "metrics/ngram.json"
TRAIN_METRICS = "metrics/train"  # <model>.json, one per train@<model>
CURVES = "plots/train"  # <model>.csv, one per train@<model>
EVAL_MODELS = "metrics/eval"  # <model>.json: one model's scores and samples, one per score@<model> (and score_ngram)
EVAL = "metrics/eval.json"  # every model's scores, joined by `evaluate`
COMBINE = "metrics/combine.json"  # the models interpolated with each other, shaped like eval.json's `models`
SAMPLES = "reports/samples.md"
PERPLEXITY_PLOT = "plots/eval/perplexity.csv"
WEAT = "metrics/weat.json"
WEAT_WORDS = "reports/weat_words.json"
WEAT_HEATMAP = "plots/weat/heatmap.png"
REPORTS = "reports"  # where lmpipe.report writes the study's report:
STUDY_REPORT, STUDY_PAGE, FIGURES = f"{REPORTS}/study.md", f"{REPORTS}/study.html", f"{REPORTS}/figures"
PLOTS_TEMPLATE = f"{REPORTS}/plots_template.html"  # .dvc/config points `dvc plots show` at it
COMPUTE_CURVES = "plots/compute.csv"  # every model's valid bpb against training FLOPs: one DVC plot (report)
SUMMARIES = "metrics/models"  # <model>.json: what `dvc metrics show` lists
POSITION_CURVES = "plots/position.csv"  # loss by context position (python -m flows.position; the report shows it)

SCALING_PIPELINE = "scaling/dvc.yaml"  # the scaling-law experiment, apart from the study
RUNS = "scaling/runs.csv"  # the scaling grid's rows: written by `grid`, fitted by `fit`
GRID_MADE_WITH = "scaling/made_with.json"  # the data and settings the grid trained from (lmpipe.grid_record)
SCALING_METRICS = "metrics/scaling.json"
SEEDS_PIPELINE = "seeds/dvc.yaml"  # the seed spread, apart from the study (its stage is frozen: lmpipe seeds runs it)
SEEDS = "seeds/seeds.csv"  # every model at every seed, the study's own run among them; the report reads it
SEED_BUDGETS = "seeds/budgets.csv"  # with the study's decay branches: every seed's annealed result at each budget
SWEEP_RATE, SWEEP_WIDTH, SWEEP_OPTIMISER = "sweeps/equal_compute", "sweeps/equal_size", "sweeps/equal_optimiser"
SWEEP_DROPOUT = "sweeps/equal_dropout"
TUNING_AT_C = (SWEEP_RATE, SWEEP_WIDTH, SWEEP_OPTIMISER, SWEEP_DROPOUT)  # one-setting sweeps at the study's budget
SEED_WEAT = "seeds/weat.csv"  # every seed's WEAT effect sizes, audited as the audit stage audits the study's

SCALING_REPORT, SCALING_PAGE, SCALING_FIGURES = f"{REPORTS}/scaling.md", f"{REPORTS}/scaling.html", f"{REPORTS}/scaling"


def model_dir(name: str) -> str:
    return f"{MODELS}/{name}"


def train_metrics(name: str) -> str:
    return f"{TRAIN_METRICS}/{name}.json"


def curve(name: str) -> str:
    return f"{CURVES}/{name}.csv"


def eval_metrics(name: str) -> str:
    return f"{EVAL_MODELS}/{name}.json"


def logprobs(name: str) -> str:
    return f"{LOGPROBS}/{name}.npz"
