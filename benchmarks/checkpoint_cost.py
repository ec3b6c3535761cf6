"""What a resumable checkpoint costs the round loop: each method's checkpoint payload of the default experiment (its
first checkpoint of the federated rounds: ``train.checkpoint_every`` rounds in where a number is set, else the one
at the rounds' end — ``auto`` writes none mid-run in a run shorter than a minute), serialised as hetfed writes it
(:mod:`hetfed.runs.tensor_pickle`) and as ``torch.save`` wrote it before (2026-12-06), in one run. The loop's
thread serialises every checkpoint (the file is written by a background thread), so this is the time a checkpoint
takes from the rounds. Prints JSON: per method, the payload's tensors and bytes, the fastest of ``--repeats``
batches of ``--saves`` saves in milliseconds, and their ratio. Timings are never asserted.

    python benchmarks/checkpoint_cost.py [--config configs/default.yaml] [--set KEY=VALUE …] [--saves 50]
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import timeit
from pathlib import Path
from typing import Any

import torch

from hetfed.config import load_config
from hetfed.console import make_console
from hetfed.engine.types import tensor_bytes
from hetfed.runs import checkpoint, tensor_pickle
from hetfed.runs.sweep import run_sweep

DEFAULT = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def payloads(config_path: str, sets: list[str]) -> dict[str, dict[str, Any]]:
    """Each method's first mid-run checkpoint payload, as :meth:`Checkpointer.save` serialises it."""
    config = load_config(config_path, sets)
    caught: dict[str, dict[str, Any]] = {}
    save = checkpoint.Checkpointer.save

    def catch(self: checkpoint.Checkpointer, current: dict[str, Any] | None) -> None:
        if current is not None and current.get("phase") == "federated" and current["label"] not in caught:
            caught[current["label"]] = checkpoint._versioned(
                {"methods": self.methods, "done": list(self.done), "current": current, "metrics_offset": 0,
                 "torch_rng": torch.get_rng_state(), "started": self.started, "resumes": self.resumes})
            buffer = io.BytesIO()
            tensor_pickle.dump(caught[current["label"]], buffer)  # serialised now: the loop updates it in place
            buffer.seek(0)
            caught[current["label"]] = tensor_pickle.load(buffer)
        save(self, current)

    checkpoint.Checkpointer.save = catch  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run_sweep(config, {}, seeds=1, out=Path(tmp), progress=False, console=make_console(stderr=True))
    finally:
        checkpoint.Checkpointer.save = save  # type: ignore[method-assign]
    return caught


def _tensors(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(_tensors(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensors(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return sum(_tensors(getattr(value, f)) for f in value.__dataclass_fields__)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(DEFAULT))
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--saves", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = {}
    for label, payload in payloads(args.config, args.sets).items():
        ms = {name: min(timeit.repeat(lambda write=write, payload=payload: write(payload, io.BytesIO()),
                                      number=args.saves, repeat=args.repeats)) / args.saves * 1e3
              for name, write in (("tensor_pickle", tensor_pickle.dump), ("torch_save", torch.save))}
        rows[label] = {"tensors": _tensors(payload), "tensor_bytes": tensor_bytes(payload),
                       **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
                       "torch_save_over_tensor_pickle": round(ms["torch_save"] / ms["tensor_pickle"], 2)}
    print(json.dumps({"config": args.config, "set": args.sets, "methods": rows}, indent=2))


if __name__ == "__main__":
    main()
