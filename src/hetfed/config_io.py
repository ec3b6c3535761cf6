"""A config's text: YAML files (duplicate keys refused, YAML 1.2 booleans), ``--set key=value`` items and
``--grid key=v1,v2,…`` items, each value parsed as YAML. Every bad input is a one-line ConfigError naming it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from hetfed.errors import ConfigError


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=[1,2]"]`` into a nested dict; values parsed as YAML."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} is not allowed: expected key=value with '=' (not a space), e.g. "
                              f"--set {item.strip() or 'seed'}=3")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"--set {item!r} is not allowed: the key is empty")
        try:
            value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else None  # noqa: S506
        except yaml.YAMLError:
            value = raw
        set_dotted(out, key, value)
    return out


def get_dotted(tree: Any, dotted: str) -> Any:
    """The value at the dotted ``key`` of mappings nested in ``tree`` (None where a part is missing)."""
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``tree["a"]["b"] = value`` for ``key = "a.b"``, creating levels as needed.

    A numeric part indexes a list (``methods.0.algorithm``).
    """
    parts = key.split(".")
    node: Any = tree
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[_list_index(node, part, key)]
            continue
        if not isinstance(node.get(part), dict | list):
            node[part] = {}
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[_list_index(node, last, key)] = value
    else:
        node[last] = value


def _list_index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"--set {key}: {part!r} is not an index of a list of {len(node)}")
    return int(part)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys: with plain YAML the last one wins silently."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _value in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ConfigError(
                f"key {key!r} appears twice in one mapping (lines {seen[key]} and {line}): "
                "keep one (YAML would silently use the last)"
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)
# YAML 1.2 booleans: only true/false. YAML 1.1's on/off/yes/no made `heterogeneity: {on: all}` a key True;
# a setting that is a bool still accepts them (pydantic reads "on"/"yes" as true)
_BOOL = "tag:yaml.org,2002:bool"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_UniqueKeyLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def parse_yaml_text(text: str, where: str) -> Any:
    """YAML text → Python values; duplicate keys and syntax errors are ConfigErrors naming ``where``."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())
        raise ConfigError(f"{where} is not valid YAML: {detail}") from None


def flatten_keys(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """A nested mapping's leaves as ``(dotted key, value)`` (an empty mapping is a leaf)."""
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.extend(flatten_keys(value, full + "."))
        else:
            out.append((full, value))
    return out


