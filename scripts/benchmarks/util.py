"""What the benchmark modules share: paths, timers, the machine and the commit."""
from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import time
from typing import Callable, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")
ENTRY = os.path.join(SCRIPTS, "benchmark.py")  # the command line, started as a subprocess

JOBS = 2  # runs at a time, each pinned to its own core (learn, standard, full)


def tool(name: str):
    """A user tool of scripts/ (plot, export, ...) as a module."""
    if SCRIPTS not in sys.path:
        sys.path.insert(0, SCRIPTS)
    return importlib.import_module(name)


def device_line() -> str:
    """The default JAX device, how many there are, and the host's cores."""
    import jax
    d = jax.devices()[0]
    return f"{d.platform} {d.device_kind} ({jax.device_count()} device(s)), {os.cpu_count()} cores"


def median(xs: List[float]) -> float:
    import numpy as np
    return float(np.median(xs)) if xs else float("nan")


def timed(fn: Callable[[], None], times: int = 1) -> float:
    return timed_cpu(fn, times)[0]


def timed_cpu(fn: Callable[[], None], times: int = 1) -> Tuple[float, float]:
    """Wall-clock and process CPU seconds (all threads) of `times` calls."""
    t, c = time.perf_counter(), time.process_time()
    for _ in range(times):
        fn()
    return time.perf_counter() - t, time.process_time() - c


def calls_for(fn: Callable[[], None], min_time: float) -> int:
    """How many calls of a warmed-up `fn` take about `min_time` seconds."""
    return max(1, math.ceil(min_time / max(timed(fn), 1e-9)))


def cpu_model(default: str) -> str:
    """The CPU's model name from /proc/cpuinfo, else `default`."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        return default


def machine() -> str:
    """The machine line of a result file: cores and CPU model."""
    return f"{os.cpu_count()} cores, {cpu_model('unknown CPU')}"


def write_json(path: str, obj) -> None:
    """Write `obj` to `path` atomically (a half-written file never replaces a good one)."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


def git_commit(mark_dirty: bool = True) -> str:
    """The short commit of the checkout; with `mark_dirty`, a note when
    tracked files have uncommitted changes."""
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                       cwd=ROOT)
    commit = r.stdout.strip() or "unknown"
    if not mark_dirty:
        return commit
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, cwd=ROOT)
    return commit + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
