"""Backdoors (a BadNets trigger on a share of a malicious client's samples; boosted: model replacement) and the
defences made against such attacks, FLAME and FoolsGold: the trigger and the poisoned samples against their
definitions, ``backdoor_accuracy`` against the server's model's predictions computed here, the executors agreeing,
the refusals; FLAME against its paper's Algorithm 1 written out, its filter keeping a majority of alike updates and
dropping the rest; FoolsGold against its authors' code written out, over rounds and through a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.cluster import HDBSCAN

from hetfed.cli import main
from hetfed.config import AttackConfig, ServerConfig
from hetfed.engine.attacks.backdoor import stamp
from hetfed.engine.faults import Adversary
from hetfed.engine.rng import COMBINE_NOISE, torch_gen
from hetfed.engine.types import Broadcast, Upload
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.server.combine import parse
from hetfed.server.combine.flame import admitted
from hetfed.server.pipeline import server_chain
from tests.server.test_robust import _algo, _fed


def _with(fed, made):
    """simulate's first three arguments: the algorithm, the federation, the train section."""
    return made[0], fed, made[1]


def _stamped(x: np.ndarray, shape: tuple[int, ...], size: int, value: float) -> np.ndarray:
    """The trigger written from its definition, pixel by pixel: an image's pixels (i, j) with i ≥ H − size and
    j ≥ W − size (every channel), or a vector's last ``size`` features."""
    out = x.copy()
    for r in range(len(out)):
        if len(shape) == 1:
            for f in range(shape[0] - size, shape[0]):
                out[r, f] = value
            continue
        h, w = shape[:2]
        channels = shape[2] if len(shape) == 3 else 1
        for i in range(h - size, h):
            for j in range(w - size, w):
                for c in range(channels):
                    out[r, (i * w + j) * channels + c] = value
    return out


@pytest.mark.parametrize("shape, size", [((8, 8), 3), ((5, 7), 2), ((4, 4, 3), 2), ((6,), 2), ((28, 28), 28)])
def test_the_trigger_is_the_bottom_right_square_of_every_channel_or_a_vectors_last_features(shape, size):
    x = np.random.default_rng(0).random((5, int(np.prod(shape)))).astype(np.float32)
    out = stamp(torch.as_tensor(x), shape, size, 1.5)
    np.testing.assert_array_equal(out.numpy(), _stamped(x, shape, size, 1.5))
    np.testing.assert_array_equal(x, np.random.default_rng(0).random(x.shape).astype(np.float32))  # not in place


@settings(max_examples=50, deadline=None)
@given(shape=st.sampled_from([(8, 8), (5, 7), (4, 4, 3), (6,), (28, 28)]), size=st.integers(1, 4),
       parts=st.integers(1, 9))
def test_a_distributed_triggers_parts_cut_the_whole_trigger_in_consecutive_pixels(shape, size, parts):
    from hetfed.engine.attacks.backdoor import trigger_features

    pixels = size * size if len(shape) >= 2 else size
    parts = min(parts, pixels)
    whole = trigger_features(shape, size)
    cut = [trigger_features(shape, size, parts, p) for p in range(parts)]
    assert np.array_equal(np.concatenate(cut), whole)  # disjoint, in order, and all of it
    assert all(len(c) for c in cut)
    x = np.zeros((1, int(np.prod(shape))), dtype=np.float32)
    np.testing.assert_array_equal(np.flatnonzero(_stamped(x, shape, size, 1.0)[0]), np.sort(whole))


