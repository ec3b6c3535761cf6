"""LoRA adapters of many clients over one frozen encoder: hetfed's stack against peft's per-client loop, one run.

One training step = forward + cross-entropy + backward + an Adam update of the adapters and head, for ``n`` clients,
each with its own adapters and a batch of token ids (lengths drawn 8…L, padding at the end):

- ``stacked``: :class:`hetfed.models.lora.LoRAEncoder` — the base once over the stack's ``n·B`` texts, each client's
  adapters applied to its own rows by batched matmuls (what the vectorised executor runs);
- ``peft_loop``: one ``peft`` LoRA model per client (the same frozen base shared, its own adapters and head), the
  clients one after another — what a per-client PEFT loop (FlowerTune's ClientApp, one client at a time) computes.

- ``--from-layer K``: also the stack adapting only the layers from K up (``model.from_layer``), the layers below run
  once per distinct text and kept — the steady state of every epoch after the first, which revisits the same texts —
  against peft's loop adapting the same layers (``layers_to_transform``), which runs the whole base every step.

Both get the same weights; the losses are checked to agree. Prints seconds per step, the ratio, and the bytes of
the adapters and heads (what a stack holds beside the base) as JSON. Not a test.

- ``--memory``: instead of timing, each way's first step in a process of its own — the resident memory it adds to
  the process (the highest RSS sampled during the step, less the RSS before it: the step's working set, activations
  and gradients and the optimiser's state, beside the base loaded before), against the base's and the adapters'
  bytes.

    python benchmarks/lora_clients.py [--clients 1 5 20] [--batch 16] [--length 64] [--rank 8] [--threads 1] \
        [--path DIR] [--from-layer K] [--memory]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F


@functools.cache
def _tokenizer(path: str):
    """The encoder's tokenizer, read from its folder once (every row of a run draws its texts with it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _data(n: int, batch: int, length: int, path: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n clients' batches of texts as the encoder's tokenizer numbers them: its [CLS], ids above its special tokens'
    (MiniLM's ids 1000 and up were fixed here: a smaller vocabulary has none), its padding after each text's length
    (8…L); labels 0/1."""
    tokenizer = _tokenizer(path)
    ids = torch.randint(max(tokenizer.all_special_ids) + 1, len(tokenizer), (n, batch, length), generator=gen)
    ids[..., 0] = tokenizer.cls_token_id
    lengths = torch.randint(8, length + 1, (n, batch), generator=gen)
    ids[torch.arange(length) >= lengths[..., None]] = tokenizer.pad_token_id
    return ids.float(), torch.randint(0, 2, (n, batch), generator=gen)


def stacked_step(model, params, opt, x, y) -> float:
    logits = model.forward(params, x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
    loss = loss.view(y.shape).mean(1).sum()  # each client's mean, summed: each client's own gradient
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss)


def peft_models(path: str, model, params, n: int, rank: int, alpha: float, from_layer: int = 0):
    """n peft LoRA models over one shared base, each given client k's adapters and head; ``from_layer``: adapters on
    the encoder's layers from this one up only (peft's ``layers_to_transform``), as ``model.from_layer``."""
    import peft
    from transformers import AutoModel

    base = AutoModel.from_pretrained(path)
    base.requires_grad_(False)
    layers = list(range(from_layer, base.config.num_hidden_layers)) if from_layer else None
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(model.targets),
                             layers_to_transform=layers)
    wrapped = peft.get_peft_model(base, config)
    clients = []
    for k in range(n):
        name = f"client{k}"
        wrapped.add_adapter(name, config)
        modules = dict(wrapped.named_modules())
        with torch.no_grad():
            for i, layer_name in enumerate(model.adapted):
                layer = modules[f"base_model.model.{layer_name}"]
                layer.lora_A[name].weight.copy_(params[f"lora{i}.A"][k])
                layer.lora_B[name].weight.copy_(params[f"lora{i}.B"][k])
        head = torch.nn.Linear(model.hidden, model.n_classes)
        with torch.no_grad():
            head.weight.copy_(params["head.weight"][k].T)
            head.bias.copy_(params["head.bias"][k])
        clients.append((name, head))
    return wrapped, clients


def peft_optimizers(wrapped, clients) -> list[torch.optim.Adam]:
    """One Adam per client over its own adapter (the trainable parameters while it is the active one) and head."""
    optimizers = []
    for name, head in clients:
        wrapped.set_adapter(name)
        trainable = [p for p in wrapped.parameters() if p.requires_grad] + list(head.parameters())
        optimizers.append(torch.optim.Adam(trainable, lr=1e-3))
    return optimizers


def _peft_loss(wrapped, name: str, head, ids: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Client ``name``'s loss through peft: its adapter, the mean of the real tokens' states, its head."""
    wrapped.set_adapter(name)
    mask = (ids != 0).long()
    hidden = wrapped(input_ids=ids.long(), attention_mask=mask).last_hidden_state
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
    return F.cross_entropy(head(pooled), y)


