"""What ``hetfed partition`` reports: a partition and its heterogeneity as JSON-ready values and as its table, and the
check of the figure file it may write."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from hetfed.config import Config
from hetfed.errors import ConfigError


def partition_report(config: Config, status: Console | None = None) -> dict:
    """The JSON-ready description of a partition and its heterogeneity (``status``: where its steps are shown)."""
    from hetfed.pipeline import prepare

    prep = prepare(config, progress=True, status=status)
    fed, het = prep.federation, prep.heterogeneity
    counts = fed.class_counts()
    from hetfed.partition.shift import concept_names

    concepts = concept_names(fed.n_clients, fed.params)
    clients = [
        {
            "client": k,
            "size": int(counts[k].sum()),
            "train": int(len(fed.train[k])),
            "val": int(len(fed.val[k])),
            "test": int(len(fed.test[k])),
            "class_counts": counts[k].tolist(),
            "classes": int((counts[k] > 0).sum()),
            "opted_out": bool(fed.opted_out[k]),
            "label_emd": het.label_emd[k],
            **({"concept": concepts[k]} if concepts else {}),
        }
        for k in range(fed.n_clients)
    ]
    return {
        "dataset": config.dataset.name,
        "embed": config.embed.kind,
        "partition": config.partition.model_dump(),
        "seed": config.seed,
        "n_clients": fed.n_clients,
        "n_classes": fed.n_classes,
        "global_test_size": int(len(fed.y_global_test)),
        "global_test_balanced": bool(getattr(prep.data, "balanced_test", True)),
        **{k: v for k, v in het.as_dict().items() if k.startswith("gamma")},
        "label_emd_mean": het.label_emd_mean,
        "js_mean": het.js_mean,
        "data_files": list(prep.sources),
        "data_notes": list(prep.notes),  # what loading did, as a run's summary.json records it
        "warnings": list(prep.warnings),
        "clients": clients,
        "_federation": fed,
        "_class_names": prep.data.class_names if prep.data is not None else (),
    }


def check_figure_path(path: str, key: str = "--plot") -> None:
    """A figure file name must have a format matplotlib writes and a folder that exists."""
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise ConfigError(
            f"{key} {path!r} is not allowed: expected a file name ending in one of "
            f"{', '.join('.' + f for f in sorted(formats))} (e.g. clients.png)"
        )
    folder = Path(path).parent
    if not folder.is_dir():
        raise ConfigError(f"{key} {path!r} is not allowed: the folder {str(folder)!r} does not exist")


def print_partition(console: Console, config: Config, report: dict) -> None:
    """``hetfed partition``'s table of :func:`partition_report`'s clients and its heterogeneity lines."""
    from rich.table import Table

    from hetfed.heterogeneity import gamma_given_label_line, gamma_line

    table = Table(title=f"{config.dataset.name} · {config.partition.kind} · {report['n_clients']} clients")
    on = config.heterogeneity.on  # label EMD is measured on the rows Γ is (the API's label_emd_<on> column)
    concept = any("concept" in c for c in report["clients"])  # partition.rotations / label_swaps
    for col in ("client", "size", "train/val/test", "classes", "opted out", f"label EMD ({on})",
                *(["concept"] if concept else [])):
        table.add_column(col, justify="right")
    for c in report["clients"]:
        table.add_row(
            str(c["client"]), str(c["size"]), f"{c['train']}/{c['val']}/{c['test']}",
            str(c["classes"]), "yes" if c["opted_out"] else "", f"{c['label_emd']:.3f}",
            *([c["concept"]] if concept else []),
        )
    console.print(table)
    for line in (gamma_line(report), gamma_given_label_line(report)):
        if line is not None:
            console.print(line, soft_wrap=True)
    console.print(
        f"label EMD mean ({on}) = {report['label_emd_mean']:.3f}   JS mean = {report['js_mean']:.4f}   "
        f"global test = {report['global_test_size']} "
        f"({'class-balanced' if report['global_test_balanced'] else 'the test split as is, not class-balanced'})",
        soft_wrap=True,
    )
