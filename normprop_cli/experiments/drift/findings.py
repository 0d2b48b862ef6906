"""The report's headlines and findings, every number read from spread.csv and population.csv (runs that
learned and did not diverge), the weight decay from the runs' config.yaml; the paper's column is
`experiment.paper_expects` in conf/experiment/drift.yaml.
The (method, width) findings read the main settings (tables.main_rows); where the grid has ablations,
ablation_report adds their headlines and section."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.drift.ablation_report import ablation_headlines, ablation_paragraphs
from normprop_cli.experiments.drift.tables import by_group, group_label, learned_rows, main_rows, mean_at
from normprop_cli.io import read_yaml
from normprop_cli.statistics import format_mean_ci
from normprop_cli.verdicts import claims

PREMISE = 1.2  # a mean ratio above this says the pre-activation's spread is not the input's
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
    """Per (method, width): the numbers the findings cite, means over seeds (and layers)."""
    out = {}
    for (method, width), g in by_group(spread):
        last = int(g["epoch"].max())
        by_layer = g[g["epoch"] == last].groupby("layer")["ratio"].mean()
        seeds = g["seed"].nunique()
        final = g[g["epoch"] == last]
        out[method, width] = {
            "label": f"width {width:g}, {seeds} seed{'s' if seeds > 1 else ''}",
            "width": width,
            "last": last,
            "layer_span": f"{int(g['layer'].min())}-{int(g['layer'].max())}",
            "ratio0": mean_at(g, "ratio", 0)["mean"],
            "ratio": mean_at(g, "ratio", last)["mean"],
            "layers": {k: by_layer[k] for k in SHOWN_LAYERS if k in by_layer.index},
            "max_layer": int(by_layer.idxmax()),
            "max_ratio": float(by_layer.max()),
            "cos0": mean_at(g, "coherence_mean", 0)["mean"],
            "cos": mean_at(g, "coherence_mean", last)["mean"],
            "cos_random": mean_at(g, "coherence_random", last)["mean"],
            "mu0": mean_at(g, "coherence_max", 0)["mean"],
            "mu": mean_at(g, "coherence_max", last)["mean"],
            "top0": mean_at(g, "input_top_eig_fraction", 0)["mean"],
            "top": mean_at(g, "input_top_eig_fraction", last)["mean"],
            "white": float((1.0 / g["patch_dim"]).mean()),
            "ceiling": float(np.sqrt(final["input_top_eig_fraction"] * final["patch_dim"]).mean()),
        }
        p = population[(population["method"] == method) & (population["width"] == width)]
        if len(p):
            p_last = int(p["epoch"].max())
            for column in ("avg_abs_mean", "avg_std", "avg_drift"):
                out[method, width] |= {
                    column: mean_at(p, column, p_last)["mean"],
                    f"{column}0": mean_at(p, column, 0)["mean"],
                }
    return out


def paragraphs(cfg: DictConfig) -> list[str]:
    """The finding in sentences, every number read from spread.csv and population.csv (runs that
    learned and did not diverge): C2 on the population measure, the spread ratio, the wide run, Prop. 1's premise."""
    spread, population = (learned_rows(cfg, main_rows(run_tables.read(cfg, name))) for name in ("spread", "population"))
    s = _summary(spread, population)
    if not s:
        return []
    narrow = min(width for _, width in s)
    normprop, bn = s.get(("normprop", narrow)), s.get(("batchnorm", narrow))
    wide = [v for (method, width), v in s.items() if method == "normprop" and width > narrow]
    texts = [text for text in [decay_finding(cfg)] if text]
    if normprop and bn and "avg_abs_mean" in normprop and "avg_abs_mean" in bn:
        texts.append(_population_finding(normprop, bn))
    if normprop:
        texts.append(_ratio_finding(normprop, bn))
    texts += [_wide_finding(w, normprop, bn) for w in wide]
    if normprop:
        texts.append(_premise_finding(normprop))
    return texts + ablation_paragraphs(cfg)


