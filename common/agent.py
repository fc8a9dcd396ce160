"""The agent protocol, the run around an agent's loop, and the parts of
every algos/<name>.py that carry no algorithmic meaning.

Protocol: each script declares, once, at its end,
`AGENT = agent.Agent(name, __doc__, Config, HParams, validate, make_train,
make_act)`, and its `main()` is `cli.main(AGENT, argv)` (common/cli.py).
Tools reach an agent only through these names.

- `Train`: what `make_train(config)` returns; `train(key, hp=None)` is one
  seed's whole run, vmapped and jitted by the caller.
- `Schedule`: the run cut into chunks of iterations; logs, evaluations and
  checkpoints happen at chunk ends.
- `make_runner`: the whole run as one XLA program,
  `run(state, start_chunk=0, hooks=None, member=None)`, a scan over chunks.
  A chunk below `start_chunk` is skipped, so a resumed run executes the very
  same compiled program as an uninterrupted one.
- `evaluate`: deterministic-policy episodes with fixed keys.
- Divergence: `make_runner` marks a member diverged, at the end of the
  first chunk whose learned state (`learned`: everything but replay, env
  states and initial-state pool) holds a non-finite number or whose losses
  reached infinity; its evaluations from then on are NaN.
- Building blocks: `hparams`, `adam`, `ActionBox`, `update_period`,
  `skipped`, `orthogonal`, the config checks (`check_ranges` reads an
  agent's RANGES).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from common.errors import UserError
from common.logging import host_call

# --------------------------------------------------------------------------- protocol


@dataclasses.dataclass(frozen=True)
class Agent:
    """What an algos/<name>.py provides, declared in one place (its `AGENT`)."""
    name: str                                 # "td3": run directories, checkpoint headers
    doc: str                                  # the module docstring, heading --help
    Config: type                              # frozen dataclass for tyro, a help line per field
    HParams: type                             # NamedTuple of the traced float hyperparameters
    validate: Callable[[Any], None]           # validate(config): UserError before any work
    make_train: Callable[[Any], Train]        # make_train(config) -> Train
    make_act: Callable[[Any, Any], Callable]  # make_act(config, env) -> act(state, obs, key, det)
    # {domain: {field: value}}: the defaults of that domain's tasks (its TASK_DEFAULTS)
    task_defaults: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)
    # {field: rule}: the valid values of its float fields (its RANGES, see check_ranges)
    ranges: Dict[str, str] = dataclasses.field(default_factory=dict)
    # {domain: {field: value}}: on an accelerator, what replaces the task's defaults
    # (its ACCELERATOR_DEFAULTS: the update is cheap there and physics the budget)
    accelerator_defaults: Dict[str, Dict[str, Any]] = dataclasses.field(default_factory=dict)

    def hparams(self, config) -> Any:
        """This agent's HParams as `config` sets them."""
        return hparams(self.HParams, config)

    def defaults_for(self, env: str, platform: Optional[str] = None) -> Dict[str, Any]:
        """The Config values that replace the plain defaults on `env`: the
        agent's TASK_DEFAULTS entry for the task's domain ("humanoid" for
        humanoid_walk), then, where the run learns on an accelerator
        (`platform`, default: where JAX runs), its ACCELERATOR_DEFAULTS entry."""
        return {**_domain_entry(self.task_defaults, env),
                **self.accelerator_defaults_for(env, platform)}

    def accelerator_defaults_for(self, env: str, platform: Optional[str] = None) -> Dict[str, Any]:
        """The ACCELERATOR_DEFAULTS entry of `env`'s domain where `platform`
        (default: where JAX runs) is not a CPU, else none."""
        if not self.accelerator_defaults:
            return {}
        if platform is None:
            from common import envs
            platform = envs.current_platform()
        return _domain_entry(self.accelerator_defaults, env) if platform != "cpu" else {}

    def config_for(self, env: str, platform: Optional[str] = None, **overrides) -> Any:
        """The Config `python algos/<name>.py --env <env> --flag value ...`
        runs on `platform` (default: where JAX runs): the task's defaults, then
        `overrides` (field=value); a float outside its range (the agent's
        RANGES) is a UserError."""
        config = dataclasses.replace(self.Config(), env=env,
                                     **{**self.defaults_for(env, platform), **overrides})
        check_ranges(config, self.ranges)
        return config


