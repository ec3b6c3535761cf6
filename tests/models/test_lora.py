"""#75: a frozen pretrained encoder with LoRA adapters, stacked over clients — against ``peft``'s own LoRA layers,
one client against a stack, and a federated run end to end (a tiny BERT written by the test: nothing downloads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.one_actor import ONE_ACTOR
from tests.tiny_bert import WORDS, write_tiny_bert

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> Path:
    """A BERT of 2 layers and width 16 with its WordPiece tokenizer, saved as a Hugging Face folder."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


def _ids(folder: Path, texts: list[str], length: int = 12) -> torch.Tensor:
    from hetfed.data.embeddings.wordpiece import encode

    return torch.as_tensor(encode(texts, str(folder), length), dtype=torch.float32)


def _random_adapters(model, n: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """Every shared parameter for n clients, B not zero (a trained adapter), drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return {s.name: torch.randn((n, *s.shape), generator=gen) * 0.3 for s in model.specs()}


def test_the_adapted_encoder_computes_what_peft_computes_with_the_same_weights(tiny_encoder):
    """Hidden states, and the gradients of the adapters, equal peft's LoraModel's (1e-5)."""
    from hetfed.models.lora import LoRAEncoder

    model = LoRAEncoder(str(tiny_encoder), 12, 3, rank=4, alpha=8.0, targets=("query", "value"))
    params = {k: v.requires_grad_() for k, v in _random_adapters(model, 1).items()}
    x = _ids(tiny_encoder, ["the cat sat on the mat", "a big red dog ran", "good film"])[None]
    ours = model.features(params, x)[0]

    base = transformers.BertModel.from_pretrained(tiny_encoder)
    reference = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                          target_modules=["query", "value"]))
    reference.eval()
    modules = dict(reference.named_modules())
    for i, name in enumerate(model.adapted):
        layer = modules[f"base_model.model.{name}"]
        with torch.no_grad():
            layer.lora_A["default"].weight.copy_(params[f"lora{i}.A"][0])
            layer.lora_B["default"].weight.copy_(params[f"lora{i}.B"][0])
    ids = x[0].long()
    mask = (ids != 0).long()
    hidden = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    theirs = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    assert torch.allclose(ours, theirs, atol=1e-5)

    weights = torch.randn(theirs.shape, generator=torch.Generator().manual_seed(2))
    ours_grads = torch.autograd.grad((ours * weights).sum(), [params[f"lora{i}.{p}"] for i in range(len(model.adapted))
                                                              for p in "AB"])
    (theirs * weights).sum().backward()
    for j, name in enumerate(model.adapted):
        layer = modules[f"base_model.model.{name}"]
        assert torch.allclose(ours_grads[2 * j][0], layer.lora_A["default"].weight.grad, atol=1e-5)
        assert torch.allclose(ours_grads[2 * j + 1][0], layer.lora_B["default"].weight.grad, atol=1e-5)


def test_a_stack_of_clients_computes_what_each_client_does_alone(tiny_encoder):
    """One base forward over the stack, each client's adapters on its own rows: the logits of each client alone."""
    from hetfed.models.lora import LoRAEncoder

    model = LoRAEncoder(str(tiny_encoder), 12, 4, rank=2, targets=("query", "key", "value", "dense"))
    params = _random_adapters(model, 3)
    texts = [["the cat sat", "dog ran fast"], ["a happy movie", "bad plot"], ["red log", "slow small actor"]]
    x = torch.stack([_ids(tiny_encoder, t) for t in texts])
    stacked = model.forward(params, x)
    for k in range(3):
        alone = model.forward({name: v[k:k + 1] for name, v in params.items()}, x[k:k + 1])
        assert torch.allclose(stacked[k], alone[0], atol=1e-5)
    assert not torch.allclose(stacked[0], stacked[1])


def test_zero_adapters_leave_the_pretrained_encoder_as_it_was(tiny_encoder):
    """B starts at zero (peft's initialisation): round 0's model is the frozen base with a fresh head."""
    from hetfed.models.lora import LoRAEncoder

    model = LoRAEncoder(str(tiny_encoder), 12, 2)
    params = {k: v[None] for k, v in model.init_shared(torch.Generator().manual_seed(0)).items()}
    x = _ids(tiny_encoder, ["the cat sat on the mat"])
    hidden = transformers.BertModel.from_pretrained(tiny_encoder)(input_ids=x.long(),
                                                                  attention_mask=(x != 0).long()).last_hidden_state
    mask = (x != 0).float()[..., None]
    assert torch.allclose(model.features(params, x[None])[0], (hidden * mask).sum(1) / mask.sum(1), atol=1e-5)


def _texts(n: int = 240) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, n)
    good, bad = ["good", "happy", "fast", "big"], ["bad", "sad", "slow", "small"]
    x = np.array([" ".join(rng.choice(good if c else bad, 3).tolist() + rng.choice(WORDS, 3).tolist()) for c in y])
    return x, y


