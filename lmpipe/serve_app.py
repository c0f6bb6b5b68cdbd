"""`lmpipe serve`: a registered text model over HTTP, in this process (uvicorn, one worker, 127.0.0.1).

The model is the registry's pyfunc (`mlflow.pyfunc.load_model`, lmpipe.serving.TextGenerator), answering MLflow's
scoring protocol, so MLflow clients keep working: POST /invocations with {"inputs": {"prompt": [...]}, "params":
{...}} (or dataframe_records, dataframe_split) answers {"predictions": [{"continuation": ...}]}; GET /ping and
/health answer 200, /version names the model. A request must be addressed to a loopback name (Host: 127.0.0.1,
localhost or [::1]; else 400, as the MLflow UI checks). Before any model work it must say it is JSON (else 415), its
body is read to at most MAX_BODY_BYTES whatever its Content-Length says (413 past it), and
`lmpipe.serving.check_request` checks it (400, or 413 over a limit, its work included). Every refusal is one line
that names the field and the limit and never quotes the input. The model runs on one daemon thread, one request at a
time: the server keeps answering meanwhile, refuses at once (503, Retry-After) a request that would wait more than
MAX_WAIT_S for it, and stops within seconds on SIGTERM or Ctrl-C, no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import queue
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Callable

from lmpipe.errors import LmpipeError, first_line
from lmpipe.serving import MAX_BODY_BYTES, MAX_WORK, BadRequest, check_request

HOST = "127.0.0.1"
GRACE_S = 2  # a stopping server waits this long for a running generation, then drops it
MAX_CONNECTIONS = 64  # open connections and requests at once (each holds at most MAX_BODY_BYTES); 503 past it
MAX_WAIT_S = 1.5  # a request that would wait longer for the model is refused at once: 503 with Retry-After
CALIBRATION_STEPS = 16  # new tokens of the generation that measures the model's first seconds a step


def model_uri(model: str, alias: str) -> str:
    """models:/lmpipe-<model>/<version> for a number, else models:/lmpipe-<model>@<alias>."""
    from lmpipe.tracking.registry import registered_name

    return f"models:/{registered_name(model)}" + (f"/{alias}" if alias.isdigit() else f"@{alias}")


def named(model: str, alias: str) -> tuple[str, str]:
    """(model, alias) of `--model` given as a name (gru, with `alias`) or as the registry URI `lmpipe generate` takes:
    models:/lmpipe-gru@champion, or models:/lmpipe-gru/3 for a version."""
    if not model.startswith("models:/"):
        return model, alias
    match = re.fullmatch(r"models:/lmpipe-([\w.-]+?)(?:@([\w.-]+)|/(\d+))", model)
    if not match:
        raise LmpipeError(f"--model {model}: a registered model is models:/lmpipe-<name>@<alias> or "
                          "models:/lmpipe-<name>/<version>, or give its name alone (gru)")
    return match[1], match[2] or match[3]


def resolve(model: str, alias: str) -> tuple[str, str]:
    """(URI, version) of the registry's lmpipe-<model> at `alias` (an alias or a version number); when it has none
    such, one line that names the versions and aliases it has (or the models the registry has)."""
    from mlflow.exceptions import MlflowException

    from lmpipe.tracking.registry import registered_name, registered_version
    from lmpipe.tracking.store import relocate_store
    from lmpipe.tracking import tracker

    store = tracker()
    relocate_store()  # a copied or moved checkout: serve this one's files
    uri, name = model_uri(model, alias), registered_name(model)
    with contextlib.suppress(MlflowException):
        return uri, str(registered_version(uri).version)
    client = store.client
    try:
        aliases = client.get_registered_model(name).aliases  # {alias: version}
        versions = sorted(int(v.version) for v in client.search_model_versions(f"name = '{name}'"))
    except MlflowException:
        models = sorted(m.name.removeprefix("lmpipe-") for m in client.search_registered_models()
                        if m.name.startswith("lmpipe-"))
        raise LmpipeError(f"{uri}: no model '{model}' in the registry at {store.uri} (it has "
                          f"{', '.join(models) if models else 'none: train them with dvc repro'})") from None
    named = ", ".join(f"{a} (version {v})" for a, v in sorted(aliases.items())) or "none"
    raise LmpipeError(f"{uri}: {name} has no {'version' if alias.isdigit() else 'alias'} {alias}: its versions are "
                      f"{', '.join(map(str, versions)) or 'none'}; its aliases {named}")


def load(uri: str):
    """The registered pyfunc at `uri`, as MLflow loads it; its files missing or not a text model: one line."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a log, not a terminal
    try:
        pyfunc = mlflow.pyfunc.load_model(uri)
    except (MlflowException, OSError) as exc:
        raise LmpipeError(f"{uri}: registered, but it cannot be loaded ({type(exc).__name__}): were its files under "
                          "mlartifacts/ removed?") from None
    try:
        text_model = hasattr(pyfunc.unwrap_python_model(), "tokenizer")
    except MlflowException:  # not a Python model at all
        text_model = False
    if not text_model:
        raise LmpipeError(f"{uri}: not an lmpipe text model (register it anew: dvc repro --force train@<model>)")
    return pyfunc


