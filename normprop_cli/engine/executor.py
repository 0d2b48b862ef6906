"""Where a plan's tasks train (engine.plan): one interface, `Executor`, and its implementations:

- `InProcess`: here, one task after another (the default, `jobs: 1`);
- `Workers`: a local pool of worker processes (`jobs` > 1), concurrent.futures' ProcessPoolExecutor;
- engine.launch's `Submitit`: submitit's jobs, `launcher: local | slurm`.

A task crosses a process boundary as `payload`: each run's config as a plain dict (never a DictConfig) and
its observers pickled by value (cloudpickle). Runs are deterministic from their seed and threads, and the
trainer writes their files atomically after every epoch, so where a task trains changes none of its files
but the times; a task stopped in a worker that dies, or by Ctrl-C, resumes the next time the command runs.
Every executor says a line per finished run (its stage's progress), stops the other tasks at the first
failure and raises it, and on Ctrl-C stops every task, says which runs are unfinished and exits 130.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

import cloudpickle
import torch
from omegaconf import DictConfig, OmegaConf

from normprop_cli import device as devices
from normprop_cli.engine.job import check_ready, load_data
from normprop_cli.engine.plan import Plan, Task, costliest_first
from normprop_cli.engine.riders import Rider
from normprop_cli.engine.runs import RunSpec, read_manifest, run_dir, say
from normprop_cli.engine.trainer import train_run
from normprop_cli.errors import UserError

Payload = list[tuple[dict, bytes]]  # a task's runs: plain config and pickled observers, the trained run first
Results = list[tuple[dict, dict | None]]  # each run's (manifest, last epoch's row), in the payload's order


class Executor(Protocol):
    """Trains a plan's tasks, each member's line said by its `progress`; `threads(cfg)`: the CPU threads a
    run of that config trains on (part of its trajectory: engine.plan groups by it); `live`: whether its
    runs train in this process, where a progress bar can follow their steps."""

    live: bool

    def threads(self, cfg: DictConfig) -> int: ...
    def submit(self, plan: Plan) -> None: ...
    def close(self) -> None: ...


def plain(spec: RunSpec) -> dict:
    """A run's config as a plain dict: what a worker process or a submitit job is sent."""
    return OmegaConf.to_container(spec.cfg, resolve=True)


def payload(task: Task) -> Payload:
    return [(plain(m.spec), cloudpickle.dumps(m.observers)) for m in task.members]


