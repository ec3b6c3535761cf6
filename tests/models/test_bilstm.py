"""The text model (#14): token ids → embedding → bidirectional LSTM → linear, over a client axis.

The reference is torch's own ``nn.LSTM`` on packed sequences (the standard
definition of a bidirectional LSTM over variable-length texts), not hetfed's code.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.algorithms import build_algorithm, resolve_run
from hetfed.config import ModelConfig, PartitionConfig, TrainConfig, build_config
from hetfed.data import tokens
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import personalise, simulate
from hetfed.models import build_model
from hetfed.models.bilstm import BiLSTM
from hetfed.partition import make_federation

VOCAB, LENGTH = 40, 10


def _params(model: BiLSTM, n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {s.name: torch.stack([s.init(gen, s.shape) for _ in range(n)]) for s in model.specs()}


def _ids(n: int, batch: int, lengths: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (n, batch, LENGTH), generator=gen)
    if lengths is None:
        lengths = torch.randint(0, LENGTH + 1, (n, batch), generator=gen)
    ids[torch.arange(LENGTH) >= lengths[..., None]] = 0
    return ids.float()


def _reference(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """torch.nn.LSTM(bidirectional) on packed sequences, one client at a time; empty texts → features 0."""
    n, b, _ = x.shape
    hidden = params["forward.w_hh"].shape[-1]
    out = []
    for k in range(n):
        lstm = torch.nn.LSTM(params["embedding"].shape[-1], hidden, bidirectional=True, batch_first=True)
        with torch.no_grad():
            for d, suffix in (("forward", ""), ("backward", "_reverse")):
                getattr(lstm, f"weight_ih_l0{suffix}").copy_(params[f"{d}.w_ih"][k])
                getattr(lstm, f"weight_hh_l0{suffix}").copy_(params[f"{d}.w_hh"][k])
                getattr(lstm, f"bias_ih_l0{suffix}").copy_(params[f"{d}.bias"][k])
                getattr(lstm, f"bias_hh_l0{suffix}").zero_()
        ids = x[k].long()
        lengths = (ids != 0).sum(-1)
        feats = torch.zeros(b, 2 * hidden)
        keep = lengths > 0
        if keep.any():
            emb = torch.nn.functional.embedding(ids[keep], params["embedding"][k])
            packed = torch.nn.utils.rnn.pack_padded_sequence(emb, lengths[keep], batch_first=True, enforce_sorted=False)
            _, (h, _) = lstm(packed)
            feats[keep] = torch.cat([h[0], h[1]], -1)
        out.append(feats @ params["out.weight"][k] + params["out.bias"][k])
    return torch.stack(out)


@pytest.mark.parametrize("path", ["fused", "stacked"])
def test_both_paths_equal_torch_lstm_on_packed_sequences(path):
    model = BiLSTM(LENGTH, VOCAB, 4, embedding_dim=6, hidden=5)
    params = _params(model, 3)
    x = _ids(3, 7)
    x[1, 2] = 0  # a text without a single word
    ids = x.long()
    logits = model.head(params, getattr(model, path)(params, ids, (ids != 0).sum(-1)))
    torch.testing.assert_close(logits, _reference(params, x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1, 2], params["out.bias"][1])  # features 0


def test_the_two_paths_give_the_same_gradients():
    model = BiLSTM(LENGTH, VOCAB, 3, embedding_dim=4, hidden=3)
    params = {k: v.requires_grad_() for k, v in _params(model, 2).items()}
    ids = _ids(2, 5).long()
    grads = []
    for path in ("fused", "stacked"):
        z = getattr(model, path)(params, ids, (ids != 0).sum(-1))
        grads.append(torch.autograd.grad(model.head(params, z).square().sum(), list(params.values())))
    for name, a, b in zip(params, *grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(0, LENGTH), min_size=4, max_size=4), extra=st.integers(1, 6))
def test_logits_do_not_depend_on_the_padding_or_the_stack(lengths, extra):
    """A text's logits are the same with more padding, and alone or stacked with other clients."""
    model = BiLSTM(LENGTH + extra, VOCAB, 3, embedding_dim=4, hidden=3)
    params = _params(model, 2)
    x = _ids(2, 4, torch.tensor([lengths, lengths[::-1]]))
    padded = torch.cat([x, torch.zeros(2, 4, extra)], -1)
    both = model.forward(params, padded)
    torch.testing.assert_close(both, model.forward(params, x), atol=1e-6, rtol=1e-5)
    alone = model.forward({k: v[1:] for k, v in params.items()}, x[1:])
    torch.testing.assert_close(both[1:], alone, atol=1e-6, rtol=1e-5)


# --- tokens -----------------------------------------------------------------------------------------------

def test_vocabulary_from_training_texts_only_by_frequency():
    train = ["the cat sat", "the cat ran", "The dog"]
    vocab = tokens.fit_vocabulary(train, vocab_size=5)
    assert vocab == ["the", "cat", "dog"]  # 3 × the (lower-cased), 2 × cat, then 1-count words by name; cut at 5 − 2
    ids = tokens.encode(["the zebra cat", "dog " * 20], vocab, max_length=4)
    assert ids.tolist() == [[2, tokens.UNKNOWN, 3, 0], [4, 4, 4, 4]]  # unseen word → 1; cut at 4; padded with 0
    assert tokens.fit_vocabulary(train, vocab_size=10, min_count=2) == ["the", "cat"]


