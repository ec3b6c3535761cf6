"""FedPer (Arivazhagan et al. 2019, "Federated Learning with Personalization Layers").

The model is a shared *base* (every layer but the last) and a personal *head*
(the classifier layer). Each round a client trains base and head together on
its data for the configured local epochs/steps (Algorithm 1 of the paper: the
usual local SGD on all of its layers), uploads the base only, and keeps its
head; the server averages the bases (FedAvg on the base, weighted by samples).
A client predicts with the global base and its own head.
"""

from __future__ import annotations

from hetfed.algorithms._personal import PartlyPersonal, head_of
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register


class FedPer(PartlyPersonal):
    """FedAvg on the base; the head is the client's own."""


    def personal_names(self) -> tuple[str, ...]:
        return head_of(self.model, self.spec.name)


register(AlgorithmSpec(
    "fedper", FedPer, "shared base, personal head: clients train both, upload the base only",
    "Arivazhagan et al. 2019, Federated Learning with Personalization Layers",
    capabilities=Capabilities(uploads="shared parameters of the base (every layer but the head), sample count, "
                                      "training loss", private=True, personalises=True, stacks_runs=True,
                              whole_model=False),
    privacy=(
        PrivacyRow(
            method="FedPer",
            config="`algorithm: fedper`",
            params="the base: every layer but the classifier head",
            extra="`train_loss`",
            stays="data; its head (the last layer); optimiser state when kept",
        ),
    ),
    family="personalised", venue="arXiv 2019",
))