def _run(tiny_encoder, tmp_path, executor: str, methods: list[dict], rounds: int = 6, capture: str = "auto") -> dict:
    from hetfed.config import build_config
    from hetfed.runs.runner import run_experiment

    x, y = _texts()
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "texts.npz"
    np.savez(path, x=x.astype(str), y=y, split=np.where(np.arange(len(y)) < 200, "train", "test"))
    cfg = build_config({
        "dataset": {"name": "arrays", "path": str(path)},
        "embed": {"kind": "wordpiece", "path": str(tiny_encoder), "max_length": 12},
        "partition": {"kind": "dirichlet", "alpha": 0.5, "clients": 4},
        "model": {"kind": "lora_encoder", "path": str(tiny_encoder), "rank": 4},
        "train": {"rounds": rounds, "batch_size": 16, "local_epochs": 1, "executor": executor,
                  "optimizer": {"kind": "adam", "lr": 0.02}, "capture": capture},
        **({"flower": {"connect_timeout": 300, **ONE_ACTOR}} if executor == "flower" else {}),
        "methods": methods})
    return run_experiment(cfg, out=tmp_path / executor, progress=False).summary["methods"]


def test_the_lora_methods_train_and_send_only_what_they_share(tiny_encoder, tmp_path):
    """A federated run end to end from a config: the adapters learn the task. FedIT sends every adapter and the
    head, FFA-LoRA the B matrices and the head (its A frozen), FedSA-LoRA the A matrices and the head (its B kept):
    never the encoder. The vectorised and the sequential executor agree."""
    from hetfed.models.lora import LoRAEncoder

    methods = [{"name": m, "algorithm": m} for m in ("fedit", "ffa_lora", "fedsa_lora")]
    rows = _run(tiny_encoder, tmp_path, "vectorised", methods)
    model = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4)
    half, head = model.adapter_floats() // 2, 16 * 2 + 2
    for name, shared in (("fedit", 2 * half + head), ("ffa_lora", half + head), ("fedsa_lora", half + head)):
        # 6 rounds × 4 clients, each sending its shared parameters in float32, its sample count and its loss
        assert rows[name]["uplink_bytes"] == 6 * 4 * (4 * shared + 8), name
    assert rows["fedit"]["final"]["global_accuracy"] > 0.8, rows["fedit"]["final"]
    assert rows["ffa_lora"]["final"]["global_accuracy"] > 0.8, rows["ffa_lora"]["final"]
    assert rows["fedsa_lora"]["final"]["local_accuracy_mean"] > 0.8, rows["fedsa_lora"]["final"]
    assert "global_accuracy" not in rows["fedsa_lora"]["final"] or rows["fedsa_lora"]["final"]["global_accuracy"] > 0.5
    alone = _run(tiny_encoder, tmp_path, "sequential", methods[:1])["fedit"]
    # one base forward over the stack or one per client: the same run up to float rounding
    assert rows["fedit"]["final"]["global_loss"] == pytest.approx(alone["final"]["global_loss"], rel=1e-4)


def test_ffa_lora_keeps_every_clients_a_at_the_servers_first_draw(tiny_encoder):
    """FFA-LoRA's A matrices are one draw (the run seed's server initialisation) on every client and never move."""
    from hetfed.algorithms import build_algorithm
    from hetfed.config import TrainConfig
    from hetfed.engine.rng import SERVER_INIT, torch_gen
    from hetfed.models.lora import LoRAEncoder

    model = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4)
    algo = build_algorithm("ffa_lora", model, TrainConfig(), seed=3)
    first = model.init_shared(torch_gen(3, SERVER_INIT))
    server = algo.server_init(torch_gen(3, SERVER_INIT))
    assert not set(model.lora_names("A")) & set(server.params)  # the server holds B and the head only
    for k in (0, 5):
        state = algo.client_init(k, torch.Generator())
        assert all(torch.equal(state[name], first[name]) for name in model.lora_names("A"))


