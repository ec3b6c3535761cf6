"""The plan step of a run: a validated config resolved into the methods to train.

First the checks between components, each resolved from its registry (:func:`check_config`: a model reads what
the data gives, an algorithm runs on the model and the server data it needs, compression only where a model is
uploaded, SuperNodes' own data with what it allows) — before any data is loaded; then, on the federation, each
method built with its effective settings and the executor its clients compute on (:func:`plan`) — before any
file is written. A config is validated section by section (:mod:`hetfed.config`); what needs two components is
here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hetfed.algorithms import run_for
from hetfed.algorithms.registry import with_capability
from hetfed.config import Config, MethodConfig, ServerConfig, TrainConfig
from hetfed.engine import capture
from hetfed.engine.clock import check_clock
from hetfed.engine.faults import sample_shape
from hetfed.engine.privacy import check_available
from hetfed.engine.record_dp import draws_noise
from hetfed.errors import ConfigError, RunError
from hetfed.executors.inprocess import check_memory
from hetfed.executors.kinds import ExecutorKind, executor_for
from hetfed.interface import Algorithm
from hetfed.partition import NodesFederation
from hetfed.registry import registry_of
from hetfed.run_spec import RunSpec

if TYPE_CHECKING:
    from hetfed.partition import Federation


def check_devices(config: Config) -> None:
    """Every method's ``train.device`` and ``train.capture`` available on this machine (one-line ConfigErrors): what a
    run refuses before loading any data, and a sweep before it writes its directory (every run would fail alike)."""
    from hetfed.executors.simulate import resolve_device

    for method in config.methods:
        train = config.method_train(method)
        resolve_device(train.device, train.capture)


def check_config(config: Config, train: bool = True) -> None:
    """The checks between components (one-line ConfigErrors naming both keys). ``train``: False for a command that
    only builds the federation (``hetfed partition``): no method is trained, so a model need not suit the data."""
    if registry_of("dataset").get(config.dataset.name).on_nodes:
        _check_nodes_dataset(config)
    if config.server_data.source == "dataset" and registry_of("embedding").get(config.embed.kind).fitted:
        raise ConfigError(f"server_data.source = 'dataset' is not allowed with embed.kind = {config.embed.kind!r}: "
                          "it is fitted on the federation's data; expected embed.kind 'identity' or a pre-trained "
                          "extractor, or server_data.source = 'holdout'")
    algorithms = registry_of("algorithm")
    for i, method in enumerate(config.methods):
        caps = algorithms.get(method.algorithm).capabilities
        if caps.server_data and config.server_data.source == "none":
            raise ConfigError(f"server_data.source = 'none' is not allowed with methods.{i}.algorithm = "
                              f"{method.algorithm!r}: it needs unlabeled server data; expected 'auto', 'holdout' or "
                              "'dataset'")
        _check_root(config, i, method)
        compression, plain = config.method_server(method).compression, ServerConfig().compression
        if not caps.server_model and compression != plain:
            raise ConfigError(f"server.compression = {compression.shown()} is not allowed with methods.{i}.algorithm "
                              f"= {method.algorithm!r}: it uploads no model to compress; expected the default "
                              f"{plain.shown()} for this method (methods.{i}.server.compression)")
        if train:
            _check_model(config, i, method, caps)


def _check_root(config: Config, i: int, method: MethodConfig) -> None:
    """A combine rule that trains on a labelled root set (FLTrust) needs the server's holdout, whose labels it keeps."""
    from hetfed.server_data import wanted

    rule = config.method_server(method).combine.rule
    if registry_of("combine").get(rule).root and wanted(config) != "holdout":
        raise ConfigError(f"server_data.source = {config.server_data.source!r} is not allowed with methods.{i}.server."
                          f"combine.rule = {rule!r}: it trains on a labelled root set held out of the training pool; "
                          "expected 'auto' or 'holdout'")


