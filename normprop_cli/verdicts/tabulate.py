"""The verdict table of one results tree: one row per claim (and data set), COLUMNS, and
<results>/verdicts.csv."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from normprop_cli import hints, io
from normprop_cli.verdicts.departures import protocol_note
from normprop_cli.verdicts.divergence import Divergence, divergence
from normprop_cli.verdicts.measures import MEASURES, Measurement, NotMeasured
from normprop_cli.verdicts.robustness import COLUMNS as ROBUSTNESS
from normprop_cli.verdicts.robustness import robustness
from normprop_cli.verdicts.rule import (
    INCONCLUSIVE,
    NOT_MEASURED,
    NOT_YET_MEASURED,
    Claim,
    absolute_margin,
    claims,
    final_verdict,
    halves,
    level_of,
    verdict,
)
from normprop_cli.verdicts.sources import budget, provenance, result_dirs

COLUMNS = ["dataset", "preset", "claim", "source", "experiment", "metric", "normprop", "baseline",
           "effect", "ci_low", "ci_high", "test", "margin", "n_seeds", "verdict", "verdict_half_a",
           "verdict_half_b", "halves", *ROBUSTNESS, "budget", "note"]  # fmt: skip


def judge(claim: Claim, m: Measurement) -> dict:
    """The estimate on all seeds at the claim's level (level_of), the absolute margin (margin_of), the
    verdicts on all seeds and on each half, and the halves rule's outcome (final_verdict)."""
    level, margin = level_of(claim.kind), margin_of(claim, m)
    full = m.estimate(m.table, level)
    half_a, half_b = (m.estimate(m.table[m.table["seed"].isin(h)], level) for h in halves(m.table["seed"]))
    on_all, a, b = (verdict(claim.kind, e.ci_low, e.ci_high, margin, e.n_seeds) for e in (full, half_a, half_b))
    final, check = final_verdict(claim.kind, on_all, half_a, half_b, margin, claim.unit)
    return {
        "normprop": full.normprop,
        "baseline": full.baseline,
        "effect": full.effect,
        "ci_low": full.ci_low,
        "ci_high": full.ci_high,
        "test": m.test,
        "margin": margin,
        "n_seeds": full.n_seeds,
        "verdict": final if math.isfinite(margin) else INCONCLUSIVE,
        "verdict_half_a": a,
        "verdict_half_b": b,
        "halves": check,
    }


def margin_of(claim: Claim, m: Measurement) -> float:
    """The absolute margin, in the claim's unit: claim.margin * m.reference where the claim's margin
    is relative (the baseline's error over all seeds), else claim.margin."""
    return absolute_margin(claim, m.reference)


def margin_note(claim: Claim, m: Measurement) -> list[str]:
    """How a relative margin came out of the baseline's error, or that it could not be computed."""
    if not claim.relative_to:
        return []
    reference, margin = m.reference, margin_of(claim, m)
    if not math.isfinite(margin):
        return [f"the margin could not be computed: no {claim.relative_to}; the verdict is inconclusive"]
    return [f"margin {float(claim.margin):g} × {reference:.2f}% ({claim.relative_to}) = {margin:.3g} {claim.unit}"]


def preset_experiments(preset: str) -> list[str] | None:
    """The experiments `normprop reproduce-all --preset PRESET` runs (its `preset.experiments`); None where the
    preset does not list them (it runs every one) or is not a preset of conf/preset/."""
    from normprop_cli import config

    if preset not in config.options("preset"):
        return None
    listed = config.root(preset).preset.get("experiments")
    return [str(e) for e in listed] if listed is not None else None


def rows_of(claim: Claim, results: Path, preset: str) -> list[dict]:
    """One row per data set the claim's experiment ran on; one "not measured" row if none."""
    head = {"claim": claim.id, "source": claim.source, "experiment": claim.experiment}
    if claim.id not in MEASURES:
        note = f"no verdict rule yet: an `{claim.experiment}` experiment will measure it"
        if result_dirs(results, claim.experiment):
            note = f"`{claim.experiment}` results exist, but no verdict rule reads them yet"
        return [head | {"dataset": "", "preset": preset, "verdict": NOT_YET_MEASURED, "note": note}]
    dirs = result_dirs(results, claim.experiment)
    if not dirs:
        runs = preset_experiments(preset)
        note = f"`{hints.command('run', claim.experiment, preset=preset, results_dir=results)}` produces it"
        if runs is not None and claim.experiment not in runs:
            note = f"the {preset} preset does not run `{claim.experiment}` (it runs {', '.join(runs)})"
        return [head | {"dataset": "", "preset": preset, "verdict": NOT_MEASURED, "note": note}]
    rows = []
    for sweep in dirs:
        prov = provenance(sweep)
        row = head | {"dataset": prov.get("dataset", sweep.name), "preset": prov.get("preset", preset)}
        gone = divergence(sweep)
        try:
            m = MEASURES[claim.id](claim, sweep, prov)
        except NotMeasured as exc:
            if gone:  # the diverged runs left nothing to measure: no rerun of this version cures that
                rows.append(row | diverged_row(gone, prov))
                continue
            command = hints.command("run", claim.experiment, preset=row["preset"], results_dir=results)
            note = f"{exc}; `{command}` with this version produces it"
            rows.append(row | {"verdict": NOT_MEASURED, "note": note})
            continue
        notes = margin_note(claim, m) + list(m.notes)
        row["dataset"] = m.dataset or row["dataset"]
        if m.budget:
            row["budget"] = m.budget
        elif prov:
            row["budget"] = budget(prov)
            notes += protocol_note(claim.experiment, prov)
        judged = judge(claim, m)
        if gone and not judged["n_seeds"]:
            rows.append(row | diverged_row(gone, prov))
            continue
        measure = lambda view, c=claim, s=sweep, p=prov: MEASURES[c.id](c, s, p, view)  # noqa: E731
        judged |= robustness(claim, m, judged, measure, lambda mm, c=claim: judge(c, mm))
        rows.append(row | {"metric": claim.metric.format(**m.metric)} | judged | {"note": "; ".join(notes)})
    return rows


def diverged_row(gone: Divergence, prov: dict) -> dict:
    """The verdict "inconclusive: N of M runs diverged" of a sweep whose diverged runs (every run, or
    every run of a setting the claim compares) leave no seed to measure the claim on."""
    note = f"{gone.text()}; no seed left to measure the claim on: a rate at which the runs do not diverge measures it"
    return {"verdict": gone.verdict(), "note": note} | ({"budget": budget(prov)} if prov else {})


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
    return frame.astype({"n_seeds": "Int64", "loso_flips": "Int64"})


def write_verdicts(results: Path, frame: pd.DataFrame | None = None) -> Path:
    """<results>/verdicts.csv."""
    return io.write_csv(Path(results) / "verdicts.csv", table(results) if frame is None else frame)