def test_a_model_and_a_tokenizer_of_different_folders_are_refused(tiny_encoder, tmp_path):
    from hetfed.config import build_config
    from hetfed.errors import ConfigError
    from hetfed.runs.plan import check_config

    cfg = build_config({"dataset": {"name": "arrays", "path": str(tmp_path / "t.npz")},
                        "embed": {"kind": "wordpiece", "path": str(tiny_encoder)},
                        "model": {"kind": "lora_encoder", "path": str(tmp_path)},
                        "methods": [{"name": "fedit", "algorithm": "fedit"}]})
    with pytest.raises(ConfigError, match=r"model.path = .* with embed.path = .* is not allowed: the model reads its "
                                          r"own tokenizer's ids"):
        check_config(cfg)


def test_fedit_refuses_a_model_without_adapters():
    from hetfed.config import build_config
    from hetfed.errors import ConfigError
    from hetfed.runs.plan import check_config

    cfg = build_config({"methods": [{"name": "fedit", "algorithm": "fedit", "model": {"kind": "mlp"}}]})
    with pytest.raises(ConfigError, match="is not allowed with model.kind = 'mlp'"):
        check_config(cfg)


def test_dp_sgd_is_refused_on_the_adapted_encoder(tiny_encoder, tmp_path):
    """privacy.record's per-sample gradients through a Hugging Face module are unchecked: refused before any file."""
    from hetfed.config import build_config
    from hetfed.errors import ConfigError
    from hetfed.runs.runner import run_experiment

    x, y = _texts()
    path = tmp_path / "texts.npz"
    np.savez(path, x=x.astype(str), y=y)
    cfg = build_config({"dataset": {"name": "arrays", "path": str(path)},
                        "embed": {"kind": "wordpiece", "path": str(tiny_encoder), "max_length": 12},
                        "partition": {"kind": "iid", "clients": 2},
                        "model": {"kind": "lora_encoder", "path": str(tiny_encoder)},
                        "privacy": {"record": {"noise_multiplier": 1.0}},
                        "methods": [{"name": "fedit", "algorithm": "fedit"}]})
    with pytest.raises(ConfigError, match=r"privacy.record.noise_multiplier = 1 with methods.0 \(model.kind = "
                                          r"'lora_encoder'\) is not allowed: its frozen encoder's forward"):
        run_experiment(cfg, out=tmp_path / "dp", progress=False)
    assert not (tmp_path / "dp").exists()


@pytest.mark.slow
def test_the_lora_methods_on_flowers_simulation_engine_give_the_in_process_numbers(tiny_encoder, tmp_path):
    """The same runs on Flower's Simulation Engine: every node rebuilds the encoder from model.path, only what each
    method shares travels (the same uplink bytes: FedIT's adapters and head; HetLoRA's with its weight; FLoRA's merged
    update goes down in the broadcast, never up), the clients' own parts (FedSA-LoRA's B, the ranks) stay on the
    nodes, and the numbers are the vectorised executor's."""
    pytest.importorskip("flwr")
    methods = [{"name": m, "algorithm": m} for m in ("fedit", "ffa_lora", "fedsa_lora", "hetlora", "flora")]
    vec = _run(tiny_encoder, tmp_path / "v", "vectorised", methods, rounds=2)
    flower = _run(tiny_encoder, tmp_path / "f", "flower", methods, rounds=2)
    assert flower["fedit"]["uplink_bytes"] == 2 * 4 * (4 * 546 + 8)  # 512 adapter floats + 34 head
    for name in ("fedit", "ffa_lora", "fedsa_lora", "hetlora", "flora"):
        assert flower[name]["uplink_bytes"] == vec[name]["uplink_bytes"], name
        for key in ("global_loss", "global_accuracy", "val_loss", "local_accuracy_mean"):
            if key in vec[name]["final"]:
                assert flower[name]["final"][key] == pytest.approx(vec[name]["final"][key], rel=1e-4, abs=1e-5), (
                    name, key)


