"""One set of worker processes for the grids of several experiments at once (`normprop reproduce-all`,
experiments.together): each experiment runs in a thread of the parent process and hands its runs to
this pool, and a worker that finishes a run takes the next waiting run of any experiment. So no core
waits at the end of one experiment's grid while another experiment has runs to train, and the workers
start (import torch, load the data set) once, not once per grid.

The threads take turns (TURN): a thread holds the turn while it runs its own code (configs, the rate
sweep's choices, tables, figures) and lets it go only while it waits for its runs, so the parent's code
runs one thread at a time, as in a sequential reproduce-all; only the workers' training overlaps.

Which run a free worker takes: a learning-rate sweep's runs (sweep-*) first, since the experiment's
reported runs wait on their choice; then the costliest (engine.cost's steps and images, scaled by the
NIN's width), so that the last runs to finish are short ones. The order changes nothing in a run:
each one is deterministic from its seed and its worker's thread count, which its own experiment's
`jobs` sets as in engine.parallel.

Which runs train one trajectory (runs.trajectory: runs of several experiments with the same config, seed
and threads, but for their epochs and what they observe) is the plan's (Plan), made from the runs every
experiment will hand in before any is handed out: a run of a planned trajectory waits until each run of it
is in, then one worker trains the one with the most epochs and the others ride along it
(trainer.train_together), so that no trajectory of the plan is trained twice, whatever the timing. A run
the plan cannot foresee (the rates of a sweep's reported runs are known only once the sweep ran) trains
alone.
"""

from __future__ import annotations

import heapq
import itertools
import multiprocessing
import queue
import threading
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import cloudpickle
from omegaconf import DictConfig

from normprop_cli import device as devices
from normprop_cli.engine.cost import run_cost
from normprop_cli.engine.parallel import Observers, plain, report, serve, stop_unfinished, worker_threads
from normprop_cli.engine.progress import QuietProgress
from normprop_cli.engine.runs import RunSpec, run_dir, say, trajectory
from normprop_cli.errors import UserError

TURN = threading.Lock()  # held by the experiment thread whose own code runs (module docstring)


class Closed(BaseException):
    """The pool was closed (another experiment failed, or Ctrl-C) while a thread waited for its runs."""


@dataclass(order=True)
class Task:
    priority: tuple
    seq: int
    batch: int = field(compare=False)
    spec: RunSpec = field(compare=False)
    threads: int = field(compare=False)
    observers: bytes = field(compare=False)
    experiment: str = field(compare=False)
    trajectory: str | None = field(compare=False, default=None)  # the plan's trajectory: None trains alone


def where(spec: RunSpec) -> str:
    return str(run_dir(spec.cfg, spec.name))


@dataclass
class Plan:
    """The trajectories two or more runs train (module docstring), each as its runs' directories, and the
    experiment that hands in each of those runs."""

    groups: dict[str, set[str]] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, grids: Mapping[str, tuple[Sequence[RunSpec], int]]) -> Plan:
        """From each experiment's runs and the CPU threads they train on."""
        members: dict[str, dict[str, str]] = {}
        for experiment, (specs, threads) in grids.items():
            for spec in specs:
                if (key := trajectory(spec, threads)) is not None:
                    members.setdefault(key, {})[where(spec)] = experiment
        plan = cls()
        for key, runs in members.items():
            if len(runs) > 1:
                plan.groups[key] = set(runs)
                plan.owner |= runs
        return plan


def weight(spec: RunSpec) -> float:
    """A run's work in image-passes, for the order only: SGD steps cost about 8 images each beyond their
    images (a batch-1 step is bound by its operator calls), evaluation a third of a training image, and the
    NIN's work grows with the square of its width."""
    cost = run_cost(spec)
    if cost is None:
        return 0.0
    work = 8 * cost.steps + cost.train_images + cost.eval_images / 3 + cost.single_images
    return work * (max(float(spec.cfg.model.width), 0.25) / 0.25) ** 2


def priority(spec: RunSpec) -> tuple:
    return (0 if spec.name.startswith("sweep-") else 1, -weight(spec))


