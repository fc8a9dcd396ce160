r"""PPO: Proximal Policy Optimization with a clipped surrogate, fully compiled.

Schulman, Wolski, Dhariwal, Radford and Klimov, "Proximal Policy Optimization
Algorithms", arXiv:1707.06347 (2017), with the details that matter for
continuous control (Huang et al., "The 37 Implementation Details of Proximal
Policy Optimization", ICLR blog track 2022): many parallel envs, GAE,
advantages normalised per minibatch, clipped surrogate, value loss (clipping
optional), entropy bonus, several epochs of shuffled minibatches, global
gradient-norm clipping, optional learning-rate annealing, a Gaussian policy
with a state-independent log std (unclipped actions stored, clipped ones sent
to the env), orthogonal initialisation, observation normalisation and reward
scaling.

Truncation and termination are kept apart: GAE bootstraps through a
1000-step time limit from the value of the true final observation
(`info["final_obs"]`) and uses 0 after a termination; the lambda-trace
stops at either.

One runner iteration is one rollout of `num_steps` steps in each of the
`num_envs` envs followed by `update_epochs` passes of `num_minibatches`
shuffled minibatches over it. Observation statistics stay fixed during a
rollout and its update (so the first ratio is exactly 1); the rollout's
observations are folded into them for the next rollout.

Defaults are Brax PPO's tuned settings for the MuJoCo Playground dm_control
suite (mujoco_playground/config/dm_control_suite_params.py, brax_ppo_config:
unroll 30, discount 0.995, lr 1e-3, entropy cost 1e-2, reward scaling 10,
observation normalisation, 60M steps; brax/training/agents/ppo: clip 0.3,
GAE lambda 0.95, a 4x32 policy, a state-independent std starting at 1),
sized for a CPU: 1024 envs rather than 2048, 4 epochs of 8 minibatches
(3,840 transitions each) rather than 16 epochs, and a 2x256 value network
rather than 5x256 (docs/ppo_sizing.md: the flags close to Brax's sizes, for
a GPU, and the cost and throughput of both). From CleanRL rather than
Brax: gradient-norm clipping at 0.5 (Brax: none), orthogonal initialisation
(Brax: lecun uniform) and a plain Gaussian clipped at the action bounds
(Brax: tanh-squashed).

Usage:
    python algos/ppo.py --env cheetah_run
    # CPU-sized (small minibatches, many epochs; its results: docs/ppo_sizing.md)
    python algos/ppo.py --env cartpole_balance --num-envs 32 --num-steps 64 \
        --num-minibatches 32 --update-epochs 10 --anneal-lr --normalize-reward --init-log-std -0.5 \
        --actor-hidden-sizes 64 64 --critic-hidden-sizes 64 64 --total-timesteps 800000
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import dataclass, replace
from typing import NamedTuple, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from common import agent, cli, envs, normalize
from common.errors import UserError, exit_on_user_error


# ----------------------------------------------------------------------------- Config

@dataclass(frozen=True)
class Config:
    env: str = "cheetah_run"
    """dm_control task, <domain>_<task>"""
    backend: str = "auto"
    """physics backend: auto (native on a CPU or TPU, mjx on a GPU), native or mjx"""
    num_envs: int = 1024
    """parallel envs per seed"""
    num_seeds: int = 1
    """independent seeds trained at once in one program"""
    total_timesteps: int = 60_000_000
    """env steps per seed (rounded down to whole rollouts of num_envs x num_steps)"""
    seed: int = 1
    """seed of the first run; the others get their own streams split from it"""
    eval_every: int = 5_000_000
    """env steps between evaluations (0: only at the end)"""
    eval_episodes: int = 10
    """deterministic episodes per evaluation"""
    log_dir: str = "runs"
    """where run directories (TensorBoard logs, config, checkpoint) go"""
    checkpoint_every: int = 5_000_000
    """env steps between checkpoints (0: only at the end)"""
    resume: Optional[str] = None
    """checkpoint file or run directory to continue"""
    compile_cache: bool = True
    """keep compiled programs in JAX's persistent compilation cache ($RL_COMPILE_CACHE_DIR, else
    ~/.cache/jax-mujoco-rl/xla); training programs stay out of it (host callbacks)"""

    num_steps: int = 30
    """rollout length per env between updates (Brax's unroll_length)"""
    num_minibatches: int = 8
    """minibatches per epoch; num_envs x num_steps must divide into them"""
    update_epochs: int = 4
    """passes over each rollout (Brax's num_updates_per_batch)"""
    gamma: float = 0.995
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    learning_rate: float = 1e-3
    """Adam learning rate (actor and critic together)"""
    anneal_lr: bool = False
    """decay the learning rate linearly to 0 over the run"""
    clip_coef: float = 0.3
    """surrogate clipping range: the ratio is clipped to 1 +- clip_coef"""
    clip_vloss: bool = False
    """clip value updates to +-clip_coef around the rollout's values"""
    ent_coef: float = 1e-2
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient (value loss is 0.5 x squared error)"""
    max_grad_norm: float = 0.5
    """clip the global norm of the actor+critic gradient to this"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    reward_scaling: float = 10.0
    """rewards are multiplied by this before learning"""
    normalize_reward: bool = False
    """divide rewards by the running std of the discounted return (before reward_scaling)"""
    normalize_obs: bool = True
    """normalise observations with running mean/std over all envs"""
    obs_clip: float = 10.0
    """normalised observations are clipped to +-obs_clip"""
    actor_hidden_sizes: Tuple[int, ...] = (32, 32, 32, 32)
    """hidden layer widths of the policy"""
    critic_hidden_sizes: Tuple[int, ...] = (256, 256)
    """hidden layer widths of the value function"""
    init_log_std: float = 0.0
    """initial log std of the Gaussian policy (in units of half the action range)"""


# The humanoid recipe (humanoid_stand, _walk, _run): these values replace the
# defaults above on those tasks, any flag given still wins, and a run prints
# the ones it uses. Found by one-core probes (docs/results/humanoid/probes.md).
TASK_DEFAULTS = {"humanoid": dict(
    num_envs=512, num_steps=32, total_timesteps=40_000_000, eval_every=2_000_000,
    checkpoint_every=5_000_000, num_minibatches=8, update_epochs=4, gamma=0.99,
    learning_rate=3e-4, clip_coef=0.2, ent_coef=1e-3, reward_scaling=1.0, obs_clip=5.0,
    actor_hidden_sizes=(256, 256), critic_hidden_sizes=(256, 256), init_log_std=-0.5)}


# The valid values of the float fields (agent.check_ranges; every float must also be
# finite), checked before anything compiles: on the command line, in AGENT.config_for (so
# TASK_DEFAULTS too) and for every swept value.
RANGES = dict(
    gamma="(0, 1]", gae_lambda="[0, 1]", learning_rate="(0, inf)", clip_coef="(0, inf)",
    ent_coef="[0, inf)", vf_coef="[0, inf)", max_grad_norm="(0, inf)", reward_scaling="(0, inf)",
    obs_clip="(0, inf)", init_log_std="(-inf, inf)")


def validate(config: Config) -> None:
    agent.check_ranges(config, RANGES)
    agent.check_positive(config, "num_envs", "num_seeds", "total_timesteps", "eval_episodes",
                         "num_steps", "num_minibatches", "update_epochs")
    for name in ("actor_hidden_sizes", "critic_hidden_sizes"):
        if min(getattr(config, name), default=0) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive widths, "
                            f"got {getattr(config, name)}")
    batch = config.num_envs * config.num_steps
    if batch % config.num_minibatches:
        raise UserError(f"--num-envs x --num-steps ({batch}) is not divisible by "
                        f"--num-minibatches {config.num_minibatches}")
    if config.total_timesteps < batch:
        raise UserError(f"--total-timesteps {config.total_timesteps} is smaller than one rollout "
                        f"of {batch} env steps (--num-envs {config.num_envs} x --num-steps "
                        f"{config.num_steps})")