def _sweep_config(tiny_encoder: Path, folder: Path, extra: dict | None = None):
    """A small sweep's config over the tiny encoder: the texts written to ``folder`` as an arrays file, 4 Dirichlet
    clients, LoRA rank 4, 2 rounds evaluated each; ``extra``: more top-level keys (the methods)."""
    from hetfed.config import build_config

    x, y = _texts()
    np.savez(folder / "texts.npz", x=x.astype(str), y=y, split=np.where(np.arange(len(y)) < 200, "train", "test"))
    return build_config({
        "dataset": {"name": "arrays", "path": str(folder / "texts.npz")},
        "embed": {"kind": "wordpiece", "path": str(tiny_encoder), "max_length": 12},
        "partition": {"kind": "dirichlet", "alpha": 0.5, "clients": 4},
        "model": {"kind": "lora_encoder", "path": str(tiny_encoder), "rank": 4},
        "train": {"rounds": 2, "batch_size": 16, "local_epochs": 1, "eval_every": 1,
                  "optimizer": {"kind": "adam", "lr": 0.02}},
        **(extra or {})})


def test_a_stacked_sweep_of_the_lora_methods_gives_the_sweep_one_by_one(tiny_encoder, tmp_path, monkeypatch):
    """#74: FedIT, FFA-LoRA, FedSA-LoRA, HetLoRA and FLoRA declare ``stacks_runs``: stacked, each seed's clients train
    and are scored in one stack with the other seed's (each with its own run's adapters, ranks, frozen A and FLoRA's
    merged update), and runs.csv is the sweep's one by one to the bit (every value of metrics.csv to float
    tolerance)."""
    from hetfed.executors import stacked_runs
    from hetfed.runs.sweep import run_sweep
    from tests.runs.test_stacked_sweep import _equal, _metrics, _runs

    served: set[tuple[str, str, int]] = set()
    for name in ("train_together", "evaluate_together"):
        computed = getattr(stacked_runs, name)
        monkeypatch.setattr(stacked_runs, name, lambda group, computed=computed, name=name: served.add(
            (group[0].executor.algo.spec.name, name, len(group))) or computed(group))
    methods = ("fedit", "ffa_lora", "fedsa_lora", "hetlora", "flora")
    cfg = _sweep_config(tiny_encoder, tmp_path, {"methods": [{"name": m, "algorithm": m} for m in methods]})
    run_sweep(cfg, {}, seeds=2, out=tmp_path / "one_by_one", progress=False)
    run_sweep(cfg, {}, seeds=2, out=tmp_path / "stacked", progress=False, stack=True)
    _equal(_runs(tmp_path / "stacked", ()), _runs(tmp_path / "one_by_one", ()))
    alone, stacked = _metrics(tmp_path / "one_by_one"), _metrics(tmp_path / "stacked")
    assert alone.keys() == stacked.keys()
    for key, value in alone.items():
        assert stacked[key] == pytest.approx(value, rel=1e-5, abs=1e-8, nan_ok=True), key
    assert {(m, kind) for m, kind, size in served if size == 2} == {
        (m, kind) for m in methods for kind in ("train_together", "evaluate_together")}


def test_lora_methods_side_by_side_score_each_with_its_own_adapters(tiny_encoder, tmp_path, monkeypatch):
    """#74 §1: FedIT's and FFA-LoRA's clients both score the model sent, the base way, but FFA-LoRA's predict with the
    frozen A matrices they hold (model names in their states): a grid of the two, stacked, never scores one's clients
    in the other's stack, and runs.csv is the sweep's one by one to the bit."""
    from hetfed.executors import stacked_runs
    from hetfed.runs.sweep import run_sweep
    from tests.runs.test_stacked_sweep import _equal, _runs

    scored: list[tuple[str, ...]] = []
    evaluate = stacked_runs.evaluate_together
    monkeypatch.setattr(stacked_runs, "evaluate_together", lambda group: scored.append(
        tuple(sorted({r.executor.algo.spec.name for r in group}))) or evaluate(group))
    cfg = _sweep_config(tiny_encoder, tmp_path)
    grid = {"methods": [[{"name": m, "algorithm": m}] for m in ("fedit", "ffa_lora")]}
    run_sweep(cfg, grid, seeds=2, out=tmp_path / "one_by_one", progress=False)
    run_sweep(cfg, grid, seeds=2, out=tmp_path / "stacked", progress=False, stack=True)
    _equal(_runs(tmp_path / "stacked", ("methods",)), _runs(tmp_path / "one_by_one", ("methods",)))
    assert set(scored) == {("fedit",), ("ffa_lora",)}, scored


