"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic controlled averaging for FL"), Algorithm 1.

Server state: the model x and the server control variate c. Client i keeps its own
control variate c_i (client-local state: it never leaves the client). In round r a
sampled client starts from y_i = x and takes K_i local steps

    y_i ← y_i − η_l (g_i(y_i) − c_i + c)

(the correction ``c − c_i`` is added to each step's gradient, the gradient of the linear term ⟨c − c_i, y⟩:
a :class:`~hetfed.engine.local.Proximal` term's shift, so the step stays plain; with ``optimizer.momentum`` > 0
the corrected gradient goes through momentum as any gradient does). Then

    option II (default):  c_i⁺ = c_i − c + (x − y_i) / (K_i η_l)
    option I:             c_i⁺ = ∇f_i(x), the full gradient of its training loss at x

and it uploads y_i and Δc_i = c_i⁺ − c_i. The server:

    x ← x + η_g · (Σ_i w_i y_i − x)   with w_i ∝ n_i  (hetfed's FedAvg weighting)
    c ← c + (1/N) Σ_i Δc_i             (N: every client of the federation)

Differences from the paper, said in docs/methods.md: Algorithm 1 averages Δy_i
uniformly over the sampled clients; hetfed weights them by sample counts like its
FedAvg (equal client sizes make the two the same). Δc_i travels as
Δc_i / n_i in the upload's parameters, so the round's sum streams like the model
(Σ n_i · (Δc_i / n_i) = Σ Δc_i) whatever the number of clients.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.local import Proximal, row_cross_entropy
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    ServerState,
    StreamedUpload,
    Upload,
    beside_model,
    padded_rows,
    split_state,
    take_rows,
)
from hetfed.interface import server_step
from hetfed.models.base import prefixed, without

#: client state: the client's control variate per shared parameter
CI = "scaffold.c."
#: upload: Δc_i / n_i per shared parameter (summed by the server)
DC = "scaffold.dc."
#: broadcast extra: the server control variate per shared parameter
C = "scaffold.c."
#: option I's full gradient reads at most this many input and activation floats in one pass over its clients' rows
FULL_GRADIENT_FLOATS = 50_000_000


def effective_steps(k: int, opt) -> float:
    """How many plain-SGD steps of size η the K local steps amount to (option II divides by K·η).

    Plain SGD: K. Heavy-ball momentum β with the buffer reset each round moves a
    constant gradient by η·[K − β(1 − β^K)/(1 − β)]/(1 − β) in K steps (exact for a
    constant gradient; K = 1 gives 1); with the buffer kept across rounds, its steady
    state K/(1 − β). Adam has no such factor: K (SCAFFOLD is defined for SGD).
    """
    beta = opt.momentum if opt.kind == "sgd" else 0.0
    if beta == 0.0:
        return float(k)
    if not opt.reset_each_round:
        return k / (1 - beta)
    return (k - beta * (1 - beta**k) / (1 - beta)) / (1 - beta)


class ScaffoldParams(AlgorithmParams):
    option: Literal[1, 2] = Field(
        2, description="the client control-variate update: 2 (the paper's cheaper default, from the model change) "
        "or 1 (the full local gradient at the server model)"
    )


