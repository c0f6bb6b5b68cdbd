"""lmpipe.stage_deps writes each stage's code deps from the import walk: an import added to a flow reaches exactly the
stages that run that flow, a dep no longer imported goes, and every other line of the pipeline files stays as it was.
(tests/test_graph.py runs its check on the committed files.)"""

from __future__ import annotations

import difflib
import shutil

import yaml

from lmpipe import codebase, stage_deps
from tests.helpers import ROOT


def copy_of_the_project(tmp_path):
    """The packages and the pipeline files, with every stage's code deps as the generator writes them."""
    for package in codebase.PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "data"))
    for pipeline in stage_deps.PIPELINES:
        (tmp_path / pipeline).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / pipeline, tmp_path / pipeline)
    stage_deps.write(tmp_path)
    return tmp_path


def texts(root) -> dict[str, str]:
    return {pipeline: (root / pipeline).read_text() for pipeline in stage_deps.PIPELINES}


def changed_lines(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return [line for pipeline in before for line in difflib.unified_diff(
        before[pipeline].splitlines(), after[pipeline].splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_an_import_added_to_a_flow_becomes_a_dep_of_exactly_the_stages_that_run_it(tmp_path, capsys):
    root = copy_of_the_project(tmp_path)
    runs_train = {f"{pipeline}:{name}" for pipeline in stage_deps.PIPELINES
                  for name, stage in yaml.safe_load((root / pipeline).read_text())["stages"].items()
                  if "flows/train.py" in stage.get("do", stage).get("deps", [])}
    assert runs_train == {"dvc.yaml:train", "seeds/dvc.yaml:seeds"}  # seeds runs the decay branches as train does
    (root / "lmpipe/newpart.py").write_text('"""A part of the training code."""\n')
    with (root / "flows/train.py").open("a") as flow:
        flow.write("\n\ndef uses_newpart():\n    from lmpipe import newpart\n\n    return newpart\n")
    before = texts(root)

    assert stage_deps.main(["--check"], root=root) == 1
    said = capsys.readouterr().out.splitlines()
    assert sorted(said) == sorted(f"{stage}: missing lmpipe/newpart.py" for stage in runs_train)

    assert stage_deps.main([], root=root) == 0
    assert "then: python .ci/relock.py 'train@*' 'seeds/dvc.yaml:seeds'" in capsys.readouterr().out
    added = changed_lines(before, texts(root))
    assert [line.replace(" ", "") for line in added] == ["+-lmpipe/newpart.py"] * 2, added
    assert stage_deps.drifts(root) == []


def test_a_dep_no_longer_imported_goes_and_the_rest_of_the_file_stays(tmp_path):
    root = copy_of_the_project(tmp_path)
    text = (root / "dvc.yaml").read_text()
    marker = "      - lmpipe/weat.py\n    params:\n      - audit.word2vec\n"
    assert text.count(marker) == 1
    (root / "dvc.yaml").write_text(text.replace(marker, "      - lmpipe/tables.py   # not imported\n" + marker))
    assert [str(d) for d in stage_deps.drifts(root)] == ["dvc.yaml:word2vec: extra lmpipe/tables.py"]

    stage_deps.write(root)
    assert (root / "dvc.yaml").read_text() == text


def test_a_package_listed_as_a_folder_covers_its_files():
    """lmpipe/models is one dep of the train stage, and no file under it is named on its own."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["train"]["do"]
    assert "lmpipe/models" in stage["deps"] and not [d for d in stage["deps"] if d.startswith("lmpipe/models/")]
    assert "lmpipe/models/rnn.py" in stage_deps.imported("flows.train")
    assert stage_deps.is_code("lmpipe/models") and not stage_deps.is_code("lmpipe/data/weat_tests.json")