# ----------------------------------------------------------------------------- Networks

def _dense(features: int, scale: float) -> nn.Dense:
    return nn.Dense(features, kernel_init=agent.orthogonal(scale),
                    bias_init=nn.initializers.zeros)


class Actor(nn.Module):
    """Mean of the Gaussian policy, in units of half the action range, and a
    state-independent log std."""
    hidden_sizes: Tuple[int, ...]
    action_size: int

    @nn.compact
    def __call__(self, obs):
        x = obs
        for h in self.hidden_sizes:
            x = nn.swish(_dense(h, np.sqrt(2))(x))
        mean = _dense(self.action_size, 0.01)(x)
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_size,))
        return mean, jnp.broadcast_to(log_std, mean.shape)


class Critic(nn.Module):
    hidden_sizes: Tuple[int, ...]

    @nn.compact
    def __call__(self, obs):
        x = obs
        for h in self.hidden_sizes:
            x = nn.swish(_dense(h, np.sqrt(2))(x))
        return _dense(1, 1.0)(x).squeeze(-1)


def gaussian_log_prob(action, mean, log_std):
    return (-0.5 * ((action - mean) / jnp.exp(log_std)) ** 2 - log_std
            - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)


def gaussian_entropy(log_std):
    return (log_std + 0.5 * (1 + jnp.log(2 * jnp.pi))).sum(-1)


