"""The data's sections: which dataset (``dataset.*``), the frozen extractor (``embed.*``), how it is split over
simulated clients (``partition.*``) and how their heterogeneity Γ is measured (``heterogeneity.*``)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from hetfed.config_base import Chosen, Strict


class DatasetConfig(Chosen):
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
    keep_classes: list[int | str] | None = Field(
        None, min_length=2, description="keep only these classes (ids, or label names such as Shirt), relabelled "
        "0, 1, … in the order given; every other sample is dropped from the training and test data"
    )
    standardise: Literal["none", "global"] = Field(
        "none", description="global: (x − mean) / std with one mean and std over the training split's values "
        "(torchvision's MNIST Normalize(0.1307, 0.3081)); images and vectors only"
    )

    @model_validator(mode="after")
    def _one_way_to_choose_classes(self) -> DatasetConfig:
        if self.keep_classes is not None and self.positive_class is not None:
            raise ValueError(f"dataset.keep_classes = {self.keep_classes} and dataset.positive_class = "
                             f"{self.positive_class!r} are both set: expected one of them (a binary task of two "
                             "classes is keep_classes: [a, b])")
        return self


class EmbedConfig(Chosen):
    """The frozen feature extractor between loading and partitioning; an extractor's own keys (pca:
    ``components``; tokens: ``max_length``, ``vocab_size``, ``min_count`` …) sit beside ``kind``."""

    chosen_by: ClassVar[tuple[str, str]] = ("embedding", "kind")

    kind: str = Field("identity", description="a registered extractor (`hetfed components embedding`)")
    batch_size: int = Field(64, ge=1)
    cache_dir: str | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"


class PartitionConfig(Chosen):
    """How the data is split over simulated clients (see hetfed.partition); a partitioner's own keys (dirichlet:
    ``alpha`` …; `hetfed components partitioner NAME`) sit beside ``kind``."""

    chosen_by: ClassVar[tuple[str, str]] = ("partitioner", "kind")

    kind: str = Field("feature_clusters", description="a registered partitioner (hetfed.partition): iid, shards, "
                      "majority, dirichlet, feature_clusters, natural, pathological, quantity, or a plugin's")
    clients: int | None = Field(10, ge=1)
    opt_out: float = Field(0.0, ge=0, le=1)
    feature_noise: float = Field(0.0, ge=0, description="NIID-Bench's noise-based feature skew, beside any kind: "
                                 "client k's features get Gaussian noise of standard deviation feature_noise · k/(K−1) "
                                 "(client 0 none), drawn once per sample; the global test set stays clean")
    rotations: list[Literal[0, 90, 180, 270]] | None = Field(
        None, min_length=2, description="concept shift by rotation (IFCA's rotated MNIST), beside any kind: the "
        "clients in as many contiguous groups, group g's images rotated rotations[g] degrees counter-clockwise; the "
        "global test set stays as it is")
    label_swaps: list[Annotated[list[int], Field(min_length=2, max_length=2)] | None] | None = Field(
        None, min_length=2, description="concept shift by labels, beside any kind: the clients in as many contiguous "
        "groups, group g's two labels label_swaps[g] exchanged (null: none); the global test set stays as it is")
    val_fraction: float = Field(0.15, ge=0, lt=1)
    test_fraction: float = Field(0.15, ge=0, lt=1)

    @field_validator("label_swaps")
    @classmethod
    def _swaps_exchange_two_labels(cls, v: list | None) -> list | None:
        same = [p for p in v or () if p is not None and p[0] == p[1]]
        if same:
            raise ValueError(f"swaps label {same[0][0]} with itself, which exchanges nothing; expected two "
                             "different labels or null")
        return v

    @model_validator(mode="after")
    def _fractions_leave_training_data(self) -> PartitionConfig:
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(
                f"partition.val_fraction + partition.test_fraction = "
                f"{self.val_fraction + self.test_fraction} leaves no training data: must be < 1"
            )
        return self


class HeterogeneityConfig(Strict):
    """How Γ is measured (see hetfed.heterogeneity)."""

    gamma: bool = Field(
        True, description="measure Γ (and Γ_IID, Γ(x|y)) before the rounds; false: only the label-skew figures — Γ "
        "on 784 features takes 20–30 s a run on 2 cores (Fashion-MNIST, 20 clients), before every run of a sweep; "
        "on Flower no client sends its Γ summary either")
    on: Literal["train", "all"] = Field(
        "train", description="each client's training samples (what the method sees) or train ∪ val ∪ test"
    )
    iid_draws: int = Field(3, ge=0, description="size-matched IID partitions for the reference Γ_IID (0: off)")
    iid_max_clients: int = Field(100, ge=1, description="clients scored per IID draw (keeps it cheap at many clients)")
    estimator: Literal["plain", "extrapolated"] = Field(
        "plain", description="plain Fréchet distance, or extrapolated to infinite client size (FD∞)"
    )
    given_label: bool = Field(True, description="also Γ(x|y), the class-conditional Γ with its IID reference: sees "
                              "concept shift (rotated images, swapped labels), not label skew; about as costly as Γ; "
                              "not on nodes with their own data (their labels never leave them)")

    def unread(self) -> dict[str, tuple[Any, str]]:
        if not self.gamma:
            return {k: (v, "heterogeneity.gamma = false: Γ is not measured")
                    for k, v in self.away_from_default("iid_draws", "iid_max_clients", "estimator",
                                                       "given_label").items()}
        return {} if self.iid_draws else {k: (v, "heterogeneity.iid_draws = 0: no Γ_IID reference")
                                          for k, v in self.away_from_default("iid_max_clients").items()}
