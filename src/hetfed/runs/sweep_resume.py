"""What ``hetfed sweep --resume`` does with an earlier sweep's folder: the sweep checked to be the same one, and
each run's folder reused, continued from its checkpoint, moved aside and redone, or trained — the one
classification a sweep and its dry run share (:func:`fate`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hetfed.config import Config, migrate_legacy
from hetfed.errors import ConfigError, RunError
from hetfed.runs.rundir import CONFIG, SUMMARY, SWEEP_REQUEST


def resumed(out: str | Path | None, resume: bool) -> Path | None:
    """The earlier sweep being resumed: ``out`` where ``resume`` names a folder that is there (else a new one)."""
    return Path(out) if resume and out is not None and Path(out).is_dir() else None


def check_resumable(sweep_dir: Path, runs: list[tuple[Path, Config]], each_method: bool) -> None:
    """Refuse to resume a sweep with a different config (its ``runs``' folders and configs), or with its methods run
    otherwise (``--each-method``, whose runs are folders of their own): its completed runs would be thrown away, or
    run again beside them."""
    made = sweep_dir / SWEEP_REQUEST
    apart = json.loads(made.read_text()).get("each_method", False) if made.is_file() else False
    if apart != each_method:
        raise ConfigError(f"--resume {str(sweep_dir)!r} {'without' if apart else 'with'} --each-method is not allowed: "
                          f"the sweep was made {'with' if apart else 'without'} it (its runs are "
                          f"{'one a method' if apart else 'whole'}); expected the same flags as the first time")
    changed = []
    for run_dir, cfg in runs:
        done = run_dir / CONFIG
        if (run_dir / SUMMARY).is_file() and done.is_file() and not same_config(done, cfg):
            old = migrate_legacy(yaml.safe_load(done.read_text()))  # an older hetfed's keys where they are now
            changed.append((run_dir, config_diff(old, cfg.model_dump(mode="json"))))
    if changed:
        run_dir, diff = changed[0]
        raise RunError(
            f"--resume {str(sweep_dir)!r}: {len(changed)} completed runs were made with a different config "
            f"(e.g. {run_dir.relative_to(sweep_dir)}: {', '.join(diff[:4]) or 'other settings'}); resuming would "
            "redo them. Expected the same config and --set values as the first time, or a new --out"
        )


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two resolved configs (``key: old → new``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += config_diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} → {new!r}"]


def fate(run_dir: Path, cfg: Config, resume: bool) -> tuple[str, dict[str, Any] | None]:
    """What a sweep does with a run's folder: ``train`` it; resuming, ``reuse`` the completed run of this config (its
    summary, read once), ``continue`` a failed or killed one from its checkpoint, or ``redo`` one that is neither
    (:func:`move_aside` first)."""
    if not (resume and run_dir.exists()):
        return "train", None
    if (summary := _completed(run_dir, cfg)) is not None:
        return "reuse", summary
    return ("continue" if _resumable(run_dir, cfg) else "redo"), None


def _completed(run_dir: Path, cfg: Config) -> dict[str, Any] | None:
    """The summary of a completed run made with exactly this config, else None."""
    summary, config = run_dir / SUMMARY, run_dir / CONFIG
    if summary.is_file() and config.is_file() and same_config(config, cfg):
        loaded: dict[str, Any] = json.loads(summary.read_text())
        return loaded
    return None


def same_config(path: Path, cfg: Config) -> bool:
    """Whether a run's config.yaml is ``cfg``: read with this hetfed (an older one's keys migrated), so a setting
    added since the run was made (absent from its file) counts as its default — the behaviour the run had — and not
    as a change."""
    from hetfed.config import dump_config, load_run_config

    if path.read_text() == dump_config(cfg):
        return True
    try:
        return load_run_config(path).model_dump(mode="json") == cfg.model_dump(mode="json")
    except Exception:  # a file this hetfed cannot read is not the same config
        return False


def _resumable(run_dir: Path, cfg: Config) -> bool:
    """A failed or killed run of exactly this config with a checkpoint: ``--resume`` continues it in place."""
    from hetfed.runs.checkpoint import checkpoint_path
    from hetfed.runs.rundir import run_state

    config = run_dir / CONFIG
    return (config.is_file() and same_config(config, cfg) and checkpoint_path(run_dir).is_file()
            and run_state(run_dir) in ("failed", "dead"))


def move_aside(run_dir: Path) -> Path:
    """``run_dir`` renamed ``<name>.incomplete-<n>`` (never deleted), for the run to be redone in its place."""
    i = 1
    while (target := run_dir.with_name(f"{run_dir.name}.incomplete-{i}")).exists():
        i += 1
    run_dir.rename(target)
    return target
