"""A grid's runs as submitit jobs, one job per run (engine.parallel.train_in_worker):

- `--launcher local`: submitit's LocalExecutor, `--jobs N` jobs at a time on this machine; waits
  for them, so that the experiment's runner then writes its summary as usual.
- `--launcher slurm`: one SLURM job array, settings in conf/launcher/slurm.yaml; returns after
  submission. Running the same command again submits only the runs that are neither complete,
  diverged, nor still queued or running, and once all are complete writes the summary.

A job that SLURM stops at its time limit or preempts is requeued by submitit (RunTask is
Checkpointable) and resumes from the checkpoint of its run's last finished epoch; a job killed
outright resumes the same way when it is submitted again. submitit's files, and which job each
run was submitted as, are in <results_dir>/.submitit/.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

import submitit
import torch
from omegaconf import DictConfig, OmegaConf
from submitit.core.utils import FailedJobError, FailedSubmissionError

from normprop_cli import device as devices
from normprop_cli import hints, io
from normprop_cli.engine import parallel
from normprop_cli.engine.progress import QuietProgress
from normprop_cli.engine.runs import RunSpec, record_path, submitit_folder, submitted
from normprop_cli.errors import UserError, first_line

# sacct states of a job that SLURM may still run
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"}


class RunTask(submitit.helpers.Checkpointable):
    """One run as a submitit job. On a time limit or a preemption, Checkpointable's `checkpoint`
    resubmits this same call: the run's per-epoch checkpoint is all the state there is."""

    def __init__(self, observers: parallel.Observers, threads: int | None = None, device: str | None = None):
        self.observers, self.threads, self.device = observers, threads, device

    def __call__(self, run: dict) -> tuple[dict, dict | None]:
        return parallel.train_in_worker([(run, self.observers)], self.device, self.threads)[0]


def status_command(cfg: DictConfig) -> str:
    seeds = [f"seeds={cfg.seeds}"] + ([f"seed={cfg.seed}"] if int(cfg.seed) else [])
    return hints.of(cfg, "status", cfg.experiment.name, extra=seeds)


def run_local(cfg: DictConfig, todo: Sequence[RunSpec], observers: parallel.Observers, progress: QuietProgress) -> None:
    """One LocalExecutor job per run, `jobs` at a time, each on its slot's device; wait for all."""
    slots = min(int(cfg.jobs), len(todo))
    executor = submitit.LocalExecutor(folder=submitit_folder(cfg))
    gpus = _visible_gpus()
    executor.update_parameters(timeout_min=int(cfg.launcher.timeout_min), gpus_per_node=len(gpus), visible_gpus=gpus)
    threads, device = parallel.worker_threads(slots), devices.for_workers(cfg.device, slots)
    waiting, running, lost = list(todo), {}, []
    try:
        while waiting or running:
            for k in range(slots):
                if k not in running and waiting:
                    spec = waiting.pop(0)
                    task = RunTask(observers, threads, device[k])
                    running[k] = spec, executor.submit(task, parallel.plain(spec))
            for k, (spec, job) in list(running.items()):
                if job.done():
                    del running[k]
                    result = _result(spec, job)
                    if result:
                        parallel.report(progress, spec, *result)
                    else:
                        lost.append(spec)
            time.sleep(0.2)
    except KeyboardInterrupt:
        _cancel(running)
        unfinished = [spec for spec, _ in running.values()] + waiting + lost
        parallel.stop_unfinished(unfinished, "interrupted", 130)
    except BaseException:
        _cancel(running)
        raise
    if lost:
        why = f"{len(lost)} job(s) stopped before their run finished (logs in {submitit_folder(cfg)})"
        parallel.stop_unfinished(lost, why, 1)


