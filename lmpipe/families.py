"""The model families' `arch` settings: each family's defaults and checks, written once, in pydantic.

params.yaml's `models.<name>.arch` states only what differs from them; lmpipe.config checks it against its family's
class when params load, and the model's constructor (lmpipe/models/) reads its settings from the same class, so no
default is written twice. torch-free, so that params load without importing it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Arch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    model: ClassVar[str]  # module:class of the family's StreamLM
    recurrent: ClassVar[bool]  # reads the train split as streams (variable_bptt applies)


class NPLMArch(_Arch):
    """Bengio et al.'s NPLM (lmpipe/models/nplm.py): y = b + W x + U tanh(d + H x) over `context` tokens."""

    model: ClassVar[str] = "lmpipe.models.nplm:NPLM"
    recurrent: ClassVar[bool] = False
    context: int = Field(5, ge=1)
    emb: int = Field(128, ge=1)
    hidden: int = Field(512, ge=1)
    direct: bool = Field(False, description="the direct connections W")
    dropout: float = Field(0.0, ge=0, lt=1)


class RNNArch(_Arch):
    """Elman RNN, LSTM and GRU with AWD-LSTM's regularisers (lmpipe/models/rnn.py)."""

    model: ClassVar[str] = "lmpipe.models.rnn:RNNModel"
    recurrent: ClassVar[bool] = True
    cell: Literal["rnn_tanh", "rnn_relu", "lstm", "gru"] = "lstm"
    emb: int = Field(256, ge=1)
    hidden: int = Field(512, ge=1)
    layers: int = Field(2, ge=1)
    tie: bool = True
    dropout: float = Field(0.0, ge=0, lt=1, description="locked dropout on the last layer's output")
    dropout_input: float = Field(0.0, ge=0, lt=1)
    dropout_hidden: float = Field(0.0, ge=0, lt=1, description="between layers")
    dropout_embedding: float = Field(0.0, ge=0, lt=1, description="whole rows of the embedding")
    weight_drop: float = Field(0.0, ge=0, lt=1, description="DropConnect on the hidden-to-hidden matrices")
    ar: float = Field(0.0, ge=0)
    tar: float = Field(0.0, ge=0)


class TransformerArch(_Arch):
    """A GPT-style decoder (lmpipe/models/transformer.py)."""

    model: ClassVar[str] = "lmpipe.models.transformer:TransformerLM"
    recurrent: ClassVar[bool] = False
    dim: int = Field(256, ge=1)
    layers: int = Field(4, ge=1)
    heads: int = Field(4, ge=1)
    block_size: int = Field(256, ge=2)
    dropout: float = Field(0.1, ge=0, lt=1)
    tie: bool = True
    position: Literal["learned", "rope"] = "learned"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    qk_norm: bool = False
    mlp: Literal["gelu", "relu2", "swiglu"] = "gelu"
    zero_init: bool = Field(False, description="residual projections and the (untied) head start at zero")
    softcap: float = Field(0.0, ge=0, description="tanh cap of the logits; 0 for none")

    @model_validator(mode="after")
    def _consistent(self):
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} must be divisible by heads {self.heads}")
        if self.position == "rope" and (self.dim // self.heads) % 2:
            raise ValueError(f"rope needs an even head width: dim {self.dim} / heads {self.heads} is odd")
        if self.zero_init and self.tie:
            raise ValueError("zero_init starts the head at zero: it needs an untied head (tie: false)")
        return self


# The registry: family -> its settings, which name its model class. A family of your own is a class here, an entry in
# it, and its model in lmpipe/models/.
FAMILIES: dict[str, type[_Arch]] = {"nplm": NPLMArch, "rnn": RNNArch, "transformer": TransformerArch}
