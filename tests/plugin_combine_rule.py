"""A user's plugin module, as ``plugins: [tests.plugin_combine_rule]`` names it: one combine rule in one file."""

from __future__ import annotations

from hetfed.server.combine import CombineRule, RuleParams, register


class ClippedMeanParams(RuleParams):
    bound: float = 1.0


def clipped_mean(old, upload, params):
    """The unweighted mean of the updates with every coordinate clipped to ±bound around the old model."""
    return {k: (upload.params[k] - v).clamp(-params.bound, params.bound).mean(0) + v for k, v in old.items()}


register(CombineRule("plugin_clipped_mean", clipped_mean, ClippedMeanParams, streams=False,
                     summary="a plugin's rule (tests)"))
