"""Executors: what runs an algorithm's rounds — in process (``inprocess``: vectorised and sequential; ``simulate``:
the round loop) and, in :mod:`hetfed.flower`, on Flower. They sit above the server pipeline they feed."""
