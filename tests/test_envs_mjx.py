"""MJX backend vs native, for every task in envs.names() that MJX supports.

Everything starts from identical physics states: native float64 states
rounded to float32 once, so that both backends hold the same bits.

1. Identical states, reset-time forward (Env.init_state's path: mj_forward
   with actuation disabled): raw fields, observation and reward (with a random
   control, for control costs), at dm_control resets and at every state of a
   native random-action trajectory.
2. One control step (n_sub_steps mj_step, then the mj_step1 stage; the
   acceleration-stage sensors keep the last substep's values) from each of
   those states; and free-running trajectories of T = 20 steps from the same
   start with the same actions.
3. A task that needs a feature MJX lacks raises a one-line UserError naming
   it on `mjx`, and runs on `native`.

Tolerances, elementwise |mjx - native| <= atol + rtol |native|, and what was
measured on CPU (all tasks, worst case; MuJoCo 3.17, JAX 0.10):

                                  tolerance (rtol, atol)   measured max |diff|
  identical state: fields, obs,   1e-5, 1e-5              7e-7 obs, 6e-7 reward,
    reward (float32 rounding)                              3e-6 pos/vel sensors
  identical state: acceleration-  1e-3, 1e-4 x the        2.6e-2 on readings up to
    stage sensordata (outputs of  state's largest such    ~4e3 (humanoid contact
    the iterative solver)         reading + 1e-4          forces); used 0.1 of it
  obs entries computed from those 1e-3, 1e-3              3e-4 (quadruped
                                                          arcsinh(force))
  one step from identical states  2e-3, 2e-3 (reward      6e-4 obs (humanoid qvel
                                  atol 2e-3)              after 5 contact substeps)
  free-running, 20 steps          2e-2, 2e-2 (reward      1.6e-3 obs (humanoid),
                                  atol 2e-2)              4e-6 reward

Free-running comparisons are only meaningful over a short horizon: contact-
rich tasks are chaotic, and native itself, restarted from a state perturbed by
1e-6 (relative), leaves its own trajectory as fast as MJX does (humanoid from
a dm_control reset: ~2e-3 after 20 steps, O(1) after 25-30).
A thresholded reward (sparse tasks) may flip where a state sits within float32
noise of its threshold: a reward is only counted wrong where the observation
of the same transition agrees to float32 rounding.

MJX compiles slowly on CPU, so the physics is compiled once per model (tasks
sharing a model share it) with XLA CPU options that cut compile time, tiny
batches, and the task code applied outside. By default (CI) the tasks in
CI_TASKS run; `-m slow` runs every task. To print the measured numbers:
MJX_REPORT=1 pytest -s -n 0 tests/test_envs_mjx.py [-m slow]
"""
import functools
import hashlib
import os

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from common import envs
from common.envs.native import decode, encode
from common.errors import UserError

TASKS = envs.names()


# CI compares one cheap model per kind of physics (no contacts, a cart, planar
# contacts, a free-floating cup, and swimmer for the refusal); `-m slow` every
# task (compiling MJX for a model costs 5-90 s of CPU here).
CI_TASKS = ("pendulum_swingup", "cartpole_balance", "hopper_stand", "cheetah_run",
            "ball_in_cup_catch", "swimmer_swimmer6")


def _params():
    return [name if name in CI_TASKS else pytest.param(name, marks=pytest.mark.slow)
            for name in TASKS]


PARAMS = _params()
B = 2            # trajectories per task
T = 20           # control steps per trajectory
# Test-only XLA CPU options: about 3x less compile time for MJX's large programs
# (the slow part of this file), the same HLO.
COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}

TOL_STATE = dict(rtol=1e-5, atol=1e-5)
TOL_ACC = dict(rtol=1e-3, atol=1e-4)   # atol x the state's largest acc-stage reading
TOL_ACC_FLOOR = 1e-4                   # plus this (float32 noise of readings that cancel to ~0)
TOL_ACC_OBS = dict(rtol=1e-3, atol=1e-3)
TOL_ONE_STEP = dict(rtol=2e-3, atol=2e-3)
TOL_TRAJ = dict(rtol=2e-2, atol=2e-2)
REPORT = os.environ.get("MJX_REPORT")


