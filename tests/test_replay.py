"""Replay: n-step windows stop at episode ends; truncation bootstraps from the
true final observation, termination does not bootstrap; sampling stays inside
the stored rows."""
import jax
import jax.numpy as jnp
import numpy as np

from common import replay

GAMMA = 0.9
ADD = jax.jit(replay.add)


def _fill(steps, num_envs=1, rows=16, obs_size=1):
    """steps: list of (obs, reward, terminated, truncated, final_obs[, valid]) per env-0 step."""
    buf = replay.init(rows, num_envs, obs_size, 1, replay.final_slots(rows, 4))
    for obs, r, term, trunc, fin, *valid in steps:
        o = jnp.full((num_envs, obs_size), obs, jnp.float32)
        buf = ADD(buf, o, jnp.zeros((num_envs, 1)), jnp.full((num_envs,), r, jnp.float32),
                         jnp.full((num_envs,), term), jnp.full((num_envs,), trunc),
                         jnp.full((num_envs, obs_size), fin, jnp.float32),
                         jnp.full((num_envs,), valid[0] if valid else True))
    return buf


def _sample_all(buf, n):
    """Sample many times and index results by their start obs (unique here)."""
    b = jax.tree.map(np.asarray, replay.sample(buf, jax.random.PRNGKey(0), 4096, n, GAMMA))
    return {float(b.obs[i, 0]): (b.reward[i], b.discount[i], b.next_obs[i, 0], b.mask[i])
            for i in range(4096)}


def close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-6)


# Episode A: obs 0,1,2 then truncated at obs 2 (final obs 102); reset obs 10,
# episode B: 10, 11 terminated at 11 (final obs 111, unused); reset 20, 21, 22, 23.
STEPS = [(0, 1.0, False, False, 1), (1, 2.0, False, False, 2), (2, 3.0, False, True, 102),
         (10, 4.0, False, False, 11), (11, 5.0, True, False, 111),
         (20, 6.0, False, False, 21), (21, 7.0, False, False, 22), (22, 8.0, False, False, 23),
         (23, 9.0, False, False, 24)]


# A diverged step at obs 3 (the env marks it invalid, reward 0, truncated,
# "final obs" 3 again) inside an episode 0..3, then a reset to 10, 11, 12, 13.
DIVERGED = [(0, 1.0, False, False, 1), (1, 2.0, False, False, 2), (2, 3.0, False, False, 3),
            (3, 0.0, False, True, 3, False),
            (10, 4.0, False, False, 11), (11, 5.0, False, False, 12), (12, 6.0, False, False, 13),
            (13, 7.0, False, False, 14)]


def test_invalid_steps_are_masked_and_windows_stop_before_them():
    s = _sample_all(_fill(DIVERGED), 3)
    assert s[3.0][3] == 0.0                                   # the diverged step itself: masked
    # windows that reach it stop just before it and bootstrap from the real obs 3
    close(s[1.0], (2 + GAMMA * 3, GAMMA ** 2, 3.0, 1.0))
    close(s[2.0], (3.0, GAMMA, 3.0, 1.0))
    close(s[0.0], (1 + GAMMA * 2 + GAMMA ** 2 * 3, GAMMA ** 3, 3.0, 1.0))
    close(s[10.0], (4 + GAMMA * 5 + GAMMA ** 2 * 6, GAMMA ** 3, 13.0, 1.0))
    one = _sample_all(_fill(DIVERGED), 1)
    assert one[3.0][3] == 0.0 and one[2.0][3] == 1.0
    close(one[2.0][:3], (3.0, GAMMA, 3.0))


def test_one_step_truncation_bootstraps_from_final_obs():
    s = _sample_all(_fill(STEPS), 1)
    close(s[2.0], (3.0, GAMMA, 102.0, 1.0))       # truncated: bootstrap from true final obs
    close(s[11.0], (5.0, 0.0, 111.0, 1.0))       # terminated: no bootstrap
    close(s[0.0], (1.0, GAMMA, 1.0, 1.0))
    close(s[10.0], (4.0, GAMMA, 11.0, 1.0))


