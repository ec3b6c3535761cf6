"""The config schema: the one place that says what can be set, and to what.

A config is YAML with the nesting below; ``--set key=value`` overrides any key
(values are parsed as YAML, so ``--set model.hidden=[128,128]`` works). The whole
config is validated before anything runs; an error names the key, the value and
what is allowed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from hetfed import config_legacy
from hetfed.config_io import parse_overrides, read_yaml, set_dotted
from hetfed.errors import ConfigError, HetfedNote
from hetfed.registry import ComponentParams, registry_of


class _Strict(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class _Chosen(_Strict):
    """A section that names one registered component and carries that component's own parameters beside the
    choice: ``partition: {kind: dirichlet, alpha: 0.1}``.

    ``chosen_by`` = (kind of component, field that names one). The section's fields are what every component of
    the kind shares; any other key is the chosen component's, validated by the ``Params`` its file declares, so a
    key it does not have is refused with the keys it takes. :attr:`params` is the validated model; a dump writes
    it in full (every parameter, defaults filled), :func:`as_given` only what was given."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)
    chosen_by: ClassVar[tuple[str, str]]
    #: the top-level section is the methods' defaults (``model``): in a whole config, a key its own choice does not
    #: take is left for the methods whose choice does (refused when none does: :meth:`Config._methods_resolve`)
    for_methods: ClassVar[bool] = False
    _params: ComponentParams = PrivateAttr(default_factory=ComponentParams)

    @model_validator(mode="after")
    def _component_params(self, info: ValidationInfo) -> _Chosen:
        kind, field = self.chosen_by
        registry = registry_of(kind)  # the component's own declaration (discovered, not listed here)
        context = info.context or {}
        where = context.get("where", registry.params_key)
        component = registry.get(getattr(self, field), f"{where}.{field}")
        given = self.model_extra or {}
        if self.for_methods and context.get("whole"):
            given = {k: v for k, v in given.items() if k in component.Params.model_fields}
        self._params = registry.params(getattr(self, field), given, where)
        return self

    def not_taken(self) -> dict[str, Any]:
        """The given keys that this section's own choice does not take (a methods' default, ``for_methods``)."""
        takes = registry_of(self.chosen_by[0]).get(self.choice).Params.model_fields
        return {k: v for k, v in (self.model_extra or {}).items() if k not in takes}

    @model_serializer(mode="wrap")
    def _with_params(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data = handler(self)
        if not (info.context or {}).get("as_given"):
            data.update(self._params.model_dump(mode=info.mode))
        return data

    @property
    def chooser(self) -> str:
        return self.chosen_by[1]

    @property
    def choice(self) -> str:
        return str(getattr(self, self.chosen_by[1]))

    @property
    def params(self) -> Any:
        """The chosen component's validated parameters (its ``Params`` model, frozen)."""
        return self._params

    def given_for(self, name: str) -> dict[str, Any]:
        """This section as given, for a method that chooses component ``name`` instead: the shared keys, and the
        given parameters that ``name`` takes too (a top-level ``model.hidden`` reaches a method's ``cgau``, not
        its ``cnn4``)."""
        shared = {k: v for k, v in self.model_dump(mode="json", context={"as_given": True}).items()
                  if k in type(self).model_fields}
        takes = registry_of(self.chosen_by[0]).get(name).Params.model_fields
        return {**shared, **{k: v for k, v in (self.model_extra or {}).items() if k in takes}}


class DatasetConfig(_Chosen):
    """Which data to load. ``data_dir`` is searched first, then standard places; a dataset's own keys (arrays:
    ``path``; fortunes: ``categories``; shakespeare: ``plays``, ``window_stride``; nodes: ``features``,
    ``classes``) sit beside ``name`` (`hetfed components dataset NAME`)."""

    chosen_by: ClassVar[tuple[str, str]] = ("dataset", "name")

    name: str = Field("digits", description="a registered dataset (`hetfed components dataset`)")
    data_dir: str | None = None
    test_fraction: float = Field(
        0.2, gt=0, lt=1, description="held-out share when the data has no test split"
    )
    positive_class: int | str | None = Field(
        None, description="make a binary task: this class (an id, or a label name such as Cough) against all others"
    )
    standardise: Literal["none", "global"] = Field(
        "none", description="global: (x − mean) / std with one mean and std over the training split's values "
        "(torchvision's MNIST Normalize(0.1307, 0.3081)); images and vectors only"
    )


class EmbedConfig(_Chosen):
    """The frozen feature extractor between loading and partitioning; an extractor's own keys (pca:
    ``components``; tokens: ``max_length``, ``vocab_size``, ``min_count`` …) sit beside ``kind``."""

    chosen_by: ClassVar[tuple[str, str]] = ("embedding", "kind")

    kind: str = Field("identity", description="a registered extractor (`hetfed components embedding`)")
    batch_size: int = Field(64, ge=1)
    cache_dir: str | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"


class PartitionConfig(_Chosen):
    """How the data is split over simulated clients (see hetfed.partition); a partitioner's own keys (dirichlet:
    ``alpha`` …; `hetfed components partitioner NAME`) sit beside ``kind``."""

    chosen_by: ClassVar[tuple[str, str]] = ("partitioner", "kind")

    kind: str = Field("feature_clusters", description="a registered partitioner (hetfed.partition): iid, shards, "
                      "majority, dirichlet, feature_clusters, natural, or a plugin's")
    clients: int | None = Field(10, ge=1)
    opt_out: float = Field(0.0, ge=0, le=1)
    val_fraction: float = Field(0.15, ge=0, lt=1)
    test_fraction: float = Field(0.15, ge=0, lt=1)

    @model_validator(mode="after")
    def _fractions_leave_training_data(self) -> PartitionConfig:
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(
                f"partition.val_fraction + partition.test_fraction = "
                f"{self.val_fraction + self.test_fraction} leaves no training data: must be < 1"
            )
        return self


class HeterogeneityConfig(_Strict):
    """How Γ is measured (see hetfed.heterogeneity)."""

    on: Literal["train", "all"] = Field(
        "train", description="each client's training samples (what the method sees) or train ∪ val ∪ test"
    )
    iid_draws: int = Field(3, ge=0, description="size-matched IID partitions for the reference Γ_IID (0: off)")
    iid_max_clients: int = Field(100, ge=1, description="clients scored per IID draw (keeps it cheap at many clients)")
    estimator: Literal["plain", "extrapolated"] = Field(
        "plain", description="plain Fréchet distance, or extrapolated to infinite client size (FD∞)"
    )


class ModelConfig(_Chosen):
    """The network every client trains: ``kind`` and that kind's own keys (mlp: ``hidden``, ``dropout`` …;
    `hetfed components model NAME`)."""

    chosen_by: ClassVar[tuple[str, str]] = ("model", "kind")
    for_methods: ClassVar[bool] = True

    kind: str = Field("mlp", description="a registered model (`hetfed components model`)")


class OptimizerConfig(_Strict):
    """The client optimiser. ``reset_each_round: false`` keeps its state on the client."""

    kind: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    reset_each_round: bool = True


class StragglerConfig(_Strict):
    """Slow clients and a round deadline: a client whose round takes longer than ``deadline`` is dropped.

    Each client gets a fixed time per local step, drawn once from the run seed
    (median 1: the deadline is in "median client steps"); a round takes
    ``steps × time_per_step``.
    """

    distribution: Literal["none", "lognormal", "exponential", "uniform"] = "none"
    spread: float = Field(0.5, gt=0, description="lognormal σ; uniform: times in [1 − spread/2, 1 + spread/2]·median")
    deadline: float | None = Field(None, gt=0, description="time units (median client steps); None: no deadline")


class ClockConfig(_Strict):
    """Simulated time (hetfed.engine.clock): a client's round takes its compute time (samples processed × its
    seconds per sample) plus its network time (bytes received ÷ downlink + bytes sent ÷ uplink); a synchronous
    round lasts as long as its slowest aggregated client (or the deadline, when a client missed it). Each client's
    speeds are drawn once from the run seed (median ``sample_seconds``), or read from ``file``."""

    latency: Literal["constant", "lognormal", "exponential", "uniform", "file", "wall"] = Field(
        "constant", description="each client's seconds per sample: all the median (constant), drawn once per client "
        "from a distribution with that median (lognormal: σ = spread; exponential; uniform: ±spread/2), or read "
        "from file; wall: no model — an asynchronous server on Flower merges replies in the order they really come "
        "and sim_time is the run's seconds")
    spread: float = Field(1.0, gt=0, description="lognormal σ; uniform: speeds in [1 − spread/2, 1 + spread/2]·median")
    sample_seconds: float = Field(1e-3, gt=0, description="the median client's seconds to train on one sample")
    uplink_mbps: float | None = Field(None, gt=0, description="the median client's upload bandwidth in Mbit/s "
                                      "(None: sending takes no time)")
    downlink_mbps: float | None = Field(None, gt=0, description="the median client's download bandwidth in Mbit/s "
                                        "(None: receiving takes no time)")
    network_spread: float = Field(0.0, ge=0, description="lognormal σ of each client's bandwidths around the median")
    file: str | None = Field(None, description="latency = file: a CSV with a header and one row per client: client, "
                             "sample_seconds, and optionally uplink_mbps, downlink_mbps")
    slow: Literal["random", "by_label"] = Field(
        "random", description="which client gets which speed: random, or by_label (clients sorted by their most "
        "frequent class; the slowest speeds go to the highest classes, so slow clients hold different classes)")
    deadline: float | None = Field(None, gt=0, description="seconds: a client whose round takes longer is dropped "
                                   "(late); the round then lasts the deadline")

    @model_validator(mode="after")
    def _file_given(self) -> ClockConfig:
        if (self.latency == "file") != (self.file is not None):
            raise ValueError(f"train.clock.latency = {self.latency!r} with train.clock.file = {self.file!r} is not "
                             "allowed: latency 'file' needs file (a CSV path), and file needs latency 'file'")
        return self


class TrainConfig(_Strict):
    """The federated schedule: rounds, client sampling, local work, evaluation."""

    rounds: int = Field(100, ge=1)
    client_fraction: float | None = Field(
        1.0, gt=0, le=1, description="C: share of the opted-in clients sampled per round"
    )
    clients_per_round: int | None = Field(
        None, ge=1, description="m: a fixed count per round (wins over client_fraction)"
    )
    local_epochs: float | None = Field(1.0, gt=0)
    local_steps: int | None = Field(None, ge=1, description="τ: wins over local_epochs")
    steps_cap_one_pass: bool = Field(
        False, description="with local_steps: stop early once all client data was seen once"
    )
    batch_size: int = Field(32, ge=1)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    lr_decay: float = Field(1.0, gt=0, le=1, description="lr multiplied by this every round")
    eval_every: int = Field(1, ge=1)
    eval_clients: int | None = Field(
        None, ge=2, description="score a fixed random sample of this many clients at each evaluation (None: all); "
        "local metrics then come with a 95%% CI over the sampled clients"
    )
    eval_global_clients: int | None = Field(
        10, ge=1, description="during the rounds, personalised models of at most this many of the evaluated clients "
        "also score the global test set (a fixed random subset; None: all): each is a full pass over the global "
        "test set, ~10× a client's training round on FMNIST. The final personalised views are scored by all"
    )
    global_test_size: int | None = Field(
        None, ge=10, description="score the global test set on a fixed, class-balanced subset of this size (None: all)"
    )
    patience: int | None = Field(None, ge=1, description="early stop after this many evals")
    executor: str = Field(
        "vectorised", description="where the clients compute: a registered executor that train.executor may name "
        "(vectorised, sequential, flower; `hetfed components executor`)")
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    capture: Literal["auto", "off", "compile"] = Field(
        "auto", description="auto: on CUDA, a stacked training step is recorded once as a CUDA graph and replayed "
        "(steps of methods with their own objective, constraint or extra loss term, and models with buffers, run "
        "eagerly; no effect on a CPU); compile (CPU only): the same steps compiled with torch.compile once a batch "
        "shape has come up 20 times, ~2x faster for small models but ~45 s of compiling per shape the first time on "
        "a machine (~1 s from torch's cache after), for long runs; off: every step eager")
    chunk_clients: int | None = Field(
        None, ge=1, description="at most this many clients trained at once (memory budget)"
    )
    memory_budget_mb: float | None = Field(
        None, gt=0, description="working set of one chunk of clients; None: 128 MB on a CPU (cache-friendly), "
        "a quarter of the free GPU memory on CUDA (GPUs need big stacks to be busy)"
    )
    checkpoint_every: int | None = Field(
        10, ge=1, description="write a resumable checkpoint every this many rounds (and at the end of the "
        "federated phase and of personalisation); None: only at the end. `hetfed run --resume DIR` continues"
    )
    # -- clients that fail or straggle (see docs/robustness.md; what the server does with their updates: server.*)
    client_dropout: float = Field(0.0, ge=0, lt=1, description="probability that a sampled client fails to report")
    stragglers: StragglerConfig = Field(default_factory=StragglerConfig)
    clock: ClockConfig = Field(default_factory=ClockConfig)

    @model_validator(mode="after")
    def _one_clock(self) -> TrainConfig:
        if self.stragglers.distribution == "none" and self.stragglers.deadline is not None:
            raise ValueError(f"train.stragglers.deadline = {self.stragglers.deadline:g} is not allowed with "
                             "train.stragglers.distribution = 'none': nobody would be late; expected a distribution "
                             "(lognormal, exponential, uniform) or train.clock.deadline (seconds)")
        if self.stragglers.distribution != "none" and self.clock != ClockConfig():
            raise ValueError(f"train.stragglers.distribution = {self.stragglers.distribution!r} with train.clock set is "
                             "not allowed: stragglers is the clock in median-step units; expected train.clock alone "
                             "(latency, spread, deadline in seconds) or train.stragglers alone")
        return self

    @field_validator("executor")
    @classmethod
    def _selectable_executor(cls, name: str) -> str:
        executors = registry_of("executor")
        selectable = [n for n, kind in executors.items() if kind.selectable]
        if name not in selectable:
            raise ValueError(f"not allowed: expected one of {selectable}"
                              + (" (a deployment is chosen by running on one: hetfed flower run)"
                                 if name in executors.names() else ""))
        return name



class SecAggPlusConfig(_Strict):
    """Flower's SecAgg+ (Bell et al. 2020) for a round's training (``flower.secure_aggregation: secaggplus``):
    the server learns only the sample-weighted mean of the nodes' updates. The parameters are Flower's
    ``SecAggPlusWorkflow``'s (an int is a count, a float a share) — :mod:`hetfed.flower.secure`."""

    num_shares: int | float = Field(
        1.0, gt=0, description="shares each node's secrets are split into: an int > 2 (a count), or a float (a share "
        "of the round's nodes; 1.0: every node is every node's neighbour, plain SecAgg)")
    reconstruction_threshold: int | float = Field(
        0.5, gt=0, description="shares needed to rebuild a secret: an int < num_shares, or a float in (0, 1] (a share "
        "of num_shares); the round survives nodes dropping as long as each keeps this many live neighbours")
    clipping_range: float = Field(
        8.0, gt=0, description="each weighted update coordinate is clipped to [-this, this] before quantisation "
        "(hetfed sends the update θ − θ_global, so 8 clips nothing in practice)")
    quantization_bits: int = Field(22, ge=1, le=30, description="updates are quantised to 2**this levels")
    modulus_bits: int = Field(32, ge=2, le=32, description="masks are drawn modulo 2**this (> quantization_bits)")
    max_weight: float | None = Field(
        None, gt=0, description="the largest weight (training samples) a node may send; None: the largest node's "
        "training samples when the server knows the partition, else 10 000")

    @field_validator("num_shares", "reconstruction_threshold")
    @classmethod
    def _one_is_all(cls, value: int | float) -> int | float:
        """1 means all of them, as in Flower (``1`` and ``1.0`` alike)."""
        return 1.0 if value == 1 else value

    @model_validator(mode="after")
    def _consistent(self) -> SecAggPlusConfig:
        if self.modulus_bits <= self.quantization_bits:
            raise ValueError(f"flower.secaggplus.modulus_bits = {self.modulus_bits} is not allowed with "
                             f"quantization_bits = {self.quantization_bits}: expected more modulus bits than "
                             "quantisation bits (the masked sums must not wrap)")
        shares, threshold = self.num_shares, self.reconstruction_threshold
        if isinstance(shares, int) and shares <= 2:
            raise ValueError(f"flower.secaggplus.num_shares = {shares} is not allowed: expected an int > 2 or a "
                             "share of the nodes as a float (e.g. 1.0)")
        if isinstance(threshold, float) and threshold > 1:
            raise ValueError(f"flower.secaggplus.reconstruction_threshold = {threshold} is not allowed: a float is a "
                             "share of num_shares, expected one in (0, 1]")
        if isinstance(threshold, int) and isinstance(shares, int) and threshold >= shares:
            raise ValueError(f"flower.secaggplus.reconstruction_threshold = {threshold} is not allowed with "
                             f"num_shares = {shares}: expected fewer")
        return self


class FlowerConfig(_Strict):
    """How the server talks to clients on Flower (``train.executor: flower``)."""

    round_timeout: float | None = Field(
        600, gt=0, description="seconds to wait for a step's replies; clients that miss it count as failed "
        "(None waits for all: a dead SuperNode then hangs the run)"
    )
    min_replies: int = Field(1, ge=1, description="a round with fewer training replies is skipped and logged")
    connect_timeout: float = Field(120, gt=0, description="seconds to wait for one SuperNode per client")
    client_cpus: float = Field(1, gt=0, description="Simulation Engine: CPUs per ClientApp (2 on 2 cores = 1 at a time)")
    nodes: int | None = Field(
        None, ge=1, description="dataset.name = nodes: how many SuperNodes with their own data to wait for at set-up "
        "(within connect_timeout); the federation is the clients of those that answer without an error")
    ray_address: str | None = Field(
        None, description="Simulation Engine: join the running Ray cluster at this address (`auto`, or the "
        "host:port that `ray start --head` prints) instead of starting Ray here; its nodes host the ClientApps, "
        "each with hetfed and the data installed (docs/flower.md)")
    clients_per_node: int = Field(
        1, ge=1, description="Simulation Engine: clients per SuperNode; a node trains its cohort stacked (the "
        "vectorised executor) and sends one combined upload — ceil(clients / this) nodes")
    gamma_summaries: bool = Field(
        True, description="at set-up each client sends its feature count, sum and sum of outer products once; the "
        "server computes Γ from them (hetfed.gamma_summaries) — what a real federation's Γ is made of")
    summary_noise: float | None = Field(
        None, ge=0, description="Gaussian noise multiplier on those summaries (record-level DP; needs summary_clip); "
        "the (ε, δ) is reported")
    summary_clip: float | None = Field(None, gt=0, description="rows are scaled to this L2 norm before summarising")
    summary_delta: float = Field(1e-5, gt=0, lt=1, description="δ of the summaries' (ε, δ)")
    secure_aggregation: Literal["none", "secaggplus"] = Field(
        "none", description="secaggplus: a round's updates are summed under Flower's SecAgg+ — the server sees only "
        "their weighted mean (methods whose upload is shared parameters and the training loss; docs/flower.md)")
    secaggplus: SecAggPlusConfig = Field(default_factory=SecAggPlusConfig)
    packed_messages: bool = Field(
        True, description="a message's records travel as one Flower array (their protobuf bytes: "
        "hetfed.flower.packing), so Flower moves ~5 objects per message instead of one per record and tensor; false: "
        "as Flower records (SecAgg+ rounds always are)")

    @model_validator(mode="after")
    def _noise_needs_clip(self):
        if self.summary_noise is not None and self.summary_clip is None:
            raise ValueError(f"flower.summary_noise = {self.summary_noise} is not allowed without flower.summary_clip: "
                             "the noise is calibrated to the rows' norm bound; expected a clip (e.g. 10)")
        return self


class ServerDataConfig(_Strict):
    """Unlabeled data the server holds (FedDF distils on it). Labels are never used.

    ``auto``: a ``holdout`` when a method needs server data, else none. ``holdout``:
    a random ``fraction`` of the training pool is taken out *before* partitioning
    (every method of the run then trains on the same smaller pool). ``dataset``:
    the training images of another dataset (``name``), e.g. Fashion-MNIST for an
    MNIST federation; its inputs must have the federation's shape.
    """

    source: Literal["auto", "none", "holdout", "dataset"] = "auto"
    fraction: float = Field(0.1, gt=0, lt=1, description="holdout: share of the training pool the server keeps")
    name: str | None = Field(None, description="dataset: which dataset's training inputs")
    data_dir: str | None = None
    max_samples: int | None = Field(10_000, ge=10, description="at most this many server samples (random)")

    @field_validator("name")
    @classmethod
    def _registered_dataset(cls, name: str | None) -> str | None:
        if name is not None:
            registry_of("dataset").get(name, "server_data.name")
        return name


class AttackConfig(_Strict):
    """Malicious clients, for testing defences: a fixed ``fraction`` of the opted-in clients, drawn from the seed.

    Model poisoning changes what they upload (Δ = θ_k − θ_global): ``sign_flip`` sends
    −factor·Δ (default factor 4), ``scale`` sends factor·Δ (default 10), ``gaussian`` sends
    noise N(0, noise_std²) in place of Δ; data poisoning: ``label_flip`` trains on labels
    y → C − 1 − y. Simulated by the in-process executors (on Flower the clients are real).
    """

    kind: Literal["none", "sign_flip", "scale", "gaussian", "label_flip"] = "none"
    fraction: float = Field(0.1, ge=0, le=1)
    factor: float | None = Field(None, gt=0, description="sign_flip: 4, scale: 10 when unset")
    noise_std: float = Field(1.0, gt=0)


class PrivacyConfig(_Strict):
    """Client-level DP-FedAvg (McMahan et al. 2018): clip each update, add Gaussian noise to the aggregate.

    On when ``noise_multiplier`` is set. ε for ``delta`` is computed by Google's
    dp-accounting (RDP, Poisson-subsampled Gaussian, q = clients per round / eligible clients).
    """

    noise_multiplier: float | None = Field(None, ge=0, description="z: noise std = z·clip / m (None: no DP)")
    clip: float | None = Field(1.0, gt=0, description="S: each client's update is scaled to norm ≤ S (None: no clipping, "
                               "only with noise_multiplier 0)")
    delta: float = Field(1e-5, gt=0, lt=1)
    weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="uniform: every clipped update counts 1/m (the sensitivity is S/m, so ε holds); "
        "samples: FedAvg's weights n_k/Σn, noise std z·S·max n_k/Σn (ε then assumes the weights are public)"
    )

    @model_validator(mode="after")
    def _noise_needs_clip(self) -> PrivacyConfig:
        if self.noise_multiplier and self.clip is None:
            raise ValueError(f"privacy.clip = None with privacy.noise_multiplier = {self.noise_multiplier}: "
                             "noise is only meaningful relative to a clip bound; expected a positive clip")
        return self