def config_source(path: str | Path | None, overridden: bool) -> str:
    """What an invalid config's error says it was read from (:func:`hetfed.config.build_config`'s ``source``): the file
    — the key alone does not say where it was typed — and whether overrides went onto it; nothing for the defaults."""
    return "" if path is None else f" (file {str(path)!r}{' with overrides' if overridden else ''})"


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a config file; a missing, empty or malformed file is a ConfigError."""
    p = Path(path)
    where = f"config file {str(p)!r}"
    if p.is_dir():
        raise ConfigError(f"{where} is a directory: expected a YAML file (e.g. configs/default.yaml)")
    if not p.is_file():
        raise ConfigError(f"{where} does not exist: expected a YAML file (e.g. configs/default.yaml)")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{where} is not UTF-8 text (byte {err.start}): expected a YAML file") from None
    except OSError as err:
        raise ConfigError(f"{where} cannot be read: {err.strerror}") from None
    data = parse_yaml_text(text, where)
    if data is None:
        raise ConfigError(
            f"{where} is empty: expected a mapping of keys (run without a file for the defaults, "
            "or see `hetfed config`)"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping of keys, not {type(data).__name__}")
    return data


def method_entries(path: str | Path, names: list[str], plain: bool = False) -> list[dict[str, Any]]:
    """The entries of a config file's ``methods`` named ``names``, as the file writes them — its parameters and own
    train settings — for a script that runs some of a protocol's methods (``--set methods=[…]``, ``--grid``) without
    loading torch (:func:`pick_methods`)."""
    return pick_methods(read_yaml(path).get("methods") or [], names, f"config file {str(path)!r}", plain)


def entry_label(entry: dict[str, Any]) -> str:
    """A config's method entry's name as written, before validation: its ``name``, else its ``algorithm`` (FedAvg when
    it names none) — :attr:`hetfed.config.MethodConfig.label` of the entry."""
    return entry.get("name") or entry.get("algorithm", "fedavg")


def pick_methods(entries: list[Any], names: list[str], where: str, plain: bool = False) -> list[dict[str, Any]]:
    """The entries of ``entries`` (a config's ``methods``, read from ``where``) named ``names`` (:func:`entry_label`),
    in that order. A name it lacks is a ConfigError naming it and the names it has; ``plain``: that name's plain
    algorithm instead."""
    by_name = {entry_label(e): e for e in entries if isinstance(e, dict)}
    missing = [n for n in names if n not in by_name]
    if missing and not plain:
        raise ConfigError(f"{where} has no method named {missing}: it has {sorted(by_name)}")
    return [by_name.get(n, {"name": n, "algorithm": n}) for n in names]


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["a.b=1,2", "c=x,y", "h=[32,32],[64]"]`` → ``{"a.b": [1, 2], "c": ["x", "y"], "h": [[32, 32], [64]]}``.

    Values are parsed as YAML and split on the commas *between* them, so list and
    dict values (``[32,32]``, ``{kind: adam}``) keep their own commas.
    """
    grid: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid {item!r} is not allowed: expected key=v1,v2,… e.g. partition.shuffle=0,0.5,1")
        key, raw = item.split("=", 1)
        key = key.strip()
        values = []
        for part in split_top_level(raw, item):
            if part.strip() == "":
                continue
            try:
                values.append(yaml.safe_load(part))
            except yaml.YAMLError:
                raise ConfigError(
                    f"--grid {item!r} is not allowed: value {part.strip()!r} is not valid YAML; "
                    "expected key=v1,v2,… with lists written [a,b] and mappings {k: v}"
                ) from None
        if not key or not values:
            raise ConfigError(f"--grid {item!r} is not allowed: expected key=v1,v2,…")
        if key in grid:
            raise ConfigError(f"--grid {key} is given twice: expected each key once (list all its values together)")
        if key == "seed":  # every grid point runs the seeds seed, seed + 1, …: a grid value would be overwritten
            raise ConfigError(f"--grid {item!r} is not allowed: the seeds are --seeds N (seed, seed + 1, …, seed + "
                              "N − 1; the first set with --set seed=S)")
        grid[key] = values
    return grid


def typed_leaves(items: list[str] | None) -> list[tuple[str, str]]:
    """Each ``--set`` item's leaves as ``(dotted key, the item as typed)``: a mapping value sets each of its keys."""
    return [(key, item) for item in items or [] for key, _ in flatten_keys(parse_overrides([item]))]


def refuse_swept_overrides(grid: dict[str, list[Any]], items: list[str] | None) -> None:
    """A key both ``--set`` and swept by ``--grid`` is refused: a grid point's value would replace the one typed
    with ``--set``, which would then be silently ignored there. Compared leaf by leaf, as the values are applied (a
    mapping sets its own keys and keeps the others: ``--grid 'train.optimizer={kind: adam},{kind: sgd}'`` keeps a
    typed ``train.optimizer.lr``); a value that is not a mapping replaces everything below its key. A grid over part
    of a value typed whole (``--set methods=[…]``, ``--grid methods.0.params.mu=…``) refines it and is allowed."""
    typed = dict(typed_leaves(items))
    for swept, values in grid.items():
        leaves = {key for value in values for key, _ in flatten_keys({swept: value})}
        whole = any(not isinstance(value, dict) for value in values)
        for key, item in typed.items():
            if key in leaves or (whole and key.startswith(swept + ".")):
                raise ConfigError(f"--grid {swept} is not allowed with --set {item}: every grid point's value would "
                                  f"replace it; expected {key} set once (drop the --set, or sweep the values wanted)")


def split_top_level(raw: str, item: str) -> list[str]:
    """Split on commas outside brackets, braces and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(raw):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth < 0:
                break
        elif ch == "," and depth == 0:
            parts.append(raw[start:i])
            start = i + 1
    if depth != 0 or quote:
        raise ConfigError(f"--grid {item!r} is not allowed: unbalanced brackets or quotes in the values")
    parts.append(raw[start:])
    return parts
