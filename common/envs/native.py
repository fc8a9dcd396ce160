"""Native backend: MuJoCo C, stepped on a thread pool from inside jax.jit.

One host call (common/hostcall) per control step carries the whole batch (nested vmap
over seeds and envs still makes one call). The host side is MuJoCo's own
`mujoco.batch.Batch`: it loads each simulation's state row, runs the substeps
and an mj_step1-equivalent stage with the GIL released on `nthread` threads,
and copies out the fields the task reads. Results are bit-identical to one
MjData per env, so trajectories match dm_control's exactly.

A control step is dm_control's: `n_sub_steps` mj_step, then the position and
velocity stages (mj_step1) at the new state for the observation. For batches
of at least SPLIT_MIN envs, that last stage runs in a second call on a copy of
the model with constraints and passive forces switched off, when the task
reads only fields that do not depend on them (kinematics, position and
velocity sensors): the same arithmetic on the same inputs, so the same bits,
without collision detection, which costs a cheap model like cheetah's over a
third of a step. Acceleration-stage sensors keep the values of the last
substep, as in MuJoCo.

The physics state lives in JAX as the float64 state row viewed as uint32
pairs (x64 stays off): rounding it to float32 between steps would drift.

`step_start` and `step_finish` split a step in two host calls, the physics
running on a worker thread between them, so that the device can compute
meanwhile (`Env.step_while`, the agents' --overlap-physics).
"""
from __future__ import annotations

import concurrent.futures
import itertools
import os
import sys
import threading
import time
from typing import Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from mujoco import batch as mjbatch

from common import hostcall

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
MAXVAL = 1e10  # mjMAXVAL: mj_checkPos/mj_checkVel reject a state beyond it
VEL = int(mujoco.mjtStage.mjSTAGE_VEL)
SPLIT_MIN = 64  # smaller batches do the observation stage in the step's own call


class SplitTimes:
    """Where a split step's time goes (RL_SPLIT_TIMES=N in the environment):
    for each step_start/step_finish pair, the physics on the host and how
    long after the start the device asked for the results (its work in
    between: the overlapped updates) and then waited for them. Every N
    steps one line of medians over those N goes to stderr. A diagnostic for
    --overlap-physics: when the device asks after the physics is done, the
    updates are what the loop waits for."""

    def __init__(self, every: int):
        self.every, self.rows, self.lock = every, [], threading.Lock()

    def timed(self, step):
        """`step` for the worker, called at the start: returns its results
        with (start, physics begin, physics end)."""
        start = time.perf_counter()

        def run(*args):
            begin = time.perf_counter()
            out = step(*args)
            return out, (start, begin, time.perf_counter())
        return run

    def add(self, start, begin, end, called, returned):
        with self.lock:
            self.rows.append((end - begin, called - start, returned - called, called > end))
            if len(self.rows) < self.every:
                return
            physics, asked, waited, late = (np.mean(c) if i == 3 else 1e3 * np.median(c)
                                            for i, c in enumerate(zip(*self.rows)))
            self.rows = []
        print(f"\nsplit step ({self.every}): physics {physics:.2f} ms, device asked after "
              f"{asked:.2f} ms, waited {waited:.2f} ms; asked after the physics ended in "
              f"{late:.0%}", file=sys.stderr, flush=True)


_EVERY = os.environ.get("RL_SPLIT_TIMES", "")
_SPLIT_TIMES = SplitTimes(int(_EVERY)) if _EVERY.isdigit() and int(_EVERY) > 0 else None

# mjData fields of the position and velocity stages that depend neither on
# constraints (contacts, limits, equalities) nor on passive forces, so that the
# observation stage may recompute them without those.
_KINEMATIC_FIELDS = frozenset((
    "qpos", "qvel", "act", "time", "mocap_pos", "mocap_quat", "userdata",
    "xpos", "xquat", "xmat", "xipos", "ximat", "xanchor", "xaxis", "geom_xpos", "geom_xmat",
    "site_xpos", "site_xmat", "cam_xpos", "cam_xmat", "light_xpos", "light_xdir",
    "subtree_com", "cinert", "cdof", "cvel", "cdof_dot", "ten_length", "ten_velocity",
    "actuator_length", "actuator_velocity", "sensordata"))
