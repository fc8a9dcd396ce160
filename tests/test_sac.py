"""SAC end to end: smoke on both backends, seeds, resume, the squashed
log-density, the soft target, the temperature, bad input and learning.
Tiny networks and budgets; compiled programs are shared."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from algos import sac
from tests import agent_checks as checks

TINY = sac.Config(env="cartpole_balance", backend="native", num_envs=2, num_seeds=2,
                  total_timesteps=2000, learning_starts=500, batch_size=32, buffer_size=1000,
                  hidden_sizes=(16, 16), eval_every=1000, eval_episodes=2, checkpoint_every=1000,
                  n_step=3)


@pytest.fixture(scope="module")
def tiny_run():
    return checks.tiny_run(sac, TINY)


def test_smoke_native_two_seeds(tiny_run):
    checks.check_smoke(tiny_run)
    h = tiny_run["history"]
    for name in ("losses/alpha", "losses/alpha_loss", "stats/entropy"):
        assert np.isfinite(h[name][:, -1]).all(), name
    # the fresh policy's entropy (about 0 nats) is above the target (-1):
    # the temperature falls from its initial 1.0
    assert (h["stats/entropy"][:, -1] > -1).all() and (h["losses/alpha"][:, -1] < 1).all()
    assert (tiny_run["final"].log_alpha < 0).all()


def test_seeds_get_their_own_streams(tiny_run):
    checks.check_seeds_differ(tiny_run)


def test_resume_is_bitwise_identical(tiny_run, tmp_path):
    checks.check_resume_bitwise(tiny_run, "sac", tmp_path)


def test_checkpoint_of_other_agent_is_refused(tiny_run, tmp_path):
    from common import checkpoint
    from common.errors import UserError
    path = str(tmp_path / "c.npz")
    checkpoint.save(path, tiny_run["saved"][0], {"algo": "td3", "env": TINY.env})
    template = jax.eval_shape(jax.vmap(tiny_run["train"].init), tiny_run["keys"])
    with pytest.raises(UserError, match="algo"):
        checkpoint.load(path, template, {"algo": "sac", "env": TINY.env})


# -m slow: TD3's MJX smoke covers the off-policy agents in CI (agent_checks.py)
@pytest.mark.slow
def test_smoke_mjx():
    checks.check_mjx_smoke(sac, TINY)


# --------------------------------------------------------------------- policy density

def _normal_logpdf(u, mean, std):
    return -0.5 * ((u - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)


def test_squashed_log_prob_matches_change_of_variables():
    """log pi(a) = log N(u) - sum log |d tanh(u)/du| with a numerical
    Jacobian, in float64, from the reconstructed pre-tanh sample."""
    mean = jnp.array([[0.3, -1.2, 1.0]]).repeat(4, 0)
    log_std = jnp.array([[-0.5, 0.0, -1.0]]).repeat(4, 0)
    a, logp = sac.squashed_gaussian(mean, log_std).sample_and_log_prob(
        seed=jax.random.PRNGKey(0), sample_shape=500)
    a, logp = np.asarray(a, np.float64), np.asarray(logp, np.float64)
    keep = (np.abs(a) < 0.995).all(-1)
    assert keep.mean() > 0.9
    u = np.arctanh(a[keep])
    m, s = np.broadcast_to(np.asarray(mean, np.float64), a.shape)[keep], np.exp(np.broadcast_to(
        np.asarray(log_std, np.float64), a.shape)[keep])
    h = 1e-6
    jacobian = (np.tanh(u + h) - np.tanh(u - h)) / (2 * h)
    ref = (_normal_logpdf(u, m, s) - np.log(jacobian)).sum(-1)
    np.testing.assert_allclose(logp[keep], ref, rtol=1e-4, atol=2e-3)


def test_squashed_log_prob_stable_when_saturated():
    """Where tanh(u) rounds to +-1 in float32 the log-density stays finite and
    equals the float64 value of log N(u) - sum (log 4 - 2|u| - 2 log(1 + e^-2|u|))."""
    mean = jnp.array([20.0, -20.0, 9.0])
    log_std = jnp.full(3, sac.LOG_STD_MIN)
    dist = sac.squashed_gaussian(mean, log_std)
    key = jax.random.PRNGKey(1)
    a, logp = dist.sample_and_log_prob(seed=key, sample_shape=8)
    u = np.asarray(dist.distribution.sample(seed=key, sample_shape=8), np.float64)  # same draw
    assert (np.abs(np.asarray(a)[:, :2]) == 1).all()          # saturated in float32
    assert np.isfinite(np.asarray(logp)).all()
    log_det = np.log(4) - 2 * np.abs(u) - 2 * np.log1p(np.exp(-2 * np.abs(u)))
    ref = (_normal_logpdf(u, np.asarray(mean, np.float64), np.exp(sac.LOG_STD_MIN))
           - log_det).sum(-1)
    np.testing.assert_allclose(np.asarray(logp), ref, rtol=1e-5)


def test_squashed_density_matches_histogram_of_samples():
    mean, log_std = jnp.array([0.7]), jnp.log(jnp.array([0.9]))
    dist = sac.squashed_gaussian(mean, log_std)
    a = np.asarray(dist.sample(seed=jax.random.PRNGKey(2), sample_shape=400_000))[:, 0]
    edges = np.linspace(-0.95, 0.95, 20)
    counts, _ = np.histogram(a, edges)
    empirical = counts / (len(a) * np.diff(edges))
    fine = np.linspace(edges[:-1], edges[1:], 41)                        # [41, bins]
    density = np.exp(np.asarray(dist.log_prob(jnp.asarray(fine.reshape(-1, 1), jnp.float32))))
    expected = density.reshape(fine.shape).mean(0)                       # bin averages
    np.testing.assert_allclose(empirical, expected, rtol=0.03)


# --------------------------------------------------------------------- target, temperature

def test_soft_td_target_takes_min_of_twins_with_entropy_bonus():
    q = jnp.array([[1.0, 5.0, 3.0], [2.0, 4.0, -1.0]])
    log_prob = jnp.array([-1.0, 2.0, 0.5])
    y = sac.soft_td_target(jnp.ones(3), jnp.array([0.5, 0.0, 0.9]), q, log_prob, 0.2)
    np.testing.assert_allclose(y, [1 + 0.5 * (1.0 + 0.2), 1.0, 1 + 0.9 * (-1.0 - 0.1)], rtol=1e-6)


@pytest.mark.parametrize("entropy,rises", [(-3.0, True), (1.0, False)], ids=["below", "above"])
def test_temperature_moves_towards_target_entropy(entropy, rises):
    """Target entropy -1 (one action dimension): alpha rises while the
    policy's entropy -E[log pi] is below it and falls while above."""
    target = -1.0
    log_prob = jnp.full(64, -entropy)
    log_alpha = jnp.zeros(())
    tx = optax.adam(1e-2)
    opt = tx.init(log_alpha)
    for _ in range(3):
        grad = jax.grad(sac.alpha_loss)(log_alpha, log_prob, target)
        np.testing.assert_allclose(grad, entropy - target, rtol=1e-6)   # d loss / d log alpha
        updates, opt = tx.update(grad, opt)
        log_alpha = optax.apply_updates(log_alpha, updates)
    assert (float(log_alpha) > 0) == rises and abs(float(log_alpha)) > 0.02


