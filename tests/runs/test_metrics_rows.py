"""metrics.csv's rows (:class:`hetfed.runs.rundir.MetricsWriter`) are what the csv module writes, whatever the
names and values: the rows of plain numbers (floats, ints) go as one string, every other through the csv module."""

from __future__ import annotations

import csv
import io
import math
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hetfed.runs.rundir import METRIC_COLUMNS, MetricsWriter, read_metric_rows

names = st.one_of(st.text('ab ,"\r\n\t\'', max_size=6),  # the characters the csv module quotes for, and others
                  st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8))
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5), st.integers(), st.booleans(),
                   st.none())
floats = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=60, deadline=None)
@given(method=names, split=names, client=st.one_of(st.just("all"), st.integers(0, 9)),
       summary=st.dictionaries(names, st.one_of(floats, values), max_size=4),
       per_client=st.dictionaries(names, st.one_of(st.lists(floats, max_size=4), st.lists(values, max_size=4)),
                                  max_size=4))
@example(method='fed"avg', split="summary", client="all", summary={"acc": 0.5}, per_client={"a,b": [0.25, 1.0]})
@example(method="m", split="x\ny", client=3, summary={'q"': float("nan"), "n": 2}, per_client={"c": [None, 1.5]})
@example(method="m", split="train", client="all", summary={"clients": 20, "up": 10**30, "skipped": True},
         per_client={"n": [3, -4], "w": [0.5, 2]})
def test_rows_are_the_csv_modules(method: str, split: str, client: int | str, summary: dict[str, float],
                                  per_client: dict[str, list[float]]) -> None:
    expected = io.StringIO(newline="")
    rows = csv.writer(expected)
    rows.writerow(METRIC_COLUMNS)
    rows.writerows([method, 3, split, client, metric, value] for metric, value in summary.items())
    rows.writerows([method, 3, "client", k, metric, value] for metric, vs in per_client.items()
                   for k, value in enumerate(vs))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.csv"
        writer = MetricsWriter(path)
        writer.write(method, 3, split, client, summary)
        writer.write_clients(method, 3, per_client)
        writer.close()
        assert path.read_bytes().decode() == expected.getvalue()


def test_rows_read_back_as_written(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path / "metrics.csv")
    writer.write('fed, "avg"', 1, "summary", "all", {"acc": 0.5, "loss": float("nan")})
    writer.write_clients('fed, "avg"', 1, {"acc": [0.25, 1e-300], "n": [3, 4]})
    writer.close()
    rows = list(read_metric_rows(tmp_path / "metrics.csv"))
    assert [(r["method"], r["client"], r["metric"]) for r in rows][:3] == [
        ('fed, "avg"', "all", "acc"), ('fed, "avg"', "all", "loss"), ('fed, "avg"', "0", "acc")]
    assert float(rows[0]["value"]) == 0.5 and math.isnan(float(rows[1]["value"]))
    assert [float(r["value"]) for r in rows[2:]] == [0.25, 1e-300, 3, 4]
