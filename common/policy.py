"""Trained policies as a product: load one, act with it, export it, check it.

    import jax
    from common.policy import load_policy
    policy = load_policy("release/cheetah_run__td3.npz")   # or a run directory, a checkpoint.npz
    state = policy.env.reset(jax.random.PRNGKey(0), policy.env.eval_pool)
    state = policy.env.step(state, policy.act(state.obs))  # in a loop: jax.jit(policy.env.step)

    python scripts/export.py runs/cheetah_run__td3__1__1700000000 --seed-index 0 \
        --out release/cheetah_run__td3.npz
    python scripts/evaluate.py release/cheetah_run__td3.npz --episodes 100

`load_policy` reads any of
- a run directory (runs/<env>__<algo>__<seed>__<time>/ holding checkpoint.npz),
- a training checkpoint (common/checkpoint.py),
- the policy part of one that scripts/bench_standard.py keeps
  (docs/results/standard/<task>__<algo>.policy.npz),
- an exported policy file (`export`): one seed's actor parameters,
  observation statistics and hyperparameters, with a JSON header naming the
  format and its version, the agent, task and config, the seed, its
  evaluation return and a check: the return of one deterministic native
  episode from a fixed held-out start state and its first actions, recorded
  at export, so that a file can be shown to still reproduce years later
  (`check_return` exactly on the CPU model that recorded it, `check_actions`
  to float rounding anywhere).

It reads only the arrays the policy needs (never the replay buffer) and
rebuilds the agent through the agent protocol alone: `algos/<algo>.py`'s
`Config`, `make_train` (for the shape of the state) and `make_act`.
Anything wrong with a file ends in one UserError line, a seed whose run
diverged (its checkpoint says so, or a weight is not finite) among them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import os
import zipfile
import zlib
from typing import Any, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from common import checkpoint as ckpt
from common.errors import UserError

FORMAT = "rl-policy"
VERSION = 1  # the newest version of the exported format this code reads and writes
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what a damaged archive raises somewhere between zipfile, zlib, numpy and json
_READ_ERRORS = (
    OSError,
    EOFError,
    ValueError,
    KeyError,
    TypeError,
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
)


class PolicyState(NamedTuple):
    """The train-state fields every agent's `make_act(config, env)` reads."""

    actor_params: Any
    obs_stats: Any
    hp: Any


class Policy:
    """One seed's trained policy. `act(obs)` maps an observation [D] or a
    batch [B, D] to actions in env units (normalisation included)."""

    def __init__(
        self,
        algo: str,
        task: str,
        config,
        seed_index: int,
        state: PolicyState,
        eval_return: Optional[float],
        path: str,
        kind: str,
        header: Dict[str, Any],
        saved_config: Dict[str, Any],
        make_act,
        env=None,
    ):
        self.algo, self.task, self.config, self.seed_index = algo, task, config, seed_index
        self.state, self.eval_return = state, eval_return
        self.path = path  # the file read (a run directory's checkpoint.npz)
        self.kind = kind  # "checkpoint", "policy_part" or "exported"
        self.header = header
        self.check = header.get("check") if kind == "exported" else None  # recorded at export
        self._saved_config, self._make_act, self._env = saved_config, make_act, env

    def __repr__(self) -> str:
        return (f"Policy({self.algo!r}, {self.task!r}, seed_index={self.seed_index}, "
                f"path={self.path!r})")

    @property
    def env(self):
        """The task on the backend it was loaded for."""
        if self._env is None:
            from common import envs

            self._env = envs.make(self.task, self.config.backend)
        return self._env

    @functools.cached_property
    def act_fn(self):
        """The agent's own `act(state, obs, key, deterministic)` for one
        observation (what `act` jits), for use inside other traced code."""
        return self._make_act(self.config, self.env)

    @functools.cached_property
    def _jitted(self):
        act = self.act_fn

        @functools.partial(jax.jit, static_argnums=3)
        def run(state, obs, key, deterministic):
            if obs.ndim == 1:
                return act(state, obs, key, deterministic)
            keys = None if key is None else jax.random.split(key, obs.shape[0])
            return jax.vmap(lambda o, k: act(state, o, k, deterministic))(obs, keys)

        return run

    def act(self, obs, key: Optional[jax.Array] = None, deterministic: bool = True) -> jax.Array:
        """Actions for `obs` [D] or [B, D]; `deterministic=False` (the
        exploration policy) needs a key, split over a batch."""
        obs = jnp.asarray(obs, jnp.float32)
        size = self.env.observation_size
        if obs.ndim not in (1, 2) or obs.shape[-1] != size:
            raise UserError(
                f"{self.task} observations are [{size}] or [batch, {size}], got {list(obs.shape)}"
            )
        if not deterministic and key is None:
            raise UserError(
                "act(obs, deterministic=False) samples the exploration policy and needs a key"
            )
        return self._jitted(self.state, obs, None if deterministic else key, bool(deterministic))


