"""Every client's local state, compactly: one tensor per state name, indexed by client id.

A dict of small per-client tensors costs ~1 KB of Python and allocator overhead
per tensor; at 100 000 clients that is more than the states themselves. Here a
state name (``cgau.0.filter.cond``, ``opt.m.fc1.weight``, a FedMoE specialist's
weights) is one ``[K, …]`` tensor. On a GPU run a name lives on the device while
the store's names there fit its budget (:class:`ClientStore`'s ``budget_bytes``:
the executor gives it a quarter of the GPU's free memory), so a round's stacks are gathered and
scattered there — model-sized states (error feedback's residuals, SCAFFOLD's
control variates, personal models) went through the host every round, ~0.1 s of
a 0.14 s W1 round with top-k and error feedback on an H100; the names that do not
fit stay on the CPU and only their stacks move. Clients that do not hold a name
(FedMoE's specialists exist only on the clients that personalised) are tracked by
a mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from hetfed.engine.types import ClientState, index_on


class ClientStore(Mapping[int, ClientState]):
    """``store[k]`` is client k's state (views into the store); ``gather``/``scatter`` move stacks."""

    def __init__(self, n_clients: int, device: torch.device | str = "cpu", budget_bytes: int = 0):
        """``device``: where names live (not the CPU) while all the names there take at most ``budget_bytes``; the
        others live on the CPU. Where a name lives changes no number."""
        self.n_clients = n_clients
        self._data: dict[str, torch.Tensor] = {}
        self._has: dict[str, np.ndarray] = {}
        self._device, self._budget = torch.device(device), int(budget_bytes)

    def _home(self, nbytes: int, name: str) -> torch.device:
        """Where name ``name`` of ``nbytes`` lives: the store's device if it still fits there, else the CPU."""
        if self._device.type == "cpu":
            return self._device
        there = sum(_nbytes(v) for k, v in self._data.items() if k != name and v.device == self._device)
        return self._device if there + nbytes <= self._budget else torch.device("cpu")

    def devices(self) -> dict[str, torch.device]:
        """Where each name lives."""
        return {name: t.device for name, t in self._data.items()}

    def _new(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Name ``name``'s tensor for every client (zeros, none holding it yet), where it fits."""
        nbytes = math.prod(shape) * dtype.itemsize
        self._data[name] = torch.zeros(shape, dtype=dtype, device=self._home(nbytes, name))
        self._has[name] = np.zeros(self.n_clients, dtype=bool)
        return self._data[name]

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
                data = self._data[name]
                out[name] = data[index_on(idx, data.device)].to(device)
            elif held.any():
                raise ValueError(f"state {name!r} is held by some of the stacked clients only; "
                                 "a stack's clients must hold the same state names")
        return out

    def scatter(self, ids: list[int], new: ClientState, *, whole: bool = False) -> None:
        """Store the stacked ``new`` state of ``ids``. A step returns its clients' whole state: a name they hold that
        ``new`` lacks is refused (left out, it would be dropped, and the next step would run without it — as FLoRA's
        once ran without the model's client gates, and nothing failed). ``whole``: ``new`` is their entire state,
        as loaded (a Flower node's, from its context): the names it lacks are dropped for them."""
        idx = np.asarray(ids, dtype=np.int64)
        for name in list(self._has):
            if name not in new and self._has[name][idx].any():
                if not whole:
                    held = [ids[i] for i in np.flatnonzero(self._has[name][idx])]
                    raise RuntimeError(f"the step of clients {held[:5]}{' …' if len(held) > 5 else ''} returned no "
                                       f"state {name!r}, which they hold: a method's step returns each client's "
                                       "whole state (a part it does not change, as it received it)")
                self._has[name][idx] = False
        for name, value in new.items():
            value = value.detach()
            data = self._data.get(name)
            if data is None:
                data = self._new(name, (self.n_clients, *value.shape[1:]), value.dtype)
            data[index_on(idx, data.device)] = value.to(data.device)
            self._has[name][idx] = True

    def names(self) -> set[str]:
        """The state names any client holds."""
        return set(self._data)

    def held_by_all(self) -> set[str]:
        """The state names every client holds."""
        return {name for name, has in self._has.items() if has.all()}

    def fill(self, values: dict[str, torch.Tensor]) -> None:
        """Give every client that does not hold a name of ``values`` that value (one client's, unstacked); the
        clients that hold it keep theirs."""
        for name, value in values.items():
            data = self._data.get(name)
            if data is None:
                data = self._new(name, (self.n_clients, *value.shape), value.dtype)
            lacking = np.flatnonzero(~self._has[name])
            if len(lacking):
                data[index_on(lacking, data.device)] = value.detach().to(data.device, data.dtype)
                self._has[name][lacking] = True

    # -- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything the store holds, for a resumable checkpoint."""
        return {"n_clients": self.n_clients, "data": dict(self._data),
                "has": {k: v.copy() for k, v in self._has.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["n_clients"] != self.n_clients:
            raise ValueError(f"checkpoint holds {state['n_clients']} clients, the federation {self.n_clients}")
        self._data = {}
        for name, t in state["data"].items():  # a checkpoint's tensors (read onto the CPU): each where it fits
            self._data[name] = t.to(self._home(_nbytes(t), name))
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
        return sum(_nbytes(t) for t in self._data.values())

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
        return ids.tolist(), {n: self._data[n][index_on(ids, self._data[n].device)] for n in names}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
