"""The hetfed ``ServerApp`` that ``flwr run`` starts (deployment, or a local simulation federation).

It reads its run config (``config-yaml``: the resolved hetfed config as YAML
text; ``out``: the run directory to write, on the machine the ServerApp runs on;
``resume``: continue the killed run in ``out`` from its checkpoint; ``report``: draw its figures and
report.html at the end)
and runs :func:`hetfed.runs.runner.run_experiment` with every method on
this Flower federation: the same code path as ``hetfed run``, with the
:class:`~hetfed.flower.executor.FlowerExecutor` in place of the in-process one.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    from hetfed.analysis.present import present_run
    from hetfed.config import build_config
    from hetfed.config_io import parse_yaml_text
    from hetfed.environment import refuse_unknown
    from hetfed.flower.kinds import Deployment
    from hetfed.registry import registry_of
    from hetfed.runs.runner import run_experiment

    _marks_its_run_failed_before_flowers_timer()
    refuse_unknown()  # the SuperLink's environment: a mistyped HETFED_* fails the run, naming it
    text = str(context.run_config.get("config-yaml", ""))
    if not text.strip():
        raise ValueError("run config 'config-yaml' is empty: start runs with `hetfed flower run CONFIG`")
    config = build_config(parse_yaml_text(text, "run config 'config-yaml'"))
    out = str(context.run_config.get("out", "")) or None
    resume = bool(context.run_config.get("resume", False))
    if resume and out is None:
        raise ValueError("run config 'resume' needs 'out': the run directory to continue")
    prepared = None
    if registry_of("dataset").get(config.dataset.name).on_nodes:  # the federation is what the nodes say they hold
        from hetfed.flower.discovery import discover

        prepared = discover(grid, config)
    present = present_run if bool(context.run_config.get("report", True)) else None
    run_experiment(config, out=out, progress=True, executor=Deployment.on(grid), present=present, resume=resume,
                   prepared=prepared)


def _marks_its_run_failed_before_flowers_timer() -> None:
    """``flwr stop`` (or a signal) ends a ServerApp through Flower's own handler: it starts a 5 s timer that kills the
    process, pushes the app's outputs and closes its connections, and only then raises ``SystemExit`` in the run —
    in a CI run under load the timer came first and the run was left marked running (process dead). A Flower exit
    handler run before that timer says the run's last words (its directory marked failed) first."""
    from flwr.supercore.exit import add_exit_handler

    from hetfed.processes import say_last_words

    # the exit's status is Flower's to choose (0 when stopped, 1 on its own error), not known here
    add_exit_handler(lambda: say_last_words(SystemExit()), run_before_force_exit=True)