def test_a_distributed_backdoors_clients_each_stamp_their_own_part_and_the_test_set_the_whole_trigger():
    from hetfed.engine.attacks.backdoor import trigger_features

    fed = _fed(clients=10)
    x, y = torch.zeros_like(torch.as_tensor(fed.x)), torch.as_tensor(fed.y)  # zeros: a stamp shows where it went
    cfg = AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.3, "size": 3, "parts": 3, "value": 1.0,
                                       "poison_fraction": 1.0})
    adv = Adversary(cfg, fed, seed=1, n_classes=fed.n_classes)
    px, _ = adv.training_data(x, y, fed.train)
    d = x.shape[1]
    for rank, k in enumerate(np.flatnonzero(adv.malicious)):
        stamped = set(torch.nonzero(px[fed.train[k]].sum(0)).flatten().tolist())
        assert stamped == set(trigger_features((d,), 3, 3, rank).tolist()) == {d - 3 + rank}
    test = adv.backdoor_test(torch.zeros(4, d), torch.tensor([1, 2, 3, 0]), fed.opted_out)
    assert test is not None and set(torch.nonzero(test.x.sum(0)).flatten().tolist()) == {d - 3, d - 2, d - 1}


def test_a_backdoor_poisons_its_share_of_the_malicious_clients_training_samples_only():
    fed = _fed(clients=10)
    cfg = AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.3, "target": 2, "poison_fraction": 0.4})
    adv = Adversary(cfg, fed, seed=5, n_classes=fed.n_classes)
    x, y = torch.as_tensor(fed.x), torch.as_tensor(fed.y)
    px, py = adv.training_data(x, y, fed.train)
    value = float(fed.x.max())
    changed = set(torch.nonzero((px != x).any(1) | (py != y)).flatten().tolist())
    bad = np.flatnonzero(adv.malicious)
    assert len(bad) == 3
    assert changed <= set(np.concatenate([fed.train[k] for k in bad]).tolist())
    for k in bad:
        rows = fed.train[k]
        stamped = [i for i in rows if bool((px[i, -3:] == value).all()) and int(py[i]) == 2]
        assert len(stamped) == round(0.4 * len(rows))  # round(poison_fraction · m) of its samples
        clean = sorted(set(rows) - set(stamped))
        assert torch.equal(px[clean], x[clean]) and torch.equal(py[clean], y[clean])
        np.testing.assert_array_equal(px[stamped].numpy(), _stamped(x[stamped].numpy(), (fed.x.shape[1],), 3, value))
    again = Adversary(cfg, fed, seed=5, n_classes=fed.n_classes).training_data(x, y, fed.train)
    assert torch.equal(again[0], px) and torch.equal(again[1], py)  # drawn from the run seed
    other = Adversary(cfg, fed, seed=6, n_classes=fed.n_classes).training_data(x, y, fed.train)
    assert not torch.equal(other[1], py)


@pytest.mark.parametrize("executor", [VectorisedExecutor, SequentialExecutor])
def test_every_client_trains_on_the_pool_as_the_attack_made_it(executor):
    fed = _fed()
    algo, cfg = _algo(fed, rounds=2)
    attack = AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.3, "target": 1})
    seen = []
    original = algo.local_update

    def spy(bc, states, data):
        seen.append((list(data.client_ids), data.x.clone(), data.y.clone(), data.indices))
        return original(bc, states, data)

    object.__setattr__(algo, "local_update", spy)
    simulate(algo, fed, cfg, seed=2, executor=executor(), attack=attack)
    adv = Adversary(attack, fed, seed=2, n_classes=fed.n_classes)
    px, py = adv.training_data(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train)
    trained = set()
    for ids, x, y, indices in seen:
        for k, rows in zip(ids, indices, strict=True):
            rows = torch.as_tensor(rows)
            assert torch.equal(x[rows], px[rows]) and torch.equal(y[rows], py[rows])
            trained.add(k)
    assert set(np.flatnonzero(adv.malicious)) <= trained


