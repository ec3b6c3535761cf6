import csv
import pickle

import numpy as np
import pytest

from hetfed.config import DatasetConfig, EmbedConfig
from hetfed.data import embed, load_dataset
from hetfed.data.embed import cache_path
from hetfed.data.formats import read_idx, write_idx
from hetfed.data.loading import Dataset, keep_classes
from hetfed.errors import DataError, MissingExtraError


def _write_mnist(folder, n_train=20, n_test=10, gz=True):
    rng = np.random.default_rng(0)
    sfx = ".gz" if gz else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte{sfx}", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{sfx}", (np.arange(n) % 10).astype(np.uint8))


def test_digits_is_the_offline_default():
    ds = load_dataset(DatasetConfig())
    assert ds.name == "digits" and ds.n_classes == 10
    assert len(ds.y_train) + len(ds.y_test) == 1797
    assert ds.x_train.shape[1:] == (8, 8) and ds.x_train.min() >= 0 and ds.x_train.max() <= 1


@pytest.mark.parametrize("name", ["fashion-mnist", "mnist"])
@pytest.mark.parametrize("gz", [True, False])
def test_idx_folder_loads(tmp_path, name, gz):
    _write_mnist(tmp_path, gz=gz)
    ds = load_dataset(DatasetConfig(name=name, data_dir=str(tmp_path)))
    assert ds.x_train.shape == (20, 28, 28) and ds.x_test.shape == (10, 28, 28)
    assert ds.y_train.tolist() == [i % 10 for i in range(20)]
    assert ds.x_train.dtype == np.float32 and ds.x_train.max() <= 1


def test_missing_files_say_where_we_looked_and_how_to_get_them(tmp_path, monkeypatch):
    from hetfed.registry import registry_of

    monkeypatch.setattr(registry_of("dataset").get("fashion-mnist"), "places", (str(tmp_path / "std"),))
    monkeypatch.setattr(registry_of("dataset").get("mnist"), "places", ())
    with pytest.raises(DataError) as err:
        load_dataset(DatasetConfig(name="mnist", data_dir=str(tmp_path)))
    assert str(tmp_path) in str(err.value) and "data_dir" in str(err.value)
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_dataset(DatasetConfig(name="fashion-mnist", data_dir=str(tmp_path / "nowhere")))


def test_corrupt_idx_is_a_clear_error(tmp_path):
    _write_mnist(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataError, match="truncated"):
        load_dataset(DatasetConfig(name="mnist", data_dir=str(tmp_path)))
    bad = tmp_path / "x.idx"
    bad.write_bytes(b"hello world")
    with pytest.raises(DataError, match="magic"):
        read_idx(bad)


def test_cifar10_batches(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 3]}
        with open(folder / name, "wb") as fh:
            pickle.dump(batch, fh)
    ds = load_dataset(DatasetConfig(name="cifar10", data_dir=str(folder)))
    assert ds.x_train.shape == (20, 32, 32, 3) and ds.x_test.shape == (4, 32, 32, 3)
    # channel layout: the first 1024 values are the red plane
    with open(folder / "test_batch", "rb") as fh:
        raw = pickle.load(fh)[b"data"]
    assert np.allclose(ds.x_test[0, :, :, 0].ravel() * 255, raw[0, :1024])
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="test_batch"):
        load_dataset(DatasetConfig(name="cifar10", data_dir=str(folder)))


def test_ag_news_csv(tmp_path):
    for name in ("train.csv", "test.csv"):
        with open(tmp_path / name, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["3", "Wall St. Bears", "Short-sellers, see green again."])
            w.writerow(["1", "World news", "Something, happened"])
    ds = load_dataset(DatasetConfig(name="ag_news", data_dir=str(tmp_path)))
    assert ds.modality == "text" and ds.y_train.tolist() == [2, 0]
    assert ds.x_train[0] == "Wall St. Bears. Short-sellers, see green again."
    with pytest.raises(DataError, match="minilm"):
        embed(ds, EmbedConfig(kind="identity"))


