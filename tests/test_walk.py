"""docs/architecture.md's "One model's way": the walk a newcomer takes from dvc.yaml to the registry is the code's.

Checked on the code with `ast`: the walk names at most six files; dvc.yaml's train and score stages start where it
says; a file of the walk imports project code only from files later in the walk or from modules off it (the
blocks that return), so a reader never goes back to a file already left; and the Trainer's methods the walk names
come in the file in the order it names them, the order a run meets them. And by effects, as the two stages run
(tests/effects.py records them): each writes its own outputs and MLflow run and what the walk says besides,
nothing else, and every write is made in a file of the walk or in a block it names."""

from __future__ import annotations

import ast
import json
import re
import sys

import pytest
import yaml
from mlflow.tracking import MlflowClient

from lmpipe import codebase
from tests.helpers import ROOT, run

SECTION = "## One model's way, from dvc.yaml to the registry"


def walk() -> list[tuple[str, str]]:
    """(file, its item's text) for each numbered item of the section, in order."""
    text = (ROOT / "docs/architecture.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d+\. \*\*)", text)[1:]
    return [(re.match(r"\d+\. \*\*([^*]+)\*\*", item).group(1), item) for item in items]


def reached(path: str) -> set[str]:
    """The project files a file imports (lmpipe.codebase.imports_of: function-level and relative imports too), and
    through a package's __init__.py the files it re-exports from (`from lmpipe.train import Trainer`)."""
    files = codebase.imports_of(ROOT / path)
    files |= set().union(*(codebase.imports_of(f) for f in files if f.name == "__init__.py"))
    return {f.relative_to(ROOT).as_posix() for f in files}


def test_the_walk_opens_at_most_six_files_starting_where_dvc_yaml_does():
    files = [f for f, _ in walk()]
    assert files[0] == "dvc.yaml" and len(files) <= 6, files
    assert all((ROOT / f).exists() for f in files), files
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in ("train", "score"):
        command = stages[stage]["do"]["cmd"]
        assert f"python -m flows.{stage} " in command and f"flows/{stage}.py" in files, (stage, command)


def test_no_file_of_the_walk_goes_back_to_one_already_left():
    files = [f for f, _ in walk() if f.endswith(".py")]
    for i, path in enumerate(files):
        assert not reached(path) & set(files[:i]), f"{path} imports {reached(path) & set(files[:i])}"


