"""What a mistyped name most likely meant: the one typo away (``mpl`` → ``mlp``), for the one-line errors that refuse
a key, a choice or a variable nothing reads — so the refusal says the fix, not only what is allowed."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any


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
