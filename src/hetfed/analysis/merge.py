"""``hetfed merge``: one sweep's tables from sweeps of one config run on other seeds or other grid values.

A sweep that needs more seeds is normally extended in place (``hetfed sweep … --seeds 5 --out DIR --resume``
reuses the runs it has). That needs the run directories, which are large (a FedMoE run of the paper's protocol
is ~20 MB) and are often deleted once a sweep's small tables are kept (``runs.csv``, ``curves.csv``: what
``results/`` holds). Then the extra seeds are run as a sweep of their own (``--set seed=3 --seeds 2``) and this
module combines the two from their tables alone, as it combines sweeps over other values of the same keys:
``runs.csv`` and ``curves.csv`` concatenated, ``sweep.csv`` and ``heterogeneity.csv`` recomputed over every seed
(the same mean and Student-t CI as ``hetfed sweep``), and the sweep's learning-curve and per-metric figures
redrawn.

Refused, with one line each: a folder without ``runs.csv``; sweeps over different grid keys; a seed that two
folders both hold for the same grid point (it would be counted twice); sweeps whose recorded configs
(``sweep_request.json``, where kept) differ in more than the seed and the swept keys' values; an ``--out`` that
already holds files.
The merged folder is written beside ``--out`` and renamed into place, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import csv
import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hetfed.errors import ConfigError
from hetfed.runs.rundir import (
    CURVES_TABLE,
    HETEROGENEITY_TABLE,
    RUNS_TABLE,
    SWEEP_RECORD,
    SWEEP_REQUEST,
    SWEEP_TABLE,
    write_json_atomic,
)
from hetfed.runs.sweep_resume import config_diff
from hetfed.runs.sweep_tables import (
    aggregate_values,
    write_heterogeneity,
    write_table,
)

RUNS, CURVES = RUNS_TABLE, CURVES_TABLE


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows or "seed" not in rows[0]:
        raise ConfigError(f"merge: {path} is not a sweep's {path.name} (expected a header with a 'seed' column)")
    return rows[0], rows[1:]


def _grid_keys(header: list[str]) -> list[str]:
    return header[: header.index("seed")]


def _without(config: dict, dotted: list[str]) -> dict:
    """``config`` with the given dotted keys removed (what each run sets for itself: its seed, its grid values)."""
    out = json.loads(json.dumps(config))
    for key in dotted:
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def _same_configs(folders: Sequence[Path], keys: list[str]) -> dict | None:
    """The first recorded sweep request; refuse sweeps whose configs differ in more than the seed and the
    swept keys' values (more seeds, or more values of the same keys, are what a merge adds)."""
    first: tuple[Path, dict] | None = None
    for folder in folders:
        path = folder / SWEEP_REQUEST
        if not path.is_file():
            continue
        request = json.loads(path.read_text())
        if first is None:
            first = (folder, request)
            continue
        diff = config_diff(_without(first[1].get("config", {}), ["seed", *keys]),
                           _without(request.get("config", {}), ["seed", *keys]))
        if diff:
            raise ConfigError(f"merge: {folder} was run with a different config from {first[0]} "
                              f"({', '.join(diff[:4])}); expected sweeps of one config that differ only in their "
                              "seeds or the values of their swept keys")
    return None if first is None else first[1]