def _domain_entry(table: Dict[str, Dict[str, Any]], env: str) -> Dict[str, Any]:
    for domain, values in table.items():
        if env.startswith(domain + "_"):
            return dict(values)
    return {}


class Hooks(NamedTuple):
    """Host functions called from inside the compiled run, at chunk ends:
    log(lead, step, metrics[, member]) and
    checkpoint(lead, chunk, state, diverged_at[, member]) (lead: the vmapped
    batch shape; diverged_at: the env step at which the member diverged, -1
    if it has not; member: given to `run`)."""
    log: Callable[..., None]
    checkpoint: Callable[..., None]


class Schedule(NamedTuple):
    num_envs: int
    chunk_iters: int       # iterations (one step of every env) per chunk
    num_chunks: int
    eval_every: int        # in chunks (0: only at the end)
    checkpoint_every: int  # in chunks (0: only at the end)

    @property
    def steps_per_chunk(self) -> int:
        return self.chunk_iters * self.num_envs

    @property
    def total_steps(self) -> int:
        return self.num_chunks * self.steps_per_chunk


@dataclasses.dataclass(frozen=True, eq=False)
class Train:
    """What `make_train(config)` returns: one seed's whole run, as a function.

    `train(key, hp=None) -> (state, history)` runs it all (acting, physics,
    replay, learning, evaluation) as one traced program; vmap and jit it:

        jax.jit(jax.vmap(make_train(config)))(keys)    # seeds
        jax.jit(jax.vmap(train))(keys, hps)            # seeds and hyperparameters

    Its parts serve the CLI and tools:
    - `env`: the task (sizes, action bounds, backend);
    - `schedule`: the chunks (logs, evaluations, checkpoints);
    - `init(key, hp=None) -> state`: one seed's train state; `hp` (the
      agent's HParams, default: its config's values) sets the traced floats;
    - `run(state, start_chunk=0, hooks=None, member=None, diverged_at=None)
      -> (state, history)`: the chunks from `start_chunk` on (a resumed run
      skips the earlier ones in the same program); `hooks` (Hooks of host
      functions: static, so close over them before jitting) receive logs and
      checkpoints; `member`, this member's global index, is passed on to them
      (parallel.Gather); `diverged_at`: the env step at which a resumed
      member had diverged (default -1: it had not). `history` holds one
      scalar per chunk and metric, `stats/diverged_at` among them.
    - `iteration(state, i) -> (state, metrics)`: the loop body `run` scans,
      one step of every env and the due updates (i: global iteration);
    - `update(state, u) -> (state, metrics)`: one gradient update from the
      replay (off-policy agents; u: global update index). scripts/benchmark.py
      `train` times these two alone against the whole loop."""
    env: Any
    schedule: Schedule
    init: Callable[..., Any]
    run: Callable[..., Tuple[Any, Dict[str, jnp.ndarray]]]
    iteration: Optional[Callable[..., Any]] = None
    update: Optional[Callable[..., Any]] = None

    def __call__(self, key: jax.Array, hp=None):
        return self.run(self.init(key, hp))


# --------------------------------------------------------------------------- the run


def make_schedule(config, log_every: int = 1000, iters_per_step_unit: int = 1) -> Schedule:
    """Chunks of about `log_every` env steps; eval/checkpoint intervals
    rounded to whole chunks. `iters_per_step_unit`: iterations must be a
    multiple of this (PPO's rollout length, a fractional update period)."""
    check_positive(config, "num_envs", "num_seeds", "total_timesteps", "eval_episodes")
    for name in ("eval_every", "checkpoint_every"):
        if getattr(config, name) < 0:
            raise UserError(f"--{name.replace('_', '-')} must be >= 0 (0: only at the end)")
    unit = config.num_envs * iters_per_step_unit
    log_every = min(log_every, config.total_timesteps)
    chunk_iters = max(1, round(log_every / unit)) * iters_per_step_unit
    steps_per_chunk = chunk_iters * config.num_envs
    if config.total_timesteps < steps_per_chunk:
        raise UserError(f"--total-timesteps {config.total_timesteps} is smaller than one chunk of "
                        f"{steps_per_chunk} env steps ({config.num_envs} envs)")
    num_chunks = config.total_timesteps // steps_per_chunk

    def every(n: int) -> int:
        return 0 if n == 0 else max(1, round(n / steps_per_chunk))

    return Schedule(config.num_envs, chunk_iters, num_chunks, every(config.eval_every),
                    every(config.checkpoint_every))


