"""Every script in benchmarks/ and sweeps/ runs, at a tiny size: an API change that breaks one fails here.

Each script runs as its own process, as a user starts it, in a copy of this checkout (`project`) whose params.yaml
holds tiny models and whose data/ holds a tiny corpus, so that a run takes seconds and writes nothing here. What needs
something from outside runs without it: vs_nanogpt.py against a stand-in of nanoGPT's model.py with its interface,
ngram_scale.py against a stand-in of KenLM's lmplz that checks the text it is given, serve.py on fresh tiny models
that it serves itself, overhead.py's dry run (the copy and the stages a forced repro would run; its timing needs the
whole study and a Prefect server). study.py reads this checkout's committed metrics for real. The numbers printed
mean nothing at these sizes: the tests check that each part runs and prints its lines.

The runs start together at the module's first test, as many at once as there are cores (at least two), and each
test waits for its own: the module takes about as long as its longest runs.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers import QuietHandler, http_server

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 600  # seconds a run may take on a busy machine (each takes a few on an idle one)
SMALL = {"nplm": {"emb": 8, "hidden": 16}, "rnn": {"emb": 16}, "lstm": {"emb": 16, "hidden": 16}, "gru": {"emb": 16},
         "transformer": {"dim": 16, "layers": 1, "heads": 2, "block_size": 32}}
GRID_SIZES, GRID_BUDGETS = (4, 8, 16), (2e8, 4e8)  # the tiny project's scaling grid: the GRU at three sizes
GRID_LOSSES = {2e8: (3.0, 2.9, 2.95), 4e8: (2.9, 2.8, 2.85)}  # its committed rows: each budget's minimum in between


def uses(*runs: str):
    """The runs (RUNS' names) a test reads: the module starts those the selected tests read, all at once."""
    def mark(test):
        test.runs = runs
        return test
    return mark


NANOGPT_STANDIN = '''
"""A stand-in for nanoGPT's model.py: its interface, a model of an embedding and a head."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = torch.nn.Embedding(config.vocab_size, config.n_embd)
        self.head = torch.nn.Linear(config.n_embd, config.vocab_size, bias=config.bias)

    def forward(self, idx, targets=None):
        logits = self.head(self.embed(idx))
        return logits, None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
'''

LMPLZ_STANDIN = '''
"""A stand-in for KenLM's lmplz: checks its arguments and that --text holds lines of token ids, writes --arpa."""
import sys
from pathlib import Path

args = sys.argv[1:]
value = {flag: args[i + 1] for i, flag in enumerate(args) if flag in ("-o", "-S", "-T", "--text", "--arpa")}
assert value["-o"] == "5" and value["-S"].endswith("M") and Path(value["-T"]).is_dir(), args
lines = Path(value["--text"]).read_text().splitlines()
assert lines and all(word.isdigit() for line in lines for word in line.split()), lines[:3]
Path(value["--arpa"]).write_text(f"{len(lines)} lines\\n")
'''


def tiny_text(rng: np.random.Generator, articles: int) -> str:
    """Articles as the clean corpus holds them (a title line, paragraphs, a blank line) of Zipf-distributed words."""
    words = np.array("the history of a in and is was for to".split() + [f"w{i}" for i in range(150)])
    p = 1 / np.arange(1, len(words) + 1)
    lines = []
    for a in range(articles):
        lines += [f" = Article {a} = ", *(" ".join(rng.choice(words, 60, p=p / p.sum())) for _ in range(5)), ""]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of the checkout (its tracked files and the untracked ones git does not ignore) with tiny models in its
    params.yaml (on AdamW: Muon's first step imports torch's compiler, seconds a process; muon.py and
    compile_vs_eager.py run Muon), a tiny corpus tokenized into data/tokens, and a tiny scaling grid (scaling/runs.csv,
    the GRU at three sizes and two budgets, for the sweeps' scripts)."""
    from lmpipe.config import TokenizerParams
    from lmpipe.tokenize import tokenize_corpus

    dest = tmp_path_factory.mktemp("project")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tokenizer"]["vocab_size"] = 300
    for name, arch in SMALL.items():
        params["models"][name]["arch"].update(arch)
        params["models"][name].update(batch_size=4, seq_len=16)
        params["models"][name]["optim"].update(name="adamw", warmup_steps=2)  # Muon: muon.py, compile_vs_eager.py
    params["train"].update(evals_per_epoch=1, eval_chunk=16)
    params["evaluate"]["chunk"] = 16
    params["scaling"].update(models={"gru": [{"emb": e} for e in GRID_SIZES]}, budgets=list(GRID_BUDGETS),
                             seeds={"extra": [1], "budgets": [GRID_BUDGETS[0]]})
    params["scaling"]["overrides"].update({"batch_size": 4, "seq_len": 16, "optim.warmup_steps": 2})
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    rng = np.random.default_rng(0)
    (dest / "data/clean").mkdir(parents=True)
    for split, articles in (("train", 30), ("valid", 2), ("test", 2)):
        (dest / "data/clean" / f"{split}.txt").write_text(tiny_text(rng, articles))
    tokenize_corpus(dest / "data/clean", dest / "data/tokens", TokenizerParams(**params["tokenizer"]))
    rows = [{"name": f"gru-emb{e}-C{c:.1e}", "model": "gru", "size": f"emb{e}", "budget": c, "n_params": 1000 * e,
             "valid_bpb": loss, "train_seconds": c * e / 1e8, "cache_file": f"gru-emb{e}-C{c:.1e}-old.json"}
            for c in GRID_BUDGETS for e, loss in zip(GRID_SIZES, GRID_LOSSES[c])]
    (dest / "scaling/runs.csv").write_text(
        ",".join(rows[0]) + "\n" + "".join(",".join(str(v) for v in r.values()) + "\n" for r in rows))
    (dest / "standins").mkdir()
    (dest / "standins/model.py").write_text(NANOGPT_STANDIN)
    (dest / "standins/lmplz").write_text(f"#!{sys.executable}\n{LMPLZ_STANDIN}")
    (dest / "standins/lmplz").chmod(0o755)
    return dest


# name -> (where it runs: the tiny project or this checkout, the command line after `python`); the longest first
RUNS = {
    "serve": ("project", ["benchmarks/serve.py", "--smoke", "--models", "transformer", "gru"]),
    "reuse_grid_rows": ("project", ["sweeps/reuse_grid_rows.py", "scaling/runs.csv", "--tolerance", "10", "--workers",
                                    "2"]),  # the check rows on a local Dask cluster, as the grid spreads its runs
    "transformer_ablation": ("project", ["benchmarks/transformer_ablation.py", "--budget", "3e7", "--parallel", "1",
                                         "--only", "GPT-2 recipe (2019)", "--out", "{tmp}/ablation.csv"]),
    "compile_vs_eager": ("project", ["benchmarks/compile_vs_eager.py", "--models", "modern", "--precisions", "fp32",
                                     "--steps", "2", "--backend", "eager"]),
    "study": ("checkout", ["benchmarks/study.py", "--wall-seconds", "1500", "--seeds-seconds", "3000"]),
    "grid_seed_check": ("project", ["sweeps/grid_seed_check.py", "--dry-run", "--budgets", "2e8", "4e8"]),
    "profile_step": ("project", ["benchmarks/profile_step.py", "--model", "transformer", "--warmup", "1", "--steps",
                                 "2", "--top", "3"]),
    "mfu": ("project", ["benchmarks/mfu.py", "--sizes", "16x1x2", "--steps", "4", "--batch", "2", "--seq-len", "16"]),
    "vs_nanogpt": ("project", ["benchmarks/vs_nanogpt.py", "--nanogpt", "standins", "--layers", "1", "--dim", "16",
                               "--heads", "2", "--seq-len", "16", "--batch", "2", "--steps", "2", "--warmup", "1",
                               "--rounds", "1", "--before"]),
    "train_throughput": ("project", ["benchmarks/train_throughput.py", "--steps", "2", "--models", "gru",
                                     "transformer"]),
    "train_throughput --malloc": ("project", ["benchmarks/train_throughput.py", "--child", "gru", "kept", "--steps",
                                              "2"]),  # one of --malloc's runs, each a process of its own
    "muon": ("project", ["benchmarks/muon.py", "--models", "transformer", "gru", "--steps", "2", "--rounds", "1"]),
    "muon --training-step": ("project", ["benchmarks/muon.py", "--training-step", "--models", "transformer",
                                         "--steps", "1", "--rounds", "1"]),
    "ngram": ("project", ["benchmarks/ngram.py", "--train-tokens", "1000", "--score-tokens", "100"]),
    "overhead --dry-run": ("checkout", ["benchmarks/overhead.py", "--dry-run", "--set", "corpus.max_articles=12"]),
    "ngram_scale": ("project", ["benchmarks/ngram_scale.py", "--sizes", "5000", "20000", "--held-out-copies", "1",
                                "--workers", "1", "--memory", "64MiB", "--lmplz", "standins/lmplz"]),
    "weat": ("project", ["benchmarks/weat.py", "--permutations", "200"]),
}


def environment(tmp: Path, pythonpath: Path) -> dict:
    """The run's own MLflow store, cache, Prefect home and temporary folder, this interpreter's tools first on
    PATH (dvc), one thread (several runs share the cores; none measures anything)."""
    return {**os.environ, "PYTHONPATH": str(pythonpath), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}", "LMPIPE_CACHE_DIR": str(tmp / "cache"),
            "PREFECT_HOME": str(tmp / "prefect")}


def run(name: str, project: Path, tmp: Path) -> subprocess.CompletedProcess:
    where, command = RUNS[name]
    cwd = project if where == "project" else ROOT
    tmp.mkdir(parents=True)
    done = subprocess.run([sys.executable, *(part.format(tmp=tmp) for part in command)], cwd=cwd, text=True,
                          capture_output=True, env=environment(tmp, cwd), timeout=TIMEOUT)
    done.tmp, done.cwd = tmp, cwd
    return done


@pytest.fixture(scope="module")
def runs(request, project, tmp_path_factory):
    """{name: the CompletedProcess of that run}, each waited for when asked: every run a selected test of this
    module reads starts at once, on a pool of a worker per core (at least two)."""
    wanted = {name for item in request.session.items if item.module is request.module
              for name in getattr(item.function, "runs", ())}
    root = tmp_path_factory.mktemp("runs")
    pool = ThreadPoolExecutor(max(2, min(os.cpu_count() or 2, 4)))
    started: dict[str, Future] = {name: pool.submit(run, name, project, root / re.sub(r"\W+", "-", name))
                                  for name in RUNS if name in wanted}

    class Runs:
        def __getitem__(self, name: str) -> subprocess.CompletedProcess:
            done = started[name].result()
            assert done.returncode == 0, f"{name}: exit status {done.returncode}\n{done.stdout[-3000:]}\n" \
                                         f"{done.stderr[-3000:]}"
            return done

        def finished(self, name: str) -> subprocess.CompletedProcess:
            return started[name].result()

    yield Runs()
    pool.shutdown(cancel_futures=True)


def lines(done: subprocess.CompletedProcess) -> list[str]:
    return done.stdout.splitlines()


@uses("compile_vs_eager")
def test_compile_vs_eager_trains_a_compiled_and_an_eager_run_and_compares_them(runs):
    out = lines(runs["compile_vs_eager"])
    assert len(out) == 1 and re.fullmatch(r"modern, fp32 \(fp32 on \w+\): valid bpb relative difference \S+; "
                                          r"largest \|difference\|: .+", out[0]), out


@uses("mfu")
def test_mfu_times_each_size_given(runs):
    out = lines(runs["mfu"])
    assert out[0].startswith("device: ") and "batch 2 x 16, 4 steps, compile False" in out[0]
    assert out[1].split("|")[0].split() == ["size", "params"]
    assert len(out) == 3 and re.match(r"\s+1 x 16\s+[\d,]+ \|", out[2]), out


@uses("muon", "muon --training-step")
def test_muon_times_the_optimiser_step_and_the_training_step(runs):
    out = lines(runs["muon"])
    assert out[0].startswith("device: ") and "1 rounds of 2 steps each" in out[0]
    assert [line.split(":")[0] for line in out[1:]] == ["transformer", "gru"]
    assert all(re.search(r"matrices in \d+ shapes; per step torch.optim.Muon [\d.]+ ms, BatchedMuon [\d.]+ ms", line)
               for line in out[1:]), out
    out = lines(runs["muon --training-step"])
    assert len(out) == 2 and out[1].startswith("transformer: fp32 training step, Muon's chain in bf16 "), out


@uses("ngram")
def test_ngram_compares_lmpipe_and_nltk_at_both_orders(runs):
    out = runs["ngram"].stdout
    assert "subsample: 1000 train tokens, 100 scored tokens (both libraries)" in out
    for order in (3, 5):
        assert re.search(rf"order {order}: lmpipe is \d+x faster than NLTK at build\+score on the same subsample", out)
        for what in ("lmpipe (subsample)", "nltk (subsample)", "lmpipe (full corpus)"):
            assert re.search(rf"^\s+{order} {re.escape(what)}\s+[\d.]+", out, re.MULTILINE), (order, what)
    assert "process peak RSS" in out


@uses("ngram_scale")
def test_ngram_scale_builds_and_scores_each_size_and_compares_with_lmplz(runs):
    out = lines(runs["ngram_scale"])
    assert out[0] == "order 5, memory bound 64MiB, 1 workers; relabelled copies of the default train split"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in out[3:]]
    assert [row[0] for row in rows] == ["5e+03", "2e+04"]
    for row in rows:
        assert len(row) == 10 and "-" not in row, row  # lmplz's columns too (the stand-in's)
        float(row[2]), float(row[6]), float(row[8])


