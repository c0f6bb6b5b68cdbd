"""`lmpipe serve`'s checks, without a pipeline: the request validator's table, and the app (lmpipe.serve_app) on a
tiny real model through starlette's TestClient. A hostile request is refused in one line that never quotes it,
before any model work; tests/test_e2e_serving.py serves a trained champion the same way over a socket."""

from __future__ import annotations

import json

import pytest

from lmpipe.decode_rules import MAX_NEW_TOKENS
from lmpipe.decode import DecodeSettings
from lmpipe.serving import MAX_BODY_BYTES, MAX_PROMPT_BYTES, MAX_PROMPT_TOKENS, MAX_PROMPTS, BadRequest, check_request
from tests.helpers import section

TEXT = "The history of the city is long.\nIn 1990 the wall fell, and the people of the city went out.\n" * 40


def words(prompt: str) -> int:
    return len(prompt.split())


def refused(body, count=words) -> tuple[int, str]:
    with pytest.raises(BadRequest) as caught:
        check_request(body, count)
    return caught.value.status, str(caught.value)


def test_a_good_request_in_each_of_mlflows_formats_gives_its_prompts_and_params():
    params = {"strategy": "greedy", "max_new_tokens": 6, "seed": 3}
    for body in ({"inputs": {"prompt": ["The history of", "In"]}, "params": params},
                 {"dataframe_records": [{"prompt": "The history of"}, {"prompt": "In"}], "params": params},
                 {"dataframe_split": {"columns": ["prompt"], "data": [["The history of"], ["In"]]}, "params": params}):
        assert check_request(body, words) == (["The history of", "In"], params, 2 * (1 + 6))  # and its steps
    assert check_request({"inputs": {"prompt": [""]}, "params": None}, words) == ([""], {}, 40)  # an empty prompt
    assert check_request({"inputs": {"prompt": ["a"] * MAX_PROMPTS}, "params": {"seed": None}}, words)[1] == {}


