"""The dm_control suite on two physics backends, behind one functional API.

    from common import envs
    env = envs.make("humanoid_walk", backend="native")   # or "mjx", "auto"
    state = env.reset(key)                  # one env; vmap for many
    state = env.step(state, action)         # action in [-1, 1]^action_size

Each task keeps dm_control's meaning: its XML, control timestep and substeps,
flattened observation (same order), reward, 1000-step limit, and initial-state
distribution (a pool of states made by dm_control's own `initialize_episode`,
gathered inside the compiled program at reset).

`terminated` means the task ended (bootstrap value 0); reaching the step limit
is `truncated` (bootstrap from `info["final_obs"]`). Finished episodes reset
automatically inside `step`: `obs` is then the first observation of the next
episode and `info["final_obs"]` the true last one of the finished episode.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from common import hostcall
from common.errors import UserError
from common.envs.base import Fields, Task, flatten, tolerance  # noqa: F401

BACKENDS = ("auto", "native", "mjx")
_REGISTRY: Dict[str, Tuple[str, str, type]] = {}


def register(domain: str, task: str, cls: type) -> None:
    _REGISTRY[f"{domain}_{task}"] = (domain, task, cls)


def names() -> Tuple[str, ...]:
    """Every registered task, `<domain>_<task>`."""
    _load_suite()
    return tuple(sorted(_REGISTRY))


def _load_suite() -> None:
    from common.envs import suite  # noqa: F401  (registers the tasks)


class EnvState(NamedTuple):
    physics: Any          # native: float64 state row as uint32 pairs; mjx: mjx.Data
    task: jnp.ndarray     # per-episode task parameters (targets), float32
    obs: jnp.ndarray
    reward: jnp.ndarray
    terminated: jnp.ndarray
    truncated: jnp.ndarray
    info: Dict[str, jnp.ndarray]


GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def current_platform() -> str:
    """Where JAX runs the program, so where learning runs: "cpu", "tpu", "gpu", ...
    (tests replace this function to stand for a machine they do not have)."""
    return jax.default_backend()


def resolve_backend(backend: str, platform: Optional[str] = None) -> str:
    """The backend `backend` means on `platform` (default: `current_platform()`).

    `auto` is what is fastest where the run is:
    - a CPU: native (MJX on a CPU steps several times slower than MuJoCo C);
    - a TPU: native, physics on the host's cores, learning on the chip. On a
      TPU v5e machine (13 host cores, 2026-12-05) MJX compiled a humanoid_walk
      step for 211 s and then ran 12.6k control steps/s at 1024 envs, while raw
      mujoco.rollout ran 65.4k and the native backend inside jit 59.5k;
    - a GPU: mjx. Not measured here: MJX was built for GPUs (many envs in one
      traced program, no host round-trip), and a GPU machine often has few
      host cores per GPU to step MuJoCo C on. `--backend native` is there to
      check that on a given machine.
    Any other platform: native."""
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    where = current_platform() if platform is None else platform
    return "mjx" if where in GPU_PLATFORMS else "native"


def backend_warning(backend: str, platform: Optional[str] = None) -> Optional[str]:
    """The one warning line an explicit `backend` deserves on `platform`, or None."""
    where = current_platform() if platform is None else platform
    if backend == "mjx" and where == "tpu":
        return ("warning: --backend mjx on a TPU compiles the physics for minutes (a humanoid "
                "step: 3.5 minutes on a TPU v5e) and then steps about 4x slower than the native "
                "backend on the host's cores; --backend auto picks native there")
    return None


def describe_physics(env: "Env", batch: int) -> str:
    """Where `env`'s physics runs when one step call carries `batch` envs:
    native MuJoCo on the threads its pool uses for that batch, or MJX on the
    device the program runs on."""
    if env.backend == "native":
        threads = env.native.threads(batch)
        return f"native MuJoCo on {threads} host thread{'s' if threads != 1 else ''}"
    return f"MJX on {describe_device()}"


def describe_device(device=None) -> str:
    """A JAX device as its kind and platform, e.g. "TPU v5 lite (tpu)", "cpu (cpu)"."""
    device = device or jax.devices()[0]
    return f"{device.device_kind} ({device.platform})"


# dm_control seed of the held-out evaluation pool; training pools draw their
# seeds below it (Env.make_pool), so no training pool is ever this one.
EVAL_POOL_SEED = 2 ** 31 - 1
DEFAULT_POOL_SIZE = 1024


class Pool(NamedTuple):
    """Initial states made by dm_control's own resets, gathered at reset
    inside the compiled program."""
    physics: Any          # native: [P, 2 nstate] uint32; mjx: float32 state components
    task: jnp.ndarray     # [P, num_task_params]
    obs: jnp.ndarray      # [P, observation_size]


def make(name: str, backend: str = "auto", pool_size: int = DEFAULT_POOL_SIZE, pool_seed: int = 0,
         nthread: Optional[int] = None) -> "Env":
    """Build task `name` on `backend` ("auto", "native" or "mjx"). `pool_size`
    and `pool_seed` size and seed its pools: `env.pool` (what `reset(key)`
    draws from without a pool), `env.eval_pool` (held-out states, seed
    EVAL_POOL_SEED) and the per-run pools of `env.make_pool`."""
    _load_suite()
    if name not in _REGISTRY:
        raise UserError(f"unknown task {name!r}; valid tasks: {', '.join(names())}")
    backend = resolve_backend(backend)
    if pool_size < 1:
        raise UserError(f"pool_size must be positive, got {pool_size}")
    return Env(name, backend, pool_size, pool_seed, nthread)


@functools.lru_cache(maxsize=None)
def _dm_env(domain: str, task: str, seed: int):
    from dm_control import suite
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return suite.load(domain, task, task_kwargs={"random": seed})


@functools.lru_cache(maxsize=64)
def _initial_pool(name: str, pool_size: int, pool_seed: int):
    """float64 carried state rows and task parameters of `pool_size` dm_control resets."""
    from common.envs.native import NativePhysics
    domain, task, cls = _REGISTRY[name]
    # a fresh env, not the cached one: its first `pool_size` resets, whatever
    # pools were built before in this process
    dm_env = _dm_env.__wrapped__(domain, task, pool_seed)
    t = cls(dm_env.physics.model.ptr, dm_env.task)
    native = NativePhysics(dm_env.physics.model.ptr, 1, ())
    rows, params = [], []
    for _ in range(pool_size):
        dm_env.reset()
        rows.append(native.state_row(dm_env.physics.data.ptr))
        params.append(np.asarray(t.episode_params(dm_env.physics), np.float64).reshape(-1))
    return np.stack(rows), np.stack(params).astype(np.float32)


class Env:
    """One dm_control task on one backend. Methods are pure and vmappable."""

    def __init__(self, name: str, backend: str, pool_size: int, pool_seed: int,
                 nthread: Optional[int]):
        from common.envs.native import NativePhysics
        domain, task_name, cls = _REGISTRY[name]
        dm_env = _dm_env(domain, task_name, pool_seed)
        self.name, self.backend = name, backend
        self.model = dm_env.physics.model.ptr
        self.task = cls(self.model, dm_env.task)
        self.control_timestep = float(dm_env.control_timestep())
        self.n_sub_steps = int(dm_env._n_sub_steps)
        self.episode_length = int(dm_env._step_limit)
        spec = dm_env.action_spec()
        self.action_size = int(spec.shape[0])
        self.action_low = np.asarray(spec.minimum, np.float32)
        self.action_high = np.asarray(spec.maximum, np.float32)
        fields = tuple(dict.fromkeys(("qpos", "qvel", *self.task.fields)))
        self.native = NativePhysics(self.model, self.n_sub_steps, fields, nthread)
        if backend == "mjx":  # first, so that a feature MJX lacks fails before the pool is built
            from common.envs.mjx_backend import MjxPhysics
            self.mjx = MjxPhysics(self.model, self.n_sub_steps, fields, name,
                                  self.native.field_shapes)

        self._zero_action = jnp.zeros(self.action_size, jnp.float32)
        self.pool_size, self.pool_seed = int(pool_size), int(pool_seed)
        nparams = len(np.asarray(self.task.episode_params(dm_env.physics)).reshape(-1))
        P, ns = self.pool_size, self.native
        self._pool_shapes = (jax.ShapeDtypeStruct((P, 2 * ns.nstate), jnp.uint32),
                             jax.ShapeDtypeStruct((P, ns.nstate), jnp.float32),
                             jax.ShapeDtypeStruct((P, nparams), jnp.float32),
                             jax.ShapeDtypeStruct((P, ns.nfield), jnp.float32))
        self.observation_size = int(jax.eval_shape(
            self._observe_flat, jax.ShapeDtypeStruct((self.native.nfield,), jnp.float32),
            jax.ShapeDtypeStruct((nparams,), jnp.float32)).shape[-1])
        self._pools: Dict[int, Pool] = {}

    def __repr__(self) -> str:
        return f"Env({self.name!r}, backend={self.backend!r})"

    # -- task code, shared by both backends --------------------------------
    def _fields(self, flat_or_dict, task_params, ctrl=None) -> Fields:
        d = flat_or_dict if isinstance(flat_or_dict, dict) else \
            self.native.split_fields(flat_or_dict)
        d = Fields(d)
        d["task"] = task_params
        d["ctrl"] = self._zero_action if ctrl is None else ctrl
        return d

    def _observe_flat(self, flat, task_params):
        return flatten(self.task.observe(self._fields(flat, task_params)))

    # -- initial-state pools ------------------------------------------------
    def _pool_host(self, seeds: np.ndarray):
        """Host side of a pool per seed (any leading shape): carried state
        bits, the same rows in float32, task parameters, reset-time fields."""
        from common.envs.native import encode
        lead = np.shape(seeds)
        parts = []
        for seed in np.asarray(seeds).reshape(-1):
            rows, params = _initial_pool(self.name, self.pool_size, int(seed))
            bits = encode(rows)
            parts.append((bits, rows.astype(np.float32), params, self.native.host_forward(bits)))
        return tuple(np.stack([p[i] for p in parts]).reshape(lead + parts[0][i].shape)
                     for i in range(4))

    def _assemble(self, bits, rows32, params, fields) -> Pool:
        physics = self.mjx.pool_from_rows(rows32) if self.backend == "mjx" else bits
        obs = jax.vmap(self._observe_flat)(fields, params)
        return Pool(physics, params, obs)

    def _built_pool(self, seed: int) -> Pool:
        if seed not in self._pools:
            host = self._pool_host(np.asarray(seed))
            with jax.ensure_compile_time_eval():  # concrete even when first used inside a trace
                self._pools[seed] = self._assemble(*(jnp.asarray(x) for x in host))
        return self._pools[seed]

    @property
    def pool(self) -> Pool:
        """The pool `reset`/`step` draw from when given none: `pool_size`
        resets of a dm_control env seeded with `pool_seed`."""
        return self._built_pool(self.pool_seed)

    @property
    def eval_pool(self) -> Pool:
        """Held-out initial states for evaluation (seed EVAL_POOL_SEED): no
        pool of `make_pool` is made from this seed."""
        return self._built_pool(EVAL_POOL_SEED)

    def make_pool(self, key: jax.Array) -> Pool:
        """A run's own pool, inside the compiled program: `pool_size` resets
        of a dm_control env seeded from `key` (below EVAL_POOL_SEED), made on
        the host at that point. vmap it over seeds for a pool per seed."""
        seed = jax.random.randint(key, (), 0, EVAL_POOL_SEED)
        return self._assemble(*hostcall.call(self._pool_host, self._pool_shapes, seed))

    # -- API ---------------------------------------------------------------
    def _from_pool(self, pool: Pool, idx):
        if self.backend == "mjx":
            physics = self.mjx.from_pool(pool.physics, idx)
        else:
            physics = pool.physics[idx]
        return physics, pool.task[idx], pool.obs[idx]

    def reset(self, key: jax.Array, pool: Optional[Pool] = None) -> EnvState:
        """A new episode from a state drawn from `pool` (default: `self.pool`)."""
        pool = self.pool if pool is None else pool
        key, sub = jax.random.split(key)
        idx = jax.random.randint(sub, (), 0, pool.obs.shape[0])
        physics, task, obs = self._from_pool(pool, idx)
        zero = jnp.zeros((), jnp.float32)
        info = {"final_obs": obs, "episode_return": zero,
                "episode_length": jnp.zeros((), jnp.int32), "nonfinite": jnp.zeros((), jnp.int32),
                "invalid": jnp.zeros((), bool), "key": key}
        return EnvState(physics, task, obs, zero, jnp.zeros((), bool), jnp.zeros((), bool), info)

    def step(self, state: EnvState, action: jnp.ndarray, pool: Optional[Pool] = None) -> EnvState:
        """One control step; a finished episode restarts from `pool`."""
        pool = self.pool if pool is None else pool
        action = self._clean_action(action)
        if self.backend == "mjx":
            physics, raw, bad = self.mjx.step(state.physics, action)
        else:
            physics, raw, bad = self.native.step(state.physics, action)
        return self._stepped(state, action, physics, raw, bad, pool)

    def step_while(self, state: EnvState, action: jnp.ndarray, pool: Optional[Pool],
                   fn: Callable[[Any], Any], arg: Any, groups: int = 1) -> Tuple[EnvState, Any]:
        """`vmap(step)` over a batch of envs (leading axis, one `pool`) and
        `fn(arg)`, which must not need the step: on the native backend the
        device computes fn(arg) while the host steps the physics (an
        accelerator then waits only for the longer of the two). The same
        states, bit for bit, as `step`. Returns (next states, fn(arg)).

        groups > 1 (dividing the batch): the envs go to the host in that
        many equal parts, each started before fn and finished after it in
        turn, so that the host steps one part while the next one's
        operands, or the last one's results, travel and the device takes
        in the part before (`python scripts/benchmark.py accelerator update
        --group-probe` times it)."""
        pool = self.pool if pool is None else pool
        if self.backend == "mjx":
            return jax.vmap(self.step, in_axes=(0, 0, None))(state, action, pool), fn(arg)
        action = jax.vmap(self._clean_action)(action)
        n = action.shape[0] // groups
        if n * groups != action.shape[0]:
            raise UserError(f"{action.shape[0]} envs do not split into {groups} equal groups")
        part = (lambda tree, g: tree) if groups == 1 else (
            lambda tree, g: jax.tree.map(lambda x: x[g * n:(g + 1) * n], tree))
        tickets = []
        for g in range(groups):
            bits, act = part(state.physics, g), part(action, g)
            if tickets:  # each start after the one before
                _, bits, act = jax.lax.optimization_barrier((tickets[-1], bits, act))
            tickets.append(jax.vmap(self.native.step_start)(bits, act))
        last, arg = jax.lax.optimization_barrier((tickets[-1], arg))  # fn once all started
        tickets[-1] = last
        out = fn(arg)
        parts = []
        for g, ticket in enumerate(tickets):  # each end after fn, and after the part before
            if g == 0:
                ticket, out = jax.lax.optimization_barrier((ticket, out))
            else:
                ticket, _ = jax.lax.optimization_barrier((ticket, parts[-1]))
            physics, raw, bad = jax.vmap(self.native.step_finish)(ticket)
            parts.append(jax.vmap(self._stepped, in_axes=(0, 0, 0, 0, 0, None))(
                part(state, g), part(action, g), physics, raw, bad, pool))
        if groups == 1:
            return parts[0], out
        return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts), out

    def _clean_action(self, action: jnp.ndarray) -> jnp.ndarray:
        # a non-finite action (a diverged policy's) never reaches the physics: 0 instead
        action = action.astype(jnp.float32)
        return jnp.clip(jnp.where(jnp.isfinite(action), action, 0.0), self.action_low,
                        self.action_high)

    def _stepped(self, state: EnvState, action, physics, raw, bad, pool: Pool) -> EnvState:
        """The rest of a control step once the physics ran: observation,
        reward, episode end, and the reset of a finished episode."""
        d = self._fields(raw, state.task, action)
        obs = flatten(self.task.observe(d))
        reward = jnp.asarray(self.task.reward(d), jnp.float32).reshape(())
        terminated = jnp.asarray(self.task.terminate(d), bool).reshape(())
        # A diverged simulation is reset, counted and marked invalid: no
        # learner may train on this step (its reward and next observation are
        # not the task's). The values are only kept finite.
        bad = bad | ~jnp.isfinite(obs).all() | ~jnp.isfinite(reward)
        obs = jnp.where(bad, jnp.nan_to_num(state.obs), obs)
        reward = jnp.where(bad, 0.0, reward)
        terminated = terminated & ~bad

        info = state.info
        prev_done = state.terminated | state.truncated
        length = jnp.where(prev_done, 0, info["episode_length"]) + 1
        ret = jnp.where(prev_done, 0.0, info["episode_return"]) + reward
        truncated = ((length >= self.episode_length) | bad) & ~terminated
        done = terminated | truncated

        key, sub = jax.random.split(info["key"])
        idx = jax.random.randint(sub, (), 0, pool.obs.shape[0])
        r_phys, r_task, r_obs = self._from_pool(pool, idx)
        pick = lambda a, b: jax.tree.map(lambda x, y: jnp.where(done, x, y), a, b)
        info = {"final_obs": obs, "episode_return": ret, "episode_length": length,
                "nonfinite": info["nonfinite"] + bad.astype(jnp.int32), "invalid": bad, "key": key}
        return EnvState(pick(r_phys, physics), pick(r_task, state.task), pick(r_obs, obs),
                        reward, terminated, truncated, info)

    def qpos(self, state: EnvState) -> jnp.ndarray:
        if self.backend == "mjx":
            return state.physics.qpos
        return self._decode(state.physics, self.native.qpos_slice())

    def qvel(self, state: EnvState) -> jnp.ndarray:
        if self.backend == "mjx":
            return state.physics.qvel
        return self._decode(state.physics, self.native.qvel_slice())

    @staticmethod
    def _decode(bits, sl: slice):
        from common.envs.native import bits_to_float32
        return bits_to_float32(bits[..., 2 * sl.start:2 * sl.stop])

    def init_state(self, qpos, qvel, warmstart=None, task_params=None,
                   key: Optional[jax.Array] = None) -> EnvState:
        """Start an episode from a given physics state (dm_control's reset-time
        forward runs on it). float64 numpy input is kept bit-exact on native."""
        from common.envs.native import encode, float32_to_bits
        ns = self.native
        task = self.pool.task[0] if task_params is None else jnp.asarray(task_params, jnp.float32)
        key = jax.random.PRNGKey(0) if key is None else key
        concrete = all(isinstance(x, np.ndarray) or x is None for x in (qpos, qvel, warmstart))
        if self.backend == "native":
            if concrete:
                row = np.zeros(ns.nstate)
                row[ns.qpos_slice()] = qpos
                row[ns.qvel_slice()] = qvel
                if warmstart is not None:
                    row[ns.warmstart_slice()] = warmstart
                physics = jnp.asarray(encode(row))
            else:
                physics = jnp.zeros(2 * ns.nstate, jnp.uint32)
                for sl, v in ((ns.qpos_slice(), qpos), (ns.qvel_slice(), qvel),
                              (ns.warmstart_slice(), warmstart)):
                    if v is not None:
                        physics = physics.at[2 * sl.start:2 * sl.stop].set(
                            float32_to_bits(jnp.asarray(v)))
            raw = ns.forward(physics)
        else:
            ws = jnp.zeros(self.model.nv, jnp.float32) if warmstart is None else warmstart
            physics = self.mjx.reset(jnp.asarray(qpos, jnp.float32),
                                     jnp.asarray(qvel, jnp.float32),
                                     jnp.zeros(self.model.na, jnp.float32),
                                     jnp.asarray(ws, jnp.float32))
            raw = self.mjx.forward(physics)
        obs = flatten(self.task.observe(self._fields(raw, task)))
        zero = jnp.zeros((), jnp.float32)
        info = {"final_obs": obs, "episode_return": zero,
                "episode_length": jnp.zeros((), jnp.int32), "nonfinite": jnp.zeros((), jnp.int32),
                "invalid": jnp.zeros((), bool), "key": key}
        return EnvState(physics, task, obs, zero, jnp.zeros((), bool), jnp.zeros((), bool), info)
