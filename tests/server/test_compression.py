"""Update compression (#49): QSGD against its paper (Alistarh et al. 2017, §3.1 and Lemma 3.1), top-k with error
feedback (nothing is lost over rounds), the bytes counted, and runs that use them on every in-process executor."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.algorithms import build_algorithm, resolve_run
from hetfed.cli import main
from hetfed.config import ModelConfig, PartitionConfig, ServerConfig, TrainConfig
from hetfed.engine.types import Upload
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import RoundObserver, simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from hetfed.server.compression import parse, uniforms
from hetfed.server.compression.qsgd import pack, unpack
from hetfed.server.transport import RESIDUAL, transport
from tests.one_actor import ONE_ACTOR_SET
from tests.synthetic import ShiftedGaussians


def qsgd_paper(v: torch.Tensor, s: int, u: torch.Tensor) -> torch.Tensor:
    """Q_s(v) of one bucket as §3.1 writes it: ‖v‖₂·sgn(vᵢ)·ξᵢ, ξᵢ = (ℓ+1)/s with probability s|vᵢ|/‖v‖₂ − ℓ, else
    ℓ/s, ℓ = ⌊s|vᵢ|/‖v‖₂⌋; ``u`` the uniform draws deciding each coordinate."""
    norm = float(torch.linalg.vector_norm(v))
    out = torch.zeros_like(v)
    for i, vi in enumerate(v.tolist()):
        if norm == 0:
            continue
        r = s * abs(vi) / norm
        ell = math.floor(r)
        xi = (ell + 1) / s if float(u[i]) < r - ell else ell / s
        out[i] = norm * math.copysign(1.0, vi) * xi if vi != 0 else 0.0
    return out


def _qsgd(bits: int, bucket: int | None):
    return parse({"kind": "qsgd", "bits": bits, "bucket": bucket})


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_qsgd_is_the_papers_quantiser_draw_for_draw(bits):
    comp, p = _qsgd(bits, 8)
    s = 2 ** (bits - 1) - 1
    v = torch.randn(3, 20, generator=torch.Generator().manual_seed(bits))
    seeds = [11, 12, 13]
    got = comp.decode(comp.encode(v, seeds, 5, p), (20,), p)
    draws = uniforms(seeds, 5, 24, "cpu")  # each client's own: the same alone as in a stack
    assert torch.equal(uniforms([12], 5, 24, "cpu")[0], draws[1])
    for c in range(3):
        padded = torch.nn.functional.pad(v[c], (0, 4)).reshape(3, 8)
        u = draws[c].reshape(3, 8)
        want = torch.cat([qsgd_paper(padded[b], s, u[b]) for b in range(3)])[:20]
        torch.testing.assert_close(got[c], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bits,bucket", [(2, 16), (4, 64), (8, None)])
def test_qsgd_is_unbiased_and_within_its_variance_bound(bits, bucket):
    comp, p = _qsgd(bits, bucket)
    d = 64
    v = torch.randn(1, d, generator=torch.Generator().manual_seed(0))
    draws = 3000
    q = comp.decode(comp.encode(v.expand(draws, d), list(range(draws)), 0, p), (d,), p)  # every client its own stream
    mean, se = q.mean(0), q.std(0) / math.sqrt(draws)
    assert bool(((mean - v[0]).abs() <= 4 * se + 1e-7).all())  # E Q(v) = v, within 4 standard errors
    s, n = 2 ** (bits - 1) - 1, (bucket or d)
    sq_norms = v.reshape(-1, n).pow(2).sum(1)  # per bucket
    bound = float((min(n / s**2, math.sqrt(n) / s) * sq_norms).sum())  # Lemma 3.1, summed over buckets
    assert float((q - v).pow(2).sum(1).mean()) <= bound


@settings(max_examples=40, deadline=None)
@given(bits=st.integers(2, 8), m=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_the_bit_packing_round_trips_exactly(bits, m, seed):
    codes = torch.randint(0, 2**bits, (2, m), generator=torch.Generator().manual_seed(seed))
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape[1] == math.ceil(m * bits / 8)
    assert torch.equal(unpack(packed, bits, m).long(), codes)


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(2, 8), bucket=st.sampled_from([None, 1, 3, 32, 100, 512]),
       shape=st.lists(st.integers(1, 30), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_qsgd_sends_exactly_the_bytes_it_counts(bits, bucket, shape, seed):
    """The encoding's arrays are as long as ``nbytes`` says (no padded last bucket, no padded group of codes) and
    decode to the in-process round trip."""
    comp, p = _qsgd(bits, bucket)
    delta = torch.randn(2, *shape, generator=torch.Generator().manual_seed(seed))
    enc = comp.encode(delta, [seed, seed + 1], 0, p)
    assert all(v.shape[0] == 2 for v in enc.values())
    sent = sum(v[0].numel() * v.element_size() for v in enc.values())
    assert sent == comp.nbytes(tuple(shape), p)
    assert torch.equal(comp.decode(enc, tuple(shape), p), comp.received(delta, [seed, seed + 1], 0, p))


def test_the_issues_examples_send_what_they_count():
    for bits, bucket, n, expected in ((8, 512, 640, 4 * 2 + 640), (4, 32, 100, 4 * 4 + 50)):
        comp, p = _qsgd(bits, bucket)
        enc = comp.encode(torch.randn(1, n), [0], 0, p)
        assert sum(v.numel() * v.element_size() for v in enc.values()) == comp.nbytes((n,), p) == expected


def test_bytes_are_the_encodings_size():
    comp, p = _qsgd(4, 512)
    assert comp.nbytes((200, 10), p) == 4 * math.ceil(2000 / 512) + math.ceil(2000 * 4 / 8)
    topk, tp = parse({"kind": "topk", "fraction": 0.1})
    assert topk.nbytes((200, 10), tp) == 8 * 200
    for name in ("fp16", "bf16"):
        c, cp = parse({"kind": name})
        assert c.nbytes((200, 10), cp) == 2 * 2000
    none, np_ = parse({"kind": "none"})
    assert none.nbytes((200, 10), np_) == 4 * 2000
    assert transport({"kind": "none"}).nbytes({"w": (200, 10)}) == 4 * 2000


def test_topk_with_error_feedback_loses_nothing_over_rounds():
    t = transport({"kind": "topk", "fraction": 0.1, "error_feedback": True})
    ref = {"w": torch.zeros(5, 6)}
    residual = {RESIDUAL + "w": torch.zeros(2, 5, 6)}
    gen = torch.Generator().manual_seed(0)
    total_update, total_sent = torch.zeros(2, 5, 6), torch.zeros(2, 5, 6)
    for r in range(12):
        delta = torch.randn(2, 5, 6, generator=gen)
        total_update += delta
        before = residual[RESIDUAL + "w"].clone()
        upload, residual = t.send(Upload([0, 1], {"w": delta}, torch.ones(2)), ref, residual, [r, r + 100])
        sent = upload.params["w"]
        assert int((sent != 0).sum(dim=(1, 2)).max()) <= math.ceil(0.1 * 30)  # only k values travel
        torch.testing.assert_close(residual[RESIDUAL + "w"], delta + before - sent)  # what was not transmitted
        total_sent += sent
    torch.testing.assert_close(total_sent + residual[RESIDUAL + "w"], total_update)  # nothing lost


def test_without_error_feedback_topk_drops_what_it_does_not_send():
    t = transport({"kind": "topk", "fraction": 0.5})
    upload, residual = t.send(Upload([0], {"w": torch.tensor([[1.0, -3.0, 0.5, 2.0]])}, torch.ones(1)),
                              {"w": torch.zeros(4)}, {}, [0])
    assert residual == {} and upload.params["w"].tolist() == [[0.0, -3.0, 0.0, 2.0]]


def _setup(compression: dict, clients: int = 8, rounds: int = 3):
    data = ShiftedGaussians(n=240, d=6, classes=3)
    fed = make_federation(data, PartitionConfig(kind="dirichlet", clients=clients, alpha=0.5, min_size=8), 0)
    train = TrainConfig(rounds=rounds, local_steps=3, batch_size=8, eval_every=1,
                        optimizer={"kind": "sgd", "lr": 0.1, "momentum": 0.0})
    model = build_model(ModelConfig(kind="mlp", hidden=[16]), fed.input_shape, fed.n_classes)
    algo = build_algorithm("fedavg", model, train, server=ServerConfig(compression=compression))
    return algo, fed, train


@pytest.mark.parametrize("compression", [
    {"kind": "qsgd", "bits": 4, "bucket": 32, "error_feedback": True},
    {"kind": "topk", "fraction": 0.1, "error_feedback": True},
    {"kind": "bf16"},
])
def test_compressed_runs_are_the_same_on_both_in_process_executors(compression):
    results = []
    for executor in (VectorisedExecutor(), SequentialExecutor()):
        algo, fed, train = _setup(compression)
        results.append(simulate(algo, fed, train, seed=3, executor=executor))
    a, b = results
    for k in a.server.params:
        torch.testing.assert_close(a.server.params[k], b.server.params[k], rtol=1e-4, atol=1e-5)
    assert a.uplink_bytes == b.uplink_bytes
    if compression.get("error_feedback"):  # the residuals are client state, kept where the clients are
        ra, rb = a.executor.states[0], b.executor.states[0]
        assert any(k.startswith(RESIDUAL) for k in ra)
        for k in ra:
            torch.testing.assert_close(ra[k], rb[k], rtol=1e-4, atol=1e-5)


def test_compression_changes_the_model_and_the_bytes_and_none_changes_nothing():
    def run(compression):
        algo, fed, train = _setup(compression)
        return simulate(algo, fed, train, seed=1)

    plain, none, q8 = run({"kind": "none"}), run({"kind": "none"}), run({"kind": "qsgd", "bits": 8})
    algo, fed, train = _setup({"kind": "none"})
    default = simulate(build_algorithm("fedavg", algo.model, train), fed, train, seed=1)
    for k in plain.server.params:
        assert torch.equal(plain.server.params[k], default.server.params[k])
        assert torch.equal(plain.server.params[k], none.server.params[k])
    assert any(not torch.equal(plain.server.params[k], q8.server.params[k]) for k in plain.server.params)
    shapes = {k: tuple(v.shape) for k, v in plain.server.params.items()}
    per_client_none = sum(4 * math.prod(s) for s in shapes.values()) + 8
    per_client_q8 = transport({"kind": "qsgd", "bits": 8}).nbytes(shapes) + 8
    assert plain.uplink_bytes == 3 * 8 * per_client_none  # 3 rounds × 8 clients
    assert q8.uplink_bytes == 3 * 8 * per_client_q8 and q8.uplink_bytes < plain.uplink_bytes / 3


def test_the_upload_never_carries_the_residual():
    algo, fed, train = _setup({"kind": "topk", "fraction": 0.05, "error_feedback": True}, rounds=1)
    executor = VectorisedExecutor()
    executor.start(resolve_run(algo, fed, train, 0), fed, torch.device("cpu"))
    bc = algo.broadcast(algo.server_init(torch.Generator().manual_seed(0)), 0)
    upload = executor.train(bc, list(range(fed.n_clients)))
    names = set(upload.params) | set(getattr(upload, "mean", {}))
    assert names and not any(k.startswith(RESIDUAL) for k in names | set(upload.extra))
    residual = executor.states[0][RESIDUAL + "mlp.0.weight"] if RESIDUAL + "mlp.0.weight" in executor.states[0] \
        else next(v for k, v in executor.states[0].items() if k.startswith(RESIDUAL))
    assert float(residual.abs().sum()) > 0  # 95 % of the update stayed on the client


@pytest.mark.parametrize("setting,says", [
    (["server.compression.kind=zip"], "server.compression.kind = 'zip' is not allowed"),
    (["server.compression.kind=qsgd", "server.compression.bits=1"], "server.compression.bits"),
    (["server.compression.kind=topk", "server.compression.bits=4"], "unknown key 'server.compression.bits'"),
    (["server.compression.kind=none", "server.compression.error_feedback=true"], "loses nothing to feed back"),
    (["server.compression.kind=topk", "server.compression.error_feedback=maybe"], "error_feedback"),
])
def test_bad_compression_settings_are_refused_in_one_line(tmp_path, capsys, setting, says):
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "--quiet"]
    for s in setting:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and not out.exists()


def test_a_compressed_run_records_bytes_in_metrics_csv(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--quiet", "--set", "train.rounds=2", "--set", "methods.0.algorithm=fedavg",
                 "--set", "server.compression.kind=qsgd", "--set", "server.compression.bits=4"]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    up = [float(r["value"]) for r in rows if r["split"] == "train" and r["metric"] == "uplink_bytes"
          and r["method"] == "relu"]
    total = [float(r["value"]) for r in rows if r["split"] == "summary" and r["metric"] == "uplink_bytes_total"
             and r["method"] == "relu"]
    assert len(up) == 2 and up[0] > 0 and total == list(np.cumsum(up))


@pytest.mark.slow
def test_compression_with_error_feedback_gives_the_in_process_numbers_on_flower(tmp_path):
    """The nodes encode (their records carry the encodings) and keep their residuals between rounds; the server
    decodes: the in-process numbers. Top-k with error feedback and QSGD, each a method's own `server.compression`,
    in one Flower run."""
    pytest.importorskip("flwr")
    import json

    methods = ("methods=[{name: topk_ef, algorithm: fedavg, server: {compression: {kind: topk, fraction: 0.1, "
               "error_feedback: true}}}, "
               "{name: qsgd4, algorithm: fedavg, server: {compression: {kind: qsgd, bits: 4}}}]")
    common = ["--quiet", "--set", "partition.clients=3", "--set", "train.rounds=3", "--set", methods]
    assert main(["run", "--out", str(tmp_path / "f"), "--set", "train.executor=flower", "--set", ONE_ACTOR_SET,
                 *common]) == 0
    assert main(["run", "--out", str(tmp_path / "v"), *common]) == 0
    f, v = (json.loads((tmp_path / d / "summary.json").read_text())["methods"] for d in "fv")
    assert f["topk_ef"]["final"]["uplink_bytes_total"] != f["qsgd4"]["final"]["uplink_bytes_total"]
    for method in ("topk_ef", "qsgd4"):
        for key in ("global_accuracy", "local_accuracy_mean", "val_loss", "uplink_bytes_total"):
            assert f[method]["final"][key] == pytest.approx(v[method]["final"][key], rel=1e-5), (method, key)


def _model_uploaders():
    from hetfed.algorithms import registry
    from tests.feature_methods import reads_features

    return [n for n in registry.names() if registry.get(n).capabilities.server_model and reads_features(n)]


@pytest.mark.parametrize("name", _model_uploaders())
def test_every_algorithm_that_uploads_a_model_runs_compressed_with_error_feedback(tmp_path, name):
    """`server.compression` applies to every method whose server holds a model (their uploads' names differ:
    cluster models, control variates, heads …); the residuals are client state from the first round on."""
    import json

    import yaml

    from hetfed.algorithms import registry
    from hetfed.config import build_config, dump_config
    from hetfed.runs.runner import run_experiment

    spec = registry.get(name)
    raw = yaml.safe_load(dump_config(build_config()))
    raw["partition"]["clients"] = 4
    raw["train"].update({"rounds": 2, "local_steps": 2, "executor": "vectorised"})
    raw["server"]["compression"] = {"kind": "topk", "fraction": 0.2, "error_feedback": True}
    params = dict(spec.quick)
    if spec.capabilities.asynchronous:
        params = {**params, "concurrency": 3}
    raw["methods"] = [{"name": "m", "algorithm": name, "params": params, "model": dict(spec.model) or {"kind": "mlp"}}]
    run_experiment(build_config(raw), out=tmp_path / "r", progress=False)
    rows = list(csv.DictReader((tmp_path / "r" / "metrics.csv").read_text().splitlines()))
    sent = [float(r["value"]) for r in rows if r["split"] == "train" and r["metric"] == "uplink_bytes"]
    assert len(sent) == 2 and min(sent) > 0, json.dumps(sent)


def test_the_residuals_survive_a_resume(tmp_path):
    """A run killed after round 2 and resumed ends where the uninterrupted run does: its clients' residuals are in
    the checkpoint with the rest of their state."""
    import io

    from hetfed.runs.checkpoint import snapshot

    class Keep(RoundObserver):
        def __init__(self):
            self.saved = None

        def checkpoint(self, result, phase="federated"):
            buf = io.BytesIO()
            torch.save(snapshot(result), buf)
            self.saved = buf.getvalue()

        def round_done(self, rnd, metrics, timing):
            if rnd == 3:
                raise KeyboardInterrupt

    compression = {"kind": "topk", "fraction": 0.05, "error_feedback": True}
    algo, fed, train = _setup(compression, rounds=5)
    train = train.model_copy(update={"checkpoint_every": 2})
    ref = simulate(algo, fed, train, seed=4)
    keep = Keep()
    algo, fed, _ = _setup(compression, rounds=5)
    with pytest.raises(KeyboardInterrupt):
        simulate(algo, fed, train, seed=4, observers=[keep])
    saved = torch.load(io.BytesIO(keep.saved), weights_only=False)
    assert any(k.startswith(RESIDUAL) for k in saved["states"]["data"])
    algo, fed, _ = _setup(compression, rounds=5)
    resumed = simulate(algo, fed, train, seed=4, resume=saved["result"], resume_states=saved["states"])
    for k in ref.server.params:
        assert torch.equal(resumed.server.params[k], ref.server.params[k])


@settings(max_examples=30, deadline=None)
@given(bits=st.integers(2, 8), bucket=st.sampled_from([None, 1, 5, 8, 512]), n=st.integers(1, 40),
       clients=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_the_in_process_round_trip_is_the_wire_encodings_decode_bit_for_bit(bits, bucket, n, clients, seed):
    """In process nothing travels: the compressor's shortcut must be decode(encode(Δ)) exactly, short last bucket,
    zeros and all."""
    comp, p = _qsgd(bits, bucket)
    delta = torch.randn(clients, n, generator=torch.Generator().manual_seed(seed))
    delta[:, ::3] = 0.0
    seeds = list(range(seed, seed + clients))
    wire = comp.decode(comp.encode(delta, seeds, 2, p), (n,), p)
    assert torch.equal(comp.received(delta, seeds, 2, p), wire)


def test_compressing_in_blocks_and_in_place_changes_no_number_and_spares_what_the_caller_still_reads(monkeypatch):
    """The transport overwrites an upload's own tensors block by block, never a tensor that is also the clients'
    new state or the broadcast; the result is the one-block, out-of-place result."""
    from hetfed.engine.types import Upload
    from hetfed.server import transport as tr

    send = transport({"kind": "qsgd", "bits": 4, "error_feedback": True})
    g = torch.Generator().manual_seed(0)
    ref = {"w": torch.randn(6, 7, generator=g), "b": torch.randn(6, generator=g)}
    theta = {k: v + 0.1 * torch.randn(5, *v.shape, generator=g) for k, v in ref.items()}
    residual = {RESIDUAL + k: 0.01 * torch.randn(5, *v.shape, generator=g) for k, v in ref.items()}
    seeds = [3, 1, 4, 1, 5]

    def upload():
        return Upload(client_ids=list(range(5)), params={k: v.clone() for k, v in theta.items()},
                      num_samples=[1] * 5, extra={})

    monkeypatch.setattr(tr, "BLOCK_VALUES", 10**9)
    one, kept_one = send.send(upload(), ref, residual, seeds)
    monkeypatch.setattr(tr, "BLOCK_VALUES", 7)  # one client per block
    up = upload()
    state_b = up.params["b"]  # the clients' new state is the uploaded tensor itself
    blocks, kept_blocks = send.send(up, ref, residual, seeds, still_read=(state_b,))
    for k in ref:
        assert torch.equal(blocks.params[k], one.params[k]) and torch.equal(kept_blocks[RESIDUAL + k],
                                                                           kept_one[RESIDUAL + k])
    assert blocks.params["w"] is up.params["w"]  # overwritten where it lives
    assert torch.equal(state_b, theta["b"]) and blocks.params["b"] is not state_b  # spared
    kept = upload()
    assert send.send(kept, ref, residual, seeds)[0].params["w"] is not kept.params["w"]  # not handed over: left
    assert torch.equal(kept.params["w"], theta["w"])


@pytest.mark.parametrize("compression", [{"kind": "qsgd", "bits": 4, "error_feedback": True},
                                         {"kind": "topk", "fraction": 0.2, "error_feedback": True},
                                         {"kind": "fp16"}])
def test_what_a_flower_node_sends_is_the_encoding_and_the_server_decodes_the_in_process_update(compression):
    """A node's upload carries each parameter's encoding (``<name>|<field>``: QSGD's packed bytes and norms, top-k's
    values and positions) — what a real client sends, no float32 copy of the update — and the server's decoding
    is the in-process transport's result bit for bit, residuals included."""
    from hetfed.engine.types import Upload
    from hetfed.server.transport import FIELD

    t = transport(compression)
    g = torch.Generator().manual_seed(1)
    ref = {"w": torch.randn(5, 7, generator=g), "b": torch.randn(5, generator=g)}
    theta = {k: v + 0.1 * torch.randn(3, *v.shape, generator=g) for k, v in ref.items()}
    residual = {RESIDUAL + k: 0.01 * torch.randn(3, *v.shape, generator=g) for k, v in ref.items()}
    seeds = [5, 6, 7]
    up = Upload([0, 1, 2], {k: v.clone() for k, v in theta.items()}, torch.ones(3), {"train_loss": torch.zeros(3)})
    wire, kept_wire = t.encode(up, ref, residual if t.error_feedback else {}, seeds)
    assert all(FIELD in k for k in wire.params) and "w" not in wire.params
    sent_bytes = sum(v[0].numel() * v.element_size() for v in wire.params.values())
    exact = t.nbytes({k: tuple(v.shape) for k, v in ref.items()})
    assert sent_bytes == exact  # what travels is what metrics.csv counts
    local, kept_local = t.send(Upload([0, 1, 2], {k: v.clone() for k, v in theta.items()}, torch.ones(3)), ref,
                               residual if t.error_feedback else {}, seeds)
    decoded = t.decode(wire, ref)
    for k in ref:
        assert torch.equal(decoded.params[k], local.params[k]), k
    assert set(kept_wire) == set(kept_local) and all(torch.equal(kept_wire[k], kept_local[k]) for k in kept_wire)