def test_a_backdoors_test_set_is_the_other_classes_stamped_and_labelled_the_target():
    fed = _fed()
    adv = Adversary(AttackConfig.model_validate({"kind": "backdoor", "target": 1, "value": 9.0}), fed, seed=0,
                    n_classes=fed.n_classes)
    x, y = torch.as_tensor(fed.x_global_test), torch.as_tensor(fed.y_global_test)
    made = adv.backdoor_test(x, y, fed.opted_out)
    assert made is not None
    keep = fed.y_global_test != 1
    np.testing.assert_array_equal(made.x.numpy(), _stamped(fed.x_global_test[keep], (x.shape[1],), 3, 9.0))
    assert made.y.tolist() == [1] * int(keep.sum())
    assert made.honest == [k for k in range(fed.n_clients) if not adv.malicious[k]]
    none = Adversary(AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.0}), fed, 0, fed.n_classes)
    assert none.backdoor_test(x, y, fed.opted_out) is None  # no malicious client: no backdoor to measure


def test_a_boosted_backdoor_sends_gamma_times_its_update():
    fed = _fed()
    adv = Adversary(AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.3, "boost": 20}), fed, 0,
                    fed.n_classes)
    ref = {"w": torch.tensor([1.0, -1.0])}
    up = Upload(list(range(10)), {"w": torch.tensor([[1.5, 0.0]] * 10)}, torch.ones(10), {})
    out = adv.poison(up, Broadcast(ref, 0, 0.1))
    for k in range(10):
        expected = [1 + 20 * 0.5, -1 + 20 * 1.0] if adv.malicious[k] else [1.5, 0.0]
        torch.testing.assert_close(out.params["w"][k], torch.tensor(expected))


def _server_predictions_say_target(algo, server, x: np.ndarray, y: np.ndarray, target: int) -> float:
    keep = y != target
    xb = torch.as_tensor(_stamped(x[keep], (x.shape[1],), 3, 1.0e3))
    logits = algo.model.forward({k: v.unsqueeze(0) for k, v in server.params.items()}, xb.unsqueeze(0), None)[0]
    return float((logits.argmax(-1) == target).double().mean())


def test_backdoor_accuracy_is_the_share_of_stamped_test_samples_the_servers_model_labels_the_target():
    fed = _fed()
    algo, cfg = _algo(fed, rounds=6, eval_every=3)
    attack = AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.3, "target": 3, "value": 1.0e3})
    res = simulate(algo, fed, cfg, seed=2, executor=VectorisedExecutor(), attack=attack)
    assert [r for r, _ in res.history] == [3, 6]
    final = res.history[-1][1].metrics
    assert final["backdoor_accuracy"] == pytest.approx(
        _server_predictions_say_target(algo, res.server, fed.x_global_test, fed.y_global_test, 3), abs=1e-12)
    assert final["backdoor_accuracy"] > 0.5  # a loud trigger on 3 of 10 clients is learnt
    clean = simulate(*_with(fed, _algo(fed, rounds=6, eval_every=3)), seed=2, executor=VectorisedExecutor())
    assert "backdoor_accuracy" not in clean.history[-1][1].metrics


@pytest.mark.parametrize("rule", [{"rule": "flame"}, {"rule": "flame", "cosine_of": "updates", "noise": 0.01},
                                  {"rule": "median"}, {"rule": "foolsgold"}, {"rule": "rlr", "threshold": 3}])
def test_executors_agree_under_a_backdoor(rule):
    fed = _fed()
    attack = AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.3, "boost": 3})
    finals = []
    for executor in (VectorisedExecutor(), SequentialExecutor()):
        algo, cfg = _algo(fed, combine=rule, client_dropout=0.2)
        res = simulate(algo, fed, cfg, seed=1, executor=executor, attack=attack)
        finals.append((res.server.params, res.history[-1][1].metrics["backdoor_accuracy"]))
    (a, acc_a), (b, acc_b) = finals
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    assert acc_a == acc_b


