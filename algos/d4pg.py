"""D4PG: Distributed Distributional DDPG, fully compiled (single process).

Barth-Maron et al., "Distributed Distributional Deterministic Policy
Gradients", ICLR 2018 (arXiv:1804.08617). DDPG with a categorical (C51-style)
critic: Z(s, a) is a distribution over `num_atoms` fixed returns evenly spaced
on [v_min, v_max]; its target, r + gamma^n Z'(s', pi'(s')), is projected back
onto that support and learned by cross-entropy; the actor maximises the
distribution's mean. n-step returns (default 5); after a termination the
target is all mass at the n-step return. Gaussian exploration noise, Polyak
targets after every update.

What this script leaves out of the paper: the distributed actors (here the
`--num-envs` envs of one process act with one policy and one noise scale) and
prioritised replay (replay here is uniform). The default support [0, 100]
fits dm_control rewards, in [0, 1] per step, with gamma 0.99.

Acting in `num_envs` parallel envs, physics, replay, learning and evaluation
run as one XLA program; `--num-seeds N` trains N independent seeds in it.

Usage:
    python algos/d4pg.py --env cheetah_run
    python algos/d4pg.py --env humanoid_walk --num-seeds 4 --num-atoms 51
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
from common.distributional import categorical_projection
from common.errors import UserError, exit_on_user_error


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
    decay_start_steps: int = 0
    """env step at which that decay begins (before it the run is the undecayed one, bit for
    bit)"""
    n_step: int = 5
    """n-step returns (windows stop at episode ends)"""
    hidden_sizes: Tuple[int, ...] = (256, 256)
    """hidden layer widths of actor and critic"""
    critic_layer_norm: bool = False
    """layer norm after each hidden layer of the critic"""
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
    num_atoms: int = 101
    """atoms of the categorical critic's support"""
    v_min: float = 0.0
    """lowest return on the critic's support"""
    v_max: float = 100.0
    """highest return on the critic's support"""


# The humanoid recipe (humanoid_stand, _walk, _run): these values replace the
# defaults above on those tasks, any flag given still wins, and a run prints
# the ones it uses. Found by one-core probes (docs/results/humanoid/probes.md):
# hundreds of envs with one update per 16 env steps use one core's time on
# physics and learning in a ratio that learns fastest per hour.
TASK_DEFAULTS = {"humanoid": dict(
    num_envs=256, updates_per_step=0.0625, total_timesteps=10_000_000, eval_every=500_000,
    checkpoint_every=1_000_000, critic_layer_norm=True, normalize_obs=True,
    exploration_noise=0.2)}

# On an accelerator (docs/accelerator.md): the host steps the envs while the chip
# runs the updates, replay taking each step one iteration later. On the TPU
# machine it took the humanoid loop from 45.9 to 33.8 us per env step, and in ten
# minutes humanoid_walk from 852 to 917 and humanoid_run from 332 to 482.
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
    obs_clip="(0, inf)", v_min="< v_max", v_max="(-inf, inf)")


def validate(config: Config) -> None:
    agent.check_ranges(config, RANGES)
    agent.check_positive(config, "num_envs", "num_seeds", "total_timesteps", "eval_episodes",
                         "buffer_size", "batch_size", "n_step")
    if config.num_atoms < 2:
        raise UserError(f"--num-atoms must be at least 2, got {config.num_atoms}")
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
    """Logits of the return distribution over the support: [..., num_atoms]."""
    torso: networks.Torso  # hidden layers: MLP or SimBa (common/networks.py)
    num_atoms: int

    @nn.compact
    def __call__(self, obs, action):
        x = self.torso(jnp.concatenate([obs, action], -1))
        return nn.Dense(self.num_atoms)(x)


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
    v_min: jnp.ndarray
    v_max: jnp.ndarray


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

def td_target(reward, discount, next_logits, v_min, v_max):
    """The categorical TD target: the target critic's distribution shifted by
    the n-step return, scaled by `discount` (gamma^m, or 0 after a
    termination, never after a truncation) and projected onto the support."""
    probs = jax.nn.softmax(next_logits)
    return categorical_projection(reward, discount, probs, v_min, v_max)


