"""``cgau``: conditionally gated units conditioned on the client id (CGAU client adaptation) —
:class:`~hetfed.models.cgau.CGAUNet`."""

from __future__ import annotations

from pydantic import Field, model_validator

from hetfed.models.cgau import CGAUNet
from hetfed.models.kinds import ModelKind, WidthsParams, register
from hetfed.models.mlp import flat_size


class CGAUParams(WidthsParams):
    condition_output: bool = Field(False, description="also condition the logits on the client")

    @model_validator(mode="after")
    def _gated_layers(self) -> CGAUParams:
        if not self.hidden:
            raise ValueError("model.hidden = [] is not allowed with model.kind = 'cgau': its gated units are its "
                             "hidden layers, so without one it is a linear model still labelled CGAU; expected at "
                             "least one width (e.g. [64, 64]), or model.kind = 'logreg' for a linear model")
        return self


def build(shape, n_classes, vocab_size, hidden, dropout, condition_output):
    return CGAUNet(flat_size(shape), hidden, n_classes, dropout, condition_output)


register(ModelKind("cgau", build, "gated units conditioned on each client's own id rows (which never leave it)",
                   Params=CGAUParams))