@pytest.mark.parametrize("setting, says", [
    ("attack.target=10", "attack.target = 10 is not a class of the data; expected 0 … 9"),
    ("attack.size=9", "attack.size = 9 does not fit inputs of shape (8, 8); expected ≤ 8"),
    ("attack.parts=10", "attack.parts = 10 cuts a trigger of 9 pixels into empty parts; expected ≤ 9"),
])
def test_a_backdoor_the_data_cannot_take_is_refused_in_one_line(tmp_path, capsys, setting, says):
    out = tmp_path / "r"
    code = main(["run", "--quiet", "--set", "attack.kind=backdoor", "--set", setting, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "attack.kind = 'backdoor'" in err and says in err
    assert not out.exists()


def test_a_backdoor_on_token_ids_is_refused():
    from hetfed.engine.attacks.backdoor import BackdoorParams, check

    assert "token ids" in (check(BackdoorParams(), (40,), 4, False) or "")
    assert check(BackdoorParams(), (40,), 4, True) is None


# ------------------------------------------------------------------ FLAME


def _flame_written_out(ref: np.ndarray, models: np.ndarray, lam: float, on_models: bool, gen: torch.Generator
                       ) -> np.ndarray:
    """Nguyen et al.'s Algorithm 1: cosine distances c_ij = 1 − W_i·W_j / (‖W_i‖‖W_j‖); HDBSCAN (min_cluster_size
    n/2 + 1, min_samples 1, one cluster allowed) admits its cluster; e_i = ‖G − W_i‖, S = median(e); each admitted
    W clipped to G + (W − G)·min(1, S/e); their mean; plus N(0, (λS)²)."""
    n = len(models)
    points = models if on_models else models - ref
    unit = points / np.linalg.norm(points, axis=1, keepdims=True)
    c = np.clip(1 - unit @ unit.T, 0, None)
    np.fill_diagonal(c, 0)
    labels = HDBSCAN(min_cluster_size=n // 2 + 1, min_samples=1, metric="precomputed",
                     allow_single_cluster=True, copy=True).fit_predict(c)
    chosen = np.flatnonzero(labels == np.bincount(labels[labels >= 0]).argmax()) if (labels >= 0).any() \
        else np.arange(n)
    e = np.linalg.norm(models - ref, axis=1)
    s = np.median(e)
    clipped = [ref + (models[i] - ref) * min(1.0, s / e[i]) for i in chosen]
    g = np.mean(clipped, axis=0)
    return g + lam * s * torch.randn(g.shape, generator=gen, dtype=torch.float64).numpy()


def _flame(ref: np.ndarray, models: np.ndarray, gen: torch.Generator, **params) -> np.ndarray:
    rule, options = parse({"rule": "flame", **params})
    parts = {"a": torch.as_tensor(models[:, :3]), "b": torch.as_tensor(models[:, 3:])}
    upload = Upload(list(range(len(models))), parts, torch.ones(len(models)), {})
    out = rule.combine({"a": torch.as_tensor(ref[:3]), "b": torch.as_tensor(ref[3:])}, upload, options, rng=gen)
    return torch.cat([out["a"], out["b"]]).numpy()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 14), lam=st.sampled_from([0.0, 0.001, 0.5]),
       on_models=st.booleans())
def test_flame_is_its_papers_algorithm(seed, n, lam, on_models):
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=7)
    models = ref + rng.normal(size=(n, 7)) * rng.uniform(0.1, 3, size=(n, 1))
    expected = _flame_written_out(ref, models, lam, on_models, torch_gen(seed, COMBINE_NOISE, 4))
    got = _flame(ref, models, torch_gen(seed, COMBINE_NOISE, 4), noise=lam,
                 cosine_of="models" if on_models else "updates")
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), honest=st.integers(6, 15), share=st.floats(0.05, 0.45))
def test_flames_filter_admits_a_majority_of_alike_updates_and_no_opposite_one(seed, honest, share):
    rng = np.random.default_rng(seed)
    bad = max(1, int(share * honest))
    direction = rng.normal(size=20)
    good = direction + 0.1 * rng.normal(size=(honest, 20))
    evil = -direction + 0.1 * rng.normal(size=(bad, 20))
    chosen = admitted(np.concatenate([good, evil]))
    # a majority, all of them honest (HDBSCAN may leave honest updates out too: FLAME's false positives)
    assert set(chosen.tolist()) <= set(range(honest)) and len(chosen) >= (honest + bad) // 2 + 1


