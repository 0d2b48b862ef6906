"""Every device choice of the project is made here, and only here."""

from __future__ import annotations

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


def prepare(device: torch.device) -> None:
    """Per-process settings for fast, repeatable steps on this device."""
    if device.type == "cpu":
        # Denormal floats can make a CPU step many times slower; flush them to zero.
        torch.set_flush_denormal(True)
    else:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
