"""Token embedding → bidirectional LSTM → linear: FedMoE's text model, over a client axis.

Listo Zec, Mogren et al. train this on AG News (an embedding of 100, an LSTM of
64 per direction, a softmax output; the gate is the same network with one
sigmoid output, :class:`hetfed.models.mixture.Mixture` builds it).

Two ways to run the stack, the same numbers (tested against ``torch.nn.LSTM``),
chosen by device as the CNN's convolutions are (measured in
``benchmarks/bilstm.py``):

- on accelerators, a hand-written cell over stacked weights: the input
  projection of every time step is one batched matmul, and the recurrence one
  ``bmm`` per step in which the two directions are more rows of the client axis
  (``[2n, batch, H]``) — a step launches the same few kernels for 1 client or
  100, which is what a GPU needs (not yet measured on one: none was lent);
- on CPU, torch's fused LSTM kernel once per client (``functional_call`` with the
  client's weights, packed sequences): per training step (batch 32, 64 tokens,
  1 thread) the cell took 1.8× (1 client) to 3.5× (20 clients) as long, and this
  loop as long as plain ``nn.LSTM`` modules. ``vmap`` does not batch torch's LSTM.

Padding (id 0, at the end of each text) is exact, as ``pack_padded_sequence``
is: a padded step leaves the state as it was (``torch.where``, not a blend), the
backward direction reads each text's real tokens in reverse, and the features
are the two directions' last real states — so a text's logits do not depend on
how much padding its batch has, and one client run alone or in a stack gives
the same numbers. A text without a single word has features 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence

from hetfed.models.base import Model, Noise, Params, ParamSpec, dense, dropout, fan_in_init

DIRECTIONS = ("forward", "backward")


def _normal_init(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """N(0, 1), ``nn.Embedding``'s default."""
    return torch.randn(shape, generator=gen)


class BiLSTM(Model):
    no_compile = ("its forward reads the batch's longest text from the data on the host, which torch.compile does "
                  "not trace")

    def __init__(self, max_length: int, vocab_size: int, n_classes: int, embedding_dim: int = 100,
                 hidden: int = 64, dropout: float = 0.0):
        self.max_length, self.vocab_size, self.n_classes = max_length, vocab_size, n_classes
        self.embedding_dim, self.hidden, self.p = embedding_dim, hidden, dropout
        cell = fan_in_init(hidden)  # torch.nn.LSTM's default: U(±1/√H)
        self._specs = [ParamSpec("embedding", (vocab_size, embedding_dim), _normal_init)]
        for d in DIRECTIONS:  # torch's layout and gate order (i, f, g, o); one bias (torch's two only add up)
            self._specs += [
                ParamSpec(f"{d}.w_ih", (4 * hidden, embedding_dim), cell),
                ParamSpec(f"{d}.w_hh", (4 * hidden, hidden), cell),
                ParamSpec(f"{d}.bias", (4 * hidden,), cell),
            ]
        self._specs += [
            ParamSpec("out.weight", (2 * hidden, n_classes), fan_in_init(2 * hidden)),
            ParamSpec("out.bias", (n_classes,), fan_in_init(2 * hidden)),
        ]
        self._lstm = torch.nn.LSTM(embedding_dim, hidden, bidirectional=True, batch_first=True)  # a shape only

    def specs(self) -> list[ParamSpec]:
        return self._specs

    @property
    def head_names(self) -> tuple[str, ...]:
        return ("out.weight", "out.bias")

    @property
    def latent_dim(self) -> int:
        return 2 * self.hidden

    def features(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        """The two directions' last real states, ``[n, batch, 2H]``."""
        ids = x.long()
        n, b, _ = ids.shape
        lengths = (ids != 0).sum(-1)  # [n, b]
        steps = int(lengths.max()) if ids.numel() else 0
        if steps == 0:  # not one word in the stack: nothing to read
            return x.new_zeros(n, b, 2 * self.hidden)
        ids = ids[..., :steps]
        run = self.fused if x.device.type == "cpu" else self.stacked
        return dropout(run(params, ids, lengths), self.p, noise)

    def fused(self, params: Params, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """torch's LSTM kernel once per client, on packed sequences."""
        out = []
        # unbind, not p[k]: indexing a stack n times would back-propagate n zero-filled stacks (the embedding's!)
        per_client = {name: p.unbind(0) for name, p in params.items()}
        zeros = torch.zeros(4 * self.hidden, device=ids.device)
        for k in range(ids.shape[0]):
            tokens = F.embedding(ids[k], per_client["embedding"][k])
            packed = pack_padded_sequence(tokens, lengths[k].clamp(min=1).cpu(), batch_first=True,
                                          enforce_sorted=False)
            weights: dict[str, torch.Tensor] = {}
            for d, suffix in zip(DIRECTIONS, ("", "_reverse"), strict=True):
                weights |= {f"weight_ih_l0{suffix}": per_client[f"{d}.w_ih"][k],
                            f"weight_hh_l0{suffix}": per_client[f"{d}.w_hh"][k],
                            f"bias_ih_l0{suffix}": per_client[f"{d}.bias"][k], f"bias_hh_l0{suffix}": zeros}
            _, (h, _) = functional_call(self._lstm, weights, (packed,))
            out.append(torch.cat([h[0], h[1]], -1))
        return torch.where((lengths > 0).unsqueeze(-1), torch.stack(out), 0.0)  # an empty text read one pad

    def stacked(self, params: Params, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """A hand-written cell, every client and both directions in one ``bmm`` per time step."""
        n, b, steps = ids.shape
        real = ids != 0
        # the backward direction reads each text's real tokens last to first; padding stays at the end
        t = torch.arange(steps, device=ids.device)
        backward_ids = torch.where(real, ids.gather(-1, (lengths.unsqueeze(-1) - 1 - t).clamp(min=0)), ids)
        offset = (torch.arange(n, device=ids.device) * self.vocab_size)[:, None, None]
        table = params["embedding"].reshape(n * self.vocab_size, -1)
        tokens = F.embedding(torch.cat([ids + offset, backward_ids + offset]), table)  # [2n, b, T, E]
        w_ih = torch.cat([params[f"{d}.w_ih"] for d in DIRECTIONS]).transpose(1, 2)
        w_hh = torch.cat([params[f"{d}.w_hh"] for d in DIRECTIONS]).transpose(1, 2)
        bias = torch.cat([params[f"{d}.bias"] for d in DIRECTIONS])
        gates_x = dense(tokens.reshape(2 * n, b * steps, -1), w_ih, bias).reshape(2 * n, b, steps, -1)
        mask = torch.cat([real, real]).unsqueeze(-1)  # [2n, b, T, 1]
        h = gates_x.new_zeros(2 * n, b, self.hidden)
        c = torch.zeros_like(h)
        for step in range(steps):
            g = gates_x[:, :, step] + torch.bmm(h, w_hh)
            i, f, cand, o = g.chunk(4, -1)
            c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(cand)
            h_next = torch.sigmoid(o) * torch.tanh(c_next)
            on = mask[:, :, step]
            c, h = torch.where(on, c_next, c), torch.where(on, h_next, h)
        return torch.cat([h[:n], h[n:]], -1)

    def head(self, params: Params, z: torch.Tensor) -> torch.Tensor:
        return dense(z, params["out.weight"], params["out.bias"])

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return self.head(params, self.features(params, x, noise))

    def activation_floats(self, batch: int) -> int:
        # per step and direction: the embedded token, the 4H gates, c and h (kept for backward)
        return 3 * batch * self.max_length * 2 * (self.embedding_dim + 6 * self.hidden)
