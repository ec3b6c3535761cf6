"""McMahan et al.'s character LSTM for Shakespeare, over a client axis.

"The model takes a series of characters as input and embeds each of these into a learned
8 dimensional space. The embedded characters are then processed through 2 LSTM layers, each
with 256 nodes. Finally the output of the second LSTM layer is sent to a softmax output layer
with one node per character" (McMahan et al. 2017, §3; LEAF's ``stacked_lstm.py`` predicts
the next character from the last step's output, as here). Widths and depth are
``model.embedding_dim`` / ``model.lstm_hidden`` / ``model.lstm_layers``.

Two ways to run the stack, the same numbers (tested against each other), chosen by device as
the BiLSTM's are: on CPU torch's fused LSTM kernel once per client (``functional_call`` with
the client's weights); on accelerators a hand-written cell in which every client is a slice
of one ``bmm`` per layer and step. Windows are always full (80 characters, no padding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call

from hetfed.models.base import Model, Noise, Params, ParamSpec, dense, dropout, fan_in_init
from hetfed.models.bilstm import _normal_init


class CharLSTM(Model):
    reads_rows = True  # packs each client's real rows
    no_compile = "its layers run torch's fused LSTM, which torch.compile does not trace"

    def __init__(self, window: int, vocab_size: int, n_classes: int, embedding_dim: int = 8, hidden: int = 256,
                 layers: int = 2, dropout: float = 0.0):
        self.window, self.vocab_size, self.n_classes = window, vocab_size, n_classes
        self.embedding_dim, self.hidden, self.layers, self.p = embedding_dim, hidden, layers, dropout
        cell = fan_in_init(hidden)  # torch.nn.LSTM's default: U(±1/√H)
        self._specs = [ParamSpec("embedding", (vocab_size, embedding_dim), _normal_init)]
        for layer in range(layers):  # torch's layout and gate order (i, f, g, o); one bias (torch's two only add up)
            width = embedding_dim if layer == 0 else hidden
            self._specs += [
                ParamSpec(f"lstm{layer}.w_ih", (4 * hidden, width), cell),
                ParamSpec(f"lstm{layer}.w_hh", (4 * hidden, hidden), cell),
                ParamSpec(f"lstm{layer}.bias", (4 * hidden,), cell),
            ]
        self._specs += [
            ParamSpec("out.weight", (hidden, n_classes), fan_in_init(hidden)),
            ParamSpec("out.bias", (n_classes,), fan_in_init(hidden)),
        ]
        self._lstm = torch.nn.LSTM(embedding_dim, hidden, num_layers=layers, batch_first=True)  # a shape only

    def specs(self) -> list[ParamSpec]:
        return self._specs

    @property
    def head_names(self) -> tuple[str, ...]:
        return ("out.weight", "out.bias")

    @property
    def latent_dim(self) -> int:
        return self.hidden

    def features(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        """The top layer's state after the window's last character, ``[n, batch, H]``."""
        ids = x.long()
        if ids.shape[1] == 0:
            return x.new_zeros(ids.shape[0], 0, self.hidden)
        if x.device.type == "cpu":
            return dropout(self.fused(params, ids, noise.rows if noise is not None else None), self.p, noise)
        return dropout(self.stacked(params, ids), self.p, noise)

    def fused(self, params: Params, ids: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        """torch's LSTM kernel once per client, on its real rows only (``rows``: per client, in training).

        A stack pads every client's batch to the largest (a FedSGD step of a Shakespeare role of 6 667
        windows next to roles of 12): the padding rows' features are zeros — the loss masks them —
        instead of 80 LSTM steps each.
        """
        out = []
        b = ids.shape[1]
        # unbind, not p[k]: indexing a stack n times would back-propagate n zero-filled stacks
        per_client = {name: p.unbind(0) for name, p in params.items()}
        zeros = torch.zeros(4 * self.hidden, device=ids.device)
        for k in range(ids.shape[0]):
            weights: dict[str, torch.Tensor] = {}
            for layer in range(self.layers):
                weights |= {f"weight_ih_l{layer}": per_client[f"lstm{layer}.w_ih"][k],
                            f"weight_hh_l{layer}": per_client[f"lstm{layer}.w_hh"][k],
                            f"bias_ih_l{layer}": per_client[f"lstm{layer}.bias"][k], f"bias_hh_l{layer}": zeros}
            real = b if rows is None else int(rows[k])
            if real == 0:  # a finished client in this step: nothing to read
                out.append(ids.new_zeros(b, self.hidden, dtype=per_client["out.weight"][k].dtype))
                continue
            chars = F.embedding(ids[k, :real], per_client["embedding"][k])
            _, (h, _) = functional_call(self._lstm, weights, (chars,))
            out.append(F.pad(h[-1], (0, 0, 0, b - real)) if real < b else h[-1])
        return torch.stack(out)

    def stacked(self, params: Params, ids: torch.Tensor) -> torch.Tensor:
        """A hand-written cell: every client in one ``bmm`` per layer and time step."""
        n, b, steps = ids.shape
        offset = (torch.arange(n, device=ids.device) * self.vocab_size)[:, None, None]
        table = params["embedding"].reshape(n * self.vocab_size, -1)
        seq = F.embedding(ids + offset, table)  # [n, b, T, E]
        for layer in range(self.layers):
            w_ih = params[f"lstm{layer}.w_ih"].transpose(1, 2)
            w_hh = params[f"lstm{layer}.w_hh"].transpose(1, 2)
            gates_x = dense(seq.reshape(n, b * steps, -1), w_ih, params[f"lstm{layer}.bias"]).reshape(n, b, steps, -1)
            h = gates_x.new_zeros(n, b, self.hidden)
            c = torch.zeros_like(h)
            outputs = []
            for step in range(steps):
                i, f, cand, o = (gates_x[:, :, step] + torch.bmm(h, w_hh)).chunk(4, -1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(cand)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            seq = torch.stack(outputs, 2)
        return h

    def head(self, params: Params, z: torch.Tensor) -> torch.Tensor:
        return dense(z, params["out.weight"], params["out.bias"])

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return self.head(params, self.features(params, x, noise))

    def activation_floats(self, batch: int) -> int:
        # per step and layer: the input, the 4H gates, c and h (kept for backward)
        return 3 * batch * self.window * self.layers * (self.embedding_dim + 6 * self.hidden)
