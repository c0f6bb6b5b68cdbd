"""The project's Prefect server trusts only its own pages: a web page of another origin can create nothing through
the user's browser; the server's own UI and Prefect's clients still work."""

from __future__ import annotations

import os
import subprocess
import sys

import requests

from tests.conftest import ROOT

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
    assert simple.status_code == 422, simple.text  # not JSON to the API: nothing created
    assert simple.headers.get("access-control-allow-origin") not in ("*", EVIL)
    names = [f["name"] for f in requests.post(f"{prefect_api}/flows/filter", json={}, timeout=10,
                                              headers={"Origin": own}).json()]
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
    assert requests.post(f"{prefect_api}/flows/filter", json={}, timeout=10).status_code == 200
    assert requests.get(f"{prefect_api}/health", headers={"Host": "localhost"}, timeout=10).status_code == 200