# ----------------------------------------------------------------------------- Training

def make_train(config: Config) -> agent.Train:
    # The run, in the order it executes (agent.make_runner drives the chunks):
    #   init(key, hp)          one seed's networks, optimisers, envs and empty replay
    #   for each chunk         of L = schedule.chunk_iters; those below start_chunk skipped (resume)
    #     iteration, L times   every env steps once (uniform random actions during the
    #                          warm-up), the transitions go to replay, then the due
    #       update             critic, actor, then both targets
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
    critic = Critic(networks.critic_torso(config), config.num_atoms)
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
            u = (i // period) * n_updates + jnp.arange(n_updates)
            state, m = jax.lax.scan(update, state, u)
            return state, jax.tree.map(jnp.nanmean, m)

        due = ~warmup & (i % period == period - 1) & replay.ready(i, config.n_step)
        state, metrics, next_state = agent.step_and_learn(env, state, action, learn, due,
                                                          config.overlap_physics)
        return state, {**metrics, **agent.episode_metrics(next_state)}

    def update(state: TrainState, u):
        """One critic update, one actor update, then both targets."""
        hp = state.hp
        key, k_sample = jax.random.split(state.key)
        batch = replay.sample(state.replay, k_sample, config.batch_size, config.n_step, hp.gamma)
        obs = obs_in(state.obs_stats, batch.obs)
        next_obs = obs_in(state.obs_stats, batch.next_obs)

        next_action = box.to_env(actor.apply(state.actor_target, next_obs))
        target = td_target(batch.reward, batch.discount,
                           critic.apply(state.critic_target, next_obs, next_action),
                           hp.v_min, hp.v_max)
        support = jnp.linspace(hp.v_min, hp.v_max, config.num_atoms)

        def critic_loss(params):
            logits = critic.apply(params, obs, batch.action)
            q = (jax.nn.softmax(logits) * support).sum(-1)
            cross_entropy = -(target * jax.nn.log_softmax(logits)).sum(-1)
            return (batch.mask * cross_entropy).mean(), q

        (qf_loss, q), grads = jax.value_and_grad(critic_loss, has_aux=True)(state.critic_params)
        updates, critic_opt = critic_tx(hp).update(grads, state.critic_opt, state.critic_params)
        state = state._replace(critic_params=optax.apply_updates(state.critic_params, updates),
                               critic_opt=critic_opt, key=key)

        def actor_step(state):
            def actor_loss(params):
                action = box.to_env(actor.apply(params, obs))
                logits = critic.apply(state.critic_params, obs, action)
                return -(batch.mask * (jax.nn.softmax(logits) * support).sum(-1)).mean()

            loss, grads = jax.value_and_grad(actor_loss)(state.actor_params)
            updates, actor_opt = actor_tx(hp).update(grads, state.actor_opt, state.actor_params)
            actor_params = optax.apply_updates(state.actor_params, updates)
            polyak = lambda t, p: optax.incremental_update(p, t, hp.tau)
            return state._replace(
                actor_params=actor_params, actor_opt=actor_opt,
                actor_target=polyak(state.actor_target, actor_params),
                critic_target=polyak(state.critic_target, state.critic_params)), loss

        state, actor_loss = actor_step(state)
        return state, {"losses/qf_loss": qf_loss, "losses/actor_loss": actor_loss,
                       "losses/qf1_values": q.mean()}

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

AGENT = agent.Agent(name="d4pg", doc=__doc__, Config=Config, HParams=HParams, validate=validate,
                    make_train=make_train, make_act=make_act,
                    task_defaults=TASK_DEFAULTS, ranges=RANGES,
                    accelerator_defaults=ACCELERATOR_DEFAULTS)


@exit_on_user_error
def main(argv=None):
    return cli.main(AGENT, argv)


if __name__ == "__main__":
    main()
