"""How the suite's runs on Flower's Simulation Engine use Ray: one ClientApp actor at a time.

Each actor Ray starts imports torch, Flower and hetfed (~3–6 s of CPU: measured with process accounting over a suite
run, 46 actors took 4.8 CPU-minutes) while the suite's pytest workers already keep the cores busy; one actor
per simulation does the same work with half the starts. A client's numbers do not depend on it (its seeds are its
own), and ``tests/flower/test_flower_ray_cluster.py`` keeps running several actors across a cluster's nodes."""

from __future__ import annotations

import os

#: ``flower.client_cpus`` = every CPU Ray sees: one actor (as a ``flower`` section's keys, and as a ``--set``)
ONE_ACTOR = {"client_cpus": float(os.cpu_count() or 1)}
ONE_ACTOR_SET = f"flower.client_cpus={ONE_ACTOR['client_cpus']:g}"