def _check_model(config: Config, i: int, method: MethodConfig, caps: Any) -> None:
    """The model reads what the data gives (feature vectors, token ids, character windows: each model kind declares
    its inputs, each dataset and extractor what it gives), and the algorithm supports it."""
    kind = config.method_model(method).kind
    models = registry_of("model")
    gives = (registry_of("embedding").get(config.embed.kind).gives
             or registry_of("dataset").get(config.dataset.name).gives)
    if models.get(kind).inputs != gives:
        readers = [name for name, m in models.items() if m.inputs == gives]
        need = f"need model.kind = {readers[0]!r}" if len(readers) == 1 else f"need model.kind in {readers}"
        raise ConfigError(f"methods.{i} model.kind = {kind!r} with embed.kind = {config.embed.kind!r} is not allowed "
                          f"(dataset.name = {config.dataset.name!r}): the model reads {models.get(kind).inputs}, the "
                          f"data gives {gives}, which {need}")
    model_params, embed_params = config.method_model(method).params, config.embed.params
    if "path" in type(model_params).model_fields and "path" in type(embed_params).model_fields \
            and model_params.path != embed_params.path:  # a model reading a tokenizer's ids names the same folder
        raise ConfigError(f"methods.{i} model.path = {model_params.path!r} with embed.path = {embed_params.path!r} "
                          "is not allowed: the model reads its own tokenizer's ids; expected the same folder for both")
    if caps.model_kinds is not None and kind not in caps.model_kinds:
        raise ConfigError(f"methods.{i}.algorithm = {method.algorithm!r} is not allowed with model.kind = {kind!r}: "
                          f"{caps.model_reason or 'unsupported'}; expected model.kind in {list(caps.model_kinds)}")


def _check_nodes_dataset(config: Config) -> None:
    """A dataset on the SuperNodes (``on_nodes``): the run waits for its nodes, and neither an extractor, server
    data cut from a dataset nor simulated opt-out can be applied to data the server never holds."""
    name = config.dataset.name
    if config.flower.nodes is None:
        raise ConfigError(f"dataset.name = {name!r} needs flower.nodes: how many SuperNodes with their own data to "
                          "wait for at set-up, e.g. 3")
    if registry_of("embedding").get(config.embed.kind).gives is not None:  # an extractor, not the samples as they are
        raise ConfigError(f"embed.kind = {config.embed.kind!r} is not allowed with dataset.name = {name!r}: nodes "
                          "read feature tables; expected 'identity'")
    algorithms = registry_of("algorithm")
    from hetfed.server_data import labelled

    if config.server_data.source in ("holdout", "dataset") or labelled(config) or any(
            algorithms.get(m.algorithm).capabilities.server_data for m in config.methods):
        raise ConfigError(f"server_data is not available with dataset.name = {name!r} (the server holds no data): "
                          "expected methods that need no server data and server_data.source 'auto' or 'none'")
    if config.partition.opt_out:
        raise ConfigError(f"partition.opt_out = {config.partition.opt_out} is not allowed with dataset.name = "
                          f"{name!r}: a node's clients opt out by not joining; expected 0")
    for key, value in config.partition.away_from_default("feature_noise", "rotations", "label_swaps").items():
        raise ConfigError(f"partition.{key} = {value} is not allowed with dataset.name = {name!r}: the nodes' own "
                          "data is not simulated; expected it left out")
    for key, value in config.dataset.away_from_default("positive_class", "keep_classes", "standardise").items():
        raise ConfigError(f"dataset.{key} = {value!r} is not allowed with dataset.name = {name!r}: each node reads "
                          "its own file as it is; expected it left out (relabel or scale the nodes' files instead)")
    for method in config.methods:
        _check_nodes_clock(config.method_train(method))


def _check_nodes_clock(train: TrainConfig) -> None:
    """Nodes with their own data are timed by the wall clock (the server does not know their clients' sizes): a
    modelled clock or simulated stragglers set for them are refused, the key named."""
    typed = {**train.clock.away_from_default("latency", "sample_seconds", "uplink_mbps", "downlink_mbps",
                                             "network_spread", "slow", "deadline"),
             **train.stragglers.away_from_default("distribution")}
    for key, value in typed.items():
        if not (key == "latency" and registry_of("latency").get(value).wall):
            raise ConfigError(f"train.{'stragglers' if key == 'distribution' else 'clock'}.{key} = {value!r} is not "
                              "allowed with a federation of nodes with their own data: the server does not know "
                              "their clients' sizes and speeds to simulate their rounds, which are timed by the wall "
                              "clock; expected it left out (or train.clock.latency 'wall')")


