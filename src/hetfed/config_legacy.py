"""Old configs in today's keys: the top-level sections and ``train.*`` keys that became algorithms' parameters
(refused in a user's config, naming where they live now; moved when a run directory written by an older hetfed is
read back), and the ``train`` keys that moved to ``server`` (still accepted, with a deprecation note).

Plain mappings in, plain mappings out: the schema (:mod:`hetfed.config`) hands in its ``server`` defaults, so this
module never imports it.
"""

from __future__ import annotations

import copy
from typing import Any

from hetfed.config_io import get_dotted
from hetfed.errors import ConfigError, HetfedNote
from hetfed.registry import registry_of


class DeprecatedKey(HetfedNote):
    """A config key that still works but has a new name (shown once on stderr)."""


def _params_key(methods: list, algorithm: str) -> str:
    """``methods.<i>.params`` of the first method running ``algorithm`` (``<i>`` when none does)."""
    users = [i for i, m in enumerate(methods) if isinstance(m, dict) and m.get("algorithm") == algorithm]
    return f"methods.{users[0] if users else '<i>'}.params"


def _moved_train_keys(train: Any, where: str, methods: list) -> str | None:
    """The error for an old ``train.*`` key that is now an algorithm's parameter (None: none there)."""
    if not isinstance(train, dict):
        return None
    for old, (algo, new) in legacy_train_keys().items():
        if old in train:
            target = f"{_params_key(methods, algo)}.{new}"
            return (f"{where}.{old} = {train[old]!r} is no longer a train key: it is algorithm {algo!r}'s "
                    f"parameter {new!r}; set {target} instead (see `hetfed algorithms`)")
    return None


def legacy_sections() -> dict[str, str]:
    """Old top-level config sections → the algorithm whose ``params`` took them over."""
    return {s.legacy_section: s.name for _, s in registry_of("algorithm").items() if s.legacy_section}


def legacy_train_keys() -> dict[str, tuple[str, str]]:
    """Old ``train.*`` keys → (algorithm, parameter) that took them over."""
    return {old: (s.name, new) for _, s in registry_of("algorithm").items() for old, new in s.legacy_train.items()}


#: ``train`` keys that moved into the ``server`` section: old key → its dotted key under ``server``
MOVED_TO_SERVER = {
    "server_lr": "optimizer.lr", "aggregator": "combine.rule", "trim_fraction": "combine.fraction",
    "byzantine_fraction": "combine.byzantine_fraction", "multi_krum_keep": "combine.keep",
    "multi_krum_weighted": "combine.weighted", "reject_norm_factor": "screen.norm_factor",
    "norm_reference_clients": "screen.reference_clients", "min_clients": "min_clients",
}


def _move_to_server(section: Any, server: dict, where: str, server_where: str, defaults: dict[str, Any],
                    note: bool = True) -> None:
    """The old ``train`` keys of :data:`MOVED_TO_SERVER` still work: each is put where it now lives (with a
    one-line deprecation note when ``note``; ``defaults``: the ``server`` section's defaults). A combine option the
    chosen rule does not take was ignored before
    the rules had their own parameters (``trim_fraction`` beside the mean): it is dropped, as it was."""
    import warnings

    if not isinstance(section, dict):
        return
    moved = {old: section.pop(old) for old in list(section) if old in MOVED_TO_SERVER}
    for old, value in moved.items():
        new = MOVED_TO_SERVER[old]
        head, _, leaf = new.rpartition(".")
        node = server.setdefault(head, {}) if head else server
        default = defaults[head][leaf] if head and leaf in defaults.get(head, {}) else defaults.get(new)
        if node.get(leaf, default) not in (default, value):
            raise ConfigError(f"{where}.{old} = {value!r} and {server_where}.{new} = {node[leaf]!r} are both set: "
                              f"{where}.{old} is the old name of {server_where}.{new}; keep {server_where}.{new}")
        node[leaf] = value
        if note:
            warnings.warn(f"{where}.{old} is deprecated: it is now {server_where}.{new} (set to {value!r})",
                          DeprecatedKey, stacklevel=3)
    combine = server.get("combine")
    if isinstance(combine, dict) and moved:
        rules = registry_of("combine")  # the registered rules (discovered, not listed here)
        takes = rules.get(str(combine.get("rule", "mean")), f"{server_where}.combine.rule").Params.model_fields
        for key in [k for k in combine if k != "rule" and k not in takes
                    and f"combine.{k}" in {MOVED_TO_SERVER[o] for o in moved}]:
            del combine[key]


#: flat ``server`` keys that became the server optimiser's block (``server.optimizer: {kind, lr, …}``)
OPTIMIZER_KEYS = ("lr", "momentum", "beta1", "beta2", "tau", "bias_correction", "variant")


def _nest_optimizer(server: Any, where: str, note: bool) -> None:
    """``server.optimizer: adam`` and the flat ``server.lr``, ``server.momentum`` … in today's block
    ``server.optimizer: {kind: adam, lr: …, …}``; with ``note`` (a user's config) each moved key gets a deprecation
    note. A key the kind does not take is then refused by its ``Params`` (a user's config) or dropped by
    :func:`_keep_taken` (a run directory's config, which held every key at its default: it was never read)."""
    import warnings

    if not isinstance(server, dict):
        return
    flat = {k: server.pop(k) for k in OPTIMIZER_KEYS if k in server}
    named = server.get("optimizer")
    if not flat and not isinstance(named, str):
        return
    block = dict(named) if isinstance(named, dict) else ({"kind": named} if named is not None else {})
    for key, value in flat.items():
        if note:
            warnings.warn(f"{where}.{key} is deprecated: it is now {where}.optimizer.{key} (set to {value!r})",
                          DeprecatedKey, stacklevel=4)
        block[key] = value
    if note and isinstance(named, str):
        warnings.warn(f"{where}.optimizer = {named!r} is deprecated: it is now {where}.optimizer.kind",
                      DeprecatedKey, stacklevel=4)
    server["optimizer"] = block


