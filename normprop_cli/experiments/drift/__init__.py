"""Beyond the paper (drift): why a trained NormProp net's layer inputs leave N(0, 1).

    normprop run drift [--preset quick|cpu|paper]

Proposition 1 (section 3.2): if E[x x^T] = sigma^2 I and the rows of W are incoherent, u = W x has
a nearly diagonal covariance with var(u_i) = sigma^2 ||W_i||^2, so dividing by ||W_i|| keeps unit
variance layer after layer (section 3.3). Before training and after every epoch, over the evaluation
set, `SpreadProbe` measures that premise at the input x of every conv layer k = 1..9, in standard
units (experiments.probes): the spread of W_i * x / ||W_i|| against the spread of x, the coherence of
the rows of W, and how far x's patch covariance is from sigma^2 I. `PopulationProbe` gives
each layer's average |mean|, std and drift from initialisation.

runs/<run>/spread.csv      SPREAD_COLUMNS, one row per conv layer and epoch
runs/<run>/population.csv  probes.POPULATION_COLUMNS, layers 2..9
spread.csv       every run's spread rows, with run, setting, method, seed, width
population.csv   every run's population rows, with run, setting, method, seed, width
epochs.csv, curves.csv  every run's metrics; test accuracy per setting, mean and 95% interval over
                 the seeds that did not diverge (results.curves)
summary.csv      one row per run: engine columns + width, final_mean_ratio (final epoch, mean over
                 layers 1..9), final_population_abs_mean, final_population_drift, final_population_std
                 (final epoch, mean over layers 2..9), final_test_acc, best_test_acc
drift.png/.pdf   the ratio per layer, the rows' mean |cos| beside random rows', the population's
                 average |mean| and drift, the input's top-eigenvector fraction, vs epoch

spread.py    SpreadProbe, the measurement during training
tables.py    the CSVs as the figures and the report read them
figures.py   plot(cfg)
findings.py  headlines(cfg) and paragraphs(cfg) for the report
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from normprop_cli.engine import expand_grid, run_sweep
from normprop_cli.experiments import results
from normprop_cli.experiments.covariate_shift import final_population
from normprop_cli.experiments.drift.figures import plot
from normprop_cli.experiments.drift.findings import headlines, paragraphs
from normprop_cli.experiments.drift.spread import (
    SPREAD_COLUMNS,
    MapMoments,
    SpreadProbe,
    coherence,
    full_patches,
    random_coherence,
    spectrum,
)
from normprop_cli.experiments.probes import PopulationProbe

__all__ = [
    "SPREAD_COLUMNS",
    "MapMoments",
    "SpreadProbe",
    "coherence",
    "full_patches",
    "headlines",
    "paragraphs",
    "plot",
    "random_coherence",
    "run",
    "spectrum",
]


def run(cfg: DictConfig) -> Path:
    specs = expand_grid(cfg)
    positions, images = int(cfg.experiment.patch_positions), int(cfg.experiment.patch_images)
    manifests = run_sweep(cfg, specs, observers=lambda spec: [SpreadProbe(positions, images), PopulationProbe()])
    width = {"width": "model.width"}
    spread = results.gather(specs, SpreadProbe.name, width)
    population = results.gather(specs, PopulationProbe.name, width)
    results.write(cfg, "spread", spread)
    results.write(cfg, "population", population)

    def columns(spec) -> dict:
        s = results.of_run(spread, spec.name)
        final = {"final_mean_ratio": s.loc[s["epoch"] == s["epoch"].max(), "ratio"].mean()} if len(s) else {}
        p = final_population(population, spec.name)
        if p:
            last = results.of_run(population, spec.name)
            p["final_population_std"] = last.loc[last["epoch"] == last["epoch"].max(), "avg_std"].mean()
        return {"width": spec.cfg.model.width} | final | p

    out = results.write_curves_and_summary(cfg, specs, manifests, results.gather(specs), ["setting"], columns)
    plot(cfg)
    return out