class _Texts:
    """4 classes of synthetic texts: each class has its own words, plus shared noise words; lengths vary."""

    def __init__(self, n: int = 400, seed: int = 0):
        rng = np.random.default_rng(seed)
        words = [[f"w{c}x{i}" for i in range(6)] for c in range(4)]
        noise = [f"noise{i}" for i in range(10)]

        def text(c):
            k = rng.integers(1, 8)
            return " ".join(rng.choice(words[c] if rng.random() < 0.7 else noise) for _ in range(k))

        self.y_train = rng.integers(0, 4, n)
        self.y_test = np.repeat(np.arange(4), 10)
        raw_train = [text(c) for c in self.y_train]
        vocab = tokens.fit_vocabulary(raw_train, VOCAB)
        self.x_train = tokens.encode(raw_train, vocab, LENGTH)
        self.x_test = tokens.encode([text(c) for c in self.y_test], vocab, LENGTH)
        self.n_classes = 4
        self.input_shape = (LENGTH,)


def _build(n_out: int):
    return build_model(ModelConfig(kind="bilstm", embedding_dim=8, lstm_hidden=6), (LENGTH,), n_out, VOCAB)


def _fedavg(fed, executor, train):
    return simulate(build_algorithm("fedavg", _build(fed.n_classes), train), fed, train, 1, executor=executor)


@pytest.mark.parametrize("path", ["fused", "stacked"])
def test_executors_agree_and_fedavg_learns_the_texts(path, monkeypatch):
    if path == "stacked":  # the accelerator path, run on CPU
        monkeypatch.setattr(BiLSTM, "fused", BiLSTM.stacked)
    fed = make_federation(_Texts(), PartitionConfig(kind="dirichlet", clients=5, alpha=0.5, min_size=5), 0)
    train = TrainConfig(rounds=4, local_epochs=1, batch_size=16, eval_every=4,
                        optimizer={"kind": "adam", "lr": 0.02, "momentum": 0.0})
    seq = _fedavg(fed, SequentialExecutor(), train)
    vec = _fedavg(fed, VectorisedExecutor(chunk_clients=3), train)
    for k, v in seq.server.params.items():
        # Adam's m/√v amplifies summation-order roundoff where v is small: one element of forward.w_ih differs
        # by 8e-5 after 4 rounds at 1 thread (7e-6 at 2); a wrong batch or mask would differ by O(0.1)
        torch.testing.assert_close(vec.server.params[k], v, rtol=1e-4, atol=2e-4)
    (_, ev_seq), (_, ev_vec) = seq.history[-1], vec.history[-1]
    assert ev_vec.metrics["global_accuracy"] == pytest.approx(ev_seq.metrics["global_accuracy"], abs=1e-6)
    assert ev_seq.metrics["global_accuracy"] > 0.6  # chance is 0.25


def test_the_mixture_on_the_bilstm_agrees_across_executors():
    """FedMoE's gate is the same network with one output; its per-client phases agree too."""
    fed = make_federation(_Texts(300), PartitionConfig(kind="majority", clients=6, p=0.9), 0)
    config = build_config({"train": {"rounds": 2, "clients_per_round": 3, "optimizer": {"kind": "adam", "lr": 0.02}},
                           "methods": [{"algorithm": "fedmoe", "params": {"max_epochs": 3, "patience": 2}}]})
    out = []
    for executor in ("sequential", "vectorised"):
        train = config.train.model_copy(update={"executor": executor})
        algo = build_algorithm("fedmoe", _build(4), train, config.methods[0].params, build=_build, seed=0)
        run = resolve_run(algo, fed, train, 0)
        res = personalise(run, fed, simulate(run, fed), torch.device("cpu"))
        out.append({view: ev.metrics["local_accuracy_mean"] for view, ev in res.views.items()})
    assert out[0].keys() == {"local", "fedavg", "finetuned", "mixture"}
    for view, acc in out[0].items():
        assert out[1][view] == pytest.approx(acc, abs=1e-6), view


PARAMS = {"feddf": {"max_steps": 5, "eval_every": 5}, "fedgen": {"server_steps": 5}}


@pytest.mark.parametrize("algorithm", ["fedprox", "scaffold", "afl", "feddf", "fedgen", "local"])
def test_every_algorithm_but_fsnet_trains_the_bilstm(tmp_path, algorithm):
    """Through the runner on fortune-format files: the head split (FedGen), server data (FedDF), client sampling
    (AFL) and control variates (SCAFFOLD) all work on token ids."""
    from hetfed.runs.runner import run_experiment
    from tests.data.test_text_data import write_fortunes

    write_fortunes(tmp_path / "f", per_category=20)
    config = build_config({
        "dataset": {"name": "fortunes", "data_dir": str(tmp_path / "f")},
        "embed": {"kind": "tokens", "max_length": 8, "vocab_size": 60, "cache_dir": str(tmp_path / "c")},
        "model": {"kind": "bilstm", "embedding_dim": 6, "lstm_hidden": 4},
        "partition": {"kind": "iid", "clients": 3}, "train": {"rounds": 2, "local_steps": 3},
        "methods": [{"algorithm": algorithm, "params": PARAMS.get(algorithm, {})}]})
    summary = run_experiment(config, out=tmp_path / "run", progress=False).summary
    assert 0.0 <= summary["methods"][algorithm]["best"]["global_accuracy"] <= 1.0
