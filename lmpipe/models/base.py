"""What every neural LM shares: one streaming interface, so one trainer, evaluator and decoder serve all.

`forward(x, state) -> (logits, state, aux_loss)` reads a (batch, time) chunk of a token stream and returns
logits for every position, the state needed to continue the stream (hidden states for RNNs, the last tokens for
window models: NPLM, Transformer), so chunked reading equals one long pass, and the model's own regularisation
of this pass, which training adds to the loss (AR/TAR for AWD-LSTM; 0.0 for the others, and when not training).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class StreamLM(nn.Module):
    recurrent = False  # recurrent models train on batchified streams; window models on shuffled windows
    boundary = 0

    def forward(self, x: torch.Tensor, state=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def detach_state(self, state):
        """Cut the graph at a chunk boundary (truncated BPTT); token contexts have no graph."""
        if state is None:
            return None
        if isinstance(state, torch.Tensor):
            return state.detach()
        return tuple(s.detach() for s in state) if isinstance(state, tuple) else [self.detach_state(s) for s in state]

    def embedding_matrix(self) -> torch.Tensor:
        """The input embedding table (vocab, dim): what the bias audit reads."""
        return self.embed.weight

    def output_matrix(self) -> torch.Tensor:
        """The output (decoder) rows, one per token: the same tensor as the input table when tied."""
        for name in ("decoder", "head", "out"):
            if hasattr(self, name):
                return getattr(self, name).weight
        raise AttributeError(f"{type(self).__name__} has no output layer")

    def next_token_distribution(self, context) -> np.ndarray:
        """P(next token | boundary + context) over the vocabulary: the decoding interface shared with the n-gram."""
        return self.next_token_distributions([context])[0]

    @torch.no_grad()
    def next_token_distributions(self, contexts) -> np.ndarray:
        """The same for several equally long contexts (beams) in one forward pass, re-reading each context: what
        `start_decoding` and `step_decoding` compute one new token at a time."""
        was_training = self.training
        self.eval()
        tokens = self._context_tensor(contexts)
        logits, _, _ = self(tokens[:, self.window_start(tokens.size(1)):], None)
        self.train(was_training)
        return self.probabilities(logits[:, -1])

    def window_start(self, length: int) -> int:
        """Where the context a prediction reads begins, after `length` tokens: all of them, but for a window model."""
        return 0

    def _context_tensor(self, contexts) -> torch.Tensor:
        device = next(self.parameters()).device
        return torch.tensor([[self.boundary] + [int(t) for t in c] for c in contexts], device=device)

    # Incremental decoding: the context is read once, then each new token costs one step of the carried state.
    # Call in eval mode; `rows` picks, for each new token, the context it extends (beam search reorders).

    @torch.no_grad()
    def start_decoding(self, contexts) -> tuple[torch.Tensor, object]:
        """Next-token logits after boundary + each of several equally long contexts, and the state that continues
        them (`step_decoding`)."""
        logits, state, _ = self(self._context_tensor(contexts), None)
        return logits[:, -1], state

    @torch.no_grad()
    def step_decoding(self, state, tokens: torch.Tensor, rows: torch.Tensor | None = None):
        """The logits after one more token per context (`tokens`, shape (B,)) and the state after it."""
        if rows is not None:
            state = self.select_state(state, rows)
        logits, state, _ = self(tokens[:, None], state)
        return logits[:, -1], state

    def select_state(self, state, rows: torch.Tensor):
        """The state of the contexts `rows`, in that order: a window model's state is its last tokens (B, n)."""
        return state[rows]

    def join_states(self, states: list):
        """The states of several contexts as one batch, in order (None where they cannot be stacked)."""
        return torch.cat(states, dim=0)

    @staticmethod
    def probabilities(logits: torch.Tensor) -> np.ndarray:
        """Next-token probabilities as decoding reads them: float64 NumPy rows."""
        return torch.softmax(logits.float(), dim=-1).cpu().double().numpy()

