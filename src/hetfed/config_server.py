"""The server's sections: its data, simulated attackers, client-level DP and the server chain (``server.*``)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from hetfed.config_base import Chosen, Strict
from hetfed.registry import registry_of


class ServerDataConfig(Strict):
    """Data the server holds: FedDF distils on it, unlabeled; FLTrust's combine rule trains on it as a labelled root
    set (the only reader of its labels, kept for it alone).

    ``auto``: a ``holdout`` when a method needs server data or its combine rule a root set, else none. ``holdout``:
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

    def unread(self) -> dict[str, tuple[Any, str]]:
        """What the source takes: a holdout its ``fraction``, another dataset its ``name`` and ``data_dir``; ``none``
        nothing (``auto`` is a holdout when a method needs server data)."""
        takes = {"none": (), "auto": ("fraction", "max_samples"), "holdout": ("fraction", "max_samples"),
                 "dataset": ("name", "data_dir", "max_samples")}[self.source]
        others = [k for k in ("fraction", "name", "data_dir", "max_samples") if k not in takes]
        why = f"server_data.source = {self.source!r} does not take it"
        return {k: (v, why) for k, v in self.away_from_default(*others).items()}

    @model_validator(mode="after")
    def _dataset_named(self) -> ServerDataConfig:
        if self.source == "dataset" and self.name is None:
            raise ValueError("server_data.source = 'dataset' needs server_data.name: expected a dataset name, "
                             "e.g. fashion-mnist")
        return self


class AttackConfig(Chosen):
    """Malicious clients, for testing defences: a fixed ``fraction`` of the opted-in clients, drawn from the seed,
    doing what ``kind`` does (hetfed.engine.attacks; `hetfed components attack NAME`): model poisoning changes what
    they upload (Δ = θ_k − θ_global) — ``sign_flip`` sends −factor·Δ (``factor`` 4), ``scale`` factor·Δ
    (``factor`` 10), ``gaussian`` noise N(0, noise_std²) in place of Δ; data poisoning: ``label_flip`` trains on
    labels y → C − 1 − y, ``backdoor`` stamps a trigger on a share of its samples and labels them ``target``
    (its success, ``backdoor_accuracy``, measured at every evaluation); colluding model poisoning, crafted from the
    round's honest updates (``knowledge: full``, omniscient) or from the malicious clients' own as they trained them
    (``knowledge: partial``): ``alie`` sends their mean minus ``z`` standard deviations, ``ipm`` −``epsilon`` × their
    mean, ``min_max`` and ``min_sum`` their mean pushed along a ``deviation`` as far as their distances allow,
    ``fang_trim`` every coordinate pushed against their direction past their extreme (by a factor up to ``b``; under
    partial knowledge 3–4 standard deviations past their mean), ``fang_krum`` −λ × their direction, λ the largest Krum
    still chooses. They attack in the rounds ``start_round`` … ``stop_round`` (1-based; by default all).
    Simulated by the in-process executors (on Flower the clients are real)."""

    chosen_by: ClassVar[tuple[str, str]] = ("attack", "kind")

    kind: str = Field("none", description="none, sign_flip, scale, gaussian, label_flip, backdoor, alie, ipm, "
                                               "min_max, min_sum, fang_trim, fang_krum, or a plugin's")
    fraction: float = Field(0.1, ge=0, le=1, description="the share of the opted-in clients that is malicious")
    start_round: int = Field(1, ge=1, description="the first round the malicious clients attack in (1: from the "
                             "start); before it they train and send as honest clients do")
    stop_round: int | None = Field(None, ge=1, description="the last round they attack in (None: to the end); e.g. "
                                   "start_round = stop_round: one round, as Bagdasaryan et al.'s model replacement")

    def unread(self) -> dict[str, tuple[Any, str]]:
        return {k: (v, "attack.kind = 'none': no client is malicious") for k, v in
                self.away_from_default("fraction", "start_round", "stop_round").items()} if self.kind == "none" else {}

    @model_validator(mode="after")
    def _window(self) -> AttackConfig:
        if self.stop_round is not None and self.stop_round < self.start_round:
            raise ValueError(f"attack.stop_round = {self.stop_round} is before attack.start_round = "
                             f"{self.start_round}: expected stop_round ≥ start_round, or None")
        return self

    def attacks_in(self, rnd: int) -> bool:
        """Whether the malicious clients attack in round ``rnd`` (0-based, as the loop counts)."""
        return self.start_round <= rnd + 1 and (self.stop_round is None or rnd + 1 <= self.stop_round)


