"""Device-side random streams (#47 §2, §3): counter-based, independent of the stack, no host round-trip.

What a user relies on: a client's batches and dropout masks are a function of (run seed, round, client,
step, position) alone — the same alone, stacked with any others, or on another device — and the streams
are random enough (uniform, no correlation between neighbouring counters, permutations that are
permutations). The step loop reads only what was planned before it: no numpy, no ``.item()``.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch.overrides import TorchFunctionMode

from hetfed import streams
from hetfed.config import OptimizerConfig
from hetfed.engine import local
from hetfed.engine.local import LocalSchedule, Proximal, train_stack
from hetfed.engine.step_plan import plan_batches, plan_steps
from hetfed.engine.types import ClientData
from hetfed.models import MLP
from hetfed.models.base import Noise

CUDA = torch.cuda.is_available()


def _data(sizes: list[int], seeds: list[int], d: int = 5, device: str = "cpu") -> ClientData:
    gen = torch.Generator().manual_seed(0)
    total = sum(sizes)
    x, y = torch.randn(total, d, generator=gen), torch.randint(0, 3, (total,), generator=gen)
    bounds = np.cumsum([0, *sizes])
    idx = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    return ClientData(list(range(len(sizes))), x.to(device), y.to(device), idx, seeds)


def test_uniform_bits_pass_a_chi_square_and_neighbouring_counters_are_uncorrelated():
    key = streams.keys([12345], "cpu")
    u = streams.uniform(key[:, None], torch.arange(200_000)[None])[0].numpy()
    counts = np.histogram(u, bins=64, range=(0, 1))[0]
    assert stats.chisquare(counts).pvalue > 1e-4
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01
    # neighbouring keys (consecutive seeds) are unrelated streams too
    v = streams.uniform(streams.keys([12346], "cpu")[:, None], torch.arange(200_000)[None])[0].numpy()
    assert abs(np.corrcoef(u, v)[0, 1]) < 0.01
    assert u.min() >= 0 and u.max() < 1


@settings(max_examples=60, deadline=None)
@given(seeds=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=5), start=st.integers(0, 2**31 - 5000),
       length=st.integers(1, 4099), p=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]))
def test_the_int32_form_draws_the_same_bits_and_compares_them_unsigned(seeds, start, length, p):
    """The dropout masks' int32 form (``seeded32``/``next32``, ``at_least``) is the int64 form's numbers: every bit of
    every
    draw, at any counter (lengths that leave a vectorised loop's scalar tail included), and the unsigned threshold."""
    key = streams.keys(seeds, "cpu")[:, None]
    counters = torch.arange(start, start + length)[None]
    wide = streams.bits(key, counters)
    narrow = streams.next32(streams.seeded32(key), counters)
    assert narrow.dtype == torch.int32
    assert torch.equal(narrow.to(torch.int64) & streams.MASK32, wide)
    threshold = streams.below(p)
    assert torch.equal(streams.at_least(narrow.clone(), threshold), wide >= threshold)
    for edge in (0, 1, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1):
        assert torch.equal(streams.at_least(narrow.clone(), edge), wide >= edge)


def test_a_rounds_draw_table_gives_each_draw_its_own_hash():
    """The round's table of dropout stream states (hashed for every step at once) is the per-draw hash at every
    step and draw — past its width, and for a step given as a device scalar (a recorded step), too — and masks
    drawn through it are the masks drawn without it."""
    keys = streams.keys([5, 2**33 + 7, 91], "cpu")
    table = streams.RoundDraws(keys, steps=6, purpose=streams.DROPOUT_MASK, draws=3)
    for step in (0, 3, 5, 6, torch.tensor(2)):
        for draw in range(5):
            want = streams.seeded32(streams.bits(keys, streams.DROPOUT_MASK, step, draw))
            assert torch.equal(table.state(step, draw), want), (step, draw)
    with_table, without = Noise(keys, 4, [3, 3, 1], masks=table), Noise(keys, 4, [3, 3, 1])
    for _ in range(5):  # past the table's 3 draws
        assert torch.equal(with_table.keep_mask(3, 7, 0.3), without.keep_mask(3, 7, 0.3))
    wide, narrow = with_table.columns(1, 2), without.columns(1, 2)
    assert torch.equal(wide.keep_mask(2, 7, 0.5), narrow.keep_mask(2, 7, 0.5))


def test_seeds_that_differ_only_in_their_high_bits_get_different_keys():
    low = 987654321
    keys = streams.keys([low, low + (1 << 32), low + (5 << 40)], "cpu").tolist()
    assert len(set(keys)) == 3


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 4), st.integers(0, 2**63 - 1)), min_size=1, max_size=6))
def test_permutations_are_permutations_and_each_is_the_same_alone_as_in_a_stack(clients):
    sizes, epochs, seeds = (list(c) for c in zip(*clients, strict=True))
    key = streams.keys(seeds, "cpu")
    flat = streams.permutations(key, sizes, epochs).tolist()
    at = 0
    for k, (n, e) in enumerate(zip(sizes, epochs, strict=True)):
        alone = streams.permutations(key[k : k + 1], [n], [e]).tolist()
        assert flat[at : at + n * e] == alone
        for j in range(e):
            assert sorted(alone[j * n : (j + 1) * n]) == list(range(n))
        at += n * e



