"""The ARPA export of an interpolated Kneser-Ney model: the text format KenLM and SRILM load."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np

from lmpipe.errors import LmpipeError
from lmpipe.ngram.counts import BITS, WORD_SHIFT, tokens_of
from lmpipe.ngram.model import NGramLM

ARPA_CHUNK = 1 << 20  # n-grams formatted at a time: the export's memory does not grow with the model


def export(model_dir: str | Path, out: str | Path) -> str:
    """`lmpipe ngram export-arpa`: the model in `model_dir` written to `out`, with a progress bar on a terminal;
    what was written, in a line."""
    import sys

    from tqdm.auto import tqdm

    if not (Path(model_dir) / "ngram.json").exists():
        raise LmpipeError(f"{model_dir}: no n-gram model there (run: dvc repro ngram)")
    model = NGramLM.load(model_dir)
    if model.method != "kneser_ney":
        raise LmpipeError(f"{model_dir}: ARPA needs a kneser_ney model, this one is {model.method} (set ngram.method)")
    with tqdm(total=sum(arpa_counts(model).values()), desc=f"writing {out}", unit=" n-grams", unit_scale=True,
              disable=not sys.stderr.isatty()) as bar:
        counts = write_arpa(model, out, bar.update)
    return (f"wrote {out}: " + ", ".join(f"{n} {k}-grams" for k, n in counts.items())
            + "\ntokens are written as their ids; the boundary token is </s> (and <s> as context)")


def arpa_counts(model: NGramLM) -> dict:
    """How many n-grams of each order the ARPA file lists (the unigrams with <s> and <unk>)."""
    return {k: (model.vocab_size + 2 if k == 1 else len(model.tables[k - 1].keys)) for k in range(1, model.order + 1)}


def write_arpa(model: NGramLM, path: str | Path, on_written: Callable[[int], None] = lambda rows: None) -> dict:
    """Export an interpolated Kneser-Ney model in ARPA backoff form (KenLM, SRILM), streamed to disk; `on_written`
    hears how many n-grams each chunk wrote (a progress bar).

    Tokens are written as their ids; the boundary is `</s>` when predicted and `<s>` as context.
    Each listed n-gram carries its full interpolated log10 probability, each context its backoff
    log10(gamma), so backoff arithmetic reproduces the interpolated model exactly.
    """
    if model.method != "kneser_ney":
        raise ValueError(f"ARPA export needs a backoff-form model (kneser_ney), not {model.method}")
    names = np.array([str(i) for i in range(model.vocab_size)], dtype=object)
    names[model.boundary] = "</s>"
    counts = arpa_counts(model)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write("\\data\\\n" + "".join(f"ngram {k}={n}\n" for k, n in counts.items()) + "\n")
        for k in range(1, model.order + 1):
            out.write(f"\\{k}-grams:\n")
            n = model.vocab_size if k == 1 else len(model.tables[k - 1].keys)
            for start in range(0, n, ARPA_CHUNK):
                out.writelines(_arpa_rows(model, k, names, slice(start, min(n, start + ARPA_CHUNK))))
                on_written(min(n, start + ARPA_CHUNK) - start)
            if k == 1:
                out.write(f"-99\t<s>{_bos_backoff(model)}\n-99\t<unk>\n")
                on_written(2)
            out.write("\n")
        out.write("\\end\\\n")
    os.replace(tmp, path)
    return counts


def _arpa_rows(model: NGramLM, k: int, names: np.ndarray, rows: slice) -> list[str]:
    """ARPA lines of the order-k n-grams in `rows` (for k = 1: of the word ids in `rows`)."""
    table = model.tables[k - 1]
    if k == 1:
        words = np.arange(rows.start, rows.stop, dtype=np.uint64)
        contexts = np.zeros(len(words), dtype=np.uint64)
    else:
        keys = np.asarray(table.keys[rows])
        contexts, words = np.asarray(table.contexts)[(keys >> WORD_SHIFT).astype(np.int64)], keys & np.uint64(0xFFFFFFFF)
    # the context as seen from order j: its most recent j - 1 tokens, the highest bits (orders above k unused)
    by_order = [contexts >> np.uint64(BITS * (k - j)) if 1 < j <= k else np.zeros_like(contexts)
                for j in range(1, model.order + 1)]
    prob = model._probabilities(by_order, np.full(len(words), k - 1), words)
    tokens = tokens_of(contexts, words, k)
    backoff = np.full(len(words), np.nan)  # of each n-gram as a context one order up: gamma numerator / total
    if k < model.order:
        upper = model.tables[k]
        key = np.zeros(len(words), dtype=np.uint64)
        for j in range(k):
            key |= tokens[:, j].astype(np.uint64) << np.uint64(BITS * j)
        ci = np.minimum(np.searchsorted(upper.contexts, key), len(upper.contexts) - 1)
        seen = upper.contexts[ci] == key
        backoff = np.where(seen, upper.context_gamma[ci] / np.where(seen, upper.context_total[ci], 1), np.nan)
    lines = []
    for p, row, b in zip(np.log10(prob), tokens, backoff):
        text = " ".join("<s>" if (j == 0 and k > 1 and t == model.boundary) else names[t] for j, t in enumerate(row))
        lines.append(f"{p:.7f}\t{text}" + ("" if np.isnan(b) else f"\t{np.log10(b) if b > 0 else -99:.7f}") + "\n")
    return lines


def _bos_backoff(model: NGramLM) -> str:
    """The backoff weight of <s> as a unigram context, from the bigram table ('' for a unigram model)."""
    if model.order == 1:
        return ""
    start, key = model.tables[1], np.uint64(model.boundary)
    ci = int(np.searchsorted(start.contexts, key))
    if ci < len(start.contexts) and start.contexts[ci] == key:
        return f"\t{np.log10(start.context_gamma[ci] / start.context_total[ci]):.7f}"
    return ""
