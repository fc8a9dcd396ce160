"""TD3: Twin Delayed Deep Deterministic policy gradient, fully compiled.

Fujimoto, van Hoof and Meger, "Addressing Function Approximation Error in
Actor-Critic Methods", ICML 2018 (arXiv:1802.09477). DDPG with three changes:
twin critics with the minimum of their targets, target policy smoothing
(clipped Gaussian noise on the target action), and delayed policy and target
updates (every `policy_delay` critic updates).

Acting in `num_envs` parallel envs, physics, replay, learning and evaluation
run as one XLA program; `--num-seeds N` trains N independent seeds in it.

Usage:
    python algos/td3.py --env cheetah_run
    python algos/td3.py --env humanoid_walk --num-seeds 4 --backend native
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

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
    exploration_noise: float = 0.1
    """std of the Gaussian exploration noise, in units of half the action range"""
    exploration_noise_final: float = 0.1
    """exploration std after --exploration-decay-steps (same units)"""
    exploration_decay_steps: int = 0
    """env steps over which the exploration std moves linearly from --exploration-noise to
    --exploration-noise-final (0: --exploration-noise throughout)"""
    lr_decay_steps: int = 0
    """env steps over which both learning rates fall linearly to --lr-final-scale times their
    value (0: constant)"""
    lr_final_scale: float = 1.0
    """the learning rates' multiplier after --lr-decay-steps"""
    decay_start_steps: int = 0
    """env step at which both decays begin (before it the run is the undecayed one, bit for
    bit)"""
    policy_noise: float = 0.2
    """std of the target smoothing noise, in units of half the action range"""
    noise_clip: float = 0.5
    """target smoothing noise is clipped to +-noise_clip"""
    policy_delay: int = 2
    """critic updates per actor and target update"""
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
    exploration_noise=0.2, n_step=5,
    # one actor and target update per critic update: with one update per 16 env steps
    # the paper's delay of 2 halves the actor's updates and delays take-off by ~1M env steps
    policy_delay=1,
    # at 3e-4 take-off is a coin toss (one seed of two still at 2 after 1.5M env steps);
    # at 6e-4 all six probed seeds pass 200 by 1.25M, at 1e-3 two of six never take off
    actor_lr=6e-4, critic_lr=6e-4,
    # the noise to 0.05 and both rates to half, from the humanoid benchmark's 2nd evaluation
    # (2 x 1,171,456 env steps, so the take-off above is untouched) to 10M: both seeds
    # end at 800+ in two hours (804, 811) where the constant recipe ended at 762 and 793
    exploration_noise_final=0.05, lr_final_scale=0.5, decay_start_steps=2_342_912,
    exploration_decay_steps=7_657_088, lr_decay_steps=7_657_088)}


# On an accelerator (docs/accelerator.md): the host steps the envs while the chip
# runs the updates, replay taking each step one iteration later. On the TPU
# machine it took the humanoid loop from 44.8 to 31.2 us per env step.
# Checkpoints every 5M env steps there (minutes, as 1M are on one core): each cost
# D4PG's run on the chip 2.0-2.1 s, about 6% of the run at one per 1M.
ACCELERATOR_DEFAULTS = {"humanoid": dict(overlap_physics=True, checkpoint_every=5_000_000)}


# The valid values of the float fields (agent.check_ranges; every float must also be
# finite), checked before anything compiles: on the command line, in AGENT.config_for (so
# TASK_DEFAULTS too) and for every swept value.
RANGES = dict(
    updates_per_step="(0, inf)", gamma="(0, 1]", tau="(0, 1]", actor_lr="(0, inf)",
    critic_lr="(0, inf)", max_grad_norm="[0, inf) 0: off",
    # the final std is also at most the first when it decays (agent.check_off_policy)
    exploration_noise="[0, inf)", exploration_noise_final="[0, inf)",
    lr_final_scale="(0, 1]", policy_noise="[0, inf)", noise_clip="(0, inf)",
    obs_clip="(0, inf)")


def validate(config: Config) -> None:
    agent.check_ranges(config, RANGES)
    agent.check_positive(config, "num_envs", "num_seeds", "total_timesteps", "eval_episodes",
                         "buffer_size", "batch_size", "n_step", "policy_delay")
    agent.check_off_policy(config)


# ----------------------------------------------------------------------------- Networks

class Actor(nn.Module):
    hidden_sizes: Tuple[int, ...]
    action_size: int

    @nn.compact
    def __call__(self, obs):
        x = obs
        for h in self.hidden_sizes:
            x = nn.relu(nn.Dense(h)(x))
        return jnp.tanh(nn.Dense(self.action_size)(x))


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