HUGE = "x" * 1_000_000
TABLE = [  # (what, body, status, the start of the one line)
    ("a list body", [1, 2], 400, "the body must be a JSON object"),
    ("a string body", HUGE, 400, "the body must be a JSON object"),
    ("no input", {"params": {}}, 400, "a request has exactly one of inputs, dataframe_records, dataframe_split, not 0"),
    ("two inputs", {"inputs": {"prompt": ["a"]}, "dataframe_records": [{"prompt": "a"}]}, 400, "a request has exactly"),
    ("unknown top-level field", {"inputs": {"prompt": ["a"]}, "temperature": 0.5}, 400, "unknown field 'temperature'"),
    ("a huge unknown field", {"inputs": {"prompt": ["a"]}, HUGE: 1}, 400, "unknown field 'xxxx"),
    ("inputs a list", {"inputs": ["a"]}, 400, 'inputs must be {"prompt": [strings]}, not a list'),
    ("inputs without prompt", {"inputs": {"text": ["a"]}}, 400, "inputs must be"),
    ("an unknown column", {"inputs": {"prompt": ["a"], "text": ["b"]}}, 400, "inputs has an unknown column 'text'"),
    ("prompt a dict", {"inputs": {"prompt": {"a": 1}}}, 400, "inputs.prompt must be a list of strings, not an object"),
    ("prompt a number", {"inputs": {"prompt": 5}}, 400, "inputs.prompt must be a list of strings, not a number"),
    ("prompt a string", {"inputs": {"prompt": HUGE}}, 400, "inputs.prompt must be a list of strings, not a string"),
    ("prompt null", {"inputs": {"prompt": None}}, 400, "inputs.prompt must be a list of strings, not null"),
    ("an empty list", {"inputs": {"prompt": []}}, 400, "inputs.prompt is empty"),
    ("a number in the list", {"inputs": {"prompt": ["a", 5]}}, 400, "prompt 2 is a number: each prompt must be"),
    ("a list in the list", {"inputs": {"prompt": [["a"]]}}, 400, "prompt 1 is a list"),
    ("a lone surrogate", {"inputs": {"prompt": ["\ud800"]}}, 400, "prompt 1 is not valid Unicode"),
    ("records not records", {"dataframe_records": [{"text": "a"}]}, 400, "dataframe_records must be"),
    ("split of two columns", {"dataframe_split": {"columns": ["prompt", "x"], "data": [["a", "b"]]}}, 400,
     "dataframe_split must be"),
    ("params a list", {"inputs": {"prompt": ["a"]}, "params": [1]}, 400, "params must be an object"),
    ("unknown param", {"inputs": {"prompt": ["a"]}, "params": {"temprature": 0.5}}, 400,
     "params.temprature is not a setting of this model: use strategy, max_new_tokens, temperature, top_k, top_p, "
     "typical_p, beam_size, no_repeat_ngram, seed"),
    ("a temperature of 0", {"inputs": {"prompt": ["a"]}, "params": {"temperature": 0}}, 400,
     "temperature must be a number above 0"),
    ("a temperature as text", {"inputs": {"prompt": ["a"]}, "params": {"temperature": "hot"}}, 400,
     "temperature must be"),
    ("unknown strategy", {"inputs": {"prompt": ["a"]}, "params": {"strategy": HUGE}}, 400,
     "strategy must be one of greedy, beam, top-k, top-p, typical, sample"),
    ("no new token", {"inputs": {"prompt": ["a"]}, "params": {"max_new_tokens": 0}}, 400,
     f"max_new_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}"),
    ("too many new tokens", {"inputs": {"prompt": ["a"]}, "params": {"max_new_tokens": MAX_NEW_TOKENS + 1}}, 400,
     "max_new_tokens must be"),
    ("new tokens a string", {"inputs": {"prompt": ["a"]}, "params": {"max_new_tokens": "6"}}, 400, "max_new_tokens"),
    ("new tokens a fraction", {"inputs": {"prompt": ["a"]}, "params": {"max_new_tokens": 2.5}}, 400, "max_new_tokens"),
    ("new tokens true", {"inputs": {"prompt": ["a"]}, "params": {"max_new_tokens": True}}, 400, "max_new_tokens"),
    ("a negative seed", {"inputs": {"prompt": ["a"]}, "params": {"seed": -1}}, 400, "seed must be a whole number"),
    ("a huge seed", {"inputs": {"prompt": ["a"]}, "params": {"seed": 2**70}}, 400, "seed must be a whole number"),
    ("too many prompts", {"inputs": {"prompt": ["a"] * (MAX_PROMPTS + 1)}}, 413,
     f"inputs.prompt holds {MAX_PROMPTS + 1} prompts: at most {MAX_PROMPTS} a request"),
    ("too many records", {"dataframe_records": [{"prompt": "a"}] * (MAX_PROMPTS + 1)}, 413, "dataframe_records holds"),
    ("a 1 MB prompt", {"inputs": {"prompt": ["a", HUGE]}}, 413,
     f"prompt 2 has 1000000 bytes: at most {MAX_PROMPT_BYTES} (UTF-8) a prompt"),
    ("bytes counted in UTF-8", {"inputs": {"prompt": ["é" * (MAX_PROMPT_BYTES // 2 + 1)]}}, 413, "prompt 1 has"),
    ("too many tokens", {"inputs": {"prompt": ["a " * (MAX_PROMPT_TOKENS + 1)]}}, 413,
     f"prompt 1 has {MAX_PROMPT_TOKENS + 1} tokens: at most {MAX_PROMPT_TOKENS} a prompt"),
    ("over the work budget", {"inputs": {"prompt": ["a"] * MAX_PROMPTS}, "params": {"max_new_tokens": 200}}, 413,
     f"the request asks for {MAX_PROMPTS * 201} steps of generation"),
    ("beams counted", {"inputs": {"prompt": ["a", "b"]}, "params": {"strategy": "beam", "max_new_tokens": 300}}, 413,
     f"the request asks for {2 * (1 + 5 * 300)} steps of generation"),
]


def test_the_work_budget_counts_new_tokens_beams_and_long_prompts():
    """A request at every size limit fits the budget exactly when it asks for few new tokens: a prompt is read once."""
    from lmpipe.serving import MAX_WORK, PROMPT_TOKENS_PER_STEP

    longest = ["a " * MAX_PROMPT_TOKENS] * MAX_PROMPTS
    fits = MAX_WORK // MAX_PROMPTS - MAX_PROMPT_TOKENS // PROMPT_TOKENS_PER_STEP
    assert check_request({"inputs": {"prompt": longest}, "params": {"max_new_tokens": fits}}, words)[2] == MAX_WORK
    assert refused({"inputs": {"prompt": longest}, "params": {"max_new_tokens": fits + 1}})[0] == 413
    assert check_request({"inputs": {"prompt": ["a"]}, "params": {"max_new_tokens": MAX_NEW_TOKENS}}, words)[2] \
        == 1 + MAX_NEW_TOKENS


@pytest.mark.parametrize("what, body, status, start", TABLE, ids=[row[0] for row in TABLE])
def test_a_bad_request_is_one_line_that_does_not_quote_it(what, body, status, start):
    code, message = refused(body)
    assert (code, message[:len(start)]) == (status, start)
    assert "\n" not in message and len(message) < 200


def test_tokens_are_counted_only_of_prompts_that_passed_every_cheap_check():
    counted = []

    def count(prompt):
        counted.append(prompt)
        return 1

    for body in ({"inputs": {"prompt": ["a", 5]}}, {"inputs": {"prompt": ["a"]}, "params": {"temperature": 0}},
                 {"inputs": {"prompt": ["a", HUGE]}}):
        refused(body, count)
    assert counted == []


def test_request_settings_layer_a_request_on_the_models_defaults():
    from lmpipe.serving import request_settings

    defaults = DecodeSettings(strategy="top-p", max_new_tokens=30, seed=(1, 2))
    assert request_settings(defaults, None) == defaults
    assert request_settings(defaults, {"strategy": "greedy", "max_new_tokens": 6, "seed": 4}) == DecodeSettings(
        strategy="greedy", max_new_tokens=6, seed=4)


# The app on a tiny real model ------------------------------------------------------------------------------------


class Loaded:
    """What mlflow.pyfunc.load_model returns, for a TextGenerator built in the test (no registry)."""

    def __init__(self, generator):
        self.generator, self.calls = generator, 0

    def unwrap_python_model(self):
        return self.generator

    def predict(self, frame, params=None):
        self.calls += 1
        return self.generator.predict(None, frame, params)


LOCAL = "http://127.0.0.1:5000"  # what a client on this machine addresses: `lmpipe serve` binds 127.0.0.1


@pytest.fixture(scope="module")
def served():
    import torch
    from starlette.testclient import TestClient

    from lmpipe.config import TokenizerParams
    from lmpipe.models import build_model
    from lmpipe.serve_app import build_app
    from lmpipe.serving import TextGenerator
    from lmpipe.tokenize import boundary_id, train_tokenizer

    tokenizer = train_tokenizer(TEXT, TokenizerParams(**section("tokenizer", vocab_size=300, min_frequency=1)))
    boundary = boundary_id(tokenizer, "<|endoftext|>")
    torch.manual_seed(0)
    generator = TextGenerator()
    generator.lm = build_model("rnn", {"cell": "gru", "emb": 16, "layers": 1}, tokenizer.get_vocab_size(), boundary).eval()
    generator.tokenizer, generator.boundary, generator.defaults = tokenizer, boundary, DecodeSettings(max_new_tokens=4)
    model, lines = Loaded(generator), []
    with TestClient(build_app(model, {"model": "models:/lmpipe-gru@champion", "version": "1"}, lines.append),
                    base_url=LOCAL) as client:
        yield client, model, lines


GOOD = {"inputs": {"prompt": ["The history of", "In 1990"]}, "params": {"strategy": "greedy", "max_new_tokens": 5}}


def test_the_app_answers_mlflows_scoring_protocol(served):
    client, model, lines = served
    answer = client.post("/invocations", json=GOOD)
    assert answer.status_code == 200, answer.text
    continuations = [p["continuation"] for p in answer.json()["predictions"]]
    assert len(continuations) == 2 and all(isinstance(c, str) and c for c in continuations)
    records = {"dataframe_records": [{"prompt": "The history of"}], "params": GOOD["params"]}
    assert client.post("/invocations", json=records).json()["predictions"][0]["continuation"] == continuations[0]
    charset = client.post("/invocations", content=json.dumps(GOOD),
                          headers={"Content-Type": "application/json; charset=utf-8"})
    assert [p["continuation"] for p in charset.json()["predictions"]] == continuations  # greedy: the same again
    for path in ("/ping", "/health"):
        assert client.get(path).status_code == 200
    assert client.get("/version").json() == {"model": "models:/lmpipe-gru@champion", "version": "1"}
    assert lines[0].startswith("POST /invocations 200 in ")


def test_every_setting_generate_takes_is_a_request_param_and_identical_prompts_sample_apart(served):
    """`temperature` (and each setting `lmpipe generate` takes) over HTTP as on the command line; four identical
    prompts in one request get four samples, the same four again with the same seed."""
    client, _, _ = served
    body = {"inputs": {"prompt": ["The history of"] * 4},
            "params": {"strategy": "sample", "max_new_tokens": 6, "seed": 11, "temperature": 2.0, "top_k": 5}}
    answer = client.post("/invocations", json=body)
    assert answer.status_code == 200, answer.text
    four = [p["continuation"] for p in answer.json()["predictions"]]
    assert len(set(four)) == 4
    assert [p["continuation"] for p in client.post("/invocations", json=body).json()["predictions"]] == four
    cooler = client.post("/invocations", json={**body, "params": {**body["params"], "temperature": 0.05}})
    assert [p["continuation"] for p in cooler.json()["predictions"]] != four  # the temperature is used


def test_a_request_gets_what_it_gets_alone_whatever_the_server_batches_it_with(served):
    """Requests queued while the model is busy go through it together; each still gets the answer it gets alone,
    a request repeating another's prompt too (held for the next batch, as a repeat samples another stream)."""
    import threading
    import time

    from starlette.testclient import TestClient

    from lmpipe.serve_app import build_app

    _, loaded, _ = served
    release, batches = threading.Event(), []

    class Held(Loaded):  # the first request holds the model while the others queue behind it
        def predict(self, frame, params=None):
            if list(frame["prompt"]) == ["hold"]:
                release.wait(30)
            else:
                batches.append(list(frame["prompt"]))
            return super().predict(frame, params)

    params = {"strategy": "sample", "max_new_tokens": 6, "seed": 4}
    requests = [["The history of"], ["In 1990", "The history of"], ["The war"], ["The history of"]]
    with TestClient(build_app(Held(loaded.generator), {}, max_wait_s=60), base_url=LOCAL) as client:
        def ask(prompts: list[str]) -> list[str]:
            answer = client.post("/invocations", json={"inputs": {"prompt": prompts}, "params": params})
            assert answer.status_code == 200, answer.text
            return [p["continuation"] for p in answer.json()["predictions"]]

        alone = [ask(prompts) for prompts in requests]
        batches.clear()
        answers = {}
        def until(done, what: str) -> None:
            deadline = time.monotonic() + 30
            while not done():
                assert time.monotonic() < deadline, what
                time.sleep(0.01)

        holder = threading.Thread(target=lambda: ask(["hold"]))
        holder.start()
        until(lambda: client.app.state.worker.busy, "the first request never reached the model")
        threads = []
        for i, prompts in enumerate(requests):  # queued in this order behind the held request
            threads.append(threading.Thread(target=lambda i=i, p=prompts: answers.__setitem__(i, ask(p))))
            threads[-1].start()
            until(lambda: client.app.state.worker.jobs.qsize() >= len(threads), f"request {i} never queued")
        release.set()
        for thread in [holder, *threads]:
            thread.join(60)
            assert not thread.is_alive()
    assert [answers.get(i) for i in range(len(requests))] == alone
    # together where no prompt repeats, the rest the next batch's first: the third request joins the first
    assert batches == [requests[0] + requests[2], requests[1], requests[3]]


@pytest.mark.parametrize("what, request_, status, start", [
    ("no content type", {"content": json.dumps(GOOD)}, 415, "the body must be JSON, sent with Content-Type"),
    ("text/plain", {"content": json.dumps(GOOD), "headers": {"Content-Type": "text/plain"}}, 415, "the body must"),
    ("form data", {"data": {"prompt": "The"}}, 415, "the body must be JSON"),
    ("not JSON", {"content": b"{nope", "headers": {"Content-Type": "application/json"}}, 400, "the body is not JSON"),
    ("not UTF-8", {"content": b'"\xff"', "headers": {"Content-Type": "application/json"}}, 400, "the body is not JSON"),
    ("nested too deep", {"content": b"[" * 200_000, "headers": {"Content-Type": "application/json"}}, 400,
     "the body is not JSON"),
    ("a number of 5000 digits", {"content": b"{\"params\": {\"seed\": " + b"9" * 5000 + b"}}",
                                 "headers": {"Content-Type": "application/json"}}, 400, "the body is not JSON"),
    ("a body too large", {"content": b"x" * (MAX_BODY_BYTES + 1), "headers": {"Content-Type": "application/json"}},
     413, f"the body is larger than {MAX_BODY_BYTES} bytes"),
    ("a chunked body too large", {"content": iter([b"x" * 65536] * (MAX_BODY_BYTES // 65536 + 1)),
                                  "headers": {"Content-Type": "application/json"}}, 413, "the body is larger than"),
    ("a 1 MB prompt", {"json": {"inputs": {"prompt": [HUGE]}, "params": {"max_new_tokens": 1}}}, 413, "prompt 1 has"),
    ("unknown field", {"json": {**GOOD, "temperature": 0.5}}, 400, "unknown field 'temperature'"),
    ("prompt a dict", {"json": {"inputs": {"prompt": {"a": "b"}}}}, 400, "inputs.prompt must be a list of strings"),
    ("too many prompts", {"json": {"inputs": {"prompt": ["a"] * (MAX_PROMPTS + 1)}}}, 413, "inputs.prompt holds"),
    ("too many tokens", {"json": {"inputs": {"prompt": ["The history of " * 2000]}}}, 413, "prompt 1 has"),
])
def test_the_app_refuses_a_bad_request_before_any_model_work(served, what, request_, status, start):
    client, model, lines = served
    calls = model.calls
    answer = client.post("/invocations", **request_)
    assert answer.status_code == status and answer.json()["message"].startswith(start), answer.text
    assert set(answer.json()) == {"error_code", "message"} and len(answer.content) < 300  # nothing quoted
    assert model.calls == calls  # the model never saw it
    assert lines[-1].startswith(f"POST /invocations {status} in ")


def test_the_app_refuses_a_declared_length_over_the_limit_unread(served):
    client, model, _ = served
    answer = client.post("/invocations", content=b"{}", headers={"Content-Type": "application/json",
                                                                  "Content-Length": str(MAX_BODY_BYTES + 1)})
    assert answer.status_code == 413


def test_other_paths_and_methods_are_one_line_too(served):
    client, _, _ = served
    assert client.get("/nope").json() == {"error_code": "NOT_FOUND", "message": "GET /nope: Not Found"}
    assert client.get("/invocations").status_code == 405


def test_a_request_addressed_to_another_host_or_from_another_page_reaches_no_model(served):
    """DNS rebinding: a page of another site whose name resolves to 127.0.0.1 sends that name as Host (400). A page
    that calls 127.0.0.1 itself can send only what a browser sends without asking: not JSON (415)."""
    client, model, _ = served
    calls = model.calls
    for host in ("evil.example", "evil.example:5000", "127.0.0.1.evil.example", "localhost.evil.example:5000"):
        forged = client.post("/invocations", json=GOOD, headers={"Host": host})
        assert forged.status_code == 400, (host, forged.text)
        assert forged.json()["message"].startswith("the Host header names another machine") and host not in forged.text
    simple = client.post("/invocations", content=json.dumps(GOOD).encode(),
                         headers={"Origin": "http://evil.example", "Content-Type": "text/plain"})
    assert simple.status_code == 415, simple.text
    assert model.calls == calls
    for host in ("127.0.0.1:5000", "localhost", "LOCALHOST:8080", "[::1]:5000"):
        assert client.get("/ping", headers={"Host": host}).status_code == 200, host


def test_an_unknown_alias_or_version_names_what_the_registry_has(tmp_path, mlflow_store):
    from mlflow.tracking import MlflowClient

    from lmpipe.errors import LmpipeError
    from lmpipe.serve_app import resolve

    client = MlflowClient(mlflow_store)
    client.create_registered_model("lmpipe-gru")
    for _ in range(2):
        client.create_model_version("lmpipe-gru", source=str(tmp_path))
    client.set_registered_model_alias("lmpipe-gru", "champion", "1")
    client.set_registered_model_alias("lmpipe-gru", "challenger", "2")
    assert resolve("gru", "champion") == ("models:/lmpipe-gru@champion", "1")
    assert resolve("gru", "2") == ("models:/lmpipe-gru/2", "2")
    for alias, message in (
            ("99", "models:/lmpipe-gru/99: lmpipe-gru has no version 99: its versions are 1, 2; its aliases "
                   "challenger (version 2), champion (version 1)"),
            ("best", "models:/lmpipe-gru@best: lmpipe-gru has no alias best: its versions are 1, 2; its aliases "
                     "challenger (version 2), champion (version 1)")):
        with pytest.raises(LmpipeError) as caught:
            resolve("gru", alias)
        assert str(caught.value) == message
    with pytest.raises(LmpipeError) as caught:
        resolve("lstm", "champion")
    assert str(caught.value) == f"models:/lmpipe-lstm@champion: no model 'lstm' in the registry at {mlflow_store} (it has gru)"


def test_a_taken_port_is_one_line():
    import socket

    from lmpipe.errors import LmpipeError
    from lmpipe.serve_app import HOST, listen

    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        with pytest.raises(LmpipeError, match=rf"^port {taken.getsockname()[1]} on {HOST} is not free"):
            listen(taken.getsockname()[1])


def test_a_request_that_would_wait_too_long_is_refused_at_once_with_retry_after(served):
    """While a large request holds the model, a small one is refused in well under a second (503, Retry-After: the
    seconds the queue needs), not left waiting; once the model is free, it is answered."""
    import threading
    import time

    from starlette.testclient import TestClient

    from lmpipe.serve_app import build_app

    _, loaded, _ = served
    release = threading.Event()

    class Held(Loaded):  # the model holds the first request until the test lets it go
        def predict(self, frame, params=None):
            if len(frame) == MAX_PROMPTS:
                release.wait(30)
            return super().predict(frame, params)

    lines = []
    with TestClient(build_app(Held(loaded.generator), {}, lines.append, max_wait_s=0.001), base_url=LOCAL) as client:
        big = {"inputs": {"prompt": ["The history of"] * MAX_PROMPTS}, "params": {"max_new_tokens": 120}}
        answers = []
        first = threading.Thread(target=lambda: answers.append(client.post("/invocations", json=big)))
        first.start()
        while not any(line.startswith("POST") for line in lines) and not client.app.state.worker.busy:
            time.sleep(0.01)
        start = time.monotonic()
        busy = client.post("/invocations", json=GOOD)
        took = time.monotonic() - start
        release.set()
        first.join(60)
        assert busy.status_code == 503 and took < 1.0, busy.text
        assert busy.json()["message"].startswith("the model is busy for about ")
        assert int(busy.headers["Retry-After"]) >= 1
        assert answers[0].status_code == 200 and len(answers[0].json()["predictions"]) == MAX_PROMPTS
        assert client.post("/invocations", json=GOOD).status_code == 200  # the queue is empty again


def test_serve_takes_a_models_name_or_the_registry_uri_generate_takes():
    from lmpipe.errors import LmpipeError
    from lmpipe.serve_app import named

    assert named("gru", "2") == ("gru", "2")
    assert named("models:/lmpipe-gru@champion", "champion") == ("gru", "champion")
    assert named("models:/lmpipe-my-lstm/3", "champion") == ("my-lstm", "3")
    with pytest.raises(LmpipeError, match=r"^--model models:/gru: a registered model is models:/lmpipe-<name>@"):
        named("models:/gru", "champion")


def test_a_batch_running_past_its_estimate_still_holds_the_model():
    """A slower machine than the measured rate (or another process on its cores) makes a batch overrun: the model is
    still busy, so a request sent then waits as long again as the batch is late, not zero seconds."""
    import time

    from lmpipe.serve_app import Worker

    worker = Worker(lambda prompts, params: prompts, seconds=1.0, steps=100.0)
    worker.busy, worker._running_until = True, time.monotonic() - 2.0  # its estimate ran out two seconds ago
    assert 2.0 <= worker.wait() < 3.0
    worker._running_until = time.monotonic() + 1.5  # on time: what is left of it
    assert 1.0 < worker.wait() <= 1.5
    worker.busy, worker._running_until = False, time.monotonic() - 2.0  # done: nothing holds the model
    assert worker.wait() == 0.0