@pytest.mark.parametrize("seed, rnd", [(3, 0), (3, 7), (11, 7)])
def test_the_chain_gives_flame_its_noise_from_the_run_seed_and_the_round(seed, rnd):
    rng = np.random.default_rng(0)
    ref = rng.normal(size=7)
    models = ref + rng.normal(size=(9, 7))
    upload = Upload(list(range(9)), {"a": torch.as_tensor(models[:, :3]), "b": torch.as_tensor(models[:, 3:])},
                    torch.ones(9), {})
    chain = server_chain(ServerConfig(combine={"rule": "flame", "noise": 0.1}))
    new, _ = chain.step({"a": torch.as_tensor(ref[:3]), "b": torch.as_tensor(ref[3:])}, upload, {}, round=rnd,
                        seed=seed)
    expected = _flame(ref, models, torch_gen(seed, COMBINE_NOISE, rnd), noise=0.1)
    np.testing.assert_allclose(torch.cat([new["a"], new["b"]]).numpy(), expected, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ FoolsGold


def _authors_foolsgold(grads: np.ndarray, kappa: float = 1.0) -> np.ndarray:
    """``foolsgold(grads)`` of DistributedML/FoolsGold's deep-fg/fg/foolsgold.py, step by step (κ = 1), but for the
    diagonal: set to exactly 0 where the authors subtract an identity (which leaves ±1e-16 and, when it is negative,
    a division by a zero maximum: hetfed.server.combine.foolsgold says why)."""
    from sklearn.metrics.pairwise import cosine_similarity

    n = grads.shape[0]
    cs = cosine_similarity(grads)
    np.fill_diagonal(cs, 0.0)
    maxcs = np.max(cs, axis=1)
    for i in range(n):
        for j in range(n):
            if i != j and maxcs[i] < maxcs[j]:
                cs[i][j] = cs[i][j] * maxcs[i] / maxcs[j]
    wv = 1 - np.max(cs, axis=1)
    wv[wv > 1] = 1
    wv[wv < 0] = 0
    wv = wv / np.max(wv)
    wv[wv == 1] = 0.99
    with np.errstate(divide="ignore"):
        wv = kappa * (np.log(wv / (1 - wv)) + 0.5)  # the paper's κ (the authors' code: 1)
    wv[(np.isinf(wv) + wv) > 1] = 1
    wv[wv < 0] = 0
    return wv


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 12), d=st.integers(2, 20), sybils=st.integers(0, 4),
       kappa=st.sampled_from([1.0, 0.1, 2.0]))
def test_foolsgolds_weights_are_its_authors_code(seed, n, d, sybils, kappa):
    from hetfed.server.combine.foolsgold import weights

    rng = np.random.default_rng(seed)
    grads = rng.normal(size=(n, d))
    sybils = min(sybils, n)
    if sybils:  # some rows nearly alike, as sybils' histories are (and the 0 weights the logit gives them)
        grads[:sybils] = rng.normal(size=d) + 1e-3 * rng.normal(size=(sybils, d))
    np.testing.assert_allclose(weights(grads, kappa), _authors_foolsgold(grads, kappa), rtol=1e-12, atol=1e-12)


def test_foolsgold_leaves_a_clients_own_similarity_out_exactly_where_its_authors_code_divides_by_zero():
    from sklearn.metrics.pairwise import cosine_similarity

    from hetfed.server.combine.foolsgold import weights

    grads = np.random.default_rng(1).normal(size=(2, 2))  # two clients pointing apart
    diagonal = np.diag(cosine_similarity(grads) - np.eye(2))
    assert diagonal.min() < 0  # what the authors' identity leaves: the second client's maximum is −1e-16
    assert weights(grads).tolist() == [1.0, 1.0]  # neither is like the other: both keep their weight