def _hetlora(tiny_encoder, **params):
    from hetfed.algorithms import build_algorithm
    from hetfed.config import TrainConfig
    from hetfed.models.lora import LoRAEncoder

    model = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4)
    train = TrainConfig(batch_size=8, optimizer={"kind": "adam", "lr": 0.05})
    return model, build_algorithm("hetlora", model, train, seed=0, params=params)


def _stack(algo, tiny_encoder, ranks: list[int]):
    """Three clients of ``ranks`` holding the server's first model, and their data."""
    from hetfed.engine.rng import SERVER_INIT, torch_gen
    from hetfed.engine.types import Broadcast, ClientData, stack_states

    x, y = _texts(48)
    ids = _ids(tiny_encoder, list(x))
    states = stack_states([algo.client_init(k, torch.Generator().manual_seed(k)) for k in range(3)])
    states["hetlora.rank"] = torch.tensor([float(r) for r in ranks])
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    server.params["lora0.B"] += 0.1  # a trained global model: every component of every adapter in use
    data = ClientData([0, 1, 2], ids, torch.as_tensor(y), [np.arange(k * 16, k * 16 + 16) for k in range(3)],
                      [11, 12, 13])
    return server, Broadcast(server.params, 0, 0.05), states, data


def test_hetlora_clients_train_their_own_rank_and_the_server_weights_them_by_their_update(tiny_encoder):
    """Each client trains the global adapters cut to its rank (zero beyond it, in what it uploads); the server
    averages the zero-padded adapters weighted by each client's Σ‖B A‖_F (Cho et al. 2024, sparsity weights)."""
    model, algo = _hetlora(tiny_encoder, lam=0.0)
    server, bc, states, data = _stack(algo, tiny_encoder, [1, 2, 4])
    upload, new = algo.local_update(bc, states, data)
    for k, rank in enumerate((1, 2, 4)):
        for a, b in zip(model.lora_names("A"), model.lora_names("B"), strict=True):
            assert torch.count_nonzero(upload.params[a][k, rank:]) == 0
            assert torch.count_nonzero(upload.params[a][k, :rank]) > 0
            assert torch.count_nonzero(upload.params[b][k, :, rank:]) == 0
    assert torch.equal(new["hetlora.rank"], torch.tensor([1.0, 2.0, 4.0]))  # λ = 0: nobody prunes
    norms = sum(torch.linalg.matrix_norm(upload.params[b] @ upload.params[a])
                for a, b in zip(model.lora_names("A"), model.lora_names("B"), strict=True))
    assert torch.allclose(upload.extra["sparsity"], norms)
    weights = norms / norms.sum()
    merged = algo.aggregate(server, upload)
    for name in upload.params:
        assert torch.allclose(merged.params[name], torch.tensordot(weights, upload.params[name], dims=1), atol=1e-6)


def test_hetlora_self_prunes_a_rank_only_when_its_last_components_shrink(tiny_encoder):
    """A strong self-pruning term shrinks each client's last components, so its rank falls to ⌊γ·r⌋ (never below
    min_rank); without the term the ranks stay. The rank never leaves the client: not in the upload."""
    model, algo = _hetlora(tiny_encoder, lam=10.0, gamma=0.5, min_rank=1)
    _server, bc, states, data = _stack(algo, tiny_encoder, [1, 2, 4])
    upload, new = algo.local_update(bc, states, data)
    assert torch.equal(new["hetlora.rank"], torch.tensor([1.0, 1.0, 2.0]))
    assert "hetlora.rank" not in upload.params and "hetlora.rank" not in upload.extra


def test_hetlora_draws_ranks_or_takes_them_and_refuses_ranks_that_do_not_fit(tiny_encoder, tmp_path):
    from hetfed.errors import ConfigError

    _model, algo = _hetlora(tiny_encoder, min_rank=2)
    drawn = {int(algo.client_init(k, torch.Generator().manual_seed(k))["hetlora.rank"]) for k in range(40)}
    assert drawn == {2, 3, 4}  # uniformly from min_rank … model.rank
    rows = _run(tiny_encoder, tmp_path, "vectorised", [{"name": "het", "algorithm": "hetlora",
                                                         "params": {"ranks": [1, 2, 3, 4]}}])
    assert rows["het"]["final"]["global_accuracy"] > 0.8, rows["het"]["final"]
    from hetfed.models.lora import LoRAEncoder

    shared = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4).adapter_floats() + 16 * 2 + 2
    assert rows["het"]["uplink_bytes"] == 6 * 4 * (4 * shared + 8 + 4)  # padded adapters, the head, count, loss, ‖BA‖
    with pytest.raises(ConfigError, match=r"params.ranks = \[1, 2\] is not allowed: expected one rank per client"):
        _run(tiny_encoder, tmp_path / "bad", "vectorised", [{"name": "het", "algorithm": "hetlora",
                                                             "params": {"ranks": [1, 2]}}])