class LeakageConfig(Chosen):
    """What an honest-but-curious server attacks in a run (hetfed.leakage; `hetfed components leakage NAME`), its
    numbers written beside the method's accuracy (``summary.json``'s ``leakage``, ``runs.csv``'s ``leakage.*``).
    A membership attack (``loss_threshold``, ``lira``) scores the model the run reports — the server's, and each
    client's own where the method has one — on up to ``samples`` training samples (members) and as many held-out
    test samples; an inversion attack (``dlg``, ``idlg``, ``inverting_gradients``, ``label_counts``) reads what
    client ``client`` uploads in round ``round`` — on Flower what the server receives of it: the node's reply, its
    cohort's mean where the node summed it, the round's mean under SecAgg+. Scored against the clients' samples the
    server's process drew the federation from (SuperNodes' own data is refused)."""

    chosen_by: ClassVar[tuple[str, str]] = ("leakage", "kind")

    kind: str = Field("none", description="none, loss_threshold, lira, dlg, idlg, inverting_gradients, label_counts, "
                                          "or a plugin's")
    samples: int = Field(1000, ge=10, description="membership: members scored, at most (each client as many of its "
                                                 "training samples as of its test samples)")
    client: int = Field(0, ge=0, description="inversion: the client whose upload the server attacks")
    round: int = Field(1, ge=1, description="inversion: the round whose upload the server attacks")

    def unread(self) -> dict[str, tuple[Any, str]]:
        """A membership attack reads ``samples``, an inversion ``client`` and ``round``; ``none`` neither."""
        reads = registry_of("leakage").get(self.kind).reads
        takes = {"model": ("samples",), "update": ("client", "round")}.get(reads, ())
        why = f"leakage.kind = {self.kind!r} " + ("attacks nothing" if reads == "nothing" else
                                                   f"reads the {'model' if reads == 'model' else 'upload'}, not it")
        return {k: (v, why) for k, v in self.away_from_default(*(k for k in ("samples", "client", "round")
                                                                 if k not in takes)).items()}