# --------------------------------------------------------------------------- reading


def _resolve(path: str) -> str:
    path = str(path)
    if os.path.isdir(path):
        path = os.path.join(path, ckpt.CHECKPOINT_FILE)
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint or policy file at {path!r}")
    return path


def _read_header(path: str) -> Tuple[str, Dict[str, Any]]:
    """(kind, header) of a file, or a UserError naming what it is not."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise UserError(f"cannot read {path!r} ({e.strerror or e})") from None
    if magic != b"PK\x03\x04":  # every npz is a zip archive
        raise UserError(
            f"{path!r} is not a policy file or checkpoint (not an npz archive"
            f"{', it is empty' if not magic else ''})"
        )
    try:
        with np.load(path) as z:
            if "header" not in z.files:
                raise UserError(
                    f"{path!r} is an npz archive without this project's header "
                    f"(a foreign file, or a damaged one)"
                )
            header = json.loads(bytes(z["header"]).decode())
            names = set(z.files)
    except UserError:
        raise
    except _READ_ERRORS as e:
        raise UserError(
            f"unreadable policy file or checkpoint {path!r} "
            f"(corrupt or truncated: {type(e).__name__})"
        ) from None
    if not isinstance(header, dict):
        raise UserError(
            f"{path!r} has a header this project did not write (not a policy file or checkpoint)"
        )
    if "format" in header:
        if header["format"] != FORMAT:
            raise UserError(
                f"{path!r} is a {header['format']!r} file, not an {FORMAT!r} policy file"
            )
        version = header.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise UserError(f"{path!r} has no valid {FORMAT} version (found {version!r})")
        if version > VERSION:
            raise UserError(
                f"{path!r} is {FORMAT} version {version}; this code reads version {VERSION} "
                f"(use a newer version of this project)"
            )
        return "exported", header
    if "leaf_paths" in header:
        return "checkpoint", header
    if "chunk" in header and any(n.startswith(".") for n in names):
        return "policy_part", header
    raise UserError(
        f"{path!r} has a header this project did not write (not a policy file or checkpoint)"
    )


def _algo_module(algo, path: str):
    valid = sorted(
        f[:-3]
        for f in os.listdir(os.path.join(ROOT, "algos"))
        if f.endswith(".py") and not f.startswith("_")
    )
    if algo not in valid:
        raise UserError(f"{path!r} is for agent {algo!r}, which is not one of {', '.join(valid)}")
    return importlib.import_module(f"algos.{algo}")


def _config(module, header: Dict[str, Any], path: str):
    """The agent's Config from a saved one (JSON lists back to tuples,
    fields this version no longer has dropped)."""
    saved = header.get("config")
    if not isinstance(saved, dict):
        raise UserError(f"{path!r} has no config in its header")
    fields = {f.name for f in dataclasses.fields(module.Config)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in fields}
    try:
        config = module.Config(**values)
    except (TypeError, ValueError) as e:
        raise UserError(f"{path!r} has a config {header['algo']} cannot take ({e})") from None
    if header.get("env", config.env) != config.env:
        raise UserError(
            f"{path!r} is for task {header.get('env')!r} but its config says {config.env!r}"
        )
    return config, saved


def _members(kind: str, header: Dict[str, Any]) -> int:
    if kind == "exported":
        return 1
    n = len(header.get("members") or ()) or header.get("num_seeds")
    if not isinstance(n, int) or n < 1:
        raise UserError("its header does not say how many seeds it holds")
    return n


def _read_leaves(path: str, kind: str, header: Dict[str, Any], template, index: int, members: int,
                 hp_defaults=None):
    """The arrays of `template`'s leaves (matched by path) for member
    `index`, read one by one (np.load is lazy: nothing else is read). A
    hyperparameter the file predates takes its value from `hp_defaults`."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    if kind == "policy_part":
        names = {}
    else:
        paths = header.get("leaf_paths")
        if not isinstance(paths, list):
            raise UserError(f"{path!r} has no leaf_paths in its header")
        names = {p: f"leaf_{i:05d}" for i, p in enumerate(paths)}
    lead = () if kind == "exported" else (members,)
    leaves = []
    try:
        with np.load(path) as z:
            for p, t in flat:
                key = jax.tree_util.keystr(p)
                name = key if kind == "policy_part" else names.get(key)
                if (name is None or name not in z.files) and key.startswith(".hp.") \
                        and hp_defaults is not None:
                    # a traced hyperparameter newer than the file: its config's value
                    leaves.append(jnp.asarray(getattr(hp_defaults, key[len(".hp."):])))
                    continue
                if name is None or name not in z.files:
                    raise UserError(
                        f"{path!r} has no {key} (not a {header['algo']} policy of this config)"
                    )
                a = z[name]
                want = lead + tuple(t.shape)
                if a.shape != want or a.dtype != np.dtype(t.dtype):
                    raise UserError(
                        f"{path!r}: {key} is {a.dtype}{list(a.shape)}, this {header['algo']} "
                        f"config needs {np.dtype(t.dtype)}{list(want)}"
                    )
                leaves.append(jnp.asarray(a if kind == "exported" else a[index]))
    except UserError:
        raise
    except _READ_ERRORS as e:
        raise UserError(
            f"unreadable policy file or checkpoint {path!r} "
            f"(corrupt or truncated: {type(e).__name__})"
        ) from None
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _refuse_diverged(path: str, kind: str, header: Dict[str, Any], seed_index: int,
                     state) -> None:
    """A seed whose checkpoint marks it diverged (its critic or optimiser may
    have blown up before its actor), or whose policy has a non-finite weight,
    has no policy: exporting, evaluating or rendering it would score NaN
    actions."""
    from common.agent import all_finite

    steps = header.get("diverged_at") if kind == "checkpoint" else None
    step = steps[seed_index] if steps else -1
    if step >= 0 or not bool(all_finite(state)):
        when = f" at env step {step}" if step >= 0 else ""
        raise UserError(
            f"{path!r}, seed index {seed_index}: its run diverged{when} (non-finite weights or "
            f"losses), so it holds no policy"
        )


