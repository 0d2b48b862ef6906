"""The plan before training: what `normprop run EXPERIMENT` or `normprop reproduce-all` would train, and
how long it would take, counted from the composed configs without training or loading data.

    normprop run table1 --preset paper --dry-run                 -> <results_dir>/plan.csv, one line
    normprop reproduce-all --preset paper --dry-run --step-times results/bench/gpu/assumed_step_times.csv

plan.csv has one row per experiment (reproduce-all adds a `total` row):
    runs, sweep_runs    the grid's runs (engine.expand_grid) and the learning-rate sweep's first round
                        (lr_sweep.py: every rate of the factors policy; the steps policy's first `points`
                        rates x its seeds), each left out where it is complete or diverged on disk, and an
                        unfinished one counted from the epoch it resumes at
    sgd_steps           epochs x steps per epoch (engine.trainer.epoch_steps: train size // batch, at most
                        train.max_steps), runs and sweep runs
    train_images        sgd_steps x batch size
    eval_images         validation and test images scored after every epoch, and the probes' images
                        (OBSERVED_PASSES; normalizers' training-mode score at batch 1, one image at a time)
    est_seconds         the steps at their configuration's step time (engine.cost.StepKey: method, batch,
                        width, image shape) plus evaluation (engine.cost.seconds), one process
    disk_bytes          the checkpoints the runs left to train keep (engine.cost.checkpoint_bytes)
    sweep_runs_max, est_seconds_max   the same where the steps policy extends every setting's rates
                        past both edges as far as `extend` allows (the most it can train)

The data set sizes come from data.sizes (nothing is loaded: the data need not be here); the step times
from bench.step_times, passed in as `times` (measured on this machine, or read from a file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from normprop_cli import io
from normprop_cli.engine import RunSpec, expand_grid, run_dir
from normprop_cli.engine.cost import RunCost, StepKey, duration, run_cost, seconds, size, sizes
from normprop_cli.engine.job import validate
from normprop_cli.engine.runs import check_same_config, config_differences
from normprop_cli.experiments import lr_sweep
from normprop_cli.experiments.probes import due
from normprop_cli.nn.methods import METHODS

COLUMNS = ["experiment", "dataset", "runs", "sweep_runs", "sgd_steps", "train_images", "eval_images", "est_seconds",
           "disk_bytes", "sweep_runs_max", "est_seconds_max"]  # fmt: skip
PLAN = "plan.csv"
# The committed CPU bench (`normprop bench`): what a plan's timing of steps on a CPU is priced by before it starts.
BENCH = Path(__file__).resolve().parents[2] / "results" / "bench" / "bench.csv"
WARMUP = 2  # the untimed steps before the timed ones (bench.step_times.measure's)
EVAL_TIMED = 100  # evaluation is priced at the step time of a batch of min(train.eval_batch_size, this)
# Passes over the probe set (train.probe_images, else the test set) before training and after every epoch,
# one per observer that reads it: covariate-shift's unit and population probes, activations' population
# probe, drift's spread and population probes. normalizers: observed_normalizers.
OBSERVED_PASSES = {"covariate-shift": 2, "activations": 1, "drift": 2}

Times = Callable[[Mapping[StepKey, DictConfig]], Mapping[StepKey, float]]


@dataclass
class Planned:
    """One experiment's work left: the grid's and the sweep's first round (`costs`), the sweep's
    possible extensions (`extra`), and a run config for every step configuration to price (`needed`)."""

    experiment: str
    dataset: str
    costs: list[RunCost] = field(default_factory=list)
    extra: list[RunCost] = field(default_factory=list)
    needed: dict[StepKey, DictConfig] = field(default_factory=dict)


def plan_experiment(cfg: DictConfig, trains: bool = True) -> Planned:
    """What `normprop run` would train of the experiment composed as `cfg` (experiments.grid.load);
    the runs' settings are checked as the sweep checks them (a UserError before anything is timed)."""
    planned = Planned(cfg.experiment.name, cfg.dataset.name)
    if not trains:
        return planned
    specs = [spec for one in each_setting(cfg) for spec in expand_grid(one)]
    swept = cfg.experiment.get("lr_sweep") is not None
    for spec in specs:
        validate(spec)
        path = run_dir(spec.cfg, spec.name)
        if swept and config_differences(spec, path) == ["train.lr"]:
            continue  # planned at the centre rate; the sweep chose this run's rate (`normprop run` checks it)
        check_same_config(spec, path, write=False)
    observed = observer(cfg)
    first, extensions = sweep_specs(cfg)
    for group, sweep in ((specs, False), (first, True)):
        for spec in group:
            cost = run_cost(spec, sweep, observed if not sweep else _nothing)
            if cost is None or not cost.epochs:
                continue
            planned.costs.append(cost)
            planned.needed.setdefault(cost.key, spec.cfg)
            eval_key = cost.key._replace(batch_size=min(int(spec.cfg.train.eval_batch_size), EVAL_TIMED))
            planned.needed.setdefault(eval_key, spec.cfg)
    for spec, more in extensions:  # as costly as the setting's centre rate, whatever rate they try
        cost = run_cost(spec, True)
        if cost is not None:
            planned.extra += [cost] * more
            planned.needed.setdefault(cost.key, spec.cfg)
    return planned


