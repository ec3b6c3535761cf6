"""The config schema: what can be set, and to what — the whole run (:class:`Config`), the component sections
(dataset, embed, partition, model: each names a registered component, whose own parameters its file declares),
and how a config is built from a file and ``--set`` overrides. The schedule's, the server's and Flower's sections
are in :mod:`hetfed.config_train`, :mod:`hetfed.config_server` and :mod:`hetfed.config_flower`.

A config is YAML with the nesting below; ``--set key=value`` overrides any key (values are parsed as YAML, so
``--set model.hidden=[128,128]`` works). The whole config is validated before anything runs; an error names the
key, the value, what is allowed and the file it was read from.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from hetfed import config_legacy, config_train
from hetfed.config_base import Chosen, Strict
from hetfed.config_data import DatasetConfig, EmbedConfig, HeterogeneityConfig, PartitionConfig
from hetfed.config_flower import FlowerConfig, SecAggPlusConfig
from hetfed.config_io import (
    config_source,
    entry_label,
    flatten_keys,
    get_dotted,
    parse_overrides,
    pick_methods,
    read_yaml,
    set_dotted,
)
from hetfed.config_server import (
    AttackConfig,
    LeakageConfig,
    PrivacyConfig,
    RecordPrivacyConfig,
    ScreenConfig,
    ServerConfig,
    ServerDataConfig,
)
from hetfed.config_train import ClockConfig, OptimizerConfig, StragglerConfig, TrainConfig, unread_method_keys
from hetfed.errors import ConfigError, HetfedNote
from hetfed.registry import model_at, model_in, registry_of, unknown_key
from hetfed.spelling import choice_hint, did_you_mean, section_expected

__all__ = ["AttackConfig", "LeakageConfig", "ClockConfig", "Config", "DatasetConfig", "EmbedConfig", "FlowerConfig",
           "HeterogeneityConfig", "MethodConfig", "ModelConfig", "OptimizerConfig", "PartitionConfig", "PrivacyConfig",
           "RecordPrivacyConfig", "ScreenConfig", "SecAggPlusConfig", "ServerConfig", "ServerDataConfig",
           "StragglerConfig", "TrainConfig", "as_given", "build_config", "dump_config", "load_config",
           "load_run_config", "method_section", "unread_keys", "warn_unread"]


class ModelConfig(Chosen):
    """The network every client trains: ``kind`` and that kind's own keys (mlp: ``hidden``, ``dropout`` …;
    `hetfed components model NAME`)."""

    chosen_by: ClassVar[tuple[str, str]] = ("model", "kind")
    for_methods: ClassVar[bool] = True

    kind: str = Field("mlp", description="a registered model (`hetfed components model`)")


class MethodConfig(Strict):
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


class Config(Strict):
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
    leakage: LeakageConfig = Field(default_factory=LeakageConfig)
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
            known = {"": frozenset(Config.model_fields), "train": frozenset(TrainConfig.model_fields)}
            config_legacy.refuse_legacy(data, ServerConfig().model_dump(mode="json"), known)
        return data

    @model_validator(mode="after")
    def _methods_resolve(self) -> Config:
        """The methods resolve to registered algorithms with valid params and overrides, under unique names. (The
        checks between components — a model and the data, an algorithm and the server data — are the plan's:
        :func:`hetfed.runs.plan.check_config`.)"""
        registry = registry_of("algorithm")  # the algorithms' own declarations (discovered, not listed here)

        _import_plugins(self.plugins)
        if not self.methods:
            raise ValueError("methods is empty: list at least one method")
        labels = [m.label for m in self.methods]
        if len(set(labels)) != len(labels):
            raise ValueError(f"methods have repeated names {labels}: give each a unique name")
        for i, m in enumerate(self.methods):
            spec = registry.get(m.algorithm, f"methods.{i}.algorithm")
            spec.make_params(m.params, f"methods.{i}.params")
            views = spec.capabilities.views
            clash = sorted(set(views) & (set(labels) - {m.label})) if m.label == m.algorithm else []
            if clash:  # a method named after its algorithm reports its views unprefixed
                raise ValueError(f"methods names {clash} clash with the rows of the method named {m.label!r} "
                                 f"(its views {sorted(views)}): rename them")
            for section in METHOD_SECTIONS:
                method_section(self, m, section, f"methods.{i}.{section}")
        self._refuse_untaken()
        return self

    def _refuse_untaken(self) -> None:
        """A top-level key of a methods' default section (``model.condition_output``) that neither its own choice
        nor any method's takes is refused, naming what the methods' choices take."""
        for name in METHOD_SECTIONS:
            top = getattr(self, name)
            if not isinstance(top, Chosen):
                continue
            untaken = top.not_taken()
            chosen = {method_section(self, m, name).choice for m in self.methods}
            registry = registry_of(top.chosen_by[0])
            takes = {c: sorted(registry.get(c).Params.model_fields) for c in sorted(chosen | {top.choice})}
            for key, value in untaken.items():
                if not any(key in fields for fields in takes.values()):
                    taken = {*type(top).model_fields, *(k for fields in takes.values() for k in fields)}
                    hint = did_you_mean(key, taken, f"{name}.")
                    raise ValueError(f"{name}.{key} = {value!r} is not allowed: {hint}neither {name}.{top.chooser} = "
                                     f"{top.choice!r} nor a method's {registry.noun} takes it; they take {takes}")

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
    chosen: dict[str, tuple[str, str, frozenset[str]]] = {}
    for name, f in Config.model_fields.items():  # the component sections, and those one level inside a section
        section = f.annotation
        if isinstance(section, type) and issubclass(section, Chosen):
            chosen[name] = (*section.chosen_by, frozenset(section.model_fields))
        elif isinstance(section, type) and issubclass(section, Strict):
            chosen.update({f"{name}.{inner}": (*t.chosen_by, frozenset(t.model_fields))
                           for inner, g in section.model_fields.items()
                           if isinstance(t := g.annotation, type) and issubclass(t, Chosen)})
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


def section_keys(model: type[BaseModel] | None = None, prefix: str = "") -> Iterator[str]:
    """Every dotted key of the config's sections (``train.optimizer.lr``), a section before the keys inside it; a
    method's own sections are the top-level ones (``methods`` is not walked), a component's parameters are its own."""
    for name, field in (model or Config).model_fields.items():
        yield prefix + name
        inner = model_in(field.annotation)
        if inner is not None and inner is not MethodConfig:
            yield from section_keys(inner, f"{prefix}{name}.")


@functools.cache
def _every_key() -> dict[str, str]:
    """Every key of the config's sections by its last name, dotted and quoted, three places at most (``lr`` →
    ``'train.optimizer.lr' or 'server.optimizer.lr'``): where a key typed in the wrong section belongs."""
    places: dict[str, list[str]] = {}
    for key in section_keys():
        places.setdefault(key.rpartition(".")[2], []).append(repr(key))
    return {leaf: " or ".join(where[:3]) for leaf, where in places.items()}


def _format_errors(err: ValidationError, prefix: str = "", root: type[BaseModel] | None = None) -> str:
    """Pydantic's errors as one line, each naming its key in full: ``prefix`` + its place below ``root`` (a method's
    own section is validated alone: ``methods.0.train.`` below TrainConfig)."""
    lines = []
    for e in err.errors():
        key = (prefix + ".".join(str(p) for p in e["loc"])).rstrip(".")
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            section = (prefix + ".".join(map(str, e["loc"][:-1]))).rstrip(".")
            model = model_at(root or Config, e["loc"][:-1])
            owner = f"section {section!r}" if section else "a config"
            lines.append(unknown_key(key, e.get("input"), owner, model.model_fields if model else (), _every_key()))
            continue
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        value = e.get("input")
        if e["type"] in ("model_type", "dict_type") and not isinstance(value, dict):
            msg = section_expected(key, value, model_at(root or Config, e["loc"]))
        msg = choice_hint(e) + msg  # one of a fixed few ('sgd' or 'adam'): the nearest first, if a typo
        shown = "" if isinstance(value, dict) or not key else f" = {value!r}"
        named = msg.split(" ", 1)[0]  # a message that starts with its own key (a step's, a method's section's)
        names_itself = key and (named.startswith(f"{key}.") or named == key or f".{key}." in named or f"'{key}." in msg)
        lines.append(f"{key}{shown}: {msg}" if key and not names_itself else msg)
    return "; ".join(lines)


def build_config(raw: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None,
                 source: str = "") -> Config:
    """Validate a raw mapping (plus overrides) into a Config, or raise ConfigError naming ``source`` (where it was
    read, :func:`~hetfed.config_io.config_source`); each section and component is checked on its own (the checks
    between components are the plan's, :func:`hetfed.runs.plan.check_config`)."""
    # start from the defaults so --set can reach into default lists (methods.0.…)
    try:
        merged = _deep_merge(_defaults_given(), raw or {})
    except AttributeError:
        raise ConfigError(f"invalid config{source}: every section must be a mapping of keys") from None
    items = flatten_keys(overrides or {})
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
        return Config.model_validate(merged, context={"whole": True})
    except ValidationError as err:
        raise ConfigError(f"invalid config{source}: " + _format_errors(err)) from None


@functools.cache
def _defaults_given() -> dict[str, Any]:
    """The default config as given (:func:`as_given`), validated once a process: every config is built on it (a
    sweep builds two a run; validating the defaults was half of each). Callers copy it (:func:`_deep_merge`)."""
    return as_given(Config())


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
        label = entry_label(method)
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
    methods: list[Any] = merged["methods"] if isinstance(merged.get("methods"), list) else []
    own = path[:2] if path[:1] == ["methods"] and len(path) > 2 and path[1].isdigit() else []
    inner = path[len(own):]
    schema: Any = Config
    for part in inner:  # the section the key names a component of (model; server.optimizer)
        schema = schema.model_fields[part].annotation if part in getattr(schema, "model_fields", {}) else None
    if not inner or not (isinstance(schema, type) and issubclass(schema, Chosen) and leaf == schema.chosen_by[1]):
        return
    homes = [(".".join(own), methods[int(own[1])])] if own and int(own[1]) < len(methods) else [] if own else [
        ("", merged), *((f"methods.{i}", m) for i, m in enumerate(methods) if inner[0] in METHOD_SECTIONS)]
    nodes = [(".".join(p for p in (home, *inner) if p), get_dotted(node, ".".join(inner))) for home, node in homes]
    registry = registry_of(schema.chosen_by[0])
    component = registry.find(str(value))
    if component is None:
        return  # validation names the choice that is not registered
    for where, node in nodes:
        if not isinstance(node, dict):
            continue
        for param in [k for k in node if k not in schema.model_fields and k not in component.Params.model_fields]:
            warnings.warn(f"{where}.{param} = {node.pop(param)!r} is dropped: {key} = {value!r} does not take it",
                          OverriddenKey, stacklevel=4)


class OverriddenKey(HetfedNote):
    """A method's own value of a key was replaced by a top-level override of that key."""


class UnreadKey(HetfedNote):
    """A key set to a value other than its default that nothing the config chose reads."""


def _away_from_default(section: Strict) -> dict[str, Any]:
    """The section's keys whose value differs from their default, with that value (a nested section's
    keys dotted: ``secaggplus.num_shares``)."""
    fields = type(section).model_fields
    out: dict[str, Any] = {}
    if isinstance(section, Chosen):  # its component's own parameters, against their defaults
        defaults = type(section.params)().model_dump()
        out.update({k: v for k, v in section.params.model_dump().items() if v != defaults[k]})
    for k in fields:
        value = getattr(section, k)
        out.update({f"{k}.{key}": inner for key, inner in _away_from_default(value).items()}
                   if isinstance(value, Strict) else section.away_from_default(k))
    return out


def _unread_flower(config: Config, executor: str | None = None) -> dict[str, str]:
    """A note per ``flower.*`` key set away from its default where the run's clients live in this process (the
    Flower executors read that section; the others never do), and per ``flower.secaggplus.*`` key set without
    secure aggregation. ``executor``: where the run really goes when not ``train.executor`` (``hetfed flower run``
    hands its run to a deployment); and per Γ summary key (``flower.summary_*``) where Γ is not measured."""
    if not registry_of("executor").get(executor or config.train.executor).in_process:
        f = config.flower
        notes = {} if f.secure_aggregation != "none" else {
            f"flower.secaggplus.{key}": (f"flower.secaggplus.{key} = {value!r} is not read with "
                                         "flower.secure_aggregation = 'none': it applies to 'secaggplus'")
            for key, value in _away_from_default(f.secaggplus).items()}
        summaries = {} if config.heterogeneity.gamma else _away_from_default(f)
        return notes | {f"flower.{key}": f"flower.{key} = {value!r} is not read with heterogeneity.gamma = false: no "
                        "client sends its Γ summary" for key, value in summaries.items()
                        if key in ("summary_noise", "summary_clip")}
    return {f"flower.{key}": (f"flower.{key} = {value!r} is not read with train.executor = "
                              f"{config.train.executor!r}: it applies to the Flower executors (flower, deployment)")
            for key, value in _away_from_default(config.flower).items()}


def unread_keys(config: Config, executor: str | None = None) -> dict[str, str]:
    """One note per setting that is applied to nothing, keyed by its dotted key: a ``flower`` key where the run's
    clients are in this process, a ``server`` key where the method's algorithm has no server model, a top-level
    ``model`` parameter that no method's model kind takes, and any key a section does not read given its other keys
    (``Strict.unread``: the run's sections, each method's ``train`` and ``server``). (A key the chosen component does
    not have at all is refused by its ``Params``, not noted.)"""
    algorithms = registry_of("algorithm")
    notes = _unread_flower(config, executor)
    serves = [algorithms.get(m.algorithm).capabilities.server_model for m in config.methods]
    for name in Config.model_fields.keys() - set(METHOD_SECTIONS):  # the run's sections; the methods' below
        if isinstance(section := getattr(config, name), Strict):
            notes.update({f"{name}.{k}": f"{name}.{k} = {v!r} is not read: {why}"
                          for k, (v, why) in section.unread().items()})
    found = []  # each method's (label, notes)
    for i, (m, server_model) in enumerate(zip(config.methods, serves, strict=True)):
        found += [(m.label, unread_method_keys(m, i, name, method_section(config, m, name)))
                  for name in ("train", "server")]
        for key, value in ([] if server_model else flatten_keys(m.server)):
            notes[f"methods.{i}.server.{key}"] = (f"methods.{i}.server.{key} = {value!r} is not read: algorithm "
                                                  f"{m.algorithm!r} has no server model")
    notes.update(config_train.joined_notes(found))
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


def load_config(path: str | Path | None = None, sets: list[str] | None = None,
                executor: str | None = None, methods: list[str] | None = None) -> Config:
    """The config a command runs with: the file (or defaults), then ``--set`` items; a note for each
    setting nothing reads (:func:`warn_unread`; ``executor``: where the run goes when the command, not
    ``train.executor``, decides). ``methods`` (``--methods``): only the file's methods of these names, in this order,
    each as the file writes it (before ``--set``, whose ``methods.N`` counts them)."""
    import warnings

    overrides = parse_overrides(sets)  # first: `--set key 3` makes "3" look like the config file
    raw = read_yaml(path) if path is not None else {}
    if methods is not None:
        raw = choose_methods(raw, methods, overrides, config_source(path, False))
    # its notes (an override that replaces a method's own value) are told once the config is valid: before a refusal
    # they were lines above its one-line error, about a value refused anyway
    with warnings.catch_warnings(record=True) as noted:
        warnings.simplefilter("always")
        config = build_config(raw, overrides, config_source(path, bool(overrides)))
    for note in noted:
        warnings.warn_explicit(note.message, note.category, note.filename, note.lineno)
    return warn_unread(config, executor)


def choose_methods(raw: dict[str, Any], methods: list[str], overrides: dict[str, Any], source: str,
                   named: tuple[str, str] = ("--methods", "--set")) -> dict[str, Any]:
    """``raw`` (a config as written; the built-in config's methods where it has none) with only its methods named
    ``methods``, in that order, each as written — what ``--methods`` (``named[0]``) chooses before the overrides
    (``named[1]``) go on; overrides that set ``methods`` to a list would replace the methods chosen, and are refused."""
    option, set_ = named
    if isinstance(overrides.get("methods"), list):
        raise ConfigError(f"{set_} methods=[…] is not allowed with {option} {','.join(methods)!r}: it would "
                          "replace the methods chosen; expected one of them")
    given = raw["methods"] if isinstance(raw.get("methods"), list) else as_given(Config())["methods"]
    return {**raw, "methods": pick_methods(given, methods, f"{option} {','.join(methods)!r}: the config{source}")}


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


#: libyaml's emitter where PyYAML has it: the same text as PyYAML's own for every shipped config (tested), 5× faster
#: (a run directory's config.yaml, 5.4 → 1.1 ms the default experiment's: a sweep writes one a run)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_config(config: Config) -> str:
    """The resolved config as YAML, as written into every run directory, ending with comment lines that say
    what each method runs with where it differs from the top-level sections."""
    return yaml.dump(config.model_dump(mode="json"), Dumper=_DUMPER, sort_keys=False) + effective_methods(config)


def method_section(config: Config, method: MethodConfig, section: str, where: str | None = None) -> Any:
    """The ``section`` (one of :data:`METHOD_SECTIONS`) a method runs with: top-level, then its own keys (its
    type is the top-level section's: ``ModelConfig`` for ``model`` …). A method that chooses another component
    than the top-level section (``methods[i].model.kind``) gets the top-level parameters that component takes.
    ``where``: the key errors name (``methods.0.model``)."""
    top = getattr(config, section)
    own = getattr(method, section)
    base = _base_for(top, own)
    if where is None:
        return type(top).model_validate(_deep_merge(base, own))
    try:
        return type(top).model_validate(_deep_merge(base, own), context={"prefix": where.rpartition(".")[0] + "."})
    except ValidationError as err:
        raise ValueError(_format_errors(err, f"{where}.", type(top))) from None


def _base_for(top: Strict, own: dict[str, Any]) -> dict[str, Any]:
    """What a method's own keys ``own`` are merged onto: the top-level section as given, where a component section
    (this one, or one inside it: ``server.optimizer``) keeps only the parameters of the component ``own`` chooses."""
    if isinstance(top, Chosen):
        return top.given_for(str(own.get(top.chooser, top.choice)))
    base = top.model_dump(mode="json", context={"as_given": True})
    for name in type(top).model_fields:
        inner = getattr(top, name)
        if isinstance(inner, Strict) and isinstance(own.get(name), dict):
            base[name] = _base_for(inner, own[name])
    return base


def effective_methods(config: Config) -> str:
    """YAML comments: each method's effective settings that differ from the top-level sections."""
    lines = ["# effective settings per method, where they differ from the top-level sections:"]
    for i, m in enumerate(config.methods):
        differ = []
        for section in METHOD_SECTIONS:
            top = dict(flatten_keys(getattr(config, section).model_dump(mode="json"), f"{section}."))
            own = flatten_keys(method_section(config, m, section).model_dump(mode="json"), f"{section}.")
            differ += [f"{k} = {json.dumps(v)}" for k, v in own if top.get(k) != v]
        lines.append(f"#   methods.{i} {m.label} ({m.algorithm}): {', '.join(differ) or 'none'}")
    return "\n".join(lines) + "\n"
