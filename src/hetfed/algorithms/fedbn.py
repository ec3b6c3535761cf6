"""FedBN (Li, Jiang, Zhang, Kamp, Dou 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization").

FedAvg, except that every batch-normalisation layer stays on its client: its scale and
shift (γ, β) and its running statistics are trained and kept locally, never uploaded
or averaged (Algorithm 1 of the paper); every other layer is averaged as in FedAvg. A
client predicts with the global layers and its own normalisation — which adapts the
shared model to a client whose *features* are shifted (other scanners, other cameras).

Needs a model with batch normalisation: ``model: {kind: cnn4, batch_norm: true}``
(after each convolution and the hidden fully connected layer, as the paper's models).
"""

from __future__ import annotations

from hetfed.algorithms._personal import PartlyPersonal
from hetfed.algorithms.build import METHOD_KEY
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register
from hetfed.errors import ConfigError

#: parameter names of batch-norm layers start with this (``bn1.weight``, ``bn1.running_mean`` …)
BN = "bn"


class FedBN(PartlyPersonal):
    """FedAvg on everything but the batch-norm layers, which are each client's own."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        if not self.personal_names():
            raise ConfigError(f"{METHOD_KEY}algorithm = 'fedbn' is not allowed with a model without batch "
                              "normalisation: "
                              "expected model: {kind: cnn4, batch_norm: true}")

    def personal_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.model.specs() if s.name.startswith(BN))


register(AlgorithmSpec(
    "fedbn", FedBN, "FedAvg, but every batch-norm layer (scale, shift, running statistics) stays on its client",
    "Li et al. 2021, FedBN: Federated Learning on Non-IID Features via Local Batch Normalization",
    capabilities=Capabilities(uploads="every parameter but the batch-norm layers', sample count, training loss",
                              buffers="local",
                              private=True, personalises=True, model_kinds=("cnn4",), stacks_runs=True,
                              model_reason="it keeps batch-norm layers local: use model.kind cnn4 with "
                                           "model.batch_norm: true", whole_model=False),
    model={"kind": "cnn4", "batch_norm": True},
    privacy=(
        PrivacyRow(
            method="FedBN",
            config="`algorithm: fedbn` + `model.kind: cnn4` + `model.batch_norm: true`",
            params="every parameter but the batch-norm layers'",
            extra="`train_loss`",
            stays="data; its batch-norm layers: scale γ, shift β, running mean and variance (`bn*`)",
        ),
    ),
    family="personalised", venue="ICLR 2021",
))
