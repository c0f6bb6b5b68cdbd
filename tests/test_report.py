"""The study report builds from metrics files alone and carries every section."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from lmpipe.paths import PERPLEXITY_PLOT as PERPLEXITY
from lmpipe.report import build_report
from tests.helpers import ROOT, fixture_study, has_row, table_rows, write



def test_report_has_every_section(tmp_path):
    fixture_study(tmp_path)
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()
    for heading in ("## Corpus", "## Tokenizer", "## Perplexity", "## Learning curves", "## Decoding samples",
                    "## Bias audit (WEAT)"):
        assert heading in md
    table = md[md.index("## Perplexity"):md.index("## Learning curves")]
    assert [row[0] for row in table_rows(table)[1:4]] == ["transformer", "ngram (baseline)", "lstm"]
    assert ["transformer", "5,000,000 (1,000,000)", "1,200,000 (2.0 ep.)", "3.40e13", "1", "1.900", "1.800", "570",
            "-0.200 (-20.8%)"] in table_rows(table)
    assert "Behind the baseline in bpb: lstm." in table
    first = md.split("## ")[0]  # the answer comes before any section
    assert "**Best model: transformer**, test 1.800 (1 seed) bpb, 0.300 bpb below lstm; 0.200 bpb below the KN-5 " \
           "baseline, a word perplexity 20.8% lower." in first
    assert has_row(md, "flowers_insects: Flowers vs insects", "1.20 (p=0.010, q=0.010)")
    assert has_row(md, "math_arts", "n/a [2/8/20/20]")
    html = (tmp_path / "reports/study.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "<table>" in html
    assert (tmp_path / "reports/figures/learning_curves.png").stat().st_size > 1000
    with open(tmp_path / "plots/compute.csv") as f:  # `dvc plots show`'s one axis of FLOPs for every model
        rows = list(csv.DictReader(f))
    curves = {p.stem: list(csv.DictReader(open(p))) for p in (tmp_path / "plots/train").glob("*.csv")}
    assert {r["model"] for r in rows} == {name for name, c in curves.items() if "flops" in c[0]} != set()
    for name, curve in curves.items():
        if "flops" in curve[0]:
            assert [(float(r["flops"]), float(r["valid_bpb"])) for r in rows if r["model"] == name] == \
                   [(float(r["flops"]), float(r["valid_bpb"])) for r in curve]


def test_report_without_audit_says_so(tmp_path):
    fixture_study(tmp_path, with_weat=False)
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()
    assert "The audit stage has not run yet." in md


def test_one_small_metrics_file_per_model_best_first(tmp_path):
    """metrics/models/<rank>-<model>.json: the rows `dvc metrics show` lists (by path: best first), a few keys, from
    the report's source (lmpipe.results), as the publish stage writes them."""
    from lmpipe import summaries
    from lmpipe.results import load_results

    fixture_study(tmp_path)
    (tmp_path / "metrics/models").mkdir()
    (tmp_path / "metrics/models/9-gone.json").write_text("{}")  # a model no longer shown: its file goes
    results = load_results(tmp_path)
    summaries.write(tmp_path, results.spreads, results.trained, "KN-5")
    rows = {p.name: json.loads(p.read_text()) for p in sorted((tmp_path / "metrics/models").glob("*.json"))}
    assert rows == {
        "1-transformer.json": {"bpb": 1.8, "vs_kn5": -0.2, "tflop": 34.0},
        "2-ngram.json": {"bpb": 2.0},
        "3-lstm.json": {"bpb": 2.1, "vs_kn5": 0.1, "tflop": 34.0},
    }


def test_dvc_plots_page_draws_offline():
    """The page carries Vega, Vega-Lite and vega-embed itself: no script from a CDN, vegaEmbed defined globally."""
    import re

    import vl_convert

    from lmpipe.report import dvc_plots_template

    page = dvc_plots_template()
    assert "{plot_divs}" in page and "window.vegaEmbed=" in page
    assert not re.search(r"<script[^>]+src=", page) and "cdn.jsdelivr" not in page
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v5.json", "data": {"values": [{"x": 1, "y": 2}]},
            "mark": "line", "encoding": {"x": {"field": "x", "type": "quantitative"},
                                         "y": {"field": "y", "type": "quantitative"}}}
    assert "<svg" in vl_convert.vegalite_to_svg(spec, vl_version="5.21")  # the inlined version compiles DVC's v5 specs


