"""MPO: Maximum a Posteriori Policy Optimisation, fully compiled.

Abdolmaleki et al., ICLR 2018 (arXiv:1806.06920), with the decoupled KL
constraints on the mean and std of a diagonal Gaussian policy of
arXiv:1812.02256, per dimension, as in Acme's MPO loss. Each update:

- Critic: n-step TD target r + discount * mean_j Q'(s', a'_j) over N =
  `num_samples` actions a'_j ~ pi'(.|s') (target policy and critic; plain TD,
  not Retrace). `--critic categorical` is Acme's DMPO: D4PG's distribution
  over `num_atoms` returns, its target the projected mixture over the N
  samples, learned by cross-entropy; the E-step reads expected values.
- E-step, on the same states and samples (one sampled critic evaluation
  serves both, as in Acme): weights softmax_j(Q'(s, a_j) / eta), with the
  temperature eta a learned dual holding KL(weights || pi') near `epsilon`.
- M-step: weighted maximum likelihood, split into online mean with target
  std and target mean with online std, each bounded in KL from the target
  policy (`epsilon_mean`, `epsilon_stddev`) by a learned multiplier.
- Action penalization (MO-MPO, arXiv:2005.07513; Acme's default for the
  control suite): the cost -||a - clip(a, -1, 1)|| gets its own E-step
  weights and temperature (`epsilon_penalty`), so samples beyond the bounds
  lose weight however good the critic (which sees clipped actions) finds them.
- Duals: softplus(theta) + 1e-8 (Acme), trained by their own Adam
  (`dual_lr`): additive steps, so a multiplier does not explode while a bound
  is briefly out of reach. Targets are Polyak averages; `--policy-target-period
  K` copies the policy every K updates instead, as Acme does.

Gradients are clipped to a global norm of 40 (Acme). Exploration samples the
online Gaussian; evaluation acts with its mean; actions reaching the env or
the critic are clipped to the bounds. Acting, physics, replay, learning and
evaluation run as one XLA program; `--num-seeds N` trains N seeds in it.

Usage:
    python algos/mpo.py --env cheetah_run
    python algos/mpo.py --env humanoid_walk --critic categorical
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
from common.distributional import categorical_projection, expected_q
from common.mpo_loss import (MIN_DUAL_PARAM, action_cost, batch_mean, e_step, inverse_positive,
                             kl_penalty_and_dual_loss, positive)
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
    policy_target_period: int = 0
    """copy the policy to its target every this many updates, as Acme (0: Polyak at --tau)"""
    actor_lr: float = 1e-4
    """policy learning rate (Adam); kept low (as in Acme) so that one step's
    incidental change of the policy stays within the KL bounds"""
    critic_lr: float = 3e-4
    """critic learning rate (Adam)"""
    dual_lr: float = 1e-2
    """learning rate of the log temperature and log Lagrange multipliers (Adam)"""
    num_samples: int = 20
    """actions sampled from the target policy per state (E-step and critic target)"""
    epsilon: float = 0.1
    """E-step KL bound between the sample weights and the target policy"""
    epsilon_mean: float = 1e-3
    """M-step KL bound on the change of the policy mean"""
    epsilon_stddev: float = 1e-5
    """M-step KL bound on the change of the policy std"""
    init_temperature: float = 10.0
    """initial E-step temperature eta"""
    init_alpha_mean: float = 10.0
    """initial Lagrange multiplier of the mean constraint"""
    init_alpha_stddev: float = 1000.0
    """initial Lagrange multiplier of the std constraint"""
    init_std: float = 0.7
    """policy std at initialisation (the exploration noise before the M-step shrinks it)"""
    learn_std: bool = True
    """learn the policy std (--no-learn-std: held at --init-std, the mean alone is fitted)"""
    per_dim_constraining: bool = True
    """one KL constraint (and multiplier) per action dimension instead of one in total"""
    action_penalization: bool = True
    """MO-MPO action penalization (Acme's default): E-step weights from each sample's
    distance beyond the action bounds pull the policy back inside them"""
    epsilon_penalty: float = 1e-3
    """E-step KL bound of the action-penalization weights"""
    max_grad_norm: float = 40.0
    """global gradient-norm clipping of the actor and critic updates (as in Acme; 0: off)"""
    n_step: int = 1
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
    critic: str = "scalar"
    """scalar Q or categorical (Acme's DMPO: --num-atoms returns on [--v-min, --v-max])"""
    num_atoms: int = 101
    """atoms of the categorical critic's support"""
    v_min: float = 0.0
    """lowest return on the categorical critic's support"""
    v_max: float = 100.0
    """highest return on the categorical critic's support"""
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
    init_temperature=1.0, init_alpha_mean=1.0, actor_lr=3e-4, epsilon_mean=0.01,
    # The policy target's pace is MPO's brake here: on a fixed D4PG critic its step
    # climbs nearly as fast as DPG with the target copied every update, 6x slower with
    # a copy every 25 and slowest at Polyak 0.005 (scripts/mpo_operator.py). A target
    # one update old no longer anchors the std, so it is held at 0.2 (D4PG's noise).
    # With Polyak targets no probe stood up in 3M env steps; with these, both seeds
    # did (457 and 232 at 2.0M; docs/humanoid.md)
    policy_target_period=1, learn_std=False, init_std=0.2)}