@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 3), st.integers(0, 2**64 - 1)), min_size=1, max_size=5))
def test_a_cpu_permutation_is_its_definition_hashed_by_torch(clients):
    """On a CPU the hashing and the sort run in numpy: each permutation must still be the stable sort of its positions
    by ``bits(bits(key, BATCH_ORDER, e), i)`` with every hash computed by torch (the form CUDA runs), and the keys
    torch's :func:`mix32` of the seeds' halves."""
    sizes, epochs, seeds = (list(c) for c in zip(*clients, strict=True))
    key = streams.keys(seeds, "cpu")
    halves = torch.tensor([[s & streams.MASK32, s >> 32] for s in seeds], dtype=torch.int64)
    assert torch.equal(key, halves[:, 0] ^ streams.mix32(halves[:, 1]))
    expected: list[int] = []
    for k, (n, e) in enumerate(zip(sizes, epochs, strict=True)):
        for j in range(e):
            hashed = streams.bits(streams.bits(key[k], streams.BATCH_ORDER, j), torch.arange(n))
            expected += torch.sort(hashed, stable=True).indices.tolist()
    assert streams.permutations(key, sizes, epochs).tolist() == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=300))
def test_the_cpu_sorts_order_is_the_stable_one_with_ties_too(values):
    """The permutations' sort takes numpy's unstable sort where no two values tie: with ties (few values here, so
    most lists hold some) it must still give the stable order, ties by position."""
    values = np.asarray(values, dtype=np.int64)
    assert streams._stable_order(values).tolist() == np.argsort(values, kind="stable").tolist()
    unique = np.random.default_rng(len(values)).permutation(len(values)).astype(np.int64) << 32
    assert streams._stable_order(unique).tolist() == np.argsort(unique, kind="stable").tolist()

@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 37), min_size=1, max_size=5), st.integers(1, 8), st.sampled_from([1.0, 2.5]),
       st.integers(0, 2**40))
