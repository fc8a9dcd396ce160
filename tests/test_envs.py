"""Semantics of the env layer on the native backend: names and errors, sizes,
reset distribution, time limit, auto-reset, batching and the host callback,
keys, and diverging simulations. (Parity of every step with dm_control is in
test_envs_parity.py.)"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import envs
from common.envs import native as native_mod
from common.errors import UserError

CHEAP = ("cartpole_balance", "cheetah_run", "walker_walk", "humanoid_walk")


def _dm_load(name, seed):
    from dm_control import suite
    domain, task = envs._REGISTRY[name][:2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return suite.load(domain, task, task_kwargs={"random": seed})


def _flat_size(obs):
    return sum(int(np.prod(np.shape(v))) for v in obs.values())


# --- shared envs and compiled functions -------------------------------------------

@pytest.fixture(scope="module")
def cartpole():
    return envs.make("cartpole_balance", "native", pool_size=16)


@pytest.fixture(scope="module")
def cartpole_fns(cartpole):
    env = cartpole
    return dict(reset=jax.jit(jax.vmap(env.reset)), step=jax.jit(jax.vmap(env.step)),
                step1=jax.jit(env.step), qpos=jax.jit(env.qpos), qvel=jax.jit(env.qvel))


def _reset_set(env, reset, n=256, qpos=None):
    """The distinct first observations and qpos over many resets (covers a small pool)."""
    s = reset(jax.random.split(jax.random.PRNGKey(123), n))
    q = (qpos or jax.jit(env.qpos))(s)
    return np.unique(np.asarray(s.obs), axis=0), np.unique(np.asarray(q), axis=0)


def _np(tree):
    return jax.tree.map(np.asarray, tree)


def _is_row_of(x, rows):
    return bool((np.asarray(rows) == np.asarray(x)[None]).all(-1).any())


# --- names and errors -------------------------------------------------------------

def test_unknown_task_lists_valid_names():
    with pytest.raises(UserError) as e:
        envs.make("cheetah_walk", "native")
    msg = str(e.value)
    assert "cheetah_walk" in msg
    for name in CHEAP:
        assert name in msg
    assert "\n" not in msg


def test_unknown_backend_lists_choices():
    with pytest.raises(UserError) as e:
        envs.make("cartpole_balance", "cuda")
    assert "cuda" in str(e.value)
    for b in ("auto", "native", "mjx"):
        assert b in str(e.value)
    with pytest.raises(UserError):
        envs.make("cartpole_balance", "native", pool_size=0)


def test_names_are_dm_control_tasks():
    from dm_control import suite
    names = envs.names()
    assert list(names) == sorted(set(names))
    assert set(CHEAP) <= set(names)
    dm_names = {f"{d}_{t}" for d, t in suite.ALL_TASKS}
    assert set(names) <= dm_names, sorted(set(names) - dm_names)


def test_auto_backend_follows_the_device():
    # every platform, faked, in test_startup.py
    expected = "mjx" if jax.default_backend() in envs.GPU_PLATFORMS else "native"
    assert envs.resolve_backend("auto") == expected
    assert envs.resolve_backend("native") == "native" and envs.resolve_backend("mjx") == "mjx"


# --- sizes --------------------------------------------------------------------------

@pytest.mark.parametrize("name", CHEAP)
def test_sizes_match_dm_control(name):
    env = envs.make(name, "native", pool_size=2)
    dm = _dm_load(name, 0)
    ts = dm.reset()
    assert env.observation_size == _flat_size(ts.observation)
    assert env.action_size == dm.action_spec().shape[0]
    assert env.control_timestep == pytest.approx(dm.control_timestep())
    assert env.episode_length == 1000
    state = jax.eval_shape(env.reset, jax.random.PRNGKey(0))
    assert state.obs.shape == (env.observation_size,) and state.obs.dtype == jnp.float32
    assert jax.eval_shape(env.qpos, state).shape == (dm.physics.model.nq,)
    assert jax.eval_shape(env.qvel, state).shape == (dm.physics.model.nv,)


# --- reset distribution -------------------------------------------------------------

@pytest.mark.parametrize("name", ["cartpole_balance", "walker_walk"])
def test_reset_distribution_matches_dm_control(name):
    """Moments of qpos/qvel over the pool's resets agree with those of dm_control's
    own resets drawn with another seed, within sampling error."""
    n = 256
    env = envs.make(name, "native", pool_size=n, pool_seed=3)
    s = jax.jit(lambda k: (lambda s: (env.qpos(s), env.qvel(s)))(jax.vmap(env.reset)(k)))(
        jax.random.split(jax.random.PRNGKey(0), 4 * n))
    ours = np.concatenate([np.asarray(x) for x in s], -1).astype(np.float64)
    n_ours = len(np.unique(ours, axis=0))  # resets repeat pool states: count each once
    assert n_ours > n // 2
    dm = _dm_load(name, 777)
    theirs = []
    for _ in range(n):
        dm.reset()
        theirs.append(np.concatenate([dm.physics.data.qpos, dm.physics.data.qvel]))
    theirs = np.asarray(theirs)
    m1, m2 = ours.mean(0), theirs.mean(0)
    s1, s2 = ours.std(0), theirs.std(0)
    assert (s2 > 0).any()
    se = np.sqrt(s1 ** 2 / n_ours + s2 ** 2 / n) + 1e-7
    assert (np.abs(m1 - m2) < 5 * se).all(), (m1, m2, se)
    varies = s2 > 1e-6
    np.testing.assert_array_less(s1[~varies], 1e-6)
    # relative sampling error of a standard deviation is about 1/sqrt(2n) each
    bound = 5 * np.sqrt(1 / (2 * n_ours) + 1 / (2 * n))
    assert (np.abs(np.log(s1[varies] / s2[varies])) < bound).all(), (s1, s2)


def test_pool_is_dm_control_first_resets_whatever_was_built_before():
    """The pool is the first `pool_size` resets of a dm_control env seeded with
    `pool_seed`, independent of pools built earlier in the process."""
    envs.make("cartpole_balance", "native", pool_size=4, pool_seed=11)
    env = envs.make("cartpole_balance", "native", pool_size=8, pool_seed=11)
    dm = _dm_load("cartpole_balance", 11)
    expected = []
    for _ in range(8):
        dm.reset()
        expected.append(dm.physics.data.qpos.astype(np.float32))
    _, qpos = _reset_set(env, jax.jit(jax.vmap(env.reset)), 128)
    assert len(qpos) == 8
    for q in qpos:
        assert _is_row_of(q, expected), q


def test_keys_give_different_resets_and_same_key_the_same(cartpole, cartpole_fns):
    reset = cartpole_fns["reset"]
    keys = jax.random.split(jax.random.PRNGKey(7), 16)
    a, b = reset(keys), reset(keys)
    np.testing.assert_array_equal(np.asarray(a.obs), np.asarray(b.obs))
    np.testing.assert_array_equal(np.asarray(a.physics), np.asarray(b.physics))
    assert len(np.unique(np.asarray(a.obs), axis=0)) >= 8  # pool of 16
    c = reset(jax.random.split(jax.random.PRNGKey(8), 16))
    assert not np.array_equal(np.asarray(a.obs), np.asarray(c.obs))


# --- time limit and auto-reset --------------------------------------------------------

@pytest.fixture(scope="module")
def episode(cartpole, cartpole_fns):
    """3 cartpole envs: 999 steps with per-step records, then the 1000th and 1001st."""
    env, n = cartpole, 3
    step = jax.vmap(env.step)
    act = jnp.zeros((n, env.action_size))

    @jax.jit
    def run(s):
        def body(s, _):
            s = step(s, act)
            return s, (s.truncated, s.terminated, s.info["episode_length"], s.reward,
                       s.info["episode_return"], s.obs, s.info["final_obs"])
        return jax.lax.scan(body, s, None, length=999)

    s0 = cartpole_fns["reset"](jax.random.split(jax.random.PRNGKey(1), n))
    s999, ys = run(s0)
    s1000 = cartpole_fns["step"](s999, act)
    s1001 = cartpole_fns["step"](s1000, act)
    return dict(s0=s0, s999=s999, ys=[np.asarray(y) for y in ys], s1000=s1000, s1001=s1001, act=act)


def test_truncation_at_exactly_episode_length(episode):
    trunc, term, length, _, _, _, _ = episode["ys"]
    assert not trunc.any() and not term.any()
    np.testing.assert_array_equal(length[:, 0], np.arange(1, 1000))
    s = episode["s1000"]
    assert np.asarray(s.truncated).all() and not np.asarray(s.terminated).any()
    np.testing.assert_array_equal(np.asarray(s.info["episode_length"]), 1000)
    s = episode["s1001"]  # the next episode's first step
    assert not np.asarray(s.truncated).any()
    np.testing.assert_array_equal(np.asarray(s.info["episode_length"]), 1)
    np.testing.assert_array_equal(np.asarray(s.info["episode_return"]), np.asarray(s.reward))


def test_auto_reset_keeps_final_obs_and_episode_stats(cartpole, cartpole_fns, episode):
    env = cartpole
    _, _, _, reward, ret, obs, final_obs = episode["ys"]
    np.testing.assert_array_equal(obs, final_obs)  # no reset before the limit
    s999, s1000 = episode["s999"], episode["s1000"]
    # the same transition without the time limit: the true last observation
    info = dict(s999.info, episode_length=jnp.zeros_like(s999.info["episode_length"]))
    free = cartpole_fns["step"](s999._replace(info=info), episode["act"])
    assert not np.asarray(free.truncated).any()
    np.testing.assert_array_equal(np.asarray(s1000.info["final_obs"]), np.asarray(free.obs))
    np.testing.assert_array_equal(np.asarray(s1000.reward), np.asarray(free.reward))
    # while obs and physics are those of a fresh reset
    reset_obs, reset_qpos = _reset_set(env, cartpole_fns["reset"], qpos=cartpole_fns["qpos"])
    obs, qpos = np.asarray(s1000.obs), np.asarray(cartpole_fns["qpos"](s1000))
    free_obs = np.asarray(free.obs)
    for i in range(3):
        assert _is_row_of(obs[i], reset_obs)
        assert _is_row_of(qpos[i], reset_qpos)
        assert not _is_row_of(free_obs[i], reset_obs)
    # episode statistics are those of the finished episode
    total = np.concatenate([reward, np.asarray(s1000.reward)[None]]).astype(np.float64).sum(0)
    np.testing.assert_allclose(np.asarray(s1000.info["episode_return"]), total, rtol=1e-5)
    np.testing.assert_allclose(ret[-1], reward.astype(np.float64).sum(0), rtol=1e-5)
    assert (total > 100).all()  # a real return, not a reset value


# --- batching and the host callback -----------------------------------------------------

def test_nested_vmap_one_callback_per_step_and_same_results(cartpole, cartpole_fns, monkeypatch):
    env = cartpole
    calls, orig = [], env.native.host_step

    def counting(bits, action):
        calls.append(bits.shape)
        return orig(bits, action)

    monkeypatch.setattr(env.native, "host_step", counting)  # read when the callback is traced
    seeds, n, steps = 2, 3, 5
    keys = jax.random.split(jax.random.PRNGKey(0), seeds * n).reshape(seeds, n, 2)
    acts = jax.random.uniform(jax.random.PRNGKey(1), (steps, seeds, n, env.action_size),
                              minval=-1, maxval=1)

    @jax.jit
    def run(keys, acts):
        s = jax.vmap(jax.vmap(env.reset))(keys)
        step = jax.vmap(jax.vmap(env.step))
        return s, jax.lax.scan(lambda s, a: (step(s, a), s.obs), s, acts)[0]

    s0, s = run(keys, acts)
    jax.block_until_ready(s)
    assert len(calls) == steps, calls
    assert all(shape[:-1] == (seeds, n) for shape in calls), calls
    # each env of the nested batch is that env run alone
    for i, j in ((0, 0), (1, 2)):
        si = jax.tree.map(lambda x: x[i, j], s0)
        for t in range(steps):
            si = cartpole_fns["step1"](si, acts[t, i, j])
        np.testing.assert_array_equal(np.asarray(si.physics), np.asarray(s.physics[i, j]))
        np.testing.assert_array_equal(np.asarray(si.obs), np.asarray(s.obs[i, j]))


def test_split_observation_stage_is_bit_identical():
    """Large batches compute the observation stage on a constraint-free copy of
    the model in a second call; small ones in the step's own call. Same bits."""
    name = "humanoid_walk"  # contacts, acceleration-stage sensors
    env = envs.make(name, "native", pool_size=64)
    # every field the split path accepts, not only those humanoid reads
    fields = tuple(sorted(native_mod._KINEMATIC_FIELDS))
    fast = native_mod.NativePhysics(env.model, env.n_sub_steps, fields)
    ref = native_mod.NativePhysics(env.model, env.n_sub_steps, fields)
    ref.split = False
    n = max(native_mod.SPLIT_MIN, 64)
    assert fast._split(n) and not ref._split(n)
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    bits = np.asarray(jax.jit(jax.vmap(env.reset))(keys).physics)
    rng = np.random.default_rng(0)
    for t in range(25):  # falls and lands: contacts
        a = rng.uniform(-1, 1, (n, env.action_size)).astype(np.float32)
        out, expected = fast.host_step(bits, a), ref.host_step(bits, a)
        for x, y in zip(out, expected):
            np.testing.assert_array_equal(x, y, err_msg=f"step {t}")
        bits = out[0]
    assert fast._batch(n, "stage") is not None