@uses("overhead --dry-run")
def test_overhead_copies_the_project_and_lists_the_stages_a_forced_repro_runs(runs):
    out = lines(runs["overhead --dry-run"])
    stages = out[-1].split(": ", 1)[1].split(", ")
    assert out[-1].startswith(f"dvc repro --force would run {len(stages)} stages: ")
    assert stages[:4] == ["download", "prepare", "validate", "tokenize"] and stages[-1] == "publish"
    assert {f"train@{name}" for name in yaml.safe_load((ROOT / "params.yaml").read_text())["models"]} <= set(stages)


def test_a_models_decays_need_their_fraction_of_each_branch_and_a_model_of_its_own_length_none():
    """benchmarks/study.py's bar beside the branches' time: decay_fraction x (C/16 + C/8 + C/4 + C/2) / C for a
    model on the study's budget, 0 for one with epochs of its own (no branches, perhaps no decay_fraction at all)."""
    import importlib.util

    from lmpipe.config import parse_params

    spec = importlib.util.spec_from_file_location("study_benchmark", ROOT / "benchmarks/study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    gru = raw["models"]["gru"]
    raw["models"]["grucosine"] = {**gru, "epochs": 1, "patience": 3, "optim": {**{k: v for k, v in gru["optim"].items()
                                                                   if k != "decay_fraction"}, "schedule": "cosine"}}
    raw["study"]["branches"] = [16, 8, 4, 2]
    params = parse_params(raw)
    whole = sum(1 / k for k in (16, 8, 4, 2))
    assert study.decay_share(params, "gru") == pytest.approx(params.models["gru"].optim.decay_fraction * whole)
    assert study.decay_share(params, "rnn") == pytest.approx(params.models["rnn"].optim.decay_fraction * whole)
    assert study.decay_share(params, "grucosine") == 0.0


def test_study_holds_the_grid_to_c_and_the_study_s_models_to_the_grid_s_best(tmp_path, monkeypatch):
    """The compute-optimal targets on a grid that reaches C with three seeds at every family's best size: they hold
    while each study model is within noise of the grid's best at C, and one model beyond noise behind it misses."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("study_benchmark", ROOT / "benchmarks/study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    monkeypatch.setattr(study, "ROOT", tmp_path)
    c, families = 3e13, ("gru", "lstm", "nplm", "rnn", "transformer")
    point = {"bracketed": True, "edge": None}
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/scaling.json").write_text(json.dumps({
        "families": {m: {"isoflop": [{**point, "budget": b} for b in (c / 4, c / 2, c)]} for m in families},
        "frontier": {m: [{"budget": b, "valid_bpb": 2.2, "seed_sd": 0.002, "seeds": 3} for b in (c / 2, c)]
                     for m in families}}))
    for m in families:  # the same tuning runs for every family
        (tmp_path / f"sweeps/equal/{m}").mkdir(parents=True)
        (tmp_path / f"sweeps/equal/{m}/trials.csv").write_text("number,valid_bpb,optim.lr,train_flops\n0,2.2,0.004,3e13\n")
    (tmp_path / "sweeps/equal.yaml").write_text("")
    seed_rows = [{"model": m, "valid_bpb": 2.2 + d} for m in families for d in (-0.002, 0.0, 0.002)]
    report = "## Loss by context position\n"
    held = study.compute_optimal_targets(c, seed_rows, report)
    assert [r[2] for r in held] == [True] * 5, held
    behind = [{**r, "valid_bpb": r["valid_bpb"] + 0.02} if r["model"] == "gru" else r for r in seed_rows]
    missed = dict((t, (m, ok)) for t, m, ok in study.compute_optimal_targets(c, behind, report))
    assert missed["the study's models at C: the grid's best size, or within noise of it"] == (
        "behind the grid's best: gru", False)
    (tmp_path / "metrics/scaling.json").write_text(json.dumps({"families": {m: {"isoflop": [{**point, "budget": c / 4}]}
                                                                          for m in families}, "frontier": {}}))
    short = dict((t, (m, ok)) for t, m, ok in study.compute_optimal_targets(c, seed_rows, report))
    assert short["grid: every family at C/2 and at C (lmpipe scaling)"] == ("largest budget C/4.00", False)


def test_overhead_sums_the_task_runs_prefect_reports():
    """Its compute: the task runs' total run time since the start, from Prefect's API (here a stand-in of it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("overhead", ROOT / "benchmarks/overhead.py")
    overhead = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overhead)
    asked = []

    class Prefect(QuietHandler):
        def do_POST(self):
            asked.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            body = json.dumps([{"total_run_time": 1.5}, {"total_run_time": 2.25}]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with http_server(Prefect) as url:
        assert overhead.task_seconds(url, "2026-01-01T00:00:00Z") == 3.75
    assert asked == [("/task_runs/filter", {"task_runs": {"start_time": {"after_": "2026-01-01T00:00:00Z"}},
                                            "limit": 200})]


@uses("profile_step")
def test_profile_step_splits_a_training_step_into_its_parts(runs):
    out = runs["profile_step"].stdout
    assert re.search(r"^transformer: 4 x 16 tokens a step, [\d.]+ GFLOP; median step", out, re.MULTILINE), out
    assert "self CPU time of the aten operators, by part of the step:" in out
    assert re.search(r"^  optimiser: \w+ +[\d.]+%", out, re.MULTILINE) and "top 3 operators:" in out


@uses("serve")
def test_serve_decodes_filters_and_serves(runs):
    out = runs["serve"].stdout
    for model in ("transformer", "gru"):
        for strategy, new in (("beam", 4), ("greedy", 8)):
            assert re.search(rf"^\| {model} \| {strategy} \| {new} \| [\d.]+ \| [\d.]+ \| [\d.]+x \|$", out,
                             re.MULTILINE), (model, strategy)
    assert len(re.findall(r"^\| [\d.]+ \| \d+ \| \d+ \| \d+ \| [\d.]+x \|$", out, re.MULTILINE)) == 6  # top-p
    assert "## Serving transformer" in out and "## Serving gru" not in out  # the first model only
    assert re.search(r"^\| 1 short prompt, 4 new \| 200 \| [\d.]+ \|$", out, re.MULTILINE)
    assert re.search(r"^A small request 1 s into the first \(200 in [\d.]+ s\): 200 in", out, re.MULTILINE)
    assert len(re.findall(r"^3 small requests at once \([^)]+\): 3 answered", out, re.MULTILINE)) == 2


@uses("study")
def test_study_checks_every_target_on_the_committed_numbers(runs):
    """study.py on this checkout's committed metrics (its MLflow store an empty one: the speed targets find no run,
    and say so): every target a line of its own, held or missed."""
    done = runs.finished("study")
    assert done.returncode in (0, 1), done.stderr[-3000:]
    out = lines(done)
    assert all(line.endswith(("  holds", "  MISSED")) for line in out), out
    targets = [re.split(r"\s{2,}", line)[0] for line in out]
    names = yaml.safe_load((ROOT / "params.yaml").read_text())["models"]
    assert targets[0] == "study.budget C >= 3e+13 FLOPs"
    for name in names:
        assert f"{name}: training FLOPs within 1% of C" in targets
        assert f"{name}: training >= 100 GFLOP/s (its MLflow run)" in targets
    for target in ("transformer: test bpb below KN-5's", "best model (transformer): test word ppl >= 15% below",
                   "transformer: mean test bpb over 3 seeds below KN-5 by > 2 sd, <= 2.00",
                   "grid: IsoFLOP minimum bracketed at every budget of every family",
                   "the report compares the grid with the study at the budgets both have",
                   "nplm+ngram: test bpb below KN-5's", "grid: every family at C/2 and at C",
                   "grid: 3 seeds at each family's best size at C/2 and at C",
                   "the study's models at C: the grid's best size, or within noise of it",
                   "tuning: the same runs at C for every family", "the report draws the loss by context position"):
        assert any(t.startswith(target) for t in targets), target
    rnn = [float(r["test_bpb"]) for r in csv.DictReader((ROOT / "seeds/seeds.csv").open()) if r["model"] == "rnn"]
    shown = re.search(r"^rnn: test bpb below KN-5's [\d.]+\s+([\d.]+) ± [\d.]+ \((\d) seeds\): ", done.stdout, re.MULTILINE)
    assert shown and float(shown.group(1)) == round(sum(rnn) / len(rnn), 4) and int(shown.group(2)) == len(rnn)
    assert re.search(r"^whole default dvc repro within 30 min\s+25\.0 min  holds$", done.stdout, re.MULTILINE)
    assert re.search(r"^lmpipe seeds within 60 min\s+50\.0 min  holds$", done.stdout, re.MULTILINE)


@uses("train_throughput", "train_throughput --malloc")
def test_train_throughput_compares_the_trainer_with_a_bare_loop_and_counts_a_malloc_run(runs):
    out = lines(runs["train_throughput"])
    assert " ".join(out[0].split()) == "model lmpipe tok/s bare tok/s ratio"
    assert [line.split()[0] for line in out[1:]] == ["gru", "transformer"]
    assert all(float(line.split()[3]) > 0 for line in out[1:]), out
    usage = json.loads(lines(runs["train_throughput --malloc"])[-1])  # what --malloc reads of each of its runs
    assert usage["tokens"] == 2 * 4 * 16 and usage["steps"] == 2 and usage["cpu"] > 0 and usage["faults"] >= 0


@uses("transformer_ablation")
def test_transformer_ablation_trains_a_row_and_keeps_it_when_run_again(runs):
    done = runs["transformer_ablation"]
    out = lines(done)
    row = json.loads(out[0])
    assert row["row"] == "GPT-2 recipe (2019)" and row["settings"].startswith("budget={flops: 3e+07} ")
    assert out[1:3] == ["| row | valid bpb | test bpb | train s |", "|---|---|---|---|"]
    assert out[3].startswith("| GPT-2 recipe (2019) | ") and len(out) == 4
    again = subprocess.run([sys.executable, *(p.format(tmp=done.tmp) for p in RUNS["transformer_ablation"][1])],
                           cwd=done.cwd, capture_output=True, text=True, env=environment(done.tmp, done.cwd),
                           timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert lines(again) == out[1:]  # the row in the CSV kept: nothing trained, the same table


@uses("vs_nanogpt")
def test_vs_nanogpt_times_both_sides_and_lmpipe_before(runs):
    out = lines(runs["vs_nanogpt"])
    assert out[0].startswith("device ") and "1 x 16, 2 heads, T 16, B 2, V 300" in out[0]
    assert re.match(r"round 1: nanoGPT [\d,]+ tokens/s, lmpipe [\d,]+ tokens/s, ratio [\d.]+; lmpipe before [\d,]+ "
                    r"tokens/s, now / before [\d.]+$", out[1]), out
    assert out[2].startswith("median: nanoGPT ") and out[3].startswith("lmpipe before: ")


@uses("weat")
def test_weat_runs_every_test_on_every_embedding(runs):
    out = lines(runs["weat"])
    assert len(out) == 1 and re.match(r"\d+ WEAT runs \(6 embeddings x \d+ tests, covered ones\), [\d,]+ "
                                      r"permutations in all: [\d.]+ s", out[0]), out


@uses("grid_seed_check")
def test_grid_seed_check_lists_the_runs_around_each_minimum(runs):
    out = lines(runs["grid_seed_check"])
    assert out == ["6 of 6 points to train"] + [f"gru-emb{e}-C{c:.1e}-seed1" for c in GRID_BUDGETS for e in GRID_SIZES]


@uses("reuse_grid_rows")
def test_reuse_grid_rows_checks_the_cheapest_row_and_carries_the_rest(runs):
    done = runs["reuse_grid_rows"]
    out = lines(done)
    assert re.fullmatch(r"gru-emb4-C2\.0e\+08: valid bpb [\d.]+ now, 3\.0 committed \([-+][\d.e+-]+\)", out[0]), out
    assert "grid-checks" in done.stderr and "dask" in done.stderr.lower()  # on a local Dask cluster's workers
    rows = done.tmp / "cache/scaling/runs"
    assert out[1].startswith("0 rows made under today's keys carried as they are; reproduced: gru in "
                             "scaling/runs.csv (within ")  # every committed row here is of another key
    assert out[1].endswith(f"; 5 rows carried into {rows}; 3 points of the grid have no committed row")
    kept = {row["name"]: row for row in (json.loads(path.read_text()) for path in rows.glob("*.json"))}
    assert sorted(row["carried_from"] for row in kept.values() if "carried_from" in row) == sorted(
        f"gru-emb{e}-C{c:.1e}-old.json" for c in GRID_BUDGETS for e in GRID_SIZES if (e, c) != (4, 2e8))
    check = kept["gru-emb4-C2.0e+08"]  # the check row, trained and kept as a row of today's key (--export commits it)
    assert "carried_from" not in check and check["valid_bpb"] == float(out[0].split()[3])
    assert check["budget"] == 2e8 and check["size"] == "emb4" and check["tokens"] > 0