# --- building envs -----------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _native(name):
    return envs.make(name, "native", pool_size=B)


@functools.lru_cache(maxsize=None)
def _mjx(name):
    """The mjx env, or the UserError it raised."""
    try:
        return envs.make(name, "mjx", pool_size=B)
    except UserError as e:
        return e


def _mjx_or_skip(name):
    env = _mjx(name)
    if isinstance(env, UserError):
        pytest.skip(f"not supported on mjx: {env}")
    return env


@functools.lru_cache(maxsize=None)
def _model_key(name):
    """Tasks with equal keys run the same physics: they share a compiled program."""
    env = _mjx(name)
    m = env.mjx.model
    buf = np.zeros(mujoco.mj_sizeModel(m), np.uint8)
    mujoco.mj_saveModel(m, None, buf)
    return hashlib.sha1(buf.tobytes()).hexdigest(), env.n_sub_steps, env.mjx.fields


# --- the physics of one model, compiled once ---------------------------------------

def _program(env):
    """jitted (start states, forced states, actions) -> fields, diverged.

    One program per distinct model, compiled once: a scan over T control steps
    of MjxPhysics.run on a batch holding (a) the free-running trajectories,
    (b) the native trajectory's state t, stepped once (one step from identical
    states), and (c) that same state t under the reset-time forward (no
    actuation, no integration), so that one copy of the physics serves all.
    """
    phys, n = env.mjx, env.n_sub_steps

    def reset(s):
        return phys.reset(s["qpos"], s["qvel"], s["act"], s["warmstart"], s["time"])

    def one(d, ctrl, n_acc, on):
        d = d.replace(ctrl=ctrl)
        d = phys.run(d, n + 1, n_acc, actuated=on, integrate=on)
        return d, phys.get_fields(d), phys.diverged(d)

    def program(start, forced, actions):
        def body(d, x):
            s, a = x
            ds = jax.vmap(reset)(s)
            batch = jax.tree.map(lambda *u: jnp.concatenate(u), d, ds, ds)
            ctrl = jnp.concatenate([a, a, jnp.zeros_like(a)])
            n_acc = jnp.array([n] * (2 * B) + [1] * B)      # step, step, forward
            on = jnp.array([True] * (2 * B) + [False] * B)
            new, fields, bad = jax.vmap(one)(batch, ctrl, n_acc, on)
            return jax.tree.map(lambda u: u[:B], new), (fields, bad)

        return jax.lax.scan(body, jax.vmap(reset)(start), (forced, actions))[1]

    return jax.jit(program, compiler_options=COMPILE)


# --- native side -------------------------------------------------------------------

def _split(env, flat):
    return jax.vmap(env.native.split_fields)(jnp.asarray(flat))


def _components(env, rows):
    """Carried float64 state rows -> the components MJX carries, as float32."""
    sl = env.mjx._row_slices
    S = mujoco.mjtState
    out = {k: rows[..., sl[c]].astype(np.float32) for k, c in (
        ("time", S.mjSTATE_TIME), ("qpos", S.mjSTATE_QPOS), ("qvel", S.mjSTATE_QVEL),
        ("act", S.mjSTATE_ACT), ("warmstart", S.mjSTATE_WARMSTART))}
    out["time"] = out["time"][..., 0]
    return out


def _round32(env, rows):
    """Round the MJX-carried components of float64 rows to float32 (exactly
    representable on both backends)."""
    rows = rows.copy()
    for c in env.mjx._row_slices.values():
        rows[..., c] = rows[..., c].astype(np.float32)
    return rows


_RESULTS = {}
_LAST_PROGRAM = {}


def _compare(name):
    """_compare_task(name), cached. Tasks sharing a model (adjacent in the
    sorted order) reuse its compiled program; only the last one is kept."""
    if name not in _RESULTS:
        key = _model_key(name)
        if key not in _LAST_PROGRAM:
            _LAST_PROGRAM.clear()
            _LAST_PROGRAM[key] = _program(_mjx(name))
        _RESULTS[name] = _compare_task(name, _LAST_PROGRAM[key])
    return _RESULTS[name]


