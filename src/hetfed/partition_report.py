"""What ``hetfed partition`` reports: a partition and its heterogeneity as JSON-ready values, and the check of the
figure file it may write."""

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
