"""D4PG end to end: smoke on both backends, seeds, resume, bad input, the
categorical projection and target, learning. Tiny networks and budgets; the
compiled program is shared by the module."""
import functools

import jax.numpy as jnp
import numpy as np
import pytest

from algos import d4pg
from tests import agent_checks as checks

TINY = d4pg.Config(env="cartpole_balance", backend="native", num_envs=2, num_seeds=2,
                   total_timesteps=2000, learning_starts=500, batch_size=32, buffer_size=1000,
                   hidden_sizes=(16, 16), eval_every=1000, eval_episodes=2, checkpoint_every=1000,
                   n_step=3, num_atoms=21)


@pytest.fixture(scope="module")
def tiny_run():
    return checks.tiny_run(d4pg, TINY)


def test_smoke_native_two_seeds(tiny_run):
    checks.check_smoke(tiny_run)
    kernel = tiny_run["final"].critic_params["params"]["Dense_2"]["kernel"]
    assert kernel.shape == (2, 16, 21)                      # one logit per atom
    assert 0 <= tiny_run["history"]["losses/qf1_values"][:, -1].min()


def test_seeds_get_their_own_streams(tiny_run):
    checks.check_seeds_differ(tiny_run)


def test_resume_is_bitwise_identical(tiny_run, tmp_path):
    checks.check_resume_bitwise(tiny_run, "d4pg", tmp_path)


def test_checkpoint_of_other_agent_or_shape_is_refused(tiny_run, tmp_path, capsys):
    checks.check_checkpoint_refused(tiny_run, d4pg, "d4pg", tmp_path, capsys)


# -m slow: TD3's MJX smoke covers the off-policy agents in CI (agent_checks.py)
@pytest.mark.slow
def test_smoke_mjx():
    checks.check_mjx_smoke(d4pg, TINY)


# --------------------------------------------------------------------- categorical critic

@pytest.mark.parametrize("dense", [False, True], ids=["scatter (CPU)", "dense (accelerator)"])
def test_projection(dense):
    checks.check_projection(functools.partial(d4pg.categorical_projection, dense=dense))


def test_td_target_projects_the_target_critic_distribution():
    support = jnp.linspace(0.0, 4.0, 5)
    probs = jnp.array([[0.0, 1.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0, 0.5]])
    logits = jnp.log(probs + 1e-30)
    y = d4pg.td_target(jnp.array([0.5, 1.0]), jnp.array([1.0, 0.0]), logits, 0.0, 4.0)
    np.testing.assert_allclose(y, [[0, .5, .5, 0, 0], [0, 1, 0, 0, 0]], atol=1e-6)
    # its mean is the scalar TD target where nothing is clipped
    np.testing.assert_allclose((y * support).sum(-1), [0.5 + 1.0, 1.0], rtol=1e-6)


def test_defaults_follow_the_paper_and_dm_control():
    c = d4pg.Config()
    assert (c.num_atoms, c.v_min, c.v_max, c.n_step) == (101, 0.0, 100.0, 5)


# --------------------------------------------------------------------- CLI

def test_cli_help(capsys):
    checks.check_help(d4pg, capsys, "--num-atoms", "--v-min", "--v-max", "target networks")


BAD = checks.BAD + [(["--num-atoms", "1"], "num-atoms must be at least 2"),
                    (["--v-min", "10", "--v-max", "0"], "must be below --v-max")]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_one_line_exit_2_no_run_dir(args, message, tmp_path, capsys):
    checks.check_bad_input(d4pg, args, message, tmp_path, capsys)


# --------------------------------------------------------------------- learning

LEARN = d4pg.Config(env="cartpole_balance", backend="native", num_envs=1, num_seeds=2,
                    eval_every=2000, eval_episodes=4, checkpoint_every=0, total_timesteps=30000,
                    learning_starts=1000, buffer_size=30000, batch_size=128, hidden_sizes=(64, 64),
                    n_step=3, num_atoms=51, actor_lr=1e-3, critic_lr=1e-3, tau=0.01)


def test_learns_cartpole_balance():
    """Zero action scores 714 and random actions 325-413: >= 950 needs a policy that
    balances. Criterion over the last three evaluations (26k, 28k, 30k steps):
    the best >= 950 and the median >= 900. Measured on 8 seeds (two batches of
    4, split keys): every median of the last three >= 957. With per-seed
    initial states and held-out evaluation (2026-12-03), seeds 1-4 (as
    `--seed 1 --num-seeds 4`): last three 768/983/1000, 720/933/997,
    1000/999/999, 997/947/997, so the median alone (933 for seed 2) would sit
    at the edge; the test trains seeds 1 and 2."""
    returns = checks.learning_run(d4pg, LEARN)
    last = returns[:, -3:]
    assert (last.max(1) >= 950).all() and (np.median(last, 1) >= 900).all(), last


def test_mpo_operator_diagnostic_climbs_a_d4pg_critic(tiny_run, tmp_path):
    """scripts/mpo_operator.py (issue 38's offline check of MPO's improvement
    step) on a D4PG checkpoint: its exact E-step meets its KL bound, and DPG
    and MPO both raise the fresh actor's Q on held-out replay states."""
    import dataclasses
    import os
    import sys

    import jax
    from common import checkpoint
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts"))
    import mpo_operator
    q = jax.random.normal(jax.random.PRNGKey(0), (64, 20))
    for eps in (0.01, 0.1, 1.0):
        w = jax.nn.softmax(q / mpo_operator.solve_temperature(q, eps), -1)
        np.testing.assert_allclose(float(jnp.mean(jnp.sum(w * jnp.log(w * 20), -1))), eps,
                                   rtol=1e-3)
    path = str(tmp_path / "checkpoint.npz")
    checkpoint.save(path, tiny_run["final"], dict(algo="d4pg", env=TINY.env,
                                                  config=dataclasses.asdict(TINY)))
    r = mpo_operator.main([path, "--steps", "40", "--every", "20", "--batch", "32", "--lr",
                           "1e-3", "--operators", "dpg", "mpo N20 s0.2 K1"])
    for name, curve in r["curves"].items():
        assert len(curve) == 3 and np.isfinite(curve).all(), name
        assert curve[-1] > curve[0], (name, curve)
