"""The ingredients of the humanoid recipes, each a config field, each shown
to act: observation clipping (every agent), gradient-norm clipping and the
SimBa critic torso (off-policy agents), the exploration-noise schedule
(deterministic agents), n-step targets in SAC's entropy term and MPO's
E-step, and the per-domain defaults (TASK_DEFAULTS) that make
`python algos/<agent>.py --env humanoid_walk` run the recipe."""
import dataclasses
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from common import agent, cli, replay

ALGOS = ("ddpg", "td3", "d4pg", "td4", "sac", "mpo", "ppo")
OFF_POLICY = ALGOS[:-1]
DETERMINISTIC = ("ddpg", "td3", "d4pg", "td4")
HUMANOID = ("humanoid_stand", "humanoid_walk", "humanoid_run")


def module(algo):
    return importlib.import_module(f"algos.{algo}")


def tiny(algo, **kw):
    """A config small enough to compile in seconds (cartpole, 8 units)."""
    mod = module(algo)
    base = dict(env="cartpole_balance", backend="native", eval_every=0, eval_episodes=1,
                checkpoint_every=0)
    if algo == "ppo":
        base.update(num_envs=4, num_steps=4, num_minibatches=1, update_epochs=1,
                    total_timesteps=64, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
    else:
        base.update(total_timesteps=400, learning_starts=100, batch_size=16, buffer_size=400,
                    hidden_sizes=(8,))
    return mod.Config(**{**base, **kw})


def max_change(a, b) -> float:
    return max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# ----------------------------------------------------------------------------- observations

def test_normalize_clips_to_the_bound_it_is_given():
    from common import normalize
    stats = normalize.init(3)
    x = jnp.array([[-100.0, 0.3, 100.0]])
    assert np.allclose(normalize.normalize(stats, x, 5.0), [[-5.0, 0.3, 5.0]], atol=1e-6)
    assert np.allclose(normalize.normalize(stats, x, 0.2), [[-0.2, 0.2, 0.2]], atol=1e-6)


@pytest.mark.parametrize("algo", ALGOS)
def test_obs_clip_bounds_what_the_policy_sees(algo):
    """With --obs-clip 0.5 an observation of 1000 acts as one of 0.5 (and not
    as one of 0.4): the bound reaches the networks, not only normalize()."""
    mod = module(algo)
    config = tiny(algo, normalize_obs=True, obs_clip=0.5)
    train = mod.make_train(config)
    state = jax.jit(train.init)(jax.random.PRNGKey(0))
    act = jax.jit(lambda o: mod.make_act(config, train.env)(state, o, None, True))
    D = train.env.observation_size
    big, at_bound, inside = (act(jnp.full((1, D), v)) for v in (1000.0, 0.5, 0.4))
    assert np.array_equal(big, at_bound)
    assert not np.array_equal(big, inside)


# ----------------------------------------------------------------------------- gradients

def test_clip_by_global_norm_matches_optax_and_is_off_at_zero():
    g = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([[12.0]])}   # global norm 13
    clip = agent.clip_by_global_norm(jnp.float32(1.3))
    out, _ = clip.update(g, clip.init(g))
    ref, _ = optax.clip_by_global_norm(1.3).update(g, optax.clip_by_global_norm(1.3).init(g))
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))
    assert np.isclose(float(optax.global_norm(out)), 1.3)
    for off in (0.0, 100.0):  # off, and a bound above the norm: bit for bit unchanged
        same, _ = agent.clip_by_global_norm(jnp.float32(off)).update(g, None)
        assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(same), jax.tree.leaves(g)))


@functools.lru_cache(maxsize=None)
def compiled(algo):
    """One tiny program per agent, shared by this file's training checks:
    the SimBa critic torso, acting from step 0 with an exploration std
    decaying from 0.5 to 0 over 1000 env steps (deterministic agents)."""
    mod = module(algo)
    # a nonzero --max-grad-norm builds the clipping stage; its bound is traced (0: off)
    kw = dict(critic_torso="simba", simba_width=8, simba_blocks=2, learning_starts=0,
              max_grad_norm=1e9)
    if algo in DETERMINISTIC:
        kw.update(exploration_noise=0.5, exploration_noise_final=0.0,
                  exploration_decay_steps=1000)
    if algo == "td3":  # and learning rates falling to a quarter over the same 1000
        kw.update(lr_decay_steps=1000, lr_final_scale=0.25)
    config = tiny(algo, **kw)
    train = mod.make_train(config)
    return (mod, config, train, jax.jit(train.init), jax.jit(train.update),
            jax.jit(train.iteration))


