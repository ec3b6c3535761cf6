"""#47 §1: only active clients compute — clients of similar local steps are stacked together."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.stacks import stack_blocks, stack_occupancy
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from hetfed.run_spec import RunSpec
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
    from hetfed.engine.stacks import EXACT_UP_TO

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
    assert whole.params["w"][:, 0].tolist() == [0, 1, 3, 5,
                                                7] and whole.extra["m"][:, 0].tolist() == [0, 10, 30, 50, 70]
    assert whole.num_samples.tolist() == [1, 2, 4, 6, 8]
    streamed = RoundUploads()
    for ids in ([3, 7], [0, 5], [1]):
        streamed.add(up(ids))
    reduced = streamed.result()
    assert reduced.client_ids == [0, 1, 3, 5, 7] and reduced.extra["m"][:, 0].tolist() == [0, 10, 30, 50, 70]


def _widths(monkeypatch):
    """The number of clients each training step computes (the clients its step's noise draws for: every
    step makes one, by autograd or in closed form)."""
    from hetfed.engine import local

    seen: list[int] = []
    real = local.Noise

    def noise(keys, *a, **k):
        seen.append(keys.shape[0])
        return real(keys, *a, **k)

    monkeypatch.setattr(local, "Noise", noise)
    return seen


def _stack_data(sizes, d=6):
    from hetfed.engine.types import ClientData

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(sum(sizes), d, generator=gen), torch.randint(0, 4, (sum(sizes),), generator=gen)
    bounds = np.cumsum([0, *sizes])
    return ClientData(list(range(len(sizes))), x, y, [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))],
                      [11 * k + 3 for k in range(len(sizes))])


def _params(model, n):
    gen = torch.Generator().manual_seed(1)
    return {s.name: torch.stack([s.init(gen, s.shape) for _ in range(n)]) for s in model.specs()}


def unequal_stack(mu):
    """A stack of unequal clients in id order (the longest in the middle, one without data) on an MLP with dropout:
    (model, sizes, data, params, schedule, the proximal centres: each client's own when ``mu`` is "own centres",
    else one model for all)."""
    from hetfed.engine.local import LocalSchedule
    from hetfed.models import MLP

    model = MLP(6, [16, 8], 4, dropout=0.3)
    sizes = [37, 12, 50, 3, 24, 0]
    params = _params(model, len(sizes))
    own = mu == "own centres"
    centre = {k: v + 0.1 * (v + 1) if own else v[0] for k, v in params.items()}
    return model, sizes, _stack_data(sizes), params, LocalSchedule(batch_size=8, epochs=2), centre


@pytest.mark.parametrize("opt,mu", [(OptimizerConfig(lr=0.1, momentum=0.9), None),
                                    (OptimizerConfig(kind="adam", lr=0.01), None),
                                    (OptimizerConfig(lr=0.1), 0.5),
                                    (OptimizerConfig(lr=0.1), "own centres")])
def test_a_plain_step_computes_only_the_clients_still_training_and_gives_each_its_own_numbers(monkeypatch, opt, mu):
    """A stack in any order (here: id order, the longest client in the middle): every step computes exactly the
    clients that still train — the real client-steps, no masked ones — and each client ends where it would alone
    (its dropout masks and batches are its own), returned in the order it came. A proximal term's centre may be
    one model for all or each client's own (a stacked sweep's clients of several runs)."""
    from dataclasses import replace

    from hetfed.engine.local import Proximal, train_stack

    model, sizes, data, params, sched, centre = unequal_stack(mu)
    own = mu == "own centres"

    def reg(k=None):
        if not mu:
            return None
        return Proximal({n: v[k:k + 1] for n, v in centre.items()} if own and k is not None else centre,
                        0.3 if own else mu)

    alone = []
    for k in range(len(sizes)):
        one = replace(data, client_ids=[k], indices=[data.indices[k]], seeds=[data.seeds[k]])
        alone.append(train_stack(model, {n: v[k:k + 1] for n, v in params.items()}, one, sched, opt, opt.lr,
                                 regulariser=reg(k)))
    widths = _widths(monkeypatch)
    trained, state, loss = train_stack(model, params, data, sched, opt, opt.lr, regulariser=reg())
    steps = [sched.n_steps(m) if m else 0 for m in sizes]
    assert widths == [sum(1 for s in steps if s > t) for t in range(max(steps))]
    assert sum(widths) == sum(steps)
    for k, (p, s, lo) in enumerate(alone):
        for name in p:
            torch.testing.assert_close(trained[name][k:k + 1], p[name], rtol=1e-6, atol=1e-6)
        for name in s:
            torch.testing.assert_close(state[name][k:k + 1], s[name], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(loss[k:k + 1], lo, rtol=1e-6, atol=1e-6)


def test_a_recorded_plain_step_computes_a_few_widths_and_a_step_with_a_term_the_whole_stack(monkeypatch):
    """Replayed from recordings, a step computes the clients still training rounded up to a power of two (at most the
    stack): one recording serves several steps. A step with a loss term of the caller's (which may hold tensors of
    the whole stack) computes every client, masked."""
    from hetfed.engine import capture, local
    from hetfed.engine.local import LocalSchedule, train_stack
    from hetfed.engine.stacks import computed_clients
    from hetfed.models import MLP
    from tests.engine.test_capture import Replay

    monkeypatch.setitem(capture.BACKENDS["auto"], "cpu", Replay)
    monkeypatch.setattr(local, "_RECORDED", type(local._RECORDED)())
    model = MLP(6, [16, 8], 4)
    sizes = [37, 12, 50, 3, 24]
    opt = OptimizerConfig(lr=0.1)
    sched = LocalSchedule(batch_size=8, epochs=2, capture="auto")
    widths = _widths(monkeypatch)
    train_stack(model, _params(model, 5), _stack_data(sizes), sched, opt, 0.1)
    steps = sorted((sched.n_steps(m) for m in sizes), reverse=True)
    training = [sum(1 for s in steps if s > t) for t in range(steps[0])]
    assert widths == [computed_clients(a, 5, True) for a in training]  # eager warm-ups and replays alike
    assert set(widths) == {5, 4, 2, 1}
    widths.clear()
    train_stack(model, _params(model, 5), _stack_data(sizes), replace_capture(sched, "off"), opt, 0.1,
                regulariser=lambda p: sum((v ** 2).flatten(1).sum(1) for v in p.values()))
    assert widths == [5] * steps[0]


def replace_capture(sched, mode):
    from dataclasses import replace

    return replace(sched, capture=mode)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.integers(0, 700), min_size=1, max_size=60), cap=st.integers(1, 25))
def test_longest_first_blocks_cover_every_client_once_longest_first_within_the_cap(steps, cap):
    from hetfed.engine.stacks import longest_first_blocks

    blocks = longest_first_blocks(steps, cap)
    flat = [i for b in blocks for i in b]
    assert sorted(flat) == list(range(len(steps)))
    assert [steps[i] for i in flat] == sorted(steps, reverse=True)
    assert all(len(b) == cap for b in blocks[:-1]) and 1 <= len(blocks[-1]) <= cap
    assert stack_occupancy(steps, blocks, plain=True) == 1.0 or sum(steps) == 0


def test_the_executor_stacks_plain_steps_longest_first_and_others_by_plan_length():
    """A method whose steps are plain (FedAvg) is stacked longest first, as large as memory allows; one whose
    method that does not declare compact steps (APFL: slower in one stack on a CPU) keeps the stacks grouped by plan
    length."""
    from hetfed.engine.stacks import longest_first_blocks
    from hetfed.executors.inprocess import step_overhead

    steps = [642, 7, 9, 640, 8, 10]
    blocks = {}
    for algorithm in ("fedavg", "apfl"):
        model = build_model(ModelConfig(kind="mlp", hidden=[8]), (6,), 4)
        ex = VectorisedExecutor()
        algo = build_algorithm(algorithm, model, TrainConfig())
        ex.run, ex.algo, ex.device = RunSpec(algo, TrainConfig(), 0, algo.schedule, None), algo, torch.device("cpu")
        blocks[algorithm] = ex.blocks(steps, 10)
    assert blocks["fedavg"] == longest_first_blocks(steps, 10) == [[0, 3, 5, 2, 4, 1]]
    assert blocks["apfl"] == stack_blocks(steps, 10, step_overhead(model, 32, "cpu"))
    assert blocks["apfl"] != blocks["fedavg"]  # (a model this small: one stack in id order)


def test_every_method_that_declares_compact_steps_computes_only_the_clients_still_training(tmp_path, monkeypatch):
    """``Capabilities.plain_steps`` / ``compact_steps`` make the executor stack a method's clients longest first in
    one stack, which pays only if each of its steps computes only the clients still training: every declaring
    method's every client step does (a plain step, a StackObjective, a Proximal term with a shift), on unequal
    clients; FedRoD, FedLC, FedProto, FedCP, GPFL, MOON, SCAFFOLD and FedDyn are among them (#74: on a GPU their
    steps are recorded as FedAvg's are)."""
    from hetfed.cli import main
    from hetfed.engine import local
    from hetfed.registry import registry_of

    compacted: dict[str, list[bool]] = {}
    current = [""]
    keys = local._step_keys

    def spy(plan, reads_rows, compacts, recorded):
        compacted.setdefault(current[0], []).append(compacts)
        return keys(plan, reads_rows, compacts, recorded)

    monkeypatch.setattr(local, "_step_keys", spy)
    declared = [n for n, spec in registry_of("algorithm").items()
                if (spec.capabilities.plain_steps or spec.capabilities.compact_steps) and not spec.model]
    assert {"fedavg", "ditto", "fedrod", "fedlc", "fedproto", "fedcp", "gpfl", "scaffold", "feddyn",
            "moon"} <= set(declared)
    for name in declared:
        current[0] = name
        assert main(["run", "--set", "train.rounds=2", "--set", "heterogeneity.iid_draws=0", "--set",
                     "partition.kind=dirichlet", "--set", "partition.alpha=0.3", "--set",
                     f"methods=[{{name: {name}, algorithm: {name}}}]", "--no-report", "--quiet",
                     "--out", str(tmp_path / name)]) == 0
    assert {n: c for n, c in compacted.items() if not c or not all(c)} == {}
    assert set(compacted) == set(declared)


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 3, 8, 9, 17, 40]), min_size=2, max_size=7),
       batch=st.sampled_from([4, 8]), epochs=st.sampled_from([0.5, 1.0, 1.7, None]), steps=st.integers(1, 9),
       cap=st.booleans(), kind=st.sampled_from(["sgd", "momentum", "adam"]), dropout=st.sampled_from([0.0, 0.3]))