def submit_slurm(cfg: DictConfig, todo: Sequence[RunSpec], observers: parallel.Observers) -> None:
    """Submit the runs of `todo` that no SLURM job is working on as one job array; then exit."""
    record = submitted(cfg)
    busy = _active({record[s.name] for s in todo if s.name in record}, cfg)
    submit = [s for s in todo if record.get(s.name) not in busy]
    if submit:
        task = RunTask(observers, threads=cfg.launcher.cpus_per_task)
        try:
            jobs = _slurm_executor(cfg).map_array(task, [parallel.plain(s) for s in submit])
        except (FailedJobError, FailedSubmissionError) as exc:
            raise UserError(f"sbatch refused the job array: {first_line(exc)}") from None
        record |= {s.name: job.job_id for s, job in zip(submit, jobs, strict=True)}
        io.write_json(record_path(cfg), record)
        array = jobs[0].job_id.split("_")[0]
        print(f"submitted {len(submit)} run(s) as SLURM job {array} (logs in {submitit_folder(cfg)})")
    if len(submit) < len(todo):
        ids = ", ".join(sorted({j.split("_")[0] for j in busy}))
        print(f"{len(todo) - len(submit)} run(s) still queued or running in SLURM job(s) {ids}: not submitted again")
    print(f"watch them: {status_command(cfg)}")
    print("once every run is complete, run this command again: it writes summary.csv and the figures")
    sys.exit(0)


def _slurm_executor(cfg: DictConfig) -> submitit.SlurmExecutor:
    launcher = cfg.launcher
    try:
        executor = submitit.SlurmExecutor(folder=submitit_folder(cfg), max_num_timeout=int(launcher.max_requeues))
    except RuntimeError:  # no srun on PATH
        raise UserError(
            "--launcher slurm needs SLURM (srun and sbatch on PATH): run it on the cluster's "
            "login node, or use --launcher local"
        ) from None
    optional = {
        "partition": launcher.partition,
        "account": launcher.account,
        "qos": launcher.qos,
        "gpus_per_node": launcher.gpus_per_task or None,  # one task per job
        "cpus_per_task": launcher.cpus_per_task,
        "mem": f"{launcher.mem_gb}GB" if launcher.mem_gb else None,
    }
    try:
        executor.update_parameters(
            job_name=f"normprop-{cfg.experiment.name}",
            time=int(launcher.timeout_min),
            array_parallelism=int(launcher.array_parallelism),
            setup=list(launcher.setup),
            additional_parameters=OmegaConf.to_container(launcher.additional),
            **{k: v for k, v in optional.items() if v is not None},
        )
    except (ValueError, TypeError) as exc:
        raise UserError(f"bad launcher setting ({first_line(exc)}); see conf/launcher/slurm.yaml") from None
    return executor


def _active(job_ids: set[str], cfg: DictConfig) -> set[str]:
    """The jobs among `job_ids` that SLURM still has queued or running (submitit asks sacct)."""
    jobs = [submitit.SlurmJob(folder=submitit_folder(cfg), job_id=j) for j in sorted(job_ids)]
    return {j.job_id for j in jobs if j.state.split(" ")[0].upper() in ACTIVE}


def _result(spec: RunSpec, job) -> tuple[dict, dict | None] | None:
    """A finished job's (manifest, last row), or None when it stopped before its run finished
    (killed, or out of time more than max_num_timeout times); a failure as a one-line error."""
    if not job.paths.result_pickle.exists():  # killed: no result, not even an error
        return None
    try:
        return job.result()
    except FailedJobError as exc:
        parts = str(exc).split("-" * 22 + "\n")  # submitit puts the job's traceback between rulers
        last = (parts[1] if len(parts) > 2 else str(exc)).strip().splitlines()[-1]
        user = "normprop_cli.errors.UserError: "
        if last.startswith(user):
            raise UserError(last.removeprefix(user)) from None
        if last.startswith("submitit.core.utils.UncompletedJobError"):
            return None
        raise UserError(f"run {spec.name} failed: {last} (its log: {job.paths.stderr})") from None


def _cancel(running: dict) -> None:
    for _, job in running.values():
        job.cancel(check=False)


def _visible_gpus() -> tuple[int, ...]:
    """The GPUs this process sees, for LocalExecutor, which sets the jobs' CUDA_VISIBLE_DEVICES."""
    count = torch.cuda.device_count()
    mask = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if mask and all(g.isdigit() for g in mask):
        return tuple(int(g) for g in mask[:count])
    return tuple(range(count))