@dataclass
class Generation:
    """One request's prompts waiting for the model, and the future its answer settles."""

    prompts: list[str]
    params: dict
    steps: int
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future


class Worker:
    """Runs the model on one daemon thread: the event loop stays free to answer, and a stopping process does not wait
    for a generation to end. Requests waiting with the same params go through the model together (one batch of their
    prompts, at most MAX_WORK of work), each prompt sampling the random stream it samples alone: a request that repeats
    a prompt of the batch waits for the next one, as a prompt's stream counts the identical prompts before it in the
    call (lmpipe.decode.repeats), and the requests behind it go on joining. It knows how long its queue will take
    (the steps of work queued, lmpipe.serving.work, at the seconds a step it measures), so a request that would wait
    too long is refused at once rather than left to time out."""

    def __init__(self, predict: Callable[[list[str], dict], list[str]], seconds: float, steps: float):
        """`predict(prompts, params)` the continuations; `seconds` for `steps` of work: the first measured rate."""
        self.predict, self.jobs, self.busy = predict, queue.SimpleQueue(), False
        self._held: list[Generation] = []  # jobs taken from the queue that could not join the batch: the next one's first
        self._lock = threading.Lock()
        self._queued = 0  # steps of the jobs not started yet
        self._running_until = 0.0  # when the running batch should end (time.monotonic)
        self._seconds, self._steps = seconds, steps  # measured time and work, older batches fading
        threading.Thread(target=self._work, name="lmpipe-serve-model", daemon=True).start()

    @property
    def seconds_per_step(self) -> float:
        return self._seconds / self._steps

    def wait(self) -> float:
        """Seconds a request sent now would wait before the model starts on it. A batch running past its estimate
        (a slower machine than measured, another process on its cores) still holds the model: it counts as needing
        as long again as it is late, never as done."""
        with self._lock:
            left = self._running_until - time.monotonic()
            if self.busy and left < 0:
                left = -left
            return self._queued * self.seconds_per_step + max(0.0, left)

    async def run(self, prompts: list[str], params: dict, steps: int) -> list[str]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        with self._lock:
            self._queued += steps
        self.jobs.put(Generation(prompts, params, steps, loop, done))
        return await done

    def _batch(self) -> list[Generation]:
        """The oldest job waiting, and every job waiting behind it with the same params and none of the batch's
        prompts, up to one request's work (MAX_WORK), oldest first; the others wait for the next batch, first in it."""
        waiting = self._held or [self.jobs.get()]
        while True:
            try:
                waiting.append(self.jobs.get_nowait())
            except queue.Empty:
                break
        batch, self._held = [waiting[0]], []
        steps, prompts = waiting[0].steps, set(waiting[0].prompts)
        for job in waiting[1:]:
            if job.params != batch[0].params or steps + job.steps > MAX_WORK or prompts.intersection(job.prompts):
                self._held.append(job)
                continue
            batch.append(job)
            steps += job.steps
            prompts.update(job.prompts)
        return batch

    def _work(self) -> None:
        while True:
            batch = self._batch()
            start, steps = time.monotonic(), sum(job.steps for job in batch)
            with self._lock:
                self._queued -= steps
                self._running_until = start + steps * self.seconds_per_step
            batch = [job for job in batch if not job.done.cancelled()]  # their requests are gone (a stopping server)
            if not batch:
                continue
            self.busy = True
            try:
                answers = self.predict([p for job in batch for p in job.prompts], batch[0].params)
                outcomes, at = [], 0
                for job in batch:
                    outcomes.append((answers[at:at + len(job.prompts)], None))
                    at += len(job.prompts)
            except Exception as exc:  # handed to the requests, which answer it
                outcomes = [(None, exc)] * len(batch)
            finally:
                self.busy = False
                with self._lock:  # the rate, weighted by work: the large batches that make queues decide it
                    self._running_until = 0.0
                    self._seconds = 0.8 * self._seconds + time.monotonic() - start
                    self._steps = 0.8 * self._steps + steps
            for job, outcome in zip(batch, outcomes):
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    job.loop.call_soon_threadsafe(_settle, job.done, *outcome)