def _check_wall_clock(index: int, train: TrainConfig, kind: ExecutorKind) -> None:
    """``train.clock.latency: wall`` times real exchanges: refused where the clients compute in this process, and
    with a modelled deadline. (A federation of nodes with their own data is always timed by it; a modelled clock set
    for one is refused by :func:`check_config`, :func:`_check_nodes_clock`.)"""
    clock = train.clock
    if not registry_of("latency").get(clock.latency).wall:
        return
    if kind.in_process:
        raise ConfigError(f"train.clock.latency = 'wall' is not allowed with train.executor = {kind.name!r} "
                          f"(methods.{index}): it times exchanges with clients elsewhere (an asynchronous "
                          "server merges the replies as they really come, a round lasts its exchange's real seconds); "
                          "expected an executor whose clients are elsewhere (flower, deployment)")
    if clock.deadline is not None:
        raise ConfigError(f"train.clock.deadline = {clock.deadline:g} is not allowed with train.clock.latency = "
                          "'wall': the clients' round times are real, not modelled; expected it left out "
                          "(flower.round_timeout bounds a real round)")


@dataclass(frozen=True, eq=False)
class MethodPlan:
    """One method as it will run: ``config.methods[index]``, its run as resolved once (its effective settings and
    its algorithm: :class:`~hetfed.run_spec.RunSpec`) and the executor kind its clients compute on."""

    index: int
    method: MethodConfig
    run: RunSpec
    executor: ExecutorKind

    @property
    def train(self) -> TrainConfig:
        return self.run.train

    @property
    def algo(self) -> Algorithm:
        return self.run.algo


def plan(config: Config, fed: Federation, ckpt: dict[str, Any] | None,
         executor: ExecutorKind | None = None) -> list[MethodPlan]:
    """Every method built and checked before any file: a bad setting, an ``m`` that cannot be met, what cannot
    fit in memory or an attack on clients that are real is refused here, not mid-run."""
    _check_attack(config, fed)
    plans = []
    for index, method in enumerate(config.methods):
        train = config.method_train(method)
        kind = executor or executor_for(train)
        kind.check()  # a missing extra (Flower), before any file
        check_clock(train.clock, fed.n_clients)  # a clock file that does not fit the federation, likewise
        run = run_for(config, method, fed)  # what the method checks against the federation, before any file
        algo = run.algo
        if registry_of("attack").get(config.attack.kind).acts and not kind.in_process:
            raise ConfigError(f"attack.kind = {config.attack.kind!r} is simulated by the in-process executors only; "
                              f"expected methods.{index}.train.executor 'vectorised' or 'sequential' (on "
                              f"executor {kind.name!r} the clients are real)")
        _check_collusion(config, index, method, run)
        if registry_of("attack").get(config.attack.kind).acts and config.attack.start_round > train.rounds:
            raise ConfigError(f"attack.start_round = {config.attack.start_round} is not allowed: methods.{index} "
                              f"trains {train.rounds} rounds, so no round would be attacked; expected 1 … "
                              f"{train.rounds}")
        _check_wall_clock(index, train, kind)
        _check_leakage(config, index, method, run, kind, fed)
        _check_records(config, index, method, algo, fed)
        _check_capture(index, train, algo, config.method_model(method).kind)
        if kind.in_process:
            check_memory(run, fed)
        elif ckpt and ckpt.get("current") and ckpt["current"]["index"] == index:
            check_remote_resume(ckpt)
        plans.append(MethodPlan(index, method, run, kind))
    return plans


def _check_attack(config: Config, fed: Federation) -> None:
    """An attack's own refusal of what the data cannot take (a backdoor's trigger on token ids, a target class the
    data does not have), before anything runs."""
    attack = registry_of("attack").get(config.attack.kind)
    why = attack.check(config.attack.params, sample_shape(fed), fed.n_classes,
                       np.issubdtype(np.asarray(fed.x).dtype, np.floating)) if attack.check is not None else None
    if why:
        raise ConfigError(f"attack.kind = {config.attack.kind!r} is not allowed here: {why}")