def load_policy(path: str, seed_index: int = 0, backend: str = "native") -> Policy:
    """Seed `seed_index`'s policy from a run directory, a checkpoint, a
    policy part file of scripts/bench_standard.py or an exported policy file
    (which holds one seed: index 0), acting on `backend`'s env."""
    from common import envs

    path = _resolve(path)
    kind, header = _read_header(path)
    module = _algo_module(header.get("algo"), path)
    config, saved = _config(module, header, path)
    try:
        members = _members(kind, header)
    except UserError as e:
        raise UserError(f"{path!r}: {e}") from None
    if not 0 <= seed_index < members:
        what = (
            "an exported policy file holds one seed, index 0"
            if kind == "exported"
            else f"{path!r} holds {members} seed(s) or sweep member(s), 0..{members - 1}"
        )
        raise UserError(f"seed index {seed_index} is out of range: {what}")
    envs.resolve_backend(backend)
    config = dataclasses.replace(config, backend=backend)
    # The state's shape through the protocol; one seed is enough (the
    # memory check of make_train counts every seed's replay buffer).
    train = module.make_train(dataclasses.replace(config, num_seeds=1))
    shapes = jax.eval_shape(train.init, jax.random.PRNGKey(0))
    template = PolicyState(*(getattr(shapes, f) for f in PolicyState._fields))
    hp_defaults = module.AGENT.hparams(config)
    state = _read_leaves(path, kind, header, template, seed_index, members, hp_defaults)
    _refuse_diverged(path, kind, header, seed_index, state)
    eval_return = header.get("eval_return") if kind == "exported" else None
    return Policy(
        header["algo"],
        config.env,
        config,
        int(header.get("seed_index", 0)) if kind == "exported" else seed_index,
        state,
        eval_return,
        path,
        kind,
        header,
        saved,
        module.make_act,
        train.env,
    )