def _reduce(metrics: Dict[str, jnp.ndarray]) -> Dict[str, jnp.ndarray]:
    """Per-iteration metrics of a chunk -> one scalar each. `sum/return` and
    `sum/length` over `sum/episodes` give the mean finished-episode values."""
    out = {k: jnp.nanmean(v) for k, v in metrics.items() if not k.startswith("sum/")}
    if "sum/episodes" in metrics:
        n = metrics["sum/episodes"].sum()
        safe = jnp.maximum(n, 1)
        out["charts/episode_return"] = jnp.where(n > 0, metrics["sum/return"].sum() / safe, jnp.nan)
        out["charts/episode_length"] = jnp.where(n > 0, metrics["sum/length"].sum() / safe, jnp.nan)
    return out


def episode_metrics(env_state) -> Dict[str, jnp.ndarray]:
    """Sums over envs of finished episodes this iteration, for `_reduce`."""
    done = (env_state.terminated | env_state.truncated).astype(jnp.float32)
    return {"sum/episodes": done.sum(),
            "sum/return": (done * env_state.info["episode_return"]).sum(),
            "sum/length": (done * env_state.info["episode_length"]).sum()}


# Fields of a train state that hold data rather than what learning changes:
# the env keeps them finite, and the replay is too large to scan every chunk.
DATA_FIELDS = ("replay", "env_state", "pool")


def learned(state) -> Any:
    """The part of a train state that learning changes (networks, targets,
    optimiser and dual states, normaliser statistics, hyperparameters)."""
    if hasattr(state, "_asdict"):
        return {k: v for k, v in state._asdict().items() if k not in DATA_FIELDS}
    return state


def all_finite(tree) -> jnp.ndarray:
    """Whether every float in `tree` is finite (one reduction per leaf)."""
    flags = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
             if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
    return jnp.stack(flags).all() if flags else jnp.ones((), bool)


