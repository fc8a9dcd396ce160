"""Native backend: MuJoCo C, stepped on a thread pool from inside jax.jit.

One `jax.pure_callback` per control step carries the whole batch (nested vmap
over seeds and envs still makes one call). The host side is MuJoCo's own
`mujoco.batch.Batch`: it loads each simulation's state row, runs the substeps
and an mj_step1-equivalent stage with the GIL released on `nthread` threads,
and copies out the fields the task reads. Results are bit-identical to one
MjData per env, so trajectories match dm_control's exactly.

The physics state lives in JAX as the float64 state row viewed as uint32
pairs (x64 stays off): rounding it to float32 between steps would drift.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from mujoco import batch as mjbatch

S = mujoco.mjtState
# What is carried between steps: the full physics state plus the solver's
# warm start (needed for bitwise reproducibility). Controls are the action;
# applied forces stay zero.
CARRIED = (S.mjSTATE_TIME, S.mjSTATE_QPOS, S.mjSTATE_QVEL, S.mjSTATE_ACT, S.mjSTATE_HISTORY,
           S.mjSTATE_WARMSTART, S.mjSTATE_MOCAP_POS, S.mjSTATE_MOCAP_QUAT,
           S.mjSTATE_USERDATA, S.mjSTATE_PLUGIN)
CARRIED_SPEC = int(sum(int(c) for c in CARRIED))
BAD_WARNINGS = (mujoco.mjtWarning.mjWARN_BADQPOS, mujoco.mjtWarning.mjWARN_BADQVEL,
                mujoco.mjtWarning.mjWARN_BADQACC)


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def encode(state64: np.ndarray) -> np.ndarray:
    """float64 rows -> uint32 pairs (bit-exact)."""
    return np.ascontiguousarray(state64, np.float64).view(np.uint32)


def decode(bits: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(bits, np.uint32).view(np.float64)


def bits_to_float32(bits: jnp.ndarray) -> jnp.ndarray:
    """Decode float64 bit pairs (little-endian lo, hi) to float32 inside JAX."""
    lo = bits[..., 0::2]
    hi = bits[..., 1::2]
    sign = jnp.where((hi >> 31) == 1, -1.0, 1.0).astype(jnp.float32)
    exp = ((hi >> 20) & 0x7FF).astype(jnp.int32)
    mant = 1.0 + (hi & 0xFFFFF).astype(jnp.float32) * (2.0 ** -20) \
        + lo.astype(jnp.float32) * (2.0 ** -52)
    val = jnp.ldexp(mant, exp - 1023)
    val = jnp.where(exp == 0, 0.0, val)
    val = jnp.where(exp == 0x7FF, jnp.where((hi & 0xFFFFF) | lo, jnp.nan, jnp.inf), val)
    return sign * val


def float32_to_bits(x: jnp.ndarray) -> jnp.ndarray:
    """Encode float32 values as float64 bit pairs inside JAX (exact)."""
    x = jnp.asarray(x, jnp.float32)
    b = jax.lax.bitcast_convert_type(x, jnp.uint32)
    sign = b >> 31
    exp = ((b >> 23) & 0xFF).astype(jnp.uint32)
    man = b & 0x7FFFFF
    normal = (exp != 0) & (exp != 0xFF)
    exp64 = jnp.where(exp == 0xFF, 0x7FF, exp + (1023 - 127)).astype(jnp.uint32)
    hi = (sign << 31) | (exp64 << 20) | (man >> 3)
    lo = (man & 0x7) << 29
    zero = exp == 0  # zeros (denormals flush to zero)
    hi = jnp.where(zero, sign << 31, hi)
    lo = jnp.where(zero | ~normal & (exp != 0xFF), 0, lo)
    return jnp.stack([lo, hi], axis=-1).reshape(*x.shape[:-1], 2 * x.shape[-1])


class NativePhysics:
    """Host-side stepping of any number of envs of one model."""

    def __init__(self, model: mujoco.MjModel, n_sub_steps: int, fields: Sequence[str],
                 nthread: int | None = None):
        self.model = model
        self.n_sub_steps = int(n_sub_steps)
        self.fields = tuple(fields)
        self.nthread = nthread or default_threads()
        self._batches: Dict[Tuple[int, bool], mjbatch.Batch] = {}
        self._lock = threading.Lock()
        probe = mjbatch.Batch(model, 1, nthread=1)
        cols = []
        for c in CARRIED:
            off, size = probe._component(c)
            cols.extend(range(off, off + size))
        self.cols = np.asarray(cols)
        self.nstate = len(cols)
        self.ctrl_cols = slice(*(lambda o, s: (o, o + s))(*probe._component(S.mjSTATE_CTRL)))
        data = mujoco.MjData(model)
        self.field_shapes = {f: np.shape(getattr(data, f)) for f in self.fields}
        self.field_sizes = {f: int(np.prod(s)) for f, s in self.field_shapes.items()}
        self.nfield = sum(self.field_sizes.values())
        # dm_control runs mj_forward with actuation disabled after a reset.
        m2 = copy_model(model)
        m2.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_ACTUATION
        self.forward_model = m2

    # -- host side ---------------------------------------------------------
    def _batch(self, n: int, forward: bool) -> mjbatch.Batch:
        key = (n, forward)
        if key not in self._batches:
            model = self.forward_model if forward else self.model
            b = mjbatch.Batch(model, n, nthread=min(self.nthread, n))
            for f in self.fields:  # outputs are copied only once bound
                b.bind(f)
            self._batches[key] = b
        return self._batches[key]

    def _collect(self, b: mjbatch.Batch, n: int) -> np.ndarray:
        out = np.empty((n, self.nfield), np.float32)
        k = 0
        for f in self.fields:
            size = self.field_sizes[f]
            out[:, k:k + size] = b.bind(f).reshape(n, size)
            k += size
        return out

    @staticmethod
    def _warnings(b: mjbatch.Batch) -> np.ndarray:
        # warning rows are (lastinfo, number) per mjtWarning
        return b.warning[:, [int(w) for w in BAD_WARNINGS], 1].copy()

    def _bad(self, b: mjbatch.Batch, before: np.ndarray, state: np.ndarray) -> np.ndarray:
        counts = self._warnings(b)
        return (counts != before).any(-1) | ~np.isfinite(state).all(-1)

    def host_step(self, bits: np.ndarray, action: np.ndarray):
        lead = bits.shape[:-1]
        n = int(np.prod(lead, dtype=np.int64))
        with self._lock:
            b = self._batch(n, False)
            b.state[:, self.cols] = decode(bits).reshape(n, self.nstate)
            b.state[:, self.ctrl_cols] = np.asarray(action, np.float64).reshape(n, -1)
            before = self._warnings(b)
            try:
                b.step(nstep=self.n_sub_steps, stage=int(mujoco.mjtStage.mjSTAGE_VEL))
            except mjbatch.SimulationError:
                pass  # failed sims keep their old state; flagged below as bad
            new = b.state[:, self.cols]
            bad = self._bad(b, before, new) | (b.status != 0)
            fields = self._collect(b, n)
            out_bits = encode(new)
        return (out_bits.reshape(*lead, 2 * self.nstate), fields.reshape(*lead, self.nfield),
                bad.reshape(lead))

    def host_forward(self, bits: np.ndarray):
        """Fields of given states after dm_control's reset-time mj_forward."""
        lead = bits.shape[:-1]
        n = int(np.prod(lead, dtype=np.int64))
        with self._lock:
            b = self._batch(n, True)
            b.state[:] = 0.0
            b.state[:, self.cols] = decode(bits).reshape(n, self.nstate)
            b.forward(stage=int(mujoco.mjtStage.mjSTAGE_ACC))
            fields = self._collect(b, n)
        return fields.reshape(*lead, self.nfield)

    # -- JAX side ----------------------------------------------------------
    def step(self, bits: jnp.ndarray, action: jnp.ndarray):
        lead = bits.shape[:-1]
        shapes = (jax.ShapeDtypeStruct(bits.shape, jnp.uint32),
                  jax.ShapeDtypeStruct((*lead, self.nfield), jnp.float32),
                  jax.ShapeDtypeStruct(lead, jnp.bool_))
        return jax.pure_callback(self.host_step, shapes, bits, action.astype(jnp.float32),
                                 vmap_method="broadcast_all")

    def forward(self, bits: jnp.ndarray) -> jnp.ndarray:
        shape = jax.ShapeDtypeStruct((*bits.shape[:-1], self.nfield), jnp.float32)
        return jax.pure_callback(self.host_forward, shape, bits, vmap_method="broadcast_all")

    def split_fields(self, flat: jnp.ndarray) -> Dict[str, jnp.ndarray]:
        out, k = {}, 0
        for f in self.fields:
            size = self.field_sizes[f]
            out[f] = flat[k:k + size].reshape(self.field_shapes[f])
            k += size
        return out

    def state_row(self, data: mujoco.MjData) -> np.ndarray:
        """The carried float64 state of an MjData."""
        full = np.zeros(mujoco.mj_stateSize(self.model, CARRIED_SPEC))
        mujoco.mj_getState(self.model, data, full, CARRIED_SPEC)
        return full

    def qpos_slice(self) -> slice:
        # CARRIED order: time (1), qpos (nq), qvel (nv), ...
        return slice(1, 1 + self.model.nq)

    def qvel_slice(self) -> slice:
        return slice(1 + self.model.nq, 1 + self.model.nq + self.model.nv)

    def warmstart_slice(self) -> slice:
        m = self.model
        start = 1 + m.nq + m.nv + m.na + mujoco.mj_stateSize(m, S.mjSTATE_HISTORY)
        return slice(start, start + m.nv)


def copy_model(model: mujoco.MjModel) -> mujoco.MjModel:
    import copy
    return copy.deepcopy(model)