def _nothing(spec, first, left):
    return 0, 0


def each_setting(cfg: DictConfig):
    """`cfg` with a grid of one setting, each in turn (the same object, changed in place): every run
    config expand_grid makes holds the whole config, so a long grid is expanded one setting at a time."""
    if not cfg.get("grid"):
        yield cfg
        return
    one = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for entry in list(one.grid):
        one.grid = [entry]
        yield one


def sweep_specs(cfg: DictConfig) -> tuple[list[RunSpec], list[tuple[RunSpec, int]]]:
    """The learning-rate sweep's runs (lr_sweep.py): every run of the factors policy, or the steps
    policy's first round; and for the steps policy, (the centre rate's run, how many more runs) per
    setting and seed: its possible extensions, `extend` more rates past each edge."""
    if cfg.experiment.get("lr_sweep") is None:
        return [], []
    if not lr_sweep.stepped(cfg):
        return expand_grid(lr_sweep.sweep_grid(cfg)[0]), []
    lr_sweep.check_stepped(cfg)
    s = cfg.experiment.lr_sweep
    half, first, extensions = int(s.points) // 2, [], []
    for one in each_setting(cfg):
        entry = one.grid[0]
        if entry.get("rate_of"):
            continue
        todo = [(entry.id, lr_sweep.rate(float(entry.set[lr_sweep.LR]), s.step, k)) for k in range(-half, half + 1)]
        specs = lr_sweep.stepped_specs(one, todo)[1]
        first += specs
        centre = todo[half][1]
        extensions += [(spec, 2 * int(s.extend)) for spec in specs if float(spec.cfg.train.lr) == centre]
    return first, extensions


def observer(cfg: DictConfig):
    """(spec, first epoch, epochs left) -> (images the run's observers score in batches, one at a time)."""
    name = cfg.experiment.name
    if name == "normalizers":
        return observed_normalizers
    passes = OBSERVED_PASSES.get(name, 0)

    def observed(spec: RunSpec, first: int, left: int) -> tuple[int, int]:
        epochs = left + (first == 0)  # epoch 0 (before training) is observed by a run that starts
        return passes * epochs * probe_set(spec), 0

    return observed


def probe_set(spec: RunSpec) -> int:
    """The images a probe pass sees: the first train.probe_images test images, else the test set."""
    test, limit = sizes(spec.cfg).test, spec.cfg.train.get("probe_images")
    return min(test, int(limit)) if limit else test


def observed_normalizers(spec: RunSpec, first: int, left: int) -> tuple[int, int]:
    """normalizers' observers (normalizers.observers): the population probe every population_every epochs
    (and at 0 and the last); for a batch-statistics method at batch 1 the test set scored in both modes,
    one image at a time in training mode, every mode_gap_every epochs and the last."""
    exp, last = spec.cfg.experiment, int(spec.cfg.train.epochs)
    every = lambda key: max(1, int(exp.get(key) or 1))  # noqa: E731
    epochs = range(first + (first > 0), first + left + 1)
    population = sum(due(e, every("population_every"), last) for e in epochs) * probe_set(spec)
    method, test = spec.cfg.get("method"), sizes(spec.cfg).test
    if method in METHODS and METHODS[method].batch_statistics and int(spec.cfg.train.batch_size) == 1:
        gaps = sum(e > 0 and due(e, every("mode_gap_every"), last) for e in epochs)
        return population + gaps * test, gaps * test
    return population, 0


