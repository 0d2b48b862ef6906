"""The verdict table of one results tree: one row per claim (and data set), COLUMNS, and
<results>/verdicts.csv."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from normprop_cli import io
from normprop_cli.verdicts.measures import MEASURES, Measurement, NotMeasured
from normprop_cli.verdicts.rule import (
    NOT_MEASURED,
    NOT_YET_MEASURED,
    Claim,
    Estimate,
    claims,
    final_verdict,
    halves,
    verdict,
)
from normprop_cli.verdicts.sources import budget, plural, protocol_note, provenance, result_dirs

COLUMNS = ["dataset", "preset", "claim", "source", "experiment", "metric", "normprop", "baseline",
           "effect", "ci_low", "ci_high", "test", "n_seeds", "verdict", "verdict_half_a",
           "verdict_half_b", "budget", "note"]  # fmt: skip


def judge(claim: Claim, m: Measurement) -> dict:
    """The estimate on all seeds and the verdicts on all seeds and on each half."""
    full = m.estimate(m.table)
    a, b = halves(m.table["seed"])

    def verdict_of(e: Estimate) -> str:
        return verdict(claim.kind, e.ci_low, e.ci_high, claim.margin, e.n_seeds)

    on_all = verdict_of(full)
    half_a, half_b = (verdict_of(m.estimate(m.table[m.table["seed"].isin(h)])) for h in (a, b))
    return {
        "normprop": full.normprop,
        "baseline": full.baseline,
        "effect": full.effect,
        "ci_low": full.ci_low,
        "ci_high": full.ci_high,
        "test": m.test,
        "n_seeds": full.n_seeds,
        "verdict": final_verdict(on_all, half_a, half_b),
        "verdict_half_a": half_a,
        "verdict_half_b": half_b,
    }


def rows_of(claim: Claim, results: Path, preset: str) -> list[dict]:
    """One row per data set the claim's experiment ran on; one "not measured" row if none."""
    head = {"claim": claim.id, "source": claim.source, "experiment": claim.experiment}
    if claim.id not in MEASURES:
        note = f"no verdict rule yet: an `{claim.experiment}` experiment (SPEC §11) will measure it"
        if result_dirs(results, claim.experiment):
            note = f"`{claim.experiment}` results exist, but no verdict rule reads them yet"
        return [head | {"dataset": "", "preset": preset, "verdict": NOT_YET_MEASURED, "note": note}]
    dirs = result_dirs(results, claim.experiment)
    if not dirs:
        note = f"`normprop run {claim.experiment}` produces it"
        return [head | {"dataset": "", "preset": preset, "verdict": NOT_MEASURED, "note": note}]
    rows = []
    for sweep in dirs:
        prov = provenance(sweep)
        theory = claim.experiment == "theory"
        dataset = "N(0,1) input" if theory else prov.get("dataset", sweep.name)
        row = head | {"dataset": dataset, "preset": preset if theory else prov.get("preset", preset)}
        try:
            m = MEASURES[claim.id](claim, sweep, prov)
        except NotMeasured as exc:
            note = f"{exc}; `normprop run {claim.experiment}` with this version produces it"
            rows.append(row | {"verdict": NOT_MEASURED, "note": note})
            continue
        notes = list(m.notes)
        if theory:
            seeds = m.table["seed"].nunique()
            row["budget"] = f"N(0,1) input, no training, fc net of {m.metric['depth']} layers, {plural(seeds, 'seed')}"
        elif prov:
            row["budget"] = budget(prov)
            notes += protocol_note(claim.experiment, prov)
        rows.append(row | {"metric": claim.metric.format(**m.metric)} | judge(claim, m) | {"note": "; ".join(notes)})
    return rows


def tree_preset(results: Path) -> str:
    """The preset most of a results tree's sweeps ran with ('' when none says)."""
    presets = [provenance(d).get("preset") for e in {c.experiment for c in claims()} for d in result_dirs(results, e)]
    presets = [p for p in presets if p]
    return max(set(presets), key=presets.count) if presets else ""


def table(results: Path) -> pd.DataFrame:
    """One row per claim (per data set where a claim's experiment ran on several), COLUMNS."""
    results = Path(results)
    preset = tree_preset(results)
    rows = [row for claim in claims() for row in rows_of(claim, results, preset)]
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    return frame.astype({"n_seeds": "Int64"})


def write_verdicts(results: Path, frame: pd.DataFrame | None = None) -> Path:
    """<results>/verdicts.csv."""
    return io.write_csv(Path(results) / "verdicts.csv", table(results) if frame is None else frame)
