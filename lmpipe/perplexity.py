"""The study's one definition of perplexity, shared by the n-gram and the neural models."""

from __future__ import annotations

import math


def perplexities(nll: float, tokens: int, words: int, n_bytes: int) -> dict:
    """loss and ppl per BPE token, word_ppl per whitespace word, bpb in bits per UTF-8 byte.

    Normalising the same total NLL by words and bytes lets models with different tokenizations compare.
    """
    return {
        "loss": nll / tokens,
        "ppl": math.exp(nll / tokens),
        "word_ppl": math.exp(nll / words),
        "bpb": nll / math.log(2) / n_bytes,
    }
