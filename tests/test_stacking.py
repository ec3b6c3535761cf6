"""#47 §1: only active clients compute — clients of similar local steps are stacked together."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.local import stack_blocks, stack_occupancy
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from tests.synthetic import ShiftedGaussians


def _cost(steps, blocks, per_step):
    return sum((len(b) + per_step) * max(steps[i] for i in b) for b in blocks)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.integers(1, 700), min_size=1, max_size=60), cap=st.integers(1, 25),
       per_step=st.floats(0, 50))
def test_blocks_cover_every_client_once_within_the_cap_and_cost_no_more_than_id_order(steps, cap, per_step):
    blocks = stack_blocks(steps, cap, per_step)
    flat = [i for b in blocks for i in b]
    assert sorted(flat) == list(range(len(steps)))
    assert all(1 <= len(b) <= cap and b == sorted(b) for b in blocks)
    id_order = [list(range(i, min(i + cap, len(steps)))) for i in range(0, len(steps), cap)]
    by_steps = sorted(range(len(steps)), key=lambda i: (steps[i], i))
    sorted_chunks = [by_steps[i:i + cap] for i in range(0, len(steps), cap)]
    # the programme is optimal over runs of the sorted clients, so it beats both simple plans
    assert _cost(steps, blocks, per_step) <= _cost(steps, sorted_chunks, per_step) + 1e-6
    assert _cost(steps, blocks, per_step) <= _cost(steps, id_order, per_step) + 1e-6


def test_equal_plans_are_the_old_id_order_chunks_and_unequal_ones_fill_their_stacks():
    assert stack_blocks([5] * 7, 3, 2.0) == [[0, 1, 2], [3, 4, 5], [6]]
    steps = [642, 7, 9, 640, 8, 10]
    blocks = stack_blocks(steps, 10, 1.0)
    assert sorted(map(sorted, blocks)) == [[0, 3], [1, 2, 4, 5]]
    assert stack_occupancy(steps, blocks) > 0.99 and stack_occupancy(steps, [list(range(6))]) < 0.35
    assert stack_blocks(steps, 10, 1e6) == [[0, 1, 2, 3, 4, 5]]  # a step that costs everything: one stack


def test_a_large_round_is_grouped_by_runs_of_equal_steps():
    from hetfed.engine.local import EXACT_UP_TO

    rng = np.random.default_rng(0)
    steps = rng.integers(1, 50, EXACT_UP_TO + 500).tolist()
    blocks = stack_blocks(steps, 64, 3.0)
    assert sorted(i for b in blocks for i in b) == list(range(len(steps)))
    assert all(len(b) <= 64 for b in blocks)
    assert stack_occupancy(steps, blocks) > 0.95  # one-stack id-order chunks: about 0.5


@pytest.mark.parametrize("algorithm", ["fedavg", "ditto", "scaffold"])
def test_grouped_stacks_agree_with_one_stack_and_with_one_client_at_a_time(algorithm):
    """Unequal clients (Dirichlet 0.1): the grouped vectorised executor, the one-stack one (before #47) and the
    sequential one give the same model to float tolerance."""
    fed = make_federation(ShiftedGaussians(1200, 6, classes=4), PartitionConfig(kind="dirichlet", clients=8, alpha=0.1,
                                                                   val_fraction=0.0, test_fraction=0.0), seed=0)
    sizes = [len(t) for t in fed.train]
    assert max(sizes) > 4 * min(sizes)  # unequal enough that grouping splits the stack
    results = []
    for executor in (SequentialExecutor(), VectorisedExecutor(group_by_steps=False), VectorisedExecutor()):
        model = build_model(ModelConfig(kind="mlp", hidden=[8], dropout=0.2), fed.input_shape, fed.n_classes)
        train = TrainConfig(rounds=2, client_fraction=1.0, eval_every=2, local_epochs=1, batch_size=10,
                            optimizer=OptimizerConfig(lr=0.05, momentum=0.5))
        results.append(simulate(build_algorithm(algorithm, model, train), fed, train, 1, executor=executor))
    for other in results[1:]:
        for k, v in results[0].server.params.items():
            torch.testing.assert_close(other.server.params[k], v, rtol=1e-4, atol=1e-5)


def test_a_rounds_upload_is_in_client_id_order_whatever_the_stacks():
    """Fed-FSNet's server reads the upload's rows in order (its mixture's components): the round's upload is
    sorted by client id, however the executor stacked the clients."""
    from hetfed.engine.types import RoundUploads, Upload

    def up(ids):
        t = torch.tensor(ids, dtype=torch.float32)
        return Upload(ids, {"w": t[:, None].repeat(1, 2)}, t + 1, {"m": t[:, None] * 10})

    rows = RoundUploads(stream=False)
    for ids in ([3, 7], [0, 5], [1]):
        rows.add(up(ids))
    whole = rows.result()
    assert whole.client_ids == [0, 1, 3, 5, 7]
    assert whole.params["w"][:, 0].tolist() == [0, 1, 3, 5, 7] and whole.extra["m"][:, 0].tolist() == [0, 10, 30, 50, 70]
    assert whole.num_samples.tolist() == [1, 2, 4, 6, 8]
    streamed = RoundUploads()
    for ids in ([3, 7], [0, 5], [1]):
        streamed.add(up(ids))
    reduced = streamed.result()
    assert reduced.client_ids == [0, 1, 3, 5, 7] and reduced.extra["m"][:, 0].tolist() == [0, 10, 30, 50, 70]
