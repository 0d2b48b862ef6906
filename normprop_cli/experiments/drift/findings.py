"""The report's headlines and findings, every number read from spread.csv and population.csv (runs that
learned and did not diverge), the weight decay from the runs' config.yaml; the paper's column is
`experiment.paper_expects` in conf/experiment/drift.yaml.
The (method, width) findings read the main settings (tables.main_rows); where the grid has ablations,
ablation_report adds their headlines and section. The findings' numbers are findings_facts and decay_facts;
their words are templates/drift_findings.md.j2 and drift_findings_decay.md.j2."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from normprop_cli import prose
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.drift.ablation_report import ablation_headlines, ablation_paragraphs
from normprop_cli.experiments.drift.tables import by_group, group_label, learned_rows, main_rows, mean_at
from normprop_cli.io import read_yaml
from normprop_cli.statistics import format_mean_ci
from normprop_cli.verdicts.rule import claim_of

PREMISE = 1.2  # a mean ratio above this says the pre-activation's spread is not the input's
CORRELATED = 2.0  # a top eigenvector's share of the trace this many times white input's: far from sigma^2 I
SHOWN_LAYERS = (4, 7)  # the wide 5x5 convs after the first, in the headlines


def headlines(cfg: DictConfig) -> list[dict]:
    """Per (method, width): the ratio at initialisation and at the final epoch (mean over layers,
    and in layers 4 and 7), the rows' mean |cos| and mutual coherence, the input's top-eigenvector
    fraction, and the population's average |mean|, std and drift; mean [95% CI] over seeds. The paper's
    column: what Prop. 1 and section 3.3 expect of each quantity (experiment.paper_expects)."""
    expects = cfg.experiment.paper_expects
    spread = learned_rows(cfg, main_rows(run_tables.read(cfg, "spread")))
    population = learned_rows(cfg, main_rows(run_tables.read(cfg, "population")))
    rows = []
    for key, g in by_group(spread):
        name, last = group_label(key, g), int(g["epoch"].max())
        rows.append(_row(f"ratio std(W_i x/||W_i||) / std(x) at initialisation, mean over layers 1-9, {name}",
                         format_mean_ci(mean_at(g, "ratio", 0)), expects.ratio))  # fmt: skip
        rows.append(_row(f"ratio at epoch {last}, mean over layers 1-9, {name}",
                         format_mean_ci(mean_at(g, "ratio", last)), expects.ratio))  # fmt: skip
        for layer in SHOWN_LAYERS:
            if layer in set(g["layer"]):
                rows.append(_row(f"ratio in layer {layer}, initialisation -> epoch {last}, {name}",
                                 _change(g, "ratio", last, 2, [layer]), expects.ratio))  # fmt: skip
        random = mean_at(g, "coherence_random", last)["mean"]
        rows.append(_row(f"rows' mean |cos|, mean over layers, initialisation -> epoch {last} (random rows of the "
                         f"same length: {random:.3f}), {name}", _change(g, "coherence_mean", last),
                         expects.coherence_mean))  # fmt: skip
        rows.append(_row(f"mutual coherence mu, mean over layers, initialisation -> epoch {last}, {name}",
                         _change(g, "coherence_max", last), expects.coherence_max))  # fmt: skip
        white = (1.0 / g["patch_dim"]).mean()
        rows.append(_row(f"input patch covariance: top-eigenvector share of the trace, mean over layers, "
                         f"initialisation -> epoch {last}, {name}", _change(g, "input_top_eig_fraction", last),
                         f"{white:.4f} ({expects.input_top_eig_fraction})"))  # fmt: skip
    for key, g in by_group(population):
        name, last = group_label(key, g), int(g["epoch"].max())
        for column, what in (
            ("avg_abs_mean", "average |mean|"),
            ("avg_std", "average std"),
            ("avg_drift", "average drift from initialisation (initial stds)"),
        ):
            rows.append(_row(f"layer inputs' {what} at epoch {last}, all units, mean over layers 2-9, {name}",
                             format_mean_ci(mean_at(g, column, last), 3), expects[column]))  # fmt: skip
    return rows + ablation_headlines(cfg) + run_tables.not_learned(cfg) + run_tables.diverged_runs(cfg)


def _change(g: pd.DataFrame, column: str, last: int, digits: int = 3, layers=None) -> str:
    """mean [95% CI] over seeds at initialisation -> at epoch `last`."""
    return " -> ".join(format_mean_ci(mean_at(g, column, epoch, layers), digits) for epoch in (0, last))


def _row(quantity: str, reproduced, paper) -> dict:
    return {"quantity": quantity, "reproduced": reproduced, "paper": paper}


def _summary(spread: pd.DataFrame, population: pd.DataFrame) -> dict:
    """Per (method, width): the numbers the findings cite, means over seeds (and layers), and whether the
    final ratio passes Prop. 1's premise (`lined_up`) and whether the input starts far from white (`correlated`)."""
    out = {}
    for (method, width), g in by_group(spread):
        last = int(g["epoch"].max())
        by_layer = g[g["epoch"] == last].groupby("layer")["ratio"].mean()
        final = g[g["epoch"] == last]
        ratio = mean_at(g, "ratio", last)["mean"]
        top0, white = mean_at(g, "input_top_eig_fraction", 0)["mean"], float((1.0 / g["patch_dim"]).mean())
        out[method, width] = {
            "width": width,
            "full": width >= 1.0,
            "seeds": int(g["seed"].nunique()),
            "last": last,
            "layer_span": f"{int(g['layer'].min())}-{int(g['layer'].max())}",
            "ratio0": mean_at(g, "ratio", 0)["mean"],
            "ratio": ratio,
            "lined_up": bool(ratio > PREMISE),
            "layers": [{"layer": int(k), "ratio": by_layer[k]} for k in SHOWN_LAYERS if k in by_layer.index],
            "max_layer": int(by_layer.idxmax()),
            "max_ratio": float(by_layer.max()),
            "cos0": mean_at(g, "coherence_mean", 0)["mean"],
            "cos": mean_at(g, "coherence_mean", last)["mean"],
            "cos_random": mean_at(g, "coherence_random", last)["mean"],
            "mu0": mean_at(g, "coherence_max", 0)["mean"],
            "mu": mean_at(g, "coherence_max", last)["mean"],
            "top0": top0,
            "top": mean_at(g, "input_top_eig_fraction", last)["mean"],
            "white": white,
            "correlated": bool(top0 > CORRELATED * white),
            "ceiling": float(np.sqrt(final["input_top_eig_fraction"] * final["patch_dim"]).mean()),
            "has_population": False,
        }
        p = population[(population["method"] == method) & (population["width"] == width)]
        if len(p):
            p_last = int(p["epoch"].max())
            out[method, width]["has_population"] = True
            for column in ("avg_abs_mean", "avg_std", "avg_drift"):
                out[method, width] |= {
                    column: mean_at(p, column, p_last)["mean"],
                    f"{column}0": mean_at(p, column, 0)["mean"],
                }
    return out


