"""The timing experiment's runs, trained in rounds: per seed, epoch r of every method's run, in an order
shuffled per round (`round_order`), before any of them trains epoch r + 1. A slow spell of a shared
machine then falls on all the methods of a round alike, and C6 pairs them round by round
(verdicts.rounds).

Each setting (method) of the grid has one worker process (`device.worker_context`), which trains that setting's runs
seed after seed in its main thread, through the engine's own `train_one` (checkpoint, metrics.csv and
manifest after every epoch, the run's lock, resume, a diverged run's end), with the threads of this
process: each epoch is timed as in a run of its own. Between its epochs a worker waits on its pipe for
its turn; this process hands the turns out, one at a time, so that one worker computes while the others
sleep. A run's model, optimiser and step stay built between its epochs, so no rebuilding, checkpoint
loading or CUDA graph capture lands in a timed epoch: a turn starts right before `train_epoch` starts
its clock, and a worker reports back after its epoch's evaluation, checkpoint and tables. (Threads in
one process would not do: each thread's OpenMP team counts against the CPUs, and libgomp then changes
how its threads wait, which changes the very seconds timed.)

Every epoch's turn is recorded by a `RoundObserver` in the run's own `rounds.csv` (round, position in
the round's order, the order, the `process` that handed the turns out, when it finished), kept in its
checkpoint like any observer's rows, so that a resumed run's record is its epochs'. Ctrl-C (or a kill)
keeps each run's finished epochs: the same command resumes them; a rerun reuses the finished runs.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback
import uuid
from collections.abc import Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from normprop_cli import device as devices
from normprop_cli.engine import tally
from normprop_cli.engine.job import check_data, finished, load_data, train_one, validate
from normprop_cli.engine.progress import accuracy
from normprop_cli.engine.runs import RunSpec, check_same_config, read_manifest, run_dir, say
from normprop_cli.errors import UserError

ORDER_SEED = 56  # section 5.6: the rounds' shuffles are drawn from (ORDER_SEED, seed, round)
OBSERVER = "rounds"  # runs/<run>/rounds.csv


def round_order(seed: int, round_: int, methods: Sequence[str]) -> list[str]:
    """The order in which the runs of `methods` (the grid's order) train epoch `round_` of seed `seed`:
    a permutation drawn from a generator seeded by (ORDER_SEED, seed, round_), the same in every process."""
    rng = np.random.default_rng([ORDER_SEED, int(seed), int(round_)])
    return [methods[i] for i in rng.permutation(len(methods))]


class RoundObserver:
    """After each epoch, the turn it was trained in: round, position, order, process, finished (Unix
    seconds). The worker sets `turn` from the message that hands it its turn."""

    name = OBSERVER

    def __init__(self):
        self.turn: dict = {}

    def observe(self, model, batches, epoch: int) -> list[dict]:
        if epoch == 0:  # before training: nothing was timed
            return []
        return [{"round": epoch} | self.turn | {"finished": time.time()}]


# ---- a worker process: one setting's runs, one epoch per turn -------------------------------------------


class Turns:
    """A worker's Progress: it says where its run stands and waits for its turn when the trainer starts
    (after building and resuming the run) and after each epoch but the last."""

    def __init__(self, conn, observer: RoundObserver):
        self.conn, self.observer, self.epochs, self.last = conn, observer, 0, None

    def _wait(self) -> None:
        kind, payload = self.conn.recv()
        if kind != "turn":
            raise KeyboardInterrupt  # "stop": as Ctrl-C, the run keeps its finished epochs
        self.observer.turn = payload

    def start(self, spec, epochs, steps_per_epoch, done):
        self.epochs = epochs
        self.conn.send(("ready", done))
        self._wait()

    def step(self, n):
        pass

    def epoch(self, row):
        self.last = row
        if int(row["epoch"]) < self.epochs:
            self.conn.send(("epoch", row))
            self._wait()

    def finish(self, manifest):
        pass


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _serve(conn, device: str, threads: int) -> None:
    """A worker process: train the runs it is sent, each one epoch per turn, until it is told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops us
    signal.signal(signal.SIGTERM, _interrupt)
    torch.set_num_threads(threads)
    data = {}
    try:
        for _, run in iter(conn.recv, ("stop", None)):
            cfg = OmegaConf.create(run)
            spec = RunSpec(name=cfg.run.name, setting=cfg.run.setting, seed=int(cfg.seed), cfg=cfg)
            where = devices.resolve(device)
            devices.prepare(where, bool(cfg.get("deterministic", False)))
            key = (repr(run["dataset"]), str(cfg.data_dir), device)
            if key not in data:
                data = {key: load_data(cfg, where)}
            observer = RoundObserver()
            turns = Turns(conn, observer)
            try:
                manifest = train_one(spec, data[key], where, turns, [observer])
            except UserError as exc:
                conn.send(("error", str(exc)))
                return
            except Exception:
                conn.send(("crash", traceback.format_exc()))
                return
            conn.send(("ended", (manifest, turns.last)))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):
        pass


# ---- this process: the turns ---------------------------------------------------------------------------


