"""#73: one method's run is resolved once into a RunSpec, which the loop and the executors read; stacked sweeps
group runs by the specification's own identity."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hetfed.algorithms import build_algorithm, resolve_run, run_for
from hetfed.config import (
    ModelConfig,
    PartitionConfig,
    PrivacyConfig,
    ServerConfig,
    TrainConfig,
    build_config,
)
from hetfed.errors import ConfigError
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from tests.synthetic import ShiftedGaussians


def _fed(clients: int = 6):
    return make_federation(ShiftedGaussians(600, 4, classes=3, test_per_class=10),
                           PartitionConfig(kind="dirichlet", alpha=0.5, clients=clients), 0)


def test_the_spec_holds_the_settings_it_was_resolved_with():
    fed = _fed()
    train = TrainConfig(rounds=2, local_steps=3, batch_size=8, client_fraction=0.5)
    privacy = PrivacyConfig(noise_multiplier=0.5, clip=1.0)
    model = build_model(ModelConfig(kind="mlp", hidden=[8]), fed.input_shape, fed.n_classes)
    run = resolve_run(build_algorithm("fedavg", model, train, privacy=privacy), fed, train, seed=7)
    assert (run.train, run.seed, run.n_clients, run.per_round) == (train, 7, 6, 3)
    assert run.privacy == privacy and run.records is None and run.schedule.steps == 3
    assert run.chain is not None and run.min_clients == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.seed = 8  # type: ignore[misc]


def test_an_algorithm_and_its_resolved_spec_run_the_same_rounds():
    """simulate(algo, fed, train, seed) resolves the spec itself: the same run as the plan's spec."""
    fed = _fed()
    train = TrainConfig(rounds=2, local_steps=2, batch_size=8)

    def algo():
        return build_algorithm("fedprox", build_model(ModelConfig(kind="mlp", hidden=[8]), fed.input_shape,
                                                       fed.n_classes), train)

    a = simulate(algo(), fed, train, 3)
    b = simulate(resolve_run(algo(), fed, train, 3), fed)
    assert all(torch.equal(a.server.params[k], b.server.params[k]) for k in a.server.params)
    with pytest.raises(TypeError, match="train section and the seed"):
        simulate(algo(), fed)


def test_a_fixed_m_the_federation_cannot_meet_is_refused_when_resolved():
    fed = _fed(4)
    train = TrainConfig(clients_per_round=5)
    model = build_model(ModelConfig(kind="mlp", hidden=[8]), fed.input_shape, fed.n_classes)
    with pytest.raises(ConfigError, match=r"train.clients_per_round = 5 is not allowed: only 4 clients"):
        resolve_run(build_algorithm("fedavg", model, train), fed, train, 0)


def _spec(fed, **changes):
    cfg = build_config({"partition": {"clients": 6}, "methods": [{"name": "m", "algorithm": "fedavg"}], **changes})
    return run_for(cfg, cfg.methods[0], fed)


def test_runs_share_a_client_step_exactly_when_their_specs_agree_on_it():
    """A stacked sweep stacks two runs' clients when the step is the same computation: seeds, rounds and the
    server side may differ; the model, the schedule or the client optimiser may not."""
    fed = _fed()
    base = _spec(fed)
    assert _spec(fed, seed=5).step_identity() == base.step_identity()
    assert _spec(fed, train={"rounds": 9}).step_identity() == base.step_identity()
    assert _spec(fed, server={"optimizer": {"kind": "adam", "lr": 0.01}}).step_identity() == base.step_identity()
    assert _spec(fed, train={"local_epochs": 2}).step_identity() != base.step_identity()
    assert _spec(fed, model={"hidden": [16]}).step_identity() != base.step_identity()
    assert _spec(fed, model={"dropout": 0.5}).step_identity() != base.step_identity()  # same shapes, other model
    assert _spec(fed, train={"optimizer": {"lr": 0.3}}).step_identity() != base.step_identity()
    # scoring needs only the same model: a longer schedule scores alongside
    assert _spec(fed, train={"local_epochs": 2}).model_identity() == base.model_identity()


def test_methods_that_train_with_fedavgs_step_unchanged_share_it_whatever_their_parameters():
    """#74 §1: kNN-Per's and FedMoE's clients train with FedAvg's step, which reads none of the method's parameters;
    FedProx's adds its proximal term (its μ in the step). Scoring still tells the methods apart."""
    fed = _fed()

    def spec(algorithm, **params):
        cfg = build_config({"partition": {"clients": 6},
                            "methods": [{"name": "m", "algorithm": algorithm, "params": params}]})
        return run_for(cfg, cfg.methods[0], fed)

    base = spec("fedavg")
    assert spec("knnper").step_identity() == spec("knnper", k=3).step_identity() == base.step_identity()
    assert spec("fedmoe").step_identity() == base.step_identity()
    assert spec("fedprox").step_identity() != base.step_identity()
    assert spec("fedprox", mu=0.5).step_identity() != spec("fedprox").step_identity()
    assert spec("knnper").model_identity() != base.model_identity()


def test_a_model_built_by_hand_steps_alone():
    fed = _fed()
    train = TrainConfig()
    specs = [resolve_run(build_algorithm("fedavg", build_model(ModelConfig(kind="mlp", hidden=[8]), fed.input_shape,
                                                               fed.n_classes), train), fed, train, 0)
             for _ in range(2)]
    assert specs[0].step_identity() != specs[1].step_identity()


def test_the_server_chain_reaches_the_loop_from_the_spec():
    """server.min_clients is the spec's: a round with fewer accepted updates is skipped."""
    fed = _fed(4)
    train = TrainConfig(rounds=2, clients_per_round=2, local_steps=1, batch_size=8)
    model = build_model(ModelConfig(kind="mlp", hidden=[8]), fed.input_shape, fed.n_classes)
    algo = build_algorithm("fedavg", model, train, server=ServerConfig(min_clients=3))
    run = resolve_run(algo, fed, train, 0)
    assert run.min_clients == 3
    assert simulate(run, fed).skipped_rounds == [1, 2]
