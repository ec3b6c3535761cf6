"""``none``: the server attacks nothing (a run's default ``leakage.kind``)."""

from hetfed.leakage import LeakageAttack, register
from hetfed.registry import ComponentParams


def _nothing(*_: object) -> None:
    return None


register(LeakageAttack("none", "nothing", _nothing, ComponentParams, "no attack: the run measures no leakage"))