class Lane:
    """This process's end of one setting's worker."""

    def __init__(self, ctx, setting: str, device: str, threads: int):
        self.setting = setting
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, device, threads), daemon=True, name=f"timing-{setting}")
        self.spec: RunSpec | None = None
        self.manifest: dict | None = None
        self.done, self.ended, self.last = 0, True, {}

    def begin(self, spec: RunSpec) -> None:
        """Send the worker its run: it builds (or resumes) it and waits for its first turn, or ends it."""
        self.spec, self.manifest, self.done, self.ended, self.last = spec, None, 0, False, {}
        self.conn.send(("run", OmegaConf.to_container(spec.cfg, resolve=True)))
        self.wait()

    def turn(self, mark: dict) -> None:
        """One epoch: the worker trains it and reports back after its checkpoint (or ends its run)."""
        self.conn.send(("turn", mark))
        self.wait()

    def wait(self) -> None:
        while not self.conn.poll(0.1):  # a timeout: Ctrl-C reaches this process while it waits
            if not self.process.is_alive():
                raise UserError(
                    f"the worker process training {self.spec.name} died (exit code {self.process.exitcode})"
                )
        kind, payload = self.conn.recv()
        if kind == "ready":
            self.done = int(payload)
        elif kind == "epoch":
            self.done, self.last = int(payload["epoch"]), payload
        elif kind == "ended":
            self.ended, self.manifest = True, payload[0]
            self.last = payload[1] or self.last
        elif kind == "error":
            raise UserError(payload)
        else:
            raise RuntimeError(f"run {self.spec.name} failed in its worker process:\n{payload}")


def process_id() -> str:
    """The process that hands the turns out: this one, on this host, from this time."""
    return f"{socket.gethostname()}:{os.getpid()}:{time.strftime('%Y%m%dT%H%M%S')}:{uuid.uuid4().hex[:6]}"


def train_in_rounds(cfg: DictConfig, specs: Sequence[RunSpec]) -> list[dict]:
    """Train the grid's unfinished runs seed by seed, in rounds; return every run's manifest."""
    for spec in specs:
        validate(spec)
        check_same_config(spec, run_dir(spec.cfg, spec.name), write=False)
    todo = [s for s in specs if not finished(s)]
    if len(todo) < len(specs):
        where = run_dir(specs[0].cfg, specs[0].name).parent
        say(f"{len(specs) - len(todo)} of {len(specs)} runs already finished in {where}: reused, not retrained")
    if todo:
        check_data(cfg, todo)  # fetched once, or refused, before any worker starts
        device = str(devices.resolve(cfg.device))
        ctx = devices.worker_context()
        settings = list(dict.fromkeys(s.setting for s in specs))  # the grid's order
        lanes = {name: Lane(ctx, name, device, torch.get_num_threads()) for name in settings}
        count = {"n": len(specs) - len(todo), "of": len(specs)}
        try:
            for lane in lanes.values():
                lane.process.start()
            process = process_id()
            for seed in sorted({s.seed for s in todo}):
                seed_in_rounds(cfg, seed, [s for s in todo if s.seed == seed], lanes, process, count)
            for lane in lanes.values():
                lane.conn.send(("stop", None))
                lane.process.join()
        except KeyboardInterrupt:
            stop(lanes.values())
            kept = [f"{s.name} at epoch {(read_manifest(run_dir(s.cfg, s.name)) or {}).get('epochs_done', 0)}"
                    for s in todo if not finished(s)]  # fmt: skip
            say(f"interrupted: {', '.join(kept)} keep their finished epochs; run the same command again to resume")
            sys.exit(130)
        finally:
            stop(lanes.values())
    manifests = [read_manifest(run_dir(s.cfg, s.name)) for s in specs]
    tally.record(len(specs), len(todo), manifests)
    return manifests


def seed_in_rounds(cfg: DictConfig, seed: int, todo: list[RunSpec], lanes: dict, process: str, count: dict) -> None:
    """One seed's unfinished runs: each one's setup in turn, then the rounds, then a line per run."""
    mine = [lanes[s.setting] for s in todo]
    for lane, spec in zip(mine, todo, strict=True):
        lane.begin(spec)
    order_of = [lane.setting for lane in lanes.values()]  # every setting of the grid, done or not
    for r in range(1, max(int(s.cfg.train.epochs) for s in todo) + 1):
        order = round_order(seed, r, order_of)
        for position, setting in enumerate(order, 1):
            lane = lanes[setting]
            if lane not in mine or lane.ended or lane.done >= r:
                continue
            lane.turn({"position": position, "order": " ".join(order), "process": process})
        if not cfg.quiet:
            trained = [s for s in order if lanes[s] in mine and lanes[s].last.get("epoch") == r]
            said = [f"{s} {lanes[s].last['train_seconds']:.3f} s" for s in trained]
            say(f"seed {seed}, round {r}: {', '.join(said) or 'nothing trained'}")
    for lane in mine:
        if not lane.ended:  # cannot happen: a run that trained its last epoch has ended
            raise RuntimeError(f"run {lane.spec.name} stopped at epoch {lane.done} of {lane.spec.cfg.train.epochs}")
        finish_line(lane, count)


def stop(lanes) -> None:
    """Stop the workers still running (SIGTERM: a run in its epoch keeps its finished ones) and wait for them."""
    for lane in lanes:
        if lane.process.is_alive():
            lane.process.terminate()
    for lane in lanes:
        if lane.process.pid is not None:
            lane.process.join(timeout=30)
            if lane.process.is_alive():
                lane.process.kill()


def finish_line(lane: Lane, count: dict) -> None:
    """'[4/12] normprop-s1: complete after 4 epochs, test acc 93.33%', as a quiet sweep says it."""
    count["n"] += 1
    manifest = lane.manifest or read_manifest(run_dir(lane.spec.cfg, lane.spec.name)) or {}
    acc = f", {accuracy(lane.last, 2)}" if "test_acc" in lane.last else ""
    print(f"[{count['n']}/{count['of']}] {lane.spec.name}: {manifest.get('status')} after "
          f"{manifest.get('epochs_done')} epochs{acc}", file=sys.stderr, flush=True)  # fmt: skip
