"""The registries' shared mechanism: components of one kind, each registered by its own module, found by
importing the modules of the kind's package — so nothing lists them (DESIGN: every component is one file).

Every kind is named in :data:`KINDS` with the module that owns its registry. A layer below a kind's package (the
config schema validating ``partition.kind``) asks :func:`registry_of` — the owner is imported at call time, by
name — so no module imports upwards to reach a registry (``tests/test_layers.py`` holds with no exemption).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from hetfed.errors import ConfigError
from hetfed.spelling import choice_hint, did_you_mean, nearest

T = TypeVar("T")


#: every kind of component → the module that owns its registry (imported on first use by :func:`registry_of`)
KINDS: dict[str, str] = {
    "dataset": "hetfed.data.datasets",
    "embedding": "hetfed.data.embeddings",
    "partitioner": "hetfed.partition",
    "model": "hetfed.models.kinds",
    "combine": "hetfed.server.combine",
    "optimizer": "hetfed.server.optimizers",
    "compressor": "hetfed.server.compression",
    "algorithm": "hetfed.algorithms.registry",
    "executor": "hetfed.executors.kinds",
    "leakage": "hetfed.leakage",
    "attack": "hetfed.engine.attacks",
    "latency": "hetfed.engine.latency",
}

#: modules outside a kind's package that register components of it, imported when the kind is discovered:
#: Flower's executor kinds live with Flower, so that ``executors/`` never imports ``flower/``
PROVIDERS: dict[str, tuple[str, ...]] = {
    "executor": ("hetfed.flower.kinds",),
}

_REGISTRIES: dict[str, Registry[Any]] = {}


class ComponentParams(BaseModel):
    """A component's own parameters (none by default), declared in its file: defaults, bounds and descriptions.
    Unknown keys are errors (a typo must not fall back to a default); frozen, so a run's settings are a value."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def registry_of(kind: str) -> Registry[Any]:
    """The registry of ``kind`` (one of :data:`KINDS`), its owner imported on first use."""
    if kind not in KINDS:
        raise ConfigError(f"component kind {kind!r} is not allowed: expected one of {sorted(KINDS)}")
    if kind not in _REGISTRIES:
        importlib.import_module(KINDS[kind])
    return _REGISTRIES[kind]


def summary_and_params(item: Any) -> dict[str, Any]:
    """A component as ``hetfed components`` lists it when it has nothing more to say: its one-line summary and its
    own parameters (the default ``describe`` of a :class:`Registry`)."""
    return {"summary": item.summary, "params": describe_params(item.Params)}


class Registry(Generic[T]):
    """``package``'s components of ``kind``, by name; ``key`` is the config key that names one (for errors),
    ``hint`` what an error adds (where to look), ``exclude`` the package's modules that are not components (and
    every module whose name starts with ``_``); ``describe(item)`` a component as plain data for listings
    (``hetfed components``); ``params_key`` where a config writes a component's own parameters (default: the
    section of ``key``, e.g. ``server.compression`` for ``server.compression.kind``)."""

    def __init__(self, kind: str, package: str, key: str, hint: str = "", exclude: frozenset[str] = frozenset(),
                 describe: Callable[[T], dict[str, Any]] = summary_and_params, noun: str | None = None,
                 params_key: str | None = None):
        self.kind, self.package, self.key, self.hint, self.exclude = kind, package, key, hint, exclude
        self.params_key = params_key or key.rsplit(".", 1)[0]
        self.noun = noun or kind  # how errors name one component: "combine rule 'median' takes …"
        self._describe = describe
        self._items: dict[str, T] = {}
        self._discovered = False
        _REGISTRIES[kind] = self

    def register(self, name: str, item: T) -> T:
        self._items[name] = item
        return item

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def get_registered(self, name: str) -> T | None:
        """What is registered under ``name`` so far, without importing anything (None: nothing)."""
        return self._items.get(name)

    def _discover(self) -> None:
        """Import the package's modules once: each registers what it defines."""
        if self._discovered:
            return
        self._discovered = True
        module = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(module.__path__):
            if info.name not in self.exclude and not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")
        for provider in PROVIDERS.get(self.kind, ()):
            importlib.import_module(provider)

    def _import_own(self, name: str) -> None:
        """Import only the module named after ``name`` (``partition.kind: dirichlet`` →
        ``hetfed.partition.dirichlet``; ``fashion-mnist`` → ``fashion_mnist``), if the package has one: validating a
        config imports the components it names, not every component of every kind."""
        stem = name.replace("-", "_")
        if self._discovered or name in self._items or not stem.isidentifier() or stem.startswith("_") \
                or stem in self.exclude:
            return
        module = f"{self.package}.{stem}"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)

    def find(self, name: str) -> T | None:
        """The component ``name`` (its own module imported, else the package discovered), or None where none is
        registered — for a name read back from an old run, which need not exist here."""
        self._import_own(name)
        if name not in self._items:
            self._discover()
        return self._items.get(name)

    def items(self) -> list[tuple[str, T]]:
        self._discover()
        return sorted(self._items.items())

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._items)

    def get(self, name: str, where: str | None = None) -> T:
        """The component ``name`` (its own module imported: :meth:`_import_own`), or a one-line ConfigError
        naming ``where`` (default: the config key that names one) and every registered name."""
        if self.find(name) is None:
            hint = f" {self.hint}" if self.hint else ""
            raise ConfigError(f"{where or self.key} = {name!r} is not allowed: {did_you_mean(name, self._items)}"
                              f"expected one of {sorted(self._items)}{hint}")
        return self._items[name]

    def describe(self) -> list[dict[str, Any]]:
        """Every component as plain data: its name and what ``describe`` says of it."""
        return [{"name": name, **self._describe(item)} for name, item in self.items()]

    def params(self, name: str, values: Mapping[str, Any], where: str, shared: Iterable[str] = ()) -> BaseModel:
        """Component ``name``'s validated parameters (its ``Params`` model) from ``values``; an invalid value is a
        one-line ConfigError naming the key under ``where`` (an unknown one told the nearest of the parameters the
        kind's other components take, or of the keys its section takes beside them: ``shared``)."""
        component: Any = self.get(name)
        cls: type[BaseModel] = component.Params
        try:
            return cls(**dict(values))
        except ValidationError as err:
            elsewhere = {**self.taken_by_others(name), **{k: repr(f"{where}.{k}") for k in shared}}
            raise ConfigError(params_error(err, where, f"{self.noun} {name!r}", cls, elsewhere)) from None

    def taken_by_others(self, name: str) -> dict[str, str]:
        """The parameters of this kind's other components, each with the first (by name) that takes it, in words:
        what a key that ``name`` does not take may have meant (``alpha`` → ``'alpha' of partitioner 'dirichlet'``)."""
        taken: dict[str, str] = {}
        for other, item in self.items():
            spec: Any = item
            params = getattr(spec, "Params", None) or spec.params  # a component's model; an algorithm spec's
            for param in params.model_fields if other != name else ():
                taken.setdefault(param, f"{param!r} of {self.noun} {other!r}")
        return taken


