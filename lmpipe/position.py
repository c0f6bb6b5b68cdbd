"""Loss by context position (Kaplan et al. 2020, Fig. 7): how much each family gains from the tokens it has read.

The test stream is cut into non-overlapping windows and each window is scored as if it were a stream of its own:
conditioned on one boundary token before its first token (as `lmpipe.evaluate.stream_nll` conditions the whole
stream), from an empty context. A recurrent model starts each window from its zero state; the NPLM's fixed context
is padded with boundary tokens at the window's start, as it is at the stream's start; the transformer sees only the
window's tokens before the position (beyond its block it slides with the evaluator's stride, half a block, so a
window longer than the block shows where the block cuts the context off); the n-gram's history stops at the window's
start (a boundary token there, so KN backs off to its `<s>` context as at the start of a line).

Losses are natural-log (nats per token), the unit Kaplan et al. plot: a per-position bits-per-byte would divide by
the bytes of the tokens at that position, which differ by position for reasons that are not the model's.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

LOGITS_AT_ONCE = 1 << 24  # logits (floats) held at a time: rows x chunk x vocabulary; 64 MiB in fp32


def windows_of(tokens: np.ndarray, window: int) -> np.ndarray:
    """The stream as non-overlapping windows (rows) of `window` tokens; a last, shorter stretch is left out, so
    every position has the same windows behind its mean."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    tokens = np.asarray(tokens, dtype=np.int64)
    n = len(tokens) // window
    if n == 0:
        raise ValueError(f"a stream of {len(tokens)} tokens holds no window of {window}")
    return tokens[:n * window].reshape(n, window)


def window_losses(model, tokens: np.ndarray, window: int, device: torch.device | str | None = None,
                  chunk: int = 128) -> np.ndarray:
    """Each token's loss in nats, shape (windows, window): row i is window i of the stream, column p the loss of
    the token at position p, every window read from an empty context."""
    from lmpipe.ngram import NGramLM

    windows = windows_of(tokens, window)
    if isinstance(model, NGramLM):
        return _ngram_losses(model, windows)
    return _neural_losses(model, windows, device, chunk)


def loss_by_position(model, tokens: np.ndarray, window: int, device: torch.device | str | None = None,
                     chunk: int = 128) -> np.ndarray:
    """Mean loss in nats at each position 0..window-1 over the windows of `tokens` (`window_losses`)."""
    return window_losses(model, tokens, window, device, chunk).mean(axis=0)


def seed_bands(curves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample sd at each position over one model's seeds (the band of the figure); the sd is NaN with one
    seed, which has no spread."""
    stacked = np.stack([np.asarray(c, dtype=np.float64) for c in curves])
    sd = stacked.std(axis=0, ddof=1) if len(stacked) > 1 else np.full(stacked.shape[1], np.nan)
    return stacked.mean(axis=0), sd


@torch.no_grad()
def _neural_losses(model, windows: np.ndarray, device, chunk: int) -> np.ndarray:
    """Every window a row of one batch, read chunk by chunk with the state carried from None, exactly as
    `stream_nll` reads one stream: batched, so a window costs one pass, no loop over tokens."""
    model.eval()
    device = device or next(model.parameters()).device
    if hasattr(model, "block_size"):  # the evaluator's stride: within the block every position sees its whole window
        chunk = min(chunk, max(1, model.block_size // 2))
    n, window = windows.shape
    chunk = min(chunk, window)
    targets = torch.from_numpy(windows)
    inputs = torch.cat([torch.full((n, 1), model.boundary, dtype=torch.int64), targets[:, :-1]], dim=1)
    vocab = model.output_matrix().size(0)
    rows = max(1, LOGITS_AT_ONCE // (chunk * vocab))
    out = np.empty((n, window), dtype=np.float64)
    for first in range(0, n, rows):
        x, y = inputs[first:first + rows].to(device), targets[first:first + rows].to(device)
        state = None
        for start in range(0, window, chunk):
            logits, state, _ = model(x[:, start:start + chunk], state)
            nll = F.cross_entropy(logits.float().transpose(1, 2), y[:, start:start + chunk], reduction="none")
            out[first:first + rows, start:start + chunk] = nll.double().cpu().numpy()
    return out


def _ngram_losses(model, windows: np.ndarray) -> np.ndarray:
    """One vectorised pass over the windows joined by boundary tokens: the n-gram never reads across a boundary,
    so each window is scored as a stream of its own, then the boundaries' own scores are dropped."""
    n, window = windows.shape
    joined = np.concatenate([np.full((n, 1), model.boundary, dtype=np.int64), windows], axis=1).ravel()
    log_p = model.token_log_probs(joined[1:])  # token_log_probs puts the first boundary before the stream itself
    return -np.concatenate([[0.0], log_p]).reshape(n, window + 1)[:, 1:]