def test_client_gates_are_each_clients_own_and_leave_the_shared_adapter_at_zero(tiny_encoder, tmp_path):
    """model.client_gates (CGAU's manner on the adapters): a row per adapter that each client keeps (never uploaded:
    FedIT sends exactly what it sends without them), trained on the client; at zero (a client never seen) the
    adapted encoder computes the plain shared adapters."""
    from hetfed.models.lora import LoRAEncoder

    gated = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4, client_gates=True)
    plain = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4)
    params = _random_adapters(plain, 2)
    x = _ids(tiny_encoder, ["the cat sat on the mat", "a big red dog ran"]).expand(2, 2, 12)
    zero = {**params, **{k: torch.zeros(2, 4) for k in gated.lora_names("gate")}}
    assert torch.allclose(gated.forward(zero, x), plain.forward(params, x), atol=1e-6)
    moved = {**zero, "lora0.gate": torch.tensor([[0.0] * 4, [3.0] * 4])}
    out = gated.forward(moved, x)
    assert torch.allclose(out[0], plain.forward(params, x)[0], atol=1e-6) and not torch.allclose(out[1], out[0])

    rows = _run(tiny_encoder, tmp_path, "vectorised", [{"name": "gated", "algorithm": "fedit",
                                                         "model": {"client_gates": True}}])
    shared = plain.adapter_floats() + 16 * 2 + 2
    assert rows["gated"]["uplink_bytes"] == 6 * 4 * (4 * shared + 8)  # the gates never travel
    assert rows["gated"]["final"]["global_accuracy"] > 0.8, rows["gated"]["final"]


@pytest.mark.slow
def test_fedmoe_ditto_and_fedrep_run_on_the_adapters(tiny_encoder, tmp_path):
    """The seeds' and the personalised methods through their own machinery on the adapted encoder: FedMoE mixes the
    frozen global adapters and a client's specialist adapters by a per-client gate (itself adapters over the same
    frozen base, with a one-output head) and reports its four views; FedRep shares the adapters and keeps the head
    (its upload: the adapters only); Ditto keeps a personal model of its own."""
    from hetfed.models.lora import LoRAEncoder

    methods = [{"name": m, "algorithm": m} for m in ("fedmoe", "fedrep", "ditto")]
    rows = _run(tiny_encoder, tmp_path, "vectorised", methods)
    assert {"local", "fedavg", "finetuned", "mixture"} <= set(rows)
    assert rows["mixture"]["local_accuracy"] > 0.8, rows["mixture"]
    adapters = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4).adapter_floats()
    assert rows["fedrep"]["uplink_bytes"] == 6 * 4 * (4 * adapters + 8)
    assert rows["fedrep"]["final"]["local_accuracy_mean"] > 0.8 and rows["ditto"]["final"]["local_accuracy_mean"] > 0.8


def test_a_merged_update_is_the_adapters_it_was_made_of(tiny_encoder):
    """An adapted layer given its merged update W (FLoRA) computes W₀x + W x: with W = (α/r)·B A and zero adapters, the
    encoder of the adapters B, A."""
    from hetfed.models.lora import LoRAEncoder

    model = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4, alpha=8.0)
    params = _random_adapters(model, 2)
    x = _ids(tiny_encoder, ["the cat sat on the mat", "a big red dog ran"]).expand(2, 2, 12)
    merged = {**params, **{f"lora{i}.W": model.scaling * params[f"lora{i}.B"] @ params[f"lora{i}.A"]
                           for i in range(len(model.adapted))}}
    merged.update({k: torch.zeros_like(params[k]) for k in model.lora_names("B")})
    assert torch.allclose(model.forward(merged, x), model.forward(params, x), atol=1e-5)
    assert [tuple(s) for s in model.adapted_shapes()] == [(16, 16)] * len(model.adapted)


