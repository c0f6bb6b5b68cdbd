"""The neural LM families, built by name from params: `build_model(family, arch, vocab_size, boundary)`."""

from __future__ import annotations

from torch import nn

from lmpipe.models.base import NextTokenLogits, StreamLM  # noqa: F401
from lmpipe.models.nplm import NPLM
from lmpipe.models.rnn import RNNModel
from lmpipe.models.transformer import TransformerLM

FAMILIES = {"nplm": NPLM, "rnn": RNNModel, "transformer": TransformerLM}


def build_model(family: str, arch: dict, vocab_size: int, boundary: int) -> StreamLM:
    """`arch` holds the constructor's keyword arguments (params.yaml: models.<name>.arch)."""
    return FAMILIES[family](vocab_size=vocab_size, boundary=boundary, **arch)


def arch_with_defaults(family: str, arch: dict) -> dict:
    """`arch` with every constructor default filled in: the whole architecture, e.g. for counting FLOPs."""
    from lmpipe.config import arch_defaults

    return {**arch_defaults(family), **arch}


def save_model(model: StreamLM, family: str, arch: dict, path) -> None:
    """Weights plus what rebuilds the model: loadable with `load_model` without params.yaml."""
    import torch

    torch.save({"family": family, "arch": dict(arch), "vocab_size": model.embed.num_embeddings,
                "boundary": model.boundary, "state_dict": model.state_dict()}, path)


def load_model(path, device="cpu") -> StreamLM:
    import torch

    saved = torch.load(path, map_location=device, weights_only=False)
    model = build_model(saved["family"], saved["arch"], saved["vocab_size"], saved["boundary"])
    model.load_state_dict(saved["state_dict"])
    return model.to(device).eval()


def count_parameters(model) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def count_non_embedding_parameters(model) -> int:
    """Parameters outside the token (and position) embedding tables: the N of scaling laws (Kaplan et al.)."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values() if id(p) not in tables)


__all__ = ["NPLM", "RNNModel", "TransformerLM", "StreamLM", "arch_with_defaults", "build_model", "count_parameters",
           "count_non_embedding_parameters", "load_model", "save_model"]
