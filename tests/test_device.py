"""Per-process CPU settings (normprop_cli.device.prepare)."""

import subprocess
import sys

import pytest

# Five NIN training steps (NormProp, width 0.25, batch 16, one thread) in a fresh process, after three
# to warm up. With glibc's defaults each step's activations and gradients are fresh pages: 17,000 to
# 23,000 page faults measured here. With prepare's settings the freed blocks are reused: 1 to 1,000.
STEPS = """
import resource, sys, torch
from normprop_cli import device
from normprop_cli.nn import NIN
torch.set_num_threads(1)
device.prepare(torch.device("cpu"))
if not device.keep_freed_memory():
    sys.exit(3)
torch.manual_seed(0)
model = NIN(norm="normprop", width=0.25, num_classes=10, in_channels=3)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
def step():
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(script: str) -> int:
    """The page faults `script` prints, run in a fresh process; a skip where the C library is not glibc
    (the script exits with 3)."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    if done.returncode == 3:
        pytest.skip("the C library is not glibc")
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")


@linux_only
def test_a_training_steps_freed_memory_is_reused_not_faulted_in_again():
    assert page_faults(STEPS) < 5_000


# A 40 MB tensor (a NIN activation at width 1.0, batch 50 is 33-39 MB), made and freed five times in a
# fresh process after ten to warm up (the heap grows over the first five: each new block needs a little
# more than the freed one for its alignment). glibc mmaps every block over 32 MiB at most (its threshold
# cannot be raised past that), so without prepare's settings each comes back as 9,800 fresh pages:
# 39,000 to 49,000 faults measured here; with them, none.
BIG_BLOCKS = """
import resource, sys, torch
from normprop_cli import device
device.prepare(torch.device("cpu"))
if not device.keep_freed_memory():
    sys.exit(3)
for _ in range(10):
    torch.ones(10_000_000)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    torch.ones(10_000_000)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@linux_only
def test_a_block_over_glibcs_mmap_threshold_is_reused_not_faulted_in_again():
    assert page_faults(BIG_BLOCKS) < 2_000


def test_a_cpu_is_described_by_its_model_family_and_vector_instructions(monkeypatch):
    """Training rounds differently on AVX2 and AVX-512, so a run's manifest and a bench name the CPU by
    what tells the generations apart, even where a virtual machine calls every one "AMD EPYC"."""
    import torch

    from normprop_cli import device

    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC\ncpu family\t: 23\nmodel\t\t: 49\nflags\t\t: fpu avx2\n\n"
    cpuinfo += "processor\t: 1\nmodel name\t: other\ncpu family\t: 25\nmodel\t\t: 17\nflags\t\t: avx512_bf16\n"
    monkeypatch.setattr(device.Path, "read_text", lambda self: cpuinfo)
    device._cpu_info.cache_clear()
    try:
        text = device.describe(torch.device("cpu"))
        assert text.startswith("cpu (AMD EPYC, family 23 model 49, ")  # the first processor's
        threads = torch.get_num_threads()
        assert text.endswith(f", {torch.backends.cpu.get_cpu_capability()}, {threads} thread{'s' * (threads != 1)})")
        assert device._cpu_flags() == frozenset({"fpu", "avx2"})
        monkeypatch.setattr(device.Path, "read_text", lambda self: (_ for _ in ()).throw(OSError("no file")))
        device._cpu_info.cache_clear()
        assert "family" not in device.describe(torch.device("cpu")) and device._cpu_flags() is None
    finally:
        device._cpu_info.cache_clear()


def test_deterministic_setup_turns_on_deterministic_algorithms_and_off_autotuning_and_tf32(monkeypatch):
    """`--deterministic` (the config's `deterministic`): torch's deterministic algorithms, cuBLAS's fixed
    workspace, no cuDNN autotuning, no TF32; without it, CUDA's fast settings. CUDA's are flags, set
    here without a GPU; every flag is put back afterwards."""
    import os

    import torch

    from normprop_cli import device

    flags = [
        (torch.backends.cudnn, "benchmark"),
        (torch.backends.cudnn, "deterministic"),
        (torch.backends.cudnn, "allow_tf32"),
        (torch.backends.cuda.matmul, "allow_tf32"),
    ]
    saved = [getattr(o, name) for o, name in flags], torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # put back (unset) afterwards
    calls, real = [], torch.use_deterministic_algorithms
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda mode, **k: calls.append(mode) or real(mode, **k))
    try:
        for kind in ("cuda", "cpu"):
            torch.backends.cudnn.benchmark = torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            device.prepare(torch.device(kind), deterministic=True)
            assert calls[-1] is True and torch.are_deterministic_algorithms_enabled(), kind
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
            assert [getattr(o, name) for o, name in flags] == [False, True, False, False], kind
        device.prepare(torch.device("cuda"))
        assert calls[-1] is False and not torch.are_deterministic_algorithms_enabled()
        assert [getattr(o, name) for o, name in flags] == [True, False, True, True]
    finally:
        for (o, name), value in zip(flags, saved[0], strict=True):
            setattr(o, name, value)
        real(saved[1])