def test_temperature_rises_in_training_when_the_target_is_out_of_reach(tiny_run):
    """The same compiled program, with the entropy target (a traced
    hyperparameter) raised to 5 nats, above the log 2 that a squashed 1-D
    policy can reach at most: alpha now rises from 1.0 instead of falling."""
    logged, saved = list(tiny_run["logged"]), dict(tiny_run["saved"])
    states = jax.jit(jax.vmap(tiny_run["train"].init))(tiny_run["keys"])
    states = states._replace(hp=states.hp._replace(target_entropy_per_dim=jnp.full(2, 5.0)))
    try:
        final, history = tiny_run["run"](states, 0)
    finally:  # the hooks wrote into the shared fixture: restore it
        tiny_run["logged"][:] = logged
        tiny_run["saved"].clear()
        tiny_run["saved"].update(saved)
    assert (np.asarray(history["losses/alpha"])[:, -1] > 1).all()
    assert (np.asarray(final.log_alpha) > 0).all()


def test_deterministic_act_is_tanh_of_mean(tiny_run):
    train = tiny_run["train"]
    act = sac.make_act(TINY, train.env)
    state = jax.tree.map(lambda x: x[0], tiny_run["final"])
    obs = jnp.asarray(tiny_run["final"].env_state.obs[0])
    mean, _ = sac.Actor(TINY.hidden_sizes, train.env.action_size).apply(state.actor_params, obs)
    np.testing.assert_allclose(act(state, obs, None, True), jnp.tanh(mean), rtol=1e-6)
    sampled = act(state, obs, jax.random.PRNGKey(0), False)
    assert sampled.shape == mean.shape and (jnp.abs(sampled) <= 1).all()


# --------------------------------------------------------------------- CLI

def test_cli_help(capsys):
    checks.check_help(sac, capsys, "--alpha-lr", "--target-entropy-per-dim", "--autotune",
                      "temperature")


BAD = checks.BAD + [(["--init-alpha", "0"], "init-alpha must be positive")]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_one_line_exit_2_no_run_dir(args, message, tmp_path, capsys):
    checks.check_bad_input(sac, args, message, tmp_path, capsys)


# --------------------------------------------------------------------- learning

# 2026-12-06: on an Intel Xeon the single seed of the earlier test ended at 871 (it swings
# 515-946 over 14k-20k env steps there; 950+ on the AMD EPYC): two seeds, judged together.
# With evaluations every 2k env steps both were at 966-999 from 14k on.
LEARN = sac.Config(env="cartpole_balance", backend="native", num_envs=1, num_seeds=2,
                   total_timesteps=20_000, learning_starts=1000, batch_size=256, buffer_size=40_000,
                   hidden_sizes=(64, 64), n_step=3, critic_layer_norm=True, actor_lr=1e-3,
                   critic_lr=1e-3, alpha_lr=1e-3, updates_per_step=2, eval_every=2000,
                   eval_episodes=5, checkpoint_every=0)


def test_learns_cartpole_balance():
    """Zero action scores 714 and random actions 325-413: >= 850 needs a policy
    that balances. Two seeds in one program, each read over its last five
    evaluations (12k-20k env steps), since one evaluation swings by up to 230
    (a seed at 962 then 736 on an AMD EPYC): each >= 850, their mean >= 900."""
    last = np.asarray(checks.learning_run(sac, LEARN))[:, -5:].mean(1)
    assert last.mean() >= 900 and last.min() >= 850, last
