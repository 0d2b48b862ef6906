"""Beyond the paper (drift): why a trained NormProp net's layer inputs leave N(0, 1).

    normprop run drift [--preset quick|cpu|fashion|paper]

Proposition 1 (section 3.2): if E[x x^T] = sigma^2 I and the rows of W are incoherent, u = W x has
a nearly diagonal covariance with var(u_i) = sigma^2 ||W_i||^2, so dividing by ||W_i|| keeps unit
variance layer after layer (section 3.3). Before training and after every epoch, over the evaluation
set, `SpreadProbe` measures that premise at the input x of every conv layer k = 1..9, in standard
units (experiments.probes): the spread of W_i * x / ||W_i|| against the spread of x, the coherence of
the rows of W, and how far x's patch covariance is from sigma^2 I. `PopulationProbe` gives
each layer's average |mean|, std and drift from initialisation. With `experiment.affine_probe`,
`AffineProbe` records NormProp's gamma and beta (BatchNorm's weight and bias) per layer.

The ablation (fashion preset): where the grid has settings that share their (method, width) with another
(tables.ablation_settings: normprop-no-jacobian, normprop-frozen-affine, normprop-zca beside normprop), each
is compared with its main setting (ablation.py), and the report names the ablations that account for the
drift (ablation_report.py). Where `experiment.lr_sweep` is set, every setting first chooses its rate on a
validation sweep (lr_sweep.py; lr_sweep.csv), the grid's train.lr its centre; a `rate_of` setting borrows
another's rate, times its `rate_scale` (normprop-half-rate, normprop-double-rate). The Sigma-oracle setting
(model.sigma_oracle_every, nn/oracle.py) divides by sqrt(W_i^T Sigma W_i) / sigma, Sigma measured on held-out
validation images (oracle.SigmaOracleFeed gives them); `experiment.probe_every_steps` adds the spread and
population probes every that many SGD steps of epoch 1 (steps.StepProbe); oracle_report.py reads them.

runs/<run>/spread.csv      SPREAD_COLUMNS, one row per conv layer and epoch
runs/<run>/population.csv  probes.POPULATION_COLUMNS, layers 2..9
runs/<run>/affine.csv      affine.AFFINE_COLUMNS, one row per conv layer with gamma and beta, and epoch
runs/<run>/sigma_oracle.csv  oracle.ORACLE_COLUMNS, one row per conv layer and epoch (Sigma-oracle runs)
runs/<run>/spread_steps.csv, population_steps.csv  the probes' rows inside epoch 1, `epoch` a fraction, `step`
spread.csv       every run's spread rows, with run, setting, method, seed, width
population.csv   every run's population rows, with run, setting, method, seed, width
affine.csv       every run's affine rows, with run, setting, method, seed, width (affine_probe only)
ablation.csv     one row per setting (ablation.SETTING_COLUMNS), where the grid has ablations
lr_sweep.csv     the validation sweep's runs (lr_sweep.py), where experiment.lr_sweep is set
sigma_oracle.csv, spread_steps.csv, population_steps.csv  every run's rows of those, where runs have them
epochs.csv, curves.csv  every run's metrics; test accuracy per setting, mean and 95% interval over
                 the seeds that did not diverge (experiments.tables.curves)
summary.csv      one row per run: engine columns + width, final_mean_ratio (final epoch, mean over
                 layers 1..9), final_population_abs_mean, final_population_drift, final_population_std
                 (final epoch, mean over layers 2..9), final_test_acc, best_test_acc; with the affine
                 probe final_gamma_change, final_beta_change (final epoch, mean over layers)
drift.png/.pdf   the ratio per layer, the rows' mean |cos| beside random rows', the population's
                 average |mean| and drift, the input's top-eigenvector fraction, vs epoch (main settings)
drift_ablation.png/.pdf  drift per layer and over epochs per setting, gamma's change and gamma / f
drift_steps.png/.pdf     the ratio and the drift inside epoch 1, where runs have in-epoch probes

spread.py    SpreadProbe, the measurement during training
affine.py    AffineProbe, gamma and beta during training
oracle.py    SigmaOracleFeed, the Sigma-oracle's held-out batch and divisor
steps.py     StepProbe, a probe every few SGD steps inside epoch 1
tables.py    the CSVs as the figures and the report read them; which settings are ablations
ablation.py  the ablation's numbers: per setting, and each ablation against its main setting
figures.py   plot(cfg)
findings.py  headlines(cfg) and paragraphs(cfg) for the report; ablation_report.py their ablation part,
             oracle_report.py its Sigma-oracle, learning-rate and in-epoch parts
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from normprop_cli import engine
from normprop_cli.engine import RunSpec, Stage, expand_grid
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.base import experiment
from normprop_cli.experiments.covariate_shift import final_population
from normprop_cli.experiments.drift.ablation import kind_label, setting_kind, setting_table, tables
from normprop_cli.experiments.drift.affine import AFFINE_COLUMNS, AffineProbe, final_change
from normprop_cli.experiments.drift.figures import plot
from normprop_cli.experiments.drift.findings import headlines, paragraphs
from normprop_cli.experiments.drift.mean_report import write as write_decomposition
from normprop_cli.experiments.drift.moments import MOMENTS_COLUMNS, MomentsProbe
from normprop_cli.experiments.drift.oracle import ORACLE_COLUMNS, SigmaOracleFeed
from normprop_cli.experiments.drift.spread import (
    SPREAD_COLUMNS,
    MapMoments,
    SpreadProbe,
    coherence,
    full_patches,
    random_coherence,
    spectrum,
)
from normprop_cli.experiments.drift.steps import StepProbe
from normprop_cli.experiments.drift.tables import ablation_settings
from normprop_cli.experiments.lr_sweep import chosen, sweep_stages, with_rates
from normprop_cli.experiments.probes import PopulationProbe

__all__ = [
    "AFFINE_COLUMNS",
    "MOMENTS_COLUMNS",
    "ORACLE_COLUMNS",
    "SPREAD_COLUMNS",
    "AffineProbe",
    "MapMoments",
    "MomentsProbe",
    "SigmaOracleFeed",
    "SpreadProbe",
    "StepProbe",
    "coherence",
    "full_patches",
    "headlines",
    "paragraphs",
    "plot",
    "analyse",
    "random_coherence",
    "spectrum",
    "stages",
]


def has_oracle(cfg: DictConfig) -> bool:
    """Does the run's model hold an oracle (nn/oracle.py) that needs its held-out batch?"""
    return bool(cfg.model.get("sigma_oracle_every") or cfg.model.get("mean_oracle_every"))


