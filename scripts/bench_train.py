"""Training-throughput measurements for scripts/benchmark.py.

`agent_throughput` times any agent through the agent protocol (compiled
first, then one timed run); `reference_td3` is the usual way JAX TD3 is
written (CleanRL style): the env stepped from Python, a numpy replay buffer
and one jitted update per env step, with the same networks and batch.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import time
from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def load_algo(name: str):
    return importlib.import_module(f"algos.{name}")


def agent_config(algo: str, env: str, num_envs: int, total_timesteps: int, **overrides):
    mod = load_algo(algo)
    fields = {f.name for f in dataclasses.fields(mod.Config)}
    base = dict(env=env, backend="native", num_envs=num_envs, num_seeds=1,
                total_timesteps=total_timesteps, eval_every=0, eval_episodes=1, checkpoint_every=0)
    base.update({k: v for k, v in overrides.items() if k in fields})
    return mod, mod.Config(**base)


def agent_throughput(algo: str, env: str, num_envs: int, total_timesteps: int,
                     num_seeds: int = 1, **overrides) -> Dict[str, float]:
    """Env steps/s of one compiled run (compile excluded), and its final eval return."""
    mod, config = agent_config(algo, env, num_envs, total_timesteps, **overrides)
    config = dataclasses.replace(config, num_seeds=num_seeds)
    train = mod.make_train(config)
    keys = jax.random.split(jax.random.PRNGKey(0), num_seeds)
    t0 = time.perf_counter()
    compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, history = compiled(keys)
    jax.block_until_ready(history)
    wall = time.perf_counter() - t0
    steps = train.schedule.total_steps * num_seeds
    ret = np.asarray(history["eval/episode_return"])[:, -1]
    return {"sps": steps / wall, "wall_s": wall, "compile_s": compile_s, "steps": steps,
            "eval_return": float(np.mean(ret))}


def reference_td3(env: str, total_timesteps: int, learning_starts: int, batch_size: int = 256,
                  hidden=(256, 256), seed: int = 0) -> Dict[str, float]:
    """TD3 with the env stepped from Python and a jitted update per step."""
    from dm_control import suite
    td3 = load_algo("td3")
    domain, task = env.split("_", 1) if env.count("_") == 1 else _split(env)
    dm = suite.load(domain, task, task_kwargs={"random": seed})
    spec = dm.action_spec()
    A = spec.shape[0]
    flat = lambda ts: np.concatenate([np.ravel(v) for v in ts.observation.values()]).astype(np.float32)
    obs = flat(dm.reset())
    D = obs.shape[0]
    actor, critic = td3.Actor(tuple(hidden), A), td3.TwinCritic(tuple(hidden), False)
    key = jax.random.PRNGKey(seed)
    k1, k2, key = jax.random.split(key, 3)
    ap = actor.init(k1, jnp.zeros(D))
    cp = critic.init(k2, jnp.zeros(D), jnp.zeros(A))
    tx = optax.adam(3e-4)
    state = (ap, cp, ap, cp, tx.init(ap), tx.init(cp))

    @jax.jit
    def policy(ap, o, key):
        a = actor.apply(ap, o)
        return jnp.clip(a + 0.1 * jax.random.normal(key, a.shape), -1, 1)

    @jax.jit
    def update(state, batch, key, step):
        ap, cp, at, ct, ao, co = state
        o, a, r, d, o2 = batch
        noise = jnp.clip(0.2 * jax.random.normal(key, a.shape), -0.5, 0.5)
        a2 = jnp.clip(actor.apply(at, o2) + noise, -1, 1)
        y = r + 0.99 * (1 - d) * critic.apply(ct, o2, a2).min(0)

        def closs(cp):
            return ((critic.apply(cp, o, a) - y) ** 2).sum(0).mean()

        g = jax.grad(closs)(cp)
        u, co = tx.update(g, co, cp)
        cp = optax.apply_updates(cp, u)

        def actor_step(args):
            ap, at, ct, ao = args
            g = jax.grad(lambda p: -critic.apply(cp, o, actor.apply(p, o))[0].mean())(ap)
            u, ao = tx.update(g, ao, ap)
            ap = optax.apply_updates(ap, u)
            return ap, optax.incremental_update(ap, at, 0.005), optax.incremental_update(cp, ct, 0.005), ao

        ap, at, ct, ao = jax.lax.cond(step % 2 == 0, actor_step, lambda x: x, (ap, at, ct, ao))
        return ap, cp, at, ct, ao, co

    cap = total_timesteps
    buf_o, buf_o2 = np.zeros((cap, D), np.float32), np.zeros((cap, D), np.float32)
    buf_a, buf_r, buf_d = np.zeros((cap, A), np.float32), np.zeros(cap, np.float32), np.zeros(cap, np.float32)
    rng = np.random.default_rng(seed)
    t_start = None
    for t in range(total_timesteps):
        if t == learning_starts + 10:  # after the first (compiling) updates
            jax.block_until_ready(state)
            t_start, s_start = time.perf_counter(), t
        key, k_act, k_up = jax.random.split(key, 3)
        if t < learning_starts:
            a = rng.uniform(-1, 1, A).astype(np.float32)
        else:
            a = np.asarray(policy(state[0], obs, k_act))
        ts = dm.step(a)
        o2 = flat(ts)
        buf_o[t], buf_a[t], buf_r[t], buf_o2[t] = obs, a, ts.reward, o2
        buf_d[t] = 0.0  # dm_control tasks only truncate
        obs = flat(dm.reset()) if ts.last() else o2
        if t >= learning_starts:
            idx = rng.integers(0, t + 1, batch_size)
            batch = (buf_o[idx], buf_a[idx], buf_r[idx], buf_d[idx], buf_o2[idx])
            state = update(state, batch, k_up, t)
    jax.block_until_ready(state)
    wall = time.perf_counter() - t_start
    return {"sps": (total_timesteps - s_start) / wall, "wall_s": wall}


def _split(env: str):
    from common import envs
    envs.names()
    domain, task, _ = envs._REGISTRY[env]
    return domain, task


TRAIN_SETTINGS = {
    # name: (num_envs, overrides)
    "1 env, 1 update/step": (1, dict(updates_per_step=1.0, batch_size=256, hidden_sizes=(256, 256))),
    "256 envs, 1 update/16 steps": (256, dict(updates_per_step=1 / 16, batch_size=256,
                                               hidden_sizes=(256, 256))),
}


def train_mode(algos, tasks, steps_1env: int, steps_many: int, budget_s: float, quick: bool) -> list:
    """Rows of the training-throughput table, the reference first per task."""
    rows = []
    for task in tasks:
        ref = reference_td3(task, learning_starts=1000, total_timesteps=1000 + steps_1env)
        rows.append(dict(task=task, agent="reference TD3 (Python env loop)", setting="1 env, 1 update/step",
                         sps=ref["sps"], ratio=1.0, eval_return=float("nan"), wall=ref["wall_s"]))
        for algo in algos:
            for setting, (num_envs, over) in TRAIN_SETTINGS.items():
                steps = steps_1env + 1000 if num_envs == 1 else steps_many
                r = agent_throughput(algo, task, num_envs, steps, learning_starts=1000 if num_envs == 1
                                     else 10 * num_envs, **over)
                rows.append(dict(task=task, agent=algo, setting=setting, sps=r["sps"],
                                 ratio=r["sps"] / ref["sps"] if num_envs == 1 else float("nan"),
                                 eval_return=float("nan"), wall=r["wall_s"]))
            if budget_s > 0:
                # fixed wall clock: the steps the measured 1-env rate allows in the budget
                sps = rows[-2]["sps"]
                steps = max(2000, int(sps * budget_s) // 1000 * 1000)
                r = agent_throughput(algo, task, 1, steps, learning_starts=min(10_000, steps // 4),
                                     eval_episodes=10)
                rows.append(dict(task=task, agent=algo, setting=f"return after ~{budget_s:.0f}s ({steps} steps)",
                                 sps=r["sps"], ratio=float("nan"), eval_return=r["eval_return"], wall=r["wall_s"]))
    return rows


def print_train_table(rows) -> None:
    print(f"\n{'task':<16} {'agent':<34} {'setting':<34} {'env steps/s':>11} {'vs ref':>7} "
          f"{'eval return':>11} {'wall s':>7}")
    for r in rows:
        ratio = "" if np.isnan(r["ratio"]) else f"{r['ratio']:.2f}x"
        ret = "" if np.isnan(r["eval_return"]) else f"{r['eval_return']:.1f}"
        print(f"{r['task']:<16} {r['agent']:<34} {r['setting']:<34} {r['sps']:>11.0f} {ratio:>7} "
              f"{ret:>11} {r['wall']:>7.0f}")