# On an accelerator (docs/accelerator.md): the host steps the envs while the chip
# runs the updates, replay taking each step one iteration later. On the TPU
# machine it took the humanoid loop from 49.2 to 31.1 us per env step.
# Checkpoints every 5M env steps there (minutes, as 1M are on one core): each cost
# D4PG's run on the chip 2.0-2.1 s, about 6% of the run at one per 1M.
ACCELERATOR_DEFAULTS = {"humanoid": dict(overlap_physics=True, checkpoint_every=5_000_000)}


# The valid values of the float fields (agent.check_ranges; every float must also be
# finite), checked before anything compiles: on the command line, in AGENT.config_for (so
# TASK_DEFAULTS too) and for every swept value.
RANGES = dict(
    updates_per_step="(0, inf)", gamma="(0, 1]", tau="(0, 1]", actor_lr="(0, inf)",
    critic_lr="(0, inf)", max_grad_norm="[0, inf) 0: off",
    dual_lr="(0, inf)", epsilon="(0, inf)", epsilon_mean="(0, inf)", epsilon_stddev="(0, inf)",
    init_temperature="(0, inf)", init_alpha_mean="(0, inf)", init_alpha_stddev="(0, inf)",
    init_std="(0, inf)", epsilon_penalty="(0, inf)",
    obs_clip="(0, inf)", v_min="< v_max", v_max="(-inf, inf)")

CRITICS = ("scalar", "categorical")


def validate(config: Config) -> None:
    agent.check_ranges(config, RANGES)
    agent.check_positive(config, "num_envs", "num_seeds", "total_timesteps", "eval_episodes",
                         "buffer_size", "batch_size", "n_step", "num_samples")
    agent.check_choice(config, "critic", CRITICS)
    if config.num_atoms < 2:
        raise UserError(f"--num-atoms must be at least 2, got {config.num_atoms}")
    if config.policy_target_period < 0:
        raise UserError("--policy-target-period must be 0 (Polyak) or a positive number of "
                        f"updates, got {config.policy_target_period}")
    agent.check_off_policy(config)


# ----------------------------------------------------------------------------- Networks

MIN_STD = 1e-6


