"""What a server's defence decided about a round's malicious updates: how many it left out, how many honest ones it
left out with them, and the share of its weight the malicious ones got.

A study of defences reads these beside the accuracy (FLAME's and FLDetector's papers report the true and false
positive rates of their filters): a rule can hold the accuracy by luck of the round while keeping every attacker, or
keep the attackers out while dropping honest clients too. The simulator knows which clients are malicious
(:class:`hetfed.engine.faults.Adversary`); the server's screen and combine rule do not, and say only what they kept
(the accepted upload) and how much each update counted (:class:`hetfed.server.combine.Weighed`, kept in the chain's
state as :data:`hetfed.server.chain.DECIDED`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def detection(malicious: np.ndarray, trained: Sequence[int], decided: dict[str, Any]) -> dict[str, float]:
    """A round's columns: of the clients that ``trained`` and sent an update, ``attackers_sent`` malicious ones and
    ``honest_sent`` others; ``attackers_excluded`` / ``honest_excluded``: those the server's screen rejected or its
    combine rule gave weight 0 (``decided``: the rule's ``clients`` and ``weights`` that round); ``attack_weight``:
    the malicious updates' share of the rule's weights (absent when the rule gave every update 0)."""
    weight = dict(zip(decided["clients"], np.asarray(decided["weights"].cpu(), dtype=float).tolist(), strict=True))
    bad = [k for k in trained if malicious[k]]
    good = [k for k in trained if not malicious[k]]
    out: dict[str, float] = {
        "attackers_sent": len(bad), "attackers_excluded": sum(weight.get(k, 0.0) <= 0 for k in bad),
        "honest_sent": len(good), "honest_excluded": sum(weight.get(k, 0.0) <= 0 for k in good)}
    total = sum(weight.values())
    if total > 0:
        out["attack_weight"] = sum(weight.get(k, 0.0) for k in bad) / total
    return out
