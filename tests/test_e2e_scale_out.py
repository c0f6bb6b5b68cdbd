"""Scale-out on a copy of the studied project: a local Dask or Ray cluster, torchrun on two processes, and a team's
MLflow and Prefect on PostgreSQL with one DVC remote."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import requests
from mlflow.tracking import MlflowClient

from lmpipe.io import sha256_tree

from tests.helpers import (MODELS, STAGES, ask_prefect, newest_flow_run_state, override, ran_stages, run, start_serving,
                           stop)

pytestmark = pytest.mark.e2e
# `make test` runs on pytest-xdist's workers (tests/conftest.py): these tests form a group of their own,
# which a second worker runs beside a second copy of the study.
SECOND_STUDY = ("test_study_flow_trains_the_models_in_parallel_on_a_local_cluster",
                "test_torchrun_runs_a_train_stage_on_two_processes_and_dvc_commit_records_it",
                "test_a_team_shares_one_mlflow_and_prefect_on_postgresql_and_one_dvc_remote")


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["dask", "ray"])
def test_study_flow_trains_the_models_in_parallel_on_a_local_cluster(scratch, prefect_api, runner):
    """orchestration.task_runner=dask|ray: train stages run as overlapping tasks on a 127.0.0.1 cluster, DVC stays exact."""
    from datetime import datetime

    if runner == "ray":
        pytest.importorskip("prefect_ray", reason="the optional [ray] extra is not installed")
    copy, env = scratch
    retrained = ("gru", "transformer")  # two train stages stale: two tasks for the two workers, half the minutes of five
    before = {m: json.loads((copy / f"metrics/train/{m}.json").read_text()) for m in retrained}
    params = copy / "params.yaml"
    override(params, {"orchestration": {"task_runner": runner, "workers": 2}})
    for model in retrained:  # make their train stages stale and really train again (no resumable checkpoint)
        shutil.rmtree(copy / f"models/{model}")
    shutil.rmtree(copy / ".cache/lmpipe/ckpt", ignore_errors=True)
    done = run([sys.executable, "-m", "flows.study"], copy, env)
    assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout) == {}  # dvc.lock records the tasks
    for model in retrained:
        after = json.loads((copy / f"metrics/train/{model}.json").read_text())
        assert after["valid_ppl"] == pytest.approx(before[model]["valid_ppl"], rel=1e-4)
        assert (copy / f"models/{model}/model.pt").exists()
    flow_runs = ask_prefect("POST", f"{prefect_api}/flow_runs/filter", json={
        "flows": {"name": {"any_": ["train-models"]}}, "sort": "START_TIME_DESC", "limit": 50}).json()
    models_run = [r for r in flow_runs if r["state_type"] == "COMPLETED"]
    assert models_run, done.stdout[-2000:]
    tasks = ask_prefect("POST", f"{prefect_api}/task_runs/filter", json={
        "flow_runs": {"id": {"any_": [models_run[0]["id"]]}}, "limit": 50}).json()
    spans = sorted((datetime.fromisoformat(t["start_time"]), datetime.fromisoformat(t["end_time"]))
                   for t in tasks if t["name"].startswith("train@"))
    assert len(spans) == len(retrained)
    assert spans[1][0] < spans[0][1]  # side by side
    assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout) == {}  # orchestration is no stage param


@pytest.mark.slow
def test_torchrun_runs_a_train_stage_on_two_processes_and_dvc_commit_records_it(scratch, prefect_api):
    """The scale-out recipe: `torchrun -m flows.train` (gloo on CPU), then `dvc commit`; one tracked flow run."""
    copy, env = scratch
    env = {**env, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "flows.train",
         "--model", "gru"], copy, env)
    assert not list((copy / ".cache/lmpipe/ckpt").glob("gru-*-x2"))  # a finished run drops its checkpoints
    run(["dvc", "commit", "--force", "train@gru"], copy, env)
    assert "train@gru" not in json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout)
    flow_runs = ask_prefect("POST", f"{prefect_api}/flow_runs/filter", json={
        "flow_runs": {"name": {"any_": ["train@gru"]}}, "sort": "START_TIME_DESC", "limit": 1}).json()
    assert flow_runs[0]["state_type"] == "COMPLETED"
    run(["dvc", "repro"], copy, env)  # evaluate and the rest follow the new model
    assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], copy, env).stdout) == {}


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))),
                    reason="PostgreSQL's server programs are not installed (Debian: apt install postgresql-15)")
def test_a_team_shares_one_mlflow_and_prefect_on_postgresql_and_one_dvc_remote(committed, tmp_path_factory):
    """`lmpipe team up`; clone A records its study on the team's servers and pushes to the remote; clone B, a fresh
    clone, pulls and reproduces without training; B's retrain registers a version A sees; `team down` leaves no
    server behind."""
    import tempfile

    from tests.helpers import free_port

    a, env = committed
    folder = Path(tempfile.mkdtemp(prefix="lmpipe-team-", dir="/tmp"))  # PostgreSQL's own user must reach it
    folder.chmod(0o755)
    ports = {"postgres": free_port(), "mlflow": free_port(), "prefect": free_port()}
    up = ["lmpipe", "team", "up", "--dir", str(folder / "team")] + [f"--{k}-port={v}" for k, v in ports.items()]
    try:
        said = run(up, a, env, timeout=600).stdout
        exports = dict(re.findall(r"export (\w+)=(\S+)", said))
        assert exports == {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{ports['mlflow']}",
                           "PREFECT_API_URL": f"http://127.0.0.1:{ports['prefect']}/api"}, said
        remote = re.search(r"dvc remote add --local --force -d team (\S+)", said).group(1)
        team = {**env, **exports}
        server = MlflowClient(exports["MLFLOW_TRACKING_URI"])
        assert run(up, a, env).stdout == said  # a second `up` finds them running

        run(["lmpipe", "check-params", "--store"], a, team)
        studied = run(["dvc", "repro", "--force", "--single-item", *STAGES], a, team, timeout=1800)  # A's study, on
        assert ran_stages(studied.stdout) == set(STAGES)                                  # the team's servers
        stages_run = {r.data.tags.get("lmpipe.stage") for r in server.search_runs(
            [server.get_experiment_by_name("lmpipe").experiment_id])}
        assert set(STAGES) <= stages_run  # every stage's run on the team's server, nothing left to make afterwards
        assert run(["git", "status", "--porcelain"], a, team).stdout == ""  # bit for bit, as before
        champion = {m: server.get_model_version_by_alias(f"lmpipe-{m}", "champion") for m in MODELS}
        assert all(v.tags["lmpipe.output_sha256"] == sha256_tree(a / f"models/{m}") for m, v in champion.items())
        ui = run(["lmpipe", "ui"], a, team, timeout=60).stdout  # the server is the UI: links to it, nothing started
        assert f"the models this workspace holds, best test bpb first: {exports['MLFLOW_TRACKING_URI']}/#/" in ui
        assert f"gru v{champion['gru'].version}" in ui.splitlines()[-1]
        run(["dvc", "remote", "add", "--local", "-d", "team", remote], a, team)
        run(["dvc", "push"], a, team)

        b = tmp_path_factory.mktemp("clone-b") / "b"
        run(["git", "clone", "-q", str(a), str(b)], a, team)
        run(["dvc", "remote", "add", "--local", "-d", "team", remote], b, team)
        run(["dvc", "pull"], b, team)
        assert json.loads(run(["dvc", "status", "--json", "dvc.yaml"], b, team).stdout) == {}
        assert ran_stages(run(["dvc", "repro"], b, team).stdout) == set()  # nothing trained, nothing run
        assert all(sha256_tree(b / f"models/{m}") == sha256_tree(a / f"models/{m}") for m in MODELS)

        serving, url, log = start_serving(b, team)  # the champion, from the team's registry
        try:
            body = {"inputs": {"prompt": ["The history of"]}, "params": {"strategy": "greedy", "max_new_tokens": 4}}
            answer = requests.post(f"{url}/invocations", json=body, timeout=60)
            assert answer.status_code == 200 and answer.json()["predictions"][0]["continuation"], log.read_text()
        finally:
            stop(serving)
        log.unlink()  # B's tree stays clean for its retrain

        failed = run(["lmpipe", "retrain", "-S", "models.gru.optim.lr=1.0"], b, team, check=False)  # a crippled GRU
        assert failed.returncode == 1 and "regressed" in failed.stderr, failed.stderr[-2000:]
        seen_from_a = MlflowClient(exports["MLFLOW_TRACKING_URI"]).get_model_version_by_alias("lmpipe-gru", "challenger")
        assert int(seen_from_a.version) > int(champion["gru"].version)
        assert server.get_model_version_by_alias("lmpipe-gru", "champion").version == champion["gru"].version
        trained_run = server.get_run(champion["gru"].run_id).data.tags  # the flow runs are on the team's Prefect
        stage_run = requests.get(f"{exports['PREFECT_API_URL']}/flow_runs/{trained_run['prefect.flow_run_id']}",
                                 timeout=10).json()
        assert stage_run["name"] == "score@gru" and stage_run["state_type"] == "COMPLETED"
        assert newest_flow_run_state(exports["PREFECT_API_URL"], "retrain") == "FAILED"
    finally:
        down = run(["lmpipe", "team", "down", "--dir", str(folder / "team")], a, env, check=False)
    assert down.returncode == 0 and down.stdout.startswith("stopped: prefect, mlflow, postgres"), down.stderr
    from lmpipe_cli.server import port_free

    assert all(port_free(p) for p in ports.values())
    left = run(["pgrep", "-f", str(folder)], a, env, check=False).stdout
    assert left == "", left
    shutil.rmtree(folder, ignore_errors=True)