def test_npz_arrays_with_natural_clients(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "mine.npz"
    np.savez(path, x=rng.normal(size=(40, 3)), y=np.arange(40) % 2, client=np.arange(40) % 4,
             split=np.array(["train"] * 30 + ["test"] * 10))
    ds = load_dataset(DatasetConfig(name="arrays", path=str(path)))
    assert ds.x_train.shape == (30, 3) and ds.x_test.shape == (10, 3)
    assert sorted(np.unique(ds.client_train)) == [0, 1, 2, 3]


def test_parquet_arrays(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"f0": [0.1, 0.2, 0.3, 0.4, 0.5], "f1": [1.0, 2, 3, 4, 5], "y": [0, 1, 0, 1, 0],
                      "client": ["a", "a", "b", "b", "b"]})
    path = tmp_path / "mine.parquet"
    pq.write_table(table, path)
    ds = load_dataset(DatasetConfig(name="arrays", path=str(path), test_fraction=0.4))
    assert ds.x_train.shape[1] == 2 and len(ds.y_train) + len(ds.y_test) == 5
    (tmp_path / "bad.parquet").write_bytes(b"garbage")
    with pytest.raises(DataError, match="parquet"):
        load_dataset(DatasetConfig(name="arrays", path=str(tmp_path / "bad.parquet")))


def test_arrays_errors(tmp_path):
    with pytest.raises(DataError, match="dataset.path"):
        load_dataset(DatasetConfig(name="arrays"))
    np.savez(tmp_path / "nolabels.npz", x=np.zeros((3, 2)))
    with pytest.raises(DataError, match="'y'"):
        load_dataset(DatasetConfig(name="arrays", path=str(tmp_path / "nolabels.npz")))


def test_binary_task():
    ds = load_dataset(DatasetConfig(positive_class=3))
    assert ds.n_classes == 2 and 0.05 < ds.y_train.mean() < 0.15
    with pytest.raises(DataError, match="positive_class = 12"):
        load_dataset(DatasetConfig(positive_class=12))


def test_keeping_some_classes_relabels_them_in_the_order_given_and_drops_every_other_sample():
    """``dataset.keep_classes``: only those classes' samples, train and test, their labels 0, 1, … in the order
    given (Agnostic FL's Fashion-MNIST clients: Shirt, Pullover, T-shirt/top); names as ids; refusals name the key."""
    whole = load_dataset(DatasetConfig())
    ds = load_dataset(DatasetConfig(keep_classes=[7, 2, 5]))
    assert ds.n_classes == 3
    for x, y, wx, wy in ((ds.x_train, ds.y_train, whole.x_train, whole.y_train),
                         (ds.x_test, ds.y_test, whole.x_test, whole.y_test)):
        for new, old in enumerate([7, 2, 5]):  # each kept class's samples, in their order, under its new label
            np.testing.assert_array_equal(x[y == new], wx[wy == old])
        assert len(y) == int(np.isin(wy, [7, 2, 5]).sum())
    assert any("classes [7, 2, 5] kept as 0..2" in note for note in ds.notes)
    named = Dataset("d", np.arange(8.0).reshape(4, 2), np.array([0, 1, 2, 1]), np.zeros((2, 2)), np.array([2, 0]),
                    3, "vector", class_names=("a", "b", "c"), client_train=np.array([5, 6, 7, 8]))
    kept = keep_classes(named, ["c", 1])
    assert kept.y_train.tolist() == [1, 0, 1] and kept.client_train.tolist() == [6, 7, 8]
    assert kept.y_test.tolist() == [0] and kept.class_names == ("c", "b") and kept.n_classes == 2
    for classes, needle in (([0, 10], r"dataset.keep_classes\[1\] = 10 is not allowed: expected 0..9"),
                            ([1, "Shirt"], r"dataset.keep_classes\[1\] = 'Shirt' is not a class of digits: "
                                           r"expected a class id \(this dataset has no names\)"),
                            ([3, 3], r"dataset.keep_classes = \[3, 3\] names class 3 twice")):
        with pytest.raises(DataError, match=needle):
            load_dataset(DatasetConfig(keep_classes=classes))
    with pytest.raises(DataError, match=r"dataset.keep_classes = \['c', 2\] names class 2 twice"):
        keep_classes(named, ["c", 2])
    with pytest.raises(ValueError, match=r"dataset.keep_classes = \[0, 1\] and dataset.positive_class = 1 are both"):
        DatasetConfig(keep_classes=[0, 1], positive_class=1)
    with pytest.raises(ValueError, match="at least 2"):
        DatasetConfig(keep_classes=[4])


