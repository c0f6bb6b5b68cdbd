"""The project's Prefect server trusts only its own pages: a web page of another origin can change nothing through
the user's browser, not even with the requests a browser sends without asking (a form's POST, text/plain); the
server's own UI and Prefect's clients still work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from tests.helpers import ROOT, ask_prefect

EVIL = "http://evil.example"


def test_a_cross_origin_request_is_refused_and_the_projects_clients_still_work(prefect_api):
    own = prefect_api.removesuffix("/api")
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    theirs = requests.options(f"{prefect_api}/flows/", headers={"Origin": EVIL, **preflight}, timeout=10)
    assert theirs.headers.get("access-control-allow-origin") not in ("*", EVIL)  # the browser blocks the call
    ours = requests.options(f"{prefect_api}/flows/", headers={"Origin": own, **preflight}, timeout=10)
    assert ours.headers.get("access-control-allow-origin") == own  # the server's own UI may
    # what a page may send without a preflight: a form-like body, here the JSON as text/plain
    simple = requests.post(f"{prefect_api}/flows/", data='{"name": "from-another-page"}', timeout=10,
                           headers={"Origin": EVIL, "Content-Type": "text/plain"})
    assert simple.status_code == 403, simple.text
    assert simple.headers.get("access-control-allow-origin") not in ("*", EVIL)
    names = [f["name"] for f in ask_prefect("POST", f"{prefect_api}/flows/filter", json={}, headers={"Origin": own}).json()]
    assert "from-another-page" not in names
    flow = "from prefect import flow\n@flow(name='own-client')\ndef f():\n    return 41 + 1\nprint(f())\n"
    done = subprocess.run([sys.executable, "-c", flow], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PREFECT_API_URL": prefect_api})
    assert done.returncode == 0 and done.stdout.strip().endswith("42"), done.stderr[-2000:]


def test_a_request_addressed_to_another_host_is_refused(prefect_api):
    """DNS rebinding: a page of another site whose name resolves to 127.0.0.1 calls the server as its own origin,
    with its own name in the Host header."""
    forged = requests.post(f"{prefect_api}/flows/filter", json={}, headers={"Host": "evil.example:4200"}, timeout=10)
    assert forged.status_code == 400
    assert ask_prefect("POST", f"{prefect_api}/flows/filter", json={}).status_code == 200
    assert requests.get(f"{prefect_api}/health", headers={"Host": "localhost"}, timeout=10).status_code == 200


# What a page of another site can make the user's browser send to 127.0.0.1 without a preflight: a form's three
# encodings (and the JSON the page wants read as text/plain).
SIMPLE_FORMS = {"text/plain": {"data": '{"name": "from-another-page", "active": true}',
                               "headers": {"Content-Type": "text/plain"}},
                "x-www-form-urlencoded": {"data": {"name": "from-another-page"}},
                "multipart/form-data": {"files": {"name": (None, "from-another-page")}}}


def test_no_page_of_another_site_can_change_what_the_server_holds(prefect_api):
    """Every route that changes state (a schedule paused or resumed, a run created, a deployment deleted) refuses a
    simple request of another origin, in each form, and nothing changes; the server's own origin and clients that
    send no Origin (Prefect's) change what they ask for."""
    own = prefect_api.removesuffix("/api")
    flow_id = ask_prefect("POST", f"{prefect_api}/flows/", json={"name": "page-target"}).json()["id"]
    made = ask_prefect("POST", f"{prefect_api}/deployments/", json={
        "name": "page-target", "flow_id": flow_id, "paused": True,
        "schedules": [{"schedule": {"interval": 3600}, "active": False}]})
    assert made.status_code in (200, 201), made.text
    deployment, schedule = made.json()["id"], made.json()["schedules"][0]["id"]

    def state() -> tuple:
        held = ask_prefect("GET", f"{prefect_api}/deployments/{deployment}")
        runs = ask_prefect("POST", f"{prefect_api}/flow_runs/count", json={"flows": {"id": {"any_": [flow_id]}}})
        return (held.status_code, held.json().get("paused"), [s["active"] for s in held.json().get("schedules", [])],
                runs.json())

    before = state()
    assert before == (200, True, [False], 0)
    routes = [("POST", f"deployments/{deployment}/resume_deployment"),
              ("POST", f"deployments/{deployment}/pause_deployment"),
              ("POST", f"deployments/{deployment}/create_flow_run"), ("POST", "flow_runs/"),
              ("PATCH", f"deployments/{deployment}/schedules/{schedule}"), ("DELETE", f"deployments/{deployment}")]
    senders = [{"Origin": EVIL}, {"Origin": "null"}, {"Origin": f"{own}.evil.example"},  # sandboxed, look-alike
               {"Origin": own, "Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}]
    for form, request in SIMPLE_FORMS.items():
        for sender in senders:
            for method, route in routes:
                answer = requests.request(method, f"{prefect_api}/{route}", timeout=10, **{  # refused before the
                    **request, "headers": {**request.get("headers", {}), **sender}})  # database: no 503 to wait out
                assert answer.status_code == 403, (form, sender, method, route, answer.status_code, answer.text)
    assert state() == before  # still paused, its schedule off, no run made, not deleted

    ours, held = {"Origin": own, "Sec-Fetch-Site": "same-origin"}, f"{prefect_api}/deployments/{deployment}"  # own UI
    assert ask_prefect("POST", f"{held}/resume_deployment", headers=ours).status_code == 200
    assert state()[1] is False
    assert ask_prefect("POST", f"{held}/pause_deployment", headers={"Origin": own}).status_code == 200
    created = ask_prefect("POST", f"{held}/create_flow_run", json={})
    assert created.status_code in (200, 201), created.text  # no Origin: a client that is not a browser
    assert state() == (200, True, [False], 1)
    assert ask_prefect("DELETE", held, headers=ours).status_code == 204


def test_no_page_of_another_site_can_open_the_servers_event_stream(prefect_api):
    """Browsers let any page open a websocket to 127.0.0.1, sending its Origin: the server's event intake refuses
    another origin's; Prefect's clients send none."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = prefect_api.replace("http://", "ws://") + "/events/in"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, origin=EVIL, open_timeout=10).close()
    assert refused.value.response.status_code == 403
    connect(url, open_timeout=10).close()


def test_each_checkout_has_its_own_prefect_home(tmp_path, monkeypatch):
    """Prefect keeps a server's runs, deployments and schedules in its home, ~/.prefect by default: one for every
    checkout on the machine. A checkout's stages, `lmpipe` and its server use the checkout's own, in its ignored cache
    folder; a home the user chose stays theirs."""
    from lmpipe_cli import server

    checkouts = [tmp_path / "a", tmp_path / "b"]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_HOME"} | {"PYTHONPATH": str(ROOT)}
    said = "import flows\nfrom prefect.settings import get_current_settings\nprint(get_current_settings().home)"
    homes = []
    for checkout in checkouts:
        checkout.mkdir()
        done = subprocess.run([sys.executable, "-c", said], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        homes.append(done.stdout.strip().splitlines()[-1])
    assert homes == [str(c.resolve() / ".cache/lmpipe/prefect") for c in checkouts]
    assert all((c / ".cache/lmpipe/prefect").is_dir() for c in checkouts)  # Prefect makes the home, not its parents
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    monkeypatch.chdir(checkouts[1])
    assert server.server_env(4300)["PREFECT_HOME"] == homes[1]
    assert server.use_project_home({"PREFECT_HOME": str(tmp_path / "mine")}) == str(tmp_path / "mine")
