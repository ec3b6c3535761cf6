"""Secure aggregation on Flower (``flower.secure_aggregation: secaggplus``): a round's training under SecAgg+.

Built on Flower's own SecAgg+ (Bell et al. 2020) — ``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` on the
nodes — with none of the cryptography written here. A round takes four exchanges instead of one: *setup* (the
nodes make key pairs), *share keys* (each node's secrets split into shares for its neighbours), *collect masked
vectors* (hetfed's training message rides here: each node trains its clients and sends its update quantised,
weighted and masked), *unmask* (the surviving nodes send the shares that remove the masks). The server ends with
the sum of the nodes' weighted updates and never sees one of them: a node that drops out after sharing its keys is
unmasked from its neighbours' shares, and the round goes on while every node keeps ``reconstruction_threshold``
live neighbours.

What a node contributes (:func:`node_reply`) is its cohort's sample-weighted mean **update** Δ = θ − θ_global (the
server adds the broadcast model back: updates are small, so Flower's clipping range of 8 clips nothing in practice
and its quantisation step is fine against them) and its mean training loss, weighted by the node's training
samples; its clients' ids and sample counts travel in the clear beside it, as Flower's ``num_examples`` does. The
server (:func:`secure_round`) gets their weighted mean — exactly what the sample-weighted mean combine rule makes of
the individual updates, up to SecAgg+'s quantisation:

    |Δ̂ − Δ| ≤ nodes · (2 · clipping_range / 2**quantization_bits) / Σ_nodes (weight / max_weight)

per coordinate (:func:`error_bound`; the stochastic rounding draws from NumPy's generator on each node, so a secure
run agrees with the plain one within that bound, not bit for bit).

Methods it serves: those whose upload is only shared parameters and the training loss (``Capabilities.private``);
the rest, a robust rule, the norm filter, DP-FedAvg and compression are refused by
:func:`hetfed.algorithms.build._check_secure` — each needs individual updates or something that does not sum.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import flwr.compat.common.recorddict_compat as compat
import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key

from hetfed.engine.types import Params, StreamedUpload, Upload

if TYPE_CHECKING:
    from hetfed.config import SecAggPlusConfig

#: the name of the training loss in the summed vector (after the shared parameters, in the broadcast's order)
LOSS = "train_loss"
#: what a node says in the clear beside its masked update: its clients, their sample counts, what it screened
META = "hetfed.upload"
#: the largest weight a node may send when the server does not know the partition (nodes with their own data)
FALLBACK_MAX_WEIGHT = 10_000.0


def error_bound(params: SecAggPlusConfig, weights: list[float], max_weight: float) -> float:
    """The most SecAgg+'s quantisation can move one coordinate of the weighted mean update: each node's quantised
    value is within one step (2·clip / 2**bits) of its weighted update, and the sum is divided by the nodes' total
    weight ratio (the modular arithmetic itself is exact)."""
    step = 2 * params.clipping_range / 2 ** params.quantization_bits
    return len(weights) * step / (sum(weights) / max_weight)


# ------------------------------------------------------------------------------------------------- the node


def node_reply(upload: Upload, reference: Params, max_weight: float) -> dict:
    """A node's reply to the SecAgg+ round's training message, in the form Flower's ``secaggplus_mod`` reads (a
    legacy ``FitRes``): the vector to be summed (the cohort's weighted mean update per shared parameter, then its
    mean training loss), its weight (training samples), and in the clear its clients, their counts, how many
    updates it screened out and its largest weighted coordinate (the server warns when the clipping range cut it). The
    mod masks the vector and drops it
    from the reply before anything leaves the node."""
    weights = upload.num_samples.detach().double().cpu()
    weight = float(weights.sum())
    if weight > max_weight:
        raise ValueError(f"flower.secaggplus.max_weight = {max_weight:g} is below this node's {weight:g} training "
                         "samples (SecAgg+ would overflow); expected at least the largest node's samples")
    # reduced on the node (train(reduce=True)); a plain upload only when the screening left no client: nothing
    mean = upload.mean if isinstance(upload, StreamedUpload) else {}
    vector = [(mean[k].detach().double().cpu() - v.detach().double().cpu()).numpy() if k in mean
              else np.zeros(tuple(v.shape)) for k, v in reference.items()]
    loss = upload.extra.get(LOSS)
    vector.append(np.array([float((loss.detach().double().cpu() * weights).sum() / weight)
                            if loss is not None and weight > 0 else 0.0]))
    meta = {"clients": [int(k) for k in upload.client_ids], "num_samples": [float(n) for n in weights],
            "screened": {k: int(v) for k, v in upload.screened.items()},
            "largest": max((float(np.abs(a).max()) for a in vector if a.size), default=0.0) * weight / max_weight}
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(vector), int(round(weight)), {META: json.dumps(meta)})
    return dict(compat.fitres_to_recorddict(fitres, keep_input=False))


def node_max_weight(context) -> float:
    """The ``max_weight`` this round's SecAgg+ set-up gave the node (kept in its context by ``secaggplus_mod``)."""
    return float(context.state.config_records[RECORD_KEY_STATE]["max_weight"])


# ----------------------------------------------------------------------------------------------- the server


def max_weight_for(params: SecAggPlusConfig, node_samples: list[float]) -> float:
    """``flower.secaggplus.max_weight``, or the largest node's training samples when the server knows them."""
    if params.max_weight is not None:
        return params.max_weight
    return max(node_samples) if node_samples and max(node_samples) > 0 else FALLBACK_MAX_WEIGHT