def _check_collusion(config: Config, index: int, method: MethodConfig, run: RunSpec) -> None:
    """A colluding attack crafts its update from a round's honest updates as the server decodes them: an asynchronous
    server has no round to collude in, and a compressed upload would carry the crafted update uncompressed."""
    if registry_of("attack").get(config.attack.kind).collude is None:
        return
    why = f"attack.kind = {config.attack.kind!r} crafts one update from a round's honest updates"
    if run.algo.capabilities.asynchronous:
        raise ConfigError(f"{why}: methods.{index}.algorithm = {method.algorithm!r} has no rounds (an asynchronous "
                          "server merges arrivals); expected a synchronous algorithm")
    if run.chain is not None and run.chain.transport.compressor is not None:
        raise ConfigError(f"{why}: with methods.{index}'s server.compression.kind = "
                          f"{run.chain.transport.compressor.name!r} it would travel uncompressed; expected "
                          "server.compression.kind 'none'")


def _check_leakage(config: Config, index: int, method: MethodConfig, run: RunSpec, kind: ExecutorKind,
                   fed: Federation) -> None:
    """An attack by the server (``leakage``) needs the clients' data to be scored against (the simulation's: not
    SuperNodes' own), and an inversion a model update, sent in a round that comes, by a client that joins, of samples
    the attack can read — on Flower, where a node may send its cohort summed and SecAgg+ sends the round's sum, of as
    many samples as the sum went over."""
    leakage = config.leakage
    attack = registry_of("leakage").get(leakage.kind)
    if not attack.acts:
        return
    if isinstance(fed, NodesFederation):
        raise ConfigError(f"leakage.kind = {leakage.kind!r} is not allowed with SuperNodes' own data (dataset.name = "
                          f"{config.dataset.name!r}): the attack is scored against the clients' samples, which stay on "
                          "the nodes; expected leakage.kind 'none', or a federation the server draws")
    if attack.reads != "update":
        return
    caps, k, train, schedule = run.algo.capabilities, leakage.client, run.train, run.schedule
    if not _watches(kind, train):
        allowed = [name for name, other in registry_of("executor").items()
                   if other.selectable and _watches(other, train)]
        raise ConfigError(f"leakage.kind = {leakage.kind!r} is not allowed with train.executor = {kind.name!r}: its "
                          "executor does not say what the server receives of a client's update (it lacks watch and "
                          f"watched, hetfed.executors.inprocess.Executor); expected train.executor in {allowed}")
    if caps.asynchronous or not caps.server_model:
        why = "it merges updates as they arrive, not in rounds" if caps.asynchronous else "it uploads no model"
        raise ConfigError(f"leakage.kind = {leakage.kind!r} is not allowed with methods.{index}.algorithm = "
                          f"{method.algorithm!r}: {why}; expected a membership attack (loss_threshold)")
    if k >= fed.n_clients or fed.opted_out[k]:
        why = f"the federation has {fed.n_clients} clients" if k >= fed.n_clients else "that client opted out"
        raise ConfigError(f"leakage.client = {k} is not allowed: {why}; expected an opted-in client id")
    if leakage.round > train.rounds:
        raise ConfigError(f"leakage.round = {leakage.round} is not allowed: methods.{index} trains {train.rounds} "
                          f"rounds; expected 1 … {train.rounds}")
    seen = schedule.samples_seen(len(fed.train[k]))
    if attack.most_samples is not None and not kind.in_process and (
            config.flower.secure_aggregation != "none" or config.flower.clients_per_node > 1):
        raise ConfigError(f"leakage.kind = {leakage.kind!r} reads an update of at most {attack.most_samples} "
                          f"sample(s); on executor {kind.name!r} client {k}'s update may reach the server summed with "
                          f"others' (flower.secure_aggregation = {config.flower.secure_aggregation!r}, "
                          f"flower.clients_per_node = {config.flower.clients_per_node}); expected dlg, "
                          "inverting_gradients or label_counts, or one client per node without secure aggregation")
    if attack.most_samples is not None and seen > attack.most_samples:
        raise ConfigError(f"leakage.kind = {leakage.kind!r} reads an update of at most {attack.most_samples} "
                          f"sample(s); client {k}'s update goes over {seen}; expected dlg, inverting_gradients or "
                          "label_counts")