def row(planned: Planned, step_ms: Mapping[StepKey, float]) -> dict:
    """plan.csv's row of one experiment."""
    costs = planned.costs
    est = sum(seconds(c, step_ms) for c in costs)
    return {
        "experiment": planned.experiment,
        "dataset": planned.dataset,
        "runs": sum(not c.sweep for c in costs),
        "sweep_runs": sum(c.sweep for c in costs),
        "sgd_steps": sum(c.steps for c in costs),
        "train_images": sum(c.train_images for c in costs),
        "eval_images": sum(c.eval_images + c.single_images for c in costs),
        "est_seconds": round(est, 1),
        "disk_bytes": sum(c.checkpoint_bytes for c in costs),
        "sweep_runs_max": sum(c.sweep for c in costs) + len(planned.extra),
        "est_seconds_max": round(est + sum(seconds(c, step_ms) for c in planned.extra), 1),
    }


def table(plans: list[Planned], times: Times, total: bool = False) -> pd.DataFrame:
    """plan.csv: one row per experiment priced by `times` ({key: run config} -> {key: ms}), and with
    `total` a last row `total` that sums them."""
    needed: dict[StepKey, DictConfig] = {}
    for p in plans:
        for key, cfg in p.needed.items():
            needed.setdefault(key, cfg)
    step_ms = dict(times(needed)) if needed else {}
    rows = [row(p, step_ms) for p in plans]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    if total:
        sums = frame[COLUMNS[2:]].sum()
        frame.loc[len(frame)] = {"experiment": "total", "dataset": "", **sums.round(1).to_dict()}
    return frame


def write(results_dir: str | Path, frame: pd.DataFrame) -> Path:
    return io.write_csv(Path(results_dir) / PLAN, frame)


def summary(frame: pd.DataFrame, source: str) -> list[str]:
    """One or two lines: the totals of plan.csv (its `total` row, else its one row), and the most the
    learning-rate sweeps may add where they can extend."""
    r = frame.iloc[-1]
    sweep = f" + {int(r.sweep_runs)} sweep run(s)" if r.sweep_runs else ""
    lines = [f"plan: {int(r.runs)} run(s){sweep} to train, {int(r.sgd_steps):,} SGD steps, "
             f"{int(r.eval_images):,} images evaluated: about {duration(r.est_seconds)} in one process "
             f"({source}); checkpoints {size(r.disk_bytes)}"]  # fmt: skip
    if r.sweep_runs_max > r.sweep_runs:
        lines.append(f"plan: the learning-rate sweeps may extend to {int(r.sweep_runs_max)} sweep runs: "
                     f"{duration(r.est_seconds_max)} at most")  # fmt: skip
    return lines


def configs(preset: str | None = None, dataset: str | None = None, **settings) -> list[tuple[DictConfig, bool]]:
    """`normprop reproduce-all`'s experiments, composed as it composes them: (config, whether it trains)."""
    from normprop_cli import config
    from normprop_cli.experiments import EXPERIMENTS, grid

    listed = config.root(preset).preset.get("experiments")
    return [(grid.load(name, preset, dataset if EXPERIMENTS[name].trains else None, [], **settings),
             EXPERIMENTS[name].trains) for name in listed or EXPERIMENTS]  # fmt: skip