def make_runner(schedule: Schedule, iteration: Callable, evaluate: Callable) -> Callable:
    """run(state, start_chunk=0, hooks=None, member=None, diverged_at=None)
    -> (state, history): the scan over chunks. For each chunk c (skipped if
    c < start_chunk): `iteration` scanned over its iterations, their metrics
    reduced to one scalar each, the divergence check, `evaluate` at
    evaluation chunks and the last (NaN elsewhere), then, with hooks, log
    every chunk and checkpoint at checkpoint chunks and the last.

    iteration(state, i) -> (state, metrics) with i the global iteration index
    (unbatched under vmap, so conds on it stay real branches).
    evaluate(state, chunk) -> mean evaluation return (episodes drawn anew
    for each chunk, from held-out initial states).
    history holds one scalar per chunk and metric (bounded by the number of
    chunks, never per env step).
    Divergence: at the end of the first chunk in which a `losses/*` metric
    reached +-inf or after which the learned state (`learned`) holds a
    non-finite number, the member is diverged at that chunk's last env step:
    `stats/diverged_at` holds that step (NaN before), and every later
    evaluation is NaN. One reduction over the learned state per chunk; the
    iterations themselves are unchanged. `diverged_at` (-1: not diverged)
    carries a resumed member's step over.
    `member` (optional): this member's global index among all vmapped and
    sharded members; when given, the hooks are called as log(lead, step,
    metrics, member) and checkpoint(lead, chunk, state, diverged_at, member),
    so that the host can reassemble the shards of several devices
    (parallel.Gather)."""
    L = schedule.chunk_iters
    nan = jnp.full((), jnp.nan, jnp.float32)

    def metrics_of(state):
        s, m = jax.lax.scan(iteration, state, jnp.arange(1))
        m = _reduce(m)
        m["eval/episode_return"] = m["stats/diverged_at"] = nan
        return m

    def run(state, start_chunk=0, hooks: Optional[Hooks] = None, member=None, diverged_at=None):
        extra = () if member is None else (member,)
        nan_metrics = jax.tree.map(lambda _: nan, jax.eval_shape(metrics_of, state))
        diverged_at = jnp.asarray(-1 if diverged_at is None else diverged_at, jnp.int32)

        def do(carry, c):
            state, token, diverged_at = carry
            state, metrics = jax.lax.scan(iteration, state, c * L + jnp.arange(L))
            step = (c + 1) * schedule.steps_per_chunk
            blown = jnp.stack([jnp.isinf(v).any() for k, v in metrics.items()
                               if k.startswith("losses/")] + [~all_finite(learned(state))]).any()
            diverged_at = jnp.where((diverged_at < 0) & blown, step, diverged_at)
            diverged = diverged_at >= 0
            metrics = _reduce(metrics)
            last = c == schedule.num_chunks - 1
            is_eval = last | ((schedule.eval_every > 0)
                              & ((c + 1) % max(schedule.eval_every, 1) == 0))
            # the cond stays on the unbatched chunk index (a batched predicate would
            # evaluate every chunk); a diverged member's score is then dropped
            score = jax.lax.cond(is_eval, evaluate, lambda s, c: nan, state, c)
            metrics["eval/episode_return"] = jnp.where(diverged, nan, score)
            metrics["stats/diverged_at"] = jnp.where(diverged, diverged_at.astype(jnp.float32),
                                                     nan)
            if hooks is not None:
                token = token + host_call(hooks.log, step, metrics, *extra, pack=None)
                is_ckpt = last | ((schedule.checkpoint_every > 0)
                                  & ((c + 1) % max(schedule.checkpoint_every, 1) == 0))
                token = token + jax.lax.cond(
                    is_ckpt, lambda s, d: host_call(hooks.checkpoint, c, s, d, *extra),
                    lambda s, d: jnp.zeros((), jnp.int32), state, diverged_at)
            return (state, token, diverged_at), metrics

        def chunk(carry, c):
            return jax.lax.cond(c >= start_chunk, do, lambda carry, c: (carry, nan_metrics),
                                carry, c)

        (state, token, _), history = jax.lax.scan(
            chunk, (state, jnp.zeros((), jnp.int32), diverged_at), jnp.arange(schedule.num_chunks))
        # returned so that XLA keeps the host calls (it drops unused pure callbacks)
        history["host_calls"] = token
        return state, history

    return run


def evaluate(env, act: Callable, params, obs_transform: Callable, key: jax.Array,
             episodes: int, pool=None) -> jnp.ndarray:
    """Mean return of `episodes` full episodes of the deterministic policy,
    run in parallel, from initial states that `key` draws from `pool`
    (default: the env's held-out `eval_pool`, which no training run uses)."""
    pool = env.eval_pool if pool is None else pool
    keys = jax.random.split(key, episodes)
    state = jax.vmap(env.reset, in_axes=(0, None))(keys, pool)

    def step(carry, _):
        state, total = carry
        action = jax.vmap(lambda o: act(params, obs_transform(o), None, True))(state.obs)
        state = jax.vmap(env.step, in_axes=(0, 0, None))(state, action, pool)
        return (state, total + state.reward), None

    (_, total), _ = jax.lax.scan(step, (state, jnp.zeros(episodes)), None,
                                 length=env.episode_length)
    return total.mean()


# --------------------------------------------------------------------------- building blocks


def hparams(hparams_cls, config):
    """An agent's HParams from its config: each field the config's value of
    that name as a float32 array (traced in the program, so vmappable)."""
    return hparams_cls(*(jnp.asarray(getattr(config, f), jnp.float32)
                         for f in hparams_cls._fields))