def _watches(kind: ExecutorKind, train: TrainConfig) -> bool:
    """Whether ``kind``'s executor hands an inversion what the server receives of a client's update: in process,
    its client-step executor's ``watch``/``watched``; elsewhere (Flower) its session's, which has them."""
    if not kind.in_process:
        return True
    executor = kind.client_steps(train)
    return callable(getattr(executor, "watch", None)) and callable(getattr(executor, "watched", None))


def _check_records(config: Config, index: int, method: MethodConfig, algo: Algorithm, fed: Federation) -> None:
    """DP-SGD (``privacy.record``) clips the model's cross-entropy per sample: a method whose steps descend that
    alone (plain steps), a model whose per-sample gradients are the ones taken (no dropout, no batch statistics)."""
    sigma = config.privacy.record.noise_multiplier
    if sigma is None:
        return
    where = f"privacy.record.noise_multiplier = {sigma:g} with methods.{index}"
    if not algo.capabilities.plain_steps:
        allowed = with_capability(lambda c: c.plain_steps)
        raise ConfigError(f"{where}.algorithm = {method.algorithm!r} is not allowed: its local steps descend an "
                          f"objective of their own, which DP-SGD does not clip per sample; expected one of {allowed}")
    kind = config.method_model(method).kind
    if algo.model.buffer_names:
        raise ConfigError(f"{where} (model.kind = {kind!r}) is not allowed with batch statistics: a sample's "
                          "gradient then depends on the rest of its batch; expected model.batch_norm: false")
    if algo.model.no_per_sample_gradients:
        raise ConfigError(f"{where} (model.kind = {kind!r}) is not allowed: {algo.model.no_per_sample_gradients}; "
                          "expected a model of hetfed's own (mlp, cnn, cnn4, logreg, cgau, bilstm)")
    if draws_noise(algo.model, fed.input_shape):
        raise ConfigError(f"{where} (model.kind = {kind!r}) is not allowed with dropout: the per-sample norms are "
                          "computed without its masks, so the clip bound would not hold for the gradient taken; "
                          "expected model.dropout: 0")
    check_available()


def _check_capture(index: int, train: TrainConfig, algo: Algorithm, kind: str) -> None:
    """A recorder asked for by name (``train.capture: compile``) that cannot record the method's model is refused
    (``auto`` records where it can and leaves such a model's steps eager)."""
    if train.capture == "auto":
        return
    recorder = capture.backend(train.capture, capture.device_of(train.device))
    why = capture.refuses(recorder, algo.model) if recorder is not None else ""
    if why:
        raise ConfigError(f"train.capture = {train.capture!r} is not allowed with methods.{index} (model.kind = "
                          f"{kind!r}): {why}; expected train.capture 'auto' or 'off'")


def check_remote_resume(checkpoint: dict[str, Any] | None) -> None:
    """The checkpoint of a run whose clients live off this process (Flower) holds the server's side only: the
    clients' own state lived in the SuperNodes' run context, which ended with the killed run. Resuming mid-rounds is
    exact only for a method whose clients
    keep nothing between rounds; for any other the resume is refused, saying why."""
    current = (checkpoint or {}).get("current")
    if not current or current["result"].rounds_done == 0:
        return
    kept = current.get("client_keys", [])
    if kept:
        shown = ", ".join(kept[:4]) + (" …" if len(kept) > 4 else "")
        raise RunError(
            f"cannot resume method {current['label']!r} on Flower after round {current['result'].rounds_done}: its "
            f"clients keep state across rounds ({shown}) in the SuperNodes' run context, which ended with the killed "
            "run, and a new run cannot re-establish it (the server never held it); rerun it from the start, or run "
            "it with train.executor vectorised, whose checkpoints hold every client's state")