def test_n_step_windows_stop_at_episode_ends():
    s = _sample_all(_fill(STEPS), 3)
    close(s[0.0][:3], (1 + GAMMA * 2 + GAMMA ** 2 * 3, GAMMA ** 3, 102.0))
    close(s[1.0][:3], (2 + GAMMA * 3, GAMMA ** 2, 102.0))
    close(s[10.0][:3], (4 + GAMMA * 5, 0.0, 111.0))
    close(s[20.0][:3], (6 + GAMMA * 7 + GAMMA ** 2 * 8, GAMMA ** 3, 23.0))
    # windows need obs[t+n] stored: 21 (needs 24, not stored as a row) is never sampled
    assert 21.0 not in s and 22.0 not in s and 23.0 not in s


def test_sampling_after_wraparound_stays_in_valid_rows():
    steps = [(float(i), float(i), False, False, float(i + 1)) for i in range(40)]
    buf = _fill(steps, rows=16)
    s = _sample_all(buf, 2)
    assert min(s) == 24.0 and max(s) == 37.0      # rows 24..39 stored; 38, 39 lack obs[t+2]
    close(s[30.0][:3], (30 + GAMMA * 31, GAMMA ** 2, 32.0))


def test_overwritten_final_obs_is_masked():
    # a side store with 4 slots; 6 one-step episodes overwrite the first two finals
    steps = [(float(i), 1.0, False, True, 100.0 + i) for i in range(6)]
    steps += [(6.0, 0.0, False, False, 7.0)]
    buf = replay.init(16, 1, 1, 1, 4)
    for obs, r, term, trunc, fin in steps:
        buf = ADD(buf, jnp.full((1, 1), obs), jnp.zeros((1, 1)), jnp.full((1,), r),
                         jnp.full((1,), term), jnp.full((1,), trunc), jnp.full((1, 1), fin),
                         jnp.ones(1, bool))
    s = _sample_all(buf, 1)
    assert s[0.0][3] == 0.0 and s[1.0][3] == 0.0
    close(s[2.0], (1.0, GAMMA, 102.0, 1.0))
    close(s[5.0], (1.0, GAMMA, 105.0, 1.0))


def test_per_env_streams_are_separate():
    buf = replay.init(8, 2, 1, 1, 4)
    for t in range(5):
        obs = jnp.array([[t], [100 + t]], jnp.float32)
        buf = ADD(buf, obs, jnp.zeros((2, 1)), obs[:, 0], jnp.zeros(2, bool), jnp.zeros(2, bool),
                  obs, jnp.ones(2, bool))
    b = replay.sample(buf, jax.random.PRNGKey(1), 512, 1, GAMMA)
    assert np.all(np.asarray(b.next_obs - b.obs) == 1.0)
    assert set(np.unique(np.asarray(b.obs) // 100).tolist()) == {0.0, 1.0}


def test_ready_from_the_iteration_equals_can_sample_on_the_buffer():
    """The agents decide whether to update from the iteration index (so the
    cond is not batched over seeds); it must agree with the buffer itself,
    before and after the ring wraps around."""
    rows, n = 6, 3
    buf = replay.init(rows, 2, 1, 1, 4)
    for i in range(3 * rows):
        z = jnp.zeros((2,))
        buf = replay.add(buf, jnp.full((2, 1), float(i)), jnp.zeros((2, 1)), z, z.astype(bool),
                         z.astype(bool), jnp.zeros((2, 1)), jnp.ones(2, bool))
        assert bool(replay.ready(i, n)) == bool(replay.can_sample(buf, n)), i


def test_synthetic_buffer_is_full_and_every_window_counts():
    """replay.synthetic (the benchmark's full buffer): size at capacity, and
    every sampled window, also those cut at its truncations, has mask 1 and
    a discount of gamma^m (no termination)."""
    buf = replay.synthetic(replay.init(500, 2, 3, 1, replay.final_slots(500, 50)),
                           jax.random.PRNGKey(0), 50)
    assert int(buf.size) == 500
    b = replay.sample(buf, jax.random.PRNGKey(1), 4096, 3, 0.9)
    np.testing.assert_array_equal(np.asarray(b.mask), 1.0)
    d = np.asarray(b.discount)
    assert np.isclose(d[:, None], [0.9, 0.81, 0.729], atol=1e-6).any(1).all()
    assert (np.asarray(b.discount) > 0.729 + 1e-5).any()  # windows cut at a truncation
