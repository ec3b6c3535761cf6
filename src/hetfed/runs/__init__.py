"""What writes a run: the run directory (its files, status, heartbeat), checkpoints, the runner
(every configured method on one federation) and sweeps (a grid × seeds of runs).

Nothing here draws or renders: :mod:`hetfed.analysis` reads what a run wrote, and the entry
points (``hetfed.api``, ``hetfed.cli``, the Flower ServerApp) hand a run's presenter to
:func:`~hetfed.runs.runner.run_experiment` and :func:`~hetfed.runs.sweep.run_sweep`.
"""