class Pool:
    """`workers` worker processes on `device` and the thread that feeds them (module docstring), started
    with the first runs handed in; `experiments` hand in runs, those of `plan` among them."""

    def __init__(self, workers: int, device: str, plan: Plan | None = None, experiments: Sequence[str] = ()) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.results = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(workers)]
        self.procs = [
            ctx.Process(target=serve, args=(k, dev, self.inboxes[k], self.results), daemon=True)
            for k, dev in enumerate(devices.for_workers(device, workers))
        ]
        self.mutex = threading.Lock()
        self.waiting: list[Task] = []  # a heap, by priority
        self.held: list[Task] = []  # runs of a planned trajectory whose other runs are not all in yet
        plan = plan or Plan()
        self.expected = {key: set(runs) for key, runs in plan.groups.items()}  # runs of the plan not yet in
        self.planned = {run: key for key, runs in plan.groups.items() for run in runs}
        self.owner = dict(plan.owner)
        self.live = set(experiments)  # experiments that may still hand in runs
        self.running: dict[int, list[Task]] = {}  # worker -> its tasks: one run, or one trajectory's (_together)
        self.idle = list(range(workers))
        self.dead: set[int] = set()
        self.mailboxes: dict[int, queue.Queue] = {}
        self.open_tasks: dict[tuple[int, str], Task] = {}  # submitted, not yet answered
        self.count = itertools.count()
        self.closed: str | None = None
        self.started = False  # a reproduce-all that reuses every run starts no worker
        self.router = threading.Thread(target=self._route, name="pool-router", daemon=True)

    def _start(self) -> None:  # under self.mutex: the workers start with the first runs to train
        self.started = True
        for p in self.procs:
            p.start()
        self.router.start()

    def submit(
        self, todo: Sequence[RunSpec], observers: Observers, threads: int, experiment: str = ""
    ) -> tuple[int, queue.Queue]:
        """Queue `todo`'s runs; the mailbox that gets one message per run: (kind, name, payload)."""
        pickled = cloudpickle.dumps(observers)
        ranks = [priority(spec) for spec in todo]  # reads manifests: before the router's lock
        keys = [trajectory(spec, threads) for spec in todo]
        with self.mutex:
            if self.closed:
                raise Closed(self.closed)
            if not self.started:
                self._start()
            batch, box = next(self.count), queue.Queue()
            self.mailboxes[batch] = box
            for spec, rank, key in zip(todo, ranks, keys, strict=True):
                planned = self.planned.pop(where(spec), None)
                if planned is not None:
                    self.expected[planned].discard(where(spec))
                # a run the plan did not foresee, or not as it is now (no longer fresh), trains alone
                task = Task(rank, next(self.count), batch, spec, threads, pickled, experiment,
                            key if key == planned else None)  # fmt: skip
                self.open_tasks[(batch, spec.name)] = task
                if task.trajectory is None:
                    heapq.heappush(self.waiting, task)
                else:
                    self.held.append(task)
            self._release()
            self._dispatch()
        return batch, box

    def ended(self, experiment: str) -> None:
        """`experiment` hands in no more runs: the plan's runs of it that are not in will not come."""
        with self.mutex:
            self.live.discard(experiment)
            for run in [run for run, owner in self.owner.items() if owner == experiment]:
                if (key := self.planned.pop(run, None)) is not None:
                    self.expected[key].discard(run)
            if not self.closed:
                self._release()
                self._dispatch()

    def _release(self) -> None:  # under self.mutex
        """Queue the held runs whose trajectory has every planned run in."""
        ready = [t for t in self.held if not self.expected[t.trajectory]]
        if ready:
            self.held = [t for t in self.held if self.expected[t.trajectory]]
            for task in ready:
                heapq.heappush(self.waiting, task)

    def unfinished(self) -> list[RunSpec]:
        with self.mutex:
            return [t.spec for t in sorted(self.open_tasks.values(), key=lambda t: t.seq)]

    def close(self, why: str) -> None:
        """Stop the workers (a run in training keeps its finished epochs) and wake every waiting thread."""
        with self.mutex:
            if self.closed:
                return
            self.closed = why
            boxes = list(self.mailboxes.values())
        started = [p for p in self.procs if p.pid is not None]
        for inbox in self.inboxes:
            inbox.put(None)
        for p in started:
            if p.is_alive():
                p.terminate()  # SIGTERM: the worker stops as on Ctrl-C
        for p in started:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        for box in boxes:
            box.put(("closed", "", why))

    def _dispatch(self) -> None:  # under self.mutex
        if self.held and not self.waiting and not self.running and self.live <= self._waiting_experiments():
            # Every experiment waits for its runs and only held ones are left: a planned run still out will
            # not come before they train (its experiment hands it in after them), so they go as they are.
            for task in self.held:
                self.expected[task.trajectory].clear()
            self._release()
        while self.idle and self.waiting:
            k, tasks = self.idle.pop(0), self._together(heapq.heappop(self.waiting))
            self.running[k] = tasks
            self.inboxes[k].put(([(plain(t.spec), t.observers) for t in tasks], tasks[0].threads))
        if not (self.waiting or self.held) or len(self.dead) < len(self.procs):
            return
        for task in [*self.waiting, *self.held]:  # no worker left to train them
            self._answer(task, ("dead", task.spec.name, None))
        self.waiting, self.held = [], []

    def _waiting_experiments(self) -> set[str]:  # under self.mutex
        return {t.experiment for t in self.open_tasks.values()}

    def _together(self, task: Task) -> list[Task]:  # under self.mutex
        """`task` and every waiting task of its planned trajectory, the one with the most epochs first: one
        worker trains that one, and the others ride along it (trainer.train_together)."""
        if task.trajectory is None:
            return [task]
        same = [t for t in self.waiting if t.trajectory == task.trajectory]
        if same:
            self.waiting = [t for t in self.waiting if t.trajectory != task.trajectory]
            heapq.heapify(self.waiting)
        return sorted([task, *same], key=lambda t: -int(t.spec.cfg.train.epochs))

    def _answer(self, task: Task, message: tuple) -> None:  # under self.mutex
        self.open_tasks.pop((task.batch, task.spec.name), None)
        if (box := self.mailboxes.get(task.batch)) is not None:  # None: its thread stopped waiting
            box.put(message)

    def _route(self) -> None:
        try:
            self._route_messages()
        except Exception:  # a fault of this thread must not leave the experiments waiting forever
            say(f"the worker pool failed: {traceback.format_exc().strip().splitlines()[-1]}")
            self.close("the worker pool failed")

    def _route_messages(self) -> None:
        while not self.closed:
            try:
                kind, k, name, payload = self.results.get(timeout=0.5)
            except queue.Empty:
                kind = None
            except (EOFError, OSError):  # the queue closed under us: close() is on its way
                return
            with self.mutex:
                if self.closed:
                    return
                if kind is not None:
                    tasks = self.running.pop(k)
                    self.idle.append(k)
                    if kind == "done":  # payload: each run's (manifest, last row), in the tasks' order
                        for task, result in zip(tasks, payload, strict=True):
                            self._answer(task, (kind, task.spec.name, result))
                    else:  # an error or a crash answers every run of the assignment
                        for task in tasks:
                            self._answer(task, (kind, name, payload))
                for k, p in enumerate(self.procs):
                    if k not in self.dead and p.exitcode not in (None, 0):
                        self.dead.add(k)
                        say(f"worker process {k} died (exit code {p.exitcode}); the others go on")
                        if k in self.idle:
                            self.idle.remove(k)
                        for task in self.running.pop(k, []):
                            self._answer(task, ("dead", task.spec.name, p.exitcode))
                self._dispatch()


