"""Decoding and `lmpipe serve` at a request's limits, on this machine, against the serving targets below.

    python benchmarks/serve.py [--models transformer gru ...]
    python benchmarks/serve.py --smoke      # every part at a tiny size, the first model served: it runs, that is all

Needs the corpus and tokenizer (dvc repro tokenize). Each model is params.yaml's architecture with fresh weights: the
time of a step does not depend on the weights' values, and no served setting stops early (stop_at_boundary is off).
With --trained, the study's trained models (models/<name>/model.pt) instead: their peaked next-token distributions are
what a served request meets, and top-p's and typical sampling's filter work less on them than on a fresh model's
nearly flat ones.

1. Decoding: `lmpipe generate --strategy beam` (and greedy) of each family, carrying the model's state (what every
   path decodes with) against re-reading the whole context every token (what it did before), the same tokens
   checked, side by side in this run: the ratio is the speed-up.
2. Serving, over a socket (uvicorn in a process of its own, as `lmpipe serve` runs it), per model:
   - each request at the limits (lmpipe.serving: MAX_PROMPTS, MAX_PROMPT_TOKENS, MAX_NEW_TOKENS, MAX_WORK), its
     seconds (target: within 10 s);
   - a small request (one prompt, 20 new tokens) sent 1 s into the largest, answered or refused (503) and in how many
     seconds (target: within 2 s);
   - 20 small requests at once: how many answered, and the median seconds (target: all, median under 1 s); once
     with a new client per request (its set-up, an SSL context even for http, costs the caller ~50 ms of CPU,
     which 20 threads under one GIL queue up), once through one client that keeps its connections.
3. Top-p's filter: the head of the vocabulary it sorts (lmpipe.decode) against sorting all of it (what it did
   before), on 8,192-token distributions of the entropies a step meets (softmax of scaled Gaussian logits: from a
   trained model's few bits to a fresh model's nearly flat 13), the same tokens checked.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmpipe import paths  # noqa: E402
from lmpipe.config import load_params  # noqa: E402
from lmpipe.decode_rules import MAX_NEW_TOKENS  # noqa: E402
from lmpipe.decode import DecodeSettings, filter_top_p, generate  # noqa: E402
from lmpipe.models import build_model, load_model  # noqa: E402
from lmpipe.serving import MAX_PROMPT_TOKENS, MAX_PROMPTS, MAX_WORK, PROMPT_TOKENS_PER_STEP  # noqa: E402
from lmpipe.utf8 import Utf8Guard  # noqa: E402


class Reread:
    """The model asked afresh with each whole context: decoding before it carried the model's state."""

    def __init__(self, model):
        self.model = model

    def next_token_distributions(self, contexts):
        return self.model.next_token_distributions(contexts)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def decoding(models: dict, guard, prompt: list[int], lengths=(("beam", 40), ("greedy", 100))) -> None:
    print(f"## Decoding: {len(prompt)}-token prompt; carried state vs re-reading (same tokens checked)")
    print("| model | strategy | new tokens | carried s | re-read s | speed-up |")
    print("|---|---|---|---|---|---|")
    for name, model in models.items():
        for strategy, new in lengths:
            settings = DecodeSettings(strategy=strategy, max_new_tokens=new, beam_size=5)
            carried, a = timed(lambda: generate(model, prompt, settings, -1, guard))
            reread, b = timed(lambda: generate(Reread(model), prompt, settings, -1, guard))
            assert a == b, f"{name} {strategy}: the carried state gave other tokens than re-reading"
            print(f"| {name} | {strategy} | {new} | {carried:.2f} | {reread:.2f} | {reread / carried:.1f}x |",
                  flush=True)


