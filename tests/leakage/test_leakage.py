"""What the server learns (#76, first slice): gradient inversion on what a client sends and membership inference on
a model, scored as the papers score them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from hetfed.errors import ConfigError
from hetfed.leakage import ATTACKS, Observed, Queried, label_from_last_layer, observe_step, run
from hetfed.leakage.metrics import labels_recovered, membership, psnr, ssim
from hetfed.models.mlp import MLP


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    d = load_digits()
    return torch.tensor(d.images / 16.0, dtype=torch.float32), torch.tensor(d.target)


def _model(seed: int = 1, hidden=(64, 64)) -> tuple[MLP, dict[str, torch.Tensor]]:
    model = MLP(64, list(hidden), 10)
    return model, model.init_shared(torch.Generator().manual_seed(seed))


def test_dlg_recovers_one_image_from_a_one_step_gradient_of_a_small_mlp():
    """Zhu et al.'s setting: one sample, the gradient of one step (FedSGD); the paper's bar is PSNR > 30 dB."""
    x, y = _digits()
    model, params = _model()
    observed = observe_step(model, params, x[3:4], y[3:4], lr=0.1)
    found = run("dlg", observed, seed=5)
    assert psnr(x[3:4].numpy(), found.x.numpy()) > 30
    assert found.y.tolist() == y[3:4].tolist() and found.distance < 1e-2
    assert ssim(x[3:4].numpy(), found.x.numpy()) > 0.9


def test_idlgs_label_rule_is_exact():
    """The last layer's bias gradient of one sample's cross-entropy is softmax − onehot: negative only at its
    label, whatever the model's weights and the sample."""
    x, y = _digits()
    for seed in range(40):
        model, params = _model(seed, hidden=(16 + seed % 3 * 16,))
        i = seed * 37 % len(y)
        assert label_from_last_layer(observe_step(model, params, x[i:i + 1], y[i:i + 1])).item() == y[i].item()


def test_idlg_recovers_the_image_with_the_label_it_reads():
    x, y = _digits()
    model, params = _model(2)
    found = run("idlg", observe_step(model, params, x[10:11], y[10:11]), {"iterations": 20})
    assert found.y.item() == y[10].item() and psnr(x[10:11].numpy(), found.x.numpy()) > 30


def test_inverting_gradients_reads_a_batch_of_one_and_recovers_it():
    x, y = _digits()
    model, params = _model(3)
    found = run("inverting_gradients", observe_step(model, params, x[7:8], y[7:8]), {"iterations": 600})
    assert found.y.item() == y[7].item() and psnr(x[7:8].numpy(), found.x.numpy()) > 20


def test_noise_a_client_adds_to_its_update_defeats_dlg():
    """A defence measured by handing the attack what the defended protocol sends: the same update with Gaussian
    noise of 10 % of its norm added by the client (local noise; hetfed's DP-FedAvg noises the round's sum, so the
    server still sees each clipped update)."""
    x, y = _digits()
    model, params = _model()
    clean = observe_step(model, params, x[3:4], y[3:4])
    norm = torch.sqrt(sum((v ** 2).sum() for v in clean.update.values()))
    gen = torch.Generator().manual_seed(9)
    scale = 0.1 * norm / np.sqrt(sum(v.numel() for v in clean.update.values()))
    noisy = Observed(clean.model, clean.params, {k: v + scale * torch.randn(v.shape, generator=gen)
                                                 for k, v in clean.update.items()},
                     clean.lr, clean.input_shape)
    assert psnr(x[3:4].numpy(), run("dlg", noisy, seed=5).x.numpy()) < psnr(x[3:4].numpy(),
                                                                           run("dlg", clean, seed=5).x.numpy()) - 10


