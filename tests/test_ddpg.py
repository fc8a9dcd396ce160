"""DDPG end to end: smoke (with Ornstein-Uhlenbeck noise) on both backends,
seeds, resume, bad input, OU noise statistics and reset, learning. Tiny
networks and budgets; the compiled program is shared by the module."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import ddpg
from tests import agent_checks as checks

TINY = ddpg.Config(env="cartpole_balance", backend="native", num_envs=2, num_seeds=2,
                   total_timesteps=2000, learning_starts=500, batch_size=32, buffer_size=1000,
                   hidden_sizes=(16, 16), eval_every=1000, eval_episodes=2, checkpoint_every=1000,
                   n_step=3, noise_type="ou")


@pytest.fixture(scope="module")
def tiny_run():
    return checks.tiny_run(ddpg, TINY)


def test_smoke_native_two_seeds(tiny_run):
    checks.check_smoke(tiny_run)
    # OU state: one process per env and seed, carried in the train state
    noise = tiny_run["final"].ou_noise
    assert noise.shape == (2, 2, 1) and np.isfinite(noise).all()
    assert len(np.unique(noise)) == 4


def test_seeds_get_their_own_streams(tiny_run):
    checks.check_seeds_differ(tiny_run)


def test_resume_is_bitwise_identical(tiny_run, tmp_path):
    checks.check_resume_bitwise(tiny_run, "ddpg", tmp_path)


def test_checkpoint_of_other_agent_or_shape_is_refused(tiny_run, tmp_path, capsys):
    checks.check_checkpoint_refused(tiny_run, ddpg, "ddpg", tmp_path, capsys)


# -m slow: TD3's MJX smoke covers the off-policy agents in CI (agent_checks.py)
@pytest.mark.slow
def test_smoke_mjx():
    checks.check_mjx_smoke(ddpg, dataclasses.replace(TINY, noise_type="gaussian"))


# --------------------------------------------------------------------- target and noise

def test_td_target_respects_discount():
    y = ddpg.td_target(jnp.array([1.0, 1.0, 1.0]), jnp.array([0.5, 0.0, 0.9]),
                       jnp.array([1.0, 5.0, -1.0]))
    np.testing.assert_allclose(y, [1.5, 1.0, 1.0 - 0.9], rtol=1e-6)


def test_ou_noise_statistics():
    """Stationary mean 0, std sigma / sqrt(1 - (1 - theta)^2), lag-1 autocorrelation 1 - theta."""
    theta, sigma, E = 0.15, 0.2, 4096
    never = jnp.zeros(E, bool)

    def step(x, key):
        x2 = ddpg.ou_step(x, key, theta, sigma, never)
        return x2, (x, x2)

    x0 = jnp.zeros((E, 1))
    _, (before, after) = jax.lax.scan(step, x0, jax.random.split(jax.random.PRNGKey(0), 300))
    # past burn-in
    before, after = np.asarray(before[100:]).ravel(), np.asarray(after[100:]).ravel()
    stationary = sigma / np.sqrt(1 - (1 - theta) ** 2)
    assert abs(after.mean()) < 0.01
    np.testing.assert_allclose(after.std(), stationary, rtol=0.03)
    np.testing.assert_allclose(np.corrcoef(before, after)[0, 1], 1 - theta, atol=0.01)


def test_ou_noise_resets_at_episode_ends():
    x = jnp.array([[3.0, -3.0], [3.0, -3.0]])
    done = jnp.array([True, False])
    key = jax.random.PRNGKey(1)
    # without fresh noise: the finished env restarts from 0, the other decays
    np.testing.assert_allclose(ddpg.ou_step(x, key, 0.15, 0.0, done), [[0, 0], [2.55, -2.55]],
                               rtol=1e-6)
    # with noise: the finished env's value is the fresh noise alone
    fresh = ddpg.ou_step(jnp.zeros_like(x), key, 0.15, 0.2, done)
    got = ddpg.ou_step(x, key, 0.15, 0.2, done)
    np.testing.assert_allclose(got[0], fresh[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], 0.85 * x[1] + fresh[1], rtol=1e-6)


# --------------------------------------------------------------------- CLI

def test_cli_help(capsys):
    checks.check_help(ddpg, capsys, "--noise-type", "--ou-theta", "target networks")


BAD = checks.BAD + [(["--noise-type", "pink"], "unknown --noise-type 'pink'")]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_one_line_exit_2_no_run_dir(args, message, tmp_path, capsys):
    checks.check_bad_input(ddpg, args, message, tmp_path, capsys)


# --------------------------------------------------------------------- learning

LEARN = ddpg.Config(env="cartpole_balance", backend="native", num_envs=1, num_seeds=2,
                    eval_every=2000, eval_episodes=4, checkpoint_every=0, total_timesteps=30000,
                    learning_starts=1000, buffer_size=30000, batch_size=128, hidden_sizes=(64, 64),
                    n_step=3, critic_layer_norm=True, actor_lr=1e-3, critic_lr=1e-3, tau=0.01)


def test_learns_cartpole_balance():
    """Zero action scores 714 and random actions 325-413; 950 needs a policy that
    balances. Criterion: the best of the last five evaluations (22k-30k steps)
    reaches 950. Not the median as for D4PG/TD4: DDPG's single evaluations
    swing between 450 and 1000 after it has learned (one critic, no clipped
    double-Q); over 6 seeds at this config the best of the last five was
    977-998 and the median 651-998, and with per-seed initial states and
    held-out evaluation (2026-12-03) 1000, 978, 999, 997 for seeds 1-4 (the
    run trains seeds 1 and 2, as `--seed 1 --num-seeds 2`)."""
    returns = checks.learning_run(ddpg, LEARN)
    assert (returns[:, -5:].max(1) >= 950).all(), returns[:, -5:]