def _population_finding(normprop: dict, bn: dict) -> str:
    further = normprop["avg_abs_mean"] > bn["avg_abs_mean"] and normprop["avg_drift"] > bn["avg_drift"]
    closer = normprop["avg_abs_mean"] < bn["avg_abs_mean"] and normprop["avg_drift"] < bn["avg_drift"]
    if further:
        end = (
            "further from N(0, 1), and from where they started, than BatchNorm's, which contradicts claim C2 "
            f"({next(c.claim for c in claims() if c.id == 'C2')}) on this measure"
        )
    elif closer:
        end = "closer to N(0, 1), and to where they started, than BatchNorm's, which supports claim C2 on this measure"
    else:
        end = (
            "neither further from nor closer to N(0, 1) than BatchNorm's on both counts: claim C2 stays undecided here"
        )
    return (
        f"Over all input-dependent units of layers 2-9 and the evaluation set, after {normprop['last']} epochs "
        f"NormProp's layer inputs ({normprop['label']}) have an average |mean| of {normprop['avg_abs_mean']:.2f} "
        f"and an average std of {normprop['avg_std']:.2f} (at initialisation {normprop['avg_abs_mean0']:.2f} and "
        f"{normprop['avg_std0']:.2f}), and have drifted {normprop['avg_drift']:.2f} initial stds on average; "
        f"BatchNorm's ({bn['label']}) {bn['avg_abs_mean']:.2f} and {bn['avg_std']:.2f} (at initialisation "
        f"{bn['avg_abs_mean0']:.2f} and {bn['avg_std0']:.2f}), and {bn['avg_drift']:.2f}. NormProp's inputs end {end}."
    )


def _ratio_finding(normprop: dict, bn: dict | None) -> str:
    layers = ", ".join(f"layer {k}: {v:.2f}" for k, v in normprop["layers"].items())
    text = (
        "The spread of W_i x / ||W_i|| relative to the spread of its input x, which Proposition 1 with white "
        f"input and unit-norm rows puts at 1, averages {normprop['ratio0']:.2f} over NormProp's layers "
        f"{normprop['layer_span']} at initialisation and {normprop['ratio']:.2f} after {normprop['last']} epochs "
        f"({layers}; largest in layer {normprop['max_layer']}: {normprop['max_ratio']:.2f})."
    )
    if bn:
        text += (
            f" BatchNorm's filters go from {bn['ratio0']:.2f} to {bn['ratio']:.2f}, but BatchNorm divides by the "
            "measured std, so its ratio never reaches its layer outputs; NormProp divides by ||W_i|| alone (eq. 11), "
            "so the ratio passes into its pre-activation's std, beside gamma_i and the Jacobian factor."
        )
    if normprop["ratio"] > PREMISE:
        return text + " The trained filters have lined up with high-variance directions of their input."
    return text + (
        f" The ratio stays below {PREMISE:g}: in this budget the filters have not lined up with their input's "
        "high-variance directions enough to explain a drift."
    )


def _wide_finding(wide: dict, normprop: dict | None, bn: dict | None) -> str:
    name = "full-width" if wide["width"] >= 1.0 else "wider"
    numbers = (
        f"the ratio goes from {wide['ratio0']:.2f} to {wide['ratio']:.2f} after {wide['last']} epochs (largest in "
        f"layer {wide['max_layer']}: {wide['max_ratio']:.2f})"
    )
    if "avg_abs_mean" in wide:
        numbers += (
            f", the average |mean| is {wide['avg_abs_mean']:.2f}, the average std {wide['avg_std']:.2f} and the "
            f"drift {wide['avg_drift']:.2f}"
        )
    if normprop is None:
        return f"The {name} NormProp run ({wide['label']}): {numbers}."
    same = (wide["ratio"] > PREMISE) == (normprop["ratio"] > PREMISE)
    if bn and "avg_abs_mean" in bn and "avg_abs_mean" in wide and "avg_abs_mean" in normprop:
        numbers += f" (BatchNorm's average |mean|: {bn['avg_abs_mean']:.2f})"
        same &= (wide["avg_abs_mean"] > bn["avg_abs_mean"]) == (normprop["avg_abs_mean"] > bn["avg_abs_mean"])
    verdict = "the same, so the narrow width does not explain it" if same else "otherwise: the width may matter"
    return f"The {name} NormProp run ({wide['label']}) shows {verdict}: {numbers}."