_active: Pool | None = None


def active() -> Pool | None:
    """The pool the grids of this process train in, where experiments.together opened one."""
    return _active


@contextmanager
def opened(workers: int, device: str, plan: Plan | None = None, experiments: Sequence[str] = ()) -> Iterator[Pool]:
    """A pool for the grids run inside the block (Pool); closed at its end."""
    global _active
    pool = Pool(workers, device, plan, experiments)
    _active = pool
    try:
        yield pool
    finally:
        _active = None
        pool.close("finished")


def run_shared(pool: Pool, cfg: DictConfig, todo: Sequence[RunSpec], observers: Observers, progress: QuietProgress):
    """engine.parallel.run_pool's work in the shared pool: train `todo`, one line per finished run. The
    calling thread holds TURN and lets it go while it waits."""
    specs, done, lost = {s.name: s for s in todo}, set(), []
    batch, box = pool.submit(todo, observers, worker_threads(int(cfg.jobs)), str(cfg.experiment.name))
    problem = None
    TURN.release()
    try:
        for _ in range(len(todo)):
            kind, name, payload = box.get()
            if kind == "closed":
                raise Closed(payload)
            if kind == "done":
                done.add(name)
                report(progress, specs[name], *payload)
            elif kind == "dead":
                lost.append(name)
            elif problem is None:  # the first error or crash stops the experiment once its turn is back
                problem = (kind, name, payload)
                break
    finally:
        TURN.acquire()
        with pool.mutex:
            pool.mailboxes.pop(batch, None)
    if problem is not None:
        kind, name, payload = problem
        if kind == "error":
            raise UserError(payload)
        raise RuntimeError(f"run {name} failed in a worker process:\n{payload}")
    unfinished = [s for s in todo if s.name not in done]
    if unfinished:
        stop_unfinished(unfinished, f"{len(pool.dead)} worker process(es) died", 1)
