"""Every device choice of the project is made here, and only here."""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
import sys
from pathlib import Path

import torch

from normprop_cli.errors import UserError


def resolve(name: str = "auto") -> torch.device:
    """`auto` picks CUDA when there is a GPU, else the CPU; `cuda` without one is a UserError."""
    name = str(name).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device '{name}'; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name} asked for, but this machine has no CUDA GPU; use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) visible")
    elif device.type != "cpu":
        raise UserError(f"unsupported device '{name}'; use auto, cpu, cuda or cuda:N")
    return device


def for_workers(name: str, workers: int) -> list[str]:
    """Each worker's device: a GPU of its own when several are visible and none was named."""
    device = resolve(name)
    gpus = torch.cuda.device_count() if device.type == "cuda" and device.index is None else 0
    return [str(resolve(f"cuda:{k % gpus}")) if gpus > 1 else str(device) for k in range(workers)]


def worker_context() -> multiprocessing.context.BaseContext:
    """How a worker process is started (the runs' pool, timing's lanes): 'forkserver', which forks each
    worker from one server process that has imported torch, so a worker starts without the seconds an
    import of torch takes; like 'spawn', and unlike a fork of the parent, safe with CUDA, as the server
    touches no device. 'spawn' where the platform has no forkserver."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "pandas", "omegaconf"])
    return context


# cuBLAS's setting for deterministic results (its docs, "Results reproducibility"; torch's reproducibility
# notes): a fixed workspace per stream, read when cuBLAS starts, before the first matrix product.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def prepare(device: torch.device, deterministic: bool = False) -> None:
    """Per-process settings for fast, repeatable steps on this device. `deterministic` (`--deterministic`,
    the config's `deterministic`): torch's deterministic algorithms (an operation without one is an error),
    CUBLAS_WORKSPACE_CONFIG, no cuDNN autotuning and no TF32 (float32 products in full float32)."""
    if device.type == "cpu":
        # Denormal floats can make a CPU step many times slower; flush them to zero.
        torch.set_flush_denormal(True)
        keep_freed_memory()
    else:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if deterministic:  # on any device: the flags are process-wide
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = deterministic
    # set only where it differs: setting it imports torch._inductor, which would lengthen every process's start
    mode = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    if mode != (deterministic, False):
        torch.use_deterministic_algorithms(deterministic)


# glibc's malloc gives blocks of over 128 KiB back to the kernel when they are freed (mmap, then munmap;
# the top of the heap trimmed past 128 KiB free), so a CPU step's activations and gradients come back
# as fresh pages that the kernel must fault in and zero, every step (thousands of page faults a step;
# docs/performance.md has the measurements). The settings below take every block from the heap (no
# mmap: glibc cannot raise its mmap threshold past 32 MiB, and at width 1.0, batch 50 the first layers'
# maps are 33-39 MB), trim the heap only past 1 GiB free and grow it 16 MiB at a time: a process keeps
# up to 1 GiB of freed memory.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # mallopt's parameter numbers (malloc.h)
MALLOC_SETTINGS = {M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 16 << 20, M_MMAP_MAX: 0}


@functools.cache
def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse (MALLOC_SETTINGS); False where the C library
    is not glibc (no mallopt) or refuses a setting."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in MALLOC_SETTINGS.items())


# /proc/cpuinfo flags of CPUs with bfloat16 arithmetic: AMX tiles (Intel Sapphire Rapids on)
# and AVX512-BF16 (Intel Cooper Lake on, AMD Zen 4 on), which oneDNN's bf16 convolutions use.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def bf16_supported(device: torch.device) -> tuple[bool, str]:
    """Whether `device` computes in bfloat16 natively, and why (or why not), in a few words.

    CUDA: compute capability 8.0 or more (Ampere on: bf16 tensor cores). The CPU: a flag of
    CPU_BF16_FLAGS in /proc/cpuinfo. torch's own checks do not answer this: the ATen CPU
    capability stops at "AVX512" whether or not the CPU has AVX512-BF16 or AMX, and oneDNN's
    bf16 check accepts any AVX512-BW CPU, where it emulates bfloat16 in float32, slower than
    float32 itself.
    """
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        if (major, minor) >= (8, 0):
            return True, f"{name}: compute capability {major}.{minor}, bf16 tensor cores"
        return False, f"{name}: compute capability {major}.{minor} < 8.0, no bf16 tensor cores"
    flags = _cpu_flags()
    if flags is None:
        return False, "no /proc/cpuinfo to read the CPU's bf16 flags from"
    found = [f for f in CPU_BF16_FLAGS if f in flags]
    if found:
        return True, f"CPU flags {', '.join(found)}"
    return False, f"the CPU has none of the flags {', '.join(CPU_BF16_FLAGS)}: bf16 would be emulated"


@functools.cache
def _cpu_info() -> dict[str, str] | None:
    """The first processor's fields in /proc/cpuinfo (Linux: "model name", "cpu family", "flags", ...), or None."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    info = {}
    for line in text.splitlines():
        if not line.strip():
            if info:
                break  # the first processor's block ends
            continue
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return info


def _cpu_flags() -> frozenset[str] | None:
    """The first processor's flags in /proc/cpuinfo (Linux), or None."""
    info = _cpu_info()
    return None if info is None else frozenset(info.get("flags", "").split())


def describe(device: torch.device) -> str:
    """The device in a few words, for manifests and benches. A CPU's: its model, its family and model
    numbers (a virtual machine's model name may be only "AMD EPYC": family 23 model 49 is a Zen 2, 25 a
    Zen 3 or 4), the vector instructions torch's kernels use here (`get_cpu_capability`) and the threads.
    The CPU matters to the numbers: the same float32 training rounds differently on AVX2 and AVX-512."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    import platform

    info = _cpu_info() or {}
    parts = [info.get("model name") or platform.processor() or platform.machine()]
    if "cpu family" in info and "model" in info:
        parts.append(f"family {info['cpu family']} model {info['model']}")
    threads = torch.get_num_threads()
    parts += [torch.backends.cpu.get_cpu_capability(), f"{threads} thread{'s' if threads != 1 else ''}"]
    return f"cpu ({', '.join(parts)})"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