def test_flora_stacks_the_clients_adapters_into_the_exact_weighted_sum_of_their_products(tiny_encoder):
    """FLoRA's server adds (α/r)·Σ_k p_k B_k A_k to each layer's merged update — whatever the clients' ranks —, and
    starts the next round from a fresh A and a zero B; the server's model is the base, the merged update and the
    head."""
    from hetfed.algorithms import build_algorithm
    from hetfed.config import TrainConfig
    from hetfed.models.lora import LoRAEncoder

    model = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4)
    algo = build_algorithm("flora", model, TrainConfig(batch_size=8, optimizer={"kind": "adam", "lr": 0.05}), seed=0)
    server, bc, states, data = _stack(algo, tiny_encoder, [1, 2, 4])
    server = algo.server_init(torch.Generator().manual_seed(0))
    bc = algo.broadcast(server, 0)
    upload, new = algo.local_update(bc, states, data)
    assert not any(k.endswith(".W") for k in upload.params)  # the merged update never travels up
    assert torch.count_nonzero(upload.params["lora0.A"][0, 1:]) == 0  # client 0 trained rank 1
    merged = algo.aggregate(server, upload)
    p = upload.num_samples / upload.num_samples.sum()
    for i in range(len(model.adapted)):
        a, b = upload.params[f"lora{i}.A"], upload.params[f"lora{i}.B"]
        expected = model.scaling * sum(p[k] * b[k] @ a[k] for k in range(3))
        assert torch.allclose(merged.extra["flora.merged"][f"lora{i}.W"], expected, atol=1e-6)
        assert torch.count_nonzero(merged.params[f"lora{i}.B"]) == 0
        assert not torch.equal(merged.params[f"lora{i}.A"], server.params[f"lora{i}.A"])
    assert torch.allclose(merged.params["head.bias"], torch.tensordot(p, upload.params["head.bias"], dims=1))
    gated = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4, client_gates=True)  # the clients' own rows train and stay
    algo = build_algorithm("flora", gated, TrainConfig(batch_size=8, optimizer={"kind": "adam", "lr": 0.05}), seed=0)
    _server, _bc, states, data = _stack(algo, tiny_encoder, [4, 4, 4])
    bc = algo.broadcast(algo.server_init(torch.Generator().manual_seed(0)), 0)
    bc.params["lora0.B"] += 0.1
    upload, new = algo.local_update(bc, states, data)
    assert torch.count_nonzero(new["lora0.gate"]) and "lora0.gate" not in upload.params


def test_flora_trains_from_a_config_sends_its_adapters_and_refuses_another_server_rule(tiny_encoder, tmp_path):
    from hetfed.errors import ConfigError
    from hetfed.models.lora import LoRAEncoder

    rows = _run(tiny_encoder, tmp_path, "vectorised", [{"name": "flora", "algorithm": "flora",
                                                         "params": {"ranks": [1, 2, 3, 4]}},
                                                        ])
    assert rows["flora"]["final"]["global_accuracy"] > 0.8, rows["flora"]["final"]
    shared = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4).adapter_floats() + 16 * 2 + 2
    assert rows["flora"]["uplink_bytes"] == 6 * 4 * (4 * shared + 8)
    with pytest.raises(ConfigError, match="algorithm = 'flora' is not allowed with the server chain"):
        _run(tiny_encoder, tmp_path / "median", "vectorised", [{"name": "flora", "algorithm": "flora",
                                                                "server": {"combine": {"rule": "median"}}}])


