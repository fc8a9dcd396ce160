"""SAC: Soft Actor-Critic with a learned temperature, fully compiled.

Haarnoja, Zhou, Hartikainen, Tucker, Ha, Tan, Kumar, Zhu, Gupta, Abbeel and
Levine, "Soft Actor-Critic Algorithms and Applications", 2018
(arXiv:1812.05905): the version with automatic entropy adjustment and no
separate value network. A tanh-squashed Gaussian policy (log-density with the
change-of-variables correction in the numerically stable form
log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))), twin critics with the
minimum of their targets, the entropy bonus alpha * -log pi(a'|s') in the
target, the temperature alpha learned towards a target entropy (-action_size
by default) and Polyak-averaged target critics. Evaluation acts with the mean
action tanh(mean). With `--n-step n` the target sums n rewards and adds the
entropy bonus at the bootstrap state only.

Acting in `num_envs` parallel envs, physics, replay, learning and evaluation
run as one XLA program; `--num-seeds N` trains N independent seeds in it.

Usage:
    python algos/sac.py --env cheetah_run
    python algos/sac.py --env humanoid_walk --num-seeds 4 --backend native
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from common import agent, cli, envs, networks, normalize, replay
from common.errors import exit_on_user_error


# ----------------------------------------------------------------------------- Config

@dataclass(frozen=True)
class Config:
    env: str = "cheetah_run"
    """dm_control task, <domain>_<task>"""
    backend: str = "auto"
    """physics backend: auto (native on a CPU or TPU, mjx on a GPU), native or mjx"""
    num_envs: int = 1
    """parallel envs per seed"""
    num_seeds: int = 1
    """independent seeds trained at once in one program"""
    total_timesteps: int = 1_000_000
    """env steps per seed"""
    seed: int = 1
    """seed of the first run; the others get their own streams split from it"""
    eval_every: int = 10_000
    """env steps between evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """deterministic episodes per evaluation"""
    log_dir: str = "runs"
    """where run directories (TensorBoard logs, config, checkpoint) go"""
    checkpoint_every: int = 100_000
    """env steps between checkpoints (0: only at the end)"""
    resume: Optional[str] = None
    """checkpoint file or run directory to continue"""
    compile_cache: bool = True
    """keep compiled programs in JAX's persistent compilation cache ($RL_COMPILE_CACHE_DIR, else
    ~/.cache/jax-mujoco-rl/xla); training programs stay out of it (host callbacks)"""

    buffer_size: int = 1_000_000
    """replay capacity in transitions (all envs of a seed together)"""
    learning_starts: int = 10_000
    """env steps of uniform random actions before learning starts"""
    batch_size: int = 256
    """transitions per update"""
    updates_per_step: float = 1.0
    """gradient updates per env step; fractions allowed (0.125: one per 8 steps)"""
    overlap_physics: bool = False
    """native backend: the device runs the due updates while the host steps the envs, from
    replay one env step behind (faster where learning runs on an accelerator)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """Polyak averaging rate of the target networks"""
    actor_lr: float = 3e-4
    """actor learning rate (Adam)"""
    critic_lr: float = 3e-4
    """critic learning rate (Adam)"""
    max_grad_norm: float = 0.0
    """clip the global norm of each actor and critic gradient to this (0: off; a sweep of it
    needs a nonzero value here)"""
    alpha_lr: float = 3e-4
    """temperature learning rate (Adam on log alpha)"""
    init_alpha: float = 1.0
    """initial temperature alpha (kept fixed with --no-autotune)"""
    autotune: bool = True
    """learn alpha towards the target entropy"""
    target_entropy_per_dim: float = -1.0
    """entropy target of the squashed policy per action dimension, in nats
    (the target is this x action_size; -1 gives the paper's -action_size)"""
    n_step: int = 1
    """n-step returns (windows stop at episode ends)"""
    hidden_sizes: Tuple[int, ...] = (256, 256)
    """hidden layer widths of actor and critics"""
    critic_layer_norm: bool = False
    """layer norm after each hidden layer of the critics"""
    critic_torso: str = "mlp"
    """critic hidden layers: mlp (hidden_sizes, --critic-layer-norm) or simba (residual
    pre-LayerNorm blocks, common/networks.py)"""
    simba_width: int = 128
    """width of the simba critic torso (its blocks are 4x wider inside)"""
    simba_blocks: int = 1
    """residual blocks of the simba critic torso"""
    normalize_obs: bool = False
    """normalise observations with running mean/std"""
    obs_clip: float = 10.0
    """normalised observations are clipped to +-obs_clip"""


# The humanoid recipe (humanoid_stand, _walk, _run): these values replace the
# defaults above on those tasks, any flag given still wins, and a run prints
# the ones it uses. Found by one-core probes (docs/results/humanoid/probes.md):
# hundreds of envs with one update per 16 env steps use one core's time on
# physics and learning in a ratio that learns fastest per hour.
TASK_DEFAULTS = {"humanoid": dict(
    num_envs=256, updates_per_step=0.0625, total_timesteps=10_000_000, eval_every=500_000,
    checkpoint_every=1_000_000, critic_layer_norm=True, normalize_obs=True,
    n_step=5,
    # a fallen humanoid earns ~0.002 per step: an entropy bonus at the paper's alpha of 1
    # swamps it for millions of env steps; from 1e-3 the critic sees the reward at once
    init_alpha=1e-3, target_entropy_per_dim=-0.5)}


# On an accelerator (docs/accelerator.md): the host steps the envs while the chip
# runs the updates, replay taking each step one iteration later. On the TPU
# machine it took the humanoid loop from 44.6 to 32.5 us per env step.
# Checkpoints every 5M env steps there (minutes, as 1M are on one core): each cost
# D4PG's run on the chip 2.0-2.1 s, about 6% of the run at one per 1M.
ACCELERATOR_DEFAULTS = {"humanoid": dict(overlap_physics=True, checkpoint_every=5_000_000)}


# The valid values of the float fields (agent.check_ranges; every float must also be
# finite), checked before anything compiles: on the command line, in AGENT.config_for (so
# TASK_DEFAULTS too) and for every swept value.
RANGES = dict(
    updates_per_step="(0, inf)", gamma="(0, 1]", tau="(0, 1]", actor_lr="(0, inf)",
    critic_lr="(0, inf)", max_grad_norm="[0, inf) 0: off",
    alpha_lr="(0, inf)", init_alpha="(0, inf)", target_entropy_per_dim="(-inf, inf)",
    obs_clip="(0, inf)")


def validate(config: Config) -> None:
    agent.check_ranges(config, RANGES)
    agent.check_positive(config, "num_envs", "num_seeds", "total_timesteps", "eval_episodes",
                         "buffer_size", "batch_size", "n_step")
    agent.check_off_policy(config)


# ----------------------------------------------------------------------------- Networks

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class Actor(nn.Module):
    """Mean and log std of the pre-tanh Gaussian; log std squashed smoothly
    into [LOG_STD_MIN, LOG_STD_MAX]."""
    hidden_sizes: Tuple[int, ...]
    action_size: int

    @nn.compact
    def __call__(self, obs):
        x = obs
        for h in self.hidden_sizes:
            x = nn.relu(nn.Dense(h)(x))
        mean = nn.Dense(self.action_size)(x)
        log_std = jnp.tanh(nn.Dense(self.action_size)(x))
        return mean, LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)


