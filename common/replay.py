"""Replay inside the compiled program: one ring buffer of rows per env stream.

Row t holds what env e saw and did at its step t (obs, action, reward, flags),
so each observation is stored once: the next observation of row t is row
t+1's, except where the episode ended at t; that true final observation goes
to a small side store (`final_*`). Sampling is O(batch) and returns n-step
windows that stop at episode ends:

    G = sum_{k<m} gamma^k r_{t+k},  bootstrap gamma^m * (1 - terminated) * V(s_{t+m})

where m <= n is cut at the first terminated or truncated step, and s_{t+m}
is that episode's true final observation when the window was cut.

A step whose physics diverged (`valid` False) is never learned from: a window
that starts there has mask 0, and a window that reaches it stops just before
it, bootstrapping from the (real) observation that step started from.
"""
from __future__ import annotations

from typing import NamedTuple, Tuple

import jax
import jax.numpy as jnp


class Replay(NamedTuple):
    obs: jnp.ndarray          # [C, E, D]
    action: jnp.ndarray       # [C, E, A]
    reward: jnp.ndarray       # [C, E]
    terminated: jnp.ndarray   # [C, E] bool
    truncated: jnp.ndarray    # [C, E] bool
    valid: jnp.ndarray        # [C, E] bool: False where the physics diverged
    final_slot: jnp.ndarray   # [C, E] int32: side-store slot of a row that ended an episode
    final_obs: jnp.ndarray    # [F, E, D] true final observations
    final_row: jnp.ndarray    # [F, E] int32: the row each slot belongs to (-1: empty)
    final_count: jnp.ndarray  # [E] int32
    pos: jnp.ndarray          # int32: next row to write
    size: jnp.ndarray         # int32: rows written, at most C


class Batch(NamedTuple):
    obs: jnp.ndarray
    action: jnp.ndarray
    reward: jnp.ndarray       # n-step discounted return
    discount: jnp.ndarray     # gamma^m, or 0 after a termination
    next_obs: jnp.ndarray     # s_{t+m}
    mask: jnp.ndarray         # 1.0, or 0.0 for an invalid step or an overwritten final observation