def limit_requests(text_prompt: str, short: str) -> dict[str, dict]:
    """The largest requests the limits allow, each at MAX_WORK or next to it."""
    long_new = MAX_WORK // MAX_PROMPTS - MAX_PROMPT_TOKENS // PROMPT_TOKENS_PER_STEP
    return {
        f"{MAX_PROMPTS} prompts of {MAX_PROMPT_TOKENS} tokens, {long_new} new": {
            "inputs": {"prompt": [text_prompt] * MAX_PROMPTS}, "params": {"max_new_tokens": long_new}},
        f"1 prompt of {MAX_PROMPT_TOKENS} tokens, {MAX_NEW_TOKENS} new": {
            "inputs": {"prompt": [text_prompt]}, "params": {"max_new_tokens": MAX_NEW_TOKENS}},
        f"{MAX_PROMPTS} short prompts, {MAX_WORK // MAX_PROMPTS - 1} new": {
            "inputs": {"prompt": [short] * MAX_PROMPTS}, "params": {"max_new_tokens": MAX_WORK // MAX_PROMPTS - 1}},
        f"1 short prompt, beam of 5, {(MAX_WORK - 1) // 5} new": {
            "inputs": {"prompt": [short]}, "params": {"strategy": "beam", "max_new_tokens": (MAX_WORK - 1) // 5}},
    }


def build(name: str, tokenizer, trained: bool = False):
    """params.yaml's architecture of `name`, fresh weights (or the study's trained model), in eval mode."""
    if trained:
        return load_model(Path(paths.model_dir(name)) / "model.pt").eval()
    params = load_params("params.yaml")
    torch.manual_seed(0)
    return build_model(params.models[name].family, params.models[name].arch, tokenizer.get_vocab_size(),
                       boundary=0).eval()


def serve_child(name: str, port: int, trained: bool) -> None:
    """`lmpipe serve`'s app on `name` in a process of its own, as the command runs it (its own interpreter: the
    clients below do not share its GIL)."""
    import uvicorn
    from tokenizers import Tokenizer

    from lmpipe.serve_app import build_app, listen
    from lmpipe.serving import TextGenerator
    from lmpipe.tokenize import boundary_id

    class Loaded:  # what mlflow.pyfunc.load_model returns
        def __init__(self, generator):
            self.generator = generator

        def unwrap_python_model(self):
            return self.generator

        def predict(self, frame, params=None):
            return self.generator.predict(None, frame, params)

    tokenizer = Tokenizer.from_file(paths.TOKENIZER)
    generator = TextGenerator()
    generator.lm, generator.tokenizer = build(name, tokenizer, trained), tokenizer
    generator.boundary, generator.defaults = boundary_id(tokenizer, "<|endoftext|>"), DecodeSettings()
    uvicorn.Server(uvicorn.Config(build_app(Loaded(generator), {}), log_config=None, log_level="warning",
                                  lifespan="off")).run(sockets=[listen(port)])


def serving(name: str, requests: dict[str, dict], trained: bool, burst: int = 20) -> None:
    import multiprocessing
    import socket

    import httpx

    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = multiprocessing.get_context("spawn").Process(target=serve_child, args=(name, port, trained), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}/invocations"
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)

    shared = httpx.Client(timeout=300, limits=httpx.Limits(max_connections=32))  # thread-safe, one pool

    def post(body, client=None):
        """The request's seconds and status: through `client` (connections kept), or a client of its own, whose
        setting up (an SSL context, ~50 ms of the caller's CPU, even for http) the seconds then include."""
        start = time.perf_counter()
        answer = (client or httpx).post(url, json=body, timeout=300)
        return time.perf_counter() - start, answer.status_code

    small = {"inputs": {"prompt": ["The history of"]}, "params": {"max_new_tokens": 20}}
    print(f"\n## Serving {name}: each request at the limits (target: within 10 s)")
    print("| request | status | seconds |")
    print("|---|---|---|")
    for what, body in requests.items():
        seconds, status = post(body)
        print(f"| {what} | {status} | {seconds:.1f} |", flush=True)
    largest = next(iter(requests.values()))
    with ThreadPoolExecutor(2) as pool:
        big = pool.submit(post, largest)
        time.sleep(1.0)
        during = post(small)
        big_seconds, big_status = big.result()
    print(f"\nA small request 1 s into the first ({big_status} in {big_seconds:.1f} s): {during[1]} in "
          f"{during[0]:.2f} s (target: within 2 s)")
    for client, how in ((None, "a new client each, as before"), (shared, "one client, its connections kept")):
        time.sleep(0.5)
        with ThreadPoolExecutor(burst) as pool:
            results = list(pool.map(lambda body: post(body, client), [small] * burst))
        answered = sum(status == 200 for _, status in results)
        print(f"{burst} small requests at once ({how}): {answered} answered, median "
              f"{statistics.median(s for s, _ in results):.2f} s, slowest {max(s for s, _ in results):.2f} s "
              "(target: all, median under 1 s)", flush=True)
    shared.close()
    server.terminate()
    server.join(10)


def sampling_filter(top_p: float = 0.9, vocab: int = 8192, draws: int = 200) -> None:
    print(f"\n## Top-p ({top_p}) filter of {vocab:,} probabilities: the head it sorts vs a full stable sort")
    print("| entropy, bits | tokens kept | full sort us | head us | speed-up |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(0)

    def full_sort(p):
        order = np.argsort(-p, kind="stable")
        n = int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)
        out = np.zeros_like(p)
        out[order[:n]] = p[order[:n]]
        return out / out.sum()

    for scale in (5.0, 4.0, 3.0, 2.5, 2.0, 0.5):
        logits = rng.standard_normal((draws, vocab)) * scale
        probs = [torch.softmax(torch.from_numpy(z).float(), -1).numpy() for z in logits]
        assert all(np.array_equal(filter_top_p(p, top_p), full_sort(p)) for p in probs)
        bits = np.mean([-(p * np.log2(np.maximum(p, 1e-30))).sum() for p in probs])
        kept = np.mean([np.count_nonzero(full_sort(p)) for p in probs])
        full, head = (timed(lambda f=f: [f(p) for p in probs])[0] / draws * 1e6
                      for f in (full_sort, lambda p: filter_top_p(p, top_p)))
        print(f"| {bits:.1f} | {kept:.0f} | {full:.0f} | {head:.0f} | {full / head:.1f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "gru", "lstm", "rnn", "nplm"])
    parser.add_argument("--no-serving", action="store_true", help="the decoding table only")
    parser.add_argument("--smoke", action="store_true", help="every part at a tiny size (a test that it runs)")
    parser.add_argument("--trained", action="store_true", help="the study's trained models (models/<name>/model.pt), "
                                                                "not fresh weights")
    args = parser.parse_args()
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(paths.TOKENIZER)
    models = {name: build(name, tokenizer, args.trained) for name in args.models}
    text = Path(paths.CLEAN, "valid.txt").read_text(encoding="utf-8")
    ids = tokenizer.encode(text[:200_000], add_special_tokens=False).ids
    text_prompt = tokenizer.decode(ids[:MAX_PROMPT_TOKENS - 64])  # re-encoded, still within MAX_PROMPT_TOKENS
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    if args.smoke:  # a short prompt, few new tokens, few draws, one small request and a burst of three
        decoding(models, Utf8Guard.for_tokenizer(tokenizer), ids[:40], (("beam", 4), ("greedy", 8)))
        sampling_filter(draws=5)
        requests = {"1 short prompt, 4 new": {"inputs": {"prompt": ["The history of"]},
                                              "params": {"max_new_tokens": 4}}}
    else:
        decoding(models, Utf8Guard.for_tokenizer(tokenizer), ids[:400])
        sampling_filter()
        requests = limit_requests(text_prompt, "The history of")
    if not args.no_serving:
        for name in list(models)[:1] if args.smoke else models:
            serving(name, requests, args.trained, burst=3 if args.smoke else 20)


if __name__ == "__main__":
    main()
