"""The neural LM families, built by name from params: `build_model(family, arch, vocab_size, boundary)`.
The registry is `lmpipe.families.FAMILIES` (family -> its settings, which name its class here), read without torch."""

from __future__ import annotations

import importlib

from torch import nn

from lmpipe.model_params import arch_settings
from lmpipe.families import FAMILIES as SETTINGS
from lmpipe.models.base import StreamLM  # noqa: F401
from lmpipe.models.nplm import NPLM
from lmpipe.models.rnn import RNNModel
from lmpipe.models.transformer import TransformerLM


def _model_class(family: str) -> type[StreamLM]:
    module, name = SETTINGS[family].model.split(":")
    return getattr(importlib.import_module(module), name)


FAMILIES = {family: _model_class(family) for family in SETTINGS}


def build_model(family: str, arch: dict, vocab_size: int, boundary: int) -> StreamLM:
    """`arch`: the family's settings that differ from their defaults (params.yaml: models.<name>.arch)."""
    return FAMILIES[family](vocab_size=vocab_size, boundary=boundary, **arch)


def arch_with_defaults(family: str, arch: dict) -> dict:
    """`arch` with every default filled in (lmpipe.families): the whole architecture, e.g. for counting FLOPs."""
    return arch_settings(family, arch).model_dump()


def save_model(model: StreamLM, family: str, arch: dict, path) -> None:
    """Weights plus what rebuilds the model: loadable with `load_model` without params.yaml."""
    import torch

    torch.save({"family": family, "arch": dict(arch), "vocab_size": model.embed.num_embeddings,
                "boundary": model.boundary, "state_dict": model.state_dict()}, path)


def load_model(path, device="cpu") -> StreamLM:
    """A model saved by `save_model`. Read with `weights_only=True`: tensors and plain values only, so a file from
    elsewhere cannot run code; a torn, foreign or corrupt file is one line naming it and how to restore it."""
    from pathlib import Path

    import torch

    from lmpipe.errors import ModelFileError, first_line

    path = Path(path)
    if not path.is_file():
        stage = f" train@{path.parent.name}" if path.parent.parent.name == "models" else ""
        raise ModelFileError(f"{path}: no model file there (train it: dvc repro{stage})")
    try:
        saved = torch.load(path, map_location=device, weights_only=True)
        model = build_model(saved["family"], saved["arch"], saved["vocab_size"], saved["boundary"])
        model.load_state_dict(saved["state_dict"])
    except Exception as exc:
        import pickle

        restore = (f"restore the study's copy: dvc checkout --force train@{path.parent.name}"
                   if path.parent.parent.name == "models" else "use a model.pt written by lmpipe")
        if isinstance(exc, pickle.UnpicklingError):  # torch's own advice (weights_only=False) would run the file's code
            raise ModelFileError(f"{path}: not an lmpipe model (it holds objects other than tensors and plain values, "
                                 f"which lmpipe never loads); {restore}") from None
        first = first_line(str(exc)) or type(exc).__name__
        raise ModelFileError(f"{path}: not a readable lmpipe model ({type(exc).__name__}: {first}); {restore}") from None
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
