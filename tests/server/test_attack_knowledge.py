"""What a colluding attack knows (``attack.knowledge``): under ``partial`` its malicious clients craft from their own
updates as they trained them — the papers' formulas on those rows, never reading an honest update (the honest clients'
updates go on unchanged, and changing them changes nothing crafted) —, Fang et al.'s partial-knowledge Trim attack
against the released code's ``partial_trim`` with the paper's draws, the executors agreeing, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.cli import main
from hetfed.config import AttackConfig
from hetfed.engine.attacks.alie import z_max
from hetfed.engine.attacks.fang_krum import lambda_bound
from hetfed.engine.faults import Adversary
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from tests.server.test_colluding_attacks_and_defences import _paper_agnostic, _round
from tests.server.test_fang_trim import _draws
from tests.server.test_robust import _algo, _fed

KINDS = ["alie", "ipm", "min_max", "min_sum", "fang_trim", "fang_krum"]


def _adversary(kind: str, seed: int = 0, clients: int = 10, fraction: float = 0.3, **params) -> Adversary:
    fed = _fed(clients=clients)
    cfg = AttackConfig.model_validate({"kind": kind, "fraction": fraction, "knowledge": "partial", **params})
    return Adversary(cfg, fed, seed=seed, n_classes=fed.n_classes)


def _partial_trim(v: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``partial_trim`` of the code released with Fang et al.'s attack, on the compromised clients' rows ``v``
    ``[f, d]``, with ``r`` in the place of its fixed 3.5 (the paper draws it from [3, 4])."""
    f = v.shape[0]
    e_mu = torch.mean(v, 0)
    e_sigma = torch.sqrt(torch.sum(torch.square(v - e_mu), 0) / f)
    return e_mu - e_sigma * torch.sign(e_mu) * r


@pytest.mark.parametrize("kind, params", [("alie", {}), ("alie", {"z": 1.5}), ("ipm", {"epsilon": 4.0}),
                                          ("min_max", {"deviation": "sign"}), ("min_sum", {"deviation": "std"})])
def test_the_malicious_clients_craft_the_papers_update_from_their_own(kind, params):
    adv = _adversary(kind, **params)
    bad = adv.malicious
    rng = np.random.default_rng(3)
    ref = torch.as_tensor(rng.normal(size=6))
    thetas = ref.numpy() + rng.normal(size=(10, 6)) * 0.1 + 0.05
    out = _round(adv, ref, thetas, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
    own = thetas[bad] - ref.numpy()
    mu, sigma = own.mean(0), own.std(0, ddof=1)
    if kind == "alie":
        crafted = mu - sigma * params.get("z", z_max(10, int(bad.sum())))
    elif kind == "ipm":
        crafted = -params["epsilon"] * mu
    else:
        crafted = _paper_agnostic(own, kind, params["deviation"])
    for k in range(10):
        expected = ref.numpy() + crafted if bad[k] else thetas[k]
        np.testing.assert_allclose(out.params["w"][k].numpy(), expected, rtol=1e-9, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 11), min_size=0, max_size=3))
def test_partial_trim_is_the_codes_with_the_papers_draws_from_3_to_4_standard_deviations(seed, cuts):
    adv = _adversary("fang_trim", seed=seed % 5, clients=12, fraction=0.4)
    rng = np.random.default_rng(seed)
    ref = torch.as_tensor(rng.normal(size=(3, 4)))
    thetas = ref.numpy() + rng.normal(size=(12, 3, 4)) * rng.uniform(0.01, 5) + rng.normal(size=(3, 4))
    order = list(rng.permutation(12))
    bounds = sorted(set(cuts))
    out = _round(adv, ref, thetas, [order[a:b] for a, b in zip([0, *bounds], [*bounds, 12], strict=True) if a < b])
    bad = [int(k) for k in np.flatnonzero(adv.malicious)]
    own = torch.as_tensor(thetas[bad] - ref.numpy())
    sent = dict(zip(out.client_ids, out.params["w"], strict=True))
    for k in bad:
        expected = _partial_trim(own.reshape(len(bad), -1), 3 + _draws(seed % 5, 0, k, (3, 4)).reshape(-1))
        torch.testing.assert_close(sent[k], ref + expected.reshape(3, 4), rtol=1e-12, atol=1e-12)
    assert not torch.equal(sent[bad[0]], sent[bad[1]])  # each its own draws


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(KINDS), scale=st.floats(0.01, 100.0))
def test_what_the_malicious_clients_send_does_not_depend_on_the_honest_updates(seed, kind, scale):
    adv = _adversary(kind, seed=seed % 5, clients=12, fraction=0.4)
    rng = np.random.default_rng(seed)
    ref = torch.as_tensor(rng.normal(size=(2, 5)))
    thetas = ref.numpy() + rng.normal(size=(12, 2, 5)) * 0.3 + rng.normal(size=(2, 5))
    moved = thetas.copy()
    moved[~adv.malicious] = ref.numpy() + rng.normal(size=moved[~adv.malicious].shape) * scale
    chunks = [list(range(6)), list(range(6, 12))]
    a, b = _round(adv, ref, thetas, chunks), _round(adv, ref, moved, chunks)
    bad = torch.as_tensor(adv.malicious)
    torch.testing.assert_close(a.params["w"][bad], b.params["w"][bad], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b.params["w"][~bad], torch.as_tensor(moved[~adv.malicious]), rtol=0, atol=0)


