"""What a server's defence decided under an attack: each combine rule's weights (:class:`Weighed`) are the ones its
combination used, and the round loop counts the malicious and honest updates the screen or the rule left out."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.config import AttackConfig, ServerConfig
from hetfed.engine.types import Upload
from hetfed.executors.inprocess import VectorisedExecutor
from hetfed.executors.simulate import RoundObserver, simulate
from hetfed.runs.sweep_tables import defence_rates
from hetfed.server.chain import DECIDED
from hetfed.server.combine import Weighed, parse
from hetfed.server.combine.krum import byzantine_count
from hetfed.server.detection import detection
from hetfed.server.pipeline import server_chain
from tests.server.test_robust import _algo, _fed

#: rules whose combined model is the weighted mean of the uploaded models by their weights
AVERAGING = [("mean", {}), ("krum", {}), ("multi_krum", {}), ("multi_krum", {"weighted": True}),
             ("multi_krum", {"keep": 2}), ("dnc", {"byzantine_fraction": 0.3}), ("geometric_median", {}),
             ("geometric_median", {"weighted": False})]


def _upload(rng: np.random.Generator, n: int, d: int, outliers: int) -> tuple[dict, Upload]:
    old = {"w": torch.as_tensor(rng.normal(size=d)), "b": torch.as_tensor(rng.normal(size=1))}
    models = rng.normal(size=(n, d + 1)) + np.concatenate([old["w"].numpy(), old["b"].numpy()])
    models[:outliers] *= -20  # far off: what a defence should leave out
    return old, Upload(list(range(10, 10 + n)), {"w": torch.as_tensor(models[:, :d]),
                                                 "b": torch.as_tensor(models[:, d:])},
                       torch.as_tensor(rng.integers(5, 50, size=n), dtype=torch.float64))


def _combined(rule: str, old: dict, upload: Upload, **params) -> Weighed:
    found, options = parse({"rule": rule, **params})
    given = {"rng": torch.Generator().manual_seed(0)} if found.draws else {}
    out = found.combine(old, upload, options, {}, **given) if found.remembers else \
        found.combine(old, upload, options, **given)
    value = out[0] if found.remembers else out
    assert isinstance(value, Weighed), rule
    return value


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(5, 9), st.integers(1, 6), st.integers(0, 2))
def test_an_averaging_rules_model_is_the_mean_of_the_models_by_its_weights(seed, n, d, outliers):
    rng = np.random.default_rng(seed)
    old, upload = _upload(rng, n, d, outliers)
    rows = torch.cat([upload.params["w"], upload.params["b"]], dim=1)
    for rule, params in AVERAGING:
        value = _combined(rule, old, upload, **params)
        w = value.weights
        assert w.shape == (n,) and bool((w >= 0).all()) and math.isclose(float(w.sum()), 1.0, rel_tol=1e-12), rule
        torch.testing.assert_close(torch.cat([value["w"], value["b"]]), w @ rows, rtol=1e-10, atol=1e-10)


def test_krum_and_multi_krum_give_the_far_off_updates_nothing():
    old, upload = _upload(np.random.default_rng(3), 9, 4, 2)
    for rule in ("krum", "multi_krum", "dnc"):
        w = _combined(rule, old, upload, byzantine_fraction=0.25).weights
        assert float(w[:2].abs().sum()) == 0.0 and float(w[2:].sum()) > 0, (rule, w)
    assert int((_combined("multi_krum", old, upload, byzantine_fraction=0.25).weights > 0).sum()) == \
        9 - byzantine_count(9, 0.25) == 7
    old, upload = _upload(np.random.default_rng(3), 11, 4, 2)  # Bulyan's f = 2 needs n ≥ 4f + 3
    w = _combined("bulyan", old, upload, byzantine_fraction=0.2).weights
    assert float(w[:2].abs().sum()) == 0.0 and int((w > 0).sum()) == 11 - 2 * 2  # θ = n − 2f chosen


def test_fltrust_foolsgold_flame_and_signguard_weights_are_what_their_combination_used():
    rng = np.random.default_rng(5)
    old, upload = _upload(rng, 6, 3, 0)
    flat_old = torch.cat([old["w"], old["b"]])
    deltas = torch.cat([upload.params["w"], upload.params["b"]], dim=1) - flat_old
    server = deltas.mean(0)
    deltas[0] = -3 * server  # flipped: FLTrust trusts it 0
    up = Upload(upload.client_ids, {"w": deltas[:, :3] + old["w"], "b": deltas[:, 3:] + old["b"]},
                upload.num_samples)
    found, options = parse({"rule": "fltrust"})
    out = found.combine(old, up, options, root={"w": server[:3] + old["w"], "b": server[3:] + old["b"]})
    trust = (deltas @ server / (deltas.norm(dim=1) * server.norm())).clamp(min=0)
    torch.testing.assert_close(out.weights, trust / trust.sum())
    assert float(out.weights[0]) == 0.0
    # FoolsGold: θ + Σ w_i Δ_i with its weights (α_i / n)
    fg = _combined("foolsgold", old, up)
    torch.testing.assert_close(torch.cat([fg["w"], fg["b"]]) - flat_old, fg.weights @ deltas)
    # FLAME without noise: θ + Σ w_i · clip_i · Δ_i, clip_i = min(1, S / ‖Δ_i‖), S the median norm
    fl = _combined("flame", old, up, noise=0.0)
    norms = deltas.norm(dim=1)
    clip = (norms.median() if len(norms) % 2 else norms.sort().values[2:4].mean()) / norms
    torch.testing.assert_close(torch.cat([fl["w"], fl["b"]]) - flat_old, (fl.weights * clip.clamp(max=1)) @ deltas)
    # SignGuard: the same, S torch's median (the lower middle norm for an even count)
    sg = _combined("signguard", old, up, coordinates=1.0)
    clip = norms.sort().values[2] / norms
    torch.testing.assert_close(torch.cat([sg["w"], sg["b"]]) - flat_old, (sg.weights * clip.clamp(max=1)) @ deltas)
    assert float(sg.weights.sum()) == pytest.approx(1.0)


def _kept_shares(models: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Each update's share of the values a coordinate-wise rule kept — the places lo…hi of each coordinate's sorted
    values, a run of equal values sharing the places it fills among its rows —, one coordinate at a time."""
    n, d = models.shape
    counts = np.zeros(n)
    for j in range(d):
        column = models[:, j]
        ordered = np.sort(column)
        for value in np.unique(column):
            places = np.flatnonzero(ordered == value)
            rows = np.flatnonzero(column == value)
            counts[rows] += np.isin(places, np.arange(lo, hi)).sum() / len(rows)
    return counts / counts.sum()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12), d=st.integers(1, 6), levels=st.integers(2, 40),
       fraction=st.sampled_from([0.0, 0.1, 0.2, 0.45]))
