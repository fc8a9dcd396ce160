"""Many members (seeds, sweep points) in one program, over one or many devices.

A run trains M members at once: `num_seeds` seeds, times the combinations of
a sweep. `compile_members` vmaps an agent's `init(key, hp)` and
`run(state, start_chunk, hooks, member, diverged_at)` over them. When JAX
sees several devices the member axis is sharded across all of them with
`jax.shard_map` on a 1-D mesh (axis "members"): still one program, each
device running its M / D members, the physics host callbacks and the
log/checkpoint callbacks each called by every device with its own shard.
`Gather` puts those shards back together on the host (by global member
index) before anything is logged or saved, so logs and checkpoints look the
same whatever the device count.

Multi-host: `initialize_distributed` starts `jax.distributed` from the
environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID);
the mesh then spans the devices of every process. Each process sees (logs,
checkpoints) only the members on its own devices.

Why several devices cannot deadlock in their host calls: each device's
program calls the host on that device's own thread (a CPU device's XLA
worker thread; on a GPU, the thread serving that device's stream), and no
host function ever waits for a device or for another device's call. The
callbacks take numpy views of the buffers XLA hands them (common/hostcall:
`jax.pure_callback` would first device_put them onto CPU device 0, which on
forced CPU devices is itself busy in a callback: that was the hang); the
physics callback only holds its own lock while MuJoCo steps; `Gather` only
appends a copy under a short lock, and the last shard to arrive runs the
log or checkpoint on the numpy arrays. So every callback returns after a
bounded amount of host work whatever the other devices do. The same holds
on GPUs, where the buffers are copied to the host before the call. A run
that stops calling the host anyway is ended by common/cli.Watchdog.

`estimate_memory` / `check_fits` refuse, before anything compiles, a run
whose states (replay buffers, env states, parameters, optimiser states, ...)
cannot fit: the estimate is read off the agent's own state shapes.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from common.errors import UserError

AXIS = "members"


def initialize_distributed() -> bool:
    """Start jax.distributed when the environment asks for several processes
    (JAX_NUM_PROCESSES > 1); returns whether it did."""
    n = int(os.environ.get("JAX_NUM_PROCESSES", "1") or 1)
    if n <= 1 or jax.distributed.is_initialized():
        return False
    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not address or "JAX_PROCESS_ID" not in os.environ:
        raise UserError("JAX_NUM_PROCESSES > 1 needs JAX_COORDINATOR_ADDRESS (host:port of "
                        "process 0) and JAX_PROCESS_ID (0 .. JAX_NUM_PROCESSES-1) in the "
                        "environment")
    jax.distributed.initialize(coordinator_address=address, num_processes=n,
                               process_id=int(os.environ["JAX_PROCESS_ID"]))
    return True


def make_mesh(members: int, what: str = "--num-seeds") -> Optional[Mesh]:
    """A 1-D mesh over every device when there are several, else None (plain
    vmap on the default device). Refuses a member count the devices cannot
    share evenly; a single member runs on one device."""
    devices = jax.devices()
    if len(devices) == 1 or members == 1:
        return None
    if members % len(devices):
        raise UserError(f"{what} gives {members} members, which {len(devices)} devices cannot "
                        f"share evenly; use a multiple of {len(devices)}, or show JAX fewer "
                        f"devices (CUDA_VISIBLE_DEVICES=..., "
                        f"XLA_FLAGS=--xla_force_host_platform_device_count=...)")
    return Mesh(np.asarray(devices), (AXIS,))


def local_members(mesh: Optional[Mesh], members: int) -> np.ndarray:
    """Global indices of the members on this process's devices."""
    if mesh is None or jax.process_count() == 1:
        return np.arange(members)
    sharding = NamedSharding(mesh, P(AXIS))
    idx = sharding.addressable_devices_indices_map((members,))
    return np.sort(np.concatenate([np.arange(members)[s] for s in idx.values()]))


