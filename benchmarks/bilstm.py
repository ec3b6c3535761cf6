"""How to vectorise the BiLSTM over clients: three ways, one training step, measured in one run.

One step = forward + cross-entropy + backward for ``n`` clients, each with its own
weights and a batch of token ids (lengths drawn 8…L, padding at the end):

- ``cell``: :meth:`hetfed.models.bilstm.BiLSTM.stacked` — a hand-written cell,
  both directions and every client in one ``bmm`` per time step (hetfed's path on
  accelerators);
- ``fused``: :meth:`~hetfed.models.bilstm.BiLSTM.fused` — torch's fused LSTM kernel
  once per client with that client's slice of the stack (hetfed's path on CPU);
- ``nn_modules``: one plain ``torch.nn.LSTM`` + ``nn.Embedding`` + ``nn.Linear`` per
  client in a Python loop (the floor: what the fused path costs without stacking).

Prints seconds per step and the ratios to ``cell`` as JSON. Not a test.

    python benchmarks/bilstm.py [--clients 1 5 20 50] [--batch 32] [--length 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hetfed.models.bilstm import BiLSTM


def _data(n: int, batch: int, length: int, vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(2, vocab, (n, batch, length), generator=gen)
    lengths = torch.randint(8, length + 1, (n, batch), generator=gen)
    ids[torch.arange(length) >= lengths[..., None]] = 0
    return ids.float(), torch.randint(0, 4, (n, batch), generator=gen)


def _params(model: BiLSTM, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {s.name: torch.stack([s.init(gen, s.shape) for _ in range(n)]).requires_grad_() for s in model.specs()}


def through(path: str, model: BiLSTM, params, x, y) -> None:
    ids = x.long()
    z = getattr(model, path)(params, ids, (ids != 0).sum(-1))
    loss = torch.nn.functional.cross_entropy(model.head(params, z).flatten(0, 1), y.flatten())
    loss.backward()


def nn_modules(lstms, heads, embeddings, x, y) -> None:
    for k, (lstm, head, emb) in enumerate(zip(lstms, heads, embeddings, strict=True)):
        ids = x[k].long()
        lengths = (ids != 0).sum(-1)
        packed = torch.nn.utils.rnn.pack_padded_sequence(emb(ids), lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = lstm(packed)
        loss = torch.nn.functional.cross_entropy(head(torch.cat([h[0], h[1]], -1)), y[k])
        loss.backward()


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def measure(n: int, batch: int, length: int, vocab: int = 10_000, repeats: int = 3) -> dict:
    gen = torch.Generator().manual_seed(0)
    model = BiLSTM(length, vocab, 4, 100, 64)
    params = _params(model, n, gen)
    x, y = _data(n, batch, length, vocab, gen)
    lstms = [torch.nn.LSTM(100, 64, bidirectional=True, batch_first=True) for _ in range(n)]
    heads = [torch.nn.Linear(128, 4) for _ in range(n)]
    embeddings = [torch.nn.Embedding(vocab, 100) for _ in range(n)]
    out = {
        "clients": n,
        "cell_s": _time(lambda: through("stacked", model, params, x, y), repeats),
        "fused_s": _time(lambda: through("fused", model, params, x, y), repeats),
        "nn_modules_s": _time(lambda: nn_modules(lstms, heads, embeddings, x, y), repeats),
    }
    out["fused_over_cell"] = out["fused_s"] / out["cell_s"]
    out["nn_modules_over_cell"] = out["nn_modules_s"] / out["cell_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 5, 20, 50])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [measure(n, args.batch, args.length) for n in args.clients]
    print(json.dumps({"batch": args.batch, "length": args.length, "threads": torch.get_num_threads(),
                      "steps": rows}, indent=1))


if __name__ == "__main__":
    main()