def test_a_clients_plan_is_the_same_alone_and_stacked_and_covers_its_data_each_epoch(sizes, b, epochs, seed):
    seeds = [seed + 7 * k for k in range(len(sizes))]
    data = _data(sizes, seeds)
    schedule = LocalSchedule(batch_size=b, epochs=epochs)
    plan = plan_steps(data, schedule, torch.device("cpu"))
    for k, n in enumerate(sizes):
        mine = [plan.index[k, t, : plan.rows[t][k]].tolist() for t in range(len(plan.rows)) if plan.rows[t][k]]
        alone = plan_batches(n, schedule, seeds[k])
        assert mine == [(a + data.indices[k][0]).tolist() if n else [] for a in alone]
        assert len(mine) == (schedule.n_steps(n) if n else 0)
        per_epoch = -(-n // b) if n else 1
        for e in range(len(mine) // per_epoch):  # every whole epoch visits each sample once
            visited = sum(mine[e * per_epoch : (e + 1) * per_epoch], [])
            assert sorted(visited) == data.indices[k].tolist()
    real = plan.mask.sum(2)  # [n, S]
    assert real.T.tolist() == [[float(r) for r in row] for row in plan.rows]
    assert plan.widths == [max(row) for row in plan.rows]
    assert plan.every == [all(r > 0 for r in row) for row in plan.rows]
    assert torch.equal(plan.active, real.T > 0)


def test_dropout_masks_are_the_clients_own_whatever_the_stack_and_its_padding():
    keys = streams.keys([11, 22, 33], "cpu")
    stacked = Noise(keys, step=4, rows=[5, 2, 7]).keep_mask(batch=7, width=6, p=0.3)
    for k in range(3):
        alone = Noise(keys[k : k + 1], step=4, rows=[[5, 2, 7][k]]).keep_mask(batch=3, width=6, p=0.3)
        assert torch.equal(stacked[k, :3], alone[0])
    big = Noise(keys[:1], step=0, rows=[1000]).keep_mask(batch=1000, width=50, p=0.3)
    assert abs(float((big == 0).float().mean()) - 0.3) < 0.01
    values = big.unique().tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / 0.7)
    # a second draw in the same step, another step, and a split batch's second part are other masks
    noise = Noise(keys[:1], step=0, rows=[1000])
    first, second = noise.keep_mask(1000, 50, 0.3), noise.keep_mask(1000, 50, 0.3)
    assert not torch.equal(first, second) and torch.equal(first, big)
    part = Noise(keys[:1], step=0, rows=[1000]).columns(500, 500).keep_mask(500, 50, 0.3)
    assert torch.equal(part[0], big[0, 500:])


def test_the_proximal_terms_closed_form_gradient_trains_as_autograd_does():
    model = MLP(5, [4], 3)
    gen = torch.Generator().manual_seed(1)
    n = 3
    params = {s.name: torch.stack([s.init(gen, s.shape) for _ in range(n)]) for s in model.specs()}
    centre = {k: torch.randn(v.shape[1:], generator=gen) for k, v in params.items()}
    data = _data([9, 4, 13], [1, 2, 3])
    sched, opt = LocalSchedule(batch_size=4, epochs=2), OptimizerConfig(lr=0.1, momentum=0.9)

    def by_autograd(p):
        return 0.5 * 0.7 * sum((p[k] - centre[k]).pow(2).flatten(1).sum(1) for k in centre)

    closed, _, loss_c = train_stack(model, params, data, sched, opt, 0.1, regulariser=Proximal(centre, 0.7))
    auto, _, loss_a = train_stack(model, params, data, sched, opt, 0.1, regulariser=by_autograd)
    for k in params:
        torch.testing.assert_close(closed[k], auto[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss_c, loss_a)


_HOST_READS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "cpu", "nonzero"}


class _HostReads(TorchFunctionMode):
    """Records every tensor method that moves a value to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _HOST_READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextmanager
def _numpy_calls(found: list[str]):
    """Every Python or C function of numpy called while inside, found by the interpreter's profiler."""
    def profile(frame, event, arg):
        if event == "c_call":
            owner = getattr(arg, "__self__", None)
            module = getattr(arg, "__module__", None) or type(owner).__module__
            if module and module.startswith("numpy"):
                found.append(getattr(arg, "__qualname__", repr(arg)))
        elif event == "call" and "/numpy/" in frame.f_code.co_filename:
            found.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


def test_the_step_loop_reads_nothing_back_from_the_device_and_calls_no_numpy(monkeypatch):
    """Everything the loop needs was planned before it (§3): the check catches `.item()`, `int(t)`, `bool(t)`,
    `.tolist()` and any numpy call between the plan and the return (a dropout model: its masks too)."""
    model = MLP(5, [8], 3, dropout=0.2)
    gen = torch.Generator().manual_seed(0)
    params = {s.name: torch.stack([s.init(gen, s.shape) for _ in range(3)]) for s in model.specs()}
    data = _data([9, 4, 13], [1, 2, 3])
    planned = plan_steps(data, LocalSchedule(batch_size=4, epochs=1), torch.device("cpu"))
    monkeypatch.setattr(local, "plan_steps", lambda *a, **k: planned)
    numpy_calls: list[str] = []
    reads = _HostReads()
    with reads, _numpy_calls(numpy_calls):
        train_stack(model, params, data, LocalSchedule(batch_size=4, epochs=1), OptimizerConfig(lr=0.1, momentum=0.9),
                    0.1, regulariser=Proximal({k: v[0] for k, v in params.items()}, 0.1))
    assert reads.seen == [] and numpy_calls == []


def test_the_host_read_check_can_fail():
    reads, calls = _HostReads(), []
    with reads, _numpy_calls(calls):
        t = torch.ones(3)
        float(t.sum())
        np.zeros(2).sum()
    assert "__float__" in reads.seen and calls


@pytest.mark.skipif(not CUDA, reason="needs CUDA (run on the GPU machine)")
def test_streams_and_plans_are_bit_identical_on_cuda_and_cpu():
    seeds = [3, 2**40 + 1, 77]
    for device in ("cpu", "cuda"):
        key = streams.keys(seeds, device)
        assert key.device.type == device
    cpu_k, gpu_k = streams.keys(seeds, "cpu"), streams.keys(seeds, "cuda")
    counters = torch.arange(10_000)
    assert torch.equal(streams.bits(cpu_k[:, None], 5, counters[None]),
                       streams.bits(gpu_k[:, None], 5, counters[None].cuda()).cpu())
    data_c, data_g = _data([30, 7, 12], seeds), _data([30, 7, 12], seeds, device="cuda")
    sched = LocalSchedule(batch_size=4, epochs=2)
    a, b = plan_steps(data_c, sched, torch.device("cpu")), plan_steps(data_g, sched, torch.device("cuda"))
    assert torch.equal(a.index, b.index.cpu()) and a.rows == b.rows
    assert torch.equal(Noise(cpu_k, 3, [4, 4, 4]).keep_mask(4, 9, 0.5),
                       Noise(gpu_k, 3, [4, 4, 4]).keep_mask(4, 9, 0.5).cpu())


def train_without_synchronising(monkeypatch, model, params, data: ClientData, sched: LocalSchedule) -> None:
    """``train_stack`` on CUDA with the round planned beforehand, under ``set_sync_debug_mode("error")``: any host
    round-trip in the step loop raises (tests/engine/test_capture.py runs it on recorded steps too)."""
    planned = plan_steps(data, sched, torch.device("cuda"))
    monkeypatch.setattr(local, "plan_steps", lambda *a, **k: planned)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        train_stack(model, params, data, sched, OptimizerConfig(lr=0.1, momentum=0.9), 0.1)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not CUDA, reason="needs CUDA (run on the GPU machine)")
