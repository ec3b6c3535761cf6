"""What a mistyped name most likely meant: the one typo away (``mpl`` → ``mlp``), for the one-line errors that refuse
a key, a choice or a variable nothing reads — so the refusal says the fix, not only what is allowed; and what to type
where one value was given for a whole section."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the environment's checks import this module where nothing else loads pydantic
    from pydantic import BaseModel


def typos_apart(a: str, b: str) -> int:
    """How many typos turn ``a`` into ``b``: letters left out, added, changed or swapped with the next (the optimal
    string alignment distance)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def nearest(typed: str, choices: Iterable[str]) -> list[str]:
    """The choice ``typed`` is most likely a typo of: one typo away (two from ten letters, three from fifteen), and
    starting with the same letter, as typos do (``gpu`` is not ``cpu`` mistyped, nor ``fedsgd`` ``feddf``)."""
    apart = {c: typos_apart(typed, c) for c in choices if c[:1] == typed[:1]}
    near = sorted((n, c) for c, n in apart.items() if 0 < n <= max(1, len(typed) // 5))
    return [near[0][1]] if near else []


def did_you_mean(typed: object, choices: Iterable[str], prefix: str = "") -> str:
    """``"did you mean 'mlp'? "`` when ``typed`` is a string that looks like a typo of one of ``choices`` (``mpl``,
    ``vectorized``; shown after ``prefix``: ``'train.rounds'``), else nothing: the start of a refusal that then lists
    every choice."""
    near = nearest(typed, choices) if isinstance(typed, str) else []
    return f"did you mean {prefix + near[0]!r}? " if near else ""


def choice_hint(error: Mapping[str, Any]) -> str:
    """:func:`did_you_mean` for one of pydantic's errors: a value that is not one of a field's fixed few (a
    ``Literal``: ``'sortd'`` for ``'within_class'`` or ``'sorted'``) and looks like a typo of one; else nothing. The
    config's sections and every component's parameters answer their choices with it alike."""
    if error.get("type") != "literal_error":
        return ""
    return did_you_mean(error.get("input"), re.findall(r"'([^']*)'", error["ctx"]["expected"]))


def section_expected(key: str, value: Any, section: type[BaseModel] | None) -> str:
    """What to type where one value was given for a whole section (``--set partition=dirichlet``): the section's
    keys, and — for a section that chooses a component — the key that chooses it, set to that value. Pydantic's own
    message named the section's class (``a valid dictionary or instance of PartitionConfig``)."""
    if section is None:
        return "expected a section (a mapping of its keys), not one value"
    keys = list(section.model_fields)
    shown = ", ".join(keys[:8]) + (", …" if len(keys) > 8 else "")
    msg = f"expected a section of keys ({shown}), not one value"
    chooser = getattr(section, "chosen_by", None)
    field = chooser[1] if chooser is not None else "kind" if "kind" in section.model_fields else None
    if field is not None and isinstance(value, str):
        msg += f"; to choose its {field}: --set {key}.{field}={value}"
        parts = key.split(".")
        if not any(part.isdigit() for part in parts):  # the same in YAML, nested as the file nests it
            msg += f" (in YAML, {': {'.join(parts)}: {{{field}: {value}}}{'}' * (len(parts) - 1)})"
    return msg
