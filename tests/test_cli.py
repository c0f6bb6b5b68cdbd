"""The `lmpipe` command line: help for every option, a version, and one-line errors for a user's mistakes."""

from __future__ import annotations

import enum
import os
import subprocess
import sys

import click
import pytest

from lmpipe_cli.main import lmpipe, main
from tests.helpers import ROOT


def every_command(group: click.Group = lmpipe, path: str = "") -> dict[str, click.Command]:
    """Every command of `lmpipe`, by its words after `lmpipe` ("ngram export-arpa"), in the listing's order."""
    found = {}
    for name, command in group.commands.items():
        words = f"{path} {name}".strip()
        found.update(every_command(command, words) if isinstance(command, click.Group) else {words: command})
    return found


def test_every_option_has_help_and_there_is_a_version(capsys):
    missing = [f"{name}: {param.name}" for name, command in every_command().items() for param in command.params
               if isinstance(param, click.Option) and not param.help]
    assert not missing
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("lmpipe 0.")


@pytest.mark.parametrize("flag, value, reason", [("--top-p", "1.5", "top_p must be a number above 0 and at most 1"),
                                                 ("--top-k", "0", "top_k must be a whole number of at least 1"),
                                                 ("--temperature", "0.0", "temperature must be a number above 0"),
                                                 ("--max-new-tokens", "5000",
                                                  "max_new_tokens must be a whole number from 1 to 1024")])