_T = mujoco.mjtSensor
# Position/velocity sensors computed from kinematics alone.
_KINEMATIC_SENSORS = frozenset(int(t) for t in (
    _T.mjSENS_MAGNETOMETER, _T.mjSENS_JOINTPOS, _T.mjSENS_JOINTVEL, _T.mjSENS_TENDONPOS,
    _T.mjSENS_TENDONVEL, _T.mjSENS_ACTUATORPOS, _T.mjSENS_ACTUATORVEL, _T.mjSENS_BALLQUAT,
    _T.mjSENS_BALLANGVEL, _T.mjSENS_FRAMEPOS, _T.mjSENS_FRAMEQUAT, _T.mjSENS_FRAMEXAXIS,
    _T.mjSENS_FRAMEYAXIS, _T.mjSENS_FRAMEZAXIS, _T.mjSENS_FRAMELINVEL, _T.mjSENS_FRAMEANGVEL,
    _T.mjSENS_SUBTREECOM, _T.mjSENS_SUBTREELINVEL, _T.mjSENS_SUBTREEANGMOM, _T.mjSENS_VELOCIMETER,
    _T.mjSENS_GYRO, _T.mjSENS_CLOCK))


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
        self._batches: Dict[Tuple[int, str], mjbatch.Batch] = {}
        self._lock = threading.Lock()
        probe = mjbatch.Batch(model, 1, nthread=1)
        cols = []
        for c in CARRIED:
            off, size = probe._component(c)
            cols.extend(range(off, off + size))
        self.cols = np.asarray(cols)
        self.nstate = len(cols)
        # a slice (a view, cheap to read and write) where the carried columns
        # are contiguous in the batch's rows, as they are without mocap bodies
        contiguous = len(cols) and cols == list(range(cols[0], cols[0] + len(cols)))
        self.cols_index = slice(cols[0], cols[0] + len(cols)) if contiguous else self.cols
        self.ctrl_cols = slice(*(lambda o, s: (o, o + s))(*probe._component(S.mjSTATE_CTRL)))
        data = mujoco.MjData(model)
        self.field_shapes = {f: np.shape(getattr(data, f)) for f in self.fields}
        self.field_sizes = {f: int(np.prod(s)) for f, s in self.field_shapes.items()}
        self.nfield = sum(self.field_sizes.values())
        # dm_control runs mj_forward with actuation disabled after a reset.
        m2 = copy_model(model)
        m2.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_ACTUATION
        self.forward_model = m2
        # ... on the state mj_resetData leaves, as dm_control's reset does: what
        # is not carried (eq_active, ctrl, applied forces) keeps the model's
        # defaults. A zero row would switch the equality constraints off
        # (quadruped's tendon couplings, manipulator's finger coupling).
        self.default_row = np.zeros(mujoco.mj_stateSize(model, S.mjSTATE_INTEGRATION))
        mujoco.mj_getState(model, mujoco.MjData(model), self.default_row, S.mjSTATE_INTEGRATION)
        # The observation stage (mj_step1 at the new state) on a model without
        # constraints and passive forces, when the fields allow it (see above);
        # else (split False) as part of the step on the model itself.
        stage = model.sensor_needstage
        acc = stage == int(mujoco.mjtStage.mjSTAGE_ACC)
        kinematic = set(self.fields) <= _KINEMATIC_FIELDS and all(
            a or int(t) in _KINEMATIC_SENSORS for a, t in zip(acc, model.sensor_type))
        self.split = bool(kinematic and model.nplugin == 0)
        # sensordata entries of acceleration-stage sensors come from the step
        # itself (its last substep), the others from the observation stage.
        self.acc_sensordata = np.concatenate(
            [np.arange(a, a + d) for a, d, x in zip(model.sensor_adr, model.sensor_dim, acc) if x]
            or [np.zeros(0, int)]).astype(np.intp)
        k, self.field_offsets = 0, {}
        for f in self.fields:
            self.field_offsets[f] = k
            k += self.field_sizes[f]
        self.warning_ids = np.asarray([int(w) for w in BAD_WARNINGS])
        # steps started by host_start and not yet taken by host_finish, by ticket
        self._jobs: Dict[int, concurrent.futures.Future] = {}
        self._tickets = itertools.count()
        self._worker = None

    # -- host side ---------------------------------------------------------
    def threads(self, n: int) -> int:
        """Threads the pool that steps `n` envs at once runs on."""
        return max(1, min(self.nthread, n))

    def _batch(self, n: int, kind: str) -> mjbatch.Batch:
        """kind: "forward" (reset-time mj_forward), "step" (the substeps, plus
        the observation stage when there is no stage model) or "stage"."""
        key = (n, kind)
        if key not in self._batches:
            model = {"forward": self.forward_model}.get(kind, self.model)
            if kind == "stage":
                model = copy_model(self.model)
                D = mujoco.mjtDisableBit
                model.opt.disableflags |= D.mjDSBL_CONSTRAINT | D.mjDSBL_SPRING | D.mjDSBL_DAMPER
            b = mjbatch.Batch(model, n, nthread=self.threads(n))
            fields = self.fields
            if kind == "step" and self._split(n):  # only acc-stage sensors
                acc = len(self.acc_sensordata) and "sensordata" in fields
                fields = ("sensordata",) if acc else ()
            for f in fields:  # outputs are copied only once bound
                b.bind(f)
            self._batches[key] = b
        return self._batches[key]

    def _split(self, n: int) -> bool:
        """Whether the observation stage runs on the stage model, in its own call."""
        return self.split and n >= SPLIT_MIN

    def _collect(self, b: mjbatch.Batch, n: int) -> np.ndarray:
        out = np.empty((n, self.nfield), np.float32)
        k = 0
        for f in self.fields:
            size = self.field_sizes[f]
            out[:, k:k + size] = b.bind(f).reshape(n, size)
            k += size
        return out

    def _warnings(self, b: mjbatch.Batch) -> np.ndarray:
        # warning rows are (lastinfo, number) per mjtWarning
        return b.warning[:, self.warning_ids, 1]

    def _bad(self, b: mjbatch.Batch, state: np.ndarray) -> np.ndarray:
        bad = (self._warnings(b) > 0).any(-1) | ~np.isfinite(state).all(-1)
        # mj_step1's mj_checkPos/mj_checkVel at the new state: NaN or beyond
        # mjMAXVAL (the stage model runs no checks)
        qposvel = state[:, self.qpos_slice().start:self.qvel_slice().stop]
        return bad | ~(np.abs(qposvel) <= MAXVAL).all(-1)

    def host_step(self, bits: np.ndarray, action: np.ndarray):
        lead = bits.shape[:-1]
        n = int(np.prod(lead, dtype=np.int64))
        split = self._split(n)
        with self._lock:
            b = self._batch(n, "step")
            b.state[:, self.cols_index] = decode(bits).reshape(n, self.nstate)
            b.state[:, self.ctrl_cols] = np.asarray(action).reshape(n, -1)
            # A simulation's warning counters persist from call to call, and
            # MuJoCo's reset of a diverged one sets them to 1 again: zero them
            # so that they count this call's warnings alone.
            b.warning[:] = 0
            try:
                b.step(nstep=self.n_sub_steps, stage=0 if split else VEL)
            except mjbatch.SimulationError:
                pass  # failed sims keep their old state; flagged below as bad
            new = b.state[:, self.cols_index]
            bad = self._bad(b, new) | (b.status != 0)
            if split:  # mj_step1's stages, on the stage model
                s = self._batch(n, "stage")
                s.state[:] = b.state
                try:
                    s.forward(stage=VEL)
                except mjbatch.SimulationError:
                    bad |= s.status != 0
                fields = self._collect(s, n)
                if len(self.acc_sensordata) and "sensordata" in self.fields:
                    k = self.field_offsets["sensordata"]
                    acc = self.acc_sensordata
                    fields[:, k + acc] = b.bind("sensordata")[:, acc]
            else:
                fields = self._collect(b, n)
            out_bits = encode(np.array(new))  # a copy: `new` may view the batch's rows
        return (out_bits.reshape(*lead, 2 * self.nstate), fields.reshape(*lead, self.nfield),
                bad.reshape(lead))

    def host_start(self, bits: np.ndarray, action: np.ndarray) -> np.ndarray:
        """host_step on a worker thread; returns at once with the step's
        ticket (int32, shaped like the batch) for host_finish."""
        args = np.array(bits), np.array(action)  # copies: the buffers outlive no call
        step = self.host_step if _SPLIT_TIMES is None else _SPLIT_TIMES.timed(self.host_step)
        with self._lock:
            if self._worker is None:
                self._worker = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="native-physics")
            ticket = next(self._tickets) % 2 ** 31
            self._jobs[ticket] = self._worker.submit(step, *args)
        return np.full(bits.shape[:-1], ticket, np.int32)

    def host_finish(self, ticket: np.ndarray):
        """host_step's results of the step host_start gave `ticket`, once done."""
        with self._lock:
            job = self._jobs.pop(int(np.asarray(ticket).reshape(-1)[0]))
        if _SPLIT_TIMES is None:
            return job.result()
        called = time.perf_counter()
        result, times = job.result()
        _SPLIT_TIMES.add(*times, called, time.perf_counter())
        return result

    def host_forward(self, bits: np.ndarray):
        """Fields of given states after dm_control's reset-time mj_forward."""
        lead = bits.shape[:-1]
        n = int(np.prod(lead, dtype=np.int64))
        with self._lock:
            b = self._batch(n, "forward")
            b.state[:] = self.default_row
            b.state[:, self.cols] = decode(bits).reshape(n, self.nstate)
            b.forward(stage=int(mujoco.mjtStage.mjSTAGE_ACC))
            fields = self._collect(b, n)
        return fields.reshape(*lead, self.nfield)

    # -- JAX side ----------------------------------------------------------
    # pack=None: the operands of a step's host calls go packed, one array each way,
    # where the program runs off the host (hostcall: each operand is a transfer)
    def step(self, bits: jnp.ndarray, action: jnp.ndarray):
        lead = bits.shape[:-1]
        shapes = (jax.ShapeDtypeStruct(bits.shape, jnp.uint32),
                  jax.ShapeDtypeStruct((*lead, self.nfield), jnp.float32),
                  jax.ShapeDtypeStruct(lead, jnp.bool_))
        return hostcall.call(self.host_step, shapes, bits, action.astype(jnp.float32), pack=None)

    def step_start(self, bits: jnp.ndarray, action: jnp.ndarray) -> jnp.ndarray:
        """`step` in two calls: this one hands the batch to a host thread and
        returns its ticket; step_finish(ticket) waits for the results. What
        the device computes between the two (made to depend on the ticket, and
        step_finish's input on it) runs while the host steps the physics."""
        shape = jax.ShapeDtypeStruct(bits.shape[:-1], jnp.int32)
        return hostcall.call(self.host_start, shape, bits, action.astype(jnp.float32), pack=None)

    def step_finish(self, ticket: jnp.ndarray):
        lead = ticket.shape
        shapes = (jax.ShapeDtypeStruct((*lead, 2 * self.nstate), jnp.uint32),
                  jax.ShapeDtypeStruct((*lead, self.nfield), jnp.float32),
                  jax.ShapeDtypeStruct(lead, jnp.bool_))
        return hostcall.call(self.host_finish, shapes, ticket, pack=None)

    def forward(self, bits: jnp.ndarray) -> jnp.ndarray:
        shape = jax.ShapeDtypeStruct((*bits.shape[:-1], self.nfield), jnp.float32)
        return hostcall.call(self.host_forward, shape, bits)

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