def test_partial_knowledges_krum_attack_goes_against_the_malicious_clients_own_direction():
    adv = _adversary("fang_krum", clients=20, fraction=0.3)
    bad = adv.malicious
    rng = np.random.default_rng(4)
    ref = torch.zeros(8, dtype=torch.float64)
    thetas = rng.normal(size=(20, 8)) * 0.05
    thetas[bad] += np.array([1, -1, 1, -1, 1, 1, -1, -1]) * 0.2  # their own updates lean one way
    thetas[~bad] -= np.array([1, -1, 1, -1, 1, 1, -1, -1]) * 0.2  # the honest ones the other
    out = _round(adv, ref, thetas, [list(range(20))])
    first = out.params["w"][int(np.flatnonzero(bad)[0])]
    own = torch.as_tensor(thetas[bad])
    s = torch.sign(own.sum(0))
    assert torch.equal(torch.sign(first), -s)
    # Krum among their own c updates and c copies always lets a copy win: λ is §4.2's bound, with the round's counts
    torch.testing.assert_close(first, -lambda_bound(own, int(bad.sum()), 20) * s, rtol=1e-12, atol=0)


def test_executors_agree_under_a_partial_knowledge_attack():
    fed = _fed()
    results = []
    for executor in (VectorisedExecutor(), SequentialExecutor()):
        algo, cfg = _algo(fed, combine={"rule": "trimmed_mean", "fraction": 0.3}, client_dropout=0.2)
        results.append(simulate(algo, fed, cfg, seed=1, executor=executor, attack=AttackConfig.model_validate(
            {"kind": "fang_trim", "fraction": 0.3, "knowledge": "partial"})))
    a, b = results
    for k in a.server.params:
        torch.testing.assert_close(a.server.params[k], b.server.params[k], rtol=1e-5, atol=1e-6)
    assert a.faults == b.faults


@pytest.mark.parametrize("sets, says", [
    (["attack.kind=sign_flip", "attack.knowledge=partial"], "unknown key 'attack.knowledge' = 'partial'"),
    (["attack.kind=alie", "attack.knowledge=some"], "attack.knowledge = 'some'"),
    (["attack.kind=fang_trim", "attack.knowledge=partial", "attack.b=3"],
     "attack.b = 3.0 is not read under attack.knowledge = 'partial'"),
])
def test_knowledge_is_refused_where_it_is_not_read_in_one_line(tmp_path, capsys, sets, says):
    out = tmp_path / "r"
    code = main(["run", "--quiet", *[a for s in sets for a in ("--set", s)], "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert says in err
    assert not out.exists()


def test_a_colluding_attack_whose_params_do_not_say_what_it_knows_is_not_registered():
    from hetfed.engine.attacks import ATTACKS, ClientAttack, register
    from hetfed.registry import ComponentParams

    with pytest.raises(TypeError, match="ColludingParams"):
        register(ClientAttack("knows_nothing", "a plugin's colluding attack", ComponentParams,
                              collude=lambda honest, p: dict(honest.mean)))
    assert "knows_nothing" not in ATTACKS.names()


def test_a_sweeps_run_of_partial_trim_is_not_refused_for_the_keys_it_left_at_their_defaults(tmp_path):
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "configs" / "robust_digits.yaml"
    code = main(["sweep", str(config), "--seeds", "1", "--quiet", "--set", "train.rounds=1", "--set",
                 "methods=[{name: mean, algorithm: fedavg}]", "--grid",
                 "attack={kind: fang_trim, fraction: 0.3, knowledge: partial}", "--out", str(tmp_path / "s")])
    assert code == 0
    assert (tmp_path / "s" / "runs.csv").exists()