def peft_step(wrapped, clients, optimizers, x, y) -> float:
    total = 0.0
    for k, (name, head) in enumerate(clients):
        loss = _peft_loss(wrapped, name, head, x[k], y[k])
        optimizers[k].zero_grad()
        loss.backward()
        optimizers[k].step()
        total += float(loss)
    return total


def _first_peft_loss(wrapped, clients, x, y) -> float:
    with torch.no_grad():
        return sum(float(_peft_loss(wrapped, name, head, x[k], y[k])) for k, (name, head) in enumerate(clients))


def _both_ways(model, params, n: int, x, y, path: str, args: argparse.Namespace, from_layer: int = 0) -> dict:
    """One step of ``model``'s stack and of peft's per-client loop adapting the same layers (``from_layer`` up),
    from the same weights and batches: their first losses (to check they agree) and seconds a step."""
    wrapped, clients = peft_models(path, model, params, n, args.rank, 2.0 * args.rank, from_layer)
    with torch.no_grad():
        first_stacked = float(F.cross_entropy(model.forward(params, x).reshape(-1, 2), y.reshape(-1),
                                              reduction="none").view(y.shape).mean(1).sum())
    first_peft = _first_peft_loss(wrapped, clients, x, y)
    optimizers = peft_optimizers(wrapped, clients)
    stacked_opt = torch.optim.Adam(list(params.values()), lr=1e-3)
    # the warm-up of a stack with ``from_layer`` fills its store of the lower layers' outputs
    s_stacked = _timed(lambda: stacked_step(model, params, stacked_opt, x, y), args.repeats)
    s_peft = _timed(lambda: peft_step(wrapped, clients, optimizers, x, y), args.repeats)
    return {"stacked_s": s_stacked, "peft_s": s_peft, "first_stacked": first_stacked, "first_peft": first_peft}


def measure(n: int, args: argparse.Namespace, model, path: str) -> dict:
    """One row: n clients' step, stacked and in peft's loop, from the same weights and batches."""
    gen = torch.Generator().manual_seed(n)
    params = {s.name: (torch.randn((n, *s.shape), generator=gen) * 0.02).requires_grad_() for s in model.specs()}
    x, y = _data(n, args.batch, args.length, path, gen)
    every = _both_ways(model, params, n, x, y, path, args)
    upper = {}
    if args.from_layer:
        from hetfed.models.lora import LoRAEncoder

        k = args.from_layer
        top = LoRAEncoder(path, args.length, 2, rank=args.rank, alpha=2.0 * args.rank, from_layer=k)
        mine = {s.name: (torch.randn((n, *s.shape), generator=gen) * 0.02).requires_grad_() for s in top.specs()}
        # peft's loop adapting the same layers runs the whole base every step
        upper_ways = _both_ways(top, mine, n, x, y, path, args, k)
        upper = {f"stacked_from_layer_{k}_s_per_step": upper_ways["stacked_s"],
                 "stacked_over_from_layer": every["stacked_s"] / upper_ways["stacked_s"],
                 f"peft_loop_from_layer_{k}_s_per_step": upper_ways["peft_s"],
                 "peft_loop_over_stacked_from_layer": upper_ways["peft_s"] / upper_ways["stacked_s"],
                 "first_loss_stacked_from_layer": upper_ways["first_stacked"],
                 "first_loss_peft_loop_from_layer": upper_ways["first_peft"]}
    return {"clients": n, "stacked_s_per_step": every["stacked_s"], "peft_loop_s_per_step": every["peft_s"],
            "peft_loop_over_stacked": every["peft_s"] / every["stacked_s"], **upper,
            "first_loss_stacked": every["first_stacked"], "first_loss_peft_loop": every["first_peft"],
            "adapter_and_head_bytes": sum(v.numel() * v.element_size() for v in params.values())}