def test_a_removed_models_leftovers_never_reach_the_report(tmp_path, monkeypatch):
    """DVC keeps the outputs of a stage it no longer has: the joining stages delete what dvc.lock records of a removed
    model's stages, and nothing else (a user's own files beside them stay); the report reads only params.yaml's
    models."""
    import yaml

    from flows.report import drop_removed

    fixture_study(tmp_path)
    write(tmp_path / "metrics/train/nplm.json", {"n_params_non_embedding": 1, "tokens_seen": 1, "epochs": 1.0,
                                                 "train_flops": 1e12})
    write(tmp_path / "plots/train/nplm.csv", "epoch,flops,valid_bpb\n1,1e13,9.9\n")
    md = build_report(tmp_path, tmp_path / "reports", ["lstm", "transformer"], label="KN-5").read_text()
    assert "nplm" not in md
    for name in ("nplm", "ngram", "lstm"):  # what score@<model> and score_ngram write
        write(tmp_path / f"metrics/eval/{name}.json", {})
        write(tmp_path / f"data/logprobs/{name}.npz", "")
    (tmp_path / "models/nplm").mkdir(parents=True)
    write(tmp_path / "models/nplm/model.pt", "")
    write(tmp_path / "data/logprobs/.gitignore", "/ngram.npz\n/lstm.npz\n/nplm.npz\n")
    users = ["plots/train/my_baseline.csv", "metrics/eval/my_notes.json", "metrics/train/old.json"]
    for name in users:
        write(tmp_path / name, "mine")
    outs = {"train@nplm": ["models/nplm", "metrics/train/nplm.json", "plots/train/nplm.csv"],
            "score@nplm": ["metrics/eval/nplm.json", "data/logprobs/nplm.npz"],
            "score@lstm": ["metrics/eval/lstm.json", "data/logprobs/lstm.npz"]}
    lock = {"schema": "2.0", "stages": {stage: {"cmd": "x", "outs": [{"path": p, "md5": "0"} for p in paths]}
                                        for stage, paths in outs.items()}}
    write(tmp_path / "dvc.lock", yaml.safe_dump(lock))
    monkeypatch.chdir(tmp_path)
    gone = drop_removed(["lstm", "transformer"])
    assert sorted(p.as_posix() for p in gone) == ["data/logprobs/nplm.npz", "metrics/eval/nplm.json",
                                                  "metrics/train/nplm.json", "models/nplm", "plots/train/nplm.csv"]
    assert (tmp_path / "data/logprobs/.gitignore").read_text() == "/ngram.npz\n/lstm.npz\n"
    assert sorted(p.name for p in (tmp_path / "metrics/eval").iterdir()) == ["lstm.json", "my_notes.json", "ngram.json"]
    assert sorted(p.name for p in (tmp_path / "plots/train").iterdir()) == ["lstm.csv", "my_baseline.csv",
                                                                            "transformer.csv"]
    assert all((tmp_path / name).read_text() == "mine" for name in users)
    assert set(yaml.safe_load((tmp_path / "dvc.lock").read_text())["stages"]) == {"score@lstm"}


def test_an_evaluation_that_does_not_cover_the_models_is_refused_in_one_line(tmp_path, monkeypatch):
    import pytest

    from flows.report import check_covers
    from lmpipe.errors import LmpipeError

    fixture_study(tmp_path)
    monkeypatch.chdir(tmp_path)
    check_covers(["lstm", "transformer"])
    with pytest.raises(LmpipeError, match=r"metrics/eval.json covers \['lstm', 'transformer'\], params.yaml's "
                                          r"models are \['gru', 'lstm', 'transformer'\] \(run the whole pipeline"):
        check_covers(["lstm", "transformer", "gru"])


def test_an_experiments_report_says_it_is_one(tmp_path):
    fixture_study(tmp_path)
    md = build_report(tmp_path, tmp_path / "reports", experiment="lanky-bass", label="KN-5").read_text()
    assert "**Experiment `lanky-bass`** (`dvc exp run`)" in md.splitlines()[2]
    assert "Experiment" not in build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()


def test_the_readmes_results_block_is_the_committed_metrics(tmp_path):
    """README.md's results table is generated (python -m lmpipe.readme README.md), never typed: it must equal what the
    metrics of its own revision give. A committed README, HEAD's metrics (a study re-run on another CPU rounds
    otherwise and rewrites metrics/ in the working tree, which .ci/reproduced.py allows, not the README); a README
    changed in the working tree (regenerated before committing both), the working tree's."""
    import subprocess
    import tarfile

    from lmpipe.readme import sync_results

    edited = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "README.md"]).returncode != 0
    root = ROOT
    if not edited:
        archive, root = tmp_path / "head.tar", tmp_path / "head"
        subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), "HEAD",
                        "params.yaml", "metrics", "seeds/seeds.csv"], check=True)
        with tarfile.open(archive) as tar:
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4 (Debian 12: 3.11.2)
            tar.extractall(root, **safe)
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    assert not sync_results(readme, root, root / "params.yaml"), \
        (f"README.md's results differ from {'the working tree' if edited else 'HEAD'}'s metrics: "
         "run python -m lmpipe.readme README.md")
    assert has_row(readme.read_text(), "gru")
    machine = json.loads((root / "metrics/train/gru.json").read_text())["machine"]
    assert f"Trained on {machine} (" in readme.read_text()  # the committed numbers' machine, as the report names it