def _compare_task(name, program):
    """Both backends on the same states and actions: task outputs and fields."""
    nat = mj = _mjx(name)  # the mjx Env carries the native backend too (pool, NativePhysics)
    rng = np.random.default_rng(0)
    actions = rng.uniform(nat.action_low, nat.action_high,
                          (T, B, nat.action_size)).astype(np.float32)

    # Native free-running trajectories from dm_control resets, rounded.
    rows0 = _round32(mj, envs._initial_pool(name, nat.pool_size, nat.pool_seed)[0][:B])
    task = np.asarray(nat.pool.task[:B])
    rows, free_flat, nat_bad = [rows0], [], []
    bits = jnp.asarray(encode(rows0))
    for t in range(T - 1):
        bits, flat, bad = nat.native.step(bits, jnp.asarray(actions[t]))
        rows.append(decode(np.asarray(bits)))
        free_flat.append(np.asarray(flat))
        nat_bad.append(np.asarray(bad))
    _, flat, bad = nat.native.step(bits, jnp.asarray(actions[T - 1]))
    free_flat.append(np.asarray(flat))
    nat_bad.append(np.asarray(bad))
    forced_rows = _round32(mj, np.stack(rows))               # (T, B, nstate): states 0..T-1

    # Native one step from, and reset-time forward at, each rounded state.
    flat_rows = jnp.asarray(encode(forced_rows.reshape(T * B, -1)))
    _, one_flat, _ = nat.native.step(flat_rows, jnp.asarray(actions.reshape(T * B, -1)))
    fwd_flat = nat.native.forward(flat_rows)

    # MJX on the same states and actions.
    comps = lambda r: {k: jnp.asarray(v) for k, v in _components(mj, r).items()}
    m_fields, m_bad = program(comps(rows0), comps(forced_rows), jnp.asarray(actions))
    m_fields = jax.tree.map(np.asarray, m_fields)           # (T, 3B, ...)
    def part(k):
        return {f: v[:, k * B:(k + 1) * B].reshape(T * B, *v.shape[2:])
                for f, v in m_fields.items()}

    n_fields = {"free": _split(nat, np.stack(free_flat).reshape(T * B, -1)),
                "one": _split(nat, one_flat), "fwd": _split(nat, fwd_flat)}
    m_fields = {"free": part(0), "one": part(1), "fwd": part(2)}
    task, ctrl = _episodes(task), _steps(actions)
    fwd_ctrl = rng.uniform(nat.action_low, nat.action_high, ctrl.shape).astype(np.float32)
    out = {"bad": (np.stack(nat_bad), np.asarray(m_bad)[:, :2 * B]),
           "acc_dep": _acc_dependence(nat, n_fields["fwd"], task, fwd_ctrl)}
    for k in ("free", "one", "fwd"):
        # the reset-time forward has no action: any control cost
        c = fwd_ctrl if k == "fwd" else ctrl
        out[k] = (_task_outputs(nat, n_fields[k], task, c),
                  _task_outputs(nat, m_fields[k], task, c))
        out[k + "_fields"] = (jax.tree.map(np.asarray, n_fields[k]), m_fields[k])
    return out


def _steps(x):
    """(T, B, ...) per-step values -> (T*B, ...), index t*B + b."""
    x = np.asarray(x)
    return x.reshape(T * B, *x.shape[2:])


def _episodes(x):
    """(B, ...) per-episode values -> (T*B, ...), index t*B + b."""
    x = np.asarray(x)
    return np.tile(x, (T,) + (1,) * (x.ndim - 1))


_TASK_FNS = {}


def _task_outputs(env, fields, task, ctrl):
    """(obs, reward, terminated) of the task code on a batch of fields."""
    if env.name not in _TASK_FNS:
        def f(d, p, a):
            d = env._fields(dict(d), p, a)
            return (envs.flatten(env.task.observe(d)),
                    jnp.asarray(env.task.reward(d), jnp.float32).reshape(()),
                    jnp.asarray(env.task.terminate(d), bool).reshape(()))
        _TASK_FNS[env.name] = jax.jit(jax.vmap(f))
    fields = {k: jnp.asarray(v, jnp.float32) for k, v in fields.items()}
    out = _TASK_FNS[env.name](fields, jnp.asarray(task), jnp.asarray(ctrl))
    return jax.tree.map(np.asarray, out)