class Actor(nn.Module):
    """Diagonal Gaussian: mean and std (softplus, about init_std at init).
    The torso is Acme's LayerNormMLP (first layer layer-normalised and
    squashed by tanh, then elu): with a plain ReLU torso, unnormalised
    velocities of tens drove the std head of some states to MIN_STD, where
    the KL to the target policy reached 1e7 and swamped the M-step."""
    hidden_sizes: Tuple[int, ...]
    action_size: int
    init_std: float  # Config.init_std
    learn_std: bool = True

    @nn.compact
    def __call__(self, obs):
        x = jnp.tanh(nn.LayerNorm()(nn.Dense(self.hidden_sizes[0])(obs)))
        for h in self.hidden_sizes[1:]:
            x = nn.elu(nn.Dense(h)(x))
        mean = nn.Dense(self.action_size)(x)
        if not self.learn_std:
            return mean, jnp.full_like(mean, self.init_std)
        scale = self.init_std / jnp.log(2.0)  # softplus(0) = log 2
        std = nn.softplus(nn.Dense(self.action_size)(x)) * scale + MIN_STD
        return mean, std


class Critic(nn.Module):
    """Q(s, a): [...]; with num_atoms (--critic categorical) the logits of the
    return distribution over the support instead: [..., num_atoms]."""
    torso: networks.Torso  # hidden layers: MLP or SimBa (common/networks.py)
    num_atoms: int = 0     # 0: the scalar critic

    @nn.compact
    def __call__(self, obs, action):
        x = self.torso(jnp.concatenate([obs, action], -1))
        if self.num_atoms:
            return nn.Dense(self.num_atoms)(x)
        return nn.Dense(1)(x).squeeze(-1)


# ----------------------------------------------------------------------------- State

class HParams(NamedTuple):
    """Float hyperparameters as traced values, so one program can vmap over them."""
    gamma: jnp.ndarray
    tau: jnp.ndarray
    actor_lr: jnp.ndarray
    critic_lr: jnp.ndarray
    dual_lr: jnp.ndarray
    epsilon: jnp.ndarray
    epsilon_mean: jnp.ndarray
    epsilon_stddev: jnp.ndarray
    init_temperature: jnp.ndarray
    init_alpha_mean: jnp.ndarray
    init_alpha_stddev: jnp.ndarray
    epsilon_penalty: jnp.ndarray
    max_grad_norm: jnp.ndarray
    v_min: jnp.ndarray
    v_max: jnp.ndarray


class Duals(NamedTuple):
    """Learned dual variables as unconstrained parameters; `positive`
    (common/mpo_loss.py) maps them to the temperature and multipliers."""
    temperature: jnp.ndarray   # []
    alpha_mean: jnp.ndarray    # [A] per dimension, else [1]
    alpha_stddev: jnp.ndarray  # [A] per dimension, else [1]
    penalty_temperature: jnp.ndarray  # [] action penalization (unused when it is off)


class TrainState(NamedTuple):
    actor_params: dict
    critic_params: dict
    actor_target: dict
    critic_target: dict
    duals: Duals
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    dual_opt: optax.OptState
    env_state: envs.EnvState
    pool: envs.Pool           # this seed's initial states (dm_control resets)
    replay: replay.Replay
    obs_stats: normalize.RunningStats
    hp: HParams
    key: jax.Array
    eval_key: jax.Array
    pending: Optional[replay.Transition] = None  # --overlap-physics: replay takes it next


def init_duals(hp: HParams, num_constraints: int) -> Duals:
    ones = jnp.ones(num_constraints, jnp.float32)
    return Duals(inverse_positive(hp.init_temperature),
                 inverse_positive(hp.init_alpha_mean) * ones,
                 inverse_positive(hp.init_alpha_stddev) * ones,
                 inverse_positive(hp.init_temperature))


def project_duals(duals: Duals) -> Duals:
    return jax.tree.map(lambda d: jnp.maximum(d, MIN_DUAL_PARAM), duals)


# ----------------------------------------------------------------------------- Algorithm
# (the E-step, the action cost and the KL penalties are in common/mpo_loss.py)

