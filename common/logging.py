"""Live logs from inside the compiled run.

`host_call` sends arrays to a Python function once per execution for the
whole vmapped batch (seeds, sweep members), as numpy arrays (common/hostcall):
JAX's debug callbacks would call it once per batch element instead. Sharded
over several devices, each device calls it with its own shard
(common/parallel.Gather reassembles them). The
returned int32 token must be consumed (added to a counter in the carry) so
XLA keeps the call.

`RunLogger` writes TensorBoard event files (tensorboardX), one stream per
seed (or sweep member, its stream named and tagged with its hyperparameter
values) under runs/<env>__<algo>__<seed>__<time>/, saves the resolved config
beside them, and draws a console progress bar.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from common import hostcall


def host_call(fn: Callable[..., None], *args, pack: Optional[bool] = False) -> jnp.ndarray:
    """Run fn(lead_shape, *numpy_args) on the host; returns a token (0).
    pack: hostcall.call's (for small arguments)."""
    probe = jnp.zeros((), jnp.int32)

    def host(probe, *a):
        fn(probe.shape, *a)
        return np.zeros(probe.shape, np.int32)

    return hostcall.call(host, jax.ShapeDtypeStruct((), jnp.int32), probe, *args, pack=pack)


def run_name(env: str, algo: str, seed: int, stamp: int) -> str:
    """A run's directory name; `stamp`: the start's unix time (parallel.same_time)."""
    return f"{env}__{algo}__{seed}__{stamp}"


class RunLogger:
    """Receives per-chunk metrics of all seeds; one TensorBoard stream each.

    seeds: one entry per stream: a seed (stream `seed_<s>`) or a stream name.
    tags: optional {name: value} per stream, written as its `hparams` text
    and saved in members.json."""

    def __init__(self, run_dir: str, config: Any, total_steps: int, seeds: list,
                 quiet: bool = False, tags: Optional[list] = None):
        from tensorboardX import SummaryWriter
        self.run_dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(config), f, indent=2, sort_keys=True)
        names = [s if isinstance(s, str) else f"seed_{s}" for s in seeds]
        self.writers = [SummaryWriter(os.path.join(run_dir, n)) for n in names]
        if tags is not None:
            for w, t in zip(self.writers, tags):
                w.add_text("hparams", ", ".join(f"{k}={v}" for k, v in t.items()), 0)
            with open(os.path.join(run_dir, "members.json"), "w") as f:
                json.dump([dict(stream=n, **t) for n, t in zip(names, tags)], f, indent=2)
        self.total_steps = total_steps
        self.quiet = quiet
        self.busy = threading.Lock()  # held by each log write and checkpoint save (cli.Interrupt)
        self.start = time.time()
        self.start_step: Optional[int] = None
        self.last_return = float("nan")
        self.last_eval = float("nan")

    def write(self, step: int, metrics: Dict[str, np.ndarray]) -> None:
        """metrics: name -> array of shape [num_seeds] (NaN: nothing to log)."""
        if self.start_step is None:
            self.start_step = step
            self.start = time.time()
        elapsed = max(time.time() - self.start, 1e-9)
        sps = (step - self.start_step) / elapsed
        for i, w in enumerate(self.writers):
            for name, values in metrics.items():
                v = float(np.asarray(values).reshape(-1)[i])
                if np.isfinite(v):
                    w.add_scalar(name, v, step)
            w.add_scalar("charts/sps", sps, step)
            if np.isfinite(metrics.get("eval/episode_return", np.nan)).any():
                w.flush()  # evaluations are rare: a killed run keeps every one of them
        for name, attr in (("charts/episode_return", "last_return"),
                           ("eval/episode_return", "last_eval")):
            if name in metrics and np.isfinite(np.asarray(metrics[name])).any():
                setattr(self, attr, float(np.nanmean(metrics[name])))
        if not self.quiet:
            frac = min(step / max(self.total_steps, 1), 1.0)
            bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
            diverged = int(np.isfinite(metrics.get("stats/diverged_at", np.nan)).sum())
            sys.stdout.write(f"\r[{bar}] {step:>9d}/{self.total_steps} steps  {sps:7.0f} steps/s  "
                             f"return {self.last_return:8.1f}  eval {self.last_eval:8.1f}"
                             + (f"  diverged {diverged}/{len(self.writers)}" if diverged else ""))
            sys.stdout.flush()

    def close(self) -> None:
        for w in self.writers:
            w.flush()
            w.close()
        if not self.quiet:
            sys.stdout.write("\n")