# ----------------------------------------------------------------------------- State

class HParams(NamedTuple):
    """Float hyperparameters as traced values, so one program can vmap over them."""
    gamma: jnp.ndarray
    gae_lambda: jnp.ndarray
    learning_rate: jnp.ndarray
    clip_coef: jnp.ndarray
    ent_coef: jnp.ndarray
    vf_coef: jnp.ndarray
    max_grad_norm: jnp.ndarray
    reward_scaling: jnp.ndarray
    init_log_std: jnp.ndarray


class TrainState(NamedTuple):
    actor_params: dict
    critic_params: dict
    opt: optax.OptState
    env_state: envs.EnvState
    pool: envs.Pool           # this seed's initial states (dm_control resets)
    obs_stats: normalize.RunningStats
    return_stats: normalize.RunningStats   # of the discounted return, for normalize_reward
    returns: jnp.ndarray                   # [num_envs] discounted return so far
    hp: HParams
    key: jax.Array
    eval_key: jax.Array


class Rollout(NamedTuple):
    """One rollout, [num_steps, num_envs, ...]; obs already normalised."""
    obs: jnp.ndarray
    action: jnp.ndarray       # the unclipped Gaussian sample
    log_prob: jnp.ndarray
    value: jnp.ndarray        # V(s_t)
    next_value: jnp.ndarray   # V(true s_{t+1}): of info["final_obs"] when the episode ended
    reward: jnp.ndarray       # scaled
    terminated: jnp.ndarray
    done: jnp.ndarray         # terminated | truncated
    valid: jnp.ndarray        # False where the physics diverged: never learned from


class Batch(NamedTuple):
    obs: jnp.ndarray
    action: jnp.ndarray
    log_prob: jnp.ndarray
    value: jnp.ndarray
    advantage: jnp.ndarray
    ret: jnp.ndarray
    weight: jnp.ndarray       # 1.0, or 0.0 for a diverged step (no policy or value loss)


# ----------------------------------------------------------------------------- Algorithm

def masked_mean(x, weight):
    return (weight * x).sum() / jnp.maximum(weight.sum(), 1.0)


def gae(reward, value, next_value, terminated, done, gamma, lam, valid=None):
    """Generalised advantage estimation over [T, ...] arrays.

    delta_t = r_t + gamma (1 - terminated_t) V(s'_t) - V(s_t), with s'_t the
    true next observation (the final one when the episode ended there), and
    A_t = delta_t + gamma lam (1 - done_t) A_{t+1}, A_T = 0: a truncated step
    still bootstraps from V(s'_t), a terminated one does not, and no trace
    crosses an episode boundary. A diverged step (valid False; it is also
    done) gets delta 0, so advantage 0 and value target V(s_t): what it
    produced reaches no loss. Returns (advantages, value targets)."""
    not_term = 1.0 - terminated.astype(jnp.float32)
    not_done = 1.0 - done.astype(jnp.float32)
    delta = reward + gamma * not_term * next_value - value
    if valid is not None:
        delta = jnp.where(valid, delta, 0.0)

    def back(acc, x):
        delta, not_done = x
        acc = delta + gamma * lam * not_done * acc
        return acc, acc

    _, adv = jax.lax.scan(back, jnp.zeros_like(value[0]), (delta, not_done), reverse=True)
    return adv, adv + value


