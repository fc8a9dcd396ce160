"""TD3 end to end: smoke on both backends, seeds, target maths, resume,
CLI and bad input. Tiny networks and budgets; compiled programs are shared."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import td3
from tests import agent_checks as checks

TINY = td3.Config(env="cartpole_balance", backend="native", num_envs=2, num_seeds=2,
                  total_timesteps=2000, learning_starts=500, batch_size=32, buffer_size=1000,
                  hidden_sizes=(16, 16), eval_every=1000, eval_episodes=2, checkpoint_every=1000,
                  n_step=3)


@pytest.fixture(scope="module")
def tiny_run():
    return checks.tiny_run(td3, TINY)


def test_smoke_native_two_seeds(tiny_run):
    checks.check_smoke(tiny_run)                           # 1000 rows per seed capped at 500


def test_seeds_get_their_own_streams(tiny_run):
    checks.check_seeds_differ(tiny_run)


def test_resume_is_bitwise_identical(tiny_run, tmp_path):
    checks.check_resume_bitwise(tiny_run, "td3", tmp_path)


def test_checkpoint_of_other_agent_or_shape_is_refused(tiny_run, tmp_path, capsys):
    checks.check_checkpoint_refused(tiny_run, td3, "td3", tmp_path, capsys)


# --------------------------------------------------------------------- target maths

def test_td_target_takes_min_of_twins_and_respects_discount():
    q = jnp.array([[1.0, 5.0, 3.0], [2.0, 4.0, -1.0]])
    y = td3.td_target(jnp.array([1.0, 1.0, 1.0]), jnp.array([0.5, 0.0, 0.9]), q)
    np.testing.assert_allclose(y, [1.5, 1.0, 1.0 - 0.9], rtol=1e-6)


def test_target_smoothing_noise_is_clipped_and_actions_bounded():
    hp = td3.AGENT.hparams(dataclasses.replace(TINY, policy_noise=1e6, noise_clip=0.5))
    low, high = -jnp.ones(3), jnp.ones(3)
    base = jnp.zeros((1000, 3))
    a = td3.smoothed_target_action(base, jax.random.PRNGKey(0), hp, low, high)
    assert np.allclose(np.abs(a), 0.5)                        # huge noise clipped to +-noise_clip
    a = td3.smoothed_target_action(base + 0.9, jax.random.PRNGKey(0), hp, low, high)
    assert a.max() <= 1.0 and np.isclose(a.max(), 1.0)       # then clipped to the bounds
    hp = td3.AGENT.hparams(dataclasses.replace(TINY, policy_noise=0.2, noise_clip=0.5))
    a = td3.smoothed_target_action(base, jax.random.PRNGKey(1), hp, low, high)
    assert 0.15 < float(jnp.std(a)) < 0.25


# --------------------------------------------------------------------- mjx backend

def test_smoke_mjx_two_seeds():
    checks.check_mjx_smoke(td3, TINY)


# --------------------------------------------------------------------- CLI

def test_cli_help():
    checks.check_script_help("td3", "--policy-delay", "target networks")


@pytest.mark.parametrize("args,message", checks.BAD, ids=[m for _, m in checks.BAD])
def test_bad_input_one_line_exit_2_no_run_dir(args, message, tmp_path, capsys):
    checks.check_bad_input(td3, args, message, tmp_path, capsys)


def test_cli_run_then_resume_and_refuse_corrupt(tmp_path):
    args = ["--env", "cartpole_balance", "--total-timesteps", "1000", "--learning-starts", "500",
            "--batch-size", "16", "--buffer-size", "1000", "--hidden-sizes", "8", "8",
            "--eval-episodes", "1"]
    checks.check_script_run_resume_and_corrupt("td3", args, tmp_path, "batch_size", 16)


# --------------------------------------------------------------------- learning

LEARN = td3.Config(env="cartpole_balance", backend="native", num_envs=1, num_seeds=2,
                   eval_every=2000, eval_episodes=4, checkpoint_every=0, total_timesteps=40000,
                   learning_starts=1000, buffer_size=40000, batch_size=128, hidden_sizes=(64, 64),
                   n_step=3, critic_layer_norm=True, actor_lr=1e-3, critic_lr=1e-3, tau=0.01)


def test_learns_cartpole_balance():
    """Zero action scores 714 here and random actions 325-413; >= 950 needs a
    policy that balances. Criterion: median of the last three evaluations
    (36k, 38k, 40k steps). DDPG's budget plus 10k steps (the delayed actor
    learns later). Measured 2026-12-04 for seeds 1-4 (as `--seed 1
    --num-seeds 4`): medians 987, 996, 996, 934 (seed 4 between 840 and 975
    over the last six); with a 30k budget seed 2's last three were 724, 885,
    981. The test trains seeds 1 and 2."""
    returns = checks.learning_run(td3, LEARN)
    assert (np.median(returns[:, -3:], 1) >= 950).all(), returns[:, -3:]
