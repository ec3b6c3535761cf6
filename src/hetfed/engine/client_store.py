"""Every client's local state, compactly: one tensor per state name, indexed by client id.

A dict of small per-client tensors costs ~1 KB of Python and allocator overhead
per tensor; at 100 000 clients that is more than the states themselves. Here a
state name (``cgau.0.filter.cond``, ``opt.m.fc1.weight``, a FedMoE specialist's
weights) is one ``[K, …]`` tensor on the CPU — also when training on a GPU, where
only the stack being trained is moved to the device. Clients that do not hold a
name (FedMoE's specialists exist only on the clients that personalised) are
tracked by a mask.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from hetfed.engine.types import ClientState


class ClientStore(Mapping[int, ClientState]):
    """``store[k]`` is client k's state (views into the store); ``gather``/``scatter`` move stacks."""

    def __init__(self, n_clients: int):
        self.n_clients = n_clients
        self._data: dict[str, torch.Tensor] = {}
        self._has: dict[str, np.ndarray] = {}

    # -- stacks
    def gather(self, ids: list[int], device: torch.device | str = "cpu",
               keep: Callable[[str], bool] = lambda name: True) -> ClientState:
        """The stacked state of ``ids`` (the names every one of them holds and ``keep`` accepts), on ``device``."""
        idx = np.asarray(ids, dtype=np.int64)
        out: ClientState = {}
        for name, has in self._has.items():
            if not keep(name):
                continue
            held = has[idx]
            if held.all():
                out[name] = self._data[name][torch.as_tensor(idx)].to(device)
            elif held.any():
                raise ValueError(f"state {name!r} is held by some of the stacked clients only; "
                                 "a stack's clients must hold the same state names")
        return out

    def scatter(self, ids: list[int], new: ClientState) -> None:
        """Store the stacked ``new`` state of ``ids``; names they no longer return are dropped for them."""
        idx = np.asarray(ids, dtype=np.int64)
        for name in list(self._has):
            if name not in new:
                self._has[name][idx] = False
        for name, value in new.items():
            value = value.detach()
            if name not in self._data:
                self._data[name] = torch.zeros((self.n_clients, *value.shape[1:]), dtype=value.dtype)
                self._has[name] = np.zeros(self.n_clients, dtype=bool)
            self._data[name][torch.as_tensor(idx)] = value.to("cpu")
            self._has[name][idx] = True

    def held_by_all(self) -> set[str]:
        """The state names every client holds."""
        return {name for name, has in self._has.items() if has.all()}

    def fill(self, values: dict[str, torch.Tensor]) -> None:
        """Give every client that does not hold a name of ``values`` that value (one client's, unstacked); the
        clients that hold it keep theirs."""
        for name, value in values.items():
            if name not in self._data:
                self._data[name] = torch.zeros((self.n_clients, *value.shape), dtype=value.dtype)
                self._has[name] = np.zeros(self.n_clients, dtype=bool)
            lacking = np.flatnonzero(~self._has[name])
            if len(lacking):
                self._data[name][torch.as_tensor(lacking)] = value.detach().to("cpu", self._data[name].dtype)
                self._has[name][lacking] = True

    # -- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything the store holds, for a resumable checkpoint."""
        return {"n_clients": self.n_clients, "data": dict(self._data), "has": {k: v.copy() for k, v in self._has.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["n_clients"] != self.n_clients:
            raise ValueError(f"checkpoint holds {state['n_clients']} clients, the federation {self.n_clients}")
        self._data = dict(state["data"])
        self._has = {k: np.asarray(v, dtype=bool).copy() for k, v in state["has"].items()}

    # -- the Mapping view (tests, checkpoints, the XOR demo)
    def __getitem__(self, k: int) -> ClientState:
        if not 0 <= k < self.n_clients:
            raise KeyError(k)
        return {name: self._data[name][k] for name, has in self._has.items() if has[k]}

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n_clients))

    def __len__(self) -> int:
        return self.n_clients

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._data.values())

    def stacked(self, keep: Callable[[str], bool] = lambda name: True) -> tuple[list[int], ClientState]:
        """The clients that hold the most of the names ``keep`` accepts, and those names stacked
        (for checkpoints: personalised clients hold more than the others)."""
        has = {n: h for n, h in self._has.items() if keep(n)}
        if not has:
            return [], {}
        counts = np.sum([h.astype(np.int64) for h in has.values()], axis=0)
        if counts.max() == 0:
            return [], {}
        ids = np.flatnonzero(counts == counts.max())
        names = [n for n, h in has.items() if h[ids].all()]
        return ids.tolist(), {n: self._data[n][torch.as_tensor(ids)] for n in names}