def policy_loss(log_prob, old_log_prob, advantage, clip_coef, weight=1.0):
    """Clipped surrogate, -E[min(ratio A, clip(ratio, 1-eps, 1+eps) A)]; also
    the approximate KL ((ratio - 1) - log ratio) and the clipped fraction;
    means over the steps of weight 1."""
    weight = jnp.broadcast_to(weight, advantage.shape)
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    loss = -masked_mean(jnp.minimum(ratio * advantage,
                                    jnp.clip(ratio, 1 - clip_coef, 1 + clip_coef) * advantage),
                        weight)
    approx_kl = masked_mean((ratio - 1) - log_ratio, weight)
    clipfrac = masked_mean((jnp.abs(ratio - 1) > clip_coef).astype(jnp.float32), weight)
    return loss, (jax.lax.stop_gradient(approx_kl), jax.lax.stop_gradient(clipfrac))


def value_loss(value, old_value, ret, clip_coef, clip: bool, weight=1.0):
    """0.5 x squared error; with `clip`, the larger of the errors of the new
    value and of the old one moved at most clip_coef toward it; mean over the
    steps of weight 1."""
    err = (value - ret) ** 2
    if clip:
        clipped = old_value + jnp.clip(value - old_value, -clip_coef, clip_coef)
        err = jnp.maximum(err, (clipped - ret) ** 2)
    return 0.5 * masked_mean(err, jnp.broadcast_to(weight, err.shape))


# ----------------------------------------------------------------------------- Training