def _cell_value(text: str) -> Any:
    """A runs.csv grid cell as the value it spells (numbers as numbers), for the sweep's grid record."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


@dataclass(frozen=True)
class Merged:
    """What :func:`merge_sweeps` wrote: the folder, the seeds it now holds, and the figures it could not draw."""

    path: Path
    seeds: list[int]
    curves: bool
    figure_problems: list[str]
    table: list[dict]  # sweep.csv's rows: mean ± CI per grid point × method × metric
    keys: list[str]  # the grid keys


def merge_sweeps(folders: Sequence[str | Path], out: str | Path) -> Merged:
    """Combine sweeps of one config, run on other seeds or other grid values, into one sweep folder at ``out``."""
    return _merge([Path(f) for f in folders], Path(out))


def _merge(folders: list[Path], out: Path) -> Merged:
    if len(folders) < 2:
        raise ConfigError(f"merge: {len(folders)} sweep folder given; expected two or more to merge")
    for folder in folders:
        if not (folder / RUNS).is_file():
            raise ConfigError(f"merge: {folder / RUNS} is missing; expected a sweep directory (hetfed sweep) or a "
                              "results folder that kept its runs.csv")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {str(out)!r} is not allowed: it already holds files; expected a new or empty folder")
    tables = [(folder, *_read_csv(folder / RUNS)) for folder in folders]
    header = tables[0][1]
    keys = _grid_keys(header)
    n = len(keys)  # a row: grid cells…, seed, method, metric, value
    owner: dict[tuple[tuple[str, ...], str], Path] = {}
    rows: list[list[str]] = []
    for folder, head, body in tables:
        if head != header:
            raise ConfigError(f"merge: {folder / RUNS} has columns {head}, {tables[0][0] / RUNS} has {header}; "
                              "expected sweeps over the same grid keys")
        for pkey, seed in sorted({(tuple(r[:n]), r[n]) for r in body}):
            if (pkey, seed) in owner:
                where = ", ".join(f"{k}={v}" for k, v in zip(keys, pkey, strict=True)) or "the sweep's one point"
                raise ConfigError(f"merge: seed {seed} at {where} is in both {owner[pkey, seed]} and {folder}; "
                                  "expected sweeps run on different seeds (hetfed sweep … --set seed=K)")
            owner[pkey, seed] = folder
        rows += body
    request = _same_configs(folders, keys)

    order = {p: i for i, p in enumerate(dict.fromkeys(tuple(r[:n]) for r in rows))}  # first seen, as hetfed sweep
    rows.sort(key=lambda r: (order[tuple(r[:n])], int(r[n])))
    table = aggregate_values(((tuple(r[:n]), r[n + 1], r[n + 2], float(r[n + 3])) for r in rows), keys)
    have_curves = all((f / CURVES).is_file() for f in folders)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with open(tmp / RUNS, "w", newline="") as fh:
            csv.writer(fh).writerows([header, *rows])
        write_table(tmp / SWEEP_TABLE, table, keys)
        write_heterogeneity(tmp / HETEROGENEITY_TABLE, table, keys)
        if have_curves:
            _merge_curves(folders, tmp / CURVES)
        grid = {k: list(dict.fromkeys(_cell_value(p[i]) for p in order)) for i, k in enumerate(keys)}
        seeds = sorted({int(r[n]) for r in rows})
        write_json_atomic(tmp / SWEEP_RECORD, {
            "grid": grid, "seeds": len(seeds), "seed_values": seeds, "runs": [], "failed": [], "rows": table,
            "merged_from": [str(f) for f in folders], "curves": have_curves})
        if request is not None:
            write_json_atomic(tmp / SWEEP_REQUEST, request)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    problems: list[str] = []
    try:  # the page (and the figures it keeps) is a view of the tables: a failure is reported, the tables stay
        from hetfed.analysis.report import write_report

        write_report(out, problems=problems)
    except Exception as err:
        problems.append(f"report.html: {type(err).__name__}: {err} (try: hetfed report {out})")
    return Merged(out, seeds, have_curves, problems, table, keys)


def _merge_curves(folders: Sequence[Path], path: Path) -> None:
    """Concatenate the curves.csv files (the merged sweep's figures read them back from there)."""
    header: list[str] | None = None
    body: list[list[str]] = []
    for folder in folders:
        head, rows = _read_csv(folder / CURVES)
        if header is not None and head != header:
            raise ConfigError(f"merge: {folder / CURVES} has columns {head}; expected {header}")
        header = head
        body += rows
    assert header is not None
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([header, *body])