def _population_reading(normprop: dict, bn: dict) -> str | None:
    """'further' (|mean| and drift both above BatchNorm's), 'closer' (both below), else None (undecided)."""
    if normprop["avg_abs_mean"] > bn["avg_abs_mean"] and normprop["avg_drift"] > bn["avg_drift"]:
        return "further"
    if normprop["avg_abs_mean"] < bn["avg_abs_mean"] and normprop["avg_drift"] < bn["avg_drift"]:
        return "closer"
    return None


def _wide(wide: dict, normprop: dict | None, bn: dict | None) -> dict:
    """A wider NormProp run's numbers and whether it reads as the narrow one: the ratio on the same side
    of PREMISE and, where every run has the population, the |mean| on the same side of BatchNorm's."""
    versus_bn = bool(bn and bn["has_population"] and wide["has_population"] and normprop and normprop["has_population"])
    same = normprop is not None and wide["lined_up"] == normprop["lined_up"]
    if versus_bn:
        same &= (wide["avg_abs_mean"] > bn["avg_abs_mean"]) == (normprop["avg_abs_mean"] > bn["avg_abs_mean"])
    return wide | {"versus_bn": versus_bn, "same": bool(same)}


def findings_facts(cfg: DictConfig) -> dict | None:
    """The (method, width) findings' table: the narrowest NormProp and BatchNorm groups (`normprop`, `bn`,
    None where absent), every wider NormProp group (`wide`), the population's reading against BatchNorm,
    the claim it bears on (`claim_id`, `claim`) and PREMISE; None without spread rows."""
    spread, population = (learned_rows(cfg, main_rows(run_tables.read(cfg, name))) for name in ("spread", "population"))
    s = _summary(spread, population)
    if not s:
        return None
    narrow = min(width for _, width in s)
    normprop, bn = s.get(("normprop", narrow)), s.get(("batchnorm", narrow))
    both = bool(normprop and bn and normprop["has_population"] and bn["has_population"])
    claim = claim_of("covariate-shift")  # the claim whose protocol (Fig. 2) the population measure repeats
    return {
        "normprop": normprop,
        "bn": bn,
        "wide": [_wide(v, normprop, bn) for (method, width), v in s.items() if method == "normprop" and width > narrow],
        "population": both,
        "reading": _population_reading(normprop, bn) if both else None,
        "claim_id": claim.id,
        "claim": claim.claim,
        "premise": PREMISE,
    }


