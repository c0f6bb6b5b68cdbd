"""`lmpipe restore`'s decision, taken before anything changes: never a source that would lose an output."""

from __future__ import annotations

import pytest

from lmpipe_cli.restore import HEAD, LOCK, WORKSPACE, _decide

MODEL, METRICS = "models/gru", "metrics/train/gru.json"


class Outputs:
    """A stage's outputs as the decision sees them: what the workspace holds (an md5 per path, None: missing), what
    DVC's cache holds, and which outputs DVC caches (the others git holds)."""

    def __init__(self, workspace: dict, cache: set, cached=(MODEL,)):
        self.outs = {MODEL: None, METRICS: None}
        self.workspace, self.cache, self.cached_outs = workspace, cache, cached

    def path(self, name):
        return name

    def cached(self, name):
        return name in self.cached_outs

    def exists(self, name):
        return self.workspace.get(name) is not None

    def in_cache(self, recorded):
        return recorded["md5"] in self.cache

    def holds(self, name, recorded):
        return self.workspace.get(name) == recorded["md5"]


def run(model: str, metrics: str) -> dict:
    return {"cmd": "python -m flows.train --model gru",
            "outs": [{"path": MODEL, "hash": "md5", "md5": model}, {"path": METRICS, "hash": "md5", "md5": metrics}]}


MINE, COMMITTED = run("mine.dir", "m1"), run("theirs.dir", "t1")  # this machine's run; the commit's, made elsewhere


def decide(workspace, cache, ours=MINE, head=COMMITTED):
    return _decide(Outputs(workspace, cache), "train@gru", ours, head, "dvc.lock")


def test_outputs_as_dvc_lock_records_them_are_left_alone_whatever_the_cache_holds():
    plan = decide({MODEL: "mine.dir", METRICS: "m1"}, cache=set())
    assert plan.source == WORKSPACE and plan.line == "nothing to restore: train@gru's outputs are as dvc.lock records them"


def test_this_machines_run_comes_back_from_the_cache_when_its_metrics_are_still_there():
    plan = decide({METRICS: "m1"}, cache={"mine.dir"})  # the model was removed, its metrics kept
    assert (plan.source, plan.cached, plan.tracked) == (LOCK, [MODEL], [])


def test_a_committed_run_comes_back_whole_from_the_cache_and_git():
    plan = decide({}, cache={"theirs.dir"}, ours=COMMITTED)
    assert (plan.source, plan.cached, plan.tracked) == (LOCK, [MODEL], [METRICS])


def test_an_uncommitted_run_whose_metrics_are_gone_gives_way_to_the_commits_run_when_the_cache_has_it():
    plan = decide({}, cache={"mine.dir", "theirs.dir"})
    assert (plan.source, plan.entry, plan.cached, plan.tracked) == (HEAD, COMMITTED, [MODEL], [METRICS])


def test_nothing_is_restored_when_the_commits_outputs_are_not_in_this_cache():
    plan = decide({}, cache={"mine.dir"})  # a clone whose study ran here, uncommitted: its metrics removed by DVC
    assert plan.source is None
    assert plan.line == ("train@gru: nothing restored, nothing changed: models/gru of HEAD's run is not in this cache, "
                         "and metrics/train/gru.json of the run dvc.lock records is in no commit; `dvc pull train@gru` "
                         "fetches HEAD's from a DVC remote that has them, or `dvc repro -s train@gru` makes them again")


@pytest.mark.parametrize("workspace", [{MODEL: "edited.dir", METRICS: "m1"}, {METRICS: "edited"}],
                         ids=["model", "metrics"])
def test_an_output_that_differs_from_every_run_is_never_replaced(workspace):
    """Such a file may be the only copy of a run nobody recorded: even with every run in the cache, nothing moves."""
    plan = decide(workspace, cache={"mine.dir", "theirs.dir"})
    changed = next(iter(p for p, md5 in workspace.items() if md5 not in ("m1", "t1")))
    assert plan.source is None and f"{changed} differs from the run dvc.lock records and would be replaced" in plan.line
    assert plan.line.endswith("keep this machine's outputs: `dvc commit train@gru`, then git commit")


def test_a_stage_never_run_here_comes_from_the_commit_or_not_at_all():
    assert decide({}, cache={"theirs.dir"}, ours=None).source == HEAD
    plan = decide({}, cache=set(), ours=None, head=None)
    assert plan.source is None and "dvc.lock records no run of it" in plan.line