class ScreenConfig(_Strict):
    """The server chain's first step: which updates are kept (hetfed.server.screen)."""

    norm_factor: float | None = Field(
        10.0, gt=1, description="reject updates whose norm ‖θ_k − θ_global‖ exceeds this × the reference median "
        "(the median norm of the round's first server.screen.reference_clients updates; None: off); NaN/inf "
        "updates are always rejected"
    )
    reference_clients: int = Field(
        32, ge=3, description="the norm filter's reference median is taken over the round's first this-many "
        "updates (by client id; all when the round has fewer); only they are held, the rest of the round streams"
    )


class ServerConfig(_Strict):
    """The server pipeline of every algorithm whose server holds a model (hetfed.server.chain): screen →
    combine (a registered rule, or DP-FedAvg's noised mean under ``privacy``) → server optimiser on the
    pseudo-gradient (see hetfed.server.optimizers for the update equations)."""

    screen: ScreenConfig = Field(default_factory=ScreenConfig)
    combine: dict[str, Any] = Field(
        default_factory=lambda: {"rule": "mean"}, description="rule: mean (FedAvg's sample-weighted mean), or a "
        "robust rule (unweighted: median, trimmed_mean, krum, multi_krum), with the rule's own keys (trimmed_mean: "
        "fraction; krum: byzantine_fraction; multi_krum: byzantine_fraction, keep, weighted; docs/robustness.md)"
    )
    min_clients: int = Field(
        1, ge=1, description="a round with fewer accepted updates is skipped (logged in metrics.csv), not averaged"
    )
    compression: dict[str, Any] = Field(
        default_factory=lambda: {"kind": "none"}, description="how each client's update Δ travels: kind none, "
        "qsgd (bits, bucket), topk (fraction), fp16, bf16 (`hetfed components compressor`), and error_feedback "
        "(clients keep what was not sent and add it to their next update; docs/async.md, 'Compression of what clients send')"
    )

    optimizer: str = Field(
        "sgd", description="a registered server optimiser (hetfed.server.optimizers): sgd (FedAvg's step; lr 1: the "
        "average itself), avgm (FedAvgM, Hsu et al. 2019), adagrad / adam / yogi (FedAdagrad / FedAdam / FedYogi, "
        "Reddi et al. 2021, Algorithm 2)"
    )
    lr: float | None = Field(None, gt=0, description="server learning rate η (None: 1 for sgd and avgm, 0.01 for "
                             "the adaptive ones)")
    momentum: float = Field(0.9, ge=0, lt=1, description="avgm: server momentum β")
    beta1: float = Field(0.9, ge=0, lt=1, description="adaptive: first-moment decay β₁")
    beta2: float = Field(0.99, ge=0, lt=1, description="adam / yogi: second-moment decay β₂")
    tau: float = Field(1e-3, gt=0, description="adaptive: τ, the adaptivity (and v₋₁ = τ²)")
    bias_correction: bool = Field(
        False, description="adaptive: Kingma & Ba's bias correction η·√(1−β₂ᵗ)/(1−β₁ᵗ) at step t = 1, 2, … and "
        "v₋₁ = 0 (the paper has neither; Flower's is variant 'flower')"
    )
    variant: Literal["paper", "flower"] = Field(
        "paper", description="paper: Reddi et al.'s Algorithm 2 and Hsu et al.'s FedAvgM; flower: Flower's own "
        "FedAdagrad / FedAdam / FedYogi / FedAvgM (flwr.serverapp.strategy): v₋₁ = 0, FedAdam's η scaled by "
        "√(1−β₂^(t+1))/(1−β₁^(t+1)) at round t, FedAdagrad without β₁ (hetfed.server.optimizers)"
    )

    @model_validator(mode="after")
    def _registered_steps(self) -> ServerConfig:
        registry_of("optimizer").get(self.optimizer)  # the registered rules and optimisers (discovered, not listed)
        combine = dict(self.combine)
        registry_of("combine").params(str(combine.pop("rule", "mean")), combine, "server.combine")
        compression = dict(self.compression)
        feedback = compression.pop("error_feedback", False)
        kind = str(compression.pop("kind", "none"))
        compressors = registry_of("compressor")
        compressors.params(kind, compression, "server.compression")
        if not isinstance(feedback, bool):
            raise ValueError(f"server.compression.error_feedback = {feedback!r} is not allowed: expected true or false")
        if feedback and not compressors.get(kind).lossy:
            raise ValueError(f"server.compression.error_feedback = true is not allowed with server.compression.kind "
                             f"= {kind!r}: it loses nothing to feed back; expected a lossy kind "
                             f"{[n for n, c in compressors.items() if c.lossy]} or error_feedback: false")
        return self

    @model_validator(mode="after")
    def _one_correction(self) -> ServerConfig:
        if self.variant == "flower" and self.bias_correction:
            raise ValueError("server.bias_correction = true is not allowed with server.variant = 'flower': Flower's "
                             "strategies have their own correction; expected one of the two")
        return self

    @property
    def effective_lr(self) -> float:
        """``lr``, or the optimiser's own default (1 for sgd and avgm, 0.01 for the adaptive ones)."""
        optimizer = registry_of("optimizer").get(self.optimizer)  # discovered, not listed here
        return self.lr if self.lr is not None else float(optimizer.default_lr)


