"""Beyond the paper: NormProp against every batch-independent normaliser (and BatchNorm,
Batch Renormalization, no normalisation) on the same NIN, data and protocol, at batch sizes down to 1.

    normprop run normalizers [--preset paper] [--seeds 3]

The grid is `experiment.methods` x `experiment.batch_sizes` (grid.method_grid); each setting trains at
the learning rate its validation sweep chose (lr_sweep.py).

lr_sweep.csv     setting, method, batch_size, lr, seed, epochs, val_acc, val_loss, chosen, score, at_edge
                 (lr_sweep.py: one row per sweep run)
lr_sweep.png/.pdf  validation accuracy against the rate, per method and batch size
epochs.csv       every run's metrics per epoch, with `normalizer` and `step_ms` (training seconds per SGD step)
curves.csv       normalizer, batch_size, epoch: test accuracy (%) over the seeds that did not diverge,
                 95% interval on the logit scale (statistics.proportion_ci), diverged runs counted
summary.csv      one row per run: engine columns + normalizer, batch_size, initial_lr, final_test_acc,
                 best_val_test_acc, step_ms, drift (mean over layers at the final epoch),
                 train_mode_acc, eval_mode_acc (batch-statistics methods at batch 1, final epoch);
                 `learned` is True where the run learned in a mode it is scored in (either mode at
                 batch 1 for batch-statistics methods, experiments.tables.learned_in_a_mode)
population.csv   every run's population metric per layer at epoch 0, every `experiment.population_every`-th
                 epoch and the last (probes.PopulationProbe)
mode_gap.csv     batch-statistics methods at batch 1: test accuracy in both modes, every
                 `experiment.mode_gap_every`-th epoch and the last
normalizers.csv  per batch size and method, over the runs that did not diverge (counted in `diverged`):
                 rank, rate, final and best-validation accuracy with 95% intervals (proportion_ci),
                 the difference from the reference method in pp (Welch interval at the Bonferroni level
                 `diff_level` = 1 - 0.05/m over the m comparisons `compared` marks, its uncorrected
                 `p_value`, its minimum detectable difference at 80% power `mdd`) and its reading; at
                 batch 1 the batch-statistics methods' training-mode difference (`train_mode_diff`); step
                 time, drift, both modes' accuracy and the train-minus-eval-mode gap (t intervals)
normalizers.png/.pdf  forest plot: per batch size, each method's difference from the reference with
                 its corrected interval, ranked; both modes of the batch-statistics methods at batch 1
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from omegaconf import DictConfig

from normprop_cli import engine
from normprop_cli.engine import Stage, expand_grid
from normprop_cli.experiments import tables as run_tables
from normprop_cli.experiments.base import experiment
from normprop_cli.experiments.batch_size import updates_per_epoch
from normprop_cli.experiments.lr_sweep import chosen, sweep_stages, with_rates
from normprop_cli.experiments.normalizers.figures import plot
from normprop_cli.experiments.normalizers.findings import headlines, paragraphs, training_details
from normprop_cli.experiments.normalizers.tables import (
    KEYS,
    TABLE,
    best_val_test_acc,
    comparisons,
    final_drift,
    label,
    read_table,
    reading,
    table,
)
from normprop_cli.experiments.probes import BATCH_NORMS, PopulationProbe, due
from normprop_cli.nn.methods import METHODS

__all__ = ["KEYS", "TABLE", "ModeGap", "best_val_test_acc", "comparisons", "final_drift", "headlines",
           "label", "observers", "paragraphs", "plot", "read_table", "reading", "run", "table",
           "training_details"]  # fmt: skip


class ModeGap:
    """Batch-statistics methods trained at batch 1: test accuracy in evaluation mode (running
    estimates) and in training mode one image at a time (each image normalised by its own spatial
    statistics, as every training step saw it), on a copy of the model whose running estimates are
    left as they were (momentum 0), after every `every`-th epoch and the last (`last`; None: every epoch):
    scoring 10,000 test images one at a time costs more than an epoch of training at batch 1."""

    name = "mode_gap"

    def __init__(self, every: int = 1, last: int | None = None) -> None:
        self.every, self.last = max(1, int(every)), last

    def observe(self, model: torch.nn.Module, batches, epoch: int) -> list[dict]:
        if epoch == 0 or not due(epoch, self.every, self.last):
            return []
        probe = copy.deepcopy(model)
        norms = [m for m in probe.modules() if isinstance(m, BATCH_NORMS)]
        right, total = None, 0  # the counts stay on the device: one host sync, at the end
        with torch.no_grad():
            for x, y in batches():
                if right is None:
                    right = torch.zeros(2, dtype=torch.long, device=y.device)  # eval mode, train mode
                probe.eval()
                right[0] += (probe(x).argmax(1) == y).sum()
                for m in norms:
                    m.train()
                    m.momentum = 0.0
                for i in range(len(x)):
                    right[1] += (probe(x[i : i + 1]).argmax(1) == y[i : i + 1]).sum()
                total += len(x)
        eval_right, train_right = right.tolist() if right is not None else (0, 0)
        return [{"epoch": epoch, "eval_mode_acc": 100.0 * eval_right / total,
                 "train_mode_acc": 100.0 * train_right / total}]  # fmt: skip


def observers(spec):
    every = lambda key: int(spec.cfg.experiment.get(key) or 1)  # noqa: E731
    last = int(spec.cfg.train.epochs)
    found = [PopulationProbe(every=every("population_every"), last=last)]
    if METHODS[spec.cfg.method].batch_statistics and int(spec.cfg.train.batch_size) == 1:
        found.append(ModeGap(every("mode_gap_every"), last))
    return found


def stages(cfg: DictConfig):
    """Each setting's rate sweep, then the grid at the rates it chose."""
    cfg = with_rates(cfg, (yield from sweep_stages(cfg, method=lambda c: c.method, label=label)))
    yield Stage(cfg, expand_grid(cfg), observers)