def paragraphs(cfg: DictConfig) -> list[str]:
    """The finding in sentences, every number read from spread.csv and population.csv (runs that
    learned and did not diverge): the weight decay, the population measure against its claim, the spread
    ratio, the wide run, Prop. 1's premise; then the ablations'."""
    facts = findings_facts(cfg)
    if facts is None:
        return []
    texts = [text for text in [decay_finding(cfg)] if text]
    return texts + prose.render("drift_findings", facts) + ablation_paragraphs(cfg)


def run_decays(runs: Path, names=None) -> Counter:
    """How many runs under `runs` (those named in `names`, else every reported run: not the rate sweep's)
    train with each (train.decay, train.weight_decay), read from their config.yaml; a config written before
    train.decay existed decays every parameter ('all')."""
    found = Counter()
    keep = (lambda run: run in names) if names is not None else (lambda run: not run.startswith("sweep-"))
    for path in sorted(runs.glob("*/config.yaml")):
        if not keep(path.parent.name):
            continue
        train = read_yaml(path).get("train") or {}
        found[str(train.get("decay", "all")), float(train.get("weight_decay", 0.0))] += 1
    return found


def _decays(found: Counter) -> list[dict]:
    """One row per (train.decay, weight decay) with its number of runs."""
    return [{"decay": decay, "weight_decay": wd, "runs": n} for (decay, wd), n in found.items()]


def decay_facts(cfg: DictConfig) -> dict | None:
    """Which parameters the reported runs weight-decay (`here`), read from their config.yaml, and the
    normalizers experiment's (`other`: its runs' config.yaml where they are beside these, else its config);
    `kinds` is 'all' where every run here decays every parameter, 'some' where some do, 'none' where none
    do. None with no runs."""
    from normprop_cli import config
    from normprop_cli.engine import sweep_dir

    here = sweep_dir(cfg)
    summary = here / "summary.csv"
    reported = pd.read_csv(summary) if summary.exists() else pd.DataFrame()
    names = set(reported["run"]) if "run" in reported else None
    found = run_decays(here / "runs", names)
    if not found:
        return None
    other = run_decays(Path(cfg.results_dir) / "normalizers" / cfg.dataset.name / "runs")
    if not other:
        c = config.load("normalizers", preset=cfg.preset.name, dataset=cfg.dataset.name).train
        other = Counter({(str(c.get("decay", "all")), float(c.weight_decay)): 0})
    kinds = {d for d, _ in found}
    return {
        "runs": sum(found.values()),
        "here": _decays(found),
        "other": _decays(other),
        "same": {d for d, _ in other} == kinds,
        "kinds": "all" if kinds == {"all"} else "some" if "all" in kinds else "none",
    }


def decay_finding(cfg: DictConfig) -> str:
    """Which parameters the runs weight-decay and why it is not the normalizers experiment's choice
    (decay_facts); '' with no runs."""
    facts = decay_facts(cfg)
    return " ".join(prose.render("drift_findings_decay", facts)) if facts else ""