def test_a_plain_stacks_clients_end_where_each_would_alone(sizes, batch, epochs, steps, cap, kind, dropout):
    """Whatever the clients' sizes (empty ones too) and the schedule (epochs, fractional ones, or steps with or
    without the one-pass cap), a plain stack computing only its clients still training gives each client its own
    numbers."""
    from dataclasses import replace

    from hetfed.engine.local import LocalSchedule, train_stack
    from hetfed.models import MLP

    sched = LocalSchedule(batch_size=batch, epochs=epochs, steps=None if epochs else steps, cap_one_pass=cap)
    opt = {"sgd": OptimizerConfig(lr=0.05), "momentum": OptimizerConfig(lr=0.05, momentum=0.9),
           "adam": OptimizerConfig(kind="adam", lr=0.01)}[kind]
    model = MLP(6, [8], 4, dropout=dropout)
    data, params = _stack_data(sizes), _params(model, len(sizes))
    trained, state, loss = train_stack(model, params, data, sched, opt, opt.lr)
    for k in range(len(sizes)):
        one = replace(data, client_ids=[k], indices=[data.indices[k]], seeds=[data.seeds[k]])
        p, s, lo = train_stack(model, {n: v[k:k + 1] for n, v in params.items()}, one, sched, opt, opt.lr)
        for got, alone in ((trained, p), (state, s)):
            for name in alone:
                torch.testing.assert_close(got[name][k:k + 1], alone[name], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(loss[k:k + 1], lo, rtol=1e-6, atol=1e-6)


def test_tensor_bytes_counts_every_tensor_however_nested() -> None:
    """What a checkpoint weighs (:func:`hetfed.engine.types.tensor_bytes`, which decides whether it is written in
    the background): every tensor in dicts, lists, tuples and dataclasses, numbers and other objects counted 0."""
    from hetfed.engine.types import ServerState, tensor_bytes

    state = ServerState({"w": torch.zeros(64, 10), "b": torch.zeros(10, dtype=torch.float64)},
                        extra={"m": [torch.zeros(3, dtype=torch.int8), (1, 2.5, "x", None)]})
    value = {"result": state, "losses": [(r, 0.5) for r in range(50)], "n": np.float64(1.0),
             "deep": [[{"t": (torch.zeros(2, 2),)}]], "cls": ServerState, "obj": object()}
    assert tensor_bytes(value) == 64 * 10 * 4 + 10 * 8 + 3 + 4 * 4
    assert tensor_bytes(torch.zeros(5)) == 20 and tensor_bytes(3) == 0 and tensor_bytes([]) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 59), max_size=30), max_size=6), st.integers(1, 7))
def test_label_counts_are_each_clients_bincount(rows, n_classes):
    """``ClientData.label_counts`` (one count over (client, label) pairs, no read-back on a GPU) = each client's own
    ``bincount`` of its labels, rows repeated or absent included."""
    from hetfed.engine.types import ClientData

    y = torch.arange(60) % n_classes
    indices = [np.asarray(r, dtype=np.int64) for r in rows]
    data = ClientData(list(range(len(rows))), torch.zeros(60, 1), y, indices, list(range(len(rows))))
    expected = [torch.bincount(y[torch.as_tensor(i, dtype=torch.long)], minlength=n_classes).float() for i in indices]
    counts = data.label_counts(n_classes)
    assert counts.shape == (len(rows), n_classes) and counts.dtype == torch.float32
    assert all(torch.equal(counts[k], e) for k, e in enumerate(expected))