# --- checks ------------------------------------------------------------------------

def _acc_sensordata(model):
    """sensordata indices of acceleration-stage sensors (touch, accelerometer,
    force, torque, ...): outputs of the iterative constraint solver."""
    acc = model.sensor_needstage == int(mujoco.mjtStage.mjSTAGE_ACC)
    idx = [np.arange(a, a + d) for a, d, x in zip(model.sensor_adr, model.sensor_dim, acc) if x]
    return np.concatenate(idx) if idx else np.zeros(0, int)


def _acc_dependence(env, fields, task, ctrl):
    """Which observation entries (and whether the reward) depend on
    acceleration-stage sensors: those that change when the sensors do."""
    acc = _acc_sensordata(env.model)
    if "sensordata" not in fields or not acc.size:
        return np.zeros(env.observation_size, bool), False
    sensordata = fields["sensordata"]
    moved = dict(fields, sensordata=sensordata.at[:, acc].set(sensordata[:, acc] * 1.5 + 1))
    (o0, r0, _), (o1, r1, _) = (_task_outputs(env, f, task, ctrl) for f in (fields, moved))
    return (o0 != o1).any(0), bool((r0 != r1).any())


def _assert_close(name, what, m, n, rtol, atol):
    """|m - n| <= atol + rtol |n| elementwise (atol may be an array)."""
    m, n = np.asarray(m, np.float64), np.asarray(n, np.float64)
    diff = np.abs(m - n)
    ratio = diff / (atol + rtol * np.abs(n))
    if REPORT:
        print(f"\n[mjx-report] {name:24s} {what:30s} max|diff|={diff.max(initial=0):.2e} "
              f"tolerance-used={ratio.max(initial=0):.2f}")
    if not (ratio <= 1).all():  # also catches NaN
        i = np.unravel_index(np.nanargmax(np.where(np.isnan(ratio), np.inf, ratio)), ratio.shape)
        allowed = np.broadcast_to(atol, n.shape)[i] + rtol * abs(n[i])
        raise AssertionError(f"{name}: {what}: {(~(ratio <= 1)).sum()} of {ratio.size} entries "
                             f"beyond tolerance; worst at {i}: mjx {m[i]:.7g} native {n[i]:.7g} "
                             f"(|diff| {diff[i]:.3g}, allowed {allowed:.3g})")


def _check_fields(name, what, nat, mj, env, tol):
    """Raw fields; acceleration-stage sensordata against TOL_ACC, its atol
    scaled by the largest such reading in the same state."""
    acc = _acc_sensordata(env.model)
    for f, n in nat.items():
        n, m = np.asarray(n), np.asarray(mj[f]).reshape(np.shape(n))
        if f == "sensordata" and acc.size:
            rest = np.setdiff1d(np.arange(n.shape[-1]), acc)
            _assert_close(name, f"{what} sensordata pos/vel", m[:, rest], n[:, rest], **tol)
            scale = np.abs(n[:, acc]).max(-1, keepdims=True)
            _assert_close(name, f"{what} sensordata acc", m[:, acc], n[:, acc], TOL_ACC["rtol"],
                          TOL_ACC["atol"] * scale + TOL_ACC_FLOOR)
        else:
            _assert_close(name, f"{what} {f}", m, n, **tol)