def _premise_finding(normprop: dict) -> str:
    text = (
        "Proposition 1 assumes E[xx^T] = sigma^2 I and incoherent rows of W. The patch covariance of NormProp's "
        f"layer inputs puts {normprop['top0']:.3f} of its trace on its top eigenvector at initialisation and "
        f"{normprop['top']:.3f} after training (mean over layers; white input would give {normprop['white']:.4f}), "
        f"so the input is far from sigma^2 I from the start. The rows' mean |cos| goes from {normprop['cos0']:.3f} "
        f"to {normprop['cos']:.3f} (independent random rows of the same length: {normprop['cos_random']:.3f}) and "
        f"their mutual coherence from {normprop['mu0']:.2f} to {normprop['mu']:.2f}. With correlated input, rows in "
        "random directions still see the average variance (a ratio near 1 at initialisation), but a row along the "
        f"top eigenvector would see about sqrt(n x top share) = {normprop['ceiling']:.1f} times the input's std "
        "(mean over layers). "
    )
    if normprop["ratio"] > PREMISE:
        return text + (
            f"After training the ratio is {normprop['ratio']:.2f}: the premise fails, the canonical-covariance "
            "argument no longer holds, and dividing by ||W_i|| no longer gives a pre-activation of its input's "
            "variance."
        )
    return text + (
        f"After training the ratio is {normprop['ratio']:.2f}, within {PREMISE:g} of the premise's 1: in this budget "
        "the data do not show the canonical-covariance argument failing."
    )


DECAYS = {"all": "every parameter, gains and biases included", "weights": "the kernels alone"}


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


def _decay_words(found: Counter) -> str:
    """'`train.decay: all` (every parameter, gains and biases included; weight decay 0.0005)', per value."""
    count = (lambda n: f" in {n} run{'s' * (n != 1)}") if len(found) > 1 else (lambda n: "")
    return "; ".join(f"`train.decay: {decay}` ({DECAYS.get(decay, decay)}; weight decay {wd:g}){count(n)}"
                     for (decay, wd), n in found.items())  # fmt: skip


def decay_finding(cfg: DictConfig) -> str:
    """Which parameters the runs weight-decay, read from their config.yaml, and why it is not the normalizers
    experiment's choice (its runs' config.yaml where they are beside these, else its config); '' with no runs."""
    from normprop_cli import config
    from normprop_cli.engine import sweep_dir

    here = sweep_dir(cfg)
    summary = here / "summary.csv"
    reported = pd.read_csv(summary) if summary.exists() else pd.DataFrame()
    names = set(reported["run"]) if "run" in reported else None
    found = run_decays(here / "runs", names)
    if not found:
        return ""
    other = run_decays(Path(cfg.results_dir) / "normalizers" / cfg.dataset.name / "runs")
    if not other:
        c = config.load("normalizers", preset=cfg.preset.name, dataset=cfg.dataset.name).train
        other = Counter({(str(c.get("decay", "all")), float(c.weight_decay)): 0})
    same = {d for d, _ in other} == {d for d, _ in found}
    kinds = {d for d, _ in found}
    why = ("so it trains them the same way" if kinds == {"all"} else
           "though not every run here does" if "all" in kinds else "though these runs do not")  # fmt: skip
    return (
        f"*Weight decay.* The {sum(found.values())} runs here use {_decay_words(found)}, as their config.yaml "
        + ("records, and so do the normalizers experiment's runs" if same else
           f"records, while the normalizers experiment's runs use {_decay_words(other)}")
        + ": this experiment explains the drift of NormProp's runs in the paper's own experiments "
        f"(covariate-shift), which weight-decay every parameter, {why}."
    )  # fmt: skip