def test_the_rounding_draws_are_the_clients_counter_based_streams():
    """QSGD's draws are hetfed.streams' hash (the int64 form, :func:`hetfed.streams.uniform`) at the client's key for
    (QUANTISE, the parameter): a function of the client alone, computed where the update is — no host generator."""
    from hetfed import streams
    from hetfed.engine.rng import QUANTISE

    seeds = [5, 2**40 + 7, 2**62 + 11]  # high bits matter (streams.keys folds them)
    got = uniforms(seeds, 3, 1000, "cpu")
    key = streams.bits(streams.keys(seeds, "cpu"), QUANTISE, 3)
    want = streams.uniform(key[:, None], torch.arange(1000)[None])
    assert torch.equal(got, want)
    assert torch.equal(uniforms(seeds[1:2], 3, 1000, "cpu")[0], got[1])  # alone as in a stack
    assert not torch.equal(uniforms(seeds, 4, 1000, "cpu"), got)  # another parameter, other draws


def _special_values(clients: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    delta = torch.randn(clients, n, generator=g) * 0.01
    delta[0, : n // 2] = 0.0  # a zero bucket (scale 0)
    delta[-1, 1] = -0.0
    delta[-1, 2] = 1e-30  # levels of a value far below its bucket's norm
    return delta


@pytest.mark.parametrize("bits,bucket,n", [(2, 512, 1003), (4, 7, 50), (8, None, 333), (8, 512, 2048), (3, 64, 700)])
def test_the_fused_kernel_gives_the_torch_paths_numbers(monkeypatch, bits, bucket, n):
    """On a CPU QSGD rounds in one compiled pass (Numba); the torch path (GPUs, small tensors) must give the same
    floats — encodings, round trips, and the transport's parameters and residuals — or a client's numbers would
    depend on its stack's size (which picks the path) and on the device."""
    from hetfed.engine.types import Upload
    from hetfed.server.compression import fused

    comp, p = _qsgd(bits, bucket)
    delta = _special_values(4, n, bits)
    seeds = [9, 8, 7, 2**50]
    ref = torch.randn(n, generator=torch.Generator().manual_seed(1))
    residual = {RESIDUAL + "w": 0.001 * torch.randn(4, n, generator=torch.Generator().manual_seed(2))}
    send = transport({"kind": "qsgd", "bits": bits, "bucket": bucket, "error_feedback": True})
    calls = {"fused": 0}
    levels = fused.levels

    def counted(*a, **k):
        calls["fused"] += 1
        return levels(*a, **k)

    monkeypatch.setattr(fused, "levels", counted)

    def everything():
        up = Upload(client_ids=[0, 1, 2, 3], params={"w": (ref + delta).clone()}, num_samples=[1] * 4, extra={})
        sent, left = send.send(up, {"w": ref}, residual, seeds, still_read=())
        return (comp.encode(delta, seeds, 2, p), comp.received(delta, seeds, 2, p), sent.params["w"],
                left[RESIDUAL + "w"])

    monkeypatch.setattr(fused, "FUSED_FROM", 1 << 60)
    monkeypatch.setattr(fused, "LOADED_FROM", 1 << 60)
    slow = everything()
    assert calls["fused"] == 0
    monkeypatch.setattr(fused, "FUSED_FROM", 0)
    monkeypatch.setattr(fused, "LOADED_FROM", 0)
    fast = everything()
    assert calls["fused"] == 3  # encode, round trip, and the transport's one pass (parameters and residuals at once)
    for field in slow[0]:
        assert torch.equal(slow[0][field], fast[0][field]), field
    for a, b in zip(slow[1:], fast[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_fused_kernel_shares_a_large_update_among_threads_with_the_same_numbers(monkeypatch):
    from hetfed.server.compression import fused

    comp, p = _qsgd(8, 512)
    delta = _special_values(3, 100_003, 0)
    seeds = [1, 2, 3]
    monkeypatch.setattr(fused, "FUSED_FROM", 0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = comp.received(delta, seeds, 0, p)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(fused, "VALUES_PER_THREAD", 1000)
    assert torch.equal(comp.received(delta, seeds, 0, p), one)


def test_resuming_a_qsgd_run_whose_draws_came_from_the_old_generator_is_refused(tmp_path, monkeypatch, capsys):
    """A checkpoint written before QSGD's draws were counter-based (``random_streams`` v1, or none recorded) cannot
    continue with today's draws; a run without a drawing compressor can."""
    from hetfed.executors import inprocess as executors
    from hetfed.runs.checkpoint import checkpoint_path, read_checkpoint

    real = executors.InProcessExecutor.train
    for name, compression, refused in (("q", "{kind: qsgd, bits: 4}", True),
                                       ("t", "{kind: topk, fraction: 0.1}", False)):
        calls = {"n": 0}

        def train(self, bc, clients, *a, calls=calls, **k):
            calls["n"] += 1
            if calls["n"] > 2:
                raise KeyboardInterrupt
            return real(self, bc, clients, *a, **k)

        monkeypatch.setattr(executors.InProcessExecutor, "train", train)
        out = tmp_path / name
        assert main(["run", "--quiet", "--set", "train.rounds=4", "--set", "train.checkpoint_every=1", "--set",
                     "train.eval_every=2", "--set", "partition.clients=4",
                     "--set", f"methods=[{{algorithm: fedavg, server: {{compression: {compression}}}}}]",
                     "--out", str(out)]) == 130
        monkeypatch.setattr(executors.InProcessExecutor, "train", real)
        path = checkpoint_path(out)
        payload = read_checkpoint(out)
        assert payload is not None and payload.pop("random_streams") == "counter-lowbias32-v2"
        torch.save(payload, path)  # as a version before wrote it (torch.save, no random_streams)
        capsys.readouterr()
        assert main(["run", "--quiet", "--resume", str(out)]) == (2 if refused else 0)
        err = capsys.readouterr().err
        if refused:
            assert "counter-lowbias32-v1" in err and "qsgd" in err and len(err.strip().splitlines()) == 1


def test_without_a_writable_cache_the_kernel_compiles_in_memory(monkeypatch):
    """Numba refuses ``cache=True`` where it finds no writable place (a read-only install and home): the kernel is
    then compiled in the process, with the same numbers."""
    import numba

    from hetfed.server.compression import fused

    real = numba.njit

    def njit(*args, **options):  # numba's own modules call it too (numba.typed, imported on first use)
        if options.get("cache"):
            raise RuntimeError("cannot cache function '_levels_py': no locator available for file")
        return real(*args, **options)

    comp, p = _qsgd(8, 64)
    delta = _special_values(3, 5000, 1)
    want = comp.received(delta, [1, 2, 3], 0, p)
    monkeypatch.setattr(numba, "njit", njit)
    monkeypatch.setattr(fused, "FUSED_FROM", 0)
    monkeypatch.setattr(fused, "_mix32", fused._mix32_py)
    monkeypatch.setattr(fused, "_rounded", fused._rounded_py)
    fused._kernel.cache_clear()
    try:
        torch.testing.assert_close(comp.received(delta, [1, 2, 3], 0, p), want, rtol=0, atol=0)
    finally:
        fused._kernel.cache_clear()


def test_only_a_large_update_loads_the_kernel_and_once_loaded_it_serves_smaller_ones(monkeypatch):
    """Loading the kernel costs ~0.5 s a process: a small model's run (digits) never pays it; a large update does,
    and then updates from LOADED_FROM values use it too."""
    from hetfed.server.compression import fused

    monkeypatch.setattr(fused, "_mix32", fused._mix32_py)
    monkeypatch.setattr(fused, "_rounded", fused._rounded_py)
    fused._kernel.cache_clear()
    try:
        small, large = torch.zeros(4, fused.LOADED_FROM), torch.zeros(1, fused.FUSED_FROM)
        assert not fused.usable(small) and fused.usable(large)
        comp, p = _qsgd(8, 512)
        comp.received(large, [1], 0, p)  # loads it
        assert fused._kernel.cache_info().currsize == 1 and fused.usable(small)
        assert not fused.usable(torch.zeros(1, fused.LOADED_FROM - 1))
    finally:
        fused._kernel.cache_clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)")
def test_qsgds_draws_are_bit_identical_on_cuda_and_its_round_trip_matches_the_cpus():
    """The rounding draws are computed where the update is, from the clients' counter-based streams: the same bits
    on a GPU. The GPU's round trip (the torch path) then equals the CPU's (the compiled kernel, for an update this
    large) up to the bucket norms: a GPU's reduction rounds them in their last bits (measured on an H100: 26 % of
    the decoded values differed by that), which can also move a value whose draw sits on a level's edge by one
    level — so all but a handful of codes must be equal, and the values to the norms' precision."""
    seeds = [5, 2**40 + 7, 2**62 + 11]
    assert torch.equal(uniforms(seeds, 3, 100_003, "cuda").cpu(), uniforms(seeds, 3, 100_003, "cpu"))
    comp, p = _qsgd(8, 512)
    delta = _special_values(3, 300_001, 0)
    cpu, gpu = comp.encode(delta, seeds, 2, p), comp.encode(delta.cuda(), seeds, 2, p)
    torch.testing.assert_close(gpu["norms"].cpu(), cpu["norms"], rtol=1e-6, atol=0)
    codes_c, codes_g = unpack(cpu["codes"], 8, 300_001), unpack(gpu["codes"].cpu(), 8, 300_001)
    assert (codes_c != codes_g).sum() <= 10
    back_c, back_g = comp.received(delta, seeds, 2, p), comp.received(delta.cuda(), seeds, 2, p).cpu()
    same = codes_c == codes_g  # the same level: the values differ by their bucket norm's last bits at most
    torch.testing.assert_close(back_g[same], back_c[same], rtol=1e-5, atol=0)
    step = float(cpu["norms"].max()) / 127  # a level apart at most elsewhere
    assert all(abs(float(d)) <= 1.001 * step for d in (back_c - back_g)[~same])


def test_a_gpu_stack_is_compressed_in_one_block_and_a_cpu_stack_in_cache_sized_ones():
    """Blocks keep a CPU's temporaries in cache; on a GPU they only launch the compressor's kernels again (QSGD at 8
    bits cost 3.7× a W1 round on an H100 in ~25 blocks): a stack off the CPU is one block (``meta`` stands for a
    GPU here; blocks change no number, test above)."""
    from hetfed.server import transport as tr

    w1_layer = (100, 784 * 200)
    assert len(tr._blocks(torch.empty(w1_layer))) > 10
    assert tr._blocks(torch.empty(w1_layer, device="meta")) == [(0, 100)]