def secure_round(grid: Any, contents: dict[int, RecordDict], reference: Params, round: int,
                 params: SecAggPlusConfig, max_weight: float, timeout: float | None,
                 send: Callable[[Any, list[Message], float | None], list[Message]]
                 ) -> tuple[StreamedUpload | None, list[int], dict[str, Any]]:
    """One round's training under SecAgg+ on ``grid``: ``contents`` is each node's training message (hetfed's
    records); ``send`` pushes messages and pulls their replies (hetfed's polling).

    Returns the round's upload as the server may know it — the weighted mean of the nodes' models
    (θ_global + the unmasked mean update) and the clients' ids and counts, each client's ``train_loss`` the
    round's weighted mean — or None when the protocol stopped (too few nodes or live neighbours); the nodes whose
    update is in the sum; and what the exchanges told (``errors``: node → the reason of its error reply, any stage;
    ``largest``: the largest weighted update coordinate, against the clipping range)."""
    seen: dict[str, Any] = {"errors": {}, "largest": 0.0}
    strategy = _Strategy(sorted(contents), grid)
    workflow = _Workflow(params, max_weight, timeout, contents)
    context = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: round})
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()

    def exchange(messages: list[Message], timeout: float | None = None) -> list[Message]:
        replies = send(grid, messages, timeout)
        seen["errors"].update({r.metadata.src_node_id: str(r.error.reason or f"error code {r.error.code}")
                               for r in replies if r.has_error()})
        return replies

    workflow(_Polled(grid, exchange), LegacyContext(context, strategy=strategy))  # type: ignore[arg-type]
    if strategy.aggregate is None:
        return None, [], seen
    names = list(reference)
    if len(strategy.aggregate) != len(names) + 1:
        raise RuntimeError(f"SecAgg+ returned {len(strategy.aggregate)} arrays for {len(names)} parameters and the "
                           "training loss")
    ids: list[int] = []
    counts: list[float] = []
    screened: dict[str, int] = {}
    for meta in strategy.metas:
        ids += meta["clients"]
        counts += meta["num_samples"]
        for k, v in meta["screened"].items():
            screened[k] = screened.get(k, 0) + v
        seen["largest"] = max(seen["largest"], meta.get("largest", 0.0))
    mean = {}
    for k, delta in zip(names, strategy.aggregate, strict=False):
        ref = reference[k]
        value = ref.detach().double().cpu() + torch.as_tensor(np.asarray(delta, dtype=np.float64)).reshape(ref.shape)
        mean[k] = (value if ref.is_floating_point() else value.round()).to(ref.device, ref.dtype)
    loss = float(np.asarray(strategy.aggregate[-1]).reshape(-1)[0])
    order = sorted(range(len(ids)), key=ids.__getitem__)
    device = next(iter(reference.values())).device  # the server's: its uploads are summed there
    upload = StreamedUpload([ids[i] for i in order], {}, torch.tensor([counts[i] for i in order], device=device),
                            {LOSS: torch.full((len(ids),), loss, device=device)}, screened, mean)
    return upload, strategy.summed, seen


class _Polled:
    """The grid as Flower's workflow sees it: its ``send_and_receive`` is hetfed's (polling from 10 ms, every reply
    seen); everything else is the grid's."""

    def __init__(self, grid: Any, exchange: Callable[..., list]) -> None:
        self._grid, self._exchange = grid, exchange

    def send_and_receive(self, messages, *, timeout: float | None = None):
        return self._exchange(list(messages), timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


class _Workflow(SecAggPlusWorkflow):
    """Flower's ``SecAggPlusWorkflow`` with hetfed's training message in its collect stage (Flower's would send the
    legacy ``FitIns`` its strategy made; hetfed's nodes read hetfed's records)."""

    def __init__(self, params: SecAggPlusConfig, max_weight: float, timeout: float | None,
                 contents: dict[int, RecordDict]) -> None:
        super().__init__(params.num_shares, params.reconstruction_threshold, max_weight=max_weight,
                         clipping_range=params.clipping_range, quantization_range=2 ** params.quantization_bits,
                         modulus_range=2 ** params.modulus_bits, timeout=timeout)
        self.contents = contents

    def collect_masked_vectors_stage(self, grid, context, state) -> bool:  # type: ignore[no-untyped-def]
        # a copy per node: the stage adds its config record to the content it sends
        state.nid_to_fitins = {nid: RecordDict(dict(self.contents[nid])) for nid in state.nid_to_fitins}
        return super().collect_masked_vectors_stage(grid, context, state)


class _Strategy(Strategy):
    """The legacy strategy Flower's workflow asks: which nodes train (hetfed chose them), and the summed vector it
    hands back (kept here, with each node's clear-text ``META``)."""

    def __init__(self, nodes: list[int], grid: Any) -> None:
        self.nodes, self.grid = nodes, grid
        self.aggregate: list[np.ndarray] | None = None
        self.metas: list[dict] = []
        self.summed: list[int] = []

    def initialize_parameters(self, client_manager):  # type: ignore[no-untyped-def]
        return None

    def configure_fit(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
        return [(GridClientProxy(n, self.grid, 0), FitIns(Parameters([], ""), {})) for n in self.nodes]

    def aggregate_fit(self, server_round, results, failures):  # type: ignore[no-untyped-def]
        if results:  # every result carries the same unmasked sum
            self.aggregate = parameters_to_ndarrays(results[0][1].parameters)
            self.metas = [json.loads(str(res.metrics[META])) for _, res in results]
            self.summed = sorted(proxy.node_id for proxy, _ in results)
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
        return []

    def aggregate_evaluate(self, server_round, results, failures):  # type: ignore[no-untyped-def]
        return None, {}

    def evaluate(self, server_round, parameters):  # type: ignore[no-untyped-def]
        return None