def test_thread_count_does_not_change_the_bits():
    """The pool steps each env on one of `nthread` threads (one per core by
    default; the test workers are pinned to one core, so ask for 3 here)."""
    env = envs.make("humanoid_walk", "native", pool_size=16)
    fields = env.native.fields
    one, many = (native_mod.NativePhysics(env.model, env.n_sub_steps, fields, k) for k in (1, 3))
    n = 24
    bits = np.asarray(jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(5), n))
                      .physics)
    rng = np.random.default_rng(1)
    for t in range(25):
        a = rng.uniform(-1, 1, (n, env.action_size)).astype(np.float32)
        out, expected = many.host_step(bits, a), one.host_step(bits, a)
        for x, y in zip(out, expected):
            np.testing.assert_array_equal(x, y, err_msg=f"step {t}")
        bits = out[0]
    # the batches that stepped really ran on 3 threads and on 1
    assert [p._batches[(n, "step")].nthread for p in (many, one)] == [3, 1]


# --- diverging simulations --------------------------------------------------------------

@pytest.mark.parametrize("bad", [1e30, np.nan])
def test_diverging_simulation_is_reset_and_counted(cartpole, cartpole_fns, bad):
    env = cartpole
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    good = cartpole_fns["reset"](keys)
    qpos = np.asarray(cartpole_fns["qpos"](good), np.float64)
    qvel = np.asarray(cartpole_fns["qvel"](good), np.float64)
    qvel[1] = bad  # env 1 diverges
    s = jax.vmap(lambda q, v, k: env.init_state(q, v, key=k))(jnp.asarray(qpos), jnp.asarray(qvel),
                                                               keys)
    act = jnp.zeros((3, env.action_size))
    s1 = cartpole_fns["step"](s, act)
    q1, v1 = cartpole_fns["qpos"](s1), cartpole_fns["qvel"](s1)
    s1 = _np(s1)
    np.testing.assert_array_equal(s1.info["nonfinite"], [0, 1, 0])
    for x in (s1.obs, s1.reward, s1.info["final_obs"], s1.info["episode_return"], q1, v1):
        assert np.isfinite(np.asarray(x)).all()
    assert s1.truncated[1] and not s1.terminated[1]
    assert s1.reward[1] == 0.0
    reset_obs, _ = _reset_set(env, cartpole_fns["reset"], qpos=cartpole_fns["qpos"])
    assert _is_row_of(s1.obs[1], reset_obs)
    # the other envs are untouched by their neighbour
    alone = cartpole_fns["step1"](jax.tree.map(lambda x: x[0], s), act[0])
    np.testing.assert_array_equal(np.asarray(alone.physics), s1.physics[0])
    assert not s1.truncated[0]
    # the counter persists across the reset, and the new episode runs on
    s2 = cartpole_fns["step"](s1, act)
    np.testing.assert_array_equal(np.asarray(s2.info["nonfinite"]), [0, 1, 0])
    assert np.isfinite(np.asarray(s2.obs)).all()
    np.testing.assert_array_equal(np.asarray(s2.info["episode_length"]), [2, 1, 2])
    # the same slot diverging again is caught again (MuJoCo's own reset of the
    # simulation leaves a finite state: only its warnings tell)
    again = cartpole_fns["step"](s, act)
    np.testing.assert_array_equal(np.asarray(again.info["nonfinite"]), [0, 1, 0])
    np.testing.assert_array_equal(np.asarray(again.physics), np.asarray(s1.physics))
    # and a non-finite last observation (as MJX's forward of such a state
    # gives) does not leak into final_obs
    nan_obs = s.obs.at[1].set(jnp.nan)
    s3 = cartpole_fns["step"](s._replace(obs=nan_obs), act)
    assert np.isfinite(np.asarray(s3.info["final_obs"])).all()
    assert np.isfinite(np.asarray(s3.obs)).all()