def adam(learning_rate, max_grad_norm=None) -> optax.GradientTransformation:
    """optax.adam with its learning rate kept in the optimiser state
    (inject_hyperparams), so that it can be a traced, swept value. With
    `max_grad_norm` (traced too; <= 0: off), the gradient's global norm is
    clipped to it first."""
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)
    if max_grad_norm is None:
        return tx
    return optax.chain(clip_by_global_norm(max_grad_norm), tx)


def clip_by_global_norm(max_norm) -> optax.GradientTransformation:
    """optax.clip_by_global_norm with a traced bound where <= 0 means no
    clipping: the gradient passes through bit for bit."""
    def update(updates, state, params=None):
        del params
        norm = optax.global_norm(updates)
        clip = (max_norm > 0) & ~(norm < max_norm)  # as optax.clip_by_global_norm, bitwise
        return jax.tree.map(lambda g: jnp.where(clip, g / norm * max_norm, g), updates), state
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def noise_schedule(hp, decay_steps: int, env_steps, begin: int = 0) -> jnp.ndarray:
    """Exploration std after `env_steps` env steps of one seed: hp.exploration_noise
    until env step `begin`, then linear to hp.exploration_noise_final over
    `decay_steps`, then constant (decay_steps 0: hp.exploration_noise throughout)."""
    if decay_steps <= 0:
        return hp.exploration_noise
    return linear_schedule(hp.exploration_noise, hp.exploration_noise_final, decay_steps,
                           env_steps, begin)


def linear_schedule(start, end, decay_steps: int, env_steps, begin: int = 0) -> jnp.ndarray:
    """`start` until env step `begin`, then moving linearly to `end` over
    `decay_steps` env steps, then `end`. Before `begin` the value is `start`
    bit for bit, so a run is its unscheduled twin up to there."""
    frac = jnp.clip((jnp.asarray(env_steps, jnp.float32) - begin) / decay_steps, 0.0, 1.0)
    return start + (end - start) * frac


def set_learning_rate(opt_state, learning_rate):
    """`opt_state` of `adam(...)` with its learning rate replaced: a schedule
    applied from outside, without changing the state's structure."""
    if hasattr(opt_state, "hyperparams"):  # optax's inject_hyperparams state (either form)
        old = opt_state.hyperparams["learning_rate"]
        return opt_state._replace(hyperparams={
            **opt_state.hyperparams, "learning_rate": jnp.asarray(learning_rate, old.dtype)})
    if not isinstance(opt_state, tuple):
        return opt_state
    parts = [set_learning_rate(s, learning_rate) for s in opt_state]
    return type(opt_state)(*parts) if hasattr(opt_state, "_fields") else tuple(parts)


class ActionBox(NamedTuple):
    """An env's action bounds [low, high] and the affine map to them from
    policy units [-1, 1]. Noise scales are given in units of `scale`, half
    the action range."""
    low: jnp.ndarray
    high: jnp.ndarray
    scale: jnp.ndarray
    center: jnp.ndarray

    def to_env(self, a):
        """[-1, 1] -> [low, high] (affine; no clipping)."""
        return self.center + self.scale * a

    def clip(self, action):
        return jnp.clip(action, self.low, self.high)

    def uniform(self, key: jax.Array, shape) -> jnp.ndarray:
        """Uniform random actions in env units (the warm-up policy)."""
        return jax.random.uniform(key, shape, minval=self.low, maxval=self.high)


def action_box(env) -> ActionBox:
    low, high = jnp.asarray(env.action_low), jnp.asarray(env.action_high)
    return ActionBox(low, high, (high - low) / 2, (high + low) / 2)


def update_period(config) -> Tuple[int, int]:
    """(updates per iteration, iterations per update) of `updates_per_step`
    gradient updates per env step over `num_envs` envs; one of them is 1."""
    per_iter = config.updates_per_step * config.num_envs
    if per_iter >= 1:
        if abs(per_iter - round(per_iter)) > 1e-6:
            raise UserError(f"--updates-per-step x --num-envs must be a whole number, "
                            f"got {per_iter}")
        return int(round(per_iter)), 1
    period = 1 / per_iter
    if abs(period - round(period)) > 1e-6:
        raise UserError(f"1 / (--updates-per-step x --num-envs) must be a whole number, "
                        f"got {period}")
    return 1, int(round(period))