def _check_outputs(name, what, nat, mj, tol, acc_dep):
    """Observations, rewards, terminations. Entries that depend on
    acceleration-stage sensors get at least TOL_ACC_OBS."""
    (n_obs, n_rew, n_term), (m_obs, m_rew, m_term) = nat, mj
    obs_dep, rew_dep = acc_dep
    loose = {k: max(tol[k], TOL_ACC_OBS[k]) for k in tol}
    _assert_close(name, f"{what} obs", m_obs[:, ~obs_dep], n_obs[:, ~obs_dep], **tol)
    if obs_dep.any():
        _assert_close(name, f"{what} obs (acc sensors)", m_obs[:, obs_dep], n_obs[:, obs_dep],
                      **loose)
    # A thresholded reward (sparse tasks) may flip for a state within float32
    # noise of its threshold; that is only excused where the observation of
    # that very transition already differs beyond float32 rounding.
    rtol = (loose if rew_dep else tol)["atol"]
    diff = np.abs(m_rew - n_rew)
    obs_same = np.isclose(m_obs, n_obs, **TOL_STATE).all(-1)
    if REPORT:
        print(f"\n[mjx-report] {name:24s} {what + ' reward':28s} "
              f"max|diff|={diff.max(initial=0):.2e}")
    wrong = (diff > rtol) & obs_same
    assert not wrong.any(), (f"{name}: {what} rewards differ by {diff[wrong].max():.2e} "
                             f"at {np.flatnonzero(wrong)[:5]}")
    wrong = (m_term != n_term) & obs_same
    assert not wrong.any(), f"{name}: {what} terminations differ at {np.flatnonzero(wrong)[:5]}"


# --- tests ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", PARAMS)
def test_identical_states_same_fields_obs_reward(name):
    env = _mjx_or_skip(name)
    out = _compare(name)
    _check_fields(name, "identical state", *out["fwd_fields"], env, TOL_STATE)
    _check_outputs(name, "identical state", *out["fwd"], TOL_STATE, out["acc_dep"])


@pytest.mark.parametrize("name", PARAMS)
def test_one_step_from_identical_states(name):
    env = _mjx_or_skip(name)
    out = _compare(name)
    _check_fields(name, "one step", *out["one_fields"], env, TOL_ONE_STEP)
    _check_outputs(name, "one step", *out["one"], TOL_ONE_STEP, out["acc_dep"])


@pytest.mark.parametrize("name", PARAMS)
def test_short_trajectories_agree(name):
    _mjx_or_skip(name)
    out = _compare(name)
    n_bad, m_bad = out["bad"]
    assert not n_bad.any() and not m_bad.any(), f"{name}: a simulation diverged"
    _check_outputs(name, f"{T} steps", *out["free"], TOL_TRAJ, out["acc_dep"])


@pytest.mark.parametrize("name", PARAMS)
def test_unsupported_feature_is_one_clear_line_and_native_still_works(name):
    env = _mjx(name)
    if not isinstance(env, UserError):
        pytest.skip("supported on mjx")
    msg = str(env)
    assert "\n" not in msg and "MJX lacks" in msg and name in msg and "native" in msg, msg
    # the named feature is MJX's own verdict on this model
    import copy
    from mujoco import mjx
    from common.envs.mjx_backend import _clean, unsupported_features
    nat = _native(name)
    reasons = unsupported_features(nat.model, nat.native.fields)
    if not reasons:
        model = copy.deepcopy(nat.model)
        model.opt.enableflags &= ~int(mujoco.mjtEnableBit.mjENBL_ENERGY)
        with pytest.raises(NotImplementedError) as e:
            mjx.put_model(model)
        reasons = (_clean(e.value),)
    assert all(r in msg for r in reasons), (msg, reasons)
    s = jax.jit(nat.step)(nat.reset(jax.random.PRNGKey(0)), jnp.zeros(nat.action_size))
    assert np.isfinite(np.asarray(s.obs)).all()


# --- the public API on mjx: jit, nested vmap, auto-reset, init_state, divergence ----

API_TASK = "pendulum_swingup"  # the cheapest model to compile