def test_an_out_of_range_sampling_value_is_one_line_before_any_model_loads(flag, value, reason):
    """The same rule as params.yaml's `evaluate` and a served request's (lmpipe.decode_rules.check_decoding)."""
    done = subprocess.run([sys.executable, "-m", "lmpipe_cli", "generate", "--model", "no-such-model", flag, value],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: {flag} {value}: {reason}"]


def test_generate_outside_a_project_says_so_in_one_line(tmp_path):
    """No params.yaml here: its own error, not a flag's (the flags are checked against params.yaml's `evaluate`)."""
    done = subprocess.run([sys.executable, "-m", "lmpipe_cli", "generate", "--model", "gru", "--top-k", "5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: params.yaml") and "Traceback" not in done.stderr, lines


def test_a_bad_cron_is_one_line_and_starts_no_server():
    done = subprocess.run([sys.executable, "-m", "lmpipe_cli", "schedule", "--cron", "bad cron"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: --cron 'bad cron': not a cron expression (five fields: minute hour day-of-month month day-of-week, "
        'e.g. "0 3 * * 1" for Mondays 03:00)']


def test_server_stop_leaves_a_process_it_did_not_start_alone(tmp_path):
    """A copied checkout carries its original's pid file: `lmpipe server --stop` there must not kill that pid."""
    from lmpipe_cli import server

    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (tmp_path / "prefect-server-4200.pid").write_text(str(other.pid))
        assert server.stop(4200, log_dir=tmp_path) is False
        assert other.poll() is None  # still running
        assert not (tmp_path / "prefect-server-4200.pid").exists()  # the stale file is gone
        assert server.stop(4200, log_dir=tmp_path) is False
    finally:
        other.kill()
        other.wait()


def test_ui_on_a_taken_port_is_one_line():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "lmpipe_cli", "ui", "--port", str(port)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: 127.0.0.1:{port} is taken by another program (choose another: lmpipe ui --port N)"]


def test_a_port_whose_last_server_just_stopped_is_free():
    """Closed connections linger in TIME_WAIT after a server stops; servers bind over them (SO_REUSEADDR), so
    `lmpipe server` and `lmpipe ui` must not take such a port for one in use."""
    import socket

    from lmpipe_cli.server import HOST, port_free

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection((HOST, port))
    accepted, _ = listener.accept()
    assert not port_free(port)  # a server listens there
    accepted.close()  # the server's side closes first: its end of the connection waits in TIME_WAIT
    client.close()
    listener.close()
    assert port_free(port)


def started_ui(tmp_path, until: str) -> tuple[subprocess.Popen, int, list[str]]:
    """`lmpipe ui` on a fresh store in `tmp_path` (beside the test's `params_file`), in its own process group, read
    until a line holding `until`."""
    import os
    import time

    from tests.helpers import as_in_a_terminal, free_port

    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    ui = subprocess.Popen([sys.executable, "-m", "lmpipe_cli", "ui", "--port", str(port)], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                          preexec_fn=as_in_a_terminal)
    lines, deadline = [], time.monotonic() + 180
    while not any(until in line for line in lines) and time.monotonic() < deadline and ui.poll() is None:
        lines.append(ui.stdout.readline())
    return ui, port, lines


def test_the_mlflow_ui_is_quiet_while_a_browser_loads_it(tmp_path, params_file):
    """No line per request: the printed links stay in view (--access-log brings them back)."""
    import os
    import signal

    import requests

    ui, port, lines = started_ui(tmp_path, "no study published yet")  # a fresh store: the UI's address, no view
    try:
        assert any(f"MLflow UI: http://127.0.0.1:{port} (no study published yet" in line for line in lines), "".join(lines)
        for path in ("/", "/health", "/static-files/favicon.ico", "/ajax-api/2.0/mlflow/experiments/search") * 5:
            requests.get(f"http://127.0.0.1:{port}{path}", timeout=30)
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        rest, _ = ui.communicate(timeout=60)
    said = "".join(lines) + rest
    assert "HTTP/1.1" not in said and "GET /" not in said, said[-2000:]


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_the_mlflow_ui_stops_its_server_when_told(tmp_path, params_file, signum):
    """SIGTERM (a service manager's stop) or SIGINT to `lmpipe ui` itself, not to its group: the MLflow server it
    started stops with it and the port is free within 3 s."""
    import os
    import signal
    import time

    from lmpipe_cli.server import port_free

    ui, port, lines = started_ui(tmp_path, "champions")
    try:
        assert not port_free(port), "".join(lines)
        ui.send_signal(getattr(signal, signum))
        ui.wait(timeout=10)
        deadline = time.monotonic() + 3
        while not port_free(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert port_free(port)
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
        ui.communicate(timeout=30)


@pytest.mark.parametrize("module", ["flows.study", "lmpipe_cli.retrain", "flows.audit", "flows.word2vec", "flows.train",
                                    "flows.seeds", "flows.report", "flows.publish"])
def test_every_stage_module_prints_help_and_starts_nothing(module, tmp_path):
    """`python -m flows.<stage> --help` in a folder with no params.yaml and no Prefect server reachable: the help, exit
    0, no flow run (one would fail on the dead server address, or on the missing params.yaml)."""
    import os

    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.lower().startswith("usage:")
    assert "flow run" not in done.stderr.lower() and not list(tmp_path.iterdir())


def test_a_stage_that_reads_params_alone_refuses_an_argument_in_one_line(tmp_path):
    import os

    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "flows.combine", "--model", "gru"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: python -m flows.combine takes no arguments (got --model gru): it reads "
                                   "params.yaml; see python -m flows.combine --help")


def test_every_command_says_what_it_does_in_its_own_help(capsys):
    """`lmpipe <command> --help` opens with what the command does, not only its flags, and every flag with a default
    says it; `lmpipe --help` lists the commands in the order a user meets them."""
    for name, command in every_command().items():
        assert main([*name.split(), "--help"]) == 0
        text = capsys.readouterr().out
        description = text.split("\n\n")[1]
        assert description.strip() and not description.strip().startswith(("Options", "Usage")), name
        flat = " ".join(text.split())
        for param in command.params:
            default = param.default  # click marks "no default" with an Enum member of its own
            if isinstance(param, click.Option) and not param.is_flag and not isinstance(default, enum.Enum) \
                    and default not in (None, (), []):
                assert f"default: {default}" in flat or "default:" in param.help, (name, param.name)
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out.split("Commands:", 1)[1].splitlines()
    named = [line.split()[0] for line in listing if line.startswith("  ") and not line.startswith("   ")]
    assert named == list(lmpipe.commands) and named[:3] == ["check-params", "server", "generate"]


def test_a_command_run_from_the_venv_without_activating_it_starts_the_venv_s_tools(monkeypatch, tmp_path):
    """`.venv/bin/lmpipe retrain` from cron, a service or a teammate's shell, PATH without the venv: the dvc it
    starts, and the `python` of the stages under dvc, are the venv's, not missing (a bare FileNotFoundError) nor
    another Python without the project's packages."""
    import shutil
    from pathlib import Path

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(ROOT)
    assert main(["check-params"]) == 0
    venv = Path(sys.executable).parent
    assert shutil.which("dvc") == str(venv / "dvc")
    assert Path(shutil.which("python")).parent == venv


def test_a_frozen_stage_is_committed_only_after_its_flow_succeeds(tmp_path, monkeypatch):
    """`lmpipe scaling` / `lmpipe seeds`: the steps run in order, and the first that fails stops the rest (no
    `dvc commit` of a half-made grid), its exit code returned."""
    from lmpipe_cli import frozen

    monkeypatch.chdir(tmp_path)
    mark = [sys.executable, "-c", "import sys; open(sys.argv[1], 'w')"]
    code = frozen.run_and_commit("no_such_flow_module", "scaling/dvc.yaml:grid", before=[mark + ["before"]],
                                 after=[mark + ["after"]])
    assert code == 1
    assert (tmp_path / "before").exists() and not (tmp_path / "after").exists()
    # a flow that succeeds: then `dvc commit` of the stage (a stand-in dvc on PATH records it), then what follows
    (tmp_path / "done_flow.py").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dvc").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'dvc_calls'}\n")
    (bin_dir / "dvc").chmod(0o755)
    monkeypatch.setattr(frozen.server, "this_environment", lambda: {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert frozen.run_and_commit("done_flow", "seeds/dvc.yaml:seeds", after=[mark + ["after"]]) == 0
    assert (tmp_path / "dvc_calls").read_text().split() == ["commit", "--force", "--quiet", "seeds/dvc.yaml:seeds"]
    assert (tmp_path / "after").exists()


def test_every_command_that_takes_settings_takes_them_with_S(monkeypatch):
    """`-S KEY=VALUE` (`--set-param`), repeatable, as `dvc exp run -S` and `lmpipe plan` take it: `lmpipe retrain`
    hands them to the flow, `lmpipe plan` to the plan, `python -m flows.study` / `lmpipe_cli.retrain` to their flow."""
    import flows._stage
    import lmpipe_cli.plan

    ran, planned = [], []
    monkeypatch.setattr(flows._stage, "main", lambda flow, **kwargs: ran.append(kwargs))
    monkeypatch.setattr(lmpipe_cli.plan, "plan", lambda overrides: planned.append(overrides) or "a plan")
    assert main(["retrain", "-S", "models.gru.optim.lr=0.003", "--set-param", "+models.gru.epochs=3"]) == 0
    assert ran == [{"overrides": ["models.gru.optim.lr=0.003", "+models.gru.epochs=3"]}]
    assert main(["retrain"]) == 0 and ran[-1] == {"overrides": None}
    assert main(["plan", "-S", "models.gru.optim.lr=0.003"]) == 0 and planned == [["models.gru.optim.lr=0.003"]]
    monkeypatch.setattr(sys, "argv", ["study.py", "-S", "models.lstm.optim.lr=0.006", "-S", "corpus.max_articles=5"])
    assert flows._stage.settings_argv("a setting") == ["models.lstm.optim.lr=0.006", "corpus.max_articles=5"]
    monkeypatch.setattr(sys, "argv", ["study.py"])
    assert flows._stage.settings_argv("a setting") is None


@pytest.mark.parametrize("command, prog", [
    (["lmpipe_cli", "retrain", "models.gru.optim.lr=0.003"], "lmpipe retrain"),
    (["lmpipe_cli", "retrain", "--set", "models.gru.optim.lr=0.003"], "lmpipe retrain"),
    (["lmpipe_cli", "plan", "-S", "models.gru.arch.layers=2", "models.gru.optim.lr=0.003"], "lmpipe plan"),
    (["flows.study", "models.gru.optim.lr=0.003"], "python -m flows.study"),
    (["lmpipe_cli.retrain", "--set", "models.gru.optim.lr=0.003"], "python -m lmpipe_cli.retrain"),
])
def test_a_setting_given_another_way_than_S_is_one_line_naming_S(command, prog, tmp_path):
    """A bare key=value or --set (the syntaxes these commands once took) starts nothing: one line naming -S."""
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stdout == "" and not list(tmp_path.iterdir())
    assert done.stderr.strip().splitlines() == [
        f"{prog}: give settings as -S key=value (as dvc exp run -S); e.g. -S models.gru.optim.lr=0.003"]


def test_a_command_that_takes_no_settings_still_refuses_an_unknown_argument(capsys):
    assert main(["diff", "HEAD", "workspace", "a=1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "Error: Got unexpected extra argument (a=1)"


def test_lmpipe_help_describes_every_command_group(capsys):
    """`lmpipe --help` gives `ngram` and `team` a line as it gives every command; each group's help opens with it."""
    groups = {name: group for name, group in lmpipe.commands.items() if isinstance(group, click.Group)}
    assert sorted(groups) == ["ngram", "team"]
    assert main(["--help"]) == 0
    listing = " ".join(capsys.readouterr().out.split())
    for name, group in groups.items():
        line = group.short_help
        assert line and f"{name} {' '.join(line.split())}" in listing, name
        assert main([name, "--help"]) == 0
        assert " ".join(capsys.readouterr().out.split("\n\n")[1].split()) == line[:1].upper() + line[1:] + "."


def test_generate_help_gives_each_decoding_default_as_its_value_from_params_yaml(tmp_path, monkeypatch):
    """The defaults of `generate`'s decoding flags are params.yaml's `evaluate` here, shown as values; with no
    readable params.yaml the help says where they come from."""
    from lmpipe_cli.main import DECODE_FLAGS

    def help_text() -> str:
        with click.Context(lmpipe.commands["generate"], info_name="generate", terminal_width=200) as ctx:
            return " ".join(ctx.get_help().split())

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("evaluate:\n  top_p: 0.77\n  top_k: 12\n  temperature: 1.5\n")
    text = help_text()
    assert "default: 0.77 (params.yaml evaluate.top_p)" in text
    assert "default: 12 (params.yaml evaluate.top_k)" in text and "default: 1.5 (params.yaml evaluate.temperature)" in text
    assert "default: params.yaml evaluate.seed" in text  # a setting the file lacks: where it comes from
    (tmp_path / "params.yaml").write_text("evaluate: [unclosed\n")
    text = help_text()
    assert all(f"default: params.yaml evaluate.{name}" in text for name in DECODE_FLAGS)
    monkeypatch.chdir(ROOT)  # the study's own file
    assert "default: 0.9 (params.yaml evaluate.top_p)" in help_text()


def test_server_with_a_port_starts_there_whatever_prefect_api_url_says(tmp_path):
    """`lmpipe server --port N` starts a server on N with PREFECT_API_URL naming N; with it naming another server,
    the one on N is said to be running and the line says how to use it. Without --port a set PREFECT_API_URL still
    starts nothing (tests/test_team.py)."""
    import time

    from lmpipe_cli.server import api_url, healthy
    from tests.helpers import free_port

    port = free_port()
    url = api_url(port)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path / "prefect-home"),
           "PREFECT_UI_ENABLED": "false", "PREFECT_API_URL": url}

    def lmpipe(*argv, **extra):
        return subprocess.run([sys.executable, "-m", "lmpipe_cli", "server", *argv], cwd=tmp_path,
                              env={**env, **extra}, capture_output=True, text=True, timeout=240)

    try:
        done = lmpipe("--port", str(port))
        assert done.returncode == 0, done.stderr[-2000:]
        lines = done.stdout.splitlines()
        assert lines[:2] == [f"started {url}", f"stages find it through PREFECT_API_URL={url}"], lines
        assert healthy(url, timeout=5)
        other = "http://127.0.0.1:9/api"
        done = lmpipe("--port", str(port), PREFECT_API_URL=other)
        assert done.stdout.splitlines()[:2] == [
            f"already running: {url}", f"PREFECT_API_URL={other} points elsewhere, so the stages report there; to use "
                                       f"this server: export PREFECT_API_URL={url}"], done.stdout
    finally:
        stopped = lmpipe("--stop", "--port", str(port))
    assert stopped.stdout.strip() == "stopped"
    deadline = time.monotonic() + 30
    while healthy(url) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not healthy(url)
