"""A stack's per-client scores (``client_scores``, computed for the whole stack and read back once) equal each
client's scores computed alone with :func:`hetfed.engine.evaluate.scores` — the per-client form it replaced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetfed.engine.evaluate import (
    ONE_THREAD_SUM,
    ClientEvalData,
    Predictor,
    auc,
    client_losses,
    client_scores,
    masked_mean,
    own_class_masks,
    score_sums,
    scores,
    stacked_score_sums,
)
from hetfed.engine.types import take_rows
from hetfed.models.mlp import MLP


def _reference(pred: Predictor, data: ClientEvalData) -> dict[str, list[float]]:
    """Each client alone: its logits, then ``scores`` on its own test, validation and the global set."""
    out: dict[str, list[float]] = {}
    own = own_class_masks(data)
    for j in range(len(data.client_ids)):
        params = {k: v[j : j + 1] for k, v in pred.params.items()}
        for split, index in (("local", data.test[j]), ("val", data.val[j])):
            x = data.x[torch.as_tensor(index, dtype=torch.long)]
            s = scores(pred.model.forward(params, x.unsqueeze(0), None)[0],
                       data.y[torch.as_tensor(index, dtype=torch.long)])
            out.setdefault(f"{split}_accuracy", []).append(s["accuracy"])
            out.setdefault(f"{split}_loss", []).append(s["loss"])
            if split == "val":
                out.setdefault("val_loss_sum", []).append(s["loss_sum"])
                out.setdefault("val_n", []).append(s["n"])
            else:
                out.setdefault("local_n", []).append(s["n"])
        if data.n_classes == 2:
            yt = data.y[torch.as_tensor(data.test[j], dtype=torch.long)]
            lg = pred.model.forward(params, data.x[torch.as_tensor(data.test[j], dtype=torch.long)].unsqueeze(0),
                                    None)[0]
            out.setdefault("local_auc", []).append(auc(yt.numpy(),
                                                       lg.softmax(-1)[:, 1].numpy()) if len(yt) else float("nan"))
        glob = pred.model.forward(params, data.x_global.unsqueeze(0), None)[0]
        g = scores(glob, data.y_global)
        masked = data.global_mask is not None and not data.global_mask[j]
        out.setdefault("global_accuracy", []).append(float("nan") if masked else g["accuracy"])
        out.setdefault("global_loss", []).append(float("nan") if masked else g["loss"])
        hit = (glob.argmax(-1) == data.y_global).double()
        assert own is not None
        out.setdefault("global_accuracy_own", []).append(float("nan") if masked else masked_mean(hit, own[j]))
        out.setdefault("global_accuracy_other", []).append(float("nan") if masked else masked_mean(hit, ~own[j]))
    return out


@pytest.mark.parametrize("classes", [2, 5])
def test_a_stacks_scores_equal_each_clients_scores_alone(classes: int) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n, dim = 6, 7
    x, y = torch.randn(300, dim), torch.randint(0, classes, (300,))
    sizes = [0, 1, 13, 40, 7, 90]  # an empty client and clients of very different sizes
    test = [rng.choice(300, size=s, replace=False) for s in sizes]
    val = [rng.choice(300, size=s, replace=False) for s in reversed(sizes)]
    train = [rng.choice(300, size=30, replace=False) for _ in range(n)]
    model = MLP(dim, [8], classes)
    params = {k: v.expand(n, *v.shape) + 0.3 * torch.randn(n, *v.shape)
              for k, v in model.init_shared(torch.Generator().manual_seed(1)).items()}
    pred = Predictor(model, params, personalised=True)
    data = ClientEvalData(list(range(n)), x, y, test, val, torch.randn(50, dim), torch.randint(0, classes, (50,)),
                          classes,
                          [True, True, False, True, True, True], train)
    got, ref = client_scores(pred, data), _reference(pred, data)
    for key, values in ref.items():
        np.testing.assert_allclose(np.asarray(got[key], dtype=float), np.asarray(values, dtype=float), rtol=1e-6,
                                   atol=1e-7, err_msg=key)
    assert got["local_n"] == sizes and got["val_n"] == sizes[::-1]
    assert np.isnan(got["local_accuracy"][0]) and got["val_loss_sum"][5] == 0.0  # empty: NaN scores, zero sums
    assert ("global_probs" in got) == (classes == 2)


def test_a_stack_of_clients_without_any_samples_scores_nan() -> None:
    model = MLP(3, [5], 4)
    params = {k: v.expand(2, *v.shape) for k, v in model.init_shared(torch.Generator().manual_seed(0)).items()}
    empty = [np.zeros(0, dtype=np.int64)] * 2
    data = ClientEvalData([0, 1], torch.randn(10, 3), torch.randint(0, 4, (10,)), empty, empty, torch.randn(5, 3),
                          torch.randint(0, 4, (5,)), 4)
    got = client_scores(Predictor(model, params, personalised=False), data)
    assert np.isnan(got["local_accuracy"]).all() and got["val_n"] == [0, 0] and got["val_loss_sum"] == [0.0, 0.0]


def test_clients_of_several_runs_score_their_own_runs_global_test_sets() -> None:
    """A joined evaluation (a stacked sweep): clients scored on their own run's global set, picked from the runs'
    sets joined by ``global_index``, get the scores they get with their run's set alone."""
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    n, dim, classes = 4, 5, 3
    x, y = torch.randn(120, dim), torch.randint(0, classes, (120,))
    test = [rng.choice(120, size=10, replace=False) for _ in range(n)]
    train = [rng.choice(120, size=25, replace=False) for _ in range(n)]
    model = MLP(dim, [6], classes)
    params = {k: v.expand(n, *v.shape) + 0.3 * torch.randn(n, *v.shape)
              for k, v in model.init_shared(torch.Generator().manual_seed(2)).items()}
    pred = Predictor(model, params, personalised=True)
    sets = [(torch.randn(30, dim), torch.randint(0, classes, (30,))) for _ in range(2)]  # two runs' global sets
    joined = ClientEvalData(list(range(n)), x, y, test, test, torch.cat([s[0] for s in sets]),
                            torch.cat([s[1] for s in sets]), classes, None, train,
                            [np.arange(30) + 30 * (j // 2) for j in range(n)])  # clients 0, 1: run 0; 2, 3: run 1
    got = client_scores(pred, joined)
    for run, (xg, yg) in enumerate(sets):
        rows = [2 * run, 2 * run + 1]
        alone = client_scores(Predictor(model, {k: v[rows] for k, v in params.items()}, True),
                              ClientEvalData(rows, x, y, [test[j] for j in rows], [test[j] for j in rows], xg, yg,
                                             classes, None, [train[j] for j in rows]))
        for key in ("global_accuracy", "global_loss", "global_accuracy_own", "global_accuracy_other", "local_loss"):
            np.testing.assert_allclose([got[key][j] for j in rows], alone[key], rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("kind", ["mlp", "cgau", "cnn"])
def test_the_whole_global_set_scored_as_one_view_gives_the_numbers_of_each_clients_gathered_set(kind: str) -> None:
    """A run alone scores its clients' personal models on the whole global set as one view for all of them; a
    stacked sweep's clients pick their run's set out of the runs' sets joined (``global_index``, gathered per
    client). The two give the same numbers to the bit (a stacked sweep's runs.csv equals the sweep one by one)."""
    from hetfed.models.cgau import CGAUNet
    from hetfed.models.cnn import FedAvgCNN

    torch.manual_seed(3)
    n, classes = 5, 4
    model = {"mlp": lambda: MLP(16, [12, 8], classes), "cgau": lambda: CGAUNet(16, [12, 8], classes),
             "cnn": lambda: FedAvgCNN((12, 12), classes)}[kind]()
    shape = (12, 12) if kind == "cnn" else (16,)
    gen = torch.Generator().manual_seed(4)
    params = {k: v.expand(n, *v.shape) + 0.3 * torch.randn(n, *v.shape)
              for k, v in {**model.init_shared(gen), **model.init_local(gen)}.items()}
    pred = Predictor(model, params, personalised=True)
    x, y = torch.randn(60, *shape), torch.randint(0, classes, (60,))
    test = [np.arange(5) + 5 * j for j in range(n)]
    xg, yg = torch.randn(37, *shape), torch.randint(0, classes, (37,))
    whole = client_scores(pred, ClientEvalData(list(range(n)), x, y, test, test, xg, yg, classes, None, test))
    picked = client_scores(pred, ClientEvalData(list(range(n)), x, y, test, test, xg, yg, classes, None, test,
                                                [np.arange(37)] * n))
    for key in ("global_accuracy", "global_loss", "global_accuracy_own", "global_accuracy_other"):
        assert whole[key] == picked[key], key


def test_the_evaluations_index_cache_stays_within_its_bytes() -> None:
    """Index tensors are kept for the next evaluation of the same arrays, but never more than the cache's bytes: an
    evaluation of a newly sampled subset of clients every round names new arrays each time."""
    from hetfed.engine import evaluate

    evaluate._INDEX_CACHE.clear()
    first = [np.arange(10)]
    assert evaluate.device_index(first, torch.device("cpu")) is evaluate.device_index(first, torch.device("cpu"))
    for _ in range(200):  # 200 × ~2 × 800 KB ≫ 64 MB
        evaluate.device_index([np.arange(100_000)], torch.device("cpu"))
    held = sum(entry[2] for entry in evaluate._INDEX_CACHE.values())
    assert 0 < held <= evaluate._INDEX_CACHE_BYTES
    assert ("flat", "cpu", (id(first[0]),)) not in evaluate._INDEX_CACHE  # the oldest went first


@pytest.mark.parametrize("n", [1, 360, ONE_THREAD_SUM, 2 * ONE_THREAD_SUM])
def test_a_stacks_score_sums_are_each_models_own_to_the_bit(n: int) -> None:
    """Each row of :func:`stacked_score_sums` is :func:`score_sums` of that model's logits alone, on both sides of
    the length a CPU sums in one thread (a stacked sweep's servers give the numbers of their runs alone)."""
    gen = torch.Generator().manual_seed(n)
    logits = torch.randn(3, n, 10, generator=gen) * 4
    y = torch.randint(0, 10, (3, n), generator=gen)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a sum longer than one thread's is split between them (the suite runs on one)
    try:
        alone = torch.stack([score_sums(lg, labels) for lg, labels in zip(logits, y, strict=True)])
        assert torch.equal(stacked_score_sums(logits, y), alone)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("shape", [(7,), (4, 5), (2, 3, 4)])
def test_take_rows_is_indexing(shape: tuple[int, ...]) -> None:
    x, y = torch.randn(50, 6, 2), torch.randint(0, 9, (50,))
    index = torch.randint(0, 50, shape)
    assert torch.equal(take_rows(x, index), x[index]) and torch.equal(take_rows(y, index), y[index])


CUDA = torch.cuda.is_available()


def _losses_case(device: str) -> tuple[MLP, dict[str, torch.Tensor], torch.Tensor, torch.Tensor, list[np.ndarray]]:
    rng = np.random.default_rng(3)
    model = MLP(4, [6], 3)
    params = {k: (v.expand(4, *v.shape) + 0.3 * torch.randn(4, *v.shape, generator=torch.Generator().manual_seed(4)))
              .to(device) for k, v in model.init_shared(torch.Generator().manual_seed(5)).items()}
    x, y = torch.randn(80, 4).to(device), torch.randint(0, 3, (80,)).to(device)
    sets = [rng.choice(80, size=s, replace=False) for s in (9, 0, 31, 2)]  # an empty set, unequal ones
    return model, params, x, y, sets


def test_client_losses_are_each_clients_mean_cross_entropy_alone() -> None:
    """FedMoE's and FedFomo's held-out losses: each model's mean cross-entropy on its own set, 0 without one — the
    same numbers as each client alone, its labels indexed one set at a time."""
    from hetfed.models.softmax import row_cross_entropy

    model, params, x, y, sets = _losses_case("cpu")
    got = client_losses(model, params, x, y, sets)
    for k, idx in enumerate(sets):
        at = torch.as_tensor(idx, dtype=torch.long)
        alone = (row_cross_entropy(model.forward({n: v[k : k + 1] for n, v in params.items()}, x[at][None], None)[0],
                                   y[at]).mean() if len(idx) else torch.tensor(0.0))
        assert torch.equal(got[k], alone), k


@pytest.mark.skipif(not CUDA, reason="needs CUDA (run on the GPU machine)")
def test_a_cuda_stacks_held_out_losses_never_wait_once_its_sets_are_kept() -> None:
    """#74 item 3: the held-out losses' labels come from one kept copy of the sets' indices, and a client without a
    set gets a zero made on the device: after the first call, no synchronisation (each set's index copied to the GPU
    had been one a client, every call)."""
    model, params, x, y, sets = _losses_case("cuda")
    first = client_losses(model, params, x, y, sets)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = client_losses(model, params, x, y, sets)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(first, again)