# --------------------------------------------------------------------------- episodes


def episode_returns(policy: Policy, keys: jax.Array, env=None) -> np.ndarray:
    """Returns of len(keys) deterministic episodes run in parallel, each
    from the held-out state its key draws from `env.eval_pool` (env:
    default the policy's), env.episode_length steps; a terminated episode
    counts only up to its end."""
    env = policy.env if env is None else env
    act = policy.act_fn

    @jax.jit
    def run(state, keys):
        pool = env.eval_pool
        s = jax.vmap(env.reset, in_axes=(0, None))(keys, pool)

        def step(carry, _):
            s, total, alive = carry
            a = jax.vmap(lambda o: act(state, o, None, True))(s.obs)
            s = jax.vmap(env.step, in_axes=(0, 0, None))(s, a, pool)
            total = total + jnp.where(alive, s.reward, 0.0)
            return (s, total, alive & ~(s.terminated | s.truncated)), None

        init = (s, jnp.zeros(keys.shape[0], jnp.float32), jnp.ones(keys.shape[0], bool))
        return jax.lax.scan(step, init, None, length=env.episode_length)[0][1]

    return np.asarray(run(policy.state, keys))


def _native_env(policy: Policy):
    from common import envs

    return policy.env if policy.env.backend == "native" else envs.make(policy.task, "native")


CHECK_STEPS = 5  # steps of the check episode whose actions an export records


def cpu_model() -> str:
    """This machine's CPU model (/proc/cpuinfo), where a check return was recorded."""
    import platform
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def check_actions(policy: Policy, steps: int = CHECK_STEPS) -> np.ndarray:
    """The deterministic actions of the check episode's first `steps` steps
    ([steps, A]): what the weights compute, equal to float rounding on any
    machine. The whole episode's return is not: over 1000 steps a chaotic
    task amplifies the last bit by which one CPU's arithmetic differs from
    another's (cheetah_run's MPO check reads 72.0 on an AMD EPYC, 76.7 on an
    Intel Xeon, with the same file and code)."""
    env, act = _native_env(policy), policy.act_fn

    @jax.jit
    def run(state):
        s = env.reset(jax.random.PRNGKey(0), env.eval_pool)

        def step(s, _):
            a = act(state, s.obs, None, True)
            return env.step(s, a, env.eval_pool), a

        return jax.lax.scan(step, s, None, length=steps)[1]

    return np.asarray(run(policy.state))


def check_return(policy: Policy) -> float:
    """The check episode: deterministic, native physics, from
    `env.reset(PRNGKey(0), env.eval_pool)`, env.episode_length steps."""
    return float(episode_returns(policy, jax.random.PRNGKey(0)[None], _native_env(policy))[0])


# --------------------------------------------------------------------------- export


def export(policy: Policy, path: str, eval_return: Optional[float] = None) -> Dict[str, Any]:
    """Write `policy` (one seed) to `path` atomically; returns its header.
    `eval_return` (default the policy's own) is recorded as given."""
    if eval_return is None:
        eval_return = policy.eval_return
    if eval_return is not None:
        eval_return = float(eval_return)
        eval_return = eval_return if math.isfinite(eval_return) else None  # JSON has no NaN
    env = _native_env(policy)
    check = {
        "return": check_return(policy),
        "backend": "native",
        "reset_key": 0,
        "pool": "eval_pool",
        "steps": env.episode_length,
        # the return reproduces exactly on this CPU model; the first actions on any
        "cpu": cpu_model(),
        "actions": check_actions(policy).tolist(),
    }
    header = {
        "format": FORMAT,
        "version": VERSION,
        "algo": policy.algo,
        "env": policy.task,
        "config": policy._saved_config,
        "seed_index": policy.seed_index,
        "eval_return": eval_return,
        "check": check,
    }
    state = jax.tree.map(np.asarray, policy.state)
    try:
        ckpt.save(
            str(path), state, header
        )  # header + leaf_paths + leaf_00000..., temp file + rename
    except OSError as e:
        raise UserError(f"cannot write {str(path)!r} ({e.strerror or e})") from None
    return dict(
        header,
        leaf_paths=[
            jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]
        ],
    )
