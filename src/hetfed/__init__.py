"""hetfed: federated learning on clients that are not alike (non-IID).

A run flows one way: load → embed → partition → measure heterogeneity → train
(algorithm driven by an executor) → report. See ``DESIGN.md`` in the docs.
"""

__version__ = "0.1.0"
