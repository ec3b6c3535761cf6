"""``ag_news``: AG News from its train.csv / test.csv (class, title, description)."""

from __future__ import annotations

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.formats import read_ag_news_csv
from hetfed.data.loading import Dataset, file_record, find_folder


def load_ag_news(cfg: DatasetConfig) -> Dataset:
    """AG News from train.csv/test.csv; text — embed it (embed.kind=minilm) to train."""
    folder = find_folder("ag_news", cfg.data_dir, ["train.csv", "test.csv"])
    x_tr, y_tr = read_ag_news_csv(folder / "train.csv")
    x_te, y_te = read_ag_news_csv(folder / "test.csv")
    sources = tuple(file_record(folder / n) for n in ("train.csv", "test.csv"))
    return Dataset("ag_news", x_tr, y_tr, x_te, y_te, int(max(y_tr.max(), y_te.max())) + 1, "text", sources=sources)


register(DatasetKind(
    "ag_news", load_ag_news, "AG News: 4 classes of news titles and descriptions (text: embed it)", "text",
    places=("~/.cache/hetfed/datasets/ag_news", "~/data/ag_news"),
    how_to_get="get train.csv and test.csv of AG News (class,title,description) into one folder",
))
