"""FedAS (Yang, Huang, Ye 2024, "FedAS: Bridging Inconsistency in Personalized Federated Learning", CVPR), as
PFLlib's ``clientas`` / ``serveras``.

Each client keeps its classifier head; the body (every other layer) is shared. Two steps against the
inconsistency between the global body and a client's own:

- **Parameter alignment**: before training, the client computes its class prototypes — the mean representation
  of each class under *its own* previous model — and fits the received global body to them: one pass of plain SGD
  (``params.align_lr`` 0.01, batches of ``params.align_batch`` 16, PFLlib's fixed values) on
  ``Σ_c MSE(z_c, p_c)``, z_c the global body's representations of the batch's samples of class c and p_c the
  client's prototype (the mean squared error over those rows and the representation's width, summed over the
  batch's classes). The aligned body with the client's own head is what it trains, with the run's local SGD.
- **Client synchronisation**: after training, the client measures how much its data says about its parameters —
  the trace of the empirical Fisher information, ``Σ_batches Σ_θ ‖∇_θ NLL(batch)‖²`` (mean NLL of a batch of B of
  its training samples, the model in evaluation mode) — and the server averages the bodies weighted by those
  traces instead of by sample counts (through the server pipeline).

Differences from PFLlib: the Fisher trace runs over the client's samples in order, its last short batch included
(PFLlib's loader shuffles and drops it), and a client that never trained aligns to the prototypes of the initial
model (PFLlib's too: its clients start from one copy of the global model).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.algorithms._personal import PartlyPersonal, head_of, initial_model, second_pass
from hetfed.algorithms.fedavg import train_clients
from hetfed.algorithms.fedproto import client_prototypes
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.config import OptimizerConfig
from hetfed.engine.local import StackObjective, row_cross_entropy, train_stack
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    ServerState,
    Upload,
    index_on,
    split_state,
    take_rows,
)
from hetfed.interface import server_step
from hetfed.models.base import Model, Noise

#: the client's body after its last round (its prototypes' model) ``fedas.body.<name>``
PREVIOUS = "fedas.body."


class FedASParams(AlgorithmParams):
    align_lr: float = Field(0.01, gt=0, description="the alignment pass's SGD learning rate (PFLlib's 0.01)")
    align_batch: int = Field(16, ge=1, description="the alignment pass's batch size (PFLlib's 16)")


def alignment_loss(z: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, prototypes: torch.Tensor,
                   known: torch.Tensor) -> torch.Tensor:
    """Each client's ``Σ_c mean_{i: y_i = c} mean_d (z_i − p_c)²`` [n] over the batch's classes that have a
    prototype (``z`` [n, b, d], ``y``/``mask`` [n, b], ``prototypes`` [n, C, d], ``known`` [n, C])."""
    n_classes = prototypes.shape[1]
    target = torch.gather(prototypes, 1, y[..., None].expand(*y.shape, prototypes.shape[-1]))  # [n, b, d]
    rows = ((z - target) ** 2).mean(-1)  # [n, b]
    onehot = F.one_hot(y, n_classes).to(z.dtype) * mask[..., None]  # [n, b, C]
    counts = onehot.sum(1)  # [n, C]
    per_class = (onehot * rows[..., None]).sum(1) / counts.clamp(min=1)
    return (per_class * ((counts > 0) & known).to(z.dtype)).sum(1)


def _batches(data: ClientData, batch: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The clients most batches first (ties in order), and their training indices in batches of ``batch`` in that
    order, padded: ``[n, T, batch]`` pool rows (0 at padding) and their real rows' count in each batch ``[n, T]``.
    Built in numpy at once (a batch's rows copied into torch one client at a time cost ~10 µs each, every batch)."""
    sizes = np.array([len(i) for i in data.indices], dtype=np.int64)
    counts = -(-sizes // batch)  # each client's batches
    order = sorted(range(len(sizes)), key=lambda k: -counts[k])
    steps = int(counts.max()) if len(sizes) else 0
    rows = np.zeros((len(order), steps * batch), dtype=np.int64)
    for at, k in enumerate(order):
        rows[at, : sizes[k]] = data.indices[k]
    real = np.clip(sizes[order][:, None] - np.arange(steps)[None, :] * batch, 0, batch)
    return order, rows.reshape(len(order), steps, batch), real


def fisher_trace(model: Model, params: Params, data: ClientData, batch: int) -> torch.Tensor:
    """Each client's ``Σ_batches Σ_θ ‖∇_θ mean NLL(batch)‖²`` [n] over its training samples (no dropout).

    The clients are taken most batches first, so the ones that still have a batch ``t`` are the first ``m``: each
    pass computes only those (the stack padded to its longest client computed ~3× the batches there are on a
    Dirichlet split)."""
    n = len(data.client_ids)
    order, batches, real = _batches(data, batch)
    rows = index_on(order, data.x.device)
    leaves = {k: v.detach().index_select(0, rows).requires_grad_(True) for k, v in params.items()
              if v.is_floating_point()}
    fixed = {k: v.index_select(0, rows) for k, v in params.items() if k not in leaves}
    out = torch.zeros(n, device=data.x.device)
    for t in range(real.shape[1]):
        m = int((real[:, t] > 0).sum())
        width = int(real[:m, t].max())
        index = torch.from_numpy(np.ascontiguousarray(batches[:m, t, :width]))
        mask = torch.from_numpy((np.arange(width)[None, :] < real[:m, t, None]).astype(np.float32))
        index, mask = index.to(data.x.device, non_blocking=True), mask.to(data.x.device, non_blocking=True)
        xb, yb = take_rows(data.x, index), take_rows(data.y, index).long()
        with torch.enable_grad():
            active = {k: v[:m] for k, v in leaves.items()}
            logits = model.forward({**{k: v[:m] for k, v in fixed.items()}, **active}, xb, None)
            nll = row_cross_entropy(logits, yb)
            per_client = (nll * mask).sum(1) / mask.sum(1).clamp(min=1)  # each client's batch mean
            grads = torch.autograd.grad(per_client.sum(), list(active.values()), allow_unused=True)
        out[:m] += sum(g.reshape(m, -1).pow(2).sum(1) for g in grads if g is not None)
    return torch.empty_like(out).index_copy_(0, rows, out)


class FedAS(PartlyPersonal):
    """Personal heads; the global body aligned to each client's prototypes; bodies averaged by Fisher trace."""

    def personal_names(self) -> tuple[str, ...]:
        return head_of(self.model, self.spec.name)

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        start = initial_model(self)
        return {**super().client_init(client_id, gen), **{PREVIOUS + k: start[k].clone() for k in self._body}}

    def _alignment_loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
                        inputs: Params) -> torch.Tensor:
        """The alignment pass's loss over each client's own prototypes and which classes have one (``inputs``,
        declared: its steps are recorded and compute only the clients still aligning)."""
        z = self.model.features(params, xb, noise)
        return alignment_loss(z, yb.long(), mask, inputs["prototypes"], inputs["known"])

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        previous = {k: local.pop(PREVIOUS + k) for k in self._body}
        prototypes, counts = client_prototypes(self.model, {**previous, **local}, data)
        p = self.params
        align = self.schedule.extra_pass(p.align_batch)
        plain = OptimizerConfig(kind="sgd", lr=p.align_lr, momentum=0.0)
        aligned, _, _ = train_stack(self.model, {**bc.stacked(n), **local}, second_pass(data, 1), align, plain,
                                    p.align_lr, trainable=list(self._body),
                                    objective=StackObjective(self._alignment_loss,
                                                             {"prototypes": prototypes, "known": counts > 0}))
        params, opt_state, loss = train_clients(self, {**{k: aligned[k] for k in self._body}, **local}, kept_opt,
                                                data, bc.lr)
        trace = fisher_trace(self.model, params, data, self.schedule.batch_size)
        upload = Upload(list(data.client_ids), {k: params[k] for k in bc.params}, data.sizes(loss.device),
                        {"train_loss": loss, "fisher_trace": trace.to(loss.device)})
        kept = {**{k: params[k] for k in local}, **{PREVIOUS + k: params[k] for k in self._body}}
        return upload, {**kept, **opt_state}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """The bodies weighted by the clients' Fisher traces (by sample counts if every trace is 0)."""
        params, extra = server_step(self, state, upload.weighted_by("fisher_trace"))
        return ServerState(params, state.round + 1, extra)


register(AlgorithmSpec(
    "fedas", FedAS, "personal heads; each client aligns the global body to its own class prototypes before "
                    "training, and the server averages bodies weighted by the clients' Fisher information",
    "Yang et al. 2024, FedAS: Bridging Inconsistency in Personalized Federated Learning", FedASParams,
    Capabilities(uploads="shared parameters of the body, sample count, training loss, the trace of its Fisher "
                         "information", personalises=True, stacks_runs=True, whole_model=False, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="FedAS",
            config="`algorithm: fedas`",
            params="the body: every layer but the classifier head",
            extra="`train_loss`, `fisher_trace` (the trace of its empirical Fisher information)",
            stays="data; its head; its class prototypes and last body; optimiser state when kept",
        ),
    ),
    family="personalised", venue="CVPR 2024",
))