def final_slots(rows: int, episode_length: int) -> int:
    """Side-store size: room for every episode end among `rows` rows when
    episodes run to the time limit, plus slack for early ends."""
    return max(4, 2 * (rows // max(episode_length, 1)) + 4)


def layout(config, env) -> Tuple[int, int, int, int, int]:
    """(rows, num_envs, obs_size, action_size, num_final) of one seed's buffer,
    the arguments of `init`: `config.buffer_size` transitions shared by its
    `num_envs` env streams (at least n_step + 2 rows). Refuses, with one
    line, a buffer whose `num_seeds` copies cannot fit."""
    from common import agent
    rows = max(config.buffer_size // config.num_envs, config.n_step + 2)
    shape = (rows, config.num_envs, env.observation_size, env.action_size,
             final_slots(rows, env.episode_length))
    agent.check_memory(config.num_seeds * nbytes(*shape), "the replay buffer")
    return shape


def init(rows: int, num_envs: int, obs_size: int, action_size: int, num_final: int) -> Replay:
    C, E, F = rows, num_envs, num_final
    return Replay(
        obs=jnp.zeros((C, E, obs_size), jnp.float32),
        action=jnp.zeros((C, E, action_size), jnp.float32),
        reward=jnp.zeros((C, E), jnp.float32),
        terminated=jnp.zeros((C, E), bool),
        truncated=jnp.zeros((C, E), bool),
        valid=jnp.zeros((C, E), bool),
        final_slot=jnp.zeros((C, E), jnp.int32),
        final_obs=jnp.zeros((F, E, obs_size), jnp.float32),
        final_row=jnp.full((F, E), -1, jnp.int32),
        final_count=jnp.zeros((E,), jnp.int32),
        pos=jnp.zeros((), jnp.int32),
        size=jnp.zeros((), jnp.int32),
    )


def nbytes(rows: int, num_envs: int, obs_size: int, action_size: int, num_final: int) -> int:
    per_row = num_envs * (4 * (obs_size + action_size + 1) + 3 + 4)
    return rows * per_row + num_final * num_envs * (4 * obs_size + 4)


class Transition(NamedTuple):
    """One env step of every env, as `add` takes it (leading dim E)."""
    obs: jnp.ndarray
    action: jnp.ndarray
    reward: jnp.ndarray
    terminated: jnp.ndarray
    truncated: jnp.ndarray
    final_obs: jnp.ndarray
    valid: jnp.ndarray


def transition(obs, action, next_state) -> Transition:
    """The step from `obs` with `action` to the env states `next_state`."""
    return Transition(obs, action, next_state.reward, next_state.terminated,
                      next_state.truncated, next_state.info["final_obs"],
                      ~next_state.info["invalid"])


def no_transition(num_envs: int, obs_size: int, action_size: int) -> Transition:
    """The step before the first one, invalid in every env: `add` stores it,
    nothing learns from it."""
    E = num_envs
    return Transition(jnp.zeros((E, obs_size)), jnp.zeros((E, action_size)), jnp.zeros(E),
                      jnp.zeros(E, bool), jnp.zeros(E, bool), jnp.zeros((E, obs_size)),
                      jnp.zeros(E, bool))


def add(buf: Replay, obs, action, reward, terminated, truncated, final_obs, valid) -> Replay:
    """Write one step of every env (arrays with leading dim E) at row `pos`;
    `valid` is False where the step's physics diverged (env info["invalid"])."""
    p = buf.pos
    E = obs.shape[0]
    envs = jnp.arange(E)
    done = terminated | truncated
    slot = buf.final_count % buf.final_obs.shape[0]
    keep = lambda new, old: jnp.where(done.reshape((E,) + (1,) * (new.ndim - 1)), new, old)
    return buf._replace(
        obs=buf.obs.at[p].set(obs),
        action=buf.action.at[p].set(action),
        reward=buf.reward.at[p].set(reward),
        terminated=buf.terminated.at[p].set(terminated),
        truncated=buf.truncated.at[p].set(truncated),
        valid=buf.valid.at[p].set(valid),
        final_slot=buf.final_slot.at[p].set(slot),
        final_obs=buf.final_obs.at[slot, envs].set(keep(final_obs, buf.final_obs[slot, envs])),
        final_row=buf.final_row.at[slot, envs].set(keep(jnp.full((E,), p),
                                                        buf.final_row[slot, envs])),
        final_count=buf.final_count + done.astype(jnp.int32),
        pos=(p + 1) % buf.obs.shape[0],
        size=jnp.minimum(buf.size + 1, buf.obs.shape[0]),
    )


def can_sample(buf: Replay, n_step: int) -> jnp.ndarray:
    return buf.size > n_step


def ready(iteration, n_step: int):
    """can_sample after the add of runner iteration `iteration` (0-based),
    computed from the iteration alone: every seed has stored the same number
    of rows, so a `lax.cond` on it stays a real branch under vmap over seeds.
    A cond on the per-seed `buf.size` becomes a select that computes the
    update on every iteration and copies the whole train state, replay
    buffer included (O(capacity) per env step)."""
    return iteration >= n_step


def sample(buf: Replay, key: jax.Array, batch_size: int, n_step: int, gamma) -> Batch:
    """n-step transitions, uniformly over rows whose window is fully stored.

    Every form in SAMPLERS returns the same Batch, bit for bit, for the same
    key and buffer (tests/test_replay.py); this one picks SAMPLER[platform]
    (`python scripts/benchmark.py accelerator update --sample-variants`
    times them all on the device)."""
    name = SAMPLER.get(jax.default_backend(), SAMPLER["default"])
    return SAMPLERS[name](buf, key, batch_size, n_step, gamma)


def _start(buf: Replay, key: jax.Array, batch_size: int, n_step: int, wrap=None):
    """(t, e): the first row and the env stream of each sampled window."""
    C, E = buf.reward.shape
    k_row, k_env = jax.random.split(key)
    oldest = (buf.pos - buf.size) % C
    # the window t..t+n needs obs[t+n] stored: t + n <= newest row
    u = jax.random.randint(k_row, (batch_size,), 0, jnp.maximum(buf.size - n_step, 1))
    t = (oldest + u) % C if wrap is None else wrap(oldest + u, C)
    e = jax.random.randint(k_env, (batch_size,), 0, E)
    return t, e


def _alive(done, valid, batch_size: int):
    """alive[k]: no episode end among steps t..t+k-1 and step k valid, so it
    counts (step 0 always counts; an invalid one is masked out by the caller)."""
    go_on = ~done[:, :-1] & valid[:, 1:]
    return jnp.cumprod(jnp.concatenate([jnp.ones((batch_size, 1), bool), go_on], 1), 1)


def sample_reference(buf: Replay, key: jax.Array, batch_size: int, n_step: int, gamma) -> Batch:
    """The first form: 2-D advanced indexing `buf.x[rows, e]`, one gather per
    field and use."""
    C, E = buf.reward.shape
    t, e = _start(buf, key, batch_size, n_step)
    rows = (t[:, None] + jnp.arange(n_step)[None, :]) % C          # [B, n]
    r = buf.reward[rows, e[:, None]]
    term = buf.terminated[rows, e[:, None]]
    done = term | buf.truncated[rows, e[:, None]]
    valid = buf.valid[rows, e[:, None]]
    alive = _alive(done, valid, batch_size)
    gammas = gamma ** jnp.arange(n_step, dtype=jnp.float32)
    ret = jnp.sum(alive * gammas * r, axis=1)
    m = jnp.sum(alive, axis=1)                                       # steps counted, 1..n
    last = (t + m - 1) % C
    cut = done[jnp.arange(batch_size), m - 1]
    slot = buf.final_slot[last, e]
    next_obs = jnp.where(cut[:, None], buf.final_obs[slot, e], buf.obs[(t + m) % C, e])
    terminal = term[jnp.arange(batch_size), m - 1]
    discount = jnp.where(terminal, 0.0, gamma ** m.astype(jnp.float32))
    mask = (jnp.where(cut, buf.final_row[slot, e] == last, True) & valid[:, 0]).astype(jnp.float32)
    return Batch(buf.obs[t, e], buf.action[t, e], ret, discount, next_obs, mask)


def _take(x, index):
    """x[index] along axis 0 as one bare gather: `index` (any shape) must be
    in range, so no clamping or negative-index handling is emitted."""
    dims = jax.lax.GatherDimensionNumbers(
        offset_dims=tuple(range(index.ndim, index.ndim + x.ndim - 1)),
        collapsed_slice_dims=(0,), start_index_map=(0,))
    return jax.lax.gather(x, index[..., None], dims, (1,) + x.shape[1:],
                          mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def _flat(x):
    """[C, E, ...] as [C*E, ...] (free: the array is contiguous)."""
    return x.reshape((-1,) + x.shape[2:])


def _wrap(i, size):
    """i % size for 0 <= i < 2*size, without a division."""
    return jnp.where(i >= size, i - size, i)


def sample_flat_packed(buf: Replay, key: jax.Array, batch_size: int, n_step: int,
                       gamma) -> Batch:
    """One bare 1-D gather per field from [C*E, ...] views of the buffer (flat
    row t*E + e, wrapped without `%`; needs C*E < 2**30), obs[t] and obs[t+m]
    in one, and the three flags packed into one byte per row of the whole
    buffer at each call (O(buffer), unless the compiler fuses the packing into
    the gather) and gathered once."""
    C, E = buf.reward.shape
    CE = C * E
    t, e = _start(buf, key, batch_size, n_step, _wrap)
    i = t * E + e                                                    # flat row of (t, e)
    rows = _wrap(i[:, None] + E * jnp.arange(n_step)[None, :], CE)   # [B, n] flat rows
    r = _take(_flat(buf.reward), rows)
    flags = (buf.terminated.astype(jnp.uint8) | (buf.truncated.astype(jnp.uint8) << 1)
             | (buf.valid.astype(jnp.uint8) << 2))
    f = _take(_flat(flags), rows)
    term, done, valid = (f & 1) > 0, (f & 3) > 0, (f & 4) > 0
    alive = _alive(done, valid, batch_size)
    gammas = gamma ** jnp.arange(n_step, dtype=jnp.float32)
    ret = jnp.sum(alive * gammas * r, axis=1)
    m = jnp.sum(alive, axis=1)                                       # steps counted, 1..n
    last = _wrap(t + m - 1, C)
    slot = _take(_flat(buf.final_slot), last * E + e)
    cut = done[jnp.arange(batch_size), m - 1]
    terminal = term[jnp.arange(batch_size), m - 1]
    F = buf.final_obs.shape[0]
    fin = slot * E + e
    both = _take(_flat(buf.obs), jnp.concatenate([i, _wrap(i + m * E, CE)]))  # obs[t], obs[t+m]
    next_obs = jnp.where(cut[:, None], _take(_flat(buf.final_obs), fin), both[batch_size:])
    discount = jnp.where(terminal, 0.0, gamma ** m.astype(jnp.float32))
    row_ok = _take(buf.final_row.reshape(F * E), fin) == last
    mask = (jnp.where(cut, row_ok, True) & valid[:, 0]).astype(jnp.float32)
    return Batch(both[:batch_size], _take(_flat(buf.action), i), ret, discount, next_obs, mask)


SAMPLERS = {"reference": sample_reference, "flat_packed": sample_flat_packed}
# jax.default_backend() -> the form `sample` uses ("default": any other). Both
# give the same Batch; only their speed differs (`python scripts/benchmark.py
# accelerator update --sample-variants`, ms per call from a full 1M-transition
# humanoid buffer, 2026-12-06). On a TPU v5e the reference wins at batch 256
# (0.136 against 0.362: flat_packed packs the whole buffer's flags per call)
# and loses at 4096 (1.413 against 1.075). On a 2-core CPU (loaded, so noisy)
# flat_packed was about 10% faster at 256 and level at 4096. Four more forms
# (unpacked flat gathers; window-wide slot gathers; (n, 1) slice gathers) were
# as fast or slower on both and are gone; docs/accelerator.md has their numbers.
SAMPLER = {"default": "flat_packed", "tpu": "reference"}


def synthetic(buf: Replay, key: jax.Array, episode_length: int) -> Replay:
    """`buf` filled to capacity with random rows (episodes truncated every
    `episode_length` rows, none terminated, all valid): what a long run's
    sampling reads, for timing an update alone (scripts/benchmark.py train)."""
    C, E, D = buf.obs.shape
    k_obs, k_act, k_rew, k_fin = jax.random.split(key, 4)
    row = jnp.arange(C)[:, None] * jnp.ones((1, E), jnp.int32)
    truncated = row % episode_length == episode_length - 1
    F = buf.final_obs.shape[0]
    slots = jnp.arange(F)
    return buf._replace(
        obs=jax.random.normal(k_obs, buf.obs.shape),
        action=jax.random.uniform(k_act, buf.action.shape, minval=-1, maxval=1),
        reward=jax.random.uniform(k_rew, buf.reward.shape),
        terminated=jnp.zeros_like(buf.terminated), truncated=truncated,
        valid=jnp.ones_like(buf.valid),
        final_slot=(row // episode_length) % F,
        final_obs=jax.random.normal(k_fin, buf.final_obs.shape),
        final_row=jnp.where(slots < C // episode_length, slots * episode_length
                            + episode_length - 1, -1)[:, None] * jnp.ones((1, E), jnp.int32),
        final_count=jnp.full_like(buf.final_count, C // episode_length),
        pos=jnp.zeros((), jnp.int32), size=jnp.full((), C, jnp.int32))