def describe_params(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A component's parameters as plain data: name, default, type, bounds, description (``--json`` listings)."""
    params = []
    for key, f in model.model_fields.items():
        default = None if f.is_required() else f.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        bounds = {k: getattr(m, k) for m in f.metadata for k in ("gt", "ge", "lt", "le") if hasattr(m, k)}
        params.append({"name": key, "default": default, "type": _type_name(f.annotation), "bounds": bounds,
                       "description": f.description or ""})
    return params


def _type_name(annotation: Any) -> str:
    name = getattr(annotation, "__name__", None)
    return name if name and not hasattr(annotation, "__args__") else str(annotation).replace("typing.", "")


def unknown_key(key: str, value: Any, owner: str, allowed: Iterable[str], elsewhere: Mapping[str, str] = {}) -> str:
    """What a key that nothing takes is told, in one line: the key and its value, the nearest key ``owner`` takes or
    else the nearest name in ``elsewhere`` (a name taken somewhere else → that place in words: ``lr`` →
    ``'train.optimizer.lr'``, ``alpha`` → ``'alpha' of partitioner 'dirichlet'``), and every key ``owner`` takes —
    so a typo is answered with the fix, not with a pointer to a listing."""
    allowed = sorted(allowed)
    parent, _, leaf = key.rpartition(".")
    name, colon, typed = leaf.partition(":")
    if colon and value is None:  # YAML reads ``{name:x}`` as the key 'name:x' with no value: its colon needs a space
        return (f"unknown key {key!r} = None: YAML reads '{leaf}' as one key with no value; write "
                f"'{name}: {typed}' (a space after the colon)")
    hint = did_you_mean(leaf, allowed, f"{parent}." if parent else "")
    if not hint and (near := [leaf] if leaf in elsewhere else nearest(leaf, elsewhere)):
        hint = f"did you mean {elsewhere[near[0]]}? "
    takes = f"takes {allowed}" if allowed else "has no parameters of its own"
    return f"unknown key {key!r} = {value!r}: {hint}{owner} {takes}"


def params_error(err: ValidationError, where: str, owner: str, model: type[BaseModel],
                 elsewhere: Mapping[str, str] = {}) -> str:
    """A component's parameters' (``model``'s) validation errors as one line naming each key under ``where``; an
    unknown key is told the keys ``owner`` (the component, in words) takes, or the nearest in ``elsewhere`` — or, in a
    section among the parameters (FedMoE's ``optimizer``), that section's keys (:func:`unknown_key`)."""
    parts = []
    for e in err.errors():
        key = ".".join([where, *(str(p) for p in e["loc"])])
        inner = model_at(model, e["loc"][:-1]) if e["loc"][:-1] else None
        if e["type"] == "extra_forbidden" and inner is not None:  # a key of a section among the parameters: its keys
            section = key.rpartition(".")[0]
            parts.append(unknown_key(key, e.get("input"), f"{section!r} of {owner}", inner.model_fields))
            continue
        if e["type"] == "extra_forbidden":
            parts.append(unknown_key(key, e.get("input"), owner, model.model_fields, elsewhere))
            continue
        if e["type"] == "missing":
            parts.append(f"{key} is required: it has no default")
            continue
        msg = choice_hint(e) + e["msg"].removeprefix("Value error, ")
        parts.append(f"{key} = {e.get('input')!r}: {msg}" if e["loc"] else msg)  # a check of the whole: its own words
    return "; ".join(parts)



def model_in(annotation: Any) -> type[BaseModel] | None:
    """The config model a field holds: itself, or the model inside ``X | None`` or ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in typing.get_args(annotation) if (m := model_in(a)) is not None), None)


def model_at(root: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The section model at ``path`` below ``root`` (``methods.0.train`` → TrainConfig; FedMoE's params'
    ``optimizer`` → OptimizerConfig), or None."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None:
            return None
        if isinstance(part, str) and not part.isdigit():  # an item of a list (methods.0) is the list's model
            field = model.model_fields.get(part)
            model = model_in(field.annotation) if field is not None else None
    return model
