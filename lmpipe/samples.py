"""Generated text of every model under every decoding strategy, with numbers that compare the strategies."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from tokenizers import Tokenizer

from lmpipe.decode import DecodeSettings, diversity, generate, surprisals
from lmpipe.tables import markdown_table
from lmpipe.tokenize import decode_stream
from lmpipe.utf8 import Utf8Guard


def sample_all(models: dict, tokenizer: Tokenizer, boundary: int, params) -> dict:
    """{model: {strategy: {"samples": [{prompt, text, tokens}], "distinct_1", ..., "mean_surprisal"}}}."""
    base, guard = DecodeSettings.from_params(params), Utf8Guard.for_tokenizer(tokenizer)
    out = {}
    for name, model in models.items():
        out[name] = {}
        for strategy in params.strategies:
            settings = replace(base, strategy=strategy)
            samples, bits = [], []
            for position, prompt in enumerate(params.prompts):
                ids = tokenizer.encode(prompt, add_special_tokens=False).ids
                # each prompt its own random stream, reproducible from evaluate.seed and its place in the list
                new = generate(model, ids, replace(settings, seed=(params.seed, position)), -1, guard)
                bits += surprisals(model, ids, new)
                text = decode_stream(tokenizer, np.array(new + [boundary]), boundary)[:-1]  # boundaries as newlines
                samples.append({"prompt": prompt, "text": text, "tokens": new})
            out[name][strategy] = {"samples": samples, **diversity([s["tokens"] for s in samples]),
                                   "mean_surprisal": float(np.mean(bits)) if bits else 0.0}
    return out


def strategy_table(results: dict) -> dict:
    """Diversity per strategy averaged over models: the strategies compared by numbers."""
    strategies = next(iter(results.values())).keys()
    keys = ("distinct_1", "distinct_2", "repetition_rate", "mean_surprisal")
    return {s: {k: float(np.mean([results[m][s][k] for m in results])) for k in keys} for s in strategies}


def samples_markdown(results: dict, params) -> str:
    lines = ["# Decoding samples", "",
             f"Prompts: {', '.join(repr(p) for p in params.prompts)}; {params.max_new_tokens} new tokens; "
             f"top-k {params.top_k}, top-p {params.top_p}, typical {params.typical_p}, beam {params.beam_size}, "
             f"temperature {params.temperature}, seed {params.seed}"
             + (f", no {params.no_repeat_ngram}-gram repeated" if params.no_repeat_ngram else "") + ".", "",
             "## Diversity per strategy (mean over models)", ""]
    lines += markdown_table(
        ["strategy", "distinct-1", "distinct-2", "repetition rate", "mean surprisal (nats)"],
        [[strategy, f"{row['distinct_1']:.3f}", f"{row['distinct_2']:.3f}", f"{row['repetition_rate']:.3f}",
          f"{row['mean_surprisal']:.2f}"] for strategy, row in strategy_table(results).items()])
    for name, by_strategy in results.items():
        lines += ["", f"## {name}", ""]
        for strategy, result in by_strategy.items():
            lines.append(f"### {strategy}")
            for sample in result["samples"]:
                text = (sample["prompt"] + sample["text"]).replace("\n", " ⏎ ")
                lines.append(f"- {text}")
            lines.append("")
    return "\n".join(lines) + "\n"