def test_a_cuda_round_step_loop_never_synchronises(monkeypatch):
    model = MLP(5, [8], 3, dropout=0.2)
    gen = torch.Generator().manual_seed(0)
    params = {s.name: torch.stack([s.init(gen, s.shape) for _ in range(3)]).cuda() for s in model.specs()}
    data = _data([9, 4, 13], [1, 2, 3], device="cuda")
    # every step launches its kernels (train.capture off)
    train_without_synchronising(monkeypatch, model, params, data, LocalSchedule(batch_size=4, epochs=1, capture="off"))


@pytest.mark.skipif(not CUDA, reason="needs CUDA (run on the GPU machine)")
def test_a_cuda_rounds_plan_after_the_first_never_synchronises():
    """#74 item 3: a round's plan — its clients' keys, permutations and pool indices — is copied to the device
    without waiting for it, once the layout its sizes share with the first round is kept (the blocking copies of the
    keys and of the pool's indices were a synchronisation each, every round)."""
    sched = LocalSchedule(batch_size=4, epochs=1)
    first = plan_steps(_data([9, 4, 13], [1, 2, 3], device="cuda"), sched, torch.device("cuda"))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = plan_steps(_data([9, 4, 13], [4, 5, 6], device="cuda"), sched, torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert again.index.shape == first.index.shape and not torch.equal(again.index, first.index)


def test_a_run_records_its_generator_and_a_checkpoint_from_the_host_generators_is_refused(tmp_path):
    """Numbers changed once with the counter-based streams (hetfed 0.2): a run directory says which generator
    made it, and resuming a 0.1 run (which would mix the two) is refused with what to do instead."""
    from hetfed.errors import RunError
    from hetfed.runs.checkpoint import checkpoint_path, read_checkpoint
    from hetfed.runs.rundir import environment

    assert environment()["random_streams"] == streams.GENERATOR
    path = checkpoint_path(tmp_path)
    path.parent.mkdir(parents=True)
    torch.save({"version": 1, "result": None}, path)
    with pytest.raises(RunError, match=r"hetfed 0\.1.*rerun the config"):
        read_checkpoint(tmp_path)


_PART = st.one_of(st.integers(0, 40), st.integers(0, 2**32 - 1), st.integers(2**32, 2**64 - 1),
                  st.integers(2**64, 2**100))


@given(st.lists(st.lists(_PART, min_size=1, max_size=7), min_size=1, max_size=6))
@settings(max_examples=300, deadline=None)
def test_a_rounds_seeds_hashed_at_once_are_numpys_seed_sequences(rows):
    """``derive_seeds`` reimplements NumPy's SeedSequence on arrays (a round's clients at once): every row's seed
    must be what NumPy's own class gives, for rows of any length and parts of one, two or more 32-bit words mixed
    in one call (fewer than the pool's four words, and more)."""
    from hetfed.engine import rng

    want = [int(np.random.SeedSequence(row).generate_state(2, np.uint64)[0] >> 1) for row in rows]
    assert [rng.derive_seed(*row) for row in rows] == want
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rng, "AT_ONCE_FROM", 0)  # the arrays, however few the rows
        assert rng.derive_seeds(rows) == want


def test_a_negative_seed_part_is_refused_as_numpy_refuses_it():
    from hetfed.engine import rng

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rng, "AT_ONCE_FROM", 0)
        with pytest.raises(ValueError, match="non-negative"):
            rng.derive_seeds([(1, -2)])
    with pytest.raises(ValueError):
        np.random.SeedSequence([1, -2])


_ONE_WORD = st.one_of(st.integers(0, 40), st.integers(0, 2**32 - 1))


@given(st.integers(1, 6).flatmap(lambda n: st.lists(st.lists(_ONE_WORD, min_size=n, max_size=n), min_size=1,
                                                    max_size=40)))
@settings(max_examples=200, deadline=None)
def test_a_rounds_rows_of_one_word_parts_hash_to_numpys_seeds_in_one_conversion(rows):
    """Rows of as many parts, each one 32-bit word (a round's clients), take ``derive_seeds``' array path: still
    NumPy's seeds, a part at 2³² − 1 included."""
    from hetfed.engine import rng

    want = [int(np.random.SeedSequence(row).generate_state(2, np.uint64)[0] >> 1) for row in rows]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rng, "AT_ONCE_FROM", 0)
        assert rng._one_word_parts(rows) is not None
        assert rng.derive_seeds(rows) == want