@experiment("normalizers", plot=plot, headlines=headlines, paragraphs=paragraphs, stages=stages)
def analyse(cfg: DictConfig) -> Path:
    cfg = chosen(cfg)
    specs = expand_grid(cfg)
    manifests = engine.manifests(specs)
    steps = {spec.name: updates_per_epoch(m, spec.cfg) for spec, m in zip(specs, manifests, strict=True)}
    cols = {"normalizer": "model.norm", "batch_size": "train.batch_size", "initial_lr": "train.lr"}
    epochs = run_tables.gather(specs, columns=cols)
    if len(epochs):
        epochs["normalizer"] = epochs["run"].map({s.name: s.cfg.method for s in specs})
        epochs["step_ms"] = 1000.0 * epochs["train_seconds"] / epochs["run"].map(steps).clip(lower=1)
    population = run_tables.gather(specs, PopulationProbe.name)
    gaps = run_tables.gather(specs, ModeGap.name)
    run_tables.write(cfg, "population", population)
    run_tables.write(cfg, "mode_gap", gaps)

    def columns(spec):
        runs = run_tables.of_run(epochs, spec.name)
        t = spec.cfg.train
        row = {"normalizer": spec.cfg.method, "batch_size": int(t.batch_size), "initial_lr": float(t.lr),
               "step_ms": runs["step_ms"].median() if len(runs) else math.nan,
               "drift": final_drift(run_tables.of_run(population, spec.name)),
               "best_val_test_acc": best_val_test_acc(runs)}  # fmt: skip
        gap = run_tables.of_run(gaps, spec.name)
        if len(gap):
            train, evaluation = gap["train_mode_acc"].iloc[-1], gap["eval_mode_acc"].iloc[-1]
            row |= {"train_mode_acc": train, "eval_mode_acc": evaluation}
            if len(runs):  # did not learn only where it did not in either mode
                row["learned"] = run_tables.learned(max(runs["test_acc"].iloc[-1], train), spec.cfg)
        return row

    out = run_tables.write_curves_and_summary(cfg, specs, manifests, epochs, KEYS, columns)
    run_tables.write(cfg, "normalizers", table(cfg, run_tables.read(cfg, "summary")))
    plot(cfg)
    return out