# ----------------------------------------------------------------------------- State

class HParams(NamedTuple):
    """Float hyperparameters as traced values, so one program can vmap over them."""
    gamma: jnp.ndarray
    tau: jnp.ndarray
    actor_lr: jnp.ndarray
    critic_lr: jnp.ndarray
    max_grad_norm: jnp.ndarray
    exploration_noise: jnp.ndarray
    exploration_noise_final: jnp.ndarray
    policy_noise: jnp.ndarray
    noise_clip: jnp.ndarray


class TrainState(NamedTuple):
    actor_params: dict
    critic_params: dict
    actor_target: dict
    critic_target: dict
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    env_state: envs.EnvState
    pool: envs.Pool           # this seed's initial states (dm_control resets)
    replay: replay.Replay
    obs_stats: normalize.RunningStats
    hp: HParams
    key: jax.Array
    eval_key: jax.Array
    pending: Optional[replay.Transition] = None  # --overlap-physics: replay takes it next


# ----------------------------------------------------------------------------- Algorithm

def smoothed_target_action(target_actor_action, key, hp: HParams, low, high):
    """Target policy smoothing: clipped Gaussian noise (in units of half the
    action range), then clipped to the action bounds."""
    scale = (high - low) / 2
    noise = jnp.clip(jax.random.normal(key, target_actor_action.shape) * hp.policy_noise,
                     -hp.noise_clip, hp.noise_clip) * scale
    return jnp.clip(target_actor_action + noise, low, high)


def td_target(reward, discount, twin_next_q):
    """Clipped double-Q: the smaller of the two target critics. `discount` is
    gamma^m, or 0 after a termination (never after a truncation)."""
    return reward + discount * twin_next_q.min(0)


# ----------------------------------------------------------------------------- Training

