"""The report's headlines and paragraphs for the normalizers experiment: the numbers from facts.py (read
from normalizers.csv, tables.read_table), the words from templates/normalizers*.md.j2."""

from __future__ import annotations

import pandas as pd
from omegaconf import DictConfig

from normprop_cli import prose
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.normalizers import facts
from normprop_cli.experiments.normalizers.tables import label, read_table


def headlines(cfg: DictConfig) -> list[dict]:
    """Per batch size: the best method, and where the reference (NormProp) ranks; per batch-statistics
    method at batch 1, its final accuracy in training and in evaluation mode; the runs that did not
    learn in any mode they are scored in."""
    said = prose.render("normalizers_headlines", facts.headline_facts(cfg, read_table(cfg)))
    rows = [{"quantity": q, "reproduced": r, "paper": ""} for q, r in zip(said[::2], said[1::2], strict=True)]
    return rows + run_tables.not_learned(cfg)


def paragraphs(cfg: DictConfig) -> list[str]:
    """A ranked table per batch size, then which methods beat the reference where, with intervals;
    the batch-statistics methods at batch 1 in both modes."""
    t = read_table(cfg)
    reference = facts.reference(cfg)
    ref, level = label(reference), facts.level(t)
    intro = prose.render("normalizers", facts.intro_facts(cfg) | {"correction": correction(t, ref)})
    out = [*intro, training_details(cfg), edges(cfg), unfinished(cfg)]
    for bs, g in t.groupby("batch_size", sort=True):
        out.append(prose.text("normalizers_batch", facts.batch_facts(g, int(bs), cfg, level)))
        out.append(_finding(g, int(bs), ref, reference))
    out.append(seeds_added(cfg, t))
    out += prose.render("normalizers_gaps", facts.gap_facts(t, cfg))
    return [part for part in out if part]  # no empty paragraph where every run is finished


def seeds_added(cfg: DictConfig, t: pd.DataFrame) -> str:
    """Where `experiment.extra_seeds` gives some settings more seeds than the preset's `seeds`: when their
    runs trained beside the first seeds' (from the runs' manifests), and every comparison at their batch
    sizes on the first seeds alone beside all seeds, so that a reading the added seeds moved shows as
    such; '' where no setting has added seeds."""
    found = facts.seeds_facts(cfg, t)
    return prose.text("normalizers_seeds", found) if found else ""


def correction(t: pd.DataFrame, ref: str) -> str:
    """What the differences from the reference are, as tables.table computes them: the Welch test, the pp
    scale, the Bonferroni correction over the comparisons that `compared` marks, and the MDD."""
    return prose.text("normalizers_correction", facts.correction_facts(t, ref))


def _finding(g: pd.DataFrame, bs: int, ref: str, reference: str = "normprop-icml") -> str:
    """One sentence per batch size: who beat the reference, who is worse, who cannot be told apart; where
    every run of the reference diverged, that, and no comparison."""
    return prose.text("normalizers_finding", facts.finding_facts(g, bs, ref, reference))


def training_details(cfg: DictConfig) -> str:
    """How every method trains, as the config has it: the classifier, the weight decay, Batch
    Renormalization's schedule and its limits at batch 1, scaled WS's gradient clipping."""
    return prose.text("normalizers_training", facts.training_facts(cfg))


def edges(cfg: DictConfig) -> str:
    """Which chosen rates sit at an edge of their sweep, and why (lr_sweep.edge_choices), and the settings
    whose every rate scored near chance on validation (their choice says nothing); '' where the steps
    policy did not choose the rates."""
    return prose.text("normalizers_edges", facts.edge_facts(cfg))


def unfinished(cfg: DictConfig) -> str:
    """A sentence where rows of summary.csv name runs that are not finished in runs/ (removed to retrain,
    or still training): their numbers, and every table and figure built from them, are from the earlier
    training until the experiment's command finishes them; '' where every row's run is finished."""
    return prose.text("normalizers_unfinished", facts.unfinished_facts(cfg))
