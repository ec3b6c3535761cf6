"""How the server talks to clients on Flower (``flower.*``), SecAgg+ included."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from hetfed.config_base import Strict


class SecAggPlusConfig(Strict):
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


class FlowerConfig(Strict):
    """How the server talks to clients on Flower (``train.executor: flower``)."""

    round_timeout: float | None = Field(
        600, gt=0, description="seconds to wait for a step's replies; clients that miss it count as failed "
        "(None waits for all: a dead SuperNode then hangs the run)"
    )
    min_replies: int = Field(1, ge=1, description="a round with fewer training replies is skipped and logged")
    connect_timeout: float = Field(120, gt=0, description="seconds to wait for one SuperNode per client")
    client_cpus: float = Field(1, gt=0,
                               description="Simulation Engine: CPUs per ClientApp (2 on 2 cores = 1 at a time)")
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
