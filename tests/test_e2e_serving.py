"""`lmpipe serve` of the study's champion over HTTP: its answers, its refusals of hostile requests, its stop, and an
unknown alias or version."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
import requests

from tests.helpers import run, start_serving, stop

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(project):
    """One `lmpipe serve --model gru` (the champion) for the tests that only send it requests."""
    copy, env, _ = project
    server, url, log = start_serving(copy, env)
    yield server, url, log
    stop(server)


def test_the_champion_answers_prompts_over_http_and_bad_input_is_a_400_of_one_reason(project, served):
    """`lmpipe serve` on 127.0.0.1 (MLflow's scoring protocol, in process): text in, the same text `lmpipe generate`
    prints out."""
    copy, env, _ = project
    server, url, log = served
    body = {"inputs": {"prompt": ["The history of", "In 1990"]}, "params": {"strategy": "greedy", "max_new_tokens": 6}}
    answer = requests.post(f"{url}/invocations", json=body, timeout=60)
    assert answer.status_code == 200, log.read_text()[-2000:]
    served_text = [p["continuation"] for p in answer.json()["predictions"]]
    printed = run(["lmpipe", "generate", "--model", "models:/lmpipe-gru@champion", "--prompt", "The history of",
                   "--strategy", "greedy", "--max-new-tokens", "6"], copy, env).stdout
    assert len(served_text) == 2 and printed == "The history of" + served_text[0] + "\n"
    for params, reason in (({"strategy": "nucleus"}, "strategy must be one of greedy, beam, top-k, top-p, typical, "
                            "sample"),
                           ({"max_new_tokens": 0}, "max_new_tokens must be a whole number from 1 to 1024"),
                           ({"max_new_tokens": 1025}, "max_new_tokens must be a whole number from 1 to 1024")):
        bad = requests.post(f"{url}/invocations", json={"inputs": {"prompt": ["The"]}, "params": params}, timeout=60)
        assert bad.status_code == 400 and bad.json() == {"error_code": "BAD_REQUEST", "message": reason}, bad.text
    assert requests.post(f"{url}/invocations", json={"inputs": {"text": ["The"]}}, timeout=60).status_code == 400
    assert requests.get(f"{url}/version", timeout=10).json()["version"] == "1"


MB = "x" * 1_000_000


JSON = {"Content-Type": "application/json"}


HOSTILE = [  # (what, the request's keyword arguments, the status it must get)
    ("a 1 MB prompt", {"json": {"inputs": {"prompt": [MB]}, "params": {"max_new_tokens": 1}}}, 413),
    ("a 2 MB body", {"json": {"inputs": {"prompt": [MB * 2]}}}, 413),
    ("a 2 MB chunked body", {"data": iter([b"x" * 65536] * 32), "headers": JSON}, 413),
    ("a 50 MB body", {"data": b"x" * (50 << 20), "headers": JSON}, 413),
    ("a prompt of 6000 tokens", {"json": {"inputs": {"prompt": ["The history of " * 2000]}}}, 413),
    ("17 prompts", {"json": {"inputs": {"prompt": ["The"] * 17}}}, 413),
    ("16 prompts of 1024 new tokens", {"json": {"inputs": {"prompt": ["The"] * 16}, "params": {"max_new_tokens": 1024}}},
     413),
    ("a prompt that is a dict", {"json": {"inputs": {"prompt": {"The": "history"}}}}, 400),
    ("a prompt that is a number", {"json": {"inputs": {"prompt": 5}}}, 400),
    ("an empty list", {"json": {"inputs": {"prompt": []}}}, 400),
    ("a list of numbers", {"json": {"inputs": {"prompt": [1, 2]}}}, 400),
    ("no Content-Type", {"data": json.dumps({"inputs": {"prompt": ["The"]}})}, 415),
    ("a 1 MB body without Content-Type", {"data": MB}, 415),
    ("not JSON", {"data": b"{nope", "headers": JSON}, 400),
    ("an unknown field", {"json": {"inputs": {"prompt": ["The"]}, "temperature": 0.5}}, 400),
    ("an unknown param", {"json": {"inputs": {"prompt": ["The"]}, "params": {"temprature": 0.5}}}, 400),
    ("a bad temperature", {"json": {"inputs": {"prompt": ["The"]}, "params": {"temperature": -1}}}, 400),
    ("max_new_tokens a string", {"json": {"inputs": {"prompt": ["The"]}, "params": {"max_new_tokens": "9" * 5000}}}, 400),
]


def test_every_hostile_request_is_a_4xx_of_one_line_within_a_second_and_the_server_stays_small(served):
    """The operator's table: each bad request is refused in one line that does not quote it, within
    1 s, before any model work; the server's peak memory stays under 2 GB and it answers good requests after."""
    import time

    server, url, log = served
    failures = []
    for what, request, status in HOSTILE:
        start = time.monotonic()
        answer = requests.post(f"{url}/invocations", timeout=30, **request)
        took = time.monotonic() - start
        if answer.status_code != status or took >= 1 or len(answer.content) > 300 or "\n" in answer.json()["message"]:
            failures.append(f"{what}: {answer.status_code} in {took:.2f} s, {answer.text[:300]}")
    assert not failures, "\n".join(failures)
    peak = next(int(line.split()[1]) for line in Path(f"/proc/{server.pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:"))  # kB
    assert peak < 2 * 1024 * 1024, f"lmpipe serve peaked at {peak / 1024:.0f} MB"
    good = requests.post(f"{url}/invocations", json={"inputs": {"prompt": ["The"]}, "params": {"max_new_tokens": 2}},
                         timeout=60)
    assert good.status_code == 200 and len(good.json()["predictions"]) == 1
    assert "Traceback" not in log.read_text()


def test_sigterm_stops_the_server_at_once_and_frees_its_port(project):
    """SIGTERM to `lmpipe serve` itself (not its group), while it generates: it ends within seconds without a
    traceback, nothing of it answers any more, and the port can be bound again."""
    import signal
    import socket
    import time

    copy, env, _ = project
    server, url, log = start_serving(copy, env)
    long = {"inputs": {"prompt": ["The history of " * 100] * 16}, "params": {"max_new_tokens": 1024}}
    threading.Thread(target=lambda: requests.post(f"{url}/invocations", json=long, timeout=60), daemon=True).start()
    time.sleep(1)
    assert requests.get(f"{url}/ping", timeout=1).ok  # it answers while it generates
    start = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        stop(server)
        raise AssertionError(f"lmpipe serve still ran 10 s after SIGTERM:\n{log.read_text()[-2000:]}") from None
    output = log.read_text()
    assert code == 0 and time.monotonic() - start < 10, output[-2000:]
    assert "Traceback" not in output and output.rstrip().splitlines()[-1].startswith("stopped"), output[-2000:]
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)  # no process of its group is left
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as again:  # as a server binds (SO_REUSEADDR): only a listener would stop it
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


def test_serving_an_unknown_alias_or_version_is_one_line_naming_what_exists(project):
    copy, env, _ = project
    for alias, missing in (("99", "version 99"), ("best", "alias best")):
        done = run(["lmpipe", "serve", "--model", "gru", "--alias", alias], copy, env, check=False)
        uri = f"models:/lmpipe-gru/{alias}" if alias.isdigit() else f"models:/lmpipe-gru@{alias}"
        assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {uri}: lmpipe-gru has no {missing}: its versions are 1")
        assert "champion (version 1)" in lines[0], lines[0]
