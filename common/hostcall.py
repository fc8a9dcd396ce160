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

import math
import time
from typing import Any, Callable, Optional, Sequence

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
    (a primitive parameter). `packed`: the (shape, dtype) of each argument
    leaf when they come as one uint32 array, and `results` the shapes fn
    returns, sent back as one uint32 array (`shapes`)."""

    def __init__(self, fn: Callable, treedef, shapes: Sequence[jax.ShapeDtypeStruct],
                 packed: Optional[Sequence[tuple]] = None,
                 results: Optional[Sequence[jax.ShapeDtypeStruct]] = None):
        self.fn, self.treedef, self.shapes = fn, treedef, tuple(shapes)
        self.packed, self.results = packed, results

    def __call__(self, *flat):
        _last[0] = time.monotonic()
        if self.packed is not None:
            flat = _unpack_host(flat[0], self.packed)
        out = self.fn(*jax.tree.unflatten(self.treedef, flat))
        out = out if isinstance(out, (tuple, list)) else (out,)
        if self.results is None:
            return tuple(np.asarray(o, s.dtype) for o, s in zip(out, self.shapes))
        return (_pack_host([np.asarray(o, s.dtype) for o, s in zip(out, self.results)],
                           self.results),)


# Packing (call(..., pack=True)): every argument leaf, and every result, as
# 32-bit words in one uint32 array. Each operand of a host call is a
# transfer of its own, and on a TPU each cost D4PG's loop 0.13 ms or more
# however small (a profile: docs/accelerator.md), so a call with several
# small operands is cheaper as one. Where the program runs on the host's
# CPU there is no transfer, and packing only adds copies (about 1% of D4PG's
# one-core humanoid loop), so by default a call packs elsewhere only.
def packs_by_default() -> bool:
    """Whether call(pack=None) packs: where the program's devices are not
    the host's CPU (tests replace this to stand for an accelerator)."""
    return jax.default_backend() != "cpu"


def _packable(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype == np.bool_ or (dtype.itemsize <= 4 and dtype.kind in "iuf"
                                 and (dtype.kind != "f" or dtype.itemsize == 4))


def _words(a: jnp.ndarray) -> jnp.ndarray:
    if a.dtype.itemsize == 4 and a.dtype != jnp.bool_:
        return jax.lax.bitcast_convert_type(a, jnp.uint32).reshape(-1)
    return a.astype(jnp.uint32).reshape(-1)  # bool and narrower integers: by value


def _from_words(w, shape, dtype, bitcast):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return (w != 0).reshape(shape)
    if dtype.itemsize == 4:
        return bitcast(w, dtype).reshape(shape)
    return w.astype(dtype).reshape(shape)


def _split(words, specs):
    lead, k = words.shape[:-1], 0
    for shape, dtype in specs:
        n = math.prod(shape)
        yield lead, words[..., k:k + n], shape, dtype
        k += n


def _unpack_host(words: np.ndarray, specs) -> list:
    return [_from_words(w, lead + tuple(shape), dtype, lambda w, d: w.view(d))
            for lead, w, shape, dtype in _split(words, specs)]


def _pack_host(out: list, shapes) -> np.ndarray:
    lead = out[0].shape[:out[0].ndim - len(shapes[0].shape)]
    return np.concatenate([(o.view(np.uint32) if o.dtype.itemsize == 4 and o.dtype != np.bool_
                            else o.astype(np.uint32)).reshape(*lead, -1) for o in out], -1)


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


def call(fn: Callable[..., Any], result_shapes, *args, pack: Optional[bool] = False):
    """fn(*args as numpy pytrees) -> arrays shaped like `result_shapes` (one
    ShapeDtypeStruct or a tuple of them); with leading batch axes under vmap.
    pack: the arguments go to the host as one array and the results come
    back as one (bool, integers and float32 only; the same values, fewer
    transfers): for calls with several small operands made often. None:
    where `packs_by_default()`."""
    single = isinstance(result_shapes, jax.ShapeDtypeStruct)
    shapes = (result_shapes,) if single else tuple(result_shapes)
    flat, treedef = jax.tree.flatten(args)
    flat = [jnp.asarray(a) for a in flat]
    if pack is None:
        pack = packs_by_default()
    if not pack:
        out = host_p.bind(*flat, fn=_Fn(fn, treedef, shapes), lead=())
        return out[0] if single else tuple(out)
    if not all(_packable(a.dtype) for a in flat) or not all(_packable(s.dtype) for s in shapes):
        raise TypeError("hostcall.call(pack=True) takes bool, integer and float32 arrays only")
    words = jnp.concatenate([_words(a) for a in flat]) if flat else jnp.zeros(0, jnp.uint32)
    total = sum(math.prod(s.shape) for s in shapes)
    packed = _Fn(fn, treedef, (jax.ShapeDtypeStruct((total,), jnp.uint32),),
                 packed=[(a.shape, a.dtype) for a in flat], results=shapes)
    back, = host_p.bind(words, fn=packed, lead=())
    out = tuple(_from_words(w, shape, dtype, jax.lax.bitcast_convert_type)
                for _, w, shape, dtype in _split(back, [(s.shape, s.dtype) for s in shapes]))
    return out[0] if single else out
