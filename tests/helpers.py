"""What several test files share: a local HTTP server for a handler, run in a thread for the length of a block; a
port another program holds; a child that takes Ctrl-C as a terminal's would; the page `lmpipe ui`'s link opens, as
headless Chromium has it; a learnable token stream (and a project's data/tokens of it); a study's metrics files for
the report; params as params.yaml states them (every setting), with a test's changes; the rows of a markdown table;
a folder built once for all of pytest-xdist's workers."""

from __future__ import annotations

import base64
import contextlib
import copy
import http.server
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import requests
import yaml

from lmpipe.families import FAMILIES
from lmpipe.io import sha256_tree, write_text
from lmpipe.splits import Split, TokenData

ROOT = Path(__file__).resolve().parents[1]  # the checkout
SHARED = ROOT.parent / "shared"
PARAMS = ROOT / "params.yaml"  # the committed params

CHROMIUM = shutil.which("chromium")
browser = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that prints no line per request."""

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def http_server(handler) -> Iterator[str]:
    """`handler` (a request handler class, or a factory of one) served on 127.0.0.1 at a free port; yields its base
    URL, http://127.0.0.1:<port>, and stops the server when the block ends."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that a listening socket holds for the length of a block: another program's."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_in_a_terminal() -> None:
    """A `preexec_fn`: SIGINT delivered as a terminal delivers it. A test run started as `nohup ... &` (or by a
    script's background job) ignores SIGINT, and every child would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


LAID_OUT = """(() => {
  const cells = [...document.querySelectorAll('.ag-cell[col-id^="tags."]')], grid = document.querySelector('.ag-root');
  const cut = cells.filter(cell => {  // its text wider than the cell's content box: shown with an ellipsis
    const style = getComputedStyle(cell), text = cell.querySelector('.ag-cell-value') || cell;
    return text.scrollWidth > cell.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  }).map(cell => cell.textContent);
  const right = grid ? grid.getBoundingClientRect().right : 0;  // columns a scroll away are not shown
  const shown = [...document.querySelectorAll('.ag-header-cell[col-id^="tags."]')]
    .filter(head => head.getBoundingClientRect().right <= right).map(head => head.getAttribute('col-id'));
  return {cut, shown};
})()"""
SHOWN = """document.querySelectorAll('.ag-cell[col-id^="tags."]').length > 0
  || document.body.innerText.includes('Test bits per byte')"""  # the views' grid or chart has rendered


def inspect(url: str, expression: str, ready: str, seconds: int = 60, shot: Path | None = None,
            width: int = 1400) -> tuple[str, object]:
    """The page at `url` in headless Chromium, `width` x 1000, driven over its DevTools protocol: once the JavaScript
    `ready` is true (or `seconds` have passed) and a second more, (its DOM, the value of `expression` there); a
    screenshot to `shot` when given. What --dump-dom cannot tell: how the page lays its text out."""
    from websockets.sync.client import connect

    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                                    "--no-first-run", f"--user-data-dir={profile}", f"--window-size={width},1000",
                                    "--remote-debugging-port=0", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            active = Path(profile) / "DevToolsActivePort"
            for _ in range(300):
                if active.exists() and len(active.read_text().split()) == 2:
                    break
                time.sleep(0.1)
            port = active.read_text().split()[0]
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy for 127.0.0.1
            targets = json.loads(direct.open(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
            page = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            with connect(page, max_size=2 ** 26, proxy=None) as ws:
                calls = iter(range(1, 10 ** 6))

                def call(method: str, **params):
                    ident = next(calls)
                    ws.send(json.dumps({"id": ident, "method": method, "params": params}))
                    while (reply := json.loads(ws.recv(timeout=60))).get("id") != ident:
                        pass
                    assert "error" not in reply, reply
                    return reply["result"]

                def evaluate(js: str):
                    return call("Runtime.evaluate", expression=js, returnByValue=True)["result"].get("value")

                call("Page.navigate", url=url)
                deadline = time.monotonic() + seconds
                while not evaluate(ready) and time.monotonic() < deadline:
                    time.sleep(0.5)
                time.sleep(1)
                if shot is not None:
                    shot.write_bytes(base64.b64decode(call("Page.captureScreenshot", format="png")["data"]))
                return evaluate("document.documentElement.outerHTML"), evaluate(expression)
        finally:
            os.killpg(browser.pid, signal.SIGTERM)
            browser.wait(timeout=30)


def leaderboard_page(project: Path, link_text: str = "workspace holds, best test bpb first", env: dict | None = None,
                     shot: Path | None = None, grid: bool = True) -> str:
    """`lmpipe ui` in `project` (with `env`, default this process's): the page its link after `link_text` opens, as a
    browser 1400 px wide has it (MLflow 3.17 opens its Assistant panel there, ~360 px, on a first visit), once its
    grid shows runs. It asserts that test bpb and the gap to KN-5 are in view, no scroll away, even with the panel
    open (not on a `grid=False` link: a chart), and that no label is cut (shown with an ellipsis: the view's columns
    are MLflow's 100 px). A screenshot to `shot` when given."""
    port = free_port()
    env = {**(os.environ if env is None else env), "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    ui = subprocess.Popen([sys.executable, "-m", "lmpipe_cli", "ui", "--port", str(port)], cwd=project, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    stuck = threading.Timer(300, os.killpg, (ui.pid, 9))  # a UI that never answers ends the read below
    stuck.start()
    try:
        lines = []
        for line in ui.stdout:
            lines.append(line)
            if line.startswith("champions"):
                break
        link = next((line.split(": ", 1)[1].strip() for line in lines if link_text in line), None)
        assert link, f"lmpipe ui printed no link to the models: {lines}"
        page, laid_out = inspect(link, LAID_OUT, SHOWN, shot=shot, width=1400)
        assert laid_out["cut"] == [], f"cut to the cell's width: {laid_out['cut']}"
        hidden = [c for c in ("test bpb", "vs KN-5") if f"tags.`{c}`" not in laid_out["shown"]]
        assert not (hidden and grid), f"a scroll away: {hidden}"  # the first screen answers "which, by how much"
        return page
    finally:
        stuck.cancel()
        os.killpg(ui.pid, 15)
        ui.wait(timeout=30)


def assert_best_first(page: str, results: dict) -> None:
    """Every model's row on the page (the publish stage's run of it, named by the model), in order of test bpb,
    each with its test bpb."""
    shown = {name: page.find(f">{name}<") for name in results}
    assert all(at > 0 for at in shown.values()), f"not on the page: {[n for n, at in shown.items() if at < 0]}"
    assert sorted(shown, key=shown.get) == sorted(results, key=results.get)  # best test bpb first
    for bpb in results.values():  # what a person reads: three decimals, the gap to KN-5, size and FLOPs
        assert f">{bpb:.3f}<" in page or f">{bpb:.3f} ± " in page, bpb
    for column in ("vs KN-5", "word ppl", "size", "training FLOPs"):
        assert f">{column}<" in page, column
    assert "test_ppl" not in page  # the labels only


SYNTHETIC_VOCAB = 30


def synthetic_data(seed=0) -> TokenData:
    """A learnable stream: token t+1 = (t * 7 + 3) mod the vocabulary most of the time, boundaries every ~20 tokens."""
    rng = np.random.default_rng(seed)

    def stream(n):
        out, t = [], 1
        for _ in range(n):
            t = (t * 7 + 3) % (SYNTHETIC_VOCAB - 1) + 1 if rng.random() < 0.9 else int(rng.integers(1, SYNTHETIC_VOCAB))
            out.append(0 if rng.random() < 0.05 else t)
        return np.array(out, dtype=np.uint16)

    splits = {name: Split(name, stream(n), n // 4, n * 3) for name, n in (("train", 6000), ("valid", 800), ("test", 800))}
    return TokenData(SYNTHETIC_VOCAB, 0, splits)


def write_tokens(root: Path, data: TokenData) -> None:
    """`data` as the tokenize stage leaves it in a project at `root`: data/tokens/{split}.npy and counts.json."""
    tokens = root / "data/tokens"
    tokens.mkdir(parents=True, exist_ok=True)
    for name, split in data.splits.items():
        np.save(tokens / f"{name}.npy", split.tokens)
    (tokens / "counts.json").write_text(json.dumps({
        "vocab_size": data.vocab_size, "boundary_id": data.boundary,
        "words": {n: s.words for n, s in data.splits.items()}, "bytes": {n: s.bytes for n, s in data.splits.items()}}))


def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)


def fixture_study(root, with_weat=True):
    split = {"articles": 10, "lines": 100, "words": 1000, "chars": 6000}
    write(root / "metrics/corpus.json", {"source": "enwiki-sample", "splits": {s: split for s in ("train", "valid", "test")},
                                         "sha256": {}})
    write(root / "metrics/validation.json", {"success": True, "evaluated": 12, "failed": 0})
    write(root / "metrics/tokenize.json", {"vocab_size": 8192, "tokens": {"train": 1700}, "words": {"train": 1000}})
    result = lambda p, bpb: {"ppl": p, "word_ppl": p * 3, "bpb": bpb, "loss": 5.0}  # noqa: E731
    write(root / "metrics/eval.json", {"models": {
        "ngram": {"valid": result(260, 2.1), "test": result(240, 2.0), "n_params": 1000},
        "lstm": {"valid": result(300, 2.2), "test": result(280, 2.1), "n_params": 4_000_000},
        "transformer": {"valid": result(200, 1.9), "test": result(190, 1.8), "n_params": 5_000_000},
    }})
    for name in ("lstm", "transformer"):
        write(root / f"metrics/train/{name}.json", {"n_params_non_embedding": 1_000_000, "tokens_seen": 1_200_000,
                                                    "epochs": 2.0, "train_flops": 3.4e13})
    write(root / "plots/train/lstm.csv", "epoch,flops,valid_bpb\n1,1e13,2.6\n2,2e13,2.2\n")
    write(root / "plots/train/transformer.csv", "epoch,flops,valid_bpb\n1,1.5e13,2.4\n2,3e13,1.9\n")
    write(root / "reports/samples.md", "# Decoding samples\n\n## Diversity per strategy (mean over models)\n\n"
                                       "| strategy | distinct-1 |\n|---|---|\n| greedy | 0.2 |\n\n## lstm\n\n### greedy\n- The history of x\n")
    if with_weat:
        write(root / "metrics/weat.json", {"models": {"lstm": {
            "flowers_insects": {"effect_size": 1.2, "p_value": 0.01, "x_words": 8, "y_words": 8, "a_words": 20,
                                "b_words": 20},
            "math_arts": {"effect_size": None, "p_value": None, "status": "insufficient_coverage", "x_words": 2,
                          "y_words": 8, "a_words": 20, "b_words": 20}}}})
        write(root / "reports/weat_words.json", {"models": {"lstm": {"flowers_insects": {"title": "Flowers vs insects"},
                                                                      "math_arts": {}}}})


# ---------------- params as params.yaml states them (every setting), with a test's changes ----------------

def committed_params() -> dict:
    """The project's params.yaml as data: a fresh copy each call."""
    return yaml.safe_load(PARAMS.read_text())


def project_params(**sections) -> dict:
    """The committed params with `sections` merged in, one level deep; `models` replaced whole (and the scaling grid,
    which names the committed models, emptied unless `scaling` is given; its extra seeds, which name the committed
    budgets, none where `scaling` gives budgets of its own)."""
    tree = committed_params()
    if "models" in sections:
        tree["scaling"]["models"] = {}
    if "budgets" in sections.get("scaling", {}):
        tree["scaling"]["seeds"] = {"extra": [], "budgets": []}
    for name, changes in sections.items():
        tree[name] = changes if name == "models" or not isinstance(changes, dict) else {**tree[name], **changes}
    return tree


def section(name: str, **changes) -> dict:
    """One committed section with `changes`: e.g. TokenizerParams(**section("tokenizer", vocab_size=600))."""
    return {**committed_params()[name], **changes}


ADAMW = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0, "clip": 1.0, "schedule": "cosine", "warmup_steps": 0}


def entry(family: str, arch: dict | None = None, **settings) -> dict:
    """A model entry with every setting stated: a test's own small settings on AdamW at 1e-3 with a cosine schedule,
    batch 32 of 64 tokens; patience 3 with epochs, variable_bptt false on a recurrent family."""
    tree = {"family": family, "arch": arch or {}, "optim": ADAMW, "batch_size": 32, "seq_len": 64,
            "max_steps_per_epoch": None, **settings}
    if "epochs" in settings:
        tree.setdefault("patience", 3)
    if FAMILIES[family].recurrent:
        tree.setdefault("variable_bptt", False)
    return copy.deepcopy(tree)  # no object shared with another entry: YAML would write it once, as an alias


def table_rows(markdown: str | list[str]) -> list[list[str]]:
    """Every row of the markdown tables in `markdown` (header rows too, not the rule under them), each cell without
    the padding that lines the columns up."""
    lines = markdown.splitlines() if isinstance(markdown, str) else markdown
    rows = [[cell.strip() for cell in line.strip()[1:-1].split("|")] for line in lines
            if line.startswith("|") and line.rstrip().endswith("|")]
    return [row for row in rows if not all(cell and set(cell) <= set(":-") for cell in row)]


def has_row(markdown: str | list[str], *cells: str) -> bool:
    """Whether a row of a markdown table in `markdown` begins with `cells`."""
    return any(row[:len(cells)] == list(cells) for row in table_rows(markdown))


# ---------------- the end-to-end tests: the tiny study they share, and what they run on its copies ----------------

MODELS = ("nplm", "rnn", "lstm", "gru", "transformer")
STAGES = ("download", "prepare", "validate", "tokenize", "ngram") + tuple(f"train@{m}" for m in MODELS) + (
    "score_ngram",) + tuple(f"score@{m}" for m in MODELS) + ("evaluate", "combine", "word2vec", "audit", "report",
                                                                  "publish")
QUICK = {"epochs": 1, "max_steps_per_epoch": 3, "batch_size": 4, "seq_len": 16}


TINY = {  # the study the end-to-end tests share (tests/conftest.py's `project`): every stage on 12 articles
    "corpus": {"max_articles": 12},
    "split": {"seed": 57, "valid": 0.02, "test": 0.02},  # one short article each (1,872 and 1,708 words): scoring is quick
    "validate": {"min_words": 200, "max_oov_rate": 0.6},
    "tokenizer": {"vocab_size": 600},
    "evaluate": {"prompts": ["The history of"], "max_new_tokens": 8, "beam_size": 2},
    "study": {"budget": None, "branches": []},  # each tiny model by its own few steps
    "models": {
        "nplm": entry("nplm", {"context": 3, "emb": 16, "hidden": 32}, **QUICK),
        "rnn": entry("rnn", {"cell": "rnn_tanh", "emb": 16, "layers": 1}, **QUICK),
        "lstm": entry("rnn", {"cell": "lstm", "emb": 16, "hidden": 32, "layers": 2, "weight_drop": 0.2},
                      variable_bptt=True, **QUICK),
        "gru": entry("rnn", {"cell": "gru", "emb": 16, "layers": 1}, **QUICK),
        "transformer": entry("transformer", {"dim": 16, "layers": 1, "heads": 2, "block_size": 16}, **QUICK),
    },
    "scaling": {  # 2 sizes of 2 families at 4 budgets: enough for every fit (a law needs 5 points), ~2 minutes
        "models": {"transformer": [{"dim": 8}, {"dim": 16}], "lstm": [{"emb": 8, "hidden": 8}, {"emb": 16, "hidden": 16}]},
        "budgets": [2e8, 4e8, 8e8, 1.6e9],
        "overrides": {"max_steps_per_epoch": None},
        "evals_per_epoch": 1,
        "precision": "fp32",  # as the committed grid, on any CPU
        "seeds": {"extra": [1], "budgets": [2e8]},  # every size again with seed 1 at the smallest budget
        "fit": {"bootstrap": 5, "seed": 0, "huber_delta": 0.001},
        "around_best": [],  # a whole section replaces the committed one: every key DVC tracks must be here
    },
}


def built_once(tmp_path_factory, name: str, build: Callable[[Path], str]) -> tuple[Path, str]:
    """This worker's own copy of a folder that `build` makes once for the whole run, and what `build` said: the
    first of pytest-xdist's workers to ask builds it in its copy and leaves a snapshot; the others wait for it under a
    lock and copy the snapshot (a copied study's MLflow store points at its own artifacts, lmpipe.tracking.store).
    Each worker's tests may change its copy."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this run's, common to its workers
    snapshot, said = shared / f"{name}-built", shared / f"{name}-built.txt"
    copy = tmp_path_factory.mktemp(name)
    with FileLock(str(shared / f"{name}-built.lock")):
        if said.exists():
            shutil.copytree(snapshot, copy, symlinks=True, dirs_exist_ok=True)
            return copy, said.read_text()
        text = build(copy)  # a failed build leaves no snapshot: the next worker to ask builds again
        shutil.copytree(copy, snapshot, symlinks=True)
        write_text(said, text)  # last: the mark that the snapshot is whole
        return copy, text


def run(args, cwd, env, check=True, timeout=600):
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{args} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def stop(process: subprocess.Popen) -> None:
    """End a background server and its children: politely, then for sure."""
    import signal

    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def override(path: Path, changes: dict) -> None:
    params = yaml.safe_load(path.read_text())
    for section, values in changes.items():
        if section in ("models", "scaling"):
            params[section] = values
        else:
            params[section].update(values)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def stages_in_order(output: str) -> list[str]:
    """The stages `dvc repro` printed as it started them, in its order."""
    import re

    return re.findall(r"Running stage '([^']+)'", output)


def ran_stages(output: str) -> set[str]:
    return set(stages_in_order(output))


def start_serving(copy: Path, env: dict, *args: str) -> tuple[subprocess.Popen, str, Path]:
    """`lmpipe serve --model gru` on a free port, once it answers /ping: (process, its URL, its log)."""
    import time

    port, log = free_port(), copy / f"serve-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(["lmpipe", "serve", "--model", "gru", "--port", str(port), *args], cwd=copy, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{url}/ping", timeout=2).ok:
                return server, url, log
        except requests.ConnectionError:
            if server.poll() is not None or time.monotonic() > deadline:
                stop(server)
                raise AssertionError(f"lmpipe serve did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.5)


def workspace(copy: Path) -> dict:
    """What users read: HEAD, the tracked files' state, the models and the metrics."""
    return {"head": run(["git", "rev-parse", "HEAD"], copy, os.environ).stdout.strip(),
            "status": run(["git", "status", "--porcelain"], copy, os.environ).stdout,
            "models": {m: sha256_tree(copy / f"models/{m}") for m in MODELS},
            "eval": (copy / "metrics/eval.json").read_text(), "lock": (copy / "dvc.lock").read_text()}


def ask_prefect(method: str, url: str, patience: int = 60, **request) -> requests.Response:
    """A request to the test Prefect server, sent again while it answers 503 (its SQLite database busy under the
    suite's load), as Prefect's own client does: the tests ask what the server decides, not whether it was busy."""
    for _ in range(patience):
        answer = requests.request(method, url, timeout=10, **request)
        if answer.status_code != 503:
            return answer
        time.sleep(1)
    return answer


def newest_flow_run_state(prefect_api: str, flow_name: str) -> str:
    """The state of the flow's newest run that started (a schedule's future runs, created ahead, do not count)."""
    runs = ask_prefect("POST", f"{prefect_api}/flow_runs/filter", json={
        "flows": {"name": {"any_": [flow_name]}}, "sort": "START_TIME_DESC", "limit": 1,
        "flow_runs": {"start_time": {"is_null_": False}}}).json()
    return runs[0]["state_type"]


def with_fake_dvc(tmp_path, script: str) -> dict:
    """An environment whose `dvc` is a shell script of `script`, in `tmp_path` (beside the test's `params_file`), and
    whose MLflow store is a new one there."""
    fake = tmp_path / "dvc"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}  # the study's driver opens the store first
    env.pop("LMPIPE_PARENT_RUN_ID", None)
    return env
