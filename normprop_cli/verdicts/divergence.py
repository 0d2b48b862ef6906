"""How many of a sweep's runs diverged, and at which rates, from its summary.csv (statuses) and each
run's config.yaml (its train.lr): one count behind the line `normprop run` prints, the report's line
in the experiment's section, the figures' "all runs diverged" and the verdict "inconclusive: N of M
runs diverged" of a claim that a diverged grid leaves nothing to measure.

    gone = divergence(sweep)      # Divergence(diverged=3, runs=3, rates=(1e9,), settings=(...))
    if gone: print(gone.text())   # '3 of 3 runs diverged (lr 1e9)'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from normprop_cli.engine.runs import CONFIG
from normprop_cli.outcomes import diverged
from normprop_cli.verdicts.rule import INCONCLUSIVE

ALL_DIVERGED = "all runs diverged"  # a figure's note where no curve is finite


@dataclass(frozen=True)
class Divergence:
    diverged: int  # runs whose status is "diverged"
    runs: int  # every reported run of the sweep (summary.csv's rows)
    rates: tuple[float, ...] = ()  # the diverged runs' learning rates, lowest first
    settings: tuple[str, ...] = ()  # the settings whose every run diverged, in the grid's order

    def __bool__(self) -> bool:
        return self.diverged > 0

    @property
    def every(self) -> bool:
        """Did every run of the sweep diverge?"""
        return self.runs > 0 and self.diverged == self.runs

    def count(self) -> str:
        return f"{self.diverged} of {self.runs} runs diverged"

    def text(self) -> str:
        """'3 of 3 runs diverged (lr 1e9)'; where some settings kept runs, the settings that lost all theirs."""
        rates = f" (lr {', '.join(rate(r) for r in self.rates)})" if self.rates else ""
        whole = f": every run of {', '.join(self.settings)}" if self.settings and not self.every else ""
        return f"{self.count()}{rates}{whole}" if self else ""

    def verdict(self) -> str:
        """'inconclusive: 3 of 3 runs diverged': a claim's verdict where the diverged runs leave nothing to measure."""
        return f"{INCONCLUSIVE}: {self.count()}"


def is_diverged_verdict(verdict) -> bool:
    """Is `verdict` Divergence.verdict's (an inconclusive verdict with nothing measured)?"""
    return isinstance(verdict, str) and verdict.startswith(f"{INCONCLUSIVE}: ") and verdict.endswith(" diverged")


def rate(lr: float) -> str:
    """'1e9', '0.05': a learning rate in a sentence."""
    mantissa, e, exponent = f"{float(lr):g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if e else mantissa


def summary_of(sweep: Path) -> pd.DataFrame:
    """The sweep's summary.csv; empty where there is none yet."""
    path = Path(sweep) / "summary.csv"
    return pd.read_csv(path) if path.exists() and path.stat().st_size > 1 else pd.DataFrame()


def without_diverged(table: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The rows of `table` (e.g. epochs.csv) whose run did not diverge, as summary.csv says; all of
    them where either has no `run` column."""
    if "run" not in table or "run" not in summary:
        return table
    return table[~table["run"].isin(summary.loc[diverged(summary), "run"])]


def divergence(sweep: Path, summary: pd.DataFrame | None = None) -> Divergence:
    """The diverged runs of the sweep in `sweep` (results/<experiment>/<dataset>), from its summary.csv
    (or `summary`, its rows) and their config.yaml; no runs where there is no summary yet."""
    sweep = Path(sweep)
    summary = summary_of(sweep) if summary is None else summary
    gone = diverged(summary)
    if not gone.any():
        return Divergence(0, len(summary))
    rates = set()
    for _, row in summary[gone].iterrows():
        config = sweep / "runs" / str(row.get("run")) / CONFIG
        lr = OmegaConf.select(OmegaConf.load(config), "train.lr") if config.exists() else row.get("initial_lr")
        if lr is not None and pd.notna(lr):
            rates.add(float(lr))
    settings = ()
    if "setting" in summary:
        whole = gone.groupby(summary["setting"], sort=False).all()
        settings = tuple(str(s) for s, every in whole.items() if every)
    return Divergence(int(gone.sum()), len(summary), tuple(sorted(rates)), settings)
