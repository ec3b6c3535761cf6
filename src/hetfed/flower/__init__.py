"""hetfed's algorithms on Flower: the same algorithm objects, Flower's Message API on the wire.

- :mod:`hetfed.flower.records`: Broadcast / Upload / metrics ↔ Flower records;
- :mod:`hetfed.flower.client_app`: the ``ClientApp`` (one client per SuperNode, its
  local state in the node's context state);
- :mod:`hetfed.flower.executor`: the server side, an executor that sends the
  client steps as messages through a Flower ``Grid``;
- :mod:`hetfed.flower.server_app`: the ``ServerApp`` that ``flwr run`` starts;
- :mod:`hetfed.flower.simulation`: ``train.executor: flower`` — a run on Flower's
  Simulation Engine from ``hetfed run``;
- :mod:`hetfed.flower.deploy`: a local deployment (SuperLink + SuperNodes) started
  and stopped by PID.

Everything here needs the ``flower`` extra (``pip install 'hetfed[flower]'``).
"""

from __future__ import annotations

from hetfed.errors import MissingExtraError


def require_flwr() -> None:
    """Fail with the extra to install when Flower is missing."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise MissingExtraError(
            "train.executor = 'flower' needs Flower: pip install 'hetfed[flower]' (after torch==2.13.0)"
        ) from None
