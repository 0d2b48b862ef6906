"""The normalizers section shows the comparisons on the preset's first seeds beside all seeds wherever
`experiment.extra_seeds` gave some settings more, so that a reading the added seeds moved shows as such."""

import math

import pandas as pd
import pytest
from scipy import stats

from normprop_cli import config
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.normalizers.findings import seeds_added
from normprop_cli.experiments.normalizers.tables import read_table


@pytest.fixture(scope="module")
def fashion():
    cfg = config.load("normalizers", "fashion")
    return cfg, read_table(cfg), run_tables.read(cfg, "summary")


def _row(text: str, method: str) -> list[str]:
    return next(line.split(" | ") for line in text.splitlines() if line.startswith(f"| 50 | {method} |"))


def test_the_first_seeds_comparison_is_a_welch_interval_on_those_seeds_alone(fashion):
    cfg, t, summary = fashion
    text = seeds_added(cfg, t)
    first = summary[(summary["seed"] < 3) & (summary["batch_size"] == 50)]
    a = first.loc[first["normalizer"] == "ws-gn", "final_test_acc"]
    b = first.loc[first["normalizer"] == "normprop-icml", "final_test_acc"]
    assert len(a) == len(b) == 3
    level = float(t["diff_level"].dropna().iloc[0])  # the same Bonferroni family at both seed counts
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = stats.t.ppf(0.5 + level / 2, df) * math.sqrt(va + vb)
    d = a.mean() - b.mean()
    row = _row(text, "WS + GroupNorm")
    assert row[2] == "3 / 5"
    assert row[3].startswith(f"{d:.2f} [{d - half:.2f}, {d + half:.2f}]")


def test_a_reading_moved_by_the_added_seeds_is_named(fashion):
    cfg, t, summary = fashion
    text = seeds_added(cfg, t)
    assert "indistinguishable -> better" in _row(text, "WS + GroupNorm")[-1]
    assert "WS + GroupNorm at batch 50 (indistinguishable -> better)" in text


def test_no_paragraph_without_added_seeds():
    cfg = config.load("normalizers", "quick")
    assert not (cfg.experiment.get("extra_seeds") or {})
    assert seeds_added(cfg, pd.DataFrame()) == ""
