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


@jax.jit
def _random_buffers(seed):
    """Snapshots after 8, 23, 40, 61 and 69 adds of random rows to a 23-row
    ring of 3 streams: terminations, truncations and invalid steps at
    random, a 5-slot side store (overwritten finals), partly filled, full,
    and wrapped around to several ring positions."""
    E = 3

    def step(buf, k):
        ks = jax.random.split(k, 6)
        u = jax.random.uniform(ks[0], (E,))
        buf = replay.add(buf, jax.random.normal(ks[1], (E, 2)), jax.random.normal(ks[2], (E, 3)),
                         jax.random.normal(ks[3], (E,)), u < 0.1, (u > 0.1) & (u < 0.25),
                         jax.random.normal(ks[4], (E, 2)),
                         jax.random.uniform(ks[5], (E,)) > 0.1)
        return buf, buf
    _, every = jax.lax.scan(step, replay.init(23, E, 2, 3, 5), jax.random.split(seed, 69))
    return [jax.tree.map(lambda x, i=i: x[i - 1], every) for i in (8, 23, 40, 61, 69)]


def test_every_sampler_form_returns_the_reference_batch_bit_for_bit():
    """replay.SAMPLERS (the forms `sample` picks from by platform) agree with
    sample_reference exactly, on buffers with episode ends, truncations,
    invalid steps and overwritten finals, partly filled and wrapped around
    (at several ring positions), for 1- and 5-step windows, also vmapped."""
    assert set(replay.SAMPLERS) >= {"reference"} and replay.SAMPLER["default"] in replay.SAMPLERS
    bufs = _random_buffers(jax.random.PRNGKey(0))
    bufs.append(replay.synthetic(replay.init(23, 3, 2, 3, 5), jax.random.PRNGKey(3),
                                 7)._replace(pos=jnp.int32(21)))
    forms = {name: jax.jit(f, static_argnums=(2, 3)) for name, f in replay.SAMPLERS.items()}
    masked = cut = 0
    for n in (1, 5):
        for j, buf in enumerate(bufs):
            if not bool(replay.can_sample(buf, n)):
                continue
            key = jax.random.PRNGKey(10 + j)
            ref = forms["reference"](buf, key, 2048, n, 0.97)
            masked += int((np.asarray(ref.mask) == 0).sum())
            cut += int((np.asarray(ref.discount) > 0.97 ** n + 1e-6).sum())
            for name, form in forms.items():
                got = form(buf, key, 2048, n, 0.97)
                for field, a, b in zip(replay.Batch._fields, ref, got):
                    np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                                  err_msg=f"{name} {field} n={n} buffer {j}")
    assert masked > 0 and cut > 0   # the buffers hold masked and cut windows
    seeds = jax.tree.map(lambda *x: jnp.stack(x), *bufs[2:5])
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    gamma = jnp.float32(0.97)   # traced, as the agents pass it
    vmapped = {name: jax.jit(jax.vmap(lambda b, k, g, f=f: f(b, k, 512, 5, g), (0, 0, None)))
               for name, f in replay.SAMPLERS.items()}
    ref = vmapped["reference"](seeds, keys, gamma)
    for name, form in vmapped.items():
        got = form(seeds, keys, gamma)
        for field, a, b in zip(replay.Batch._fields, ref, got):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"{name} {field}")