def td_target(reward, discount, next_q_samples):
    """Expected-value target: the critic averaged over the sampled next
    actions ([N, B]). `discount` is gamma^m, or 0 after a termination (never
    after a truncation)."""
    return reward + discount * next_q_samples.mean(0)


def categorical_td_target(reward, discount, next_logits, v_min, v_max):
    """The categorical critic's target (Acme's DMPO): the mixture (mean of the
    probabilities) of the target critic's distributions of the N sampled next
    actions (logits [N, B, K]), shifted by the n-step return, scaled by
    `discount` and projected onto the support: [B, K]. The projection is
    linear, so this is also the mean of the N projected distributions."""
    mixture = jax.nn.softmax(next_logits).mean(0)
    return categorical_projection(reward, discount, mixture, v_min, v_max)


def policy_loss(mean, std, target_mean, target_std, actions, q, duals: Duals, hp: HParams,
                per_dim: bool = True, penalize: bool = False, mask=None):
    """E-step and decoupled M-step (arXiv:1812.02256): one scalar whose
    gradient trains the online policy (through mean, std) and the duals.

    mean, std: online policy [B, A]; target_mean, target_std: target policy;
    actions: [N, B, A] sampled from the target policy; q: [N, B] their values;
    penalize: action penalization (MO-MPO, arXiv:2005.07513, as in Acme): the
    E-step weights of the action cost, with their own temperature and bound
    epsilon_penalty, are added to those of q (each state's weights then sum
    to 2), and their temperature dual loss to the temperature's.
    mask: [B], 0 for states that must not count (diverged steps)."""
    temperature = positive(duals.temperature)
    alpha_mean, alpha_stddev = positive(duals.alpha_mean), positive(duals.alpha_stddev)
    weights, temperature_loss, kl_weights = e_step(q, temperature, hp.epsilon, mask)
    penalty_temperature = positive(duals.penalty_temperature)
    kl_penalty = jnp.zeros(())
    if penalize:
        penalty_weights, penalty_loss, kl_penalty = e_step(
            action_cost(actions), penalty_temperature, hp.epsilon_penalty, mask)
        weights = weights + penalty_weights
        temperature_loss = temperature_loss + penalty_loss

    # online mean with the target std, and target mean with the online std
    fixed_std = distrax.Normal(mean, target_std)
    fixed_mean = distrax.Normal(target_mean, std)
    nll_mean = -batch_mean((weights * fixed_std.log_prob(actions).sum(-1)).sum(0), mask)
    nll_stddev = -batch_mean((weights * fixed_mean.log_prob(actions).sum(-1)).sum(0), mask)

    target = distrax.Normal(target_mean, target_std)
    penalty_mean, dual_mean, kl_mean = kl_penalty_and_dual_loss(
        target.kl_divergence(fixed_std), alpha_mean, hp.epsilon_mean, per_dim, mask)
    penalty_stddev, dual_stddev, kl_stddev = kl_penalty_and_dual_loss(
        target.kl_divergence(fixed_mean), alpha_stddev, hp.epsilon_stddev, per_dim, mask)

    loss = (nll_mean + nll_stddev + penalty_mean + penalty_stddev
            + temperature_loss + dual_mean + dual_stddev)
    metrics = {"losses/actor_loss": nll_mean + nll_stddev,
               "losses/temperature_loss": temperature_loss, "stats/temperature": temperature,
               "stats/alpha_mean": alpha_mean.mean(),
               "stats/alpha_stddev": alpha_stddev.mean(), "stats/kl_weights": kl_weights,
               "stats/kl_mean": kl_mean.sum(), "stats/kl_stddev": kl_stddev.sum(),
               "stats/policy_std": std.mean(), "stats/penalty_temperature": penalty_temperature,
               "stats/kl_penalty": kl_penalty}
    return loss, metrics


# ----------------------------------------------------------------------------- Training

