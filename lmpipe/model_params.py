"""A model's entry of params.yaml (`models.<name>`): its family and arch, its optimiser, how long it trains.

The entry states every setting that applies to it and none that does not (decay_fraction with the wsd schedule,
momentum and NT-ASGD with SGD, variable_bptt on a recurrent family, patience with epochs): pydantic refuses both a
missing and an idle one. `arch` states what differs from its family's defaults (lmpipe/families.py).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from lmpipe.errors import describe_error
from lmpipe.families import FAMILIES


class Section(BaseModel):
    """A part of params.yaml: every key known, values frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _OptimBase(Section):
    """What every optimiser takes: the rate, its schedule, weight decay and clipping."""

    lr: float = Field(gt=0)
    weight_decay: float = Field(ge=0)
    clip: float = Field(gt=0, description="gradient-norm clipping")
    schedule: Literal["constant", "cosine", "wsd", "plateau"] = Field(
        description="wsd: warmup, stable, then a linear decay to 0 over the last decay_fraction of steps")
    warmup_steps: int = Field(ge=0)
    decay_fraction: Optional[float] = Field(None, gt=0, le=1, description="wsd only: the share of the run spent "
                                            "decaying")

    @model_validator(mode="after")
    def _decay_with_wsd(self):
        if self.schedule == "wsd" and self.decay_fraction is None:
            raise ValueError("schedule wsd needs decay_fraction, the share of the run spent decaying (e.g. 0.25)")
        if self.schedule != "wsd" and self.decay_fraction is not None:
            raise ValueError("decay_fraction is the wsd schedule's setting: remove it, or set schedule: wsd")
        return self


class AdamParams(_OptimBase):
    name: Literal["adam", "adamw", "muon"] = Field(
        description="muon: Muon on the hidden matrices, AdamW on embeddings, head, norms (lmpipe/optim.py)")


class SGDParams(_OptimBase):
    """SGD, and AWD-LSTM's switch to averaged SGD (NT-ASGD)."""

    name: Literal["sgd"]
    momentum: float = Field(ge=0, lt=1)
    nt_asgd: bool = Field(description="switch to averaged SGD when valid stops improving")
    nonmono: int = Field(ge=1, description="NT-ASGD: checks without improvement before averaging starts")


def optimiser_type(optim) -> type[_OptimBase]:
    """The class of an `optim` entry (a dict or its model): SGD's for `name: sgd`, else Adam's (adam, adamw, muon)."""
    name = optim.get("name") if isinstance(optim, dict) else getattr(optim, "name", None)
    return SGDParams if name == "sgd" else AdamParams


# One type per optimiser: a model states the settings its optimiser uses (momentum and NT-ASGD are SGD's)
OptimParams = Annotated[Union[Annotated[AdamParams, Tag("adam")], Annotated[SGDParams, Tag("sgd")]],
                        Discriminator(lambda optim: "sgd" if optimiser_type(optim) is SGDParams else "adam")]


def arch_settings(family: str, arch: dict) -> BaseModel:
    """A registered family's arch with its defaults, checked: a ValueError naming the first bad setting."""
    schema = FAMILIES[family]
    unknown = sorted(set(arch) - set(schema.model_fields))
    if unknown:
        raise ValueError(f"arch has {unknown}, not settings of a {family} (allowed: {', '.join(schema.model_fields)})")
    try:
        return schema.model_validate(arch)
    except ValidationError as exc:
        raise ValueError(describe_error(exc.errors()[0], "arch")) from None


class Budget(Section):
    """A run's length in compute instead of epochs: training tokens, or training FLOPs (lmpipe.flops)."""

    tokens: Optional[int] = Field(None, ge=1)
    flops: Optional[float] = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_of(self):
        if (self.tokens is None) == (self.flops is None):
            raise ValueError("budget needs exactly one of tokens or flops")
        return self


class ModelParams(Section):
    """One entry of `models`: its family, architecture and how it trains. A run's length is the study's budget unless
    the entry states `epochs` (with `patience`) or a `budget` of its own, not both; `variable_bptt` stands on
    recurrent families only. `arch` states what differs from its family's defaults (lmpipe/families.py)."""

    family: str = Field(description="a registered family (lmpipe.families): nplm, rnn, transformer, ...")
    arch: dict
    optim: OptimParams
    batch_size: int = Field(ge=1)
    seq_len: int = Field(ge=2, description="BPTT length (recurrent) or window length (nplm, transformer)")
    variable_bptt: Optional[bool] = Field(None, description="recurrent only: AWD-LSTM's random BPTT lengths, lr "
                                          "rescaled")
    epochs: Optional[int] = Field(None, ge=1, description="train this many epochs, stopping early (patience), "
                                  "instead of the study's budget: not compute-matched")
    patience: Optional[int] = Field(None, ge=1, description="with epochs only: evaluations without a better valid "
                                    "loss before stopping")
    budget: Optional[Budget] = Field(None, description="train for this many tokens or FLOPs instead of the study's "
                                     "budget: not compute-matched")
    max_steps_per_epoch: Optional[int] = Field(ge=1, description="cap for quick runs (null: none)")

    @model_validator(mode="after")
    def _fits_family(self):
        """A registered family; one run length at most, patience with epochs; variable_bptt where it applies; an arch
        the family takes."""
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} is not registered (have: {', '.join(FAMILIES)}; "
                             "register yours in lmpipe/families.py FAMILIES)")
        if self.epochs is not None and self.budget is not None:
            raise ValueError("states both epochs and budget: a run's length is one of them (remove one)")
        if self.patience is not None and self.epochs is None:
            raise ValueError("patience stops a run of `epochs` early; a budget trains to its end (remove it)")
        if self.epochs is not None and self.patience is None:
            raise ValueError("a run of `epochs` needs patience: evaluations without a better valid loss before "
                             "it stops (e.g. 3)")
        recurrent = FAMILIES[self.family].recurrent
        if recurrent and self.variable_bptt is None:
            raise ValueError(f"a {self.family} states variable_bptt: true for AWD-LSTM's random BPTT lengths, or false")
        if not recurrent and self.variable_bptt is not None:
            raise ValueError(f"variable_bptt is a recurrent model's setting, not a {self.family}'s (remove it)")
        arch = arch_settings(self.family, self.arch)
        if self.family == "transformer" and self.seq_len > arch.block_size:
            raise ValueError("seq_len must not exceed arch.block_size for a transformer")
        return self

    @property
    def length_stated(self) -> bool:
        """Whether the entry states its run's length (epochs, or a budget of its own); else the study's budget."""
        return self.epochs is not None or self.budget is not None
