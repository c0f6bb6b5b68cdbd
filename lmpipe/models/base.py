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
        """The same for several equally long contexts (beams) in one forward pass."""
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        tokens = torch.tensor([[self.boundary] + [int(t) for t in c] for c in contexts], device=device)
        window = getattr(self, "block_size", None)
        logits, _, _ = self(tokens[:, -window:] if window else tokens, None)
        self.train(was_training)
        return torch.softmax(logits[:, -1].float(), dim=-1).cpu().double().numpy()
