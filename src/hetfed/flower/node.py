"""What a SuperNode holds and the steps it runs for its clients: one client, or a cohort trained vectorised.

A node rebuilds its clients from the run's config — the simulated partition, the
same one the in-process simulator builds — and serves the clients its node config
names (:func:`node_clients`). Its clients are trained by hetfed's own in-process
:class:`~hetfed.executors.inprocess.VectorisedExecutor`, stacked and chunked as in a
simulation, so one message per node per round carries a whole cohort: the node
returns one combined upload (its clients' updates screened and summed, as the
in-process executor streams them), or every client's update when the round must
hold them one by one (a robust aggregator, FedDF, FedGen) or the node trained a
single client (the server then screens it with the others).

The clients' local state lives in the node's Flower ``context.state``, one record
per client, and is loaded into the executor before each step and written back
after it: it never appears in a reply.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from flwr.app import ConfigRecord, Context, RecordDict

from hetfed.config import Config, build_config
from hetfed.config_io import parse_yaml_text
from hetfed.engine.host_memory import keep_freed_memory
from hetfed.engine.host_threads import limit_threads
from hetfed.engine.types import stack_states
from hetfed.environment import count
from hetfed.executors.inprocess import VectorisedExecutor, initial_state
from hetfed.flower.records import CLIENTS, listed, number, record_to_tensors, state_to_record
from hetfed.partition import Federation, client_blocks
from hetfed.run_spec import RunSpec

STATE_KEY = "hetfed.state"


@dataclass(frozen=True, eq=False)
class NodeSide:
    """What a node builds once per run and method: the config, the method's run (its algorithm), the data and its
    executor."""

    config: Config
    run: RunSpec
    fed: Federation
    executor: VectorisedExecutor
    key: str  # the run's config and method, hashed
    features: object = None  # what Γ is measured on (the inputs, or a bag-of-words view of token ids)


_CACHE: dict[str, NodeSide] = {}


def node_side(run: ConfigRecord, node_config=None) -> NodeSide:
    """The run's config, algorithm, federation and a started executor, built once per process (cached by
    config and node: a Simulation Engine's worker serves many nodes of one run).

    The federation is the simulated one (every node rebuilds it and serves its block of clients), or —
    ``data=…`` in the node config — the node's own clients from its own file (:mod:`hetfed.flower.node_data`).
    """
    from hetfed.flower.node_data import CLIENT, DATA, GLOBAL_TEST, LABEL, SPLIT, own_data

    text, method = str(run["config"]), int(number(run["method"]))
    # the node's own file as its config reads it (the same file read with another label or split is other data)
    mine = (" ".join(f"{k}={node_config[k]}" for k in (DATA, LABEL, CLIENT, SPLIT, GLOBAL_TEST) if k in node_config)
            if node_config is not None and own_data(node_config) else "")
    key = hashlib.sha256(f"{method}\n{mine}\n{text}".encode()).hexdigest()
    if key not in _CACHE:
        from hetfed.algorithms import run_for
        from hetfed.executors.simulate import resolve_device

        # a node's process computes with HETFED_CLIENT_THREADS threads (1): torch's, and numpy's, scipy's and
        # scikit-learn's pools alike (a simulation runs a process per worker on the machine's cores)
        limit_threads(count("HETFED_CLIENT_THREADS", 1))
        keep_freed_memory()  # as a simulation's process (HETFED_MALLOC of the node's environment)
        config = build_config(parse_yaml_text(text, "the run's config"))
        if mine:
            from hetfed.flower.node_data import node_federation

            fed, measure_on = node_federation(node_config, config), None
        else:
            from hetfed.flower import node_cache

            cached = node_cache.load(config)  # a deployment starts a process per message: build once per run
            if cached is None:
                from hetfed.pipeline import build_federation

                built = build_federation(config, progress=False)  # the simulator's path: holdout cut first
                fed, measure_on = built.federation, getattr(built.clients_data, "measure_train", None)
                node_cache.save(config, fed, measure_on, built.sources)
            else:
                fed, measure_on = cached
        method_cfg = config.methods[method]
        spec = run_for(config, method_cfg, fed, server=False)  # a node serves no round: the clients' side
        train = spec.train
        executor = VectorisedExecutor(train.memory_budget_mb, train.chunk_clients)
        executor.start(spec, fed, resolve_device(train.device, train.capture))
        executor.wire = executor.transport.compressor is not None  # compressed updates travel encoded
        _CACHE.clear()  # one run at a time per process
        _CACHE[key] = NodeSide(config, spec, fed, executor, key[:16], fed.x if measure_on is None else measure_on)
    return _CACHE[key]


def node_clients(node_config, n_clients: int) -> list[int]:
    """The clients a node holds: ``partition-id=P num-partitions=K`` gives node P the P-th of K contiguous
    blocks of the federation's clients (K = the number of clients: one client per node); a node with its own
    data holds all of its own clients (numbered from 0 on the node; the server offsets them)."""
    from hetfed.flower.node_data import own_data

    if own_data(node_config):
        return list(range(n_clients))
    if "partition-id" not in node_config:
        raise ValueError("this SuperNode has no partition-id in its node config: start it with "
                         "--node-config 'partition-id=P num-partitions=K' (K nodes share the clients)")
    p = int(node_config["partition-id"])
    k = int(node_config.get("num-partitions", n_clients))
    if not 0 <= p < k:
        raise ValueError(f"node config partition-id = {p} is not allowed with num-partitions = {k}: "
                         f"expected 0 ≤ partition-id < {k}")
    return [int(c) for c in client_blocks(n_clients, k)[p]]


def step_clients(content: RecordDict) -> tuple[list[int], list[int] | None, int]:
    """The node's clients this step is for (numbered as on the node), every client the step evaluates (None:
    the node's), and the offset of the node's clients in the federation (0 but for nodes with their own data)."""
    rec = content.config_records[CLIENTS]
    offset = int(number(rec.get("offset", 0)))
    among = rec.get("among")
    return (
        [int(k) - offset for k in listed(rec["ids"])],
        None if among is None else [int(k) for k in listed(among)],
        offset,
    )


# ----------------------------------------------------------------- client state in the node's context


def _tag(side: NodeSide, k: int) -> str:
    """Where in the node's context client ``k``'s state for this run and method lives."""
    return f"{STATE_KEY}.{side.key}.{k}"


def load_states(side: NodeSide, clients: list[int], context: Context) -> None:
    """Put the clients' states from the node's context (their initial state on first use, from the client's
    federation number) into the executor."""
    first = side.executor.pool.first_id
    for k in clients:
        tag = _tag(side, k)
        state = (record_to_tensors(context.state.array_records[tag]) if tag in context.state else
                 initial_state(side.run.algo, k + first, side.run.seed))
        side.executor.states.scatter([k], stack_states([state]), whole=True)


def keep_states(side: NodeSide, clients: list[int], context: Context) -> None:
    for k in clients:
        context.state[_tag(side, k)] = state_to_record({n: v.clone() for n, v in side.executor.states[k].items()})


def reduces(side: NodeSide, clients: list[int]) -> bool:
    """Whether the node sends its cohort's updates summed: more than one client, a round that may stream, and
    updates that travel uncompressed."""
    return len(clients) > 1 and not side.run.holds_round() and not side.executor.wire  # encodings do not sum