def put(tree: Any, mesh: Optional[Mesh], members: int = 0,
        local: Optional[np.ndarray] = None) -> Any:
    """Host arrays with a leading member axis -> device arrays sharded on it.
    The host arrays hold every member, or, given the number of `members` and
    this process's (`local_members`), only those, in that order."""
    if mesh is None:
        return jax.tree.map(jnp.asarray, tree)
    sharding = NamedSharding(mesh, P(AXIS))
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)
    row = None if local is None else {int(m): r for r, m in enumerate(local)}

    def shard(x):
        x = np.asarray(x)
        if row is None:
            return jax.make_array_from_callback(np.shape(x), sharding, lambda i: x[i])
        return jax.make_array_from_callback(
            (members,) + x.shape[1:], sharding,
            lambda i: x[[row[m] for m in range(members)[i[0]]]])
    return jax.tree.map(shard, tree)


def check_same(value: int, what: str, fix: str) -> None:
    """Refuse, on every process at once, a run whose processes disagree on
    `value` (a no-op in one process)."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils
    values = np.asarray(multihost_utils.process_allgather(np.int32(value))).reshape(-1).tolist()
    if len(set(values)) > 1:
        each = ", ".join(f"process {k}: {v}" for k, v in enumerate(values))
        raise UserError(f"the processes differ in {what} ({each}); {fix}")


def same_time() -> int:
    """Process 0's clock in whole seconds, on every process: one run's
    directories share one name even when the processes start seconds apart."""
    now = int(time.time())
    if jax.process_count() == 1:
        return now
    from jax.experimental import multihost_utils
    return int(multihost_utils.broadcast_one_to_all(np.int64(now)))


def fetch(tree: Any) -> Any:
    """Device arrays -> numpy on the host (all members, every process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree.map(np.asarray, tree)


def over_members(f: Callable, in_axes=0) -> Callable:
    """jax.vmap(f, in_axes) over the leading member axis, except where that
    axis has length 1 (one seed, the usual run; a device's one member of a
    sharded run): there f runs on the member itself and the axis is put back
    on its results. The results are the same to float rounding, but XLA
    compiles a batch of one slower: on a CPU the off-policy agents' one-seed
    humanoid runs are 1.3 times faster without it (`python
    scripts/benchmark.py train --member-axis`, docs/throughput.md)."""
    batched = jax.vmap(f, in_axes=in_axes)

    def call(*args):
        axes = tuple(in_axes) if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
        sizes = {jnp.shape(x)[0] for a, ax in zip(args, axes) if ax == 0
                 for x in jax.tree.leaves(a)}
        if sizes != {1}:
            return batched(*args)
        one = [jax.tree.map(lambda x: x[0], a) if ax == 0 else a for a, ax in zip(args, axes)]
        return jax.tree.map(lambda x: jnp.expand_dims(x, 0), f(*one))
    return call


def _member_axis(fn: Callable) -> Callable:
    """A hook that expects the member axis (Gather), also for host calls of
    a run over_members traced without it (lead shape ())."""
    def hook(lead, *args):
        if lead:
            return fn(lead, *args)
        return fn((1,), *jax.tree.map(lambda x: np.expand_dims(x, 0), args))
    return hook


def compile_members(train, mesh: Optional[Mesh], hooks=None) -> Tuple[Callable, Callable]:
    """(init(keys, hps) -> states, run(states, start_chunk, members,
    diverged_at=None) -> (states, history)), jitted, vmapped over the leading
    member axis and, with a mesh, sharded over its devices. `hooks`
    (agent.Hooks, or None) are closed over: they are host functions, static
    for jit. `diverged_at` (per member, -1: not diverged; default all -1)
    carries resumed members' divergence over. `run` donates the states
    (replay buffers). A device's single member runs without the vmap
    (over_members)."""
    init = over_members(train.init)
    if hooks is not None:
        hooks = type(hooks)(*map(_member_axis, hooks))

    def run_member(state, start_chunk, member, diverged_at):
        return train.run(state, start_chunk, hooks, member, diverged_at)

    members_run = over_members(run_member, in_axes=(0, None, 0, 0))
    if mesh is not None:
        m = P(AXIS)
        init = jax.shard_map(init, mesh=mesh, in_specs=(m, m), out_specs=m, check_vma=False)
        members_run = jax.shard_map(members_run, mesh=mesh, in_specs=(m, P(), m, m),
                                    out_specs=m, check_vma=False)

    def run(states, start_chunk, members, diverged_at=None):
        if diverged_at is None:
            diverged_at = jnp.full(jnp.shape(members), -1, jnp.int32)
        return members_run(states, start_chunk, members, diverged_at)

    return jax.jit(init), jax.jit(run, donate_argnums=0)


class Gather:
    """Collects per-device shards of one host call (same key: the step or
    chunk) until every expected member has arrived, then calls
    fn(key, members_in_order, tree_with_leading_member_axis) once. Callbacks
    of different devices may arrive concurrently, on other threads."""

    def __init__(self, fn: Callable[[int, np.ndarray, Any], None], members: np.ndarray):
        self.fn, self.expected = fn, len(members)
        self.pending: Dict[int, list] = {}
        self.lock = threading.Lock()

    def __call__(self, key, member, tree) -> None:
        key = int(np.asarray(key).reshape(-1)[0])
        member = np.asarray(member).reshape(-1)
        with self.lock:
            parts = self.pending.setdefault(key, [])
            parts.append((member, jax.tree.map(np.array, tree)))
            if sum(len(m) for m, _ in parts) < self.expected:
                return
            del self.pending[key]
            members = np.concatenate([m for m, _ in parts])
            order = np.argsort(members, kind="stable")
            tree = jax.tree.map(lambda *xs: np.concatenate(xs)[order], *[t for _, t in parts])
            self.fn(key, members[order], tree)


# --------------------------------------------------------------------------- memory

def tree_nbytes(tree: Any) -> int:
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree)))