def make_schedule(config: Config) -> agent.Schedule:
    """The runner's iteration is one rollout: a 'step' of the schedule is
    num_envs x num_steps env steps. Chunks (logging) of about 1000 env steps,
    at least one rollout."""
    rollout = config.num_envs * config.num_steps
    log_every = rollout * max(1, min(1000, config.total_timesteps) // rollout)
    return agent.make_schedule(replace(config, num_envs=rollout), log_every=log_every)


def make_train(config: Config) -> agent.Train:
    # The run, in the order it executes (agent.make_runner drives the chunks):
    #   init(key, hp)          one seed's networks, optimiser and envs
    #   for each chunk         of L = schedule.chunk_iters; those below start_chunk skipped (resume)
    #     iteration, L times   a rollout of num_steps in every env, GAE, then
    #       learn              update_epochs passes of num_minibatches updates (loss_fn)
    #     evaluate             at evaluation chunks and the last
    #     hooks.log            the chunk's metrics (means over its iterations)
    #     hooks.checkpoint     the state, at checkpoint chunks and the last
    validate(config)
    env = envs.make(config.env, config.backend)
    groups = agent.env_groups(config.num_envs)
    schedule = make_schedule(config)
    num_iterations = schedule.num_chunks * schedule.chunk_iters
    E, T, A, D = config.num_envs, config.num_steps, env.action_size, env.observation_size
    N, M = E * T, config.num_minibatches
    # rollout (obs, action, 6 scalars) plus one shuffled copy of it, per seed
    agent.check_memory(config.num_seeds * 2 * N * (D + A + 6) * 4, "the rollout batch")

    actor = Actor(config.actor_hidden_sizes, A)
    critic = Critic(config.critic_hidden_sizes)
    # one optimiser for actor and critic together; learn() applies the (annealed) learning rate
    tx = lambda hp: optax.chain(optax.clip_by_global_norm(hp.max_grad_norm),
                                optax.scale_by_adam(eps=1e-5))
    box = agent.action_box(env)
    to_env = lambda a: box.to_env(jnp.clip(a, -1.0, 1.0))  # policy units -> env units
    obs_in = lambda stats, obs: (normalize.normalize(stats, obs, config.obs_clip)
                                 if config.normalize_obs else obs)

    def init(key, hp=None):
        key, k_actor, k_critic, k_env, k_eval, k_pool = jax.random.split(key, 6)
        pool = env.make_pool(k_pool)  # this seed's own initial states
        hp = agent.hparams(HParams, config) if hp is None else hp
        dummy_obs = jnp.zeros(D)
        actor_params = actor.init(k_actor, dummy_obs)
        actor_params["params"]["log_std"] = jnp.full(A, hp.init_log_std)
        critic_params = critic.init(k_critic, dummy_obs)
        return TrainState(
            actor_params=actor_params, critic_params=critic_params,
            opt=tx(hp).init((actor_params, critic_params)),
            env_state=jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, E), pool),
            pool=pool,
            obs_stats=normalize.init(D), return_stats=normalize.init(1),
            returns=jnp.zeros(E, jnp.float32), hp=hp, key=key, eval_key=k_eval)

    def iteration(state: TrainState, i):
        """One rollout, GAE, then update_epochs x num_minibatches updates."""
        hp = state.hp
        key, k_rollout, k_learn = jax.random.split(state.key, 3)
        state, data, new_stats, episodes = rollout(state._replace(key=key), k_rollout)
        adv, ret = gae(data.reward, data.value, data.next_value, data.terminated, data.done,
                       hp.gamma, hp.gae_lambda, data.valid)
        flat = lambda x: x.reshape(N, *x.shape[2:])
        batch = Batch(flat(data.obs), flat(data.action), flat(data.log_prob), flat(data.value),
                      flat(adv), flat(ret), flat(data.valid.astype(jnp.float32)))
        frac = 1.0 - i.astype(jnp.float32) / num_iterations if config.anneal_lr else 1.0
        lr = hp.learning_rate * frac
        state, metrics = learn(state, batch, k_learn, lr)
        state = state._replace(obs_stats=new_stats)
        var_ret = jnp.var(ret)
        metrics.update({
            "losses/explained_variance": jnp.where(
                var_ret > 0, 1 - jnp.var(ret - data.value) / var_ret, jnp.nan),
            "stats/learning_rate": lr * jnp.ones(()),
            "stats/action_std": jnp.exp(state.actor_params["params"]["log_std"]).mean(),
        })
        return state, {**metrics, **episodes}

    def rollout(state: TrainState, key):
        """num_steps steps of every env with the current policy and fixed
        observation statistics."""
        hp, stats = state.hp, state.obs_stats

        def step(carry, key):
            env_state, return_stats, returns, new_stats = carry
            obs = obs_in(stats, env_state.obs)
            mean, log_std = actor.apply(state.actor_params, obs)
            action = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
            log_prob = gaussian_log_prob(action, mean, log_std)
            value = critic.apply(state.critic_params, obs)
            if groups > 1:  # $RL_ENV_GROUPS: the host calls staggered, the same states
                next_state, _ = env.step_while(env_state, to_env(action), state.pool,
                                               lambda x: x, None, groups=groups)
            else:
                next_state = jax.vmap(env.step, in_axes=(0, 0, None))(env_state, to_env(action),
                                                                       state.pool)
            next_value = critic.apply(state.critic_params,
                                      obs_in(stats, next_state.info["final_obs"]))
            done = next_state.terminated | next_state.truncated
            reward = next_state.reward
            if config.normalize_reward:
                returns = returns * hp.gamma + reward
                return_stats = normalize.update(return_stats, returns[:, None])
                reward = reward / jnp.sqrt(return_stats.var[0] + 1e-8)
                returns = jnp.where(done, 0.0, returns)
            if config.normalize_obs:
                new_stats = normalize.update(new_stats, env_state.obs)
            data = Rollout(obs, action, log_prob, value, next_value, reward * hp.reward_scaling,
                           next_state.terminated, done, ~next_state.info["invalid"])
            return ((next_state, return_stats, returns, new_stats),
                    (data, agent.episode_metrics(next_state)))

        carry = (state.env_state, state.return_stats, state.returns, stats)
        (env_state, return_stats, returns, new_stats), (data, episodes) = jax.lax.scan(
            step, carry, jax.random.split(key, T))
        state = state._replace(env_state=env_state, return_stats=return_stats, returns=returns)
        return state, data, new_stats, jax.tree.map(lambda x: x.sum(0), episodes)

    def learn(state: TrainState, batch: Batch, key, lr):
        hp = state.hp

        def minibatch(carry, mb):
            params, opt = carry
            grads, metrics = jax.grad(loss_fn, has_aux=True)(params, mb, hp)
            updates, opt = tx(hp).update(grads, opt, params)
            params = optax.apply_updates(params, jax.tree.map(lambda u: -lr * u, updates))
            return (params, opt), metrics

        def epoch(carry, key):
            perm = jax.random.permutation(key, N)
            mbs = jax.tree.map(lambda x: x[perm].reshape(M, N // M, *x.shape[1:]), batch)
            return jax.lax.scan(minibatch, carry, mbs)

        (params, opt), metrics = jax.lax.scan(
            epoch, ((state.actor_params, state.critic_params), state.opt),
            jax.random.split(key, config.update_epochs))
        state = state._replace(actor_params=params[0], critic_params=params[1], opt=opt)
        return state, jax.tree.map(jnp.mean, metrics)

    def loss_fn(params, mb: Batch, hp: HParams):
        actor_params, critic_params = params
        mean, log_std = actor.apply(actor_params, mb.obs)
        log_prob = gaussian_log_prob(mb.action, mean, log_std)
        adv = mb.advantage
        if config.norm_adv:  # statistics of the valid steps
            mean = masked_mean(adv, mb.weight)
            adv = (adv - mean) / (jnp.sqrt(masked_mean((adv - mean) ** 2, mb.weight)) + 1e-8)
        pg_loss, (approx_kl, clipfrac) = policy_loss(log_prob, mb.log_prob, adv, hp.clip_coef,
                                                     mb.weight)
        v_loss = value_loss(critic.apply(critic_params, mb.obs), mb.value, mb.ret, hp.clip_coef,
                            config.clip_vloss, mb.weight)
        entropy = gaussian_entropy(log_std).mean()
        loss = pg_loss - hp.ent_coef * entropy + hp.vf_coef * v_loss
        return loss, {"losses/policy_loss": pg_loss, "losses/value_loss": v_loss,
                      "losses/entropy": entropy, "losses/approx_kl": approx_kl,
                      "losses/clipfrac": clipfrac}

    act = make_act(config, env)

    def evaluate(state: TrainState, chunk):
        return agent.evaluate(env, act, state, lambda o: o,
                              jax.random.fold_in(state.eval_key, chunk), config.eval_episodes)

    return agent.Train(env, schedule, init, agent.make_runner(schedule, iteration, evaluate),
                       iteration=iteration)


def make_act(config: Config, env: envs.Env):
    """act(state, obs, key, deterministic) -> action in env units, from the
    train state's policy (observations normalised as in training): the mean,
    or a Gaussian sample, clipped to the action bounds."""
    actor = Actor(config.actor_hidden_sizes, env.action_size)
    box = agent.action_box(env)

    def act(state, obs, key, deterministic=True):
        if config.normalize_obs:
            obs = normalize.normalize(state.obs_stats, obs, config.obs_clip)
        mean, log_std = actor.apply(state.actor_params, obs)
        if not deterministic:
            mean = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
        return box.to_env(jnp.clip(mean, -1.0, 1.0))

    return act


# ----------------------------------------------------------------------------- Main

AGENT = agent.Agent(name="ppo", doc=__doc__, Config=Config, HParams=HParams, validate=validate,
                    make_train=make_train, make_act=make_act,
                    task_defaults=TASK_DEFAULTS, ranges=RANGES)


@exit_on_user_error
def main(argv=None):
    return cli.main(AGENT, argv)


if __name__ == "__main__":
    main()