def skipped(step: Callable) -> Callable:
    """The branch of `lax.cond(due, step, skipped(step), x)` that does not
    run step(x) -> (x, metrics): x unchanged, every metric NaN (so a chunk's
    nanmean leaves it out)."""
    def skip(x):
        metrics = jax.eval_shape(step, x)[1]
        return x, jax.tree.map(lambda m: jnp.full(m.shape, jnp.nan, m.dtype), metrics)
    return skip


GROUPS_VAR = "RL_ENV_GROUPS"


def env_groups(num_envs: int) -> int:
    """$RL_ENV_GROUPS (default 1): the overlapped step hands the envs to the
    host in that many staggered groups (Env.step_while's groups: the same
    states bit for bit, so a knob of speed only, to be timed on an
    accelerator before it becomes a default)."""
    setting = os.environ.get(GROUPS_VAR, "1")
    if not setting.isdigit() or int(setting) < 1 or num_envs % int(setting):
        raise UserError(f"${GROUPS_VAR} must be a positive whole number that divides "
                        f"--num-envs ({num_envs}), got {setting!r}")
    return int(setting)


def step_and_learn(env, state, action, learn: Callable, due, overlap: bool):
    """Every env steps once with `action`, replay takes the transitions and
    the due updates run (`lax.cond(due, learn, ...)` on the train state);
    returns (state, update metrics, the envs' new states), the state holding
    them. `state` has env_state, pool, replay and pending fields. `due`
    None: learn at every iteration, without the `cond` (benchmark.py
    profile's variant).

    overlap False: the step, replay takes it, then the updates. overlap True:
    replay takes the previous step's transitions (`state.pending`), then the
    updates run on the device while the host steps the envs (env.step_while,
    in env_groups() groups) and this step's transitions wait in `pending`: the
    updates see replay one env step behind, and an accelerator need not wait
    for the host's physics."""
    from common import replay
    env_state = state.env_state
    updates = learn if due is None else (
        lambda state: jax.lax.cond(due, learn, skipped(learn), state))
    if not overlap:
        next_state = jax.vmap(env.step, in_axes=(0, 0, None))(env_state, action, state.pool)
        buf = replay.add(state.replay, *replay.transition(env_state.obs, action, next_state))
        state, metrics = updates(state._replace(env_state=next_state, replay=buf))
        return state, metrics, next_state
    state = state._replace(replay=replay.add(state.replay, *state.pending))
    next_state, (state, metrics) = env.step_while(env_state, action, state.pool, updates, state,
                                                  groups=env_groups(action.shape[0]))
    pending = replay.transition(env_state.obs, action, next_state)
    return state._replace(env_state=next_state, pending=pending), metrics, next_state


def orthogonal(scale: float) -> Callable:
    """Orthogonal initialisation (Saxe et al. 2014), the same distribution as
    nn.initializers.orthogonal, by Gram-Schmidt in plain jax.numpy: LAPACK's
    QR batched by vmap over seeds can deadlock XLA's CPU thread pool."""
    def init(key, shape, dtype=jnp.float32):
        rows, cols = shape
        n, m = max(rows, cols), min(rows, cols)
        a = jax.random.normal(key, (n, m), jnp.float32)

        def column(j, q):
            v, earlier = a[:, j], (jnp.arange(m) < j).astype(jnp.float32)
            for _ in range(2):  # twice is enough for float32 orthogonality
                v = v - q @ ((q.T @ v) * earlier)
            return q.at[:, j].set(v / jnp.linalg.norm(v))

        q = jax.lax.fori_loop(0, m, column, jnp.zeros((n, m), jnp.float32))
        return (scale * (q if rows >= cols else q.T)).astype(dtype)
    return init


# --------------------------------------------------------------------------- config checks