def available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_limit(device=None) -> Tuple[int, str]:
    """(bytes one device can hold, where): the accelerator's limit, or the
    host's available memory on CPU (shared by all CPU devices)."""
    device = device or jax.devices()[0]
    if device.platform != "cpu":
        limit = (device.memory_stats() or {}).get("bytes_limit")
        if limit:
            return int(limit), f"one {device.platform} device"
    return available_memory(), "the host"


def estimate_memory(train, members: int) -> Dict[str, int]:
    """Bytes of the run's state, read off the agent's state shapes (no
    compilation): per member by part (replay, env states, params and
    optimiser states, rest) and in total for all members."""
    state = jax.eval_shape(train.init, jax.random.PRNGKey(0))
    parts = {"replay": 0, "env states": 0, "params and optimiser": 0, "other": 0}
    fields = state._asdict() if hasattr(state, "_asdict") else {"other": state}
    for name, value in fields.items():
        part = ("replay" if name in ("replay", "rollout") else
                "env states" if name == "env_state" else
                "params and optimiser" if ("params" in name or "opt" in name or "target" in name)
                else "other")
        parts[part] += tree_nbytes(value)
    per_member = sum(parts.values())
    return dict(parts, per_member=per_member, total=per_member * members)


def check_fits(train, members: int, mesh: Optional[Mesh]) -> Dict[str, int]:
    """Refuse, with the estimate and the limit, a run that cannot fit: the
    members of one device against that device's memory (all members against
    host memory when the devices are CPUs)."""
    est = estimate_memory(train, members)
    devices = 1 if mesh is None else mesh.devices.size
    limit, where = device_limit()
    on_one = est["total"] if where == "the host" else -(-members // devices) * est["per_member"]
    if on_one > 0.9 * limit:
        gib = lambda b: f"{b / 2**30:.2f} GiB"
        detail = ", ".join(f"{k} {gib(v)}" for k, v in est.items()
                           if k not in ("per_member", "total") and v)
        raise UserError(f"this run needs about {gib(on_one)} on {where} ({members} member(s) over "
                        f"{devices} device(s), {gib(est['per_member'])} each: {detail}) but only "
                        f"{gib(limit)} is available; lower --buffer-size, --num-envs, --num-seeds "
                        f"or the number of sweep combinations")
    return est