def _settle(done: asyncio.Future, result, error: Exception | None) -> None:
    if not done.done():
        done.set_exception(error) if error is not None else done.set_result(result)


LOOPBACK_HOST = re.compile(r"(127\.0\.0\.1|localhost|\[::1\])(:\d{1,5})?", re.IGNORECASE)


class LoopbackOnly:
    """Answers only requests addressed to this machine's loopback names (any port), as the MLflow UI does: a page of
    another site whose name resolves to 127.0.0.1 (DNS rebinding) sends that name as Host and is refused (400), so
    it cannot use the model through the user's browser."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not LOOPBACK_HOST.fullmatch(host):
                await refusal(400, "the Host header names another machine: this server answers requests to "
                                   f"{HOST}, localhost or [::1] only")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def refusal(status: int, message: str):
    """An error reply as MLflow's server gives it: {"error_code", "message"}, the message one line."""
    from starlette.responses import JSONResponse

    return JSONResponse({"error_code": HTTPStatus(status).name, "message": message}, status_code=status)


async def read_body(request) -> bytes:
    """The request's body, read to at most MAX_BODY_BYTES: a larger Content-Length is refused unread, and a body
    without one (chunked) is cut off where it passes the limit."""
    too_large = BadRequest(f"the body is larger than {MAX_BODY_BYTES} bytes, the limit of a request", 413)
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
        raise too_large if declared.isdigit() else BadRequest("Content-Length is not a number")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(pyfunc, about: dict, say: Callable[[str], None] = lambda line: None, max_wait_s: float = MAX_WAIT_S):
    """The ASGI app answering MLflow's scoring protocol with `pyfunc` (a loaded TextGenerator); `about` is /version's
    answer, `say` takes one short line per scoring request (the access log). A request that would wait more than
    `max_wait_s` for the model is refused at once: 503, with Retry-After."""
    import pandas as pd
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    generator = pyfunc.unwrap_python_model()

    def predict(prompts: list[str], params: dict) -> list[str]:
        return pyfunc.predict(pd.DataFrame({"prompt": prompts}), params=params)["continuation"].tolist()

    start = time.monotonic()  # the first rate: a short generation, which also warms the model up
    predict(["The"], {"strategy": "greedy", "max_new_tokens": CALIBRATION_STEPS})
    worker = Worker(predict, time.monotonic() - start, CALIBRATION_STEPS)

    async def invocations(request):
        start = time.monotonic()
        try:
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                raise BadRequest("the body must be JSON, sent with Content-Type: application/json", 415)
            raw = await read_body(request)
            try:
                body = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise BadRequest(f"the body is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
            except (ValueError, RecursionError) as exc:  # not UTF-8, a number of over 4300 digits, nested too deep
                raise BadRequest(f"the body is not JSON that can be read ({type(exc).__name__})") from None
            prompts, params, steps = check_request(body, generator.count_tokens, generator.defaults)
        except BadRequest as exc:
            say(f"POST /invocations {exc.status} in {time.monotonic() - start:.2f} s: {exc}")
            return refusal(exc.status, str(exc))
        wait = worker.wait()
        if wait > max_wait_s:
            retry = math.ceil(wait)
            say(f"POST /invocations 503 in {time.monotonic() - start:.2f} s: busy for about {retry} s")
            busy = refusal(503, f"the model is busy for about {retry} s more (work queued before this request): "
                                f"retry after {retry} s")
            busy.headers["Retry-After"] = str(retry)
            return busy
        try:
            continuations = await worker.run(prompts, params, steps)
        except asyncio.CancelledError:  # the server stops: the generation is dropped
            return refusal(503, "the server is stopping")
        except Exception as exc:
            say(f"POST /invocations 500 in {time.monotonic() - start:.2f} s: {type(exc).__name__}: "
                f"{first_line(str(exc), 200)}")
            return refusal(500, f"the model failed ({type(exc).__name__}); see the server's output")
        say(f"POST /invocations 200 in {time.monotonic() - start:.2f} s: {len(prompts)} prompt(s)")
        return JSONResponse({"predictions": [{"continuation": c} for c in continuations]})

    async def ping(request):
        return PlainTextResponse("\n")

    async def version(request):
        return JSONResponse(about)

    async def http_error(request, exc: HTTPException):
        return refusal(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    routes = [Route("/invocations", invocations, methods=["POST"]), Route("/ping", ping, methods=["GET"]),
              Route("/health", ping, methods=["GET"]), Route("/version", version, methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error},
                    middleware=[Middleware(LoopbackOnly)])
    app.state.worker = worker
    return app


def listen(port: int) -> socket.socket:
    """A socket bound to HOST:port (SO_REUSEADDR, as uvicorn binds), or one line saying the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as exc:
        sock.close()
        raise LmpipeError(f"port {port} on {HOST} is not free ({exc.strerror}): stop what listens there, or give "
                          "another --port") from None
    return sock


def _say(line: str) -> None:
    print(line, flush=True)


def serve(model: str, alias: str, port: int, say: Callable[[str], None] = _say) -> int:
    """Serve lmpipe-<model> at `alias` on HOST:port until SIGTERM or SIGINT; 0 when stopped so."""
    import uvicorn

    from lmpipe import __version__

    before = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    sock = worker = None
    try:  # both signals end in KeyboardInterrupt, loading or serving: uvicorn raises them again once it stopped
        uri, version = resolve(model, alias)
        sock = listen(port)
        pyfunc = load(model_uri(model, version))
        app = build_app(pyfunc, {"model": uri, "version": version, "lmpipe": __version__}, say)
        worker = app.state.worker
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                                workers=1, limit_concurrency=MAX_CONNECTIONS, timeout_graceful_shutdown=GRACE_S)
        say(f"serving {uri} (version {version}) on http://{HOST}:{port}/invocations; Ctrl-C stops it")
        say(f"""  curl -s http://{HOST}:{port}/invocations -H 'Content-Type: application/json' \\
    -d '{{"inputs": {{"prompt": ["The history of"]}}, "params": {{"strategy": "greedy", "max_new_tokens": 20}}}}'""")
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if sock is not None:
            sock.close()
    if worker is not None and worker.busy:  # a generation still runs on its thread, and cannot be stopped: end
        say("stopped (the running request was dropped)")  # the process without waiting, as torch would not
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    say("stopped")
    return 0
