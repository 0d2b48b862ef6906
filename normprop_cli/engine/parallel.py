"""A grid's runs in worker processes on this machine: `normprop run EXPERIMENT --jobs N`.

Each worker is a fresh 'spawn' process (safe with CUDA) that loads the data set itself and trains
runs one after another, on its own GPU when several are visible, else on its share of the CPU
threads. A run crosses the process boundary as a plain dict, never a DictConfig. Runs are
deterministic from their seed and the trainer writes their files atomically after every epoch,
so the result files are those of a sequential run, and the run of a worker that dies resumes the
next time the command runs.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import sys
import traceback
from collections.abc import Callable, Sequence

import cloudpickle
import torch
from omegaconf import DictConfig, OmegaConf

from normprop_cli import device as devices
from normprop_cli.engine.progress import QuietProgress
from normprop_cli.engine.runs import RunSpec, read_manifest, run_dir, say
from normprop_cli.engine.trainer import Observer
from normprop_cli.errors import UserError

Observers = Callable[[RunSpec], Sequence[Observer]]


def plain(spec: RunSpec) -> dict:
    """A run's config as a plain dict: what a worker process or a submitit job is sent."""
    return OmegaConf.to_container(spec.cfg, resolve=True)


def worker_threads(workers: int) -> int:
    """CPU threads per worker: this process's threads, split between the workers."""
    return max(1, torch.get_num_threads() // workers)


class LastEpoch:
    """A silent Progress for a worker: it keeps the last epoch's row for the parent's line."""

    row: dict | None = None

    def start(self, spec, epochs, steps_per_epoch, done):
        pass

    def step(self, n):
        pass

    def epoch(self, row):
        self.row = row

    def finish(self, manifest):
        pass


_data: dict = {}  # a worker's data sets, each loaded once per process
DATA_KEPT = 2  # data sets a worker keeps: reproduce-all's experiments alternate between two (engine.pool)


def train_in_worker(runs: list[tuple[dict, Observers]], device: str | None, threads: int | None) -> list[tuple]:
    """Train runs (`plain` configs with their observers) in this process; each one's (manifest, last
    epoch's row). One run trains as `normprop run` would; several are one trajectory (engine.pool): the
    first, which has the most epochs, trains and the others ride along it (trainer.train_together)."""
    from normprop_cli.engine.job import load_data, train_one
    from normprop_cli.engine.riders import Rider
    from normprop_cli.engine.trainer import train_together

    if threads:
        torch.set_num_threads(threads)
    cfgs = [OmegaConf.create(run) for run, _ in runs]
    device = devices.resolve(device or cfgs[0].device)
    devices.prepare(device, bool(cfgs[0].get("deterministic", False)))
    key = (repr(runs[0][0]["dataset"]), str(cfgs[0].data_dir), str(device))
    if key not in _data:
        while len(_data) >= DATA_KEPT:  # the oldest goes (dicts keep their insertion order)
            _data.pop(next(iter(_data)))
        _data[key] = load_data(cfgs[0], device)
    specs = [RunSpec(name=c.run.name, setting=c.run.setting, seed=int(c.seed), cfg=c) for c in cfgs]
    lasts = [LastEpoch() for _ in specs]
    watch = [observers(spec) for spec, (_, observers) in zip(specs, runs, strict=True)]
    if len(specs) == 1:
        return [(train_one(specs[0], _data[key], device, lasts[0], watch[0]), lasts[0].row)]
    riders = [Rider(s, w, last) for s, w, last in zip(specs[1:], watch[1:], lasts[1:], strict=True)]
    manifests = train_together(specs[0], _data[key], device, lasts[0], watch[0], riders)
    return [(m, last.row) for m, last in zip(manifests, lasts, strict=True)]


def report(progress: QuietProgress, spec: RunSpec, manifest: dict, last: dict | None) -> None:
    """The --quiet line of a run that a worker finished."""
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


def run_pool(cfg: DictConfig, todo: Sequence[RunSpec], observers: Observers, progress: QuietProgress) -> None:
    """Train `todo` in min(jobs, len(todo)) worker processes; one line per finished run."""
    n = min(int(cfg.jobs), len(todo))
    ctx = multiprocessing.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    threads, pickled = worker_threads(n), cloudpickle.dumps(observers)
    for spec in todo:
        tasks.put(([(plain(spec), pickled)], threads))
    for _ in range(n):
        tasks.put(None)  # one stop sign per worker, after every run
    workers = [
        ctx.Process(target=serve, args=(k, device, tasks, results), daemon=True)
        for k, device in enumerate(devices.for_workers(cfg.device, n))
    ]
    for w in workers:
        w.start()
    specs, done, dead = {s.name: s for s in todo}, set(), set()
    try:
        for kind, k, name, payload in _messages(results, workers):
            if kind == "done":
                done.add(name)
                report(progress, specs[name], *payload[0])
            elif kind == "error":
                raise UserError(payload)
            elif kind == "crash":
                raise RuntimeError(f"run {name} failed in worker process {k}:\n{payload}")
            for i, w in enumerate(workers):
                if w.exitcode not in (None, 0) and i not in dead:
                    dead.add(i)
                    say(f"worker process {i} died (exit code {w.exitcode}); the others go on")
    except KeyboardInterrupt:
        _stop(workers)
        stop_unfinished([s for s in todo if s.name not in done], "interrupted", 130)
    finally:
        _stop(workers)
    unfinished = [s for s in todo if s.name not in done]
    if unfinished:
        stop_unfinished(unfinished, f"{sum(w.exitcode != 0 for w in workers)} worker process(es) died", 1)


def _messages(results, workers):
    """The workers' messages until every worker has exited and everything it sent is read;
    (None, ...) now and then, so that the caller can look at its workers."""
    while True:
        alive = any(w.is_alive() for w in workers)
        try:
            yield results.get(timeout=0.5)
        except queue.Empty:
            if not alive:  # what an exited worker sent is in the pipe by now
                return
            yield None, None, None, None


def _stop(workers) -> None:
    for w in workers:
        if w.is_alive():
            w.terminate()  # SIGTERM: the worker cleans up as on Ctrl-C
    for w in workers:
        w.join(timeout=30)
        if w.is_alive():
            w.kill()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve(k: int, device: str, tasks, results) -> None:
    """A worker process (this module's pool, and engine.pool's): train each assignment it takes from
    `tasks`, ([(plain config, pickled observers), ...], threads): one run, or the runs of one trajectory
    trained together (engine.pool), until it takes a stop sign (None) or a run fails. It answers each
    assignment with one message (kind, k, first run's name, payload): "done" with [(manifest, last
    epoch's row)] in the runs' order, "error" with the one-line error, "crash" with the traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for runs, threads in iter(tasks.get, None):
            name = runs[0][0]["run"]["name"]
            try:
                loaded = [(run, cloudpickle.loads(observers)) for run, observers in runs]
                results.put(("done", k, name, train_in_worker(loaded, device, threads)))
            except UserError as exc:
                results.put(("error", k, name, str(exc)))
                return
            except Exception:
                results.put(("crash", k, name, traceback.format_exc()))
                return
    except KeyboardInterrupt:
        pass