def test_the_layers_below_the_lowest_adapter_run_once_per_text_and_give_the_whole_forward(tiny_encoder, tmp_path):
    """model.from_layer: adapters only from that layer up; what the frozen layers below make of a text is computed
    once and kept, and the split forward gives the whole encoder's numbers (features and the adapters' gradients)."""
    from hetfed.errors import ConfigError
    from hetfed.models.lora import LoRAEncoder

    whole = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4)
    split = LoRAEncoder(str(tiny_encoder), 12, 2, rank=4, from_layer=1)
    assert all(".layer.1." in name for name in split.adapted) and len(split.adapted) == len(whole.adapted) // 2
    params = _random_adapters(split, 2)
    # the whole encoder with the same adapters on layer 1 and none (zero) on layer 0
    full = {**{k: torch.zeros(v.shape) for k, v in _random_adapters(whole, 2).items()}, "head.weight":
            params["head.weight"], "head.bias": params["head.bias"]}
    for i, name in enumerate(whole.adapted):
        if name in split.adapted:
            j = split.adapted.index(name)
            full[f"lora{i}.A"], full[f"lora{i}.B"] = params[f"lora{j}.A"], params[f"lora{j}.B"]
    x = _ids(tiny_encoder, ["the cat sat on the mat", "a big red dog ran", "the cat sat on the mat"]).expand(2, 3, 12)
    ours = split.features({k: v.requires_grad_() for k, v in params.items()}, x)
    assert torch.allclose(ours, whole.features(full, x), atol=1e-5)
    assert len(split.below.kept) == 2  # two distinct texts, each computed once
    split.features(params, x)
    assert len(split.below.kept) == 2
    grads = torch.autograd.grad(ours.sum(), [params["lora0.A"], params["lora0.B"]])
    assert all(torch.count_nonzero(g) for g in grads)

    rows = _run(tiny_encoder, tmp_path, "vectorised", [{"name": "top", "algorithm": "fedit",
                                                         "model": {"from_layer": 1}}])
    assert rows["top"]["final"]["global_accuracy"] > 0.8, rows["top"]["final"]
    with pytest.raises(ConfigError, match=r"model.from_layer = 2 is not allowed: expected 0 .* or 1 to 1"):
        _run(tiny_encoder, tmp_path / "bad", "vectorised", [{"name": "top", "algorithm": "fedit",
                                                             "model": {"from_layer": 2}}])


def test_compiling_the_adapted_encoders_steps_is_refused_before_any_file(tiny_encoder, tmp_path):
    """Its adapters reach the encoder's layers through a ContextVar, which dynamo does not trace: ``train.capture:
    compile`` failed at the first compiled step, the run marked failed with dynamo's message."""
    from hetfed.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^train.capture = 'compile' is not allowed with methods.0 \(model.kind "
                                          r"= 'lora_encoder'\): its adapters .* ContextVar.*expected train.capture "
                                          r"'auto' or 'off'$"):
        _run(tiny_encoder, tmp_path, "vectorised", [{"name": "fedit", "algorithm": "fedit"}], rounds=1,
             capture="compile")
    assert not (tmp_path / "vectorised").exists()


def test_a_saved_run_of_each_lora_method_predicts_as_it_was_scored(tiny_encoder, tmp_path):
    """Every client's saved model scores its test set as the run's last evaluation did, and the server's saved model
    the global test set as the run reported — FLoRA's with its merged updates, FFA-LoRA's with the frozen A every
    client holds (both were left out of the saved model: FLoRA's predictions were off, FFA-LoRA's refused)."""
    import hetfed
    from hetfed.config import build_config

    x, y = _texts()
    path = tmp_path / "texts.npz"
    np.savez(path, x=x.astype(str), y=y, split=np.where(np.arange(len(y)) < 200, "train", "test"))
    methods = ["fedit", "ffa_lora", "fedsa_lora", "flora", "hetlora"]
    cfg = build_config({
        "dataset": {"name": "arrays", "path": str(path)},
        "embed": {"kind": "wordpiece", "path": str(tiny_encoder), "max_length": 12},
        "partition": {"kind": "dirichlet", "alpha": 0.5, "clients": 4},
        "model": {"kind": "lora_encoder", "path": str(tiny_encoder), "rank": 4},
        "train": {"rounds": 2, "batch_size": 16, "eval_every": 1, "optimizer": {"kind": "adam", "lr": 0.02}},
        "methods": [{"name": m, "algorithm": m} for m in methods]})
    run = hetfed.run(cfg, out=tmp_path / "run", progress=False, report=False)
    fed, m = hetfed.build_federation(run.config), run.metrics()
    gx, gy = fed.global_test()
    for name in methods:
        model = run.model(name, which="final")
        rows = m[(m.method == name) & (m.split == "client") & (m.metric == "local_accuracy") & (m["round"] == 2)]
        want = dict(zip(rows["client"], rows["value"], strict=True))
        for k in range(4):
            cx, cy = fed.client_data(k, "test")
            assert (model.predict(cx, client=k) == cy).mean() == pytest.approx(want[str(k)], abs=1e-12), (name, k)
        if name != "fedsa_lora":  # its B stays with the clients: no whole model on the server
            final = run.summary["methods"][name]["final"]["global_accuracy"]
            assert (model.predict(gx) == gy).mean() == pytest.approx(final, abs=1e-12), name