class Critic(nn.Module):
    torso: networks.Torso  # hidden layers: MLP or SimBa (common/networks.py)

    @nn.compact
    def __call__(self, obs, action):
        x = self.torso(jnp.concatenate([obs, action], -1))
        return nn.Dense(1)(x).squeeze(-1)


class TwinCritic(nn.Module):
    """Two independent critics, evaluated together: q has shape [2, ...]."""
    torso: networks.Torso  # hidden layers: MLP or SimBa (common/networks.py)

    @nn.compact
    def __call__(self, obs, action):
        twins = nn.vmap(Critic, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=None, out_axes=0, axis_size=2)
        return twins(self.torso)(obs, action)


def squashed_gaussian(mean, log_std) -> distrax.Distribution:
    """tanh(u), u ~ N(mean, exp(log_std)) per dimension, as one distribution
    over [-1, 1]^A. distrax's Tanh bijector computes the change-of-variables
    term log(1 - tanh(u)^2) as 2 (log 2 - u - softplus(-2u)), which stays
    finite where tanh(u) rounds to +-1; `sample_and_log_prob` uses it on the
    pre-tanh sample, never atanh of the action."""
    base = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))
    return distrax.Transformed(base, distrax.Block(distrax.Tanh(), ndims=1))


# ----------------------------------------------------------------------------- State

class HParams(NamedTuple):
    """Float hyperparameters as traced values, so one program can vmap over them."""
    gamma: jnp.ndarray
    tau: jnp.ndarray
    actor_lr: jnp.ndarray
    critic_lr: jnp.ndarray
    max_grad_norm: jnp.ndarray
    alpha_lr: jnp.ndarray
    init_alpha: jnp.ndarray
    target_entropy_per_dim: jnp.ndarray


class TrainState(NamedTuple):
    actor_params: dict
    critic_params: dict
    critic_target: dict
    log_alpha: jnp.ndarray
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    alpha_opt: optax.OptState
    env_state: envs.EnvState
    pool: envs.Pool           # this seed's initial states (dm_control resets)
    replay: replay.Replay
    obs_stats: normalize.RunningStats
    hp: HParams
    key: jax.Array
    eval_key: jax.Array
    pending: Optional[replay.Transition] = None  # --overlap-physics: replay takes it next



