"""LG-FedAvg (Liang et al. 2020, "Think Locally, Act Globally: Federated Learning with Local and Global
Representations").

The mirror image of FedPer: each client keeps its own *local representation*
(every layer but the last) and the server averages the *global head* (the
classifier layer). Each round a client trains its representation and the
received head together on its data (the paper's local update, Algorithm 1 with
the auxiliary objectives left out: plain supervised learning of both parts), and
uploads the head only. A client predicts with its own representation and the
global head. The paper's optional unsupervised/fair auxiliary losses and its
step of fitting a new client's representation are not implemented.
"""

from __future__ import annotations

from hetfed.algorithms._personal import PartlyPersonal
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register


class LGFedAvg(PartlyPersonal):
    """FedAvg on the head; the representation (body) is the client's own."""

    def personal_names(self) -> tuple[str, ...]:
        return self._body


register(AlgorithmSpec(
    "lg_fedavg", LGFedAvg, "personal representation (body), shared head: clients upload the head only",
    "Liang et al. 2020, Think Locally, Act Globally: Federated Learning with Local and Global Representations",
    capabilities=Capabilities(uploads="the head's parameters (the last layer), sample count, training loss",
                              buffers="local",
                              private=True, personalises=True, stacks_runs=True, whole_model=False),
    privacy=(
        PrivacyRow(
            method="LG-FedAvg",
            config="`algorithm: lg_fedavg`",
            params="the head: the last layer only",
            extra="`train_loss`",
            stays="data; its representation (every layer but the head); optimiser state when kept",
        ),
    ),
    family="personalised", venue="arXiv 2020",
))
