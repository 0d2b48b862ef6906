"""A plan's tasks as submitit jobs, one job per task (engine.executor.train_task): the `Submitit` executor.

- `--launcher local`: submitit's LocalExecutor, `--jobs N` jobs at a time on this machine (a thread pool
  holds that many jobs in flight); waits for them, so that the experiment then writes its tables as usual.
- `--launcher slurm`: one SLURM job array, settings in conf/launcher/slurm.yaml; exits after submission.
  Running the same command again submits only the tasks whose runs are neither complete, diverged, nor
  still queued or running, and once all are complete writes the tables.

A job that SLURM stops at its time limit or preempts is requeued by submitit (RunTask is Checkpointable) and
resumes from the checkpoint of its runs' last finished epoch; a job killed outright resumes the same way when
it is submitted again. submitit's files, and which job each run was submitted as, are in <results_dir>/.submitit/.
"""

from __future__ import annotations

import os
import queue
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import submitit
import torch
from omegaconf import DictConfig, OmegaConf
from submitit.core.utils import FailedJobError, FailedSubmissionError

from normprop_cli import device as devices
from normprop_cli import hints, io
from normprop_cli.engine.executor import Payload, Results, check_here, collect, payload, stop_unfinished, train_task
from normprop_cli.engine.executor import worker_threads as share
from normprop_cli.engine.plan import Plan, Task
from normprop_cli.engine.runs import record_path, submitit_folder, submitted
from normprop_cli.errors import UserError, first_line

# sacct states of a job that SLURM may still run
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"}


class RunTask(submitit.helpers.Checkpointable):
    """One task as a submitit job. On a time limit or a preemption, Checkpointable's `checkpoint` resubmits
    this same call: the runs' per-epoch checkpoints are all the state there is."""

    def __init__(self, threads: int | None = None, device: str | None = None):
        self.threads, self.device = threads, device

    def __call__(self, runs: Payload) -> Results:
        return train_task(runs, self.threads, self.device)


def status_command(cfg: DictConfig) -> str:
    seeds = [f"seeds={cfg.seeds}"] + ([f"seed={cfg.seed}"] if int(cfg.seed) else [])
    return hints.of(cfg, "status", cfg.experiment.name, extra=seeds)


class Submitit:
    """`launcher: local` or `slurm` (module docstring); `jobs`: local jobs at a time."""

    live = False

    def __init__(self, cfg: DictConfig, jobs: int) -> None:
        self.cfg, self.jobs, self.slurm = cfg, jobs, cfg.launcher.name == "slurm"
        # The jobs of a SLURM array pick their device on their node; a login node may have no GPU.
        self.devices = None if self.slurm else devices.for_workers(cfg.device, jobs)

    def threads(self, cfg: DictConfig) -> int:
        return int(cfg.launcher.cpus_per_task) if self.slurm else share(self.jobs)

    def submit(self, plan: Plan) -> None:
        check_here(plan, torch.device("cpu"))
        if self.slurm:
            self._submit_slurm(plan)
        else:
            self._run_local(plan)

    def close(self) -> None:
        pass

    def _run_local(self, plan: Plan) -> None:
        """One LocalExecutor job per task, `jobs` at a time, each on its slot's device; wait for all."""
        folder = submitit_folder(self.cfg)
        executor = submitit.LocalExecutor(folder=folder)
        gpus = _visible_gpus()
        executor.update_parameters(timeout_min=int(self.cfg.launcher.timeout_min), gpus_per_node=len(gpus),
                                   visible_gpus=gpus)  # fmt: skip
        slots, jobs = queue.Queue(), []
        for device in self.devices:
            slots.put(device)

        def one(task: Task):
            device = slots.get()
            try:
                job = executor.submit(RunTask(task.threads, device), payload(task))
                jobs.append(job)
                job.wait()
                return job
            finally:
                slots.put(device)

        waiting = ThreadPoolExecutor(max_workers=min(self.jobs, len(plan.tasks)), thread_name_prefix="submitit")

        def stop() -> None:
            waiting.shutdown(wait=False, cancel_futures=True)
            for job in list(jobs):
                job.cancel(check=False)

        futures = {waiting.submit(one, t): t for t in plan.tasks}
        lost = collect(futures, _local_result, stop)
        waiting.shutdown(wait=True)
        if lost:
            why = f"{len(lost)} job(s) stopped before their runs finished (logs in {folder})"
            stop_unfinished([s for t in lost for s in t.specs], why, 1)

    def _submit_slurm(self, plan: Plan) -> None:
        """Submit the tasks that no SLURM job is working on as one job array; then exit."""
        records = {i: submitted(stage.cfg) for i, stage in enumerate(plan.stages)}
        ids = {records[m.stage].get(m.spec.name) for t in plan.tasks for m in t.members}
        busy = _active({j for j in ids if j}, self.cfg)
        submit = [t for t in plan.tasks if not any(records[m.stage].get(m.spec.name) in busy for m in t.members)]
        if submit:
            try:
                jobs = _slurm_executor(self.cfg).map_array(RunTask(threads=self.cfg.launcher.cpus_per_task),
                                                            [payload(t) for t in submit])  # fmt: skip
            except (FailedJobError, FailedSubmissionError) as exc:
                raise UserError(f"sbatch refused the job array: {first_line(exc)}") from None
            for task, job in zip(submit, jobs, strict=True):
                for m in task.members:
                    records[m.stage][m.spec.name] = job.job_id
            for i, stage in enumerate(plan.stages):
                io.write_json(record_path(stage.cfg), records[i])
            array, runs = jobs[0].job_id.split("_")[0], sum(len(t.members) for t in submit)
            what = f"{runs} run(s)" + (f" in {len(submit)} job(s)" if runs > len(submit) else "")
            print(f"submitted {what} as SLURM job {array} (logs in {submitit_folder(self.cfg)})")
        if len(submit) < len(plan.tasks):
            ids = ", ".join(sorted({j.split("_")[0] for j in busy}))
            left = sum(len(t.members) for t in plan.tasks) - sum(len(t.members) for t in submit)
            print(f"{left} run(s) still queued or running in SLURM job(s) {ids}: not submitted again")
        for stage in plan.stages:
            print(f"watch them: {status_command(stage.cfg)}")
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


def _local_result(future: Future, task: Task) -> Results | None:
    """A finished job's results, or None when it stopped before its runs finished (killed, or out of time
    more than max_num_timeout times); a failure as a one-line error."""
    job = future.result()
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
        raise UserError(f"run {task.leader.spec.name} failed: {last} (its log: {job.paths.stderr})") from None


def _visible_gpus() -> tuple[int, ...]:
    """The GPUs this process sees, for LocalExecutor, which sets the jobs' CUDA_VISIBLE_DEVICES."""
    count = torch.cuda.device_count()
    mask = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if mask and all(g.isdigit() for g in mask):
        return tuple(int(g) for g in mask[:count])
    return tuple(range(count))
