"""One run, one trainer: a lock file in the run directory while a process trains it.

Two `normprop run` processes on one results directory (two shells, a rerun beside a SLURM array)
must not both train a run. The lock is a file created with O_CREAT|O_EXCL that holds the pid, host
and start time of its holder; it is removed when the run ends, however it ends. A lock left by a
process that died is taken over: on the same host when its pid is gone, on another host when its
file has not been touched for STALE_SECONDS (a holder touches it every HEARTBEAT_SECONDS).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from normprop_cli import io
from normprop_cli.engine.runs import now, say

LOCK = "train.lock"
HEARTBEAT_SECONDS = 60.0
STALE_SECONDS = 15 * 60.0  # a lock of another host untouched this long is a dead process's
WRITING_SECONDS = 10.0  # a lock still without its content after this long was left half-made
POLL_SECONDS = 1.0


@contextlib.contextmanager
def hold(directory: Path, run: str) -> Iterator[None]:
    """Hold run `run`'s lock in `directory` for the block: wait while another live process holds it
    (saying so once), take it over from a dead one (saying so)."""
    path, mine = directory / LOCK, {"pid": os.getpid(), "host": socket.gethostname(), "started": now()}
    said = False
    while not _create(path, mine):
        holder = _read(path)
        if holder is None:  # released between our two looks
            continue
        if _dead(path, holder):
            if _take_over(path, holder):
                say(f"run {run}: its lock was left by {_who(holder)}, which is gone; taking it over")
            continue
        if not said:
            say(f"run {run} is being trained by {_who(holder)}; waiting")
            said = True
        time.sleep(POLL_SECONDS)
    beating = threading.Event()
    heart = threading.Thread(target=_heartbeat, args=(path, beating), daemon=True)
    heart.start()
    try:
        yield
    finally:
        beating.set()
        heart.join()
        if _read(path) == mine:
            path.unlink(missing_ok=True)


def held(directory: Path) -> bool:
    """Does a live process hold the lock of the run in `directory`? False where there is no lock, or
    only a dead process's (`normprop status`: a run stopped by Ctrl-C or a kill is resumable)."""
    path = directory / LOCK
    holder = _read(path)
    return holder is not None and not _dead(path, holder)


def _create(path: Path, content: dict) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError as exc:  # a full disk, a read-only directory: one line, as for any result file
        error = io.write_error(path, exc)
        if error is None:
            raise
        raise error from None
    with os.fdopen(fd, "w") as f:
        json.dump(content, f)
    return True


def _read(path: Path) -> dict | None:
    """The holder of a lock; {} while its content is unreadable (being written); None without a lock."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) and {"pid", "host"} <= holder.keys() else {}


def _who(holder: dict) -> str:
    return f"pid {holder['pid']} on {holder['host']}" if holder else "a process"


def _dead(path: Path, holder: dict) -> bool:
    try:
        idle = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False  # released: the next try creates it
    if not holder:
        return idle > WRITING_SECONDS
    if holder.get("host") != socket.gethostname():
        return idle > STALE_SECONDS
    if holder.get("pid") == os.getpid():  # not us, who are asking: a process of an earlier life of this pid
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: alive
        return False
    return False


def _take_over(path: Path, holder: dict) -> bool:
    """Remove the dead `holder`'s lock, unless another process took it over first; True if removed.
    A guard file makes look-and-remove one step among processes that all found the holder dead."""
    guard = path.with_name(f"{LOCK}.takeover")
    try:
        os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if time.time() - guard.stat().st_mtime > WRITING_SECONDS:  # its maker died within the step
                guard.unlink()
        time.sleep(POLL_SECONDS)
        return False
    try:
        if _read(path) != holder:
            return False
        path.unlink()
        return True
    finally:
        guard.unlink(missing_ok=True)


def _heartbeat(path: Path, stop: threading.Event) -> None:
    """Touch the lock while it is held, so that other hosts see its holder alive."""
    while not stop.wait(HEARTBEAT_SECONDS):
        with contextlib.suppress(OSError):
            os.utime(path)