def _train(model, params, x, y, steps=300, lr=0.5):
    params = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.SGD(params.values(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model.forward({k: v.unsqueeze(0) for k, v in params.items()}, x.reshape(1, len(x), -1))[0],
                        y).backward()
        opt.step()
    return {k: v.detach() for k, v in params.items()}


def test_membership_auc_is_chance_against_a_model_that_never_saw_the_members_and_high_when_it_overfit_them():
    x, y = _digits()
    x = x.reshape(len(x), -1)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train, members, others = order[:600], order[600:700], order[700:1000]
    model, params = _model(4)
    trained = _train(model, params, x[train], y[train])

    def scores(idx):
        return run("loss_threshold", Queried(model, trained, x[idx], y[idx]))

    unseen = membership(scores(members), scores(others))
    assert 0.38 < unseen["auc"] < 0.62, unseen  # neither set was trained on
    small = order[:40]  # a model fitted to 40 samples: their loss is far below the others'
    overfit = _train(model, params, x[small], y[small], steps=400)
    seen = membership(run("loss_threshold", Queried(model, overfit, x[small], y[small])),
                      run("loss_threshold", Queried(model, overfit, x[others], y[others])))
    assert seen["auc"] > 0.75 and 0 <= seen["tpr_at_0.01_fpr"] <= 1, seen


def test_lira_is_chance_on_samples_nobody_trained_on_and_finds_an_overfit_models_members():
    """Offline LiRA (Carlini et al. 2022): shadows trained on the attacker's own reference samples calibrate each
    sample's difficulty. On digits it does as well as the loss threshold, not better (every digit is about as easy
    as another; the paper's gain is on data of varied difficulty): both are asserted, neither is claimed to win."""
    x, y = _digits()
    x = x.reshape(len(x), -1)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    members, others, reference = order[:40], order[700:1000], (x[order[1000:1400]], y[order[1000:1400]])
    model, params = _model(4)

    def attack(kind, weights, idx):
        return run(kind, Queried(model, weights, x[idx], y[idx], reference), {"shadows": 8} if kind == "lira" else None)

    fresh = membership(attack("lira", params, members), attack("lira", params, others))
    assert 0.3 < fresh["auc"] < 0.7, fresh  # an untrained model: nothing to tell members by
    overfit = _train(model, params, x[members], y[members], steps=400)
    lira = membership(attack("lira", overfit, members), attack("lira", overfit, others))
    loss = membership(attack("loss_threshold", overfit, members), attack("loss_threshold", overfit, others))
    assert lira["auc"] > 0.8 and abs(lira["auc"] - loss["auc"]) < 0.05, (lira, loss)
    with pytest.raises(ValueError, match="Queried.reference is None"):
        run("lira", Queried(model, overfit, x[members], y[members]))


def test_online_lira_scores_against_shadows_that_saw_each_sample_and_that_did_not(monkeypatch):
    """Online LiRA (Carlini et al. 2022, § IV): half of the shadows train on each queried sample, in complementary
    pairs (every sample in k/2 shadows, or one fewer when their number is odd; every shadow on as many). A sample's
    score is log N(φ; μ_in, σ) − log N(φ; μ_out, σ), checked against that formula from the shadows' own φ. Chance
    against an untrained model, above chance against an overfit one; odd or too few shadows are refused.

    Finding (not asserted): on digits it does worse than the offline attack — against a target trained like the
    shadows (200 samples, 50 epochs), AUC 0.54 (8 shadows) and 0.56 (16) against offline's 0.61 and the loss
    threshold's 0.57; against the overfit target below ~0.66 against offline's > 0.8. With few shadows the per-sample
    μ_in − μ_out is noise next to this model's small memorisation, and a large φ multiplies it."""
    from scipy.stats import norm

    from hetfed.leakage import lira as module

    design = module.balanced_halves(37, 8, torch.Generator().manual_seed(1))
    seen = torch.zeros(8, 37, dtype=torch.int64)
    seen[torch.arange(8).unsqueeze(1), design] = 1
    assert design.shape == (8, 18) and set(seen.sum(0).tolist()) <= {3, 4} and int((seen.sum(0) == 3).sum()) == 4
    x, y = _digits()
    x = x.reshape(len(x), -1)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    members, others, reference = order[:40], order[700:1000], (x[order[1000:1400]], y[order[1000:1400]])
    model, params = _model(4)
    held, trained = [], []
    halves, shadows = module.balanced_halves, module.train_shadows
    monkeypatch.setattr(module, "balanced_halves", lambda *a: held.append(halves(*a)) or held[-1])
    monkeypatch.setattr(module, "train_shadows", lambda *a: trained.append(shadows(*a)) or trained[-1])

    def attack(weights, shadows=8):  # members and others asked together: the shadows train on halves of both
        idx = torch.cat([members, others])
        scores = run("lira", Queried(model, weights, x[idx], y[idx], reference), {"shadows": shadows, "online": True})
        return scores, membership(scores[: len(members)], scores[len(members):])

    _scores, fresh = attack(params)
    assert 0.3 < fresh["auc"] < 0.7, fresh
    overfit = _train(model, params, x[members], y[members], steps=400)
    scores, online = attack(overfit)
    assert online["auc"] > 0.6, online
    idx = torch.cat([members, others])
    phis = module.phi(model, trained[-1], x[idx], y[idx]).double()
    inside = torch.zeros(8, len(idx), dtype=torch.bool)
    inside[torch.arange(8).unsqueeze(1), held[-1]] = True
    mean_in = (phis * inside).sum(0) / inside.sum(0)
    mean_out = (phis * ~inside).sum(0) / (~inside).sum(0)
    residual = ((phis - mean_in) * inside).pow(2).sum() + ((phis - mean_out) * ~inside).pow(2).sum()
    sd = float((residual / (8 * len(idx) - 2 * len(idx))).sqrt())
    target = module.phi(model, {k: v.unsqueeze(0) for k, v in overfit.items()}, x[idx], y[idx])[0].double()
    expected = norm.logpdf(target.numpy(), mean_in.numpy(), sd) - norm.logpdf(target.numpy(), mean_out.numpy(), sd)
    assert np.allclose(scores, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="even number of shadows, at least 4: shadows = 5"):
        attack(overfit, shadows=5)


def test_labels_recovered_counts_the_multiset():
    assert labels_recovered(np.array([1, 1, 2]), np.array([1, 2, 2])) == pytest.approx(2 / 3)


def test_the_attacks_are_components_with_their_own_parameters(capsys):
    from hetfed.cli import main

    assert {"dlg", "idlg", "inverting_gradients", "loss_threshold"} <= set(ATTACKS.names())
    assert main(["components", "leakage"]) == 0
    assert "Zhu et al., NeurIPS 2019" in capsys.readouterr().out
    x, y = _digits()
    model, params = _model()
    with pytest.raises(ConfigError, match="unknown key 'leakage.dlg.steps' = 3: .*leakage attack 'dlg' takes"):
        run("dlg", observe_step(model, params, x[:1], y[:1]), {"steps": 3})
    with pytest.raises(ValueError, match="a batch of 2"):
        run("idlg", observe_step(model, params, x[:2], y[:2]))


def test_the_aggregate_secure_aggregation_hands_over_is_the_gradient_of_the_union_batch():
    """Under SecAgg+ the server holds only the mean update: for FedSGD clients of one sample each, that is the
    one-step update of their union batch — what `summed` hands the attack."""
    from hetfed.leakage import summed

    x, y = _digits()
    model, params = _model()
    idx = [3, 400, 800, 1200]
    mean = summed([observe_step(model, params, x[i:i + 1], y[i:i + 1]) for i in idx])
    union = observe_step(model, params, x[idx], y[idx])
    assert mean.batch == 4
    for k in union.update:
        torch.testing.assert_close(mean.update[k], union.update[k])


def test_a_compressed_update_is_what_the_server_decodes_and_2_bit_qsgd_defeats_dlg():
    from hetfed.leakage import compressed

    x, y = _digits()
    model, params = _model()
    clean = observe_step(model, params, x[3:4], y[3:4])
    same = compressed(clean, {"kind": "none"})
    assert all(torch.equal(same.update[k], clean.update[k]) for k in clean.update)
    coarse = compressed(clean, {"kind": "qsgd", "bits": 2})
    assert not torch.equal(coarse.update["layers.0.weight"], clean.update["layers.0.weight"])
    assert psnr(x[3:4].numpy(), run("dlg", coarse, seed=5).x.numpy()) < 20


def test_an_update_of_several_local_steps_is_the_sum_of_its_steps():
    from hetfed.leakage import observe_local

    x, y = _digits()
    model, params = _model()
    two = observe_local(model, params, x[:4], y[:4], lr=0.1, steps=2, batch=2)
    first = observe_step(model, params, x[:2], y[:2], lr=0.1)
    moved = {k: params[k] + first.update[k] for k in params}
    second = observe_step(model, moved, x[2:4], y[2:4], lr=0.1)
    for k in params:
        torch.testing.assert_close(two.update[k], first.update[k] + second.update[k])


def test_label_counts_reads_a_batchs_labels_from_the_bias_gradient_of_an_early_model():
    """Label-distribution inference: the multiset of a batch of 16's labels from one FedSGD update of a freshly
    initialised MLP (whose softmax is near the random inputs' mean, as the estimator assumes)."""
    x, y = _digits()
    recovered = []
    for seed in range(5):
        model, params = _model(seed)
        idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:16]
        found = run("label_counts", observe_step(model, params, x[idx], y[idx]), seed=seed)
        assert len(found.y) == 16 and found.x.shape[0] == 0
        recovered.append(labels_recovered(y[idx].numpy(), found.y.numpy()))
    assert np.mean(recovered) > 0.8, recovered