# ----------------------------------------------------------------------------- Algorithm

def soft_td_target(reward, discount, twin_next_q, next_log_prob, alpha):
    """Clipped double-Q with the entropy bonus at the bootstrap state:
    r + discount * (min_i Q_i(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s').
    `discount` is gamma^m, or 0 after a termination (never after a truncation)."""
    return reward + discount * (twin_next_q.min(0) - alpha * next_log_prob)


def alpha_loss(log_alpha, log_prob, target_entropy, mask=1.0):
    """Temperature loss of arXiv:1812.05905 eq. 18 on log alpha. Its gradient
    -E[log pi + target] = entropy - target is positive (alpha falls) while the
    policy's entropy -E[log pi] is above the target and negative (alpha rises)
    while below it."""
    return -(mask * log_alpha * jax.lax.stop_gradient(log_prob + target_entropy)).mean()


# ----------------------------------------------------------------------------- Training

def make_train(config: Config) -> agent.Train:
    # The run, in the order it executes (agent.make_runner drives the chunks):
    #   init(key, hp)          one seed's networks, optimisers, envs and empty replay
    #   for each chunk         of L = schedule.chunk_iters; those below start_chunk skipped (resume)
    #     iteration, L times   every env steps once (uniform random actions during the
    #                          warm-up), the transitions go to replay, then the due
    #       update             critic, actor, temperature, then the target critics
    #                          (--overlap-physics: the updates run while the host steps
    #                          the envs, and replay takes the step at the next iteration)
    #     evaluate             at evaluation chunks and the last
    #     hooks.log            the chunk's metrics (means over its iterations)
    #     hooks.checkpoint     the state, at checkpoint chunks and the last
    validate(config)
    env = envs.make(config.env, config.backend)
    n_updates, period = agent.update_period(config)
    schedule = agent.make_schedule(config, iters_per_step_unit=period)
    buffer = replay.layout(config, env)
    E, A = config.num_envs, env.action_size

    actor = Actor(config.hidden_sizes, A)
    critic = TwinCritic(networks.critic_torso(config))
    # learning rates and the clip bound are traced (swept); at --max-grad-norm 0 there is
    # no clipping stage, so the default program is the one without it
    clip = lambda hp: hp.max_grad_norm if config.max_grad_norm > 0 else None
    actor_tx = lambda hp: agent.adam(hp.actor_lr, clip(hp))
    critic_tx = lambda hp: agent.adam(hp.critic_lr, clip(hp))
    alpha_tx = lambda hp: agent.adam(hp.alpha_lr)
    box = agent.action_box(env)  # squashed sample [-1, 1] -> env units
    obs_in = lambda stats, obs: (normalize.normalize(stats, obs, config.obs_clip)
                                 if config.normalize_obs else obs)

    def policy_sample(params, obs, key):
        """Reparameterised squashed sample in [-1, 1] and its log-density."""
        return squashed_gaussian(*actor.apply(params, obs)).sample_and_log_prob(seed=key)

    def init(key, hp=None):
        key, k_actor, k_critic, k_env, k_eval, k_pool = jax.random.split(key, 6)
        pool = env.make_pool(k_pool)  # this seed's own initial states
        hp = agent.hparams(HParams, config) if hp is None else hp
        dummy_obs, dummy_act = jnp.zeros(env.observation_size), jnp.zeros(A)
        actor_params = actor.init(k_actor, dummy_obs)
        critic_params = critic.init(k_critic, dummy_obs, dummy_act)
        log_alpha = jnp.log(hp.init_alpha)
        return TrainState(
            actor_params=actor_params, critic_params=critic_params, critic_target=critic_params,
            log_alpha=log_alpha,
            actor_opt=actor_tx(hp).init(actor_params), critic_opt=critic_tx(hp).init(critic_params),
            alpha_opt=alpha_tx(hp).init(log_alpha),
            env_state=jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, E), pool),
            pool=pool, replay=replay.init(*buffer),
            obs_stats=normalize.init(env.observation_size), hp=hp, key=key, eval_key=k_eval,
            pending=replay.no_transition(E, env.observation_size, A) if config.overlap_physics
            else None)

    def iteration(state: TrainState, i):
        """Every env takes one step; then the due gradient updates."""
        key, k_policy, k_random = jax.random.split(state.key, 3)
        env_state = state.env_state
        obs_stats = normalize.update(state.obs_stats, env_state.obs) if config.normalize_obs \
            else state.obs_stats
        explore = box.to_env(policy_sample(state.actor_params, obs_in(obs_stats, env_state.obs),
                                           k_policy)[0])
        random = box.uniform(k_random, explore.shape)
        warmup = i * E < config.learning_starts
        action = jnp.where(warmup, random, explore)

        state = state._replace(obs_stats=obs_stats, key=key)

        def learn(state):
            u = (i // period) * n_updates + jnp.arange(n_updates)
            state, m = jax.lax.scan(update, state, u)
            return state, jax.tree.map(jnp.nanmean, m)

        due = ~warmup & (i % period == period - 1) & replay.ready(i, config.n_step)
        state, metrics, next_state = agent.step_and_learn(env, state, action, learn, due,
                                                          config.overlap_physics)
        return state, {**metrics, **agent.episode_metrics(next_state)}

    def update(state: TrainState, u):
        """One critic update, then actor, temperature and target updates."""
        hp = state.hp
        key, k_sample, k_next, k_pi = jax.random.split(state.key, 4)
        batch = replay.sample(state.replay, k_sample, config.batch_size, config.n_step, hp.gamma)
        obs = obs_in(state.obs_stats, batch.obs)
        next_obs = obs_in(state.obs_stats, batch.next_obs)
        alpha = jnp.exp(state.log_alpha)

        next_action, next_log_prob = policy_sample(state.actor_params, next_obs, k_next)
        next_q = critic.apply(state.critic_target, next_obs, box.to_env(next_action))
        target = soft_td_target(batch.reward, batch.discount, next_q, next_log_prob, alpha)

        def critic_loss(params):
            q = critic.apply(params, obs, batch.action)
            return (batch.mask * ((q - target) ** 2).sum(0)).mean(), q

        (qf_loss, q), grads = jax.value_and_grad(critic_loss, has_aux=True)(state.critic_params)
        updates, critic_opt = critic_tx(hp).update(grads, state.critic_opt, state.critic_params)
        critic_params = optax.apply_updates(state.critic_params, updates)

        def actor_loss(params):
            action, log_prob = policy_sample(params, obs, k_pi)
            q_pi = critic.apply(critic_params, obs, box.to_env(action)).min(0)
            return (batch.mask * (alpha * log_prob - q_pi)).mean(), log_prob

        (pi_loss, log_prob), grads = jax.value_and_grad(actor_loss, has_aux=True)(
            state.actor_params)
        updates, actor_opt = actor_tx(hp).update(grads, state.actor_opt, state.actor_params)
        actor_params = optax.apply_updates(state.actor_params, updates)

        a_loss, grad = jax.value_and_grad(alpha_loss)(state.log_alpha, log_prob,
                                                      hp.target_entropy_per_dim * A, batch.mask)
        updates, alpha_opt = alpha_tx(hp).update(grad, state.alpha_opt, state.log_alpha)
        log_alpha = optax.apply_updates(state.log_alpha, updates) if config.autotune \
            else state.log_alpha

        polyak = lambda t, p: optax.incremental_update(p, t, hp.tau)
        state = state._replace(
            actor_params=actor_params, critic_params=critic_params, log_alpha=log_alpha,
            actor_opt=actor_opt, critic_opt=critic_opt, alpha_opt=alpha_opt,
            critic_target=polyak(state.critic_target, critic_params), key=key)
        return state, {"losses/qf_loss": qf_loss / 2, "losses/actor_loss": pi_loss,
                       "losses/qf1_values": q[0].mean(), "losses/alpha": alpha,
                       "losses/alpha_loss": a_loss, "stats/entropy": -log_prob.mean()}

    act = make_act(config, env)

    def evaluate(state: TrainState, chunk):
        return agent.evaluate(env, act, state, lambda o: o,
                              jax.random.fold_in(state.eval_key, chunk), config.eval_episodes)

    return agent.Train(env, schedule, init, agent.make_runner(schedule, iteration, evaluate),
                       iteration=iteration, update=update)


def make_act(config: Config, env: envs.Env):
    """act(state, obs, key, deterministic) -> action in env units, from the
    train state's actor (observations normalised as in training):
    tanh(mean) when deterministic, else a sample of the squashed Gaussian."""
    actor = Actor(config.hidden_sizes, env.action_size)
    box = agent.action_box(env)

    def act(state, obs, key, deterministic=True):
        if config.normalize_obs:
            obs = normalize.normalize(state.obs_stats, obs, config.obs_clip)
        mean, log_std = actor.apply(state.actor_params, obs)
        if deterministic:
            return box.to_env(jnp.tanh(mean))
        return box.to_env(squashed_gaussian(mean, log_std).sample(seed=key))

    return act


# ----------------------------------------------------------------------------- Main

AGENT = agent.Agent(name="sac", doc=__doc__, Config=Config, HParams=HParams, validate=validate,
                    make_train=make_train, make_act=make_act,
                    task_defaults=TASK_DEFAULTS, ranges=RANGES,
                    accelerator_defaults=ACCELERATOR_DEFAULTS)


@exit_on_user_error
def main(argv=None):
    return cli.main(AGENT, argv)


if __name__ == "__main__":
    main()