class MethodConfig(_Strict):
    """One method of a comparison: its algorithm and that algorithm's own ``params`` (see
    ``hetfed algorithms``); ``model``/``train``/``server`` override the top-level sections.

    Precedence, lowest first: the defaults, the config file's top-level sections, the file's
    per-method keys, a top-level override (``--set``, ``--grid``, the API's ``overrides``), a
    per-method override (``--set methods.1.train.rounds=…``). A top-level override replaces
    the per-method values of the same key, with a note naming them.
    """

    name: str | None = None
    algorithm: str = "fedavg"
    params: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] = Field(default_factory=dict)
    train: dict[str, Any] = Field(default_factory=dict)
    server: dict[str, Any] = Field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name or self.algorithm


class Config(_Strict):
    """A whole run: data, embedding, partition, and the methods to compare."""

    seed: int = Field(0, ge=0, lt=2**32, description="every random choice derives from it (< 2³², the range "
                      "NumPy's and scikit-learn's generators take)")
    name: str = "default"
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    embed: EmbedConfig = Field(default_factory=EmbedConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    heterogeneity: HeterogeneityConfig = Field(default_factory=HeterogeneityConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    flower: FlowerConfig = Field(default_factory=FlowerConfig)
    server_data: ServerDataConfig = Field(default_factory=ServerDataConfig)
    attack: AttackConfig = Field(default_factory=AttackConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    methods: list[MethodConfig] = Field(default_factory=lambda: [
        MethodConfig(name="relu", algorithm="fedavg", model={"kind": "mlp", "dropout": 0.5}),
        MethodConfig(name="cgau", algorithm="fedavg", model={"kind": "cgau", "dropout": 0.5}),
    ])
    out_dir: str = "runs"
    tracking: list[Literal["tensorboard", "mlflow"]] = Field(
        default_factory=list, description="mirror every round's metrics to these trackers as they are written: "
        "tensorboard (RUN/tb/), mlflow (MLFLOW_TRACKING_URI, else RUN/mlflow.db; a sweep's runs share "
        "SWEEP/mlflow.db); needs hetfed[tracking]"
    )
    plugins: list[str] = Field(
        default_factory=list, description="modules imported before the methods are checked: algorithms of your own "
        "that call hetfed.algorithms.registry.register (on Flower, every SuperNode imports them too)"
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """The user's plugins first (what they register — an algorithm, a combine rule, a server optimiser — is
        then known to every section's validation); keys that moved: a one-line error or note naming the new key."""
        if isinstance(data, dict):
            plugins = data.get("plugins")
            if isinstance(plugins, list) and all(isinstance(m, str) for m in plugins):
                _import_plugins(plugins)
            config_legacy.refuse_legacy(data, ServerConfig().model_dump(mode="json"))
        return data

    @model_validator(mode="after")
    def _methods_resolve(self, info: ValidationInfo) -> Config:
        """The methods resolve to registered algorithms with valid params and overrides; with the validation
        context's ``scope`` = ``"data"`` (a command that only builds the federation, ``hetfed partition``), the
        checks between a method's model and the data are left out: nothing is trained."""
        scope = (info.context or {}).get("scope", "run")
        registry = registry_of("algorithm")  # the algorithms' own declarations (discovered, not listed here)

        _import_plugins(self.plugins)
        if not self.methods:
            raise ValueError("methods is empty: list at least one method")
        labels = [m.label for m in self.methods]
        if len(set(labels)) != len(labels):
            raise ValueError(f"methods have repeated names {labels}: give each a unique name")
        if registry_of("dataset").get(self.dataset.name).on_nodes:
            _check_nodes_dataset(self)
        if self.server_data.source == "dataset" and self.server_data.name is None:
            raise ValueError("server_data.source = 'dataset' needs server_data.name: expected a dataset name, "
                             "e.g. fashion-mnist")
        for i, m in enumerate(self.methods):
            spec = registry.get(m.algorithm, f"methods.{i}.algorithm")
            spec.make_params(m.params, f"methods.{i}.params")
            caps = spec.capabilities
            if caps.server_data and self.server_data.source == "none":
                raise ValueError(f"server_data.source = 'none' is not allowed with methods.{i}.algorithm = "
                                 f"{m.algorithm!r}: it needs unlabeled server data; expected 'auto', 'holdout' or "
                                 "'dataset'")
            clash = sorted(set(caps.views) & (set(labels) - {m.label})) if m.label == m.algorithm else []
            if clash:  # a method named after its algorithm reports its views unprefixed
                raise ValueError(f"methods names {clash} clash with the rows of the method named {m.label!r} "
                                 f"(its views {sorted(caps.views)}): rename them")
            server = _deep_merge(self.server.model_dump(), m.server)
            if not caps.server_model and server.get("compression") != ServerConfig().compression:
                raise ValueError(f"server.compression = {server.get('compression')} is not allowed with methods.{i}"
                                 f".algorithm = {m.algorithm!r}: it uploads no model to compress; expected the default "
                                 f"{ServerConfig().compression} for this method (methods.{i}.server.compression)")
            for section in METHOD_SECTIONS:
                method_section(self, m, section, f"methods.{i}.{section}")
            if scope == "run":
                self._check_model(i, m, caps)
        self._refuse_untaken()
        return self

    def _refuse_untaken(self) -> None:
        """A top-level key of a methods' default section (``model.condition_output``) that neither its own choice
        nor any method's takes is refused, naming what the methods' choices take."""
        for name in METHOD_SECTIONS:
            top = getattr(self, name)
            if not isinstance(top, _Chosen):
                continue
            untaken = top.not_taken()
            chosen = {method_section(self, m, name).choice for m in self.methods}
            registry = registry_of(top.chosen_by[0])
            takes = {c: sorted(registry.get(c).Params.model_fields) for c in sorted(chosen | {top.choice})}
            for key, value in untaken.items():
                if not any(key in fields for fields in takes.values()):
                    raise ValueError(f"{name}.{key} = {value!r} is not allowed: neither {name}.{top.chooser} = "
                                     f"{top.choice!r} nor a method's {registry.noun} takes it; they take {takes}")

    def _check_model(self, i: int, method: MethodConfig, caps) -> None:
        """The model reads what the data gives (feature vectors, token ids, character windows: each model kind
        declares its inputs, each dataset and extractor what it gives), and the algorithm supports it."""
        kind = self.method_model(method).kind
        models = registry_of("model")
        spec = models.get(kind)
        gives = registry_of("embedding").get(self.embed.kind).gives or registry_of("dataset").get(
            self.dataset.name).gives
        if spec.inputs != gives:
            readers = [name for name, m in models.items() if m.inputs == gives]
            need = f"need model.kind = {readers[0]!r}" if len(readers) == 1 else f"need model.kind in {readers}"
            raise ValueError(f"methods.{i} model.kind = {kind!r} with embed.kind = {self.embed.kind!r} is not allowed "
                             f"(dataset.name = {self.dataset.name!r}): the model reads {spec.inputs}, the data gives "
                             f"{gives}, which {need}")
        if caps.model_kinds is not None and kind not in caps.model_kinds:
            raise ValueError(f"methods.{i}.algorithm = {method.algorithm!r} is not allowed with model.kind = "
                             f"{kind!r}: {caps.model_reason or 'unsupported'}; expected model.kind in "
                             f"{list(caps.model_kinds)}")

    def method_server(self, method: MethodConfig) -> ServerConfig:
        """The server config a method runs with: top-level, then its overrides."""
        return method_section(self, method, "server")

    def method_model(self, method: MethodConfig) -> ModelConfig:
        """The model config a method runs with: top-level, then its overrides."""
        return method_section(self, method, "model")

    def method_train(self, method: MethodConfig) -> TrainConfig:
        """The train config a method runs with: top-level, then its overrides."""
        return method_section(self, method, "train")


def _import_plugins(modules: list[str]) -> None:
    """Import the user's plugin modules (each registers its components: algorithms, combine rules, server
    optimisers)."""
    import importlib

    for i, name in enumerate(modules):
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(f"plugins.{i} = {name!r} cannot be imported ({err}): expected a module on the Python "
                             "path (PYTHONPATH) that registers components") from None


def migrate_legacy(raw: dict) -> dict:
    """A config written by an older hetfed (a run directory's config.yaml) in today's keys
    (:func:`hetfed.config_legacy.migrate_legacy`)."""
    chosen = {name: (*section.chosen_by, frozenset(section.model_fields)) for name, f in Config.model_fields.items()
              if isinstance(section := f.annotation, type) and issubclass(section, _Chosen)}
    return config_legacy.migrate_legacy(raw, ServerConfig().model_dump(mode="json"), chosen)


def load_run_config(path: str | Path) -> Config:
    """The config of a run directory (``config.yaml``), written by this or an older hetfed."""
    return build_config(migrate_legacy(read_yaml(path)))


def _deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)  # the result shares nothing with its inputs
    return out


def _format_errors(err: ValidationError, prefix: str = "") -> str:
    lines = []
    for e in err.errors():
        key = prefix + ".".join(str(p) for p in e["loc"])
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown key {key!r} (check the spelling; see `hetfed config`)")
            continue
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        value = e.get("input")
        shown = "" if isinstance(value, dict) or not key else f" = {value!r}"
        names_itself = key and (msg.startswith((f"{key}.", f"{key} ")) or f"'{key}." in msg)  # a step's own message
        lines.append(f"{key}{shown}: {msg}" if key and not names_itself else msg)
    return "; ".join(lines)


def build_config(raw: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None,
                 scope: Literal["run", "data"] = "run") -> Config:
    """Validate a raw mapping (plus overrides) into a Config, or raise ConfigError.

    ``scope = "data"``: for commands that only build the federation (no method is trained, so a
    method's model need not suit the data)."""
    # start from the defaults so --set can reach into default lists (methods.0.…)
    try:
        merged = _deep_merge(as_given(Config()), raw or {})
    except AttributeError:
        raise ConfigError("invalid config: every section must be a mapping of keys") from None
    items = _flatten(overrides or {})
    # a whole methods list typed in the overrides first (its keys are the user's own, not the file's); then the
    # top-level keys, which replace the file's per-method values of the same key; then the per-method overrides
    typed_methods = any(key == "methods" for key, _ in items)

    def rank(item: tuple[str, Any]) -> tuple[int, bool]:  # a choice of component before its parameters
        level = 0 if item[0] == "methods" else 2 if item[0].startswith("methods.") else 1
        return level, not item[0].endswith((".kind", ".name"))

    for key, value in sorted(items, key=rank):
        if not typed_methods and key.split(".")[0] != "methods":
            _override_methods(merged, key, value)
        _rechoose(merged, key, value)
        set_dotted(merged, key, value)
    try:
        return Config.model_validate(merged, context={"scope": scope, "whole": True})
    except ValidationError as err:
        raise ConfigError("invalid config: " + _format_errors(err)) from None


#: the top-level sections a method may override with its own keys (``methods.<i>.model`` …)
METHOD_SECTIONS = tuple(k for k in MethodConfig.model_fields if k in Config.model_fields
                        and isinstance(annotation := Config.model_fields[k].annotation, type)
                        and issubclass(annotation, BaseModel))


def _override_methods(merged: dict[str, Any], key: str, value: Any) -> None:
    """A top-level override of ``key`` wins over the methods' own values of it (or of keys under it): they are
    removed, with a note naming each, so the override is applied to every method (MethodConfig's precedence)."""
    import warnings

    section, _, rest = key.partition(".")
    methods = merged.get("methods")
    if section not in METHOD_SECTIONS or not rest or not isinstance(methods, list):
        return
    path = rest.split(".")
    for i, method in enumerate(methods):
        node = method.get(section) if isinstance(method, dict) else None
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or path[-1] not in node:
            continue
        old = node.pop(path[-1])
        label = method.get("name") or method.get("algorithm", "fedavg")
        warnings.warn(f"{key} = {value!r} replaces methods.{i}.{key} = {old!r} (method {label!r}): an override of "
                      f"a top-level key applies to every method; to set one method's, use methods.{i}.{key}",
                      OverriddenKey, stacklevel=3)


def _rechoose(merged: dict[str, Any], key: str, value: Any) -> None:
    """An override that chooses a component (``--set partition.kind=dirichlet``) drops the parameters written for
    the choice it replaces that the new one does not take (``partition.p`` of ``majority``; for a top-level
    ``model.kind``, also the methods' own ``model`` parameters), with a note naming each. A parameter typed as an
    override itself is applied after the choice, so it is kept or refused, never dropped."""
    import warnings

    *path, leaf = key.split(".")
    methods = merged.get("methods") if isinstance(merged.get("methods"), list) else []
    if len(path) == 1 and path[0] in Config.model_fields:
        section, nodes = path[0], [(path[0], merged.get(path[0]))]
        if section in METHOD_SECTIONS:
            nodes += [(f"methods.{i}.{section}", m.get(section)) for i, m in enumerate(methods) if isinstance(m, dict)]
    elif len(path) == 3 and path[0] == "methods" and path[1].isdigit() and int(path[1]) < len(methods):
        section, nodes = path[2], [(key.rpartition(".")[0], (methods[int(path[1])] or {}).get(path[2]))]
    else:
        return
    schema = Config.model_fields[section].annotation if section in Config.model_fields else None
    if not (isinstance(schema, type) and issubclass(schema, _Chosen) and leaf == schema.chosen_by[1]):
        return
    registry = registry_of(schema.chosen_by[0])
    component = registry.find(str(value))
    if component is None:
        return  # validation names the choice that is not registered
    for where, node in nodes:
        for param in [k for k in node or {} if k not in schema.model_fields and k not in component.Params.model_fields]:
            warnings.warn(f"{where}.{param} = {node.pop(param)!r} is dropped: {key} = {value!r} chose a "
                          f"{registry.noun} that does not take it", OverriddenKey, stacklevel=4)


class OverriddenKey(HetfedNote):
    """A method's own value of a key was replaced by a top-level override of that key."""


class UnreadKey(HetfedNote):
    """A key set to a value other than its default that nothing the config chose reads."""


def _away_from_default(section: _Strict) -> dict[str, Any]:
    """The section's keys whose (dumped) value differs from their default, with that value (a nested section's
    keys dotted: ``secaggplus.num_shares``)."""
    fields = type(section).model_fields
    out: dict[str, Any] = {}
    for k, v in section.model_dump().items():
        value = getattr(section, k)
        if isinstance(value, _Strict):
            out.update({f"{k}.{key}": inner for key, inner in _away_from_default(value).items()})
        elif v != fields[k].get_default(call_default_factory=True):
            out[k] = v
    return out


def _unread_flower(config: Config, executor: str | None = None) -> dict[str, str]:
    """A note per ``flower.*`` key set away from its default where the run's clients live in this process (the
    Flower executors read that section; the others never do), and per ``flower.secaggplus.*`` key set without
    secure aggregation. ``executor``: where the run really goes when not ``train.executor`` (``hetfed flower run``
    hands its run to a deployment)."""
    if not registry_of("executor").get(executor or config.train.executor).in_process:
        if config.flower.secure_aggregation != "none":
            return {}
        return {f"flower.secaggplus.{key}": (f"flower.secaggplus.{key} = {value!r} is not read with "
                                             "flower.secure_aggregation = 'none': it applies to 'secaggplus'")
                for key, value in _away_from_default(config.flower.secaggplus).items()}
    return {f"flower.{key}": (f"flower.{key} = {value!r} is not read with train.executor = "
                              f"{config.train.executor!r}: it applies to the Flower executors (flower, deployment)")
            for key, value in _away_from_default(config.flower).items()}


def unread_keys(config: Config, executor: str | None = None) -> dict[str, str]:
    """One note per setting that is applied to nothing, keyed by its dotted key: a ``flower`` key where the run's
    clients are in this process, a ``server`` key where the method's algorithm has no server model, a top-level
    ``model`` parameter that no method's model kind takes. (A key the chosen component does not have at all is
    refused by its ``Params``, not noted.)"""
    algorithms = registry_of("algorithm")
    notes = _unread_flower(config, executor)
    serves = [algorithms.get(m.algorithm).capabilities.server_model for m in config.methods]
    for i, (m, server_model) in enumerate(zip(config.methods, serves, strict=True)):
        for key, value in ([] if server_model else _flatten(m.server)):
            notes[f"methods.{i}.server.{key}"] = (f"methods.{i}.server.{key} = {value!r} is not read: algorithm "
                                                  f"{m.algorithm!r} has no server model")
    for key, value in ({} if any(serves) else _away_from_default(config.server)).items():
        notes[f"server.{key}"] = (f"server.{key} = {value!r} is not read by any method: no method's algorithm has a "
                                  "server model")
    models = registry_of("model")
    kinds = {method_section(config, m, "model").kind for m in config.methods}
    for key, value in (config.model.model_extra or {}).items():
        if not any(key in models.get(kind).Params.model_fields for kind in kinds):
            notes[f"model.{key}"] = (f"model.{key} = {value!r} is not read by any method: their model kinds "
                                     f"{sorted(kinds)} do not take it (see `hetfed config` for each method's settings)")
    return notes


def _flatten(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.extend(_flatten(value, full + "."))
        else:
            out.append((full, value))
    return out


def load_config(path: str | Path | None = None, sets: list[str] | None = None,
                scope: Literal["run", "data"] = "run", executor: str | None = None) -> Config:
    """The config a command runs with: the file (or defaults), then ``--set`` items; a note for each
    setting nothing reads (:func:`warn_unread`; ``executor``: where the run goes when the command, not
    ``train.executor``, decides)."""
    overrides = parse_overrides(sets)  # first: `--set key 3` makes "3" look like the config file
    raw = read_yaml(path) if path is not None else {}
    return warn_unread(build_config(raw, overrides, scope), executor)


def warn_unread(config: Config, executor: str | None = None) -> Config:
    """Warn (:class:`UnreadKey`, a ``note:`` line on the command line) for every setting of ``config`` that
    nothing reads (:func:`unread_keys`); called where a user's config is read, not where a saved one is."""
    import warnings

    for note in unread_keys(config, executor).values():
        warnings.warn(note, UnreadKey, stacklevel=2)
    return config


def as_given(config: Config) -> dict[str, Any]:
    """``config`` as plain data the way it was given: each chosen component's parameters only where they were set
    (a dump fills them all in), so another choice can be merged onto it (``--set partition.kind=iid``)."""
    return config.model_dump(mode="json", context={"as_given": True})


def dump_config(config: Config) -> str:
    """The resolved config as YAML, as written into every run directory, ending with comment lines that say
    what each method runs with where it differs from the top-level sections."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False) + effective_methods(config)


def method_section(config: Config, method: MethodConfig, section: str, where: str | None = None) -> Any:
    """The ``section`` (one of :data:`METHOD_SECTIONS`) a method runs with: top-level, then its own keys (its
    type is the top-level section's: ``ModelConfig`` for ``model`` …). A method that chooses another component
    than the top-level section (``methods[i].model.kind``) gets the top-level parameters that component takes.
    ``where``: the key errors name (``methods.0.model``)."""
    top = getattr(config, section)
    own = getattr(method, section)
    base = top.given_for(str(own.get(top.chooser, top.choice))) if isinstance(top, _Chosen) else top.model_dump()
    if where is None:
        return type(top).model_validate(_deep_merge(base, own))
    try:
        return type(top).model_validate(_deep_merge(base, own), context={"where": where})
    except ValidationError as err:
        message = _format_errors(err, prefix="")
        raise ValueError(message if f"'{where}." in message else f"in {where}: {message}") from None


def effective_methods(config: Config) -> str:
    """YAML comments: each method's effective settings that differ from the top-level sections."""
    lines = ["# effective settings per method, where they differ from the top-level sections:"]
    for i, m in enumerate(config.methods):
        differ = []
        for section in METHOD_SECTIONS:
            top = dict(_flatten(getattr(config, section).model_dump(mode="json"), f"{section}."))
            own = _flatten(method_section(config, m, section).model_dump(mode="json"), f"{section}.")
            differ += [f"{k} = {json.dumps(v)}" for k, v in own if top.get(k) != v]
        lines.append(f"#   methods.{i} {m.label} ({m.algorithm}): {', '.join(differ) or 'none'}")
    return "\n".join(lines) + "\n"


def _check_nodes_dataset(config: Config) -> None:
    """``dataset.name = nodes``: the data is on the SuperNodes, so the run states its schema, runs on Flower and
    needs no server data cut from a dataset."""
    if config.flower.nodes is None:
        raise ValueError("dataset.name = 'nodes' needs flower.nodes: how many SuperNodes with their own data to wait "
                         "for at set-up, e.g. 3")
    if config.embed.kind != "identity":
        raise ValueError(f"embed.kind = {config.embed.kind!r} is not allowed with dataset.name = 'nodes': nodes read "
                         "feature tables; expected 'identity'")
    if config.server_data.source in ("holdout", "dataset") or any(
            _needs_server_data(m.algorithm) for m in config.methods):
        raise ValueError("server_data is not available with dataset.name = 'nodes' (the server holds no data): "
                         "expected methods that need no server data and server_data.source 'auto' or 'none'")
    if config.partition.opt_out:
        raise ValueError(f"partition.opt_out = {config.partition.opt_out} is not allowed with dataset.name = 'nodes': "
                         "a node's clients opt out by not joining; expected 0")


def _needs_server_data(algorithm: str) -> bool:
    registry = registry_of("algorithm")

    return registry.get(algorithm, "methods.algorithm").capabilities.server_data
