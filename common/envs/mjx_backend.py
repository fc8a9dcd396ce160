"""MJX backend: the same physics in pure JAX (traced, no host round-trip).

Runs on GPU/TPU and, slowly, on CPU. It mirrors the native backend (MuJoCo C
as dm_control drives it) step for step:

* a control step is `n_sub_steps` full physics steps (forward dynamics, then
  the model's integrator), then the position and velocity stages are
  recomputed at the new state as dm_control's `mj_step1` does, with position
  and velocity sensors. Acceleration-stage sensors (touch, accelerometer,
  force, torque, ...) keep the values computed in the last substep, as in
  MuJoCo and dm_control: `mjx.sensor_pos`/`sensor_vel` write only the entries
  of their own stage, so they never overwrite them.
* `forward` is dm_control's reset-time `mj_forward` with actuation disabled.

Where MJX differs from MuJoCo C, this module closes the gap:

* `mjx.forward` skips the acceleration-stage sensors when the model has no
  constraint rows; here they are always computed, as in C.
* `mjx.rungekutta4` evaluates sensors at its intermediate stages; C skips them
  there, so sensordata is kept from the substep's first forward pass.
* plane-capsule contacts get C's tangent frame (see
  `_use_c_plane_capsule_frame`): with pyramidal friction cones MJX's frame
  changed the contact forces of steep limbs on the floor (humanoid touch and
  force sensors by up to 2x, and trajectories with them).
* `mjENBL_ENERGY` (used by acrobot, cartpole and pendulum only for the energy
  diagnostic) is rejected by `mjx.put_model`; it affects no dynamics and no
  field a task reads, so it is switched off in MJX's copy of the model unless
  the task reads `energy`.
* Matrix products are traced at "highest" precision, so GPUs do not round
  them through TF32: the backend is float32 throughout.
* Simulation blow-ups are flagged like MuJoCo's checks (non-finite or beyond
  mjMAXVAL), and Env resets those environments.

A task whose model needs a feature MJX lacks fails at `envs.make` with a
one-line `UserError` naming the feature; it still runs on `native`.
"""
from __future__ import annotations

import copy
import re
from typing import Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from common.errors import UserError

S = mujoco.mjtState
_MAXVAL = 1e10  # mjMAXVAL: MuJoCo's mj_checkPos/Vel/Acc reset beyond this


def _mjx():
    import contextlib
    import io
    import logging
    import warnings
    # "Failed to import warp" (printed) on installs without warp: not the
    # run's first line, which says where physics runs (common/cli.py)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        level = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)
        try:
            from mujoco import mjx
        finally:
            logging.getLogger().setLevel(level)
    _use_c_plane_capsule_frame()
    return mjx


def _use_c_plane_capsule_frame():
    """Give plane-capsule contacts MuJoCo C's tangent frame.

    C aligns the first tangent with the capsule axis projected on the plane
    whenever that projection is nonzero (mjc_PlaneCapsule, mju_makeFrame);
    MJX falls back to a fixed frame once the projection is shorter than 0.5,
    i.e. for capsules steeper than 30 degrees off the normal. With pyramidal
    friction cones (every dm_control task but finger and manipulator) the
    tangent frame orients the pyramid, so the contact forces of a steep limb
    on the floor differed (humanoid touch sensors by up to 2x). Idempotent;
    a no-op if MJX's collision table is not where this version keeps it.
    """
    from mujoco.mjx._src import collision_driver, collision_primitive, math as mjx_math
    from mujoco.mjx._src.types import GeomType
    key = (GeomType.PLANE, GeomType.CAPSULE)
    table = getattr(collision_driver, "_COLLISION_FUNC", None)
    ours = getattr(collision_primitive, "plane_capsule", 0)
    if not isinstance(table, dict) or table.get(key) is not ours:
        return

    @collision_primitive.collider(ncon=2)
    def plane_capsule(plane, cap):
        n, axis = plane.mat[:, 2], cap.mat[:, 2]
        b, b_norm = mjx_math.normalize_with_norm(axis - n * jnp.dot(n, axis))
        # C falls back only when the projection vanishes (to float32 noise here)
        b = jnp.where(b_norm < 1e-6, mjx_math.orthogonals(n)[0], b)
        frame = jnp.array([[n, b, jnp.cross(n, b)]])
        segment = axis * cap.size[1]
        collisions = []
        for offset in (segment, -segment):
            dist, pos = collision_primitive._plane_sphere(n, plane.pos, cap.pos + offset,
                                                          cap.size[0])
            collisions.append((dist[None], pos[None], frame))
        return jax.tree_util.tree_map(lambda *x: jnp.concatenate(x), *collisions)

    table[key] = plane_capsule