@pytest.mark.parametrize("algo", OFF_POLICY)
def test_max_grad_norm_bounds_every_update_and_simba_critic_learns(algo):
    """One update from a full replay, with the SimBa critic torso: under a
    tiny --max-grad-norm Adam's first step shrinks by orders of magnitude
    (its first step is g / (|g| + eps), so only a clipped |g| << eps moves
    it); at 0 (off) the update is the unclipped one."""
    mod, config, train, init, update, _ = compiled(algo)
    key = jax.random.PRNGKey(0)
    state = init(key)
    fill = jax.jit(replay.synthetic, static_argnums=2)
    state = state._replace(replay=fill(state.replay, key, train.env.episode_length))

    def one_update(max_grad_norm):
        hp = mod.AGENT.hparams(dataclasses.replace(config, max_grad_norm=max_grad_norm))
        new, metrics = update(state._replace(hp=hp), 0)
        return new, metrics

    free, metrics = one_update(0.0)
    assert all(np.isfinite(v) for v in jax.tree.leaves(metrics))
    clipped, _ = one_update(1e-12)
    loose, _ = one_update(1e9)
    for part in ("critic_params", "actor_params"):
        moved = max_change(getattr(free, part), getattr(state, part))
        assert moved > 1e-5, part
        assert max_change(getattr(clipped, part), getattr(state, part)) < 1e-2 * moved, part
        assert max_change(getattr(loose, part), getattr(free, part)) == 0.0, part
    # the critic is the SimBa torso: embedding, 2 blocks of 2 Dense, 3 LayerNorms
    assert set(find(state.critic_params, "SimbaTorso_0")) == {
        "Dense_0", "Dense_1", "Dense_2", "Dense_3", "Dense_4",
        "LayerNorm_0", "LayerNorm_1", "LayerNorm_2"}


def find(tree, name):
    """The subtree under the first key `name` of a nested parameter dict."""
    for k, v in tree.items():
        if k == name:
            return v
        if hasattr(v, "items") and (found := find(v, name)) is not None:
            return found
    return None


def test_mlp_torso_keeps_the_critics_parameter_names():
    """The MLP torso builds its layers in the critic's own scope: checkpoints
    and released policies of earlier versions keep their parameter paths."""
    from algos import td3
    from common import networks
    critic = td3.Critic(networks.Torso("mlp", (8, 8), True))
    params = critic.init(jax.random.PRNGKey(0), jnp.zeros(3), jnp.zeros(1))["params"]
    assert set(params) == {"Dense_0", "LayerNorm_0", "Dense_1", "LayerNorm_1", "Dense_2"}


# ----------------------------------------------------------------------------- exploration

def test_noise_schedule_is_linear_then_constant():
    hp = type("HP", (), {"exploration_noise": jnp.float32(0.4),
                         "exploration_noise_final": jnp.float32(0.1)})
    at = lambda step, decay=1000: float(agent.noise_schedule(hp, decay, step))
    assert np.allclose([at(0), at(500), at(1000), at(5000)], [0.4, 0.25, 0.1, 0.1])
    assert at(700, decay=0) == pytest.approx(0.4)  # no decay: the start value throughout
    # begun at env step 2000: the start value bit for bit until then, the same line after
    late = lambda step, decay=1000: float(agent.noise_schedule(hp, decay, step, 2000))
    assert [late(0), late(1999), late(2000)] == [at(0)] * 3
    assert np.allclose([late(2500), late(3000), late(9000)], [0.25, 0.1, 0.1])
    assert float(agent.linear_schedule(1.0, 0.5, 1000, 2500, 2000)) == pytest.approx(0.75)


@pytest.mark.parametrize("algo", DETERMINISTIC)
def test_exploration_noise_follows_its_schedule_in_training(algo):
    """Acting with std 0.5 decaying to 0 over 1000 env steps: the stored
    action differs from the policy's at step 0, equals it after the decay."""
    mod, config, train, init, _, iteration = compiled(algo)
    state = init(jax.random.PRNGKey(0))
    act = mod.make_act(config, train.env)

    def deviation(i):
        new, _ = iteration(state, i)
        stored = new.replay.action[state.replay.pos]
        return float(jnp.abs(stored - act(state, state.env_state.obs, None, True)).max())

    assert deviation(0) > 0.05
    assert deviation(2000) == 0.0