def test_foolsgold_gives_sybils_no_weight_and_honest_clients_some():
    from hetfed.server.combine.foolsgold import weights

    rng = np.random.default_rng(0)
    honest = rng.normal(size=(8, 30))
    sybils = rng.normal(size=30) + 0.01 * rng.normal(size=(4, 30))
    w = weights(np.concatenate([honest, sybils]))
    assert (w[8:] == 0).all() and (w[:8] > 0).all()


def _foolsgold_round(old, upload, state, **params):
    rule, options = parse({"rule": "foolsgold", **params})
    return rule.combine(old, upload, options, state)


@pytest.mark.parametrize("layers", ["last", "all"])
def test_foolsgold_keeps_each_clients_summed_history_and_moves_by_the_weighted_updates_over_n(layers):
    import pickle

    from hetfed.server.combine.foolsgold import weights

    rng = np.random.default_rng(3)
    old = {"w1": torch.as_tensor(rng.normal(size=(4, 3))), "b1": torch.as_tensor(rng.normal(size=3)),
           "w2": torch.as_tensor(rng.normal(size=(3, 2))), "b2": torch.as_tensor(rng.normal(size=2))}
    rounds = [[0, 1, 2, 3, 4], [1, 2, 5], [0, 5, 3]]
    history: dict[int, np.ndarray] = {}
    state: dict = {}
    for ids in rounds:
        thetas = {k: v + torch.as_tensor(rng.normal(size=(len(ids), *v.shape))) for k, v in old.items()}
        upload = Upload(ids, thetas, torch.ones(len(ids)), {})
        new, state = _foolsgold_round(old, upload, pickle.loads(pickle.dumps(state)), layers=layers)  # checkpointed
        names = ["w2"] if layers == "last" else list(old)
        for j, k in enumerate(ids):
            row = np.concatenate([(thetas[m][j] - old[m]).numpy().reshape(-1) for m in names])
            history[k] = history.get(k, 0) + row
        seen = sorted(history)
        w = weights(np.stack([history[k] for k in seen]))[[seen.index(k) for k in ids]]
        for m in old:
            expected = old[m] + sum(w[j] * (thetas[m][j] - old[m]) for j in range(len(ids))) / len(ids)
            torch.testing.assert_close(new[m], expected, rtol=1e-12, atol=1e-12)
        old = new
    assert sorted(state["history"]) == [0, 1, 2, 3, 4, 5]


def test_foolsgold_after_bucketing_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "r"
    code = main(["run", "--quiet", "--set", "server.combine.rule=foolsgold", "--set", "server.combine.bucket=2",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "server.combine.bucket = 2 is not allowed with server.combine.rule = 'foolsgold'" in err
    assert not out.exists()


# ------------------------------------------------------------------ personalised models under a backdoor


def test_local_backdoor_accuracy_is_the_honest_clients_own_models_mean_share_labelled_the_target():
    fed = _fed(clients=10)
    algo, cfg = _algo(fed, algorithm="fedrep", rounds=4, eval_every=2)
    attack = AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.3, "target": 2, "value": 50.0})
    executor = VectorisedExecutor()
    res = simulate(algo, fed, cfg, seed=3, executor=executor, attack=attack)
    metrics = res.history[-1][1].metrics
    adv = Adversary(attack, fed, seed=3, n_classes=fed.n_classes)
    keep = fed.y_global_test != 2
    xb = torch.as_tensor(_stamped(fed.x_global_test[keep], (fed.x.shape[1],), 3, 50.0))
    bc = algo.broadcast(res.server, res.server.round)
    shares = {}
    for chunk, pred in executor.predictors(bc, list(range(10))):
        for j, k in enumerate(chunk):
            logits = pred.model.forward({n: v[j:j + 1] for n, v in pred.params.items()}, xb.unsqueeze(0), None)[0]
            shares[k] = float((logits.argmax(-1) == 2).double().mean())
    honest = [k for k in range(10) if not adv.malicious[k]]
    assert metrics["local_backdoor_accuracy_mean"] == pytest.approx(np.mean([shares[k] for k in honest]), abs=1e-12)
    assert np.mean([shares[k] for k in honest]) != pytest.approx(np.mean(list(shares.values())), abs=1e-6)
    assert "backdoor_accuracy" not in metrics  # FedRep's server holds a body alone: no model of its own to score
    fedavg = simulate(*_with(fed, _algo(fed, rounds=4, eval_every=2)), seed=3, executor=VectorisedExecutor(),
                      attack=attack)
    assert "local_backdoor_accuracy_mean" not in fedavg.history[-1][1].metrics  # its clients predict with the server's