def _timed(step, repeats: int) -> float:
    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - t0) / repeats


def _rss() -> int:
    """This process's resident memory now, bytes (Linux)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _added_by(step) -> int:
    """The most resident memory ``step()`` adds while it runs: RSS sampled every millisecond, less the RSS before."""
    before, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        step()
    finally:
        done.set()
        watcher.join()
    return max(peak[0], _rss()) - before


def _resident(tensors) -> None:
    """Read every weight once: a base loaded from safetensors is mapped from its file, and its pages become resident
    when first read — in the first step, which would count the base as the step's."""
    with torch.no_grad():
        for t in tensors:
            float(t.sum())


def one_memory(way: str, n: int, args: argparse.Namespace, path: str) -> dict:
    """One way's first step of ``n`` clients, alone in this process: what it adds to the resident memory."""
    from hetfed.models.lora import LoRAEncoder

    top = args.from_layer if way == "stacked_from_layer" else 0
    model = LoRAEncoder(path, args.length, 2, rank=args.rank, alpha=2.0 * args.rank, from_layer=top)
    gen = torch.Generator().manual_seed(n)
    params = {s.name: (torch.randn((n, *s.shape), generator=gen) * 0.02).requires_grad_() for s in model.specs()}
    x, y = _data(n, args.batch, args.length, path, gen)
    if way == "peft_loop":
        wrapped, clients = peft_models(path, model, params, n, args.rank, 2.0 * args.rank)
        optimizers = peft_optimizers(wrapped, clients)
        _resident(wrapped.parameters())
        added = _added_by(lambda: peft_step(wrapped, clients, optimizers, x, y))
    else:
        opt = torch.optim.Adam(list(params.values()), lr=1e-3)
        _resident(model.base.parameters())
        added = _added_by(lambda: stacked_step(model, params, opt, x, y))
    return {"way": way, "clients": n, "step_adds_bytes": added,
            "base_bytes": sum(p.numel() * p.element_size() for p in model.base.parameters()),
            "adapter_and_head_bytes": sum(v.numel() * v.element_size() for v in params.values())}


def memory_rows(args: argparse.Namespace) -> list[dict]:
    """Every way and client count in a fresh process each (a process's allocator keeps what it once held)."""
    ways = ["stacked", "peft_loop"] + (["stacked_from_layer"] if args.from_layer else [])
    rows = []
    for n in args.clients:
        for way in ways:
            command = [sys.executable, __file__, "--one", way, "--clients", str(n), "--batch", str(args.batch),
                       "--length", str(args.length), "--rank", str(args.rank), "--threads", str(args.threads),
                       "--from-layer", str(args.from_layer)] + (["--path", args.path] if args.path else [])
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            row = json.loads(done.stdout)
            row["step_adds_over_adapters"] = row["step_adds_bytes"] / row["adapter_and_head_bytes"]
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 5, 20])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--from-layer", type=int, default=0, help="also time adapters from this layer up only")
    parser.add_argument("--path", default=None, help="an encoder's folder (default: all-MiniLM-L6-v2, the peft extra)")
    parser.add_argument("--memory", action="store_true", help="each way's first step's added memory, not its time")
    parser.add_argument("--one", choices=["stacked", "peft_loop", "stacked_from_layer"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from hetfed.data.embeddings.wordpiece import encoder_path
    from hetfed.models.lora import LoRAEncoder

    path = encoder_path(args.path)
    if args.one:
        print(json.dumps(one_memory(args.one, args.clients[0], args, path)))
        return
    if args.memory:
        print(json.dumps({"encoder": path, "batch": args.batch, "length": args.length, "rank": args.rank,
                          "threads": args.threads, "from_layer": args.from_layer, "memory": memory_rows(args)},
                         indent=1))
        return
    model = LoRAEncoder(path, args.length, 2, rank=args.rank, alpha=2.0 * args.rank)
    rows = [measure(n, args, model, path) for n in args.clients]
    print(json.dumps({"encoder": path, "batch": args.batch, "length": args.length, "rank": args.rank,
                      "threads": args.threads, "from_layer": args.from_layer, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
