"""Native backend vs dm_control's own Environment.step, for every task.

From the same physics state (dm_control's reset, copied with init_state), the
same random actions give the same observations and rewards to float32
rounding. CI runs 200 steps a task; `pytest -m slow` runs all 1000.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import envs

TASKS = envs.names()


def _flat(obs):
    return np.concatenate([np.ravel(v) for v in obs.values()])


def _parity(name, nsteps):
    env = envs.make(name, "native", pool_size=4)
    domain, task = envs._REGISTRY[name][:2]
    dm = envs._dm_env(domain, task, 1234)
    ts = dm.reset()
    ph = dm.physics
    state = env.init_state(ph.data.qpos.copy(), ph.data.qvel.copy(), ph.data.qacc_warmstart.copy(),
                           env.task.episode_params(ph))
    np.testing.assert_allclose(np.asarray(state.obs), _flat(ts.observation), rtol=1e-5, atol=1e-5)
    step = jax.jit(env.step)
    rng = np.random.default_rng(0)
    for t in range(nsteps):
        a = rng.uniform(-1, 1, env.action_size).astype(np.float32)
        ts = dm.step(a.astype(np.float64))
        state = step(state, jnp.asarray(a))
        np.testing.assert_allclose(np.asarray(state.info["final_obs"]), _flat(ts.observation),
                                   rtol=1e-5, atol=1e-5, err_msg=f"{name} obs at step {t}")
        np.testing.assert_allclose(float(state.reward), ts.reward, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{name} reward at step {t}")
    return state


@pytest.mark.parametrize("name", TASKS)
def test_native_matches_dm_control(name):
    _parity(name, 200)


@pytest.mark.slow
@pytest.mark.parametrize("name", TASKS)
def test_native_matches_dm_control_full_episode(name):
    state = _parity(name, 1000)
    assert bool(state.truncated) and not bool(state.terminated)


def test_registry_has_benchmark_tasks():
    from dm_control import suite
    expected = {f"{d}_{t}" for d, t in suite.BENCHMARKING} | {"quadruped_walk", "quadruped_run"}
    assert expected <= set(TASKS), sorted(expected - set(TASKS))