def announce(cfgs: list[tuple[DictConfig, bool]], make_times: Callable[[], Times], write_plan: bool,
             keep: bool = False) -> Iterator[str]:  # fmt: skip
    """With `write_plan` (--dry-run): plan.csv written into the results directory (a `total` row where
    there are several experiments) and the lines that say its totals and where it is; with `keep`, a
    plan.csv already there is left as it is (a committed plan priced on another machine) and the lines
    say so. Steps timed here are announced, with about how long that takes, before they are timed.
    Without `write_plan` (before `normprop run` trains): the estimate line alone, or nothing where the run
    is about to refuse (a setting, the data, the device: it says why in its own one line). The lines come
    as they are known, so that a caller prints each before the work after it."""
    if write_plan:
        target = Path(cfgs[-1][0].results_dir) / PLAN
        kept = keep and target.exists()
        if kept:
            yield (f"plan: {target} is there and is kept (--force writes over it; --results-dir DIR writes "
                   "DIR/plan.csv); the totals follow")  # fmt: skip
        plans = [plan_experiment(c, trains) for c, trains in cfgs]
        times = make_times()
        if (notice := timing_notice(times, needed_keys(plans))) is not None:
            yield notice
        frame = table(plans, times, total=len(cfgs) > 1)
        yield from summary(frame, getattr(times, "source", ""))
        if not kept:
            yield f"wrote {write(target.parent, frame)}"
        return
    from normprop_cli.data import available_datasets
    from normprop_cli.errors import UserError

    try:
        cfg = cfgs[0][0]
        if not (cfg.download or available_datasets(cfg.data_dir).get(cfg.dataset.name, True)):
            return
        plans = [plan_experiment(c, trains) for c, trains in cfgs]
        if not any(p.costs for p in plans):
            return
        times = make_times()
        line = summary(table(plans, times), getattr(times, "source", ""))[0]
    except UserError:
        return
    yield line


def needed_keys(plans: list[Planned]) -> list[StepKey]:
    return list(dict.fromkeys(key for p in plans for key in p.needed))


def timing_notice(times, keys: list[StepKey]) -> str | None:
    """The line said before steps are timed on this machine (no step-times file): how many
    configurations, how many steps each, and about how long, priced by the committed CPU bench."""
    if getattr(times, "known", None) is not None or getattr(times, "dev", None) is None or not keys:
        return None
    steps = int(times.steps) + WARMUP
    widths = ", ".join(f"{w:g}" for w in sorted({k.width for k in keys}))
    batches = ", ".join(str(b) for b in sorted({k.batch_size for k in keys}))
    what = (f"timing {len(keys)} step configuration(s) ({len({k.method for k in keys})} method(s), batch sizes "
            f"{batches}, width {widths}) on {times.where}, {steps} steps each, to price the plan")  # fmt: skip
    bench = bench_estimate(keys, steps) if times.dev.type == "cpu" else None
    if bench is None:
        how_long = "its time is not known before it starts"
    else:
        seconds, where = bench
        how_long = f"about {duration(seconds)} on idle cores of {where}, longer where the cores are busy"
    return f"{what}: {how_long}; --step-times FILE prices it from a file instead, timing nothing"


def bench_estimate(keys: list[StepKey], steps: int, bench: Path | None = None) -> tuple[float, str] | None:
    """(seconds, the bench's CPU) that timing `steps` steps of each of `keys` takes at the committed CPU
    bench's float32 step times: each key at its method's nearest width (scaled up by the width squared
    above it, the hidden convolutions' cost), interpolated in the batch size (in proportion above the
    largest); a method the bench lacks at the mean of the others. None without the bench."""
    try:
        table = pd.read_csv(bench or BENCH, comment="#")
        if "precision" in table:
            table = table[table["precision"] == "float32"]
        where = str(table["device"].iloc[0])
        table = table[["method", "batch_size", "width", "step_ms_median"]].dropna()
    except (OSError, ValueError, KeyError, IndexError):
        return None
    total, priced = 0.0, 0
    for key in keys:
        rows = table[table["method"] == key.method]
        if rows.empty:
            continue
        near = min(rows["width"].unique(), key=lambda w: abs(w - key.width))
        rows = rows[rows["width"] == near].sort_values("batch_size")
        batch, ms = rows["batch_size"].to_numpy(float), rows["step_ms_median"].to_numpy(float)
        at = float(np.interp(key.batch_size, batch, ms)) * max(1.0, key.batch_size / batch[-1])
        total += steps * at * max(1.0, (key.width / near) ** 2) / 1e3
        priced += 1
    return (total * len(keys) / priced, where) if priced else None


def project(preset: str, times: Times, results_dir: str | Path) -> pd.DataFrame:
    """plan.csv of `normprop reproduce-all --preset <preset>` into an empty `results_dir`, every run to
    train, priced by `times` (gpu-check: this GPU's measured step times)."""
    cfgs = configs(preset, results_dir=str(results_dir))
    return table([plan_experiment(c, trains) for c, trains in cfgs], times, total=True)
