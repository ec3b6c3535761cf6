"""What the Flower test files share: a small federation, its config on an executor, and the comparison of a
Flower run's summary with the in-process one (the numbers to 1e-5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetfed.config import build_config
from hetfed.runs.runner import run_experiment
from tests.one_actor import ONE_ACTOR

REPO = Path(__file__).resolve().parents[1]

SMALL = {
    "partition": {"kind": "feature_clusters", "clients": 4},
    "train": {"rounds": 3, "local_steps": 4, "batch_size": 16, "eval_every": 1},
}


def config(extra: dict, executor: str) -> object:
    raw = json.loads(json.dumps({**SMALL, **extra}))
    raw.setdefault("train", {})["executor"] = executor
    # Ray's start can pass the default 120 s on a loaded 2-core machine (seen with experiments beside the suite)
    raw.setdefault("flower", {}).setdefault("connect_timeout", 300)
    if executor == "flower":
        raw["flower"] = {**ONE_ACTOR, **raw["flower"]}
    return build_config(raw)


def compare(flower: dict, vec: dict, rel: float = 1e-5, abs: float = 1e-6) -> None:  # noqa: A002
    """Every final and best number of ``vec``'s methods in ``flower``'s, to ``rel`` / ``abs``."""
    assert list(flower["methods"]) == list(vec["methods"])
    for name, m in vec["methods"].items():
        for when in ("final", "best"):
            for key, value in m[when].items():
                got = flower["methods"][name][when][key]
                if value is None:
                    assert got is None, (name, when, key)
                else:
                    assert got == pytest.approx(value, rel=rel, abs=abs), (name, when, key)


def summary_of(cfg, out: Path) -> dict:
    return run_experiment(cfg, out=out, progress=False).summary