def test_a_model_off_the_study_budget_is_marked_and_left_out_of_the_verdicts(tmp_path):
    """Families compare at equal compute: the headline names the one budget, and a model that had other compute
    (a budget of its own, a run stopped early) is shown as not compute-matched, never named the best."""
    fixture_study(tmp_path)
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5", budget_flops=3.4e13).read_text()
    assert "**Equal compute**: every neural model trained 3.40e13 FLOPs (`study.budget`, within 1%)" in md
    assert "not compute-matched" not in md
    write(tmp_path / "metrics/train/transformer.json", {"n_params_non_embedding": 1_000_000, "tokens_seen": 2_400_000,
                                                        "epochs": 4.0, "train_flops": 6.8e13})
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5", budget_flops=3.4e13).read_text()
    assert "**Equal compute**: lstm trained 3.40e13 FLOPs" in md
    assert "Not compute-matched, shown but left out of every verdict: transformer (6.80e13 FLOPs)." in md
    assert has_row(md, "transformer (not compute-matched)", "5,000,000 (1,000,000)", "2,400,000 (4.0 ep.)", "6.80e13")
    assert "**Best model: lstm**, test 2.100 (1 seed) bpb" in md  # the transformer's 1.800 had twice the compute
    assert "**transformer**" not in md
    # within 1% is the same budget: a run's FLOPs land on whole steps
    write(tmp_path / "metrics/train/transformer.json", {"n_params_non_embedding": 1_000_000, "tokens_seen": 1_200_000,
                                                        "epochs": 2.0, "train_flops": 3.4e13 * 1.009})
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5", budget_flops=3.4e13).read_text()
    assert "not compute-matched" not in md and "**Best model: transformer**" in md
    # a budget of its own is the stated exception, even where it lands on the study's
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5", budget_flops=3.4e13,
                      budget_exceptions=["transformer"]).read_text()
    assert has_row(md, "transformer (not compute-matched)") and "**Best model: lstm**" in md


def test_the_report_names_settings_and_data_not_the_code_commit(tmp_path, monkeypatch):
    """A code change that leaves the numbers as they were leaves the report's header as it was; a settings change
    moves it."""
    from flows.report import made_from

    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics/corpus.json").write_text(json.dumps({"source": "enwiki-sample",
                                                               "sha256": {"train.txt": "ab" * 32}}))
    (tmp_path / "params.yaml").write_text("train:\n  seed: 0\n")
    first = made_from("params.yaml")
    assert "`enwiki-sample` (train.txt sha256 `abababababab`)" in first and "commit" not in first
    (tmp_path / "params.yaml").write_text("train:\n  seed: 1\n")
    assert made_from("params.yaml") != first


def test_dvc_plots_draws_test_bpb_sorted_not_from_zero_with_the_baseline_dashed(tmp_path):
    """`dvc plots show`'s test-bpb chart (the committed plots/eval/perplexity.csv through dvc.yaml's template): the
    models top to bottom from best to worst, an axis that does not start at 0 (1.92 and 2.07 must look apart), and
    the n-gram baseline as a dashed line."""
    import re
    import subprocess
    import sys

    import vl_convert

    out = subprocess.run([str(Path(sys.executable).parent / "dvc"), "plots", "show", "--json", PERPLEXITY],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    spec = json.loads(out)["data"][PERPLEXITY][0]["content"]
    svg = vl_convert.vegalite_to_svg(json.dumps(spec))
    rows = {r["model"]: float(r["test_bpb"]) for r in csv.DictReader((ROOT / PERPLEXITY).open())}
    labels = re.findall(r'translate\(-?[\d.]+,([\d.]+)\)"[^>]*>(' + "|".join(rows) + r")</text>", svg)
    drawn = [name for _, name in sorted(labels, key=lambda label: float(label[0]))]
    assert drawn == sorted(rows, key=rows.get)
    ticks = [float(t) for t in re.findall(r">(\d+\.\d+)</text>", svg) if float(t) not in rows.values()]
    assert min(ticks) > 1.0 and "stroke-dasharray" in svg


def test_the_committed_report_is_made_from_the_committed_params():
    """The report names the digest of the params.yaml it was made from: the committed report's must be the committed
    params.yaml's, or a change to the settings was relocked without re-making the report (a stale result, silent)."""
    import hashlib
    import re

    digest = hashlib.sha256((ROOT / "params.yaml").read_bytes()).hexdigest()[:12]
    for page in ("reports/study.md", "reports/study.html"):
        named = re.findall(r"params\.yaml(?:</code>|`) \(sha256 (?:<code>|`)([0-9a-f]{12})", (ROOT / page).read_text())
        assert named == [digest], (f"{page} names params.yaml {named}, the file is {digest}: re-make the report "
                                   "(dvc repro --force --single-item report; DVC itself skips it for an edit to "
                                   "params.yaml's comments)")
