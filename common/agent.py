"""The agent protocol: what every algos/<name>.py shares.

Each script provides `Config` (frozen dataclass, tyro), `make_train(config)`
returning `train(key)`, `make_act(config, env)` and `main()`. This module
holds the parts that are the same for all of them:

- `Schedule`: the run cut into chunks of iterations; logs, evaluations and
  checkpoints happen at chunk ends.
- `make_runner`: the whole run as one XLA program, `run(state, start_chunk)`,
  a scan over chunks. A chunk below `start_chunk` is skipped, so a resumed
  run executes the very same compiled program as an uninterrupted one.
- `evaluate`: deterministic-policy episodes with fixed keys.
- `cli_main`: parse, validate, train, log, checkpoint, resume; user
  mistakes end with one line and exit status 2. It trains every member
  (seeds x sweep combinations, scripts/sweep.py) in one program, sharded
  over the devices when JAX sees several (common/parallel.py), after
  checking that the members' states fit in memory.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import threading
import time
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from common import checkpoint as ckpt
from common.errors import UserError
from common.logging import RunLogger, host_call, run_name

SHARED_FIELDS = ("env", "backend", "num_envs", "num_seeds", "total_timesteps", "seed", "eval_every",
                 "eval_episodes", "log_dir", "checkpoint_every", "resume")


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
    every = lambda n: 0 if n == 0 else max(1, round(n / steps_per_chunk))
    return Schedule(config.num_envs, chunk_iters, num_chunks, every(config.eval_every),
                    every(config.checkpoint_every))


def check_positive(config, *names: str) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(config, name)}")


class Hooks(NamedTuple):
    """Host functions called from inside the compiled run."""
    log: Callable[[tuple, Any, Dict[str, np.ndarray]], None]
    checkpoint: Callable[[tuple, Any, Any], None]


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


def make_runner(schedule: Schedule, iteration: Callable, evaluate: Callable,
                hooks: Optional[Hooks]) -> Callable:
    """run(state, start_chunk) -> (state, history): the scan over chunks.

    iteration(state, i) -> (state, metrics) with i the global iteration index
    (unbatched under vmap, so conds on it stay real branches).
    evaluate(state, chunk) -> mean evaluation return (episodes drawn anew
    for each chunk, from held-out initial states).
    history holds one scalar per chunk and metric (bounded by the number of
    chunks, never per env step).
    `member` (optional): this member's global index among all vmapped and
    sharded members; when given, the hooks are called as log(lead, step,
    metrics, member) and checkpoint(lead, chunk, state, member), so that the
    host can reassemble the shards of several devices (parallel.Gather)."""
    L = schedule.chunk_iters

    def metrics_of(state):
        s, m = jax.lax.scan(iteration, state, jnp.arange(1))
        m = _reduce(m)
        m["eval/episode_return"] = jnp.zeros((), jnp.float32)
        return m

    def run(state, start_chunk, member=None):
        extra = () if member is None else (member,)
        nan_metrics = jax.tree.map(lambda _: jnp.full((), jnp.nan, jnp.float32),
                                   jax.eval_shape(metrics_of, state))

        def do(carry, c):
            state, token = carry
            state, metrics = jax.lax.scan(iteration, state, c * L + jnp.arange(L))
            metrics = _reduce(metrics)
            last = c == schedule.num_chunks - 1
            is_eval = last | ((schedule.eval_every > 0) & ((c + 1) % max(schedule.eval_every, 1) == 0))
            metrics["eval/episode_return"] = jax.lax.cond(
                is_eval, evaluate, lambda s, c: jnp.full((), jnp.nan, jnp.float32), state, c)
            if hooks is not None:
                step = (c + 1) * schedule.steps_per_chunk
                token = token + host_call(hooks.log, step, metrics, *extra)
                is_ckpt = last | ((schedule.checkpoint_every > 0)
                                  & ((c + 1) % max(schedule.checkpoint_every, 1) == 0))
                token = token + jax.lax.cond(
                    is_ckpt, lambda s: host_call(hooks.checkpoint, c, s, *extra),
                    lambda s: jnp.zeros((), jnp.int32), state)
            return (state, token), metrics

        def chunk(carry, c):
            return jax.lax.cond(c >= start_chunk, do, lambda carry, c: (carry, nan_metrics), carry, c)

        (state, token), history = jax.lax.scan(chunk, (state, jnp.zeros((), jnp.int32)),
                                               jnp.arange(schedule.num_chunks))
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

    (_, total), _ = jax.lax.scan(step, (state, jnp.zeros(episodes)), None, length=env.episode_length)
    return total.mean()


# --------------------------------------------------------------------------- CLI

def check_memory(nbytes: int, what: str) -> None:
    """Early refusal inside make_train of a part (replay, rollout batch) that
    cannot fit on one device (host memory on CPU). The whole run (every
    member's state) is checked by `parallel.check_fits` before compiling."""
    from common import parallel
    limit, where = parallel.device_limit()
    if nbytes > 0.9 * limit:
        raise UserError(f"{what} needs about {nbytes / 2**30:.1f} GiB but only {limit / 2**30:.1f} GiB "
                        f"is available on {where}; lower --buffer-size, --num-envs or --num-seeds")


def seed_keys(seed: int, num_seeds: int) -> np.ndarray:
    """Member m of `--seed s --num-seeds N` runs with PRNGKey(s + m), so it is
    the very run `--seed s+m` would be alone (a 4-seed run is 4 single runs)."""
    return np.stack([np.asarray(jax.random.PRNGKey(seed + m)) for m in range(num_seeds)])


STALL_VAR = "RL_STALL_TIMEOUT"


def stall_timeout() -> float:
    """Seconds without any host call (physics step, log, checkpoint) after
    which a started run counts as stuck ($RL_STALL_TIMEOUT, default 1200)."""
    try:
        return float(os.environ.get(STALL_VAR, "1200"))
    except ValueError:
        raise UserError(f"${STALL_VAR} must be a number of seconds, got {os.environ[STALL_VAR]!r}")


class Watchdog:
    """While the compiled run executes, checks that it keeps calling the host
    (common/hostcall heartbeats: every native physics step, every chunk's log)
    and calls on_stall(idle_seconds) once when it has not for `timeout`
    seconds. It arms at the first host call, so compilation never counts."""

    def __init__(self, timeout: float, on_stall: Callable[[float], None], poll: float = 5.0):
        from common import hostcall
        self.timeout, self.on_stall, self.poll, self.hostcall = timeout, on_stall, poll, hostcall
        self.stop = threading.Event()

    def _watch(self) -> None:
        start = time.monotonic()
        while not self.stop.wait(min(self.poll, self.timeout)):
            last = self.hostcall.last_call()
            if last > start and time.monotonic() - last > self.timeout:
                self.on_stall(time.monotonic() - last)
                return

    def __enter__(self):
        if self.timeout > 0:
            threading.Thread(target=self._watch, daemon=True, name="watchdog").start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()


def _stalled(idle: float, ckpt_path: str) -> None:
    saved = f"its last checkpoint is {ckpt_path}" if os.path.exists(ckpt_path) else \
        "no checkpoint was written"
    print(f"\nerror: the run made no progress for {idle:.0f} s (no physics step, log or checkpoint) "
          f"and is stopped instead of hanging; {saved} (${STALL_VAR} sets the limit)",
          file=sys.stderr, flush=True)
    os._exit(3)


def cli_main(algo: str, config_cls, make_train: Callable, argv=None,
             sweep_specs: Optional[Sequence[str]] = None) -> Any:
    """Parse, check, train, log, checkpoint, resume. `sweep_specs`
    (`name=v1,v2` strings, scripts/sweep.py): train every combination x seed
    in the same program. Members (seeds x combinations) are sharded over the
    devices when JAX sees several."""
    import tyro
    from common import envs, parallel, sweep
    module = sys.modules[make_train.__module__]
    config = tyro.cli(config_cls, args=argv, description=module.__doc__)
    getattr(module, "validate", lambda c: None)(config)  # sizes first: one line, before any work
    parallel.initialize_distributed()
    envs.resolve_backend(config.backend)
    if config.env not in envs.names():
        raise UserError(f"unknown task {config.env!r}; valid tasks: {', '.join(envs.names())}")
    axes = sweep.parse_axes(sweep_specs or (), config_cls, module.HParams, algo)
    for combo in sweep.combinations(axes) if axes else ():
        getattr(module, "validate", lambda c: None)(sweep.combination_config(config, axes, combo))
    hps, member_combos = sweep.member_hparams(config, axes, module.hparams, config.num_seeds)
    num_members = len(member_combos)
    mesh = parallel.make_mesh(num_members,
                              "--num-seeds x the sweep combinations" if axes else "--num-seeds")
    sweep_meta = [[a.name, list(a.values)] for a in axes] or None

    header = None
    if config.resume:
        header = ckpt.read_header(config.resume)
        for key, want in (("algo", algo), ("env", config.env), ("sweep", sweep_meta)):
            if header.get(key) != want:
                raise UserError(f"checkpoint {config.resume!r} is for {key}={header.get(key)!r}, "
                                f"not {want!r}")
        if jax.process_count() > 1:
            raise UserError("--resume runs in a single process (each process of a multi-host run "
                            "checkpoints only its own members)")
    trainer = make_train(config, hooks=_PendingHooks())  # validates sizes and memory
    estimate = parallel.check_fits(trainer, num_members, mesh)
    env = trainer.env
    devices = 1 if mesh is None else mesh.devices.size
    print(f"{algo} on {config.env}: backend {env.backend}, {config.num_seeds} seed(s) x "
          f"{len(member_combos) // config.num_seeds} combination(s) x {config.num_envs} env(s), "
          f"{trainer.schedule.total_steps} env steps each; {num_members} member(s) on {devices} "
          f"device(s), about {estimate['total'] / 2**20:.1f} MiB of state")

    keys = np.tile(seed_keys(config.seed, config.num_seeds), (num_members // config.num_seeds, 1))
    init, run = parallel.compile_members(trainer, mesh)
    start_chunk = 0
    if header is not None:
        template = jax.eval_shape(jax.vmap(trainer.init), keys, hps)
        states, header = ckpt.load(config.resume, template, {
            "algo": algo, "env": config.env, "num_seeds": config.num_seeds})
        start_chunk = int(header["chunk"]) + 1
        run_dir = header["run_dir"]
        print(f"resuming {run_dir} after chunk {start_chunk} of {trainer.schedule.num_chunks}")
    else:
        run_dir = os.path.join(config.log_dir, run_name(config.env, algo + ("_sweep" if axes else ""),
                                                        config.seed))
        if jax.process_count() > 1:
            run_dir += f"__process{jax.process_index()}"
    created = not os.path.exists(run_dir)
    local = parallel.local_members(mesh, num_members)
    seeds = [int(config.seed + m % config.num_seeds) for m in local]
    if axes:
        streams = [f"{sweep.label(member_combos[m])}/seed_{s}" for m, s in zip(local, seeds)]
        tags = [dict(member_combos[m], seed=s, member=int(m)) for m, s in zip(local, seeds)]
    else:
        streams, tags = seeds, None
    logger = RunLogger(run_dir, config, trainer.schedule.total_steps, streams, tags=tags)
    ckpt_path = os.path.join(run_dir, ckpt.CHECKPOINT_FILE)

    def log(step, members, metrics):
        logger.write(step, metrics)

    def save(chunk, members, state):
        ckpt.save(ckpt_path, state, {"algo": algo, "env": config.env, "num_seeds": config.num_seeds,
                                     "chunk": chunk, "run_dir": run_dir, "sweep": sweep_meta,
                                     "members": members.tolist(),
                                     "config": dataclasses.asdict(config)})

    gather_log, gather_save = parallel.Gather(log, local), parallel.Gather(save, local)
    trainer.hooks.bind(Hooks(lambda lead, step, metrics, member: gather_log(step, member, metrics),
                             lambda lead, chunk, state, member: gather_save(chunk, member, state)))
    try:
        if header is None:
            states = init(parallel.put(keys, mesh), parallel.put(hps, mesh))
        else:
            states = parallel.put(states, mesh)
        t0 = time.time()
        members = parallel.put(np.arange(num_members, dtype=np.int32), mesh)
        with Watchdog(stall_timeout(), lambda idle: _stalled(idle, ckpt_path)):
            states, history = run(states, start_chunk, members)
            jax.block_until_ready(states)
    except BaseException:
        logger.close()
        if created and header is None and not os.path.exists(ckpt_path):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    logger.close()
    history = parallel.fetch(history)
    final = np.asarray(history["eval/episode_return"])[:, -1]
    print(f"done in {time.time() - t0:.0f}s: final eval return {np.mean(final):.1f} "
          f"(per {'member' if axes else 'seed'} {[round(float(x), 1) for x in final]}); "
          f"logs and checkpoint in {run_dir}")
    if axes:
        results_path = os.path.join(run_dir, "results.json")
        if start_chunk >= trainer.schedule.num_chunks and os.path.exists(results_path):
            with open(results_path) as f:  # resumed a finished sweep: its table as it was
                rows = json.load(f)
        else:
            rows = sweep.results(axes, final, config.num_seeds)
            if jax.process_index() == 0:
                with open(results_path, "w") as f:
                    json.dump(rows, f, indent=2)
        print(sweep.table(axes, rows, config.num_seeds))
    return states, history


class _PendingHooks:
    """Hooks whose host functions are bound after the run directory exists."""

    def __init__(self):
        self.target: Optional[Hooks] = None

    def bind(self, hooks: Hooks) -> None:
        self.target = hooks

    @property
    def log(self):
        return lambda *a: self.target.log(*a)

    @property
    def checkpoint(self):
        return lambda *a: self.target.checkpoint(*a)


class Train:
    """What make_train returns: `train(key)` runs a whole run for one seed
    (vmap it over seeds). Its parts are exposed for the CLI and tools:
    `init(key) -> state`, `run(state, start_chunk) -> (state, history)`,
    the env, the schedule and the hooks."""

    def __init__(self, env, schedule: Schedule, init: Callable, run: Callable, hooks=None):
        # init(key, hp=None): hp (the agent's HParams) overrides the config's
        # float hyperparameters, for sweeps; run(state, start_chunk, member=None)
        self.env, self.schedule, self.init, self.run, self.hooks = env, schedule, init, run, hooks

    def __call__(self, key: jax.Array):
        return self.run(self.init(key), 0)