def refuse_legacy(data: dict, server_defaults: dict[str, Any], known: dict[str, frozenset[str]]) -> None:
    """Refuse the top-level sections and ``train.*`` keys that became algorithms' ``params``; map the ``train``
    keys that moved to ``server`` (:data:`MOVED_TO_SERVER`). ``data`` is a raw config mapping (changed in
    place); ``known``: today's keys of the top level (``""``) and of ``train`` — only other keys are looked up
    among the algorithms' old names (so a config of today's keys imports no algorithm it does not name)."""
    methods: list[Any] = data["methods"] if isinstance(data.get("methods"), list) else []
    _nest_optimizer(data.get("server"), "server", note=True)
    for i, m in enumerate(methods):
        _nest_optimizer(m.get("server") if isinstance(m, dict) else None, f"methods.{i}.server", note=True)
    unknown = set(data) - known[""]
    trains = [data.get("train"), *(m.get("train") for m in methods if isinstance(m, dict))]
    if not unknown and not any(isinstance(t, dict) and set(t) - known["train"] for t in trains):
        return
    for section, algo in legacy_sections().items():
        if section in data:
            target = _params_key(methods, algo)
            raise ValueError(f"top-level section {section!r} is no longer allowed: algorithm {algo!r}'s settings are "
                             f"its parameters now; move them to {target} (see `hetfed algorithms`)")
    problem = _moved_train_keys(data.get("train"), "train", methods)
    if isinstance(data.get("train"), dict):
        data.setdefault("server", {})
        if isinstance(data["server"], dict):
            _move_to_server(data["train"], data["server"], "train", "server", server_defaults)
    for i, m in enumerate(methods):
        if not isinstance(m, dict):
            continue
        problem = problem or _moved_train_keys(m.get("train"), f"methods.{i}.train", methods)
        if isinstance(m.get("train"), dict) and set(m["train"]) & set(MOVED_TO_SERVER):
            m["server"] = dict(m.get("server") or {})
            _move_to_server(m["train"], m["server"], f"methods.{i}.train", f"methods.{i}.server", server_defaults)
    if problem:
        raise ValueError(problem)


#: a section that names a component: (kind of component, the key that names one, the section's shared keys)
Chosen = tuple[str, str, frozenset[str]]


def _keep_taken(section: Any, chosen: Chosen, choice: str | None) -> None:
    """Drop the keys of a component section that its chosen component does not take: an older hetfed wrote every
    component's keys into one flat section (``partition.alpha`` beside ``kind: feature_clusters``), unread."""
    kind, chooser, shared = chosen
    if not isinstance(section, dict):
        return
    component = registry_of(kind).find(str(section.get(chooser, choice)))
    if component is None:
        return  # not registered here: validation names it
    fields = component.Params.model_fields
    for key in [k for k in section if k not in shared and (k not in fields or section[k] is None
                                                            and fields[k].default is not None)]:
        del section[key]  # another component's key, or None where an older hetfed meant "the default"


def migrate_legacy(raw: dict, server_defaults: dict[str, Any], chosen: dict[str, Chosen]) -> dict:
    """A config written by an older hetfed (a run directory's config.yaml) in today's keys.

    Old top-level sections and ``train.*`` keys become the ``params`` of the methods whose
    algorithm took them over; the ``train`` keys that moved to ``server`` go there (:data:`MOVED_TO_SERVER`);
    a component section keeps the keys its component takes (``chosen``: section → what names its component).
    """
    registry = registry_of("algorithm")

    raw = copy.deepcopy(raw)
    _nest_optimizer(raw.get("server"), "server", note=False)
    for name, how in chosen.items():
        _keep_taken(get_dotted(raw, name), how, None)
    methods: list[Any] = raw["methods"] if isinstance(raw.get("methods"), list) else []
    sections = {section: raw.pop(section) for section in legacy_sections() if section in raw}
    train_keys = legacy_train_keys()
    top_train: dict[str, Any] = raw["train"] if isinstance(raw.get("train"), dict) else {}
    moved_top = {old: top_train.pop(old) for old in list(top_train) if old in train_keys}
    if set(top_train) & set(MOVED_TO_SERVER):
        _move_to_server(top_train, raw.setdefault("server", {}), "train", "server", server_defaults, note=False)
    for m in methods:
        if not isinstance(m, dict):
            continue
        spec = registry.get(str(m.get("algorithm", "fedavg")))
        params = dict(sections.get(spec.legacy_section, {}) or {}) if spec.legacy_section else {}
        own_train: dict[str, Any] = m["train"] if isinstance(m.get("train"), dict) else {}
        for old, (algo, new) in train_keys.items():
            value = own_train.pop(old, moved_top.get(old))
            if algo == spec.name and value is not None:
                params[new] = value
        if set(own_train) & set(MOVED_TO_SERVER):
            m["server"] = dict(m.get("server") or {})
            _move_to_server(own_train, m["server"], "train", "server", server_defaults, note=False)
        m["params"] = {**params, **(m.get("params") or {})}
        _nest_optimizer(m.get("server"), "server", note=False)
        for name, how in chosen.items():  # a method's own keys of a section it may override (model, train.clock …)
            top = get_dotted(raw, name)
            _keep_taken(get_dotted(m, name), how, str(top.get(how[1])) if isinstance(top, dict) else None)
    return raw