def observers_of(cfg: DictConfig) -> Callable[[RunSpec], list]:
    """What a run of the grid observes: the Sigma-oracle's held-out batch first (every probe sees the oracle's
    division), the spread, population (and moments) probes, the affine probe, and the in-epoch probes."""
    positions, images = int(cfg.experiment.patch_positions), int(cfg.experiment.patch_images)
    affine_probe = bool(cfg.experiment.get("affine_probe"))

    def observers(spec) -> list:
        c = spec.cfg
        out = [SigmaOracleFeed(c)] if has_oracle(c) else []
        spread = c.experiment.get("spread_probe", True)  # the costliest probe; a setting may go without it
        moments = bool(c.experiment.get("moments_probe"))

        def epoch_probes() -> list:
            return [SpreadProbe(positions, images)] * spread + [PopulationProbe()] + [MomentsProbe()] * moments

        out += epoch_probes() + [AffineProbe()] * affine_probe
        every = int(c.experiment.get("probe_every_steps") or 0)
        return out + ([StepProbe(p, every) for p in epoch_probes()] if every else [])

    return observers


def oracle_feed(spec: RunSpec) -> list:
    """What a sweep run observes: the Sigma-oracle's held-out batch, where its model holds an oracle."""
    return [SigmaOracleFeed(spec.cfg)] if has_oracle(spec.cfg) else []


def stages(cfg: DictConfig):
    """Where experiment.lr_sweep is set, each setting's rate sweep first; then the grid, probed."""
    if cfg.experiment.get("lr_sweep") is not None:
        kind = lambda c: setting_kind(lambda key: OmegaConf.select(c, key))  # noqa: E731
        cfg = with_rates(cfg, (yield from sweep_stages(cfg, method=kind, label=kind_label, observers=oracle_feed)))
    yield Stage(cfg, expand_grid(cfg), observers_of(cfg))


@experiment("drift", plot=plot, headlines=headlines, paragraphs=paragraphs, stages=stages)
def analyse(cfg: DictConfig) -> Path:
    if cfg.experiment.get("lr_sweep") is not None:
        cfg = chosen(cfg)
    specs = expand_grid(cfg)
    affine_probe = bool(cfg.experiment.get("affine_probe"))
    manifests = engine.manifests(specs)
    width = {"width": "model.width"}
    spread = run_tables.gather(specs, SpreadProbe.name, width)
    population = run_tables.gather(specs, PopulationProbe.name, width)
    affine = run_tables.gather(specs, AffineProbe.name, width) if affine_probe else None
    run_tables.write(cfg, "spread", spread)
    run_tables.write(cfg, "population", population)
    if affine is not None:
        run_tables.write(cfg, "affine", affine)
    steps = (f"{SpreadProbe.name}_steps", f"{PopulationProbe.name}_steps", f"{MomentsProbe.name}_steps")
    for name in (SigmaOracleFeed.name, MomentsProbe.name, *steps):
        found = run_tables.gather(specs, name, width)
        if len(found):  # only where the grid has the Sigma-oracle or in-epoch probes
            run_tables.write(cfg, name, found)

    def columns(spec) -> dict:
        s = run_tables.of_run(spread, spec.name)
        final = {"final_mean_ratio": s.loc[s["epoch"] == s["epoch"].max(), "ratio"].mean()} if len(s) else {}
        p = final_population(population, spec.name)
        if p:
            last = run_tables.of_run(population, spec.name)
            p["final_population_std"] = last.loc[last["epoch"] == last["epoch"].max(), "avg_std"].mean()
        changes = final_change(affine, spec.name) if affine is not None else {}
        return {"width": spec.cfg.model.width} | final | p | changes

    out = run_tables.write_curves_and_summary(cfg, specs, manifests, run_tables.gather(specs), ["setting"], columns)
    if ablation_settings(run_tables.read(cfg, "summary")):
        run_tables.write(cfg, "ablation", setting_table(cfg, tables(cfg)))
    write_decomposition(cfg)
    plot(cfg)
    return out