def worker_threads(workers: int) -> int:
    """CPU threads per worker: this process's threads, split between the workers."""
    return max(1, torch.get_num_threads() // workers)


class LastEpoch:
    """A silent Progress: it keeps the last epoch's row, for the line said once the run is back."""

    row: dict | None = None

    def start(self, spec, epochs, steps_per_epoch, done):
        pass

    def step(self, n):
        pass

    def epoch(self, row):
        self.row = row

    def finish(self, manifest):
        pass


def report(progress, spec: RunSpec, manifest: dict, last: dict | None) -> None:
    """The line of a run that trained elsewhere (a worker, a job) or rode along."""
    progress.start(spec, int(manifest["epochs"]), 1, 0)
    if last:
        progress.epoch(last)
    progress.finish(manifest)


def stop_unfinished(specs: Sequence[RunSpec], why: str, code: int) -> None:
    """Say which runs are unfinished, and where they stand, then exit with `code`."""
    done = [(read_manifest(run_dir(s.cfg, s.name)) or {}).get("epochs_done", 0) for s in specs]
    where = ", ".join(f"{s.name} at epoch {epoch}" for s, epoch in zip(specs, done, strict=True))
    say(
        f"{why}: {len(specs)} run(s) unfinished ({where}); they keep their finished epochs; "
        "run the same command again to resume them"
    )
    sys.exit(code)


# ---- one task, in whichever process trains it ---------------------------------------------------------------

_here: dict = {"data": {}, "prepared": set(), "device": None, "busy": False}
DATA_KEPT = 2  # data sets a process keeps: the experiments of one round use one or two


def data_key(cfg: DictConfig) -> tuple[str, str]:
    return repr(OmegaConf.to_container(cfg.dataset)), str(cfg.data_dir)


def data_for(cfg: DictConfig, device: torch.device):
    """The run's data set on `device`, loaded once per process (the oldest of DATA_KEPT goes first)."""
    key, kept = (*data_key(cfg), str(device)), _here["data"]
    if key not in kept:
        while len(kept) >= DATA_KEPT:
            kept.pop(next(iter(kept)))
        kept[key] = load_data(cfg, device)
    return kept[key]


def train_task(runs: Payload, threads: int | None = None, device: str | None = None) -> Results:
    """Train one task in this process: the first run trains, the others ride along it (engine.plan)."""
    if threads:
        torch.set_num_threads(threads)
    cfgs = [OmegaConf.create(run) for run, _ in runs]
    dev = devices.resolve(device or _here["device"] or cfgs[0].device)
    if (dev, deterministic := bool(cfgs[0].get("deterministic", False))) not in _here["prepared"]:
        devices.prepare(dev, deterministic)
        _here["prepared"].add((dev, deterministic))
    specs = [RunSpec(name=c.run.name, setting=c.run.setting, seed=int(c.seed), cfg=c) for c in cfgs]
    watch = [cloudpickle.loads(observers)(spec) for spec, (_, observers) in zip(specs, runs, strict=True)]
    lasts = [LastEpoch() for _ in specs]
    riders = [Rider(s, w, last) for s, w, last in zip(specs[1:], watch[1:], lasts[1:], strict=True)]
    _here["busy"] = True
    try:
        manifest = train_run(specs[0], data_for(cfgs[0], dev), dev, lasts[0], watch[0], riders)
    except KeyboardInterrupt:  # a worker stopped (SIGTERM) mid-run: its finished epochs are on disk
        os._exit(128 + signal.SIGTERM)
    finally:
        _here["busy"] = False
    return [(manifest, lasts[0].row)] + [(r.manifest, last.row) for r, last in zip(riders, lasts[1:], strict=True)]


def check_here(plan: Plan, device: torch.device) -> None:
    """Before any task trains: each unfinished run's training split holds a batch and its results directory
    can be written (the data set loaded here, so that a missing one is fetched once, or refused)."""
    for i, stage in enumerate(plan.stages):
        todo = [m.spec for t in plan.tasks for m in t.members if m.stage == i]
        if todo:
            check_ready(stage.cfg, todo, data_for(todo[0].cfg, device))


# ---- here ---------------------------------------------------------------------------------------------------


class InProcess:
    """Here, one task after another, each run's progress live."""

    live = True

    def __init__(self, cfg: DictConfig) -> None:
        self.device, self.deterministic = devices.resolve(cfg.device), bool(cfg.get("deterministic", False))
        self.prepared = False

    def threads(self, cfg: DictConfig) -> int:
        return torch.get_num_threads()

    def submit(self, plan: Plan) -> None:
        if not self.prepared:  # once, before the first run trains
            devices.prepare(self.device, self.deterministic)
            self.prepared = True
        check_here(plan, self.device)
        for task in plan.tasks:
            lead, along = task.leader, task.members[1:]
            riders = [Rider(m.spec, m.observers(m.spec), LastEpoch()) for m in along]
            try:
                data = data_for(lead.spec.cfg, self.device)
                train_run(lead.spec, data, self.device, lead.progress, lead.observers(lead.spec), riders)
            except KeyboardInterrupt:
                done = (read_manifest(run_dir(lead.spec.cfg, lead.spec.name)) or {}).get("epochs_done", 0)
                say(f"interrupted: run {lead.spec.name} kept {done} finished epoch(s); run the same command again "
                    "to resume")  # fmt: skip
                sys.exit(130)
            for member, rider in zip(along, riders, strict=True):
                report(member.progress, member.spec, rider.manifest, rider.progress.row)

    def close(self) -> None:
        pass


# ---- tasks that train elsewhere, as futures -----------------------------------------------------------------


class Died(Exception):
    """A process that trained a task died: the other tasks are stopped, their finished epochs kept."""


def collect(futures: Mapping[Future, Task], outcome: Callable[[Future, Task], Results | None],
            stop: Callable[[], None]) -> list[Task]:  # fmt: skip
    """Say each finished task's lines as it finishes; `outcome` gives its results (None: lost, to say at the
    end) or raises its failure, which stops the others (`stop`) and is raised; Ctrl-C stops them and exits
    130, and a dead process exits 1, each naming the unfinished runs. The lost tasks, once all are done."""
    waiting, lost = dict(futures), []
    try:
        for future in as_completed(futures):
            results = outcome(future, waiting[future])
            task = waiting.pop(future)
            if results is None:
                lost.append(task)
                continue
            for member, (manifest, last) in zip(task.members, results, strict=True):
                report(member.progress, member.spec, manifest, last)
    except KeyboardInterrupt:
        stop()
        stop_unfinished([s for t in [*waiting.values(), *lost] for s in t.specs], "interrupted", 130)
    except Died as exc:
        stop()
        stop_unfinished([s for t in [*waiting.values(), *lost] for s in t.specs], str(exc), 1)
    except BaseException:
        stop()
        raise
    return lost


def _on_term(signum, frame):
    if _here["busy"]:
        raise KeyboardInterrupt  # the run stops as on Ctrl-C: its lock released, its finished epochs kept
    os._exit(0)


def start_worker(slots, datasets: list[dict]) -> None:
    """A worker process's start: its device (a slot of its own), Ctrl-C left to the parent (which stops it
    with SIGTERM), and the data sets of the first tasks loaded once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    _here["device"] = slots.get()
    for cfg in datasets:
        data_for(OmegaConf.create(cfg), devices.resolve(_here["device"]))


class Workers:
    """`workers` worker processes on this machine (ProcessPoolExecutor, started as `device.worker_context`
    says), each on its own GPU where several are visible, else on its share of the CPU threads
    (worker_threads of the run's `jobs`). Started with the first tasks, kept for the later rounds of the same
    command."""

    live = False

    def __init__(self, workers: int, device: str, deterministic: bool) -> None:
        self.workers, self.devices = workers, devices.for_workers(device, workers)
        self.deterministic = deterministic
        self.pool: ProcessPoolExecutor | None = None
        self.procs: list = []

    def threads(self, cfg: DictConfig) -> int:
        return worker_threads(int(cfg.get("jobs") or 1))

    def _start(self, plan: Plan) -> ProcessPoolExecutor:
        if self.pool is None:
            ctx = devices.worker_context()
            slots = ctx.Queue()
            for device in self.devices:
                slots.put(device)
            firsts = {data_key(t.leader.spec.cfg): plain(t.leader.spec) for t in plan.tasks}
            self.pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=start_worker,
                                            initargs=(slots, list(firsts.values())))  # fmt: skip
        return self.pool

    def submit(self, plan: Plan) -> None:
        check_here(plan, torch.device("cpu"))
        pool = self._start(plan)
        futures = {pool.submit(train_task, payload(t), t.threads): t for t in costliest_first(plan.tasks)}
        self.procs = list((pool._processes or {}).values())  # to name a dead one's exit code (Died)
        collect(futures, self._outcome, self._stop)

    def _outcome(self, future: Future, task: Task) -> Results:
        try:
            return future.result()
        except UserError:
            raise
        except BrokenProcessPool:
            for p in self.procs:  # the pool stops the others (SIGTERM) once one has died
                p.join(timeout=30)
            stopped = (None, 0, -signal.SIGTERM, 128 + signal.SIGTERM)
            codes = [p.exitcode for p in self.procs if p.exitcode not in stopped]
            raise Died(f"a worker process died{f' (exit code {codes[0]})' if codes else ''}") from None
        except Exception as exc:
            trace = str(exc.__cause__ or "").strip() or repr(exc)
            raise RuntimeError(f"run {task.leader.spec.name} failed in a worker process:\n{trace}") from None

    def _stop(self) -> None:
        """Stop the workers (SIGTERM: a run in training keeps its finished epochs) and wait for them."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        pool.shutdown(wait=False, cancel_futures=True)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None