def make_train(config: Config) -> agent.Train:
    # The run, in the order it executes (agent.make_runner drives the chunks):
    #   init(key, hp)          one seed's networks, duals, optimisers, envs and empty replay
    #   for each chunk         of L = schedule.chunk_iters; those below start_chunk skipped (resume)
    #     iteration, L times   every env steps once (uniform random actions during the
    #                          warm-up), the transitions go to replay, then the due
    #       update             critic, E-step and M-step (policy and duals), targets
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
    E, A, N = config.num_envs, env.action_size, config.num_samples

    actor = Actor(config.hidden_sizes, A, config.init_std, config.learn_std)
    categorical = config.critic == "categorical"
    critic = Critic(networks.critic_torso(config), config.num_atoms if categorical else 0)
    # learning rates and the clip bound are traced (swept); at --max-grad-norm 0 there is
    # no clipping stage, so the default program is the one without it
    clip = lambda hp: hp.max_grad_norm if config.max_grad_norm > 0 else None
    actor_tx = lambda hp: agent.adam(hp.actor_lr, clip(hp))
    critic_tx = lambda hp: agent.adam(hp.critic_lr, clip(hp))
    dual_tx = lambda hp: agent.adam(hp.dual_lr)
    box = agent.action_box(env)
    to_env = lambda a: box.clip(box.to_env(a))  # policy units -> env units, within the bounds
    obs_in = lambda stats, obs: (normalize.normalize(stats, obs, config.obs_clip)
                                 if config.normalize_obs else obs)

    def sampled_critic(critic_params, obs, actions):
        """The critic of N actions per state: obs [B, D], actions [N, B, A] ->
        Q [N, B] (categorical: logits [N, B, K])."""
        return critic.apply(critic_params, jnp.broadcast_to(obs, (N,) + obs.shape), to_env(actions))

    def init(key, hp=None):
        key, k_actor, k_critic, k_env, k_eval, k_pool = jax.random.split(key, 6)
        pool = env.make_pool(k_pool)  # this seed's own initial states
        hp = agent.hparams(HParams, config) if hp is None else hp
        dummy_obs, dummy_act = jnp.zeros(env.observation_size), jnp.zeros(A)
        actor_params = actor.init(k_actor, dummy_obs)
        critic_params = critic.init(k_critic, dummy_obs, dummy_act)
        duals = init_duals(hp, A if config.per_dim_constraining else 1)
        return TrainState(
            actor_params=actor_params, critic_params=critic_params,
            actor_target=actor_params, critic_target=critic_params, duals=duals,
            actor_opt=actor_tx(hp).init(actor_params), critic_opt=critic_tx(hp).init(critic_params),
            dual_opt=dual_tx(hp).init(duals),
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
        mean, std = actor.apply(state.actor_params, obs_in(obs_stats, env_state.obs))
        explore = to_env(distrax.Normal(mean, std).sample(seed=k_policy))
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
        """One critic update, then policy and duals (E- and M-step), then targets."""
        hp = state.hp
        key, k_sample, k_next = jax.random.split(state.key, 3)
        batch = replay.sample(state.replay, k_sample, config.batch_size, config.n_step, hp.gamma)
        obs = obs_in(state.obs_stats, batch.obs)
        next_obs = obs_in(state.obs_stats, batch.next_obs)

        # One set of N target-policy samples at the next states serves both the
        # TD target and the E-step (as in Acme): the sampled critic is most of
        # the update's cost.
        target_mean, target_std = actor.apply(state.actor_target, next_obs)
        actions = distrax.Normal(target_mean, target_std).sample(seed=k_next, sample_shape=N)
        if categorical:  # the E-step reads each sample's expected value
            logits = sampled_critic(state.critic_target, next_obs, actions)
            target = categorical_td_target(batch.reward, batch.discount, logits,
                                           hp.v_min, hp.v_max)
            q_samples = expected_q(logits, hp.v_min, hp.v_max)
        else:
            q_samples = sampled_critic(state.critic_target, next_obs, actions)
            target = td_target(batch.reward, batch.discount, q_samples)

        def critic_loss(params):
            out = critic.apply(params, obs, batch.action)
            if categorical:
                cross_entropy = -(target * jax.nn.log_softmax(out)).sum(-1)
                return (batch.mask * cross_entropy).mean(), expected_q(out, hp.v_min, hp.v_max)
            return (batch.mask * (out - target) ** 2).mean(), out

        (qf_loss, q), grads = jax.value_and_grad(critic_loss, has_aux=True)(state.critic_params)
        updates, critic_opt = critic_tx(hp).update(grads, state.critic_opt, state.critic_params)
        critic_params = optax.apply_updates(state.critic_params, updates)

        def loss(actor_params, duals):
            mean, std = actor.apply(actor_params, next_obs)
            return policy_loss(mean, std, target_mean, target_std, actions, q_samples, duals, hp,
                               config.per_dim_constraining, config.action_penalization, batch.mask)

        (_, metrics), (actor_grads, dual_grads) = jax.value_and_grad(
            loss, argnums=(0, 1), has_aux=True)(state.actor_params, state.duals)
        updates, actor_opt = actor_tx(hp).update(actor_grads, state.actor_opt, state.actor_params)
        actor_params = optax.apply_updates(state.actor_params, updates)
        updates, dual_opt = dual_tx(hp).update(dual_grads, state.dual_opt, state.duals)
        duals = project_duals(optax.apply_updates(state.duals, updates))

        polyak = lambda t, p: optax.incremental_update(p, t, hp.tau)
        copy = (u % max(config.policy_target_period, 1)) == config.policy_target_period - 1
        state = state._replace(
            actor_params=actor_params, critic_params=critic_params, duals=duals,
            actor_opt=actor_opt, critic_opt=critic_opt, dual_opt=dual_opt,
            actor_target=(polyak(state.actor_target, actor_params)
                          if config.policy_target_period == 0 else
                          jax.tree.map(lambda t, p: jnp.where(copy, p, t), state.actor_target,
                                       actor_params)),
            critic_target=polyak(state.critic_target, critic_params), key=key)
        return state, {"losses/qf_loss": qf_loss, "losses/qf1_values": q.mean(), **metrics}

    act = make_act(config, env)

    def evaluate(state: TrainState, chunk):
        return agent.evaluate(env, act, state, lambda o: o,
                              jax.random.fold_in(state.eval_key, chunk), config.eval_episodes)

    return agent.Train(env, schedule, init, agent.make_runner(schedule, iteration, evaluate),
                       iteration=iteration, update=update)


def make_act(config: Config, env: envs.Env):
    """act(state, obs, key, deterministic) -> action in env units, from the
    train state's policy (observations normalised as in training): the
    Gaussian's mean when deterministic, else a sample as in training; clipped
    to the bounds."""
    actor = Actor(config.hidden_sizes, env.action_size, config.init_std, config.learn_std)
    box = agent.action_box(env)

    def act(state, obs, key, deterministic=True):
        if config.normalize_obs:
            obs = normalize.normalize(state.obs_stats, obs, config.obs_clip)
        mean, std = actor.apply(state.actor_params, obs)
        action = mean if deterministic else distrax.Normal(mean, std).sample(seed=key)
        return box.clip(box.to_env(action))

    return act


# ----------------------------------------------------------------------------- Main

AGENT = agent.Agent(name="mpo", doc=__doc__, Config=Config, HParams=HParams, validate=validate,
                    make_train=make_train, make_act=make_act,
                    task_defaults=TASK_DEFAULTS, ranges=RANGES,
                    accelerator_defaults=ACCELERATOR_DEFAULTS)


@exit_on_user_error
def main(argv=None):
    return cli.main(AGENT, argv)


if __name__ == "__main__":
    main()