def unsupported_features(model: mujoco.MjModel, fields: Sequence[str] = ()) -> Tuple[str, ...]:
    """Features of `model` that MJX silently ignores or gets wrong (beyond what
    `mjx.put_model` itself rejects). Empty when MJX can run it faithfully."""
    out = []
    if mujoco.mj_stateSize(model, S.mjSTATE_HISTORY) > 0:
        out.append("actuator/sensor delays (history buffer)")
    if model.nplugin > 0:
        out.append("engine plugins")
    if model.opt.noslip_iterations > 0:
        out.append("noslip solver (opt.noslip_iterations > 0)")
    fluid = model.opt.density > 0 or model.opt.viscosity > 0 or np.any(model.opt.wind)
    if fluid and model.ngeom and np.any(model.geom_fluid[:, 0] > 0):
        out.append("ellipsoid fluid model (geom fluidshape='ellipsoid')")
    if "energy" in fields and model.opt.enableflags & mujoco.mjtEnableBit.mjENBL_ENERGY:
        out.append("energy computation (mjENBL_ENERGY)")
    return tuple(out)


def _clean(e: Exception) -> str:
    """MJX's NotImplementedError text as a short phrase on one line, e.g.
    "(mjtGeom.mjGEOM_ELLIPSOID, mjtGeom.mjGEOM_BOX) collisions not implemented."
    -> "ellipsoid-box collisions"."""
    msg = " ".join(str(e).split()).rstrip(".")
    msg = re.sub(r"\(?mjt\w+\.mj[A-Z]+_(\w+), mjt\w+\.mj[A-Z]+_(\w+)\)?",
                 lambda m: f"{m[1].lower()}-{m[2].lower()}", msg)
    msg = re.sub(r"mjt\w+\.(mj[A-Z]+_\w+)", r"\1", msg)
    msg = re.sub(r"\s*(not implemented|not supported)( for JAX backend)?$", "", msg)
    return msg or type(e).__name__


