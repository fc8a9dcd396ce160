"""PPO end to end: smoke on both backends, seeds, resume, deterministic
action, GAE, the clipped objectives, observation statistics, orthogonal
init, CLI, bad input and learning. Tiny networks and budgets; the compiled
program is shared by the module."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import ppo
from common import agent, cli, normalize
from tests import agent_checks as checks

# Every optional branch on (reward normalisation, value clipping, lr annealing),
# rollouts of 4 envs x 8 steps, chunks of 31 rollouts (992 env steps).
TINY = ppo.Config(env="cartpole_balance", backend="native", num_envs=4, num_seeds=2,
                  total_timesteps=2000, num_steps=8, num_minibatches=2, update_epochs=2,
                  actor_hidden_sizes=(8,), critic_hidden_sizes=(8,), eval_every=1000,
                  eval_episodes=2, checkpoint_every=1000, normalize_reward=True, clip_vloss=True,
                  anneal_lr=True)
LOSSES = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
          "losses/clipfrac", "losses/explained_variance")


@pytest.fixture(scope="module")
def tiny_run():
    return checks.tiny_run(ppo, TINY)


def test_smoke_native_two_seeds(tiny_run):
    final, history, train = tiny_run["final"], tiny_run["history"], tiny_run["train"]
    assert train.schedule.steps_per_chunk == 992 and train.schedule.num_chunks == 2
    assert np.isfinite(history["eval/episode_return"]).all()
    for name in LOSSES:
        assert np.isfinite(history[name]).all(), name
    assert tiny_run["logged"] == [((2,), 992), ((2,), 1984)]
    # observation statistics hold every observation the policy acted on
    np.testing.assert_allclose(final.obs_stats.count, [1984 + 1e-4] * 2, rtol=1e-6)
    np.testing.assert_allclose(final.return_stats.count, [1984 + 1e-4] * 2, rtol=1e-6)
    # learning rate annealed linearly over the 62 rollouts
    lr = history["stats/learning_rate"]
    assert np.all(lr[:, 1] < lr[:, 0]) and np.all(lr > 0)


def test_seeds_get_their_own_streams(tiny_run):
    checks.check_seeds_differ(tiny_run)


def test_act_uses_the_clipped_mean_when_deterministic(tiny_run):
    env = tiny_run["train"].env
    act = ppo.make_act(TINY, env)
    state = jax.tree.map(lambda x: x[0], tiny_run["final"])
    obs = jnp.asarray(state.env_state.obs)
    mean, log_std = ppo.Actor(TINY.actor_hidden_sizes, env.action_size).apply(
        state.actor_params, normalize.normalize(state.obs_stats, obs))
    np.testing.assert_allclose(act(state, obs, None, True), jnp.clip(mean, -1, 1), rtol=1e-6)
    a = act(state, obs, jax.random.PRNGKey(0), False)
    b = act(state, obs, jax.random.PRNGKey(1), False)
    assert not np.array_equal(a, b) and np.all(np.abs(a) <= 1)


def test_resume_is_bitwise_identical(tiny_run, tmp_path):
    checks.check_resume_bitwise(tiny_run, "ppo", tmp_path)


def test_checkpoint_of_other_agent_or_shape_is_refused(tiny_run, tmp_path, capsys):
    checks.check_checkpoint_refused(tiny_run, ppo, "ppo", tmp_path, capsys,
                                    bigger={"critic_hidden_sizes": (16,)})


def test_env_groups_stagger_the_host_calls_and_change_no_state(monkeypatch):
    """$RL_ENV_GROUPS=2: two rollouts and their updates end in the same state,
    bit for bit, as with the whole batch stepped at once."""
    from common.envs import native
    config = dataclasses.replace(TINY, num_seeds=1)
    out, starts = {}, []
    start = native.NativePhysics.host_start
    monkeypatch.setattr(native.NativePhysics, "host_start",
                        lambda self, bits, action: (starts.append(bits.shape[0]),
                                                    start(self, bits, action))[1])
    for groups in ("1", "2"):
        monkeypatch.setenv(agent.GROUPS_VAR, groups)
        train = ppo.make_train(config)
        run = jax.jit(lambda s: jax.lax.scan(train.iteration, s, jnp.arange(2))[0])
        out[groups] = jax.device_get(run(train.init(jax.random.PRNGKey(3))))
    for a, b in zip(jax.tree.leaves(out["1"]), jax.tree.leaves(out["2"])):
        np.testing.assert_array_equal(a, b)
    assert starts == [2] * 2 * 2 * TINY.num_steps, starts  # 2 groups of 2 envs, per step


# --------------------------------------------------------------------- maths

def test_gae_hand_computed_with_termination_and_truncation():
    """gamma 0.9, lambda 0.5; step 1 terminates (no bootstrap), step 2 is
    truncated (bootstraps from V(final obs) = 40, not from V(s_3) = 40's
    successor in the window), the trace stops at both; the window ends at 4.

        delta = r + 0.9 (1 - term) V(s') - V(s) = [9, -18, 9, 0.9, 9]
        A_4 = 9, A_3 = 0.9 + 0.45 * 9 = 4.95, A_2 = 9, A_1 = -18,
        A_0 = 9 + 0.45 * (-18) = 0.9
    """
    reward = jnp.array([1.0, 2.0, 3.0, 4.0, 5.0])
    value = jnp.array([10.0, 20.0, 30.0, 40.0, 50.0])
    next_value = jnp.array([20.0, 99.0, 40.0, 41.0, 60.0])
    terminated = jnp.array([False, True, False, False, False])
    truncated = jnp.array([False, False, True, False, False])
    adv, ret = ppo.gae(reward, value, next_value, terminated, terminated | truncated, 0.9, 0.5)
    np.testing.assert_allclose(adv, [0.9, -18.0, 9.0, 4.95, 9.0], rtol=1e-6)
    np.testing.assert_allclose(ret, [10.9, 2.0, 39.0, 44.95, 59.0], rtol=1e-6)
    # batched over envs: [T, E], each column on its own
    stack = lambda x: jnp.stack([x, x[::-1]], 1)
    adv2, _ = ppo.gae(stack(reward), stack(value), stack(next_value), stack(terminated),
                      stack(terminated | truncated), 0.9, 0.5)
    np.testing.assert_allclose(adv2[:, 0], adv, rtol=1e-6)
    rev, _ = ppo.gae(reward[::-1], value[::-1], next_value[::-1], terminated[::-1],
                     (terminated | truncated)[::-1], 0.9, 0.5)
    np.testing.assert_allclose(adv2[:, 1], rev, rtol=1e-6)
    # lambda 1, no episode end: discounted sum of rewards plus bootstrap
    adv, ret = ppo.gae(reward, value, next_value.at[:4].set(value[1:]), jnp.zeros(5, bool),
                       jnp.zeros(5, bool), 0.9, 1.0)
    expect = sum(0.9 ** k * r for k, r in enumerate([1, 2, 3, 4, 5])) + 0.9 ** 5 * 60
    np.testing.assert_allclose(ret[0], expect, rtol=1e-6)


def _grad(log_prob, old_log_prob, advantage, clip=0.2):
    return jax.grad(lambda lp: ppo.policy_loss(lp, old_log_prob, advantage, clip)[0])(log_prob)


def test_clipped_objective_has_zero_gradient_outside_the_clip_range():
    old = jnp.zeros(4)
    ratio = jnp.array([1.5, 0.5, 1.1, 0.9])           # outside, outside, inside, inside
    lp = jnp.log(ratio)
    g = _grad(lp, old, jnp.array([1.0, -1.0, 1.0, -1.0]))
    np.testing.assert_array_equal(g[:2], 0.0)        # A>0 above 1+eps, A<0 below 1-eps
    np.testing.assert_allclose(g[2:], [-1.1 / 4, 0.9 / 4], rtol=1e-5)   # d(-ratio A / n)/d log_prob
    # on the pessimistic side the unclipped term is used, so the gradient stays
    g = _grad(lp, old, jnp.array([-1.0, 1.0, 1.0, 1.0]))
    np.testing.assert_allclose(g[:2], [1.5 / 4, -0.5 / 4], rtol=1e-5)
    loss, (kl, clipfrac) = ppo.policy_loss(lp, old, jnp.ones(4), 0.2)
    assert float(clipfrac) == 0.5 and float(kl) > 0


def test_value_loss_clipping():
    v, old, ret = jnp.array([2.0]), jnp.array([0.0]), jnp.array([3.0])
    assert float(ppo.value_loss(v, old, ret, 0.5, False)) == 0.5
    # clipped value 0.5 is farther from 3: its error counts, and has no gradient
    assert float(ppo.value_loss(v, old, ret, 0.5, True)) == 0.5 * 2.5 ** 2
    assert float(jax.grad(lambda v: ppo.value_loss(v, old, ret, 0.5, True))(v)[0]) == 0.0


def test_normalizer_matches_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, (16, 5)).astype(np.float32) * np.arange(1, 6)
               for _ in range(30)]
    stats = normalize.init(5)
    for b in batches:                      # as PPO folds [num_envs, obs] per step
        stats = normalize.update(stats, jnp.asarray(b))
    data = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-4)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-4)
    np.testing.assert_allclose(stats.count, len(data), rtol=1e-6)
    x = jnp.asarray(data[:4], jnp.float32)
    np.testing.assert_allclose(normalize.normalize(stats, x),
                               (data[:4] - data.mean(0)) / data.std(0), rtol=1e-3, atol=1e-3)


def test_orthogonal_init_is_orthogonal_and_seeded():
    for shape in [(5, 64), (64, 64), (64, 3)]:
        w = np.asarray(agent.orthogonal(np.sqrt(2))(jax.random.PRNGKey(0), shape), np.float64)
        gram = w.T @ w if shape[0] >= shape[1] else w @ w.T
        np.testing.assert_allclose(gram, 2 * np.eye(len(gram)), atol=1e-5)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    ws = jax.vmap(lambda k: agent.orthogonal(1.0)(k, (8, 8)))(keys)
    assert not np.allclose(ws[0], ws[1])


# --------------------------------------------------------------------- mjx backend

def test_smoke_mjx_two_seeds():
    cfg = dataclasses.replace(TINY, backend="mjx", num_envs=2, num_steps=4, total_timesteps=16,
                              eval_episodes=1, eval_every=0, checkpoint_every=0)
    train = ppo.make_train(cfg)
    assert train.env.backend == "mjx"
    run = jax.jit(jax.vmap(train), compiler_options=checks.MJX_COMPILE)
    states, history = run(jax.random.split(jax.random.PRNGKey(3), 2))
    for name in LOSSES + ("eval/episode_return",):
        assert np.isfinite(np.asarray(history[name])[:, -1]).all(), name


# --------------------------------------------------------------------- CLI

def test_cli_help():
    checks.check_script_help("ppo", "--num-steps", "--gae-lambda", "clipped")


BAD = checks.COMMON_BAD + [
    (["--num-envs", "8", "--num-steps", "10", "--total-timesteps", "50"],
     "smaller than one rollout"),
    (["--num-envs", "6", "--num-steps", "5", "--num-minibatches", "4"], "not divisible"),
    (["--gamma", "1.5"], "gamma must be in (0, 1]"),
    (["--critic-hidden-sizes", "0"], "critic-hidden-sizes must be positive"),
    (["--num-envs", str(10 ** 6), "--num-steps", "1000", "--num-minibatches", "1",
      "--total-timesteps", str(10 ** 9)], "GiB"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_one_line_exit_2_no_run_dir(args, message, tmp_path, capsys):
    checks.check_bad_input(ppo, args, message, tmp_path, capsys)


def test_cli_run_then_resume_and_refuse_corrupt(tmp_path):
    args = ["--env", "cartpole_balance", "--backend", "native", "--total-timesteps", "64",
            "--num-envs", "4", "--num-steps", "8", "--num-minibatches", "2", "--update-epochs", "1",
            "--actor-hidden-sizes", "8", "--critic-hidden-sizes", "8", "--eval-episodes", "1"]
    checks.check_script_run_resume_and_corrupt("ppo", args, tmp_path, "num_steps", 8)


# --------------------------------------------------------------------- learning

# In CI: 64 envs x 32 steps (2,048 transitions), 10 epochs of 16 minibatches
# of 128, lr 2e-3 annealed, gamma 0.99 and an initial std of 1 (init_log_std
# 0), 64x64 nets, 300k steps per seed. Measured on a loaded 2-core machine
# (nice 19, 2 seeds vmapped): final evals 954 and 996 (this test's keys,
# PRNGKey(0)) and 974 and 993 (PRNGKey(1)); about 55 s CPU per program (20-23 s
# compile, 30-33 s run; 108-179 s wall under load; 80 s wall inside pytest,
# same 953.6 and 995.8). With 600k steps all 4 seeds
# of PRNGKey(0) split 4 ended at 971-1000 (>= 922 already at 150k). gamma 0.99
# and the larger initial std were what mattered: with gamma 0.995 and
# init_log_std -0.5 one seed in four stayed near 300 after 800k steps (its std
# collapsed to 0.14 early), and with minibatches of 512 (8 epochs) no seed
# learned in 400k steps.
#
# Since each seed trains from its own initial states and evaluation uses
# held-out ones (2026-12-03), 300k steps was too few: 4 seeds (--seed 1
# --num-seeds 4) ended at 512, 999, 986, 887, each having passed 955 earlier
# (the annealed policy still oscillates); at 400k they ended at 989, 999,
# 1000, 997 (218 s for the 4 together on a machine shared with two
# benchmark runs). This test trains seeds 1 and 2, as `--seed 1 --num-seeds 2`.
LEARN_CI = ppo.Config(env="cartpole_balance", backend="native", num_envs=64, num_seeds=2,
                      total_timesteps=400_000, num_steps=32, num_minibatches=16, update_epochs=10,
                      learning_rate=2e-3, anneal_lr=True, max_grad_norm=0.5, normalize_reward=True,
                      reward_scaling=10.0, ent_coef=0.01, clip_coef=0.3, gamma=0.99,
                      gae_lambda=0.95, init_log_std=0.0, actor_hidden_sizes=(64, 64),
                      critic_hidden_sizes=(64, 64), eval_every=0, eval_episodes=5,
                      checkpoint_every=0)

# The earlier CPU-sized setting, kept slow: CleanRL-style minibatching (64
# transitions, 10 epochs) with Brax's reward scaling, entropy cost, clip and
# discount. Measured on 2 shared cores: 6 runs of 800k steps took 533 s
# together (about 9k env steps/s); Brax-style settings reached >= 996 in 3 of 3
# seeds (by 300k-740k steps), the CleanRL settings (no reward scaling or
# entropy, clip 0.2, gamma 0.99) in 2 of 3. At 200k-300k steps only 2 of 20
# runs of several variants had learned.
LEARN = ppo.Config(env="cartpole_balance", backend="native", num_envs=32, num_seeds=2,
                   total_timesteps=800_000, num_steps=64, num_minibatches=32, update_epochs=10,
                   learning_rate=1e-3, anneal_lr=True, max_grad_norm=0.5, normalize_reward=True,
                   reward_scaling=10.0, ent_coef=0.01, clip_coef=0.3, gamma=0.995,
                   init_log_std=-0.5, actor_hidden_sizes=(64, 64), critic_hidden_sizes=(64, 64),
                   eval_every=0, eval_episodes=5, checkpoint_every=0)


def _learns(config):
    """Zero action scores 714 and uniform random actions 325-413: >= 950
    on both seeds (deterministic mean action, full 1000-step episodes) is
    learning."""
    train = ppo.make_train(config)
    keys = jnp.asarray(cli.seed_keys(config.seed, config.num_seeds))
    _, history = jax.jit(jax.vmap(train))(keys)
    final = np.asarray(history["eval/episode_return"])[:, -1]
    print(f"ppo on {config.env}: {config.total_timesteps} steps, final eval {final}")
    assert np.all(final >= 950), final


def test_learns_cartpole_balance_in_ci_time():
    _learns(LEARN_CI)


@pytest.mark.slow
def test_learns_cartpole_balance():
    _learns(LEARN)