def test_td3_learning_rates_follow_their_schedule_in_training():
    """--lr-decay-steps 1000 --lr-final-scale 0.25: an update at the start takes
    Adam's full first step, one after the decay a quarter of it (Adam's first
    step is lr * g / (|g| + eps), so the largest change is the rate itself)."""
    mod, config, train, init, _, iteration = compiled("td3")
    key = jax.random.PRNGKey(0)
    state = init(key)
    state = state._replace(replay=jax.jit(replay.synthetic, static_argnums=2)(
        state.replay, key, train.env.episode_length))

    def after(i):
        new, _ = iteration(state, i)
        adam = new.critic_opt[-1]  # the clipping stage, then Adam with its hyperparameters
        return float(adam.hyperparams["learning_rate"]), max_change(new.critic_params,
                                                                    state.critic_params)

    E = config.num_envs
    (lr0, step0), (lr_mid, _), (lr_end, step_end) = after(1), after(500 // E), after(2000)
    assert lr0 == pytest.approx(config.critic_lr * (1 - 0.75 * E / 1000))
    assert lr_mid == pytest.approx(config.critic_lr * (1 - 0.75 * (500 // E) * E / 1000))
    assert lr_end == pytest.approx(config.critic_lr * 0.25)
    assert step0 == pytest.approx(lr0, rel=0.05)
    assert step_end == pytest.approx(config.critic_lr * 0.25, rel=0.05)


def test_td3_decays_that_begin_late_leave_the_run_bit_for_bit_until_then():
    """--decay-start-steps: before it a run with both decays is the constant
    run exactly (acting, replay, both networks); after it the rates fall."""
    mod, config, train, init, _, iteration = compiled("td3")
    late = dataclasses.replace(config, decay_start_steps=8 * config.num_envs)
    flat = dataclasses.replace(config, exploration_decay_steps=0, lr_decay_steps=0)
    key = jax.random.PRNGKey(0)
    state = init(key)
    state = state._replace(replay=jax.jit(replay.synthetic, static_argnums=2)(
        state.replay, key, train.env.episode_length))

    def first_iterations(c, n=8):
        step, s = jax.jit(mod.make_train(c).iteration), state
        for i in range(n):
            s, _ = step(s, i)
        return s, step

    (a, step_late), (b, _) = first_iterations(late), first_iterations(flat)
    for part in ("actor_params", "critic_params", "replay", "env_state"):
        assert all(np.array_equal(x, y) for x, y in zip(
            jax.tree.leaves(getattr(a, part)), jax.tree.leaves(getattr(b, part)))), part
    E, k = config.num_envs, 500 // config.num_envs  # about half-way through the decay
    after, _ = step_late(a, 8 + k)
    rate = float(after.critic_opt[-1].hyperparams["learning_rate"])
    assert rate == pytest.approx(config.critic_lr * (1 - 0.75 * k * E / 1000))


# ----------------------------------------------------------------------------- n-step targets

def test_sac_entropy_term_is_discounted_with_the_bootstrap():
    """With an n-step window the next state's soft value, entropy term
    included, is discounted by the window's gamma^m (0 after a termination)."""
    from algos import sac
    reward, discount = jnp.array([1.5, 2.0]), jnp.array([0.99 ** 3, 0.0])
    next_q, log_prob, alpha = jnp.array([[4.0, 6.0], [5.0, 3.0]]), jnp.array([-2.0, -1.0]), 0.5
    target = sac.soft_td_target(reward, discount, next_q, log_prob, alpha)
    assert np.allclose(target, [1.5 + 0.99 ** 3 * (4.0 + 0.5 * 2.0), 2.0])


def test_mpo_target_bootstraps_with_the_window_discount():
    """MPO's TD target averages the sampled actions' Q at s_{t+m} and
    discounts it by the window's gamma^m; the E-step reads those same
    states (any state of the replay is a valid one to improve the policy on)."""
    from algos import mpo
    reward, discount = jnp.array([1.0, 2.0]), jnp.array([0.99 ** 5, 0.0])
    q_samples = jnp.array([[2.0, 9.0], [4.0, 9.0]])   # [N, B]
    assert np.allclose(mpo.td_target(reward, discount, q_samples), [1.0 + 0.99 ** 5 * 3.0, 2.0])


# ----------------------------------------------------------------------------- task defaults

@pytest.mark.parametrize("algo", ALGOS)
def test_humanoid_tasks_run_the_agents_recipe_and_flags_override_it(algo, capsys):
    spec = module(algo).AGENT
    recipe = spec.defaults_for("humanoid_walk")
    assert recipe, f"{algo} has no humanoid defaults"
    fields = {f.name for f in dataclasses.fields(spec.Config)}
    assert set(recipe) <= fields, set(recipe) - fields
    plain = spec.Config()
    assert any(getattr(plain, k) != v for k, v in recipe.items())
    for task in HUMANOID:
        config = cli.parse(spec, ["--env", task])
        assert all(getattr(config, k) == v for k, v in recipe.items()), task
        assert config == spec.config_for(task)
    printed = capsys.readouterr().out
    assert "TASK_DEFAULTS" in printed and cli.as_flag(*next(iter(recipe.items()))) in printed
    # any flag wins over the recipe; other tasks keep the plain defaults
    name, value = next((k, v) for k, v in recipe.items() if isinstance(v, int)
                       and not isinstance(v, bool))
    config = cli.parse(spec, ["--env=humanoid_run", f"--{name.replace('_', '-')}", str(value + 1)])
    assert getattr(config, name) == value + 1
    assert cli.parse(spec, ["--env", "cheetah_run"]) == dataclasses.replace(plain,
                                                                           env="cheetah_run")
    # every value of the recipe is one the agent accepts
    spec.validate(spec.config_for("humanoid_walk"))


def test_documented_paper_settings_undo_every_humanoid_default():
    """docs/humanoid.md gives one command line per agent that runs the
    paper's settings on a humanoid task: each parses to the plain Config."""
    import os
    import shlex
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                        "humanoid.md")
    text = open(path).read().split("## The paper's settings", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in text.splitlines() if ln.startswith("python algos/")]
    assert sorted(ln.split()[1] for ln in lines) == sorted(f"algos/{a}.py" for a in ALGOS)
    for line in lines:
        argv = shlex.split(line)[2:]
        spec = module(line.split()[1][len("algos/"):-len(".py")]).AGENT
        config = cli.parse(spec, argv)
        assert config == dataclasses.replace(spec.Config(), env=config.env), line