class MjxPhysics:
    """Pure-JAX stepping of one env of one model; vmap for batches."""

    def __init__(self, model: mujoco.MjModel, n_sub_steps: int, fields: Sequence[str], name: str,
                 field_shapes: Dict[str, Tuple[int, ...]]):
        mjx = _mjx()
        self.mjx = mjx
        self.fields = tuple(fields)
        missing = unsupported_features(model, self.fields)
        mm = copy.deepcopy(model)
        mm.opt.enableflags &= ~int(mujoco.mjtEnableBit.mjENBL_ENERGY)  # diagnostic only
        if not missing:
            try:
                self.mx = mjx.put_model(mm)
            except NotImplementedError as e:
                missing = (_clean(e),)
        if missing:
            raise UserError(f"task {name!r} needs a MuJoCo feature MJX lacks: "
                            f"{'; '.join(missing)}; use --backend native")
        self.model = mm  # the model MJX runs
        self._run = None  # run's jitted rounds, made on first use
        self.n_sub_steps = int(n_sub_steps)
        self.field_shapes = {f: tuple(field_shapes[f]) for f in self.fields}
        self._data0 = mjx.make_data(mm)
        absent = [f for f in self.fields if not hasattr(self._data0, f)]
        if absent:
            raise UserError(f"task {name!r} reads mjData.{absent[0]}, which MJX does not provide; "
                            f"use --backend native")
        integrators = {mjx.IntegratorType.EULER: mjx.euler,
                       mjx.IntegratorType.RK4: mjx.rungekutta4,
                       mjx.IntegratorType.IMPLICITFAST: mjx.implicit}
        self._integrate = integrators.get(self.mx.opt.integrator)
        if self._integrate is None:
            raise UserError(f"task {name!r} needs a MuJoCo feature MJX lacks: integrator "
                            f"{mujoco.mjtIntegrator(int(self.mx.opt.integrator)).name}; "
                            f"use --backend native")
        # Offsets of the carried components in the native float64 state row
        # (mj_getState orders components by their mjtState bit).
        from common.envs.native import CARRIED
        self._row_slices = {}
        for comp, size in ((S.mjSTATE_TIME, 1), (S.mjSTATE_QPOS, model.nq),
                           (S.mjSTATE_QVEL, model.nv), (S.mjSTATE_ACT, model.na),
                           (S.mjSTATE_WARMSTART, model.nv)):
            below = sum(int(c) for c in CARRIED if int(c) < int(comp))
            start = mujoco.mj_stateSize(model, below) if below else 0
            self._row_slices[comp] = slice(start, start + size)

    # -- state ---------------------------------------------------------------
    def reset(self, qpos, qvel, act, warmstart, time=None):
        d0 = self._data0
        time = jnp.zeros((), d0.time.dtype) if time is None else jnp.asarray(time, d0.time.dtype)
        f32 = lambda x, like: jnp.asarray(x, like.dtype).reshape(like.shape)
        return d0.replace(qpos=f32(qpos, d0.qpos), qvel=f32(qvel, d0.qvel), act=f32(act, d0.act),
                          qacc_warmstart=f32(warmstart, d0.qacc_warmstart), time=time,
                          ctrl=jnp.zeros_like(d0.ctrl))

    def pool_from_rows(self, rows32: jnp.ndarray) -> Tuple[jnp.ndarray, ...]:
        """(time, qpos, qvel, act, warmstart) of native carried state rows
        rounded to float32 ([..., nstate])."""
        comps = (S.mjSTATE_TIME, S.mjSTATE_QPOS, S.mjSTATE_QVEL, S.mjSTATE_ACT, S.mjSTATE_WARMSTART)
        return tuple(rows32[..., self._row_slices[c]] for c in comps)

    def from_pool(self, pool, idx):
        time, qpos, qvel, act, ws = (p[idx] for p in pool)
        return self.reset(qpos, qvel, act, ws, time[..., 0])

    # -- dynamics ------------------------------------------------------------
    def _stage_vel(self, d):
        """mj_step1 without the checks: position and velocity stages and sensors."""
        mjx, m = self.mjx, self.mx
        d = mjx.fwd_position(m, d)
        d = mjx.sensor_pos(m, d)
        d = mjx.fwd_velocity(m, d)
        return mjx.sensor_vel(m, d)

    def _stage_acc(self, d, actuated=True):
        """The rest of mj_forward: actuation, acceleration, constraint solver,
        acceleration-stage sensors. Unlike mjx.forward, the sensors are computed
        even when the model has no constraint rows, as in C. `actuated` False
        is mjDSBL_ACTUATION (no actuator forces, no activation dynamics); it may
        be a traced bool."""
        mjx, m = self.mjx, self.mx
        d = mjx.fwd_actuation(m, d)
        if actuated is not True:
            on = jnp.asarray(actuated)
            d = d.replace(act_dot=jnp.where(on, d.act_dot, 0),
                          qfrc_actuator=jnp.where(on, d.qfrc_actuator, 0),
                          actuator_force=jnp.where(on, d.actuator_force, 0))
        d = mjx.fwd_acceleration(m, d)
        if d._impl.efc_J.size == 0:
            d = d.replace(qacc=d.qacc_smooth)
        else:
            d = mjx.solve(m, d)
        return mjx.sensor_acc(m, d)

    def _finish_substep(self, d, actuated=True, integrate=True):
        """What mj_step does after the position and velocity stages."""
        d = self._stage_acc(d, actuated)
        sensordata = d.sensordata
        if integrate is True:
            d = self._integrate(self.mx, d)
        elif integrate is not False:
            d = jax.lax.cond(integrate, lambda x: self._integrate(self.mx, x), lambda x: x, d)
        # RK4 re-runs forward at intermediate states, sensors included; MuJoCo
        # C skips sensors there, keeping those of the first evaluation.
        return d.replace(sensordata=sensordata)

    def run(self, d, passes, n_acc, actuated=True, integrate=True):
        """`passes` rounds of [position and velocity stages, then, in the first
        `n_acc` rounds only, the acceleration stage and the integrator].

        A control step is (n+1, n): n mj_step, then mj_step1 at the new state,
        with one copy of each stage in the compiled program (so compiling it
        costs about one mjx.step, not two). dm_control's reset-time forward is
        (1, 1) without actuation or integration; further rounds without
        integration recompute the same values. All four counts and switches
        are traced, through one jitted function per physics: the step and the
        reset's forward share one trace of MJX's stages, which takes longer
        than XLA's compile of a small model (tests batch both uses into one
        program).
        """
        if self._run is None:
            self._run = jax.jit(self._rounds)
        return self._run(d, jnp.int32(passes), jnp.int32(n_acc), jnp.bool_(actuated),
                         jnp.bool_(integrate))

    def _rounds(self, d, passes, n_acc, actuated, integrate):
        def body(i, x):
            x = self._stage_vel(x)
            finish = lambda y: self._finish_substep(y, actuated, integrate)
            return jax.lax.cond(i < n_acc, finish, lambda y: y, x)

        with jax.default_matmul_precision("highest"):
            return jax.lax.fori_loop(0, passes, body, d)

    def step(self, d, action):
        """One control step: `n_sub_steps` mj_step, then mj_step1 at the new state."""
        d = d.replace(ctrl=jnp.asarray(action, d.ctrl.dtype).reshape(d.ctrl.shape))
        d = self.run(d, self.n_sub_steps + 1, self.n_sub_steps)
        return d, self.get_fields(d), self.diverged(d)

    def forward(self, d):
        """Fields after dm_control's reset-time forward (actuation disabled)."""
        return self.get_fields(self.run(d, 1, 1, actuated=False, integrate=False))

    @staticmethod
    def diverged(d):
        """MuJoCo's mj_checkPos/Vel/Acc verdict: non-finite or beyond mjMAXVAL."""
        return ~(_sane(d.qpos) & _sane(d.qvel) & _sane(d.qacc) & _sane(d.act))

    def get_fields(self, d) -> Dict[str, jnp.ndarray]:
        """The task's fields, shaped as in mujoco.MjData (e.g. xmat is (nbody, 9))."""
        return {f: jnp.reshape(getattr(d, f), self.field_shapes[f]) for f in self.fields}


def _sane(x):
    return jnp.all(jnp.isfinite(x) & (jnp.abs(x) <= _MAXVAL))