class RecordPrivacyConfig(Strict):
    """Record-level DP in each client's own training (DP-SGD, Abadi et al., CCS 2016): every local step clips each
    sample's gradient to norm ≤ ``clip`` and adds Gaussian noise of std ``noise_multiplier``·``clip`` to their sum,
    divided by the batch size. On when ``noise_multiplier`` is set; each client's ε for ``privacy.delta`` is
    computed by dp-accounting (RDP, q = B / n_k per step, over the steps it took) and the run reports the largest."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # a local step's schedule holds it (hashed)

    noise_multiplier: float | None = Field(None, ge=0, description="σ: noise std = σ·clip per step (None: off)")
    clip: float = Field(1.0, gt=0, description="C: each sample's gradient is scaled to norm ≤ C")

    def unread(self) -> dict[str, tuple[Any, str]]:
        off = "privacy.record.noise_multiplier is unset: no DP-SGD"
        return {} if self.noise_multiplier is not None else {k: (v, off)
                                                             for k, v in self.away_from_default("clip").items()}


class PrivacyConfig(Strict):
    """Client-level DP-FedAvg (McMahan et al. 2018): clip each update, add Gaussian noise to the aggregate.

    On when ``noise_multiplier`` is set. ε for ``delta`` is computed by Google's
    dp-accounting (RDP, Poisson-subsampled Gaussian, q = clients per round / eligible clients).
    """

    noise_multiplier: float | None = Field(None, ge=0, description="z: noise std = z·clip / m (None: no DP)")
    clip: float | None = Field(1.0, gt=0, description="S: each client's update is scaled to norm ≤ S (None: no "
                                                      "clipping, "
                               "only with noise_multiplier 0)")
    delta: float = Field(1e-5, gt=0, lt=1)
    #: DP-SGD in the clients' local training, beside (or without) the client-level noise above
    record: RecordPrivacyConfig = Field(default_factory=RecordPrivacyConfig)
    weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="uniform: every clipped update counts 1/m (the sensitivity is S/m, so ε holds); "
        "samples: FedAvg's weights n_k/Σn, noise std z·S·max n_k/Σn (ε then assumes the weights are public)"
    )

    def unread(self) -> dict[str, tuple[Any, str]]:
        """Besides DP-SGD's: client-level DP's keys without its noise, and ``delta`` without any noise (no ε)."""
        out = {**super().unread()}
        if self.noise_multiplier is None:
            off = "privacy.noise_multiplier is unset: no client-level DP"
            out.update({k: (v, off) for k, v in self.away_from_default("clip", "weighting").items()})
            if self.record.noise_multiplier is None:
                out.update({k: (v, "no noise is set (privacy.noise_multiplier, privacy.record.noise_multiplier): no ε "
                                   "is computed") for k, v in self.away_from_default("delta").items()})
        return out

    @model_validator(mode="after")
    def _noise_needs_clip(self) -> PrivacyConfig:
        if self.noise_multiplier and self.clip is None:
            raise ValueError(f"privacy.clip = None with privacy.noise_multiplier = {self.noise_multiplier}: "
                             "noise is only meaningful relative to a clip bound; expected a positive clip")
        return self


class ScreenConfig(Strict):
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

    def unread(self) -> dict[str, tuple[Any, str]]:
        off = "server.screen.norm_factor is unset: no norm filter"
        return {} if self.norm_factor is not None else {k: (v, off) for k, v in
                                                        self.away_from_default("reference_clients").items()}


class CombineConfig(Chosen):
    """How a round's screened updates become one model (hetfed.server.combine): ``rule`` and its own keys beside it
    (``hetfed components combine`` lists the rules, ``hetfed components combine NAME`` a rule's keys;
    docs/robustness.md); ``bucket`` (any robust rule) averages the updates in shuffled buckets before the rule."""

    chosen_by: ClassVar[tuple[str, str]] = ("combine", "rule")

    rule: str = Field("mean", description="mean (FedAvg's sample-weighted mean), or a robust rule registered in "
                      "hetfed.server.combine or by a plugin (`hetfed components combine` lists them)")
    bucket: int = Field(1, ge=1, description="s > 1: the robust rule combines the means of the round's updates "
                        "shuffled into buckets of s (Karimireddy et al. 2022's bucketing); 1: the updates themselves")

    @model_validator(mode="after")
    def _bucket_before_a_robust_rule(self) -> CombineConfig:
        rules = registry_of("combine")
        if self.bucket > 1 and rules.get(self.rule).reads_clients:
            raise ValueError(f"server.combine.bucket = {self.bucket} is not allowed with server.combine.rule = "
                             f"{self.rule!r}: it tells clients apart by their ids, and a bucket is no client; expected "
                             "server.combine.bucket 1")
        if self.bucket > 1 and rules.get(self.rule).streams:
            robust = [name for name in rules.names() if not rules.get(name).streams]
            raise ValueError(f"server.combine.bucket = {self.bucket} is not allowed with server.combine.rule = "
                             f"{self.rule!r}: bucketing is for a rule that holds the round's updates; expected one of "
                             f"{robust}")
        return self


class CompressionConfig(Chosen):
    """How each client's update Δ travels (hetfed.server.compression): ``kind`` and its own keys (qsgd: ``bits``,
    ``bucket``; topk: ``fraction``; `hetfed components compressor NAME`; docs/async.md)."""

    chosen_by: ClassVar[tuple[str, str]] = ("compressor", "kind")

    kind: str = Field("none", description="none, qsgd, topk, fp16, bf16, or a plugin's")
    error_feedback: bool = Field(
        False, description="clients keep what was not sent and add it to their next update (a lossy kind only)")

    @model_validator(mode="after")
    def _feedback_needs_loss(self) -> CompressionConfig:
        compressors = registry_of("compressor")
        if self.error_feedback and not compressors.get(self.kind).lossy:
            raise ValueError(f"server.compression.error_feedback = true is not allowed with server.compression.kind "
                             f"= {self.kind!r}: it loses nothing to feed back; expected a lossy kind "
                             f"{[n for n, c in compressors.items() if c.lossy]} or error_feedback: false")
        return self


class ServerOptimizerConfig(Chosen):
    """The server optimiser on the pseudo-gradient (hetfed.server.optimizers): ``kind``, the step size η every one
    has, and the kind's own keys beside them (avgm: ``momentum``; adam, yogi: ``beta1``, ``beta2``, ``tau``,
    ``bias_correction``, ``variant`` …; `hetfed components optimizer NAME`)."""

    chosen_by: ClassVar[tuple[str, str]] = ("optimizer", "kind")

    kind: str = Field(
        "sgd", description="a registered server optimiser: sgd (FedAvg's step; lr 1: the average itself), avgm "
        "(FedAvgM, Hsu et al. 2019), adagrad / adam / yogi (FedAdagrad / FedAdam / FedYogi, Reddi et al. 2021, "
        "Algorithm 2)")
    lr: float | None = Field(None, gt=0, description="server learning rate η (None: the kind's default, 1 for sgd "
                             "and avgm, 0.01 for the adaptive ones)")

    @property
    def effective_lr(self) -> float:
        """``lr``, or the optimiser's own default (1 for sgd and avgm, 0.01 for the adaptive ones)."""
        return self.lr if self.lr is not None else float(registry_of("optimizer").get(self.kind).default_lr)


class ServerConfig(Strict):
    """The server pipeline of every algorithm whose server holds a model (hetfed.server.chain): screen →
    combine (a registered rule, or DP-FedAvg's noised mean under ``privacy``) → server optimiser on the
    pseudo-gradient (see hetfed.server.optimizers for the update equations)."""

    screen: ScreenConfig = Field(default_factory=ScreenConfig)
    combine: CombineConfig = Field(default_factory=lambda: CombineConfig())
    min_clients: int = Field(
        1, ge=1, description="a round with fewer accepted updates is skipped (logged in metrics.csv), not averaged"
    )
    compression: CompressionConfig = Field(default_factory=lambda: CompressionConfig())

    optimizer: ServerOptimizerConfig = Field(
        default_factory=lambda: ServerOptimizerConfig(), description="the server optimiser on the pseudo-gradient: "
        "{kind, lr, …its own keys} (`hetfed components optimizer NAME`)")
