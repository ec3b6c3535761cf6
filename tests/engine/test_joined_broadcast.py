"""A joined broadcast (a stacked sweep's clients of several runs in one stack, #74 §1): each client reads its own
run's extras as rows; the numbers every client shares stay plain; a plain read of a per-client extra fails loudly
instead of answering a default (a method would then silently compute without it)."""

from __future__ import annotations

import pytest
import torch

from hetfed.engine.types import Broadcast, ClientBroadcast


def test_a_plain_broadcast_gives_its_extra_as_rows_of_one_value_without_copying():
    prototypes = torch.arange(6.0).view(2, 3)
    bc = Broadcast({}, 1, 0.1, {"prototypes": prototypes, "generator": {"w": torch.ones(2)}})
    rows = bc.extra_rows("prototypes", 4)
    assert rows.shape == (4, 2, 3) and rows.data_ptr() == prototypes.data_ptr()
    assert all(torch.equal(r, prototypes) for r in rows)
    assert bc.extra_rows("generator", 3)["w"].shape == (3, 2) and bc.has_extra("generator")


def test_a_joined_broadcast_gives_each_client_its_own_row_and_its_rows_follow_a_selection():
    own = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    bc = ClientBroadcast({"w": torch.zeros(3, 2)}, 2, 0.1, {"known": torch.tensor(1.0)},
                         row_extra={"c": own, "generator": {"g": own * 10}})
    assert torch.equal(bc.extra_rows("c", 3), own) and bc.extra_rows("known", 3).tolist() == [1.0, 1.0, 1.0]
    assert bc.extra["known"] == 1.0 and bc.has_extra("c") and not bc.has_extra("other")
    picked = bc.rows([2, 0])
    assert picked.extra_rows("c", 2).tolist() == [[2.0, 2.0], [0.0, 0.0]]
    assert picked.extra_rows("generator", 2)["g"].tolist() == [[20.0, 20.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match="a stack of 2 clients was given the extra 'c' for 3"):
        bc.extra_rows("c", 2)


@pytest.mark.parametrize("read", [lambda e: e.get("c"), lambda e: e["c"], lambda e: "c" in e, lambda e: dict(e),
                                  lambda e: {**e}, lambda e: list(e.items()), lambda e: list(e)])
def test_a_plain_read_of_a_per_client_extra_fails_with_what_to_call(read):
    bc = ClientBroadcast({}, 0, 0.1, {"beta": 0.5}, row_extra={"c": torch.zeros(2, 3)})
    with pytest.raises(KeyError, match=r"bc.extra_rows\("):
        read(bc.extra)
    assert bc.extra.get("beta") == 0.5 and bc.extra.get("absent", 7) == 7 and "beta" in bc.extra
    assert bc.rows([1]).extra.get("beta") == 0.5  # a selection keeps the shared numbers and the guard


def test_a_row_extra_built_on_first_read_is_built_once_and_never_when_unread():
    """A stacked sweep joins each tensor extra into rows only when the step reads it: Agnostic FL's reported model,
    which only the clients' evaluation scores, was copied into every training client's row before."""
    own = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    built = []

    def build(value):
        built.append(1)
        return value

    import functools

    bc = ClientBroadcast({"w": torch.zeros(3, 2)}, 2, 0.1, {},
                         row_extra={"c": functools.cache(lambda: build(own)),
                                    "unread": functools.cache(lambda: build(own * 0))})
    picked = bc.rows([2, 0])  # a selection of rows not built yet stays unbuilt
    assert built == [] and bc.has_extra("unread") and picked.has_extra("c")
    assert picked.extra_rows("c", 2).tolist() == [[2.0, 2.0], [0.0, 0.0]]
    assert torch.equal(bc.extra_rows("c", 3), own) and torch.equal(bc.extra_rows("c", 3), own)
    assert built == [1]  # built once for the broadcast and its selection, "unread" never


def test_a_stacked_sweeps_training_stacks_never_build_agnostic_fls_reported_model_into_rows(monkeypatch, tmp_path):
    """Agnostic FL's broadcast carries the iterates' mean for its clients' evaluation: a stacked sweep's training
    stacks join its model and λ-free extras without building the mean's rows, its evaluation stacks build them."""
    from hetfed.executors import stacked_work
    joined: list[str] = []
    real = stacked_work._joined_rows
    monkeypatch.setattr(stacked_work, "_joined_rows", lambda group, runs, chosen, key: (joined.append(key), real(
        group, runs, chosen, key))[1])
    from hetfed.api_sweep import sweep

    sweep({"seed": 0, "dataset": {"name": "digits"}, "partition": {"kind": "iid", "clients": 3},
           "heterogeneity": {"iid_draws": 0}, "model": {"kind": "logreg"},
           "train": {"rounds": 2, "local_steps": 2, "eval_every": 2},
           "methods": [{"name": "agn", "algorithm": "agnostic_fl"}]}, {"partition.kind": ["iid"]}, seeds=2,
          out=tmp_path / "s", stack=True, report=False)
    assert joined and set(joined) == {"average"}
    assert len(joined) == 1  # the one evaluation (round 2) only; never in a round's training