class Scaffold(FedAvg):
    """FedAvg with server and client control variates (see the module docstring)."""

    n_clients: int | None = None

    def server_init(self, gen: torch.Generator) -> ServerState:
        params = self.model.init_shared(gen)
        return ServerState(params, 0, {"c": {k: torch.zeros_like(v) for k, v in params.items()}})

    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        super().bind(fed, seed, per_round)
        self.n_clients = fed.n_clients  # N in c ← c + (1/N) Σ Δc_i: every client of the federation

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        c = beside_model(state.extra.get("c"), state.params)
        return Broadcast(bc.params, bc.round, bc.lr, {**bc.extra, **prefixed(c, C)})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        state = super().client_init(client_id, gen)
        shapes = {s.name: s.shape for s in self.model.specs() if not s.local}
        return {**state, **{CI + k: torch.zeros(shape) for k, shape in shapes.items()}}

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        names = list(bc.params)
        c = {k: bc.extra_rows(C + k, n) for k in names}  # each client its own run's c (a stacked sweep)
        c_i = {k: states[CI + k] for k in names}
        rest = without(states, CI)
        x = bc.stacked(n)
        local, kept_opt = split_state(rest)
        # ⟨c − c_i, y⟩ per client, whose gradient is the SCAFFOLD correction: a shift of the step's gradients
        correction = Proximal({}, 0.0, {k: (c[k] - c_i[k]).detach() for k in names})

        option_one = self.params.option == 1
        full_grad = self._full_gradient({**x, **local}, data, names) if option_one else None
        params, opt_state, loss = train_clients(self, {**x, **local}, kept_opt, data, bc.lr, correction)
        steps = torch.tensor([effective_steps(self.schedule.n_steps(len(i)), self.train.optimizer)
                              for i in data.indices], dtype=torch.float32, device=loss.device)
        sizes = data.sizes(loss.device)
        new_c, dc = {}, {}
        for k in names:
            if full_grad is not None:  # option I
                new_c[k] = full_grad[k]
            else:
                shape = (n, *([1] * (x[k].dim() - 1)))
                new_c[k] = c_i[k] - c[k] + (x[k] - params[k]) / (steps.view(shape) * bc.lr)
            dc[DC + k] = (new_c[k] - c_i[k]) / sizes.view(n, *([1] * (x[k].dim() - 1)))
        upload = Upload(list(data.client_ids), {**{k: params[k] for k in names}, **dc}, sizes, {"train_loss": loss})
        kept = {k: params[k] for k in local}
        return upload, {**kept, **opt_state, **{CI + k: new_c[k].detach() for k in names}}

    def _full_gradient(self, params, data: ClientData, names: list[str]) -> dict[str, torch.Tensor]:
        """Option I: each client's gradient of its mean training loss at the server model, over all its data: in
        passes of at most :data:`FULL_GRADIENT_FLOATS` inputs and activations, each pass the clients' next rows, the
        passes' gradients summed; one pass where it fits, as before. (All at once, cnn4 on PFLlib's Fashion-MNIST
        split padded 20 clients to 6 748 rows: its first convolution's output alone was 10 GB.)"""
        n = len(data.client_ids)
        sizes = [len(i) for i in data.indices]
        width = max(sizes, default=0)
        features = data.x[0].numel() if len(data.x) else 0
        per_row = n * (self.model.activation_floats(1) + features)  # a row of every client
        rows = max(1, min(width, int(FULL_GRADIENT_FLOATS // max(per_row, 1))))
        leaves = {k: v.detach().clone().requires_grad_(k in names) for k, v in params.items()}
        counts = torch.tensor(sizes, dtype=torch.float32, device=data.x.device).clamp(min=1)
        index, real = padded_rows(list(data.indices), data.x.device)
        total: dict[str, torch.Tensor] = {}
        for start in range(0, index.shape[1], rows):
            cols = slice(start, start + rows)
            logits = self.model.forward(leaves, take_rows(data.x, index[:, cols]), None)
            ce = row_cross_entropy(logits, take_rows(data.y, index[:, cols]))
            per_client = (ce.view(n, -1) * real[:, cols]).sum(1) / counts
            grads = torch.autograd.grad(per_client.sum(), [leaves[k] for k in names])
            for k, g in zip(names, grads, strict=True):
                total[k] = g if k not in total else total[k] + g
        return {k: g.detach() for k, g in total.items()}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        names = list(state.params)
        params, extra = server_step(self, state, upload)
        total = upload.num_samples.sum()
        n_clients = self.n_clients or len(upload.client_ids)
        c = beside_model(state.extra.get("c"), params)
        new_c = {}
        for k in names:
            if isinstance(upload, StreamedUpload):
                summed = upload.mean[DC + k] * total
            else:
                summed = torch.tensordot(upload.num_samples.to(upload.params[DC + k].dtype), upload.params[DC + k],
                                         dims=1)
            new_c[k] = c[k] + summed / n_clients
        return ServerState(params, state.round + 1, {**extra, "c": new_c})


register(AlgorithmSpec(
    "scaffold", Scaffold, "FedAvg with control variates that correct the clients' drift",
    "Karimireddy et al. 2020, SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ScaffoldParams,
    Capabilities(uploads="shared parameters, sample count, training loss, control-variate change Δc_i",
                 stacks_runs=True, compact_steps=True),
    legacy_train={"scaffold_option": "option"},
    privacy=(
        PrivacyRow(
            method="SCAFFOLD",
            config="`algorithm: scaffold`",
            params="shared model parameters, and `scaffold.dc.<name>`: the change of the client's control variate Δc_i "
                   "= c_i⁺ − c_i (divided by its sample count, so the server's sum streams)",
            extra="`train_loss`",
            stays="data; its control variate c_i; optimiser state when kept",
        ),
    ),
    family="heterogeneity-specific", venue="ICML 2020",
))