def test_init_state_keeps_equality_constraints_on():
    """The reset-time forward of init_state (native) starts from the state
    mj_resetData leaves: quadruped's tendon couplings (equality constraints)
    stay active, so force/torque observations at a contact state equal
    dm_control's own reset-time forward. (A zeroed row switched them off:
    force readings of ~25 instead of ~1400 at some states.)"""
    from dm_control import suite
    env = envs.make("quadruped_run", "native", pool_size=4)
    dm = suite.load("quadruped", "run", task_kwargs={"random": 0})
    dm.reset()
    rng = np.random.default_rng(0)
    for _ in range(40):  # into contact with the floor
        dm.step(rng.uniform(-1, 1, dm.action_spec().shape))
    p = dm.physics
    q, v, ws = p.data.qpos.copy(), p.data.qvel.copy(), p.data.qacc_warmstart.copy()
    assert p.data.ncon > 0
    p.reset()
    p.data.qpos[:], p.data.qvel[:], p.data.qacc_warmstart[:] = q, v, ws
    p.after_reset()  # dm_control's reset-time forward (actuation off)
    expected = np.concatenate([np.ravel(x) for x in dm.task.get_observation(p).values()])
    state = env.init_state(q, v, ws)
    np.testing.assert_allclose(np.asarray(state.obs), expected, rtol=1e-4, atol=1e-4)
