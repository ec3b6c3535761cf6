"""The CGAU paper's audio path (#14): FSD Kaggle 2018's layout, WAV reading, YAMNet's front end and body.

The real clips and weights cannot be had here: the tests write WAVs and CSVs in
the published layout, run the architecture with random weights, and check the
front end against numbers computed from YAMNet's published parameters
(16 kHz, 25 ms window, 10 ms hop, 64 mel bands over 125–7500 Hz, 0.96 s patches
with a 0.48 s hop).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.io import wavfile

from hetfed.config import DatasetConfig, EmbedConfig
from hetfed.data import embed, load_dataset
from hetfed.data import yamnet as net
from hetfed.data.audio import read_wav
from hetfed.errors import ConfigError, DataError

LABELS = ["Cough", "Bark", "Laughter"]


def _tone(seconds: float, hz: float, rate: int = 44_100) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t) * 32767).astype(np.int16)


def write_fsd(folder: Path, per_class: int = 3) -> None:
    """The Zenodo layout: FSDKaggle2018.meta/*.csv and the two audio folders, 44.1 kHz 16-bit PCM."""
    (folder / "FSDKaggle2018.meta").mkdir(parents=True)
    for split, csv_name in (("train", "train_post_competition.csv"), ("test",
                                                                      "test_post_competition_scoring_clips.csv")):
        audio = folder / f"FSDKaggle2018.audio_{split}"
        audio.mkdir()
        rows = []
        for c, label in enumerate(LABELS):
            for i in range(per_class):
                name = f"{split}{c}{i}.wav"
                wavfile.write(audio / name, 44_100, _tone(0.5 + 0.4 * i, 300.0 * (c + 1)))
                rows.append({"fname": name, "label": label, "manually_verified": 1, "freesound_id": 1,
                             "license": "CC0"} if split == "train" else
                            {"fname": name, "label": label, "usage": "Public", "freesound_id": 1, "license": "CC0"})
        with (folder / "FSDKaggle2018.meta" / csv_name).open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def test_fsd_layout_is_read_and_cough_against_the_rest_by_name(tmp_path):
    write_fsd(tmp_path / "fsd")
    ds = load_dataset(DatasetConfig(name="fsd_kaggle2018", data_dir=str(tmp_path / "fsd")))
    assert ds.n_classes == 3 and ds.class_names == ("Bark", "Cough", "Laughter")  # sorted label names
    assert ds.modality == "audio" and len(ds.x_train) == 9 and Path(ds.x_train[0]).is_file()
    binary = load_dataset(DatasetConfig(name="fsd_kaggle2018", data_dir=str(tmp_path / "fsd"), positive_class="Cough"))
    assert binary.n_classes == 2 and binary.y_train.sum() == 3
    assert [Path(p).name for p in binary.x_train[binary.y_train == 1]] == ["train00.wav", "train01.wav", "train02.wav"]
    with pytest.raises(DataError, match=r"positive_class = 'Sneeze' is not a class.*'Cough'"):
        load_dataset(DatasetConfig(name="fsd_kaggle2018", data_dir=str(tmp_path / "fsd"), positive_class="Sneeze"))


def test_missing_fsd_files_say_where_hetfed_looked_and_how_to_get_them(tmp_path):
    with pytest.raises(DataError, match=r"FSDKaggle2018.meta/train_post_competition.csv.*looked in "
                                        r".*zenodo.org/record/2552860"):
        load_dataset(DatasetConfig(name="fsd_kaggle2018", data_dir=str(tmp_path)))
    write_fsd(tmp_path / "fsd")
    (tmp_path / "fsd" / "FSDKaggle2018.audio_test" / "test10.wav").unlink()
    with pytest.raises(DataError, match="not in .*FSDKaggle2018.audio_test.*first: test10.wav"):
        load_dataset(DatasetConfig(name="fsd_kaggle2018", data_dir=str(tmp_path / "fsd")))


def test_wav_is_read_as_16khz_mono_in_unit_range(tmp_path):
    stereo = np.stack([_tone(1.0, 440), _tone(1.0, 440)], axis=1)
    wavfile.write(tmp_path / "s.wav", 44_100, stereo)
    x = read_wav(tmp_path / "s.wav")
    assert x.dtype == np.float32 and x.ndim == 1 and len(x) == 16_000
    assert 0.45 < np.abs(x).max() <= 0.52  # the tone's 0.5 amplitude survives resampling
    spectrum = np.abs(np.fft.rfft(x))
    assert abs(np.argmax(spectrum) * 16_000 / len(x) - 440) <= 1  # still a 440 Hz tone
    (tmp_path / "bad.wav").write_bytes(b"not a wav")
    with pytest.raises(DataError, match="could not be read as WAV"):
        read_wav(tmp_path / "bad.wav")


@pytest.mark.parametrize("seconds", [0.5, 0.975, 1.0, 1.44, 3.0, 10.0])
def test_frame_and_patch_counts_follow_the_published_parameters(seconds):
    n = int(round(seconds * 16_000))
    window, hop = round(0.025 * 16_000), round(0.010 * 16_000)
    n_eff = max(n, window + 95 * hop)  # a short clip is padded to one patch (96 frames)
    frames = 1 + (n_eff - window) // hop
    patches = 1 + (frames - 96) // 48  # remainders dropped
    assert net.frame_count(n_eff) == frames and net.patch_count(n) == patches
    out = net.log_mel_patches(np.zeros(n, dtype=np.float32))
    assert tuple(out.shape) == (patches, 96, 64)
    assert torch.allclose(out, torch.full_like(out, math.log(0.001)))  # silence: log(0 + 0.001)


def test_a_tone_lights_the_mel_band_around_its_frequency():
    """HTK mel scale (1127 ln(1 + f/700)), 64 bands evenly spaced in mel between 125 and 7500 Hz."""
    def mel(f):
        return 1127 * math.log(1 + f / 700)

    edges = np.linspace(mel(125), mel(7500), 66)
    for hz in (250.0, 1000.0, 4000.0):
        t = np.arange(16_000) / 16_000
        patches = net.log_mel_patches(np.sin(2 * np.pi * hz * t).astype(np.float32))
        band = int(patches[0].mean(0).argmax())
        assert abs(edges[band + 1] - mel(hz)) <= (edges[2] - edges[0]) / 2 + 1e-6, hz  # the band centred nearest
    m = net.mel_matrix()
    assert m.shape == (257, 64) and not m[0].any()  # the DC bin is zeroed, as TensorFlow's matrix does


def test_the_body_maps_patches_to_1024_and_clips_by_the_max_over_patches():
    weights = net.random_weights()
    trainable = sum(v.numel() for k, v in weights.items() if k.endswith(("weight", "beta")))
    assert round((trainable + 1024 * 521 + 521) / 1e6, 1) == 3.7  # the YAMNet README: "3.7M weights" (+ its logits)
    rng = np.random.default_rng(0)
    wave = rng.normal(scale=0.1, size=3 * 16_000).astype(np.float32)
    patches = net.log_mel_patches(wave)
    per_patch = net.embed_patches(patches, weights)
    assert tuple(per_patch.shape) == (5, 1024)
    np.testing.assert_allclose(net.clip_embedding(wave, weights), per_patch.amax(0).detach().numpy(), rtol=1e-5)
    # TensorFlow's 'same' padding at stride 2 pads only at the end: the first row and column are not padded
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    assert net._same(x, 2)[0, 0, 0, 0] == 0.0 and net._same(x, 2).shape[-1] == 5
    assert net._same(x, 2)[0, 0, :4, :4].equal(x[0, 0])


def test_keras_h5_weights_convert_to_the_torch_layout(tmp_path):
    import h5py

    weights = net.random_weights(1)
    with h5py.File(tmp_path / "yamnet.h5", "w") as f:  # Keras's layout: /<layer>/<layer>/<weight>:0
        for name, value in weights.items():
            layer, conv, *rest = name.split(".")
            v = value.numpy()
            if rest == ["weight"]:
                if conv == "depthwise_conv":
                    f[f"{layer}/{conv}/{layer}/{conv}/depthwise_kernel:0"] = v.transpose(2, 3, 0, 1)
                else:
                    f[f"{layer}/{conv}/{layer}/{conv}/kernel:0"] = v.transpose(2, 3, 1, 0)
            else:
                f[f"{layer}/{conv}/bn/{layer}/{conv}/bn/{rest[1]}:0"] = v
        f["logits/logits/kernel:0"] = np.zeros((1024, 521), np.float32)
    loaded = net.load_weights(str(tmp_path / "yamnet.h5"))
    assert loaded.keys() == weights.keys() and all(torch.equal(loaded[k], weights[k]) for k in weights)
    net.convert(str(tmp_path / "yamnet.h5"), str(tmp_path / "yamnet.pt"))
    assert all(torch.equal(net.load_weights(str(tmp_path / "yamnet.pt"))[k], weights[k]) for k in weights)


def test_yamnet_embeddings_are_cached_and_missing_weights_name_the_setting(tmp_path):
    write_fsd(tmp_path / "fsd", per_class=2)
    ds = load_dataset(DatasetConfig(name="fsd_kaggle2018", data_dir=str(tmp_path / "fsd"), positive_class="Cough"))
    with pytest.raises(ConfigError, match=r"embed.weights is not set.*yamnet.h5"):
        embed(ds, EmbedConfig(kind="yamnet", cache_dir=str(tmp_path / "c")), progress=False)
    with pytest.raises(ConfigError, match=r"embed.weights = '.*nope.pt' is not a file"):
        embed(ds, EmbedConfig(kind="yamnet", weights=str(tmp_path / "nope.pt"), cache_dir=str(tmp_path / "c")))
    torch.save({"layer1.conv.weight": torch.zeros(1)}, tmp_path / "wrong.pt")
    with pytest.raises(ConfigError, match="does not hold YAMNet's body.*layer1.conv.weight"):
        embed(ds, EmbedConfig(kind="yamnet", weights=str(tmp_path / "wrong.pt"), cache_dir=str(tmp_path / "c")))
    torch.save(net.random_weights(), tmp_path / "w.pt")
    cfg = EmbedConfig(kind="yamnet", weights=str(tmp_path / "w.pt"), cache_dir=str(tmp_path / "c"))
    e = embed(ds, cfg, progress=False)
    assert e.x_train.shape == (6, 1024) and e.x_test.shape == (6, 1024) and e.n_classes == 2
    first = read_wav(ds.x_train[0])
    np.testing.assert_allclose(e.x_train[0], net.clip_embedding(first, net.random_weights()), rtol=1e-5)
    [cached] = list((tmp_path / "c").iterdir())
    stamp = cached.stat().st_mtime_ns
    np.testing.assert_array_equal(embed(ds, cfg, progress=False).x_train, e.x_train)
    assert cached.stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="embed.kind = 'identity' cannot be used on audio"):
        embed(ds, EmbedConfig(kind="identity"))


def test_the_shipped_cough_config_runs_as_is_on_the_files(tmp_path, capsys):
    """configs/cgau_fsd_cough.yaml with only the two paths set (and a shorter run): AUC per method."""
    import json

    from hetfed.cli import main

    write_fsd(tmp_path / "fsd", per_class=8)
    torch.save(net.random_weights(), tmp_path / "yamnet.pt")
    config = Path(__file__).resolve().parents[2] / "configs" / "cgau_fsd_cough.yaml"
    code = main(["run", str(config), "--out", str(tmp_path / "run"), "--set", f"dataset.data_dir={tmp_path / 'fsd'}",
                 "--set", f"embed.weights={tmp_path / 'yamnet.pt'}", "--set", f"embed.cache_dir={tmp_path / 'c'}",
                 "--set", "partition.clients=3", "--set", "train.rounds=10"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    for method in ("relu", "cgau"):
        assert 0.0 <= summary["methods"][method]["best"]["global_auc"] <= 1.0