def test_coordinate_wise_rules_weigh_each_update_by_its_share_of_the_values_they_kept(seed, n, d, levels, fraction):
    rng = np.random.default_rng(seed)
    models = rng.integers(0, levels, size=(n, d + 1)).astype(float)  # few levels: equal values in a coordinate
    models[:, 0] = 3.0  # a coordinate no client moved
    old = {"w": torch.zeros(d, dtype=torch.float64), "b": torch.zeros(1, dtype=torch.float64)}
    upload = Upload(list(range(n)), {"w": torch.as_tensor(models[:, 1:]), "b": torch.as_tensor(models[:, :1])},
                    torch.ones(n, dtype=torch.float64))
    cut = math.floor(fraction * n)
    for rule, params, (lo, hi) in (("median", {}, (n // 2, n // 2 + 1) if n % 2 else (n // 2 - 1, n // 2 + 1)),
                                   ("trimmed_mean", {"fraction": fraction}, (cut, n - cut))):
        found, options = parse({"rule": rule, **params})
        out = found.combine(old, upload, options)
        assert isinstance(out, Weighed)
        np.testing.assert_allclose(out.weights.numpy(), _kept_shares(models, lo, hi), rtol=1e-12, atol=1e-15)
        sorted_models = np.sort(models, axis=0)  # the combined values are the rule's, as before
        np.testing.assert_array_equal(torch.cat([out["b"], out["w"]]).numpy(), sorted_models[lo:hi].mean(0))


def test_detection_counts_the_screened_out_and_the_zero_weighted():
    malicious = np.array([True, True, False, False, False, False])
    # client 1 was screened out (not in the upload); client 3 got weight 0; the rule weighs 0 (bad), 2, 4, 5 (good)
    decided = {"round": 4, "clients": [0, 2, 3, 4, 5], "weights": torch.tensor([0.1, 0.3, 0.0, 0.2, 0.4])}
    found = detection(malicious, [0, 1, 2, 3, 4, 5], decided)
    assert found == {"attackers_sent": 2, "attackers_excluded": 1, "honest_sent": 4, "honest_excluded": 1,
                     "attack_weight": pytest.approx(0.1)}
    everyone_out = detection(malicious, [0, 2], {**decided, "weights": torch.zeros(5)})
    assert everyone_out == {"attackers_sent": 1, "attackers_excluded": 1, "honest_sent": 1, "honest_excluded": 1}
    counts = {"attackers_sent": 4, "attackers_excluded": 3, "honest_sent": 10, "honest_excluded": 1}
    assert defence_rates({"clients": counts}) == {"defence.attackers_excluded": 0.75, "defence.honest_excluded": 0.1}
    assert defence_rates({"clients": counts, "attack_weight": 0.2}) == {
        "defence.attackers_excluded": 0.75, "defence.honest_excluded": 0.1, "defence.attack_weight": 0.2}
    assert defence_rates({"clients": {"clients_sampled": 10}}) == {}  # no attack: nothing decided


class _Rows(RoundObserver):
    def __init__(self) -> None:
        self.rows: dict[int, dict[str, float]] = {}

    def trained(self, rnd: int, metrics: dict[str, float]) -> None:
        self.rows[rnd] = metrics


def _decisions(combine: dict, attack: AttackConfig, **train) -> tuple[dict[int, dict[str, float]], np.ndarray]:
    fed = _fed()
    algo, cfg = _algo(fed, combine=combine, rounds=4, **train)
    rows = _Rows()
    simulate(algo, fed, cfg, seed=2, executor=VectorisedExecutor(), observers=[rows], attack=attack)
    from hetfed.engine.faults import malicious_clients

    return rows.rows, malicious_clients(attack, fed.opted_out, 2)


def test_the_round_loop_writes_what_each_defence_decided():
    attack = AttackConfig(kind="sign_flip", fraction=0.3)
    mean, malicious = _decisions({"rule": "mean"}, attack)
    sizes = np.array([len(t) for t in _fed().train], dtype=float)
    for row in mean.values():  # nothing left out; the attackers' weight is their share of the samples
        assert row["attackers_sent"] == malicious.sum() and row["attackers_excluded"] == 0
        assert row["honest_sent"] == 10 - malicious.sum() and row["honest_excluded"] == 0
        assert row["attack_weight"] == pytest.approx(sizes[malicious].sum() / sizes.sum())
    krum, _ = _decisions({"rule": "krum"}, attack)
    for row in krum.values():  # one update kept, an honest one: every other excluded
        assert row["attackers_excluded"] == row["attackers_sent"] == 3 and row["honest_excluded"] == 6
        assert row["attack_weight"] == 0.0
    median, _ = _decisions({"rule": "median"}, attack)
    for row in median.values():  # no update cut in every coordinate; the flipped ones far less often in the middle
        assert row["attackers_excluded"] == 0 and row["honest_excluded"] == 0
        assert 0 < row["attack_weight"] < 0.5 * malicious.sum() / 10
    late, _ = _decisions({"rule": "mean"}, AttackConfig(kind="sign_flip", fraction=0.3, start_round=2))
    assert [r for r, row in late.items() if "attackers_sent" in row] == [2, 3, 4]  # only the rounds it attacked


def test_updates_the_norm_filter_screens_out_count_as_excluded():
    rows, malicious = _decisions({"rule": "mean"}, AttackConfig(kind="scale", fraction=0.2, factor=100.0),
                                 client_fraction=1.0)
    for row in rows.values():
        assert row["attackers_excluded"] == row["attackers_sent"] == malicious.sum() == 2
        assert row["honest_excluded"] == 0 and row["attack_weight"] == 0.0


def test_the_chain_keeps_the_rounds_decision():
    old, upload = _upload(np.random.default_rng(7), 8, 3, 1)
    alone = server_chain(ServerConfig(combine={"rule": "krum"}))
    params, state = alone.step(old, upload, {}, round=5)
    assert type(params) is dict and state[DECIDED]["round"] == 5  # the model a plain dict, what it decided kept
    assert state[DECIDED]["clients"] == upload.client_ids and float(state[DECIDED]["weights"].sum()) == 1.0


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(5, 13), st.integers(2, 4), st.integers(0, 2), st.integers(0, 30))
def test_under_bucketing_each_update_shares_its_buckets_weight_and_the_model_is_theirs(seed, n, s, outliers, rnd):
    """A bucket is its members' simple mean, so the rule's weight on it is shared by them equally: the combined
    model is the updates' mean by those weights, and an update is left out exactly when its bucket is."""
    from hetfed.server.buckets import buckets

    old, upload = _upload(np.random.default_rng(seed), n, 3, outliers)
    rows = torch.cat([upload.params["w"], upload.params["b"]], dim=1)
    groups = buckets(n, s, seed, rnd)
    for rule, params in [*AVERAGING[1:], ("median", {}), ("signguard", {"coordinates": 1.0})]:
        chain = server_chain(ServerConfig(combine={"rule": rule, "bucket": s, **params}))
        new, state = chain.step(old, upload, {}, round=rnd, seed=seed)
        decided = state[DECIDED]
        w = decided["weights"]
        assert decided["clients"] == upload.client_ids and w.shape == (n,), rule
        assert math.isclose(float(w.sum()), 1.0, rel_tol=1e-12), rule
        for members in groups:  # equal within a bucket
            assert torch.equal(w[members], w[members[:1]].expand(len(members))), rule
        if rule not in ("median", "signguard"):  # signguard clips; the median's weights are shares of values
            torch.testing.assert_close(torch.cat([new["w"], new["b"]]), w @ rows, rtol=1e-10, atol=1e-10)


def test_the_summary_holds_the_malicious_updates_mean_share_of_the_weight():
    from hetfed.runs.summary import _failures

    fed = _fed()
    algo, cfg = _algo(fed, combine={"rule": "geometric_median"}, rounds=4)
    rows = _Rows()
    result = simulate(algo, fed, cfg, seed=2, executor=VectorisedExecutor(), observers=[rows],
                      attack=AttackConfig(kind="ipm", fraction=0.3, start_round=3))
    shares = [row["attack_weight"] for row in rows.rows.values() if "attack_weight" in row]
    assert len(shares) == 2 and result.attack_weight_rounds == 2  # rounds 3 and 4
    assert _failures(result)["attack_weight"] == pytest.approx(np.mean(shares)) and 0 < np.mean(shares) < 1


def test_a_run_under_attack_ends_with_what_each_defence_decided(tmp_path, capsys):
    from hetfed.cli import main

    code = main(["run", "--set", "attack.kind=sign_flip", "--set", "attack.fraction=0.3", "--set", "train.rounds=2",
                 "--set", "methods=[{name: krum, algorithm: fedavg, server: {combine: {rule: krum}}}, "
                 "{name: median, algorithm: fedavg, server: {combine: {rule: median}}}]", "--out", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 0
    assert "defence (krum): left out 6 of 6 malicious updates and 12 of 14 honest ones; the malicious ones got 0.0% " \
           "of its weight" in " ".join(out.split())
    assert "defence (median): left out 0 of 6 malicious updates and 0 of 14 honest ones" in " ".join(out.split())
