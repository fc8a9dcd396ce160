"""Host functions called from inside a compiled program, with numpy arguments.

`call(fn, result_shapes, *args)` is `jax.pure_callback(fn, result_shapes,
*args, vmap_method="broadcast_all")` without one step: `jax.pure_callback`
first `device_put`s every argument onto the first CPU device and the callback
then waits for those copies. On a GPU that device is idle, but when the
devices are CPUs (`--xla_force_host_platform_device_count=N`) it is one of
the devices running the program: its XLA threads are the ones blocked in the
callbacks, so the copies never ran and a sharded run hung (one device's
checkpoint callback waiting for its copy while holding the lock that the
other devices' callbacks queued on, every XLA worker thread taken). Here the
callback gets the argument buffers as numpy arrays, as XLA hands them over,
and touches no JAX device: a callback never waits for any device, so
callbacks of several devices (each called on its own device's thread) cannot
wait for one another. It also saves the copy on every native physics step.

The arrays are views of XLA's buffers, valid during the call only: copy what
outlives it. Under vmap every argument gets the batch axis first (broadcast
where it was unbatched), so `fn` sees the whole batch in one call.

`last_call()` is when any host call last started (a heartbeat for the
watchdog in common/agent.py: a run whose program makes no host call for a
long time is stuck).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import callback as _jax_callback  # op sharding of a callback (inside shard_map)
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

_last = [0.0]


def last_call() -> float:
    """time.monotonic() at the start of the last host call (0: none yet)."""
    return _last[0]


class _Fn:
    """fn with its argument structure and result shapes, hashable by identity
    (a primitive parameter)."""

    def __init__(self, fn: Callable, treedef, shapes: Sequence[jax.ShapeDtypeStruct]):
        self.fn, self.treedef, self.shapes = fn, treedef, tuple(shapes)

    def __call__(self, *flat):
        _last[0] = time.monotonic()
        out = self.fn(*jax.tree.unflatten(self.treedef, flat))
        out = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(np.asarray(o, s.dtype) for o, s in zip(out, self.shapes))


host_p = Primitive("host_call")
host_p.multiple_results = True


@host_p.def_abstract_eval
def _abstract(*avals, fn: _Fn, lead: tuple):
    return [jax.core.ShapedArray(lead + s.shape, s.dtype) for s in fn.shapes]


@host_p.def_impl
def _impl(*args, fn: _Fn, lead: tuple):
    return [jnp.asarray(o) for o in fn(*(np.asarray(a) for a in args))]


def _lowering(ctx, *args, fn: _Fn, lead: tuple):
    sharding = _jax_callback._callback_op_sharding(ctx.module_context.axis_context, None,
                                                   ctx.avals_out)
    result, _, _ = mlir.emit_python_callback(
        ctx, fn, None, list(args), ctx.avals_in, ctx.avals_out, has_side_effect=False,
        returns_token=False, sharding=sharding)
    return result


mlir.register_lowering(host_p, _lowering, cacheable=False)


def _batch(args, dims, *, fn: _Fn, lead: tuple):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    moved = [jnp.broadcast_to(a, (size,) + a.shape) if d is None
             else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    return host_p.bind(*moved, fn=fn, lead=(size,) + lead), [0] * len(fn.shapes)


batching.primitive_batchers[host_p] = _batch


def call(fn: Callable[..., Any], result_shapes, *args):
    """fn(*args as numpy pytrees) -> arrays shaped like `result_shapes` (one
    ShapeDtypeStruct or a tuple of them); with leading batch axes under vmap."""
    single = isinstance(result_shapes, jax.ShapeDtypeStruct)
    shapes = (result_shapes,) if single else tuple(result_shapes)
    flat, treedef = jax.tree.flatten(args)
    out = host_p.bind(*(jnp.asarray(a) for a in flat), fn=_Fn(fn, treedef, shapes), lead=())
    return out[0] if single else tuple(out)