def _shares(model, params: dict, x: torch.Tensor, target: int) -> np.ndarray:
    """Each stacked model's share of ``x`` it labels ``target``."""
    logits = model.forward(params, x.expand(len(next(iter(params.values()))), *x.shape), None)
    return (logits.argmax(-1) == target).double().mean(1).numpy()


def test_ifcas_local_backdoor_accuracy_is_each_honest_clients_cluster_chosen_by_its_validation_loss():
    fed = _fed()
    algo, cfg = _algo(fed, algorithm="ifca", rounds=6, eval_every=3, eval_global_clients=2)  # every client scores it
    attack = AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.3, "target": 1, "value": 50.0,
                                          "poison_fraction": 1.0})
    res = simulate(algo, fed, cfg, seed=2, executor=VectorisedExecutor(), attack=attack)
    adv = Adversary(attack, fed, seed=2, n_classes=fed.n_classes)
    xb = torch.as_tensor(_stamped(fed.x_global_test[fed.y_global_test != 1], (fed.x.shape[1],), 3, 50.0))
    x, y = torch.as_tensor(fed.x), torch.as_tensor(fed.y)
    clusters = sorted({k.split(".")[1] for k in res.server.params})
    models = [{n.split(".", 2)[2]: v.unsqueeze(0) for n, v in res.server.params.items() if n.split(".")[1] == c}
              for c in clusters]
    expected = []
    for k in np.flatnonzero(~adv.malicious):  # the cluster whose model has the lowest loss on the client's val set
        xv, yv = x[fed.val[k]], y[fed.val[k]]
        losses = [float(torch.nn.functional.cross_entropy(algo.model.forward(m, xv.unsqueeze(0), None)[0], yv))
                  for m in models]
        expected.append(_shares(algo.model, models[int(np.argmin(losses))], xb, 1)[0])
    assert len(set(np.round(expected, 6))) > 1  # the clusters' models differ on the stamped set: the choice counts
    assert res.history[-1][1].metrics["local_backdoor_accuracy_mean"] == pytest.approx(np.mean(expected), abs=1e-12)


def _fedmoe_under_backdoor(fed, attack, seed):
    from hetfed.algorithms import build_algorithm, resolve_run
    from hetfed.config import ModelConfig, TrainConfig
    from hetfed.executors.simulate import personalise
    from hetfed.models import build_model

    def build(n_out):
        return build_model(ModelConfig(kind="mlp", hidden=[8]), fed.input_shape, n_out)

    cfg = TrainConfig(rounds=3, local_steps=3, batch_size=16, eval_every=3,
                      optimizer={"kind": "sgd", "lr": 0.05, "momentum": 0.0})
    algo = build_algorithm("fedmoe", build(fed.n_classes), cfg, {"max_epochs": 2, "patience": 1}, build=build,
                           seed=seed)
    run = resolve_run(algo, fed, cfg, seed)
    executor = VectorisedExecutor()
    res = simulate(run, fed, executor=executor, attack=attack)
    return algo, executor, personalise(run, fed, res, torch.device("cpu"))