def test_the_trainers_methods_come_in_the_order_the_walk_names_them():
    text = dict(walk())["lmpipe/train/trainer.py"]
    tree = ast.parse((ROOT / "lmpipe/train/trainer.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    lines = {f.name: f.lineno for f in trainer.body if isinstance(f, ast.FunctionDef)}
    named = [name for name in re.findall(r"`(?:Trainer\.)?(\w+)`", text) if name in lines]
    assert len(named) >= 5, named
    assert [lines[n] for n in named] == sorted(lines[n] for n in named), named


EFFECTS = "**What the two stages change, and where.**"
MLFLOW_STORE = ("mlflow.db", "mlartifacts/")  # the tracking store's files: its writes are noted as runs' and the registry's
TEMPORARY = re.compile(r"^\.(.+)\.\w{8}\.tmp$")  # lmpipe.io.atomic_path's name beside its destination


def named_in(*labels: str) -> list[str]:
    """The files and folders the bullets `labels` of the walk's paragraph on effects name: where those effects may
    be made off the walk."""
    text = (ROOT / "docs/architecture.md").read_text().split(EFFECTS, 1)[1].split("\n\n", 1)[0]
    bullets = [b for b in re.split(r"\n- ", text) if b.startswith(tuple(f"**{label}" for label in labels))]
    assert len(bullets) == len(labels), labels
    return [p for b in bullets for p in re.findall(r"`([\w/]+(?:\.py|/))`", b) if (ROOT / p).exists()]


def named_blocks() -> list[str]:
    """Where a file, a run or a registry entry may be written off the walk."""
    return named_in("Files", "MLflow")


def within(path: str, named: list[str]) -> bool:
    """Whether `path` is one of the files `named` or inside one of its folders."""
    return any(path == n or (n.endswith("/") and path.startswith(n)) for n in named)


def declared_outputs(stage: str, model: str) -> list[str]:
    """The `outs` dvc.yaml gives the foreach stage `stage` for `model`."""
    outs = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][stage]["do"]["outs"]
    return [(next(iter(o)) if isinstance(o, dict) else o).replace("${key}", model) for o in outs]


def output_of(target: str) -> str:
    """The path a write is for: a temporary name beside a destination stands for the destination."""
    return "/".join(m.group(1) if (m := TEMPORARY.match(part)) else part for part in target.split("/"))


@pytest.mark.e2e
def test_the_two_stages_change_what_the_walk_says_from_the_files_it_names(scratch, tmp_path):
    copy, env = scratch
    params = yaml.safe_load((copy / "params.yaml").read_text())  # the committed study's way: a budget, a decay branch
    params["study"] = {"budget": {"flops": 3e9}, "branches": [2]}
    params["train"]["evals_per_epoch"] = 64  # best weights saved before the branch starts (a third of the way), so
    # `_save` copies them
    gru = {k: v for k, v in params["models"]["gru"].items() if k not in ("epochs", "patience")}
    params["models"]["gru"] = {**gru, "max_steps_per_epoch": None,
                               "optim": {**gru["optim"], "schedule": "wsd", "decay_fraction": 0.25}}
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    effects = {}
    for stage in ("train", "score"):
        record = tmp_path / f"{stage}.json"
        run([sys.executable, "tests/effects.py", str(record), "-m", f"flows.{stage}", "--model", "gru"], copy, env)
        effects[stage] = json.loads(record.read_text())
    walk_files = [f for f, _ in walk()]
    blocks = named_blocks()
    assert {"lmpipe/io.py", "lmpipe/checkpoints.py", "lmpipe/tracking/"} <= set(blocks), blocks

    def made_where_said(by: str) -> bool:
        return by in walk_files or within(by, blocks)

    client = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    runs = {r.info.run_id: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}

    def run_of(stage: str) -> str:
        return next(i for i, r in runs.items() if r.data.tags.get("lmpipe.stage") == stage)

    study = {i for i, r in runs.items() if r.data.tags.get("lmpipe.role") == "study"}
    own = {"train": {run_of("train@gru")}, "score": {run_of("score@gru"), run_of("train@gru")}}
    for stage, done in effects.items():
        outputs = declared_outputs(stage, "gru")
        files = {output_of(e["target"]) for e in done if e["kind"] == "file"}
        kept = {f for f in files if not f.startswith((*MLFLOW_STORE, ".cache/lmpipe/ckpt/"))}
        assert kept == set(outputs), (stage, kept, outputs)  # every output written, nothing else of the project's
        written_runs = {e["target"] for e in done if e["kind"] == "run" and e["what"] not in (
            "create_logged_model", "finalize_logged_model", "set_logged_model_tags",  # a logged model's, not a run's
            "create_experiment")}  # a new store's experiment, made by the first stage
        assert written_runs - study == own[stage], (stage, written_runs)
        on_study = {e["what"] for e in done if e["kind"] == "run" and e["target"] in study}
        assert on_study <= {"create_run", "update_run_info"}, (stage, on_study)  # the study run opened, nothing logged
        registry = {e["target"] for e in done if e["kind"] == "registry"}
        assert registry == ({"lmpipe-gru"} if stage == "score" else set()), (stage, registry)
        makers = {e["by"] for e in done if e["kind"] not in ("env", "signal")} - {"(none)"}  # (none): MLflow's own
        # thread, sampling the run's system metrics
        assert all(made_where_said(by) for by in makers), (stage, sorted(b for b in makers if not made_where_said(b)))
        assert all(e["kind"] == "run" and e["target"] in own[stage] or e["what"] == "sqlite3.connect"  # its store
                   for e in done if e["by"] == "(none)"), stage
        made = {output_of(e["target"]) for e in done if e["kind"] == "dir"}  # an output's folder, or the caches'
        assert all(d == "." or any(o == d or o.startswith(d + "/") for o in outputs)
                   or d.startswith((".cache/", "mlartifacts")) for d in made), (stage, made)
        process = {e["by"] for e in done if e["kind"] in ("env", "signal")} - {"(none)"}
        assert all(by in walk_files or within(by, named_in("The process")) for by in process), (stage, process)
        signals = {e["target"] for e in done if e["kind"] == "signal" and e["by"] == "lmpipe/train/trainer.py"}
        assert ("SIGTERM" in signals and signals <= {"SIGINT", "SIGTERM"} if stage == "train" else not signals), (
            stage, signals)  # while it trains (SIGINT too, unless the process ignores it, as a background job does)
        databases = {e["target"] for e in done if e["what"] == "sqlite3.connect"}
        assert databases == {"mlflow.db"}, (stage, databases)  # the project's store, and no other database
    cached = {(e["by"], e["target"].rpartition("/")[2]) for e in effects["train"]
              if e["kind"] == "file" and e["target"].startswith(".cache/")}
    assert {by for by, _ in cached} == {"lmpipe/checkpoints.py", "lmpipe/train/trainer.py"}, cached  # where the walk
    assert {name for by, name in cached if by == "lmpipe/train/trainer.py"} == {"best.pt"}  # says: the checkpoints,
    # and the Trainer's `_save` copying the best weights to the decay branch's start