def make_train(config: Config) -> agent.Train:
    # The run, in the order it executes (agent.make_runner drives the chunks):
    #   init(key, hp)          one seed's networks, optimisers, envs and empty replay
    #   for each chunk         of L = schedule.chunk_iters; those below start_chunk skipped (resume)
    #     iteration, L times   every env steps once (uniform random actions during the
    #                          warm-up), the transitions go to replay, then the due
    #       update             critic updates; actor and targets every policy_delay-th
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
    box = agent.action_box(env)  # actor's tanh output [-1, 1] -> env units
    obs_in = lambda stats, obs: (normalize.normalize(stats, obs, config.obs_clip)
                                 if config.normalize_obs else obs)

    def init(key, hp=None):
        key, k_actor, k_critic, k_env, k_eval, k_pool = jax.random.split(key, 6)
        pool = env.make_pool(k_pool)  # this seed's own initial states
        hp = agent.hparams(HParams, config) if hp is None else hp
        dummy_obs, dummy_act = jnp.zeros(env.observation_size), jnp.zeros(A)
        actor_params = actor.init(k_actor, dummy_obs)
        critic_params = critic.init(k_critic, dummy_obs, dummy_act)
        return TrainState(
            actor_params=actor_params, critic_params=critic_params,
            actor_target=actor_params, critic_target=critic_params,
            actor_opt=actor_tx(hp).init(actor_params), critic_opt=critic_tx(hp).init(critic_params),
            env_state=jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, E), pool),
            pool=pool, replay=replay.init(*buffer),
            obs_stats=normalize.init(env.observation_size), hp=hp, key=key, eval_key=k_eval,
            pending=replay.no_transition(E, env.observation_size, A) if config.overlap_physics
            else None)

    def iteration(state: TrainState, i):
        """Every env takes one step; then the due gradient updates."""
        hp = state.hp
        sigma = agent.noise_schedule(hp, config.exploration_decay_steps, i * E,
                                   config.decay_start_steps)  # exploration std
        key, k_noise, k_random = jax.random.split(state.key, 3)
        env_state = state.env_state
        obs_stats = normalize.update(state.obs_stats, env_state.obs) if config.normalize_obs \
            else state.obs_stats
        policy = box.to_env(actor.apply(state.actor_params, obs_in(obs_stats, env_state.obs)))
        noise = jax.random.normal(k_noise, policy.shape) * sigma * box.scale
        explore = box.clip(policy + noise)
        random = box.uniform(k_random, policy.shape)
        warmup = i * E < config.learning_starts
        action = jnp.where(warmup, random, explore)

        state = state._replace(obs_stats=obs_stats, key=key)

        def learn(state):
            if config.lr_decay_steps > 0:  # both rates on the env-step clock of the noise
                scale = agent.linear_schedule(1.0, config.lr_final_scale,
                                              config.lr_decay_steps, i * E,
                                              config.decay_start_steps)
                state = state._replace(
                    actor_opt=agent.set_learning_rate(state.actor_opt, hp.actor_lr * scale),
                    critic_opt=agent.set_learning_rate(state.critic_opt, hp.critic_lr * scale))
            u = (i // period) * n_updates + jnp.arange(n_updates)
            state, m = jax.lax.scan(update, state, u)
            return state, jax.tree.map(jnp.nanmean, m)

        due = ~warmup & (i % period == period - 1) & replay.ready(i, config.n_step)
        state, metrics, next_state = agent.step_and_learn(env, state, action, learn, due,
                                                          config.overlap_physics)
        return state, {**metrics, **agent.episode_metrics(next_state)}

    def update(state: TrainState, u):
        """One critic update; actor and targets every `policy_delay` updates."""
        hp = state.hp
        key, k_sample, k_noise = jax.random.split(state.key, 3)
        batch = replay.sample(state.replay, k_sample, config.batch_size, config.n_step, hp.gamma)
        obs = obs_in(state.obs_stats, batch.obs)
        next_obs = obs_in(state.obs_stats, batch.next_obs)

        next_action = smoothed_target_action(box.to_env(actor.apply(state.actor_target, next_obs)),
                                             k_noise, hp, box.low, box.high)
        target = td_target(batch.reward, batch.discount,
                           critic.apply(state.critic_target, next_obs, next_action))

        def critic_loss(params):
            q = critic.apply(params, obs, batch.action)
            return (batch.mask * ((q - target) ** 2).sum(0)).mean(), q

        (qf_loss, q), grads = jax.value_and_grad(critic_loss, has_aux=True)(state.critic_params)
        updates, critic_opt = critic_tx(hp).update(grads, state.critic_opt, state.critic_params)
        state = state._replace(critic_params=optax.apply_updates(state.critic_params, updates),
                               critic_opt=critic_opt, key=key)

        def actor_step(state):
            def actor_loss(params):
                action = box.to_env(actor.apply(params, obs))
                return -(batch.mask * critic.apply(state.critic_params, obs, action)[0]).mean()

            loss, grads = jax.value_and_grad(actor_loss)(state.actor_params)
            updates, actor_opt = actor_tx(hp).update(grads, state.actor_opt, state.actor_params)
            actor_params = optax.apply_updates(state.actor_params, updates)
            polyak = lambda t, p: optax.incremental_update(p, t, hp.tau)
            return state._replace(
                actor_params=actor_params, actor_opt=actor_opt,
                actor_target=polyak(state.actor_target, actor_params),
                critic_target=polyak(state.critic_target, state.critic_params)), loss

        # Only the networks pass through the cond: with the replay buffer and
        # env states among its operands XLA copied them on every update.
        nets, actor_loss = jax.lax.cond(
            u % config.policy_delay == 0, actor_step, agent.skipped(actor_step),
            state._replace(env_state=None, pool=None, replay=None))
        state = nets._replace(env_state=state.env_state, pool=state.pool, replay=state.replay)
        return state, {"losses/qf_loss": qf_loss / 2, "losses/actor_loss": actor_loss,
                       "losses/qf1_values": q[0].mean()}

    act = make_act(config, env)

    def evaluate(state: TrainState, chunk):
        return agent.evaluate(env, act, state, lambda o: o,
                              jax.random.fold_in(state.eval_key, chunk), config.eval_episodes)

    return agent.Train(env, schedule, init, agent.make_runner(schedule, iteration, evaluate),
                       iteration=iteration, update=update)


def make_act(config: Config, env: envs.Env):
    """act(state, obs, key, deterministic) -> action in env units, from the
    train state's actor (observations normalised as in training)."""
    actor = Actor(config.hidden_sizes, env.action_size)
    box = agent.action_box(env)

    def act(state, obs, key, deterministic=True):
        if config.normalize_obs:
            obs = normalize.normalize(state.obs_stats, obs, config.obs_clip)
        action = box.to_env(actor.apply(state.actor_params, obs))
        if deterministic:
            return action
        noise = jax.random.normal(key, action.shape) * state.hp.exploration_noise * box.scale
        return box.clip(action + noise)

    return act


# ----------------------------------------------------------------------------- Main

AGENT = agent.Agent(name="td3", doc=__doc__, Config=Config, HParams=HParams, validate=validate,
                    make_train=make_train, make_act=make_act,
                    task_defaults=TASK_DEFAULTS, ranges=RANGES,
                    accelerator_defaults=ACCELERATOR_DEFAULTS)


@exit_on_user_error
def main(argv=None):
    return cli.main(AGENT, argv)


if __name__ == "__main__":
    main()
