"""hetfed: federated learning on clients that are not alike (non-IID).

A run flows one way: load → embed → partition → measure heterogeneity → train
(algorithm driven by an executor) → report. The README describes the commands and
the config; ``docs/methods.md`` what each method sends off a client.
"""

__version__ = "0.1.0"