_INTERVAL = re.compile(r"([(\[])\s*([-+\w.]+)\s*,\s*([-+\w.]+)\s*([)\]])\s*(.*)")
_RELATION = re.compile(r"(<=?)\s*(\w+)")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_ranges(config, ranges: Dict[str, str]) -> None:
    """Refuse (UserError, one line naming the flag) a float field of `config`
    that is not finite, or that breaks its rule in `ranges` (an agent's
    RANGES, {field: rule}). A rule is an interval, "(0, 1]", "[0, inf)",
    ..., optionally followed by a note ("[0, inf) 0: off"), or a bound by
    another field: "< v_max", "<= exploration_noise"."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{flag(f.name)} must be a finite number, got {value}")
    for name, rule in ranges.items():
        value = getattr(config, name)
        relation = _RELATION.fullmatch(rule)
        if relation:
            op, other = relation.groups()
            bound = getattr(config, other)
            if not (value < bound if op == "<" else value <= bound):
                word = "below" if op == "<" else "at most"
                raise UserError(f"{flag(name)} {value} must be {word} {flag(other)} {bound}")
            continue
        left, lo, hi, right, note = _INTERVAL.fullmatch(rule).groups()
        lo, hi = float(lo), float(hi)
        if (lo < value if left == "(" else lo <= value) and \
                (value < hi if right == ")" else value <= hi):
            continue
        interval = rule[:len(rule) - len(note)].strip()
        what = {"(0, inf)": "positive", "[0, inf)": ">= 0"}.get(interval, f"in {interval}")
        note = f" ({note})" if note else ""
        raise UserError(f"{flag(name)} must be {what}{note}, got {value}")


def check_positive(config, *names: str) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, "
                            f"got {getattr(config, name)}")


def check_choice(config, name: str, choices) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise UserError(f"unknown --{name.replace('_', '-')} {value!r}; "
                        f"choose one of {', '.join(choices)}")


def check_off_policy(config) -> None:
    """What every replay-based agent's config needs besides positive sizes
    and its RANGES: positive hidden widths, a batch no larger than the
    buffer, an update within the budget after `learning_starts`, and an
    exploration std that decays (final <= first) when it is scheduled."""
    if min(config.hidden_sizes, default=0) <= 0:
        raise UserError(f"--hidden-sizes must be positive widths, got {config.hidden_sizes}")
    if config.batch_size > config.buffer_size:
        raise UserError(f"--batch-size {config.batch_size} is larger than "
                        f"--buffer-size {config.buffer_size}")
    if config.learning_starts < 0 or config.learning_starts >= config.total_timesteps:
        raise UserError(f"--learning-starts {config.learning_starts} leaves no env step for an "
                        f"update within --total-timesteps {config.total_timesteps}")
    from common.networks import TORSOS
    check_choice(config, "critic_torso", TORSOS)
    check_positive(config, "simba_width", "simba_blocks")
    for name in ("exploration_decay_steps", "lr_decay_steps", "decay_start_steps"):
        if getattr(config, name, 0) < 0:
            raise UserError(f"--{name.replace('_', '-')} must be >= 0 (0: off), "
                            f"got {getattr(config, name)}")
    decay = getattr(config, "exploration_decay_steps", 0)
    # the exploration std decays: a final value above the first would be a rise
    if decay > 0 and config.exploration_noise_final > config.exploration_noise:
        raise UserError(f"--exploration-noise-final {config.exploration_noise_final} must be at "
                        f"most --exploration-noise {config.exploration_noise} (the std decays "
                        f"over --exploration-decay-steps)")


def check_memory(nbytes: int, what: str) -> None:
    """Early refusal inside make_train of a part (replay, rollout batch) that
    cannot fit on one device (host memory on CPU). The whole run (every
    member's state) is checked by `parallel.check_fits` before compiling."""
    from common import parallel
    limit, where = parallel.device_limit()
    if nbytes > 0.9 * limit:
        raise UserError(f"{what} needs about {nbytes / 2**30:.1f} GiB but only "
                        f"{limit / 2**30:.1f} GiB is available on {where}; lower --buffer-size, "
                        f"--num-envs or --num-seeds")

