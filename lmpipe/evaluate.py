"""One evaluator for every neural model: the split as one continuous stream, state carried across chunks.

Recurrent models carry their hidden state; window models carry their last tokens, so a Transformer
is scored with a sliding window whose stride is the chunk, at most half its block (each token once, with
at least half a block of context: a stride of a whole block would score each window's first token with
none) and the NPLM with exactly its n-1 tokens. The stream is conditioned on one
boundary token before its first token, as the n-gram is.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from lmpipe.perplexity import perplexities  # noqa: F401  (re-exported: the evaluator's companion)


@torch.no_grad()
def stream_nll(model, tokens: np.ndarray, chunk: int, device: torch.device | str | None = None,
               token_logprobs: list | None = None) -> tuple[float, int]:
    """Total natural-log loss of every token of `tokens`, and how many were scored, computed where the model's
    weights are unless `device` says otherwise; each token's log-probability (float32) goes to `token_logprobs`
    when one is given."""
    model.eval()
    device = device or next(model.parameters()).device
    stream = torch.from_numpy(np.concatenate([[model.boundary], np.asarray(tokens, dtype=np.int64)]))
    stream = stream.to(device).unsqueeze(0)
    inputs, targets = stream[:, :-1], stream[:, 1:]
    if hasattr(model, "block_size"):
        chunk = min(chunk, max(1, model.block_size // 2))
    total = torch.zeros((), dtype=torch.float64, device=device)
    state = None
    for start in range(0, inputs.size(1), chunk):
        logits, state, _ = model(inputs[:, start:start + chunk], state)
        logits, target = logits.float().flatten(0, 1), targets[:, start:start + chunk].flatten()
        total += F.cross_entropy(logits, target, reduction="sum")
        if token_logprobs is not None:
            token_logprobs.append(-F.cross_entropy(logits, target, reduction="none").cpu().numpy())
    return float(total), int(targets.size(1))


def evaluate_lm(model, data, chunk: int = 128, device: str | None = None, token_logprobs: dict | None = None,
                splits: tuple[str, ...] = ("valid", "test")) -> dict:
    """valid and test (or `splits`) loss/ppl/word_ppl/bpb of any model, with the same accounting for all; each token's
    log-probability per split (float32) goes to `token_logprobs` when one is given (what `combine` mixes). A neural
    model is scored on the device its weights are on (a GPU-trained one on the GPU) unless `device` says otherwise.
    A model that scores a whole token sequence itself (the n-gram: `token_log_probs`, and its size as `n_ngrams`) is
    asked for it, so this module needs no n-gram code: training, which scores its validation stream here, does not
    depend on the n-gram."""
    from lmpipe.models import count_parameters

    counted = hasattr(model, "token_log_probs")
    out = {}
    for name in splits:
        split, kept = data.splits[name], []
        if counted:
            scores = model.token_log_probs(split.tokens)
            nll, n = -float(scores.sum()), len(split.tokens)
            kept.append(scores.astype(np.float32))
        else:
            nll, n = stream_nll(model, split.tokens, chunk, device, kept)
        out[name] = perplexities(nll, n, split.words, split.bytes)
        if token_logprobs is not None:
            token_logprobs[name] = np.concatenate(kept)
    out["n_params"] = model.n_ngrams if counted else count_parameters(model)
    return out