def test_api_under_jit_and_nested_vmap():
    if API_TASK not in TASKS:
        pytest.skip(f"{API_TASK} not registered")
    env, nat = _mjx_or_skip(API_TASK), _native(API_TASK)
    vv = lambda f: jax.jit(jax.vmap(jax.vmap(f)))          # seeds x envs
    keys = jax.random.split(jax.random.PRNGKey(3), 4).reshape(2, 2, -1)
    s, ns = vv(env.reset)(keys), vv(nat.reset)(keys)
    # same keys draw the same pool states on both backends
    np.testing.assert_array_equal(np.asarray(s.obs), np.asarray(ns.obs))
    np.testing.assert_array_equal(np.asarray(vv(env.qpos)(s)), np.asarray(vv(nat.qpos)(ns)))
    np.testing.assert_array_equal(np.asarray(vv(env.qvel)(s)), np.asarray(vv(nat.qvel)(ns)))

    step, nstep = vv(env.step), vv(nat.step)
    a = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (2, 2, env.action_size)), jnp.float32)
    s1, ns1 = step(s, a), nstep(ns, a)
    np.testing.assert_allclose(np.asarray(s1.obs), np.asarray(ns1.obs), **TOL_ONE_STEP)
    np.testing.assert_allclose(np.asarray(s1.reward), np.asarray(ns1.reward),
                               atol=TOL_ONE_STEP["atol"])
    np.testing.assert_allclose(np.asarray(vv(env.qpos)(s1)), np.asarray(vv(nat.qpos)(ns1)),
                               **TOL_ONE_STEP)
    assert not np.asarray(s1.truncated).any() and (np.asarray(s1.info["episode_length"]) == 1).all()

    # the time limit truncates and auto-resets from the pool, keeping the final obs
    info = dict(s1.info, episode_length=jnp.full((2, 2), env.episode_length - 1, jnp.int32))
    s2 = step(s1._replace(info=info), a)
    assert np.asarray(s2.truncated).all() and not np.asarray(s2.terminated).any()
    pool_obs = np.asarray(env.pool.obs)
    obs2 = np.asarray(s2.obs).reshape(-1, env.observation_size)
    assert all((pool_obs == o).all(-1).any() for o in obs2)
    assert np.isfinite(np.asarray(s2.info["final_obs"])).all()
    assert not np.array_equal(np.asarray(s2.info["final_obs"]), np.asarray(s2.obs))

    # init_state from traced qpos/qvel matches native's reset-time forward; a
    # diverging simulation (absurd velocity) is cut, counted and reset
    q = np.array(vv(env.qpos)(s1), np.float32)
    v = np.array(vv(env.qvel)(s1), np.float32)
    v[1, 1] = 1e12
    init = vv(env.init_state)
    si = init(jnp.asarray(q), jnp.asarray(v))
    nsi = vv(nat.init_state)(jnp.asarray(q), jnp.asarray(v))
    np.testing.assert_allclose(np.asarray(si.obs)[0], np.asarray(nsi.obs)[0], **TOL_STATE)
    s3 = step(si, a)
    bad = np.zeros((2, 2), bool)
    bad[1, 1] = True
    np.testing.assert_array_equal(np.asarray(s3.info["nonfinite"]), bad.astype(np.int32))
    np.testing.assert_array_equal(np.asarray(s3.truncated), bad)
    assert np.isfinite(np.asarray(s3.obs)).all() and np.isfinite(np.asarray(s3.reward)).all()
    np.testing.assert_allclose(np.asarray(s3.obs)[0], np.asarray(nstep(nsi, a).obs)[0],
                               **TOL_ONE_STEP)


def test_unsupported_feature_message_for_a_model_mjx_cannot_run():
    """Whatever the registered tasks need: an ellipsoid-box contact and the
    noslip solver are named, on one line."""
    from common.envs.mjx_backend import MjxPhysics
    xml = """<mujoco><option noslip_iterations="{n}"/><worldbody>
      <geom type="box" size="1 1 .1"/>
      <body pos="0 0 1"><freejoint/><geom type="ellipsoid" size=".1 .2 .3"/></body>
    </worldbody></mujoco>"""
    for n, feature in ((0, "ellipsoid-box collisions"), (3, "noslip solver")):
        model = mujoco.MjModel.from_xml_string(xml.format(n=n))
        shapes = {"qpos": (model.nq,), "qvel": (model.nv,)}
        with pytest.raises(UserError) as e:
            MjxPhysics(model, 1, ("qpos", "qvel"), "toy_task", shapes)
        msg = str(e.value)
        assert "\n" not in msg and feature in msg and "toy_task" in msg and "native" in msg, msg