def test_hetfed_run_on_two_kept_classes_trains_a_two_class_model(tmp_path):
    from hetfed.cli import main

    out = tmp_path / "r"
    assert main(["run", "--quiet", "--no-report", "--set", "dataset.keep_classes=[3, 8]", "--set", "train.rounds=2",
                 "--set", "partition.kind=iid", "--set", "partition.clients=3", "--set", "heterogeneity.iid_draws=0",
                 "--set", "methods=[{name: avg, algorithm: fedavg, model: {kind: logreg}}]", "--out", str(out)]) == 0
    import torch

    weights = torch.load(out / "checkpoints" / "avg-final.pt")
    assert weights["layers.0.bias"].shape == (2,)  # a 2-class model
    assert main(["run", "--quiet", "--set", "dataset.keep_classes=[3, 30]", "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_what_loading_did_is_in_the_summary_and_said_once_a_sweep(tmp_path, capsys):
    """A loading note ("classes … kept") is part of the run's record; a quiet run or sweep does not print it and a
    sweep prints it once, not once a run (the notes' "sweep --quiet prints each run's loading notes")."""
    import json

    from hetfed.cli import main

    base = ["--set", "dataset.keep_classes=[3, 8]", "--set", "train.rounds=1", "--set", "partition.kind=iid",
            "--set", "partition.clients=3", "--set", "heterogeneity.iid_draws=0", "--no-report",
            "--set", "methods=[{name: avg, algorithm: fedavg, model: {kind: logreg}}]"]
    assert main(["run", "--quiet", *base, "--out", str(tmp_path / "r")]) == 0
    said = capsys.readouterr()
    assert "kept" not in said.out + said.err and str(tmp_path / "r") in said.out
    notes = json.loads((tmp_path / "r" / "summary.json").read_text())["data_notes"]
    assert len(notes) == 1 and notes[0].startswith("classes [3, 8] kept as 0..1")
    assert main(["run", *base, "--out", str(tmp_path / "loud")]) == 0
    assert notes[0] in capsys.readouterr().err
    for quiet, times in ((["--quiet"], 0), ([], 1)):
        assert main(["sweep", *base, "--seeds", "3", *quiet, "--out", str(tmp_path / f"s{times}")]) == 0
        said = capsys.readouterr()
        assert (said.out + said.err).count(notes[0]) == times


def test_identity_and_pca_embedding():
    ds = load_dataset(DatasetConfig())
    ident = embed(ds, EmbedConfig(kind="identity"))
    assert ident.x_train.shape == (len(ds.y_train), 64) and ident.input_shape == (8, 8)
    pca = embed(ds, EmbedConfig(kind="pca", components=5))
    assert pca.x_train.shape[1] == 5
    # fitted on train only: train embeddings are centred, test ones need not be
    assert np.allclose(pca.x_train.mean(axis=0), 0, atol=1e-4)
    with pytest.raises(DataError, match="embed.components = 1000"):
        embed(ds, EmbedConfig(kind="pca", components=1000))


def test_cache_key_depends_on_data_and_params(tmp_path):
    a = Dataset("d", np.zeros((2, 2)), np.zeros(2, int), np.zeros((1, 2)), np.zeros(1, int), 2, "image")
    b = Dataset("d", np.ones((2, 2)), np.zeros(2, int), np.zeros((1, 2)), np.zeros(1, int), 2, "image")
    pa = cache_path(a, "efficientnet_lite0", {"image_size": 224}, str(tmp_path))
    assert pa == cache_path(a, "efficientnet_lite0", {"image_size": 224}, str(tmp_path))
    assert pa != cache_path(b, "efficientnet_lite0", {"image_size": 224}, str(tmp_path))
    assert pa != cache_path(a, "efficientnet_lite0", {"image_size": 64}, str(tmp_path))


def test_cached_embedding_is_reused(tmp_path, monkeypatch):
    from hetfed.data import extractors

    calls = []

    def fake(x, cfg, *, progress=True, desc=""):
        calls.append(len(x))
        return np.full((len(x), 7), 1.5, np.float32)

    monkeypatch.setattr(extractors, "efficientnet_lite0", fake)
    ds = load_dataset(DatasetConfig())
    cfg = EmbedConfig(kind="efficientnet_lite0", cache_dir=str(tmp_path))
    first = embed(ds, cfg, progress=False)
    second = embed(ds, cfg, progress=False)
    assert len(calls) == 2  # train + test, once
    assert np.array_equal(first.x_train, second.x_train) and second.x_train.shape[1] == 7
    assert len(list(tmp_path.glob("*.npz"))) == 1


def test_missing_extra_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_effnet(name, *a, **k):
        if name.startswith("efficientnet"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_effnet)
    from hetfed.data.extractors import load_efficientnet_lite0

    with pytest.raises(MissingExtraError, match=r"hetfed\[vision\]"):
        load_efficientnet_lite0()


def test_efficientnet_loader_does_not_print_on_stdout(capsys):
    pytest.importorskip("efficientnet_lite_pytorch")
    from hetfed.data.extractors import load_efficientnet_lite0

    load_efficientnet_lite0()
    assert capsys.readouterr().out == ""


def test_real_efficientnet_embeds_offline(tmp_path):
    """The packaged ImageNet weights load without a network and give 1280-d features."""
    pytest.importorskip("efficientnet_lite_pytorch")
    ds = load_dataset(DatasetConfig())
    small = Dataset("digits", ds.x_train[:6], ds.y_train[:6], ds.x_test[:2], ds.y_test[:2], 10, "image")
    cfg = EmbedConfig(kind="efficientnet_lite0", image_size=64, cache_dir=str(tmp_path), device="cpu")
    out = embed(small, cfg, progress=False)
    assert out.x_train.shape == (6, 1280) and np.isfinite(out.x_train).all()
    assert not np.allclose(out.x_train[0], out.x_train[1])
    assert np.array_equal(embed(small, cfg, progress=False).x_train, out.x_train)  # from the cache


def test_global_standardisation_uses_the_training_split_only():
    raw = load_dataset(DatasetConfig(name="digits"))
    std = load_dataset(DatasetConfig(name="digits", standardise="global"))
    m, s = raw.x_train.mean(), raw.x_train.std()
    np.testing.assert_allclose(std.x_train, (raw.x_train - m) / s, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(std.x_test, (raw.x_test - m) / s, rtol=1e-5, atol=1e-5)  # the train split's m, s
    assert abs(std.x_train.mean()) < 1e-5 and abs(std.x_train.std() - 1) < 1e-5


def test_standardising_text_is_refused(tmp_path):
    from tests.data.test_text_data import write_fortunes

    write_fortunes(tmp_path / "f")
    with pytest.raises(DataError, match="dataset.standardise = 'global' cannot be used on text dataset 'fortunes'"):
        load_dataset(DatasetConfig(name="fortunes", data_dir=str(tmp_path / "f"), standardise="global"))
