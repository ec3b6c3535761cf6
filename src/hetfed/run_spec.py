"""One method's run as it is resolved once: the settings every part of the loop reads, in one frozen value.

The plan (:func:`hetfed.runs.plan.plan`) resolves each configured method into a :class:`RunSpec` before any
file is written — :func:`hetfed.algorithms.build.resolve_run` builds it from the algorithm it built — and the
round loop, the executors (in process, stacked, Flower), the server's screen and the attacks read their settings
from it: the training schedule, the seed, the server chain, DP and how many clients a round expects. None of them
reaches into the algorithm object for a setting; the algorithm is the behaviour (``spec.algo``). Two runs whose
specifications agree on :meth:`RunSpec.step_identity` run the same client step, so a stacked sweep trains their
clients as one stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetfed.config import PrivacyConfig, TrainConfig
    from hetfed.engine.local import LocalSchedule
    from hetfed.engine.types import Params, RoundUploads, Upload
    from hetfed.interface import Algorithm
    from hetfed.server.chain import Chain


@dataclass(frozen=True, eq=False)
class RunSpec:
    """One method's run: its algorithm (the behaviour) and the settings it was resolved with.

    ``train``: the method's effective ``train`` section; ``schedule``: its local work per round (DP-SGD's
    ``privacy.record`` in it when on); ``chain``: the server chain (screen spec, combine or DP-FedAvg's noised mean,
    optimiser, transport); ``privacy``: client-level DP when on (None: off); ``records``: the privacy section when
    record-level DP-SGD is on (None: off); ``n_clients`` and ``per_round``: the federation's size and how many clients
    a round expects (DP's fixed denominator); ``architecture``: what identifies the model's kind and size beyond its
    class (the model's config, input shape, classes, vocabulary), when the plan knows it.
    """

    algo: Algorithm
    train: TrainConfig
    seed: int
    schedule: LocalSchedule
    chain: Chain
    privacy: PrivacyConfig | None = None
    records: PrivacyConfig | None = None
    n_clients: int = 0
    per_round: int = 1
    architecture: Any = None

    @property
    def min_clients(self) -> int:
        """A round with fewer accepted updates is skipped (``server.min_clients``)."""
        return self.chain.min_clients

    def holds_round(self) -> bool:
        """Whether a round's updates must be held together (:meth:`~hetfed.server.chain.Chain.holds_round`)."""
        return self.chain.holds_round(self.algo.capabilities.whole_round)

    def receiving(self, reference: Params, stream: bool = True) -> RoundUploads:
        """The server chain's receiving side of a round of this method's updates
        (:meth:`~hetfed.server.chain.Chain.receiving`)."""
        caps = self.algo.capabilities
        return self.chain.receiving(reference, asynchronous=caps.asynchronous, whole_round=caps.whole_round,
                                    stream=stream)

    def receiving_encoded(self, reference: Params, uploads: list[Upload]) -> Upload:
        """A round of this method's updates that travelled encoded, decoded and received
        (:meth:`~hetfed.server.chain.Chain.receiving_encoded`)."""
        caps = self.algo.capabilities
        return self.chain.receiving_encoded(reference, uploads, asynchronous=caps.asynchronous,
                                            whole_round=caps.whole_round)

    def model_identity(self) -> tuple[Any, ...]:
        """What makes two runs' models the same computation when scored: the algorithm and its parameters and the
        model's architecture (a model built by hand, which no config names, is its own). Computed once: a stacked
        sweep asks it of every run at every request."""
        return self._model_identity

    @cached_property
    def _model_identity(self) -> tuple[Any, ...]:
        from hetfed.interface import method_identity

        return (*method_identity(self.algo), *self.network_identity())

    def network_identity(self) -> tuple[Any, ...]:
        """The model as a network, whatever method trains it: its class and architecture (a model built by hand,
        which no config names, is its own). Runs whose servers' models are scored the base way score them in one
        forward when these agree (a stacked sweep)."""
        return self._network_identity

    @cached_property
    def _network_identity(self) -> tuple[Any, ...]:
        model = self.algo.model
        return type(model), self.architecture if self.architecture is not None else ("built by hand", id(model))

    def scoring_identity(self) -> tuple[Any, ...]:
        """What makes two runs' clients' evaluations the same computation: for a method whose clients score the
        model its server sends the base way (:func:`~hetfed.interface.scores_the_broadcast`: FedAvg's, FedProx's,
        SCAFFOLD's …) that network and the server extra reported in its place, whatever method trained it — so a
        sweep's methods score their clients in one stack; for any other method, :meth:`model_identity`."""
        return self._scoring_identity

    @cached_property
    def _scoring_identity(self) -> tuple[Any, ...]:
        if not self.scores_the_broadcast:
            return self.model_identity()
        return "the model sent", *self.network_identity(), self.algo.capabilities.reports

    @cached_property
    def parameter_names(self) -> frozenset[str]:
        """The model's parameters' (and buffers') names."""
        return frozenset(spec.name for spec in self.algo.model.specs())

    @cached_property
    def scores_the_broadcast(self) -> bool:
        """:func:`hetfed.interface.scores_the_broadcast` of the method, asked once."""
        from hetfed.interface import scores_the_broadcast

        return scores_the_broadcast(self.algo)

    def step_identity(self) -> tuple[Any, ...]:
        """What makes two runs' client steps the same computation (stacked sweeps group by it): the method's step
        (:func:`hetfed.interface.step_identity`: the method, or a step several methods run unchanged — FedAvg's,
        kNN-Per's, FedMoE's), the network, the local schedule and the client optimiser. The seed, the rounds and the
        server side may differ."""
        return self._step_identity

    @cached_property
    def _step_identity(self) -> tuple[Any, ...]:
        from hetfed.interface import step_identity

        return (*step_identity(self.algo), *self.network_identity(), self.schedule,
                self.train.optimizer.model_dump_json())