def test_a_personalised_methods_views_are_scored_for_the_backdoor_each_by_its_own_predictor():
    fed = _fed()
    attack = AttackConfig.model_validate({"kind": "backdoor", "fraction": 0.3, "target": 0, "value": 50.0,
                                          "poison_fraction": 0.5})
    algo, executor, res = _fedmoe_under_backdoor(fed, attack, seed=3)
    adv = Adversary(attack, fed, seed=3, n_classes=fed.n_classes)
    xb = torch.as_tensor(_stamped(fed.x_global_test[fed.y_global_test != 0], (fed.x.shape[1],), 3, 50.0))
    chosen = res.best_server or res.server
    bc = algo.broadcast(chosen, chosen.round)
    honest = [k for k in range(fed.n_clients) if not adv.malicious[k]]
    means = {}
    for view in ("local", "finetuned", "mixture"):
        shares = [_shares(pred.model, {n: v[j:j + 1] for n, v in pred.params.items()}, xb, 0)[0]
                  for chunk, pred in executor.predictors(bc, honest, view) for j in range(len(chunk))]
        metrics = res.views[view].metrics
        means[view] = np.mean(shares)
        assert metrics["local_backdoor_accuracy_mean"] == pytest.approx(means[view], abs=1e-12), view
        assert "backdoor_accuracy" not in metrics
    assert means["local"] != means["mixture"]  # the views' models differ on the stamped set
    federated = res.views["fedavg"].metrics  # the FedAvg model: the server's, scored by the server
    server = _shares(algo.model, {n: v.unsqueeze(0) for n, v in chosen.params.items()}, xb, 0)[0]
    assert federated["backdoor_accuracy"] == pytest.approx(server, abs=1e-12)
    assert server != means["local"]
    assert "local_backdoor_accuracy_mean" not in federated


# ------------------------------------------------------------------ the rounds an attack is in


@pytest.mark.parametrize("kind", ["backdoor", "scale", "ipm"])
def test_malicious_clients_act_as_honest_ones_outside_their_rounds(kind):
    fed = _fed()
    attack = AttackConfig.model_validate({"kind": kind, "fraction": 0.3, "start_round": 3, "stop_round": 3})
    runs = {}
    for name, rounds, attacked in (("clean", 2, None), ("before", 2, attack), ("in", 3, attack), ("clean3", 3, None),
                                ("after", 4, attack), ("open", 4, attack.model_copy(update={"stop_round": None}))):
        algo, cfg = _algo(fed, rounds=rounds, eval_every=rounds)
        runs[name] = simulate(algo, fed, cfg, seed=4, executor=VectorisedExecutor(), attack=attacked).server.params
    for k in runs["clean"]:
        assert torch.equal(runs["before"][k], runs["clean"][k])  # rounds 1-2: no attack yet
    assert any(not torch.equal(runs["in"][k], runs["clean3"][k]) for k in runs["in"])  # round 3: attacked
    assert any(not torch.equal(runs["after"][k], runs["open"][k]) for k in runs["in"])  # round 4: over (or not)


@pytest.mark.parametrize("settings_, says", [
    (["attack.start_round=5", "attack.stop_round=2"], "attack.stop_round = 2 is before attack.start_round = 5"),
    (["attack.start_round=101"], "attack.start_round = 101 is not allowed: methods.0 trains 100 rounds"),
])
def test_an_attack_window_that_attacks_no_round_is_refused_in_one_line(tmp_path, capsys, settings_, says):
    out = tmp_path / "r"
    extra = [arg for s in settings_ for arg in ("--set", s)]
    code = main(["run", "--quiet", "--set", "attack.kind=backdoor", *extra, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert says in err
    assert not out.exists()
