"""`accelerator` mode: where an off-policy update's time goes on the device JAX
runs on (a TPU or GPU; it runs on a CPU the same way), and the 10-minute
runs of the accelerator benchmark.

    python scripts/benchmark.py accelerator update    # the update, taken apart
    python scripts/benchmark.py accelerator runs      # every agent, 10 minutes each
    python scripts/benchmark.py accelerator seeds     # 1 and 4 seeds in one program
    python scripts/benchmark.py accelerator report    # table.md from the result JSONs
"""
from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List

import numpy as np

from .util import ROOT, device_line, git_commit, median, tool, write_json

HELP = "the off-policy update taken apart on the accelerator, and the 10-minute runs"
DOC = """`accelerator` mode, in three parts.

update: on the default JAX device, each piece of an off-policy update timed
  alone at each --batch-sizes (humanoid_walk shapes, [256, 256] networks),
  medians of --repeats scans of --updates calls each, compile excluded:
  * mlp         a bare TD3-shaped update (actor and twin critics, Adam) on a
                batch already in device memory: the floor of the same shapes;
    mlp@highest the same at float32 matmul precision `highest`;
  * sample      replay.sample of n-step windows from a full 1M-transition buffer;
  * add         replay.add of one step of 256 envs (once per iteration, not per update);
  * proj        the categorical projection (101 atoms) as scatter-adds and as a
                dense triangle-kernel product (D4PG, TD4);
  --ablations: instead, each agent's update (--algos, default d4pg) alone
  from a full buffer at the first --batch-sizes, whole and with one piece
  taken out at a time (critic layer norm, observation normalisation, the
  replay gathers), beside the bare MLP update: what each piece costs inside
  the compiled update;
  --kernels: instead, how many kernels each agent's update (--algos) compiles
  to on this device at its humanoid recipe (batch: the first --batch-sizes),
  by what they do; where each launch has a fixed cost, their count is the
  update's fixed cost;
  --split-probe: instead, whether the device computes while the host steps
  the envs when the step is split around the device's work (--overlap-physics's
  mechanism, Env.step_while), at each --loop-envs;
  then per agent (--algos), through the agent protocol at its humanoid recipe
  with --loop-envs envs (256) and --loop-ups updates per env step (1/16),
  each with every --batch-sizes (the candidates of an accelerator recipe;
  the update runs at the platform's precision, as runs do): its update alone from a full
  buffer (ms/update), acting (ms per env step: policy, physics on the host,
  replay write) and the whole loop, as `train`'s loop-efficiency table.

runs: every agent (--algos) on humanoid_walk (and --extra TASK:ALGO runs),
  each its own command line `python algos/<algo>.py --env <task>` with no
  recipe flag (what a user types; on an accelerator it picks the accelerator
  recipe itself), started in a fresh process and stopped --minutes after its
  start, compile included. Evaluation (10 held-out episodes) every
  --eval-every env steps; the result JSON under docs/results/accelerator/
  keeps the last evaluation within 2.5, 5 and 10 minutes of the start with
  its env steps (a device command may not last 10 minutes with its own
  start: --minutes 9.25 there, and the 10-minute column is the run's end),
  the env steps/s, the seconds to the first log (startup and compile), the
  exact command and the machine; the policy of the last checkpoint beside it.

seeds: the agent's own command (--algos, default d4pg; --task) with --num-seeds
  N for each of --seed-counts (1 4), each in a fresh process stopped after
  --seed-minutes, compile included; the env steps/s per seed its progress
  line shows last (steps since the first logged chunk, so compile excluded),
  times N for the program's total, and each total over the first count's:
  the scaling of several seeds in one program. Printed, and kept as
  seeds_<task>_<algo>.json beside the results.

report: docs/results/accelerator/table.md from the result JSONs."""

OFF_POLICY = ("td3", "ddpg", "d4pg", "td4", "sac", "mpo")
ALGOS = OFF_POLICY + ("ppo",)
RESULTS = os.path.join(ROOT, "docs", "results", "accelerator")
MARKS = (2.5, 5.0, 10.0)  # minutes
RECIPE_ENVS, RECIPE_UPS = 256, 0.0625
# --quick runs and seeds programs: tiny off-policy agents on cartpole_balance
QUICK_FLAGS = ["--num-envs", "4", "--hidden-sizes", "16", "16", "--batch-size", "32",
               "--learning-starts", "500"]


def add_arguments(p) -> None:
    p.add_argument("part", choices=("update", "runs", "seeds", "report", "profile"))
    p.add_argument("--algos", nargs="+", default=None,
                   help="agents (update: the off-policy six; runs: all seven)")
    p.add_argument("--task", default="humanoid_walk")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[256, 4096])
    p.add_argument("--updates", type=int, default=64, help="update calls per timed scan")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--loop-envs", nargs="+", type=int, default=[RECIPE_ENVS],
                   help="update: envs of the per-agent loop rows")
    p.add_argument("--loop-ups", nargs="+", type=float, default=[RECIPE_UPS],
                   help="update: updates per env step of the per-agent loop rows")
    p.add_argument("--loop-overlap", nargs="+", choices=("recipe", "off", "on"),
                   default=["recipe"],
                   help="update: --overlap-physics of the per-agent loop rows (recipe: as the "
                        "agent's recipe has it where this runs)")
    p.add_argument("--loop-iters", type=int, default=16,
                   help="iterations per timed call of the per-agent loop rows (0: skip them)")
    p.add_argument("--minutes", type=float, default=10.0, help="runs: wall-clock per run")
    p.add_argument("--eval-every", type=int, default=500_000, help="runs: env steps")
    p.add_argument("--extra", nargs="*", default=[], metavar="TASK:ALGO",
                   help="runs: more runs (e.g. humanoid_run:d4pg)")
    p.add_argument("--flags", default="", help="runs: extra flags for every run's command")
    p.add_argument("--seed-counts", nargs="+", type=int, default=[1, 4],
                   help="seeds: --num-seeds of each program")
    p.add_argument("--seed-minutes", type=float, default=3.0,
                   help="seeds: wall-clock per program, compile included")
    p.add_argument("--profile-at", type=float, default=110.0,
                   help="profile: seconds after the run's first host call (its compile done)")
    p.add_argument("--profile-seconds", type=float, default=0.4,
                   help="profile: length of the trace (its file: 15-30 MB per second on a TPU)")
    p.add_argument("--out", default=None,
                   help="runs: where the JSONs go (default docs/results/accelerator)")
    p.add_argument("--quick", action="store_true",
                   help="smoke check: cartpole_balance, tiny nets and batches, a 40 s run")
    p.add_argument("--kernels", action="store_true",
                   help="update: only the kernel count of each agent's compiled update, by "
                        "what the kernels do")
    p.add_argument("--ablations", action="store_true",
                   help="update: only each agent's update (--algos, default d4pg) alone at "
                        "the first --batch-sizes, whole and with one piece taken out at a time")
    p.add_argument("--split-probe", action="store_true",
                   help="update: only whether the device computes while the host steps the "
                        "envs (the step split around device work, as --overlap-physics does) "
                        "at each --loop-envs, ms per iteration")
    p.add_argument("--group-probe", action="store_true",
                   help="update: only the env step of each --loop-envs batch handed to "
                        "the host in 1, 2 and 4 staggered groups, ms per iteration")
    p.add_argument("--sample-variants", action="store_true",
                   help="update: only the forms of replay.sample (replay.SAMPLERS), timed "
                        "in turn in one process, ms per call")


def run(args) -> int:
    from common.errors import UserError
    if (min(args.batch_sizes) < 1 or args.updates < 1 or args.repeats < 1 or args.minutes <= 0
            or min(args.loop_envs) < 1 or not 0 < min(args.loop_ups) <= max(args.loop_ups) <= 1
            or min(args.seed_counts) < 1 or args.seed_minutes <= 0 or args.profile_at < 0
            or args.profile_seconds <= 0):
        raise UserError("--batch-sizes, --updates, --repeats, --minutes, --loop-envs, "
                        "--seed-counts, --seed-minutes and --profile-seconds must be positive, "
                        "--profile-at not negative, --loop-ups in (0, 1]")
    out = args.out or (os.path.join(ROOT, "bench", "accelerator") if args.quick else RESULTS)
    if args.part == "update" and args.split_probe:
        split_probe("cartpole_balance" if args.quick else args.task,
                    [16] if args.quick else args.loop_envs, max(args.repeats, 5))
        return 0
    if args.part == "update" and args.group_probe:
        group_probe("cartpole_balance" if args.quick else args.task,
                    [16] if args.quick else args.loop_envs, max(args.repeats, 5))
        return 0
    if args.part == "update" and args.sample_variants:
        sample_variants(args.task if not args.quick else "cartpole_balance",
                        [16] if args.quick else args.batch_sizes,
                        4 if args.quick else args.updates, max(args.repeats, 5), args.quick)
        return 0
    if args.part == "update" and args.ablations:
        task = "cartpole_balance" if args.quick else args.task
        B = 16 if args.quick else args.batch_sizes[0]
        n = 4 if args.quick else args.updates
        rows = [dict(algo="bare MLP update", variant="",
                     ms=bare_ms(task, B, n, args.repeats, args.quick))]
        rows += [r for a in (args.algos or ["d4pg"])
                 for r in update_ablations(a, task, B, n, args.repeats, args.quick)]
        print(ablations_table(rows, B))
        return 0
    if args.part == "update" and args.kernels:
        algos = args.algos or (("td3",) if args.quick else OFF_POLICY)
        print(kernels_table([update_kernels(a, "cartpole_balance" if args.quick else args.task,
                                            args.batch_sizes[0], args.quick)
                             for a in ("bare", *algos)]))
        return 0
    if args.part == "update":
        rows = update_parts(args.task if not args.quick else "cartpole_balance",
                            [16] if args.quick else args.batch_sizes,
                            4 if args.quick else args.updates, args.repeats, args.quick)
        print(parts_table(rows))
        algos = args.algos or (("td3",) if args.quick else OFF_POLICY)
        if args.loop_iters > 0:
            from common import cli
            with cli.matmul_precision():  # as the runs compile it (highest on a TPU)
                rows = agent_rows(algos, args, 4 if args.quick else args.loop_iters)
            print(agents_table(rows))
        return 0
    if args.part == "profile":
        task = "cartpole_balance" if args.quick else args.task
        for algo in args.algos or ["d4pg"]:
            print(profile_run(task, algo, args.flags.split(), args.profile_at,
                              args.profile_seconds, args.out or os.path.join(ROOT, "bench"),
                              args.quick), flush=True)
        return 0
    if args.part == "seeds":
        task = "cartpole_balance" if args.quick else args.task
        algo = (args.algos or ["d4pg"])[0]
        r = seeds_scaling(task, algo, args.seed_counts, 1.0 if args.quick else args.seed_minutes,
                          args.flags.split(), args.quick)
        os.makedirs(out, exist_ok=True)
        write_json(os.path.join(out, f"seeds_{task}_{algo}.json"), r)
        print(seeds_table(r))
        return 0
    if args.part == "runs":
        task = "cartpole_balance" if args.quick else args.task
        runs = [(task, a) for a in (args.algos or ALGOS)]
        runs += [tuple(x.split(":")) for x in args.extra]
        for task, algo in runs:
            r = timed_run(task, algo, out, 0.67 if args.quick else args.minutes,
                          args.eval_every, args.flags.split(), args.quick)
            print(f"{task} {algo}: " + ", ".join(
                f"{m:g} min {v if v is None else round(v)}"
                for m, v in zip(r["mark_minutes"], r["marks"])), flush=True)
    print(write_table(load(out), out))
    return 0


# --------------------------------------------------------------------------- the update, apart

def scan_timer(body: Callable, carry, n: int, repeats: int, donate: bool = False) -> float:
    """Median seconds of one `body` call, from `repeats` jitted scans of `n`
    calls (compile and the first call excluded); `donate`: the carry's
    buffers are reused from call to call, as a run's state is (else a carry
    holding a replay buffer would be copied by every call)."""
    import jax
    import jax.numpy as jnp
    f = jax.jit(lambda c: jax.lax.scan(lambda c, i: (body(c, i), None), c, jnp.arange(n))[0],
                donate_argnums=0 if donate else ())
    carry = jax.block_until_ready(f(carry))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        carry = jax.block_until_ready(f(carry))
        times.append(time.perf_counter() - t0)
    return median(times) / n


def bare_update(obs_size: int, action_size: int, batch: int, hidden=(256, 256)):
    """(step, carry): a TD3-shaped update on a resident batch, nothing else."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class MLP(nn.Module):
        out: int

        @nn.compact
        def __call__(self, x):
            for h in hidden:
                x = nn.relu(nn.Dense(h)(x))
            return nn.Dense(self.out)(x)

    actor, critic = MLP(action_size), nn.vmap(MLP, variable_axes={"params": 0},
                                             split_rngs={"params": True}, in_axes=None,
                                             axis_size=2)(1)
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    obs = jax.random.normal(k[0], (batch, obs_size))
    act = jax.random.uniform(k[1], (batch, action_size), minval=-1, maxval=1)
    rew = jax.random.uniform(k[2], (batch,))
    x = jnp.concatenate([obs, act], -1)
    pa, pc = actor.init(k[3], obs), critic.init(k[4], x)
    tx = optax.adam(3e-4)

    def step(carry, i):
        pa, pc, ta, tc, oa, oc = carry
        a2 = jnp.tanh(actor.apply(ta, obs))
        y = rew + 0.99 * critic.apply(tc, jnp.concatenate([obs, a2], -1)).min(0)[..., 0]
        lc, gc = jax.value_and_grad(lambda p: ((critic.apply(p, x)[..., 0] - y) ** 2).mean())(pc)
        uc, oc = tx.update(gc, oc)
        pc = optax.apply_updates(pc, uc)
        la, ga = jax.value_and_grad(lambda p: -critic.apply(
            pc, jnp.concatenate([obs, jnp.tanh(actor.apply(p, obs))], -1))[0].mean())(pa)
        ua, oa = tx.update(ga, oa)
        pa = optax.apply_updates(pa, ua)
        polyak = lambda t, p: optax.incremental_update(p, t, 0.005)
        return pa, pc, polyak(ta, pa), polyak(tc, pc), oa, oc

    return step, (pa, pc, pa, pc, tx.init(pa), tx.init(pc))


def update_parts(task: str, batch_sizes: List[int], n: int, repeats: int,
                 quick: bool = False) -> List[Dict]:
    import jax
    import jax.numpy as jnp
    from algos import d4pg
    from common import envs, replay
    env = envs.make(task, "native")
    D, A = env.observation_size, env.action_size
    E = 16 if quick else RECIPE_ENVS
    rows_per_env = (4096 if quick else 1_000_000) // E
    buf = replay.init(rows_per_env, E, D, A, replay.final_slots(rows_per_env, env.episode_length))
    buf = jax.jit(lambda b: replay.synthetic(b, jax.random.PRNGKey(1), env.episode_length))(buf)
    hidden = (16, 16) if quick else (256, 256)
    out = []
    for B in batch_sizes:
        row = {"batch": B}
        step, carry = bare_update(D, A, B, hidden)
        row["mlp"] = scan_timer(step, carry, n, repeats)
        with jax.default_matmul_precision("highest"):
            row["mlp@highest"] = scan_timer(step, carry, n, repeats)

        def sample(c, i):
            b = replay.sample(buf, jax.random.fold_in(jax.random.PRNGKey(2), i), B, 5, 0.99)
            return c + b.obs.sum() + b.next_obs.sum() + b.reward.sum()
        row["sample"] = scan_timer(sample, jnp.zeros(()), n, repeats)
        probs = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(3), (B, 101)))
        reward = jax.random.uniform(jax.random.PRNGKey(4), (B,)) * 10
        for name, dense in (("proj scatter", False), ("proj dense", True)):
            project = lambda c, i, dense=dense: c + d4pg.categorical_projection(
                reward + c, jnp.full((B,), 0.95), probs, 0.0, 100.0, dense=dense)[:, 0].sum()
            row[name] = scan_timer(project, jnp.zeros(()), n, repeats)
        out.append(row)
        print(f"  batch {B}: " + ", ".join(f"{k} {1e3 * v:.3f} ms" for k, v in row.items()
                                           if k != "batch"), flush=True)
    obs = jnp.zeros((E, D))

    def add(b, i):
        return replay.add(b, obs + i, jnp.zeros((E, A)), jnp.zeros(E), jnp.zeros(E, bool),
                          jnp.zeros(E, bool), obs, jnp.ones(E, bool))
    add_s = scan_timer(add, buf, n, repeats)
    for row in out:
        row["add"] = add_s
    return out


def scan_ms(body: Callable, carry, iters: int, repeats: int) -> float:
    """ms per iteration of a jitted scan of `iters` calls of body (carry ->
    carry), the median of `repeats` timed calls after a first (compile)."""
    import jax
    f = jax.jit(lambda c: jax.lax.scan(lambda c, _: (body(c), None), c, None, iters)[0])
    jax.block_until_ready(f(carry))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(carry))
        ts.append((time.perf_counter() - t0) / iters * 1e3)
    return float(np.median(ts))


def group_probe(task: str, env_counts: List[int], repeats: int, groups=(1, 2, 4),
                iters: int = 32) -> None:
    """Prints, per envs count, ms per iteration (median of `repeats` scans of
    `iters`) of the env step alone (zero actions, nothing for the device to
    do meanwhile), the batch handed to the host in `groups` staggered parts
    (Env.step_while's groups; 1: the whole batch in one start and finish).
    Fewer ms with more parts means that the host calls' transfers, not the
    physics, are what an iteration waits for beyond its physics, and that
    staggered groups hide them."""
    import jax
    import jax.numpy as jnp
    from common import envs
    env = envs.make(task, "native")
    print(f"The env step in staggered groups ({task}, {device_line()}), ms per "
          f"iteration:\n\n| envs | " + " | ".join(f"{g} group{'s' * (g > 1)}" for g in groups)
          + " |\n|---:|" + "---:|" * len(groups), flush=True)
    for E in env_counts:
        state = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), E))
        act = jnp.zeros((E, env.action_size))
        ms = [scan_ms(lambda s: env.step_while(s, act, env.pool, lambda x: x, 0.0, groups=g)[0],
                      state, iters, repeats) if E % g == 0 else float("nan") for g in groups]
        print(f"| {E} | " + " | ".join(f"{v:.3f}" for v in ms) + " |", flush=True)


def split_probe(task: str, env_counts: List[int], repeats: int, iters: int = 32) -> None:
    """Prints, per envs count, ms per iteration (median of `repeats` scans of
    `iters`) of: physics (one native step of the batch, zero actions), work
    (a chain of [256, 256] matmuls on the device, sized to take about as long
    as the physics), both in order (the work takes the step's results) and
    both split as --overlap-physics runs them (Env.step_while: the work
    between the step's start and finish). Split near max(physics, work), not
    their sum, means the device computes while the host steps."""
    import jax
    import jax.numpy as jnp
    from common import envs
    env = envs.make(task, "native")
    W = jax.random.normal(jax.random.PRNGKey(1), (256, 256)) / 16

    def work(x, k):
        return jax.lax.fori_loop(0, k, lambda _, x: jnp.tanh(jnp.dot(x, W)), x)

    def timed(body, carry):
        return scan_ms(body, carry, iters, repeats)

    print(f"The env step split around device work ({task}, {device_line()}), ms per "
          f"iteration:\n\n| envs | physics | work | in order | split |\n|---:|---:|---:|---:|---:|",
          flush=True)
    x0 = jax.random.normal(jax.random.PRNGKey(2), (256, 256))
    for E in env_counts:
        state = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), E))
        act = jnp.zeros((E, env.action_size))
        step = jax.vmap(env.step, in_axes=(0, 0, None))
        physics = timed(lambda c: (step(c[0], act, env.pool), c[1]), (state, x0))
        per_k = timed(lambda c: (c[0], work(c[1], 64)), (state, x0)) / 64
        k = max(1, round(physics / per_k))
        ms = dict(physics=physics, work=timed(lambda c: (c[0], work(c[1], k)), (state, x0)))
        def in_order(c):  # the work takes the step's results, so it waits for them
            s = step(c[0], act, env.pool)
            return s, work(c[1] + 0 * s.obs[0, 0], k)
        ms["in order"] = timed(in_order, (state, x0))
        ms["split"] = timed(lambda c: env.step_while(c[0], act, env.pool,
                                                     lambda x: work(x, k), c[1]), (state, x0))
        print(f"| {E} | " + " | ".join(f"{v:.3f}" for v in ms.values()) + " |", flush=True)


def sample_variants(task: str, batch_sizes: List[int], n: int, repeats: int,
                    quick: bool = False) -> None:
    """Prints a table of ms per replay.sample call (5-step windows, a full
    1M-transition buffer of `task`'s shapes) for each form in
    replay.SAMPLERS: each a jitted scan of `n` calls that uses every field of
    the Batch, the forms timed in turn `repeats` times (interleaved, so a
    noisy machine slows them alike), medians."""
    import jax
    import jax.numpy as jnp
    from common import envs, replay
    env = envs.make(task, "native")
    D, A = env.observation_size, env.action_size
    E = 16 if quick else RECIPE_ENVS
    rows_per_env = (4096 if quick else 1_000_000) // E
    buf = replay.init(rows_per_env, E, D, A, replay.final_slots(rows_per_env, env.episode_length))
    buf = jax.jit(lambda b: replay.synthetic(b, jax.random.PRNGKey(1), env.episode_length))(buf)
    names = list(replay.SAMPLERS)
    used = replay.SAMPLER.get(jax.default_backend(), replay.SAMPLER["default"])
    lines = [f"replay.sample forms on {device_line()}: ms per call (median of {repeats}, "
             f"each {n} calls; batch of 5-step windows from {E * rows_per_env:,} transitions, "
             f"{D} obs, {A} actions); `sample` uses {used} here", "",
             "| batch | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    print("\n".join(lines), flush=True)
    for B in batch_sizes:
        fs = {}
        for name in names:
            fn = replay.SAMPLERS[name]

            def scan(bf, c, fn=fn):
                def body(c, i):
                    b = fn(bf, jax.random.fold_in(jax.random.PRNGKey(2), i), B, 5, 0.99)
                    return c + sum(x.sum() for x in b), None
                return jax.lax.scan(body, c, jnp.arange(n))[0]
            fs[name] = jax.jit(scan)
            jax.block_until_ready(fs[name](buf, jnp.zeros(())))
        times = {name: [] for name in names}
        for _ in range(repeats):
            for name in names:
                t0 = time.perf_counter()
                jax.block_until_ready(fs[name](buf, jnp.zeros(())))
                times[name].append((time.perf_counter() - t0) / n)
        print(f"| {B} | " + " | ".join(f"{1e3 * median(times[k]):.3f}" for k in names) + " |",
              flush=True)


def parts_table(rows: List[Dict]) -> str:
    names = [k for k in rows[0] if k != "batch"]
    lines = [f"The update taken apart on {device_line()} (ms per call, median):", "",
             "| batch | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    lines += [f"| {r['batch']} | " + " | ".join(f"{1e3 * r[k]:.3f}" for k in names) + " |"
              for r in rows]
    return "\n".join(lines) + "\n"


def agent_rows(algos, args, iters: int) -> List[Dict]:
    """Each agent's loop at its humanoid recipe, at every --loop-envs x
    --batch-sizes x --loop-ups (the candidates of an accelerator recipe)."""
    from . import train
    rows = []
    for algo in algos:
        spec = train.load_algo(algo).AGENT
        recipe = {k: v for k, v in spec.defaults_for("humanoid_walk").items()
                  if k not in ("num_envs", "updates_per_step", "total_timesteps", "eval_every",
                               "checkpoint_every")}
        if args.quick:
            recipe = dict(hidden_sizes=(16, 16), buffer_size=4096)
        grid = [(16, 16, 0.25)] if args.quick else [
            (n, B, u) for n in args.loop_envs for B in args.batch_sizes for u in args.loop_ups]
        for (n, B, ups), ov in itertools.product(grid, args.loop_overlap):
            task = "cartpole_balance" if args.quick else args.task
            overlap = recipe.get("overlap_physics", False) if ov == "recipe" else ov == "on"
            r = train.loop_efficiency(algo, task, n, ups, iters, args.repeats,
                                      **{**recipe, "batch_size": B, "overlap_physics": overlap})
            rows.append(dict(algo=algo, envs=n, batch=B, ups=ups, overlap=overlap, **r))
            print(f"  {algo} {n} envs batch {B} 1/{round(1 / ups)}"
                  f"{' overlapped' if overlap else ''}: update {r['ms_update']:.3f} "
                  f"ms, acting {1e3 * r['ms_acting']:.1f} us/env step, loop "
                  f"{1e3 * r['ms_loop']:.1f} us/env step", flush=True)
    return rows


KERNEL_KINDS = (  # (kind, what its op names hold), the first that matches
    ("rng", ("threefry", "randint", "random_bits", "random_")),
    ("layer norm", ("LayerNorm",)),
    ("replay gathers", ("gather", "dynamic_slice")),
    ("networks", ("Critic", "Actor", "dot_general")),
    ("optimiser and targets", ("/add", "/mul", "/pow", "/div", "/sqrt", "/sub", "/max")))


def count_kernels(compiled: str) -> Dict[str, int]:
    """The kernels (fusions, matmuls, gathers, copies, ...) of a compiled
    module's text, by KERNEL_KINDS on the ops' names: every computation but
    fusion bodies (whose ops run inside their fusion's kernel), so the entry
    and the bodies of loops and conditionals (a kernel there counts once)."""
    import re
    blocks = re.split(r"\n(?=\S)", compiled)
    kinds = {k: 0 for k, _ in KERNEL_KINDS}
    kinds.update(copies=0, other=0)
    for line in (ln for b in blocks if not b.startswith("%fused") for ln in b.splitlines()):
        op = re.search(r"\s(fusion|convolution|dot|copy|gather|scatter|sort|custom-call|"
                       r"reduce|select-and-scatter|rng-bit-generator)\(", line)
        if not op:
            continue
        name = re.search(r'op_name="([^"]*)"', line)
        name = name.group(1) if name else ""
        kind = "copies" if op.group(1) == "copy" else next(
            (k for k, keys in KERNEL_KINDS if any(x in name for x in keys)), "other")
        kinds[kind] += 1
    return dict(total=sum(kinds.values()), **kinds)


def recipe_config(algo: str, task: str, batch: int, quick: bool, **quick_extra):
    """(module, Config) of one agent at its humanoid recipe with batch `batch`
    and RECIPE_ENVS envs, for timing or compiling its update alone; --quick:
    tiny networks and buffer on 4 envs, plus `quick_extra`."""
    from . import train
    mod = train.load_algo(algo)
    recipe = dict(hidden_sizes=(16, 16), buffer_size=4096, **quick_extra) if quick else \
        mod.AGENT.defaults_for("humanoid_walk")
    recipe = {k: v for k, v in recipe.items() if k not in ("num_envs", "total_timesteps")}
    return train.agent_config(algo, task, 4 if quick else RECIPE_ENVS, 10 ** 6,
                              **{**recipe, "batch_size": batch})


def update_kernels(algo: str, task: str, batch: int, quick: bool) -> Dict:
    """count_kernels of one agent's update at its humanoid recipe, compiled
    for the default device with the state donated, as in a run; algo "bare":
    bare_update's (TD3 shapes, no replay, normalisation or layer norm)."""
    import jax
    import jax.numpy as jnp

    if algo == "bare":
        from common import envs
        env = envs.make(task, "native")
        step, carry = bare_update(env.observation_size, env.action_size, batch,
                                  (16, 16) if quick else (256, 256))
        compiled = jax.jit(step, donate_argnums=0).lower(carry, jnp.int32(0)).compile()
        return dict(algo="bare MLP update", batch=batch, **count_kernels(compiled.as_text()))
    mod, config = recipe_config(algo, task, batch, quick)
    t = mod.make_train(config)
    shapes = jax.eval_shape(t.init, jax.random.PRNGKey(0))
    compiled = jax.jit(t.update, donate_argnums=0).lower(shapes, jnp.int32(0)).compile()
    return dict(algo=algo, batch=batch, **count_kernels(compiled.as_text()))


ABLATIONS = (  # (name, config overrides, replay gathers replaced by one window)
    ("recipe", {}, False),
    ("critic layer norm off", dict(critic_layer_norm=False), False),
    ("observation normalisation off", dict(normalize_obs=False), False),
    ("replay gathers out", {}, True),
    ("all three off", dict(critic_layer_norm=False, normalize_obs=False), True),
)


def bare_ms(task: str, batch: int, n: int, repeats: int, quick: bool = False) -> float:
    """ms per call of bare_update at `task`'s shapes, at the precision runs use."""
    from common import cli, envs
    env = envs.make(task, "native")
    with cli.matmul_precision():
        step, carry = bare_update(env.observation_size, env.action_size, batch,
                                  (16, 16) if quick else (256, 256))
        return 1e3 * scan_timer(step, carry, n, repeats)


def update_ablations(algo: str, task: str, batch: int, n: int, repeats: int,
                     quick: bool = False) -> List[Dict]:
    """ms per call of one agent's update alone (from a full buffer, state
    donated, at the precision runs use) at its humanoid recipe, and with one
    piece taken out at a time (ABLATIONS; "replay gathers out": replay.sample
    gathers one window and broadcasts it to the batch, so the networks see
    the same shapes): what each piece costs inside the compiled update,
    where `update` times it alone."""
    import jax
    import jax.numpy as jnp

    from common import cli, replay
    # --quick: the tiny recipe with every piece on, so every row runs
    mod, base = recipe_config(algo, task, batch, quick, critic_layer_norm=True,
                              normalize_obs=True)
    fields = {f.name for f in dataclasses.fields(mod.Config)}
    gather = replay.sample

    def one_window(buf, key, batch_size, n_step, gamma):
        b = gather(buf, key, 1, n_step, gamma)
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (batch_size,) + x.shape[1:]), b)

    rows = []
    for name, overrides, gathers_out in ABLATIONS:
        overrides = {k: v for k, v in overrides.items() if k in fields and getattr(base, k) != v}
        if name != "recipe" and not overrides and not gathers_out:
            continue  # the agent has no such piece, or its recipe leaves it off
        t = mod.make_train(dataclasses.replace(base, **overrides))
        replay.sample = one_window if gathers_out else gather
        try:
            with cli.matmul_precision():
                state = jax.jit(t.init)(jax.random.PRNGKey(0))
                state = jax.jit(lambda s: s._replace(replay=replay.synthetic(
                    s.replay, jax.random.PRNGKey(1), t.env.episode_length)))(state)
                ms = 1e3 * scan_timer(lambda c, i: t.update(c, i)[0], state, n, repeats,
                                      donate=True)
        finally:
            replay.sample = gather
        rows.append(dict(algo=algo, variant=name, ms=ms))
        print(f"  {algo} batch {batch}, {name}: {ms:.3f} ms/update", flush=True)
    return rows


def ablations_table(rows: List[Dict], batch: int) -> str:
    bare = rows[0]["ms"]
    lines = [f"One update alone on {device_line()}, batch {batch}, with pieces taken out "
             "(ms per call, median):", "", "| update | taken out | ms | x bare |",
             "|---|---|---:|---:|"]
    lines += [f"| {r['algo']} | {r['variant']} | {r['ms']:.3f} | {r['ms'] / bare:.1f} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def kernels_table(rows: List[Dict]) -> str:
    kinds = [k for k, _ in KERNEL_KINDS] + ["copies", "other"]
    lines = [f"Kernels of each agent's compiled update (humanoid recipe), on {device_line()}:",
             "", "| agent | batch | kernels | " + " | ".join(kinds) + " |",
             "|---|---:|---:|" + "---:|" * len(kinds)]
    for r in rows:
        lines.append(f"| {r['algo']} | {r['batch']} | {r['total']} | "
                     + " | ".join(str(r[k]) for k in kinds) + " |")
    return "\n".join(lines) + "\n"


def agents_table(rows: List[Dict]) -> str:
    lines = [f"Each agent at its humanoid recipe (envs, batch and updates per env step as "
             f"given), on {device_line()}:", "",
             "| agent | envs | batch | updates per env step | overlapped | ms/update | "
             "acting us/env step | loop us/env step | env steps/s | update share |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['algo']} | {r['envs']} | {r['batch']} | 1/{round(1 / r['ups'])} | "
                     f"{'yes' if r.get('overlap') else 'no'} | "
                     f"{r['ms_update']:.3f} | {1e3 * r['ms_acting']:.1f} | "
                     f"{1e3 * r['ms_loop']:.1f} | {1e3 / r['ms_loop']:,.0f} | "
                     f"{r['efficiency']:.2f} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- 10-minute runs

# the same file names as the standard benchmark's: <task>__<algo>.json and .policy.npz
def result_path(out: str, task: str, algo: str, suffix: str = ".json") -> str:
    from . import standard
    return standard.result_path(out, task, algo, suffix)


def load(out: str) -> List[Dict]:
    from . import standard
    return standard.load_results(out)


def at_marks(seconds: List[float], values: List[float], steps: List[int], marks=MARKS,
             until: float = float("inf")):
    """The last (value, env steps) at or before each of `marks` minutes (and `until`
    seconds)."""
    out = []
    for m in marks:
        within = [(v, s) for t, v, s in zip(seconds, values, steps) if t <= min(m * 60, until)]
        out.append(within[-1] if within else (None, None))
    return out


def run_marks(r: Dict):
    """A run's (value, env steps) at MARKS. Evaluations logged after the stop
    signal count (they are within the marks, and a run that ignored the signal
    computed them as it would have unsignalled), except in overlapped runs
    (--overlap-physics): the signal broke their last chunk (Q and training
    return fell within seconds) while runs still ignored it, before
    common/cli.Interrupt made every run stop at once on it (2026-12-07)."""
    until = r["minutes"] * 60 if r["config"].get("overlap_physics") else float("inf")
    return at_marks(r["eval_seconds"], r["eval_returns"], r["eval_steps"], until=until)


def stopped_output(cmd: List[str], seconds: float) -> str:
    """The output of `cmd` run for `seconds` (then SIGINT, on which a run closes
    its logs and exits; killed if it has not within 15 s)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        return proc.communicate(timeout=seconds)[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            return proc.communicate(timeout=15)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.communicate()[0]


def profile_run(task: str, algo: str, flags: List[str], at: float, seconds: float, out: str,
                quick: bool) -> str:
    """The agent's command with --flags under $RL_PROFILE (common/cli.Profile),
    stopped once its trace is written; returns trace_summary's text of it
    (the trace itself stays under `out`)."""
    trace_dir = os.path.join(out, "profiles", f"{task}__{algo}__{time.strftime('%Y%m%d-%H%M%S')}")
    cmd = run_command(task, algo, 500_000, flags, QUICK_FLAGS if quick and algo != "ppo" else [])
    env = dict(os.environ, RL_PROFILE=f"{at},{seconds},{trace_dir}")
    proc = subprocess.Popen(cmd + ["--log-dir", os.path.join(out, "profiles", "runs")], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    said = []
    for line in proc.stderr:  # the run says when the trace is written
        if line.startswith("profile: "):
            break
        if line.startswith("split step"):  # $RL_SPLIT_TIMES's lines, if set
            print(line.rstrip(), flush=True)
        said = (said + [line.rstrip()])[-3:]
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    traces = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not traces:
        return (f"{task} {algo}: no trace; the run ended before {at:g} s of running, its "
                f"last words: " + " / ".join(x for x in said if x))
    return f"{shown_command(cmd)}, a {seconds:g} s trace from {at:g} s:\n" + \
        trace_summary(max(traces, key=os.path.getmtime))


def trace_summary(path: str, top: int = 12) -> str:
    """A jax.profiler trace (*.trace.json.gz) read per timeline (process,
    thread): its busy time and its `top` ops by total time (an op's time
    includes the ops nested in it); on a device's op line also the time in
    host-transfer ops (send-done, recv-done: waiting for a host call's
    operands or results), and the period of its longest repeated top-level
    op (a chunk of the run)."""
    import collections
    import gzip
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {(e["pid"], e.get("tid") if e["name"] == "thread_name" else None): e["args"]["name"]
             for e in events if e.get("ph") == "M" and e["name"] in ("process_name", "thread_name")}
    lines = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            key = names.get((e["pid"], None), "?"), names.get((e["pid"], e.get("tid")), "?")
            lines[key].append(e)
    out = []
    for (proc, thread), ops in sorted(lines.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        busy, end, tops = 0.0, -float("inf"), []
        for e in ops:  # merged busy time; the ops not inside another
            if e["ts"] >= end:
                tops.append(e)
            busy += max(0.0, e["ts"] + e["dur"] - max(e["ts"], end))
            end = max(end, e["ts"] + e["dur"])
        span = end - ops[0]["ts"]
        out.append(f"{proc} / {thread}: {len(ops)} ops, busy {busy / 1e3:.1f} of "
                   f"{span / 1e3:.1f} ms")
        total = collections.Counter()
        for e in ops:
            total[e["name"]] += e["dur"]
        count = collections.Counter(e["name"] for e in ops)
        out += [f"  {d / 1e3:9.2f} ms {count[n]:6d}x  {n[:90]}" for n, d in total.most_common(top)]
        if "/device:" in proc and thread == "XLA Ops":
            xfer = sum(d for n, d in total.items() if n.startswith(("send-done", "recv-done")))
            longest = collections.Counter()
            for e in tops:
                longest[e["name"]] += e["dur"]
            line = f"  host-transfer ops {xfer / 1e3:.2f} ms"
            if longest:
                name = longest.most_common(1)[0][0]
                starts = [e["ts"] for e in tops if e["name"] == name]
                if len(starts) > 2:
                    line += (f"; {name} repeats every {np.median(np.diff(starts)) / 1e3:.2f} ms "
                             f"(median of {len(starts) - 1})")
            out.append(line)
            if longest:
                out += chunk_breakdown(ops, [e for e in tops if e["name"] == name])
    return "\n".join(out)


def _scope(e) -> str:
    """An op's place in the program, from its name stack (the trace's
    `tf_op`, where the profiler gives one): the last components that are not
    jit/while/cond/vmap plumbing."""
    stack = str(e.get("args", {}).get("tf_op", ""))
    parts = [p for p in stack.split("/") if p and not re.match(
        r"(jit|pjit|vmap|jvp|transpose|while|body|cond|branch_\d+_fun|checkpoint|remat)\b", p)]
    return "/".join(parts[-3:])


def chunk_breakdown(ops: List[Dict], chunks: List[Dict], top: int = 20) -> List[str]:
    """Where a chunk's time goes on the device: its leaf ops (those with no
    op inside them) summed by kind (the op's name without its number, and
    its scope) per chunk, and the chunk's time in no leaf op (control flow,
    waits between ops)."""
    import collections
    if not chunks:
        return []
    ops = sorted(ops, key=lambda e: (e["ts"], -e["dur"]))
    leaf = [True] * len(ops)
    stack: List[int] = []
    for k, e in enumerate(ops):  # containment: an op inside the one below it on the stack
        while stack and ops[stack[-1]]["ts"] + ops[stack[-1]]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            leaf[stack[-1]] = False
        stack.append(k)
    kinds, covered = collections.Counter(), 0.0
    for c in chunks:
        for k, e in enumerate(ops):
            if leaf[k] and e is not c and c["ts"] <= e["ts"] < c["ts"] + c["dur"]:
                kind = re.sub(r"\.\d+$", "", e["name"])
                kinds[(kind, _scope(e))] += e["dur"]
                covered += e["dur"]
    n, mean = len(chunks), sum(c["dur"] for c in chunks) / len(chunks)
    keys = sorted({k for e in ops for k in e.get("args", {})})[:12]
    lines = [f"  a chunk's leaf ops, ms per chunk (mean over {n}, chunk {mean / 1e3:.2f} ms; "
             f"in no leaf op {(mean - covered / n) / 1e3:.2f} ms; op args: {', '.join(keys)}):"]
    lines += [f"    {d / n / 1e3:8.3f} ms  {kind:28s} {scope[:80]}"
              for (kind, scope), d in kinds.most_common(top)]
    return lines


def run_command(task: str, algo: str, eval_every: int, flags: List[str],
                tiny: List[str]) -> List[str]:
    """The agent's command with --flags (a candidate recipe: part of the command
    the table shows), then the runner's own flags (budget, evaluation, tiny nets:
    not shown), from --total-timesteps on."""
    return [sys.executable, os.path.join(ROOT, "algos", f"{algo}.py"), "--env", task, *flags,
            "--total-timesteps", str(10 ** 9), "--eval-every", str(eval_every),
            "--checkpoint-every", str(4 * eval_every), *tiny]


def shown_command(cmd: List[str]) -> str:
    end = cmd.index("--total-timesteps")
    return " ".join(["python", os.path.relpath(cmd[1], ROOT), *cmd[2:end]])


TRAINING_TAGS = ("losses/", "stats/", "charts/episode_return")


def training_curves(seed_dir: str, tags, points: int = 40) -> Dict[str, Dict[str, list]]:
    """{tag: {steps, values}} of each training metric a seed logged (TRAINING_TAGS),
    thinned to at most `points` chunks: a device run's event files stay on the
    device, and these are what tell why a run did not learn."""
    plot = tool("plot")
    out = {}
    for tag in sorted(t for t in tags if t.startswith(TRAINING_TAGS)):
        series, _ = plot.read_seed(seed_dir, tag)
        keep = sorted(set(np.linspace(0, len(series.steps) - 1, points).round().astype(int))) \
            if len(series.steps) else []
        out[tag] = dict(steps=[int(series.steps[k]) for k in keep],
                        values=[float(series.values[k]) for k in keep])
    return out


def timed_run(task: str, algo: str, out: str, minutes: float, eval_every: int,
              flags: List[str], quick: bool) -> Dict:
    """The agent's command (with --flags, if given), stopped `minutes` after its
    process started (SIGINT: the run closes its logs and keeps its last checkpoint)."""
    from . import standard
    log_dir = os.path.join(ROOT, "bench", "accelerator_runs", f"{task}__{algo}")
    tiny = QUICK_FLAGS if quick and algo != "ppo" else []
    cmd = run_command(task, algo, eval_every, flags, tiny)
    t0 = time.time()
    text = stopped_output(cmd + ["--log-dir", log_dir], minutes * 60)
    wall = time.time() - t0
    run_dir = sorted(glob.glob(os.path.join(log_dir, "*")), key=os.path.getmtime)[-1]
    plot = tool("plot")
    seed = sorted(glob.glob(os.path.join(run_dir, "seed_*")))[0]
    ev, tags = plot.read_seed(seed, "eval/episode_return")
    sps, _ = plot.read_seed(seed, "charts/sps")
    first = min([t for t in list(sps.times) if t > 0] or [float("nan")])
    # the writers' clocks start when the run directory is made: shift them to process start
    t_open = os.path.getctime(os.path.join(run_dir, "config.json")) - t0
    seconds = [float(t) + t_open for t in ev.times]  # since the process started
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    result = dict(
        task=task, algo=algo, minutes=minutes, command=shown_command(cmd),
        runner_flags=" ".join(cmd[cmd.index("--total-timesteps"):]), config=config,
        eval_steps=[int(s) for s in ev.steps], eval_returns=[float(v) for v in ev.values],
        eval_seconds=seconds, mark_minutes=list(MARKS),
        first_log_s=float(first) + t_open, wall_s=wall, training=training_curves(seed, tags),
        sps=float(np.median(sps.values[len(sps.values) // 2:])) if len(sps.values) else None,
        first_lines=[ln for ln in text.splitlines()
                     if ln.strip() and "\r" not in ln and "GLFW" not in ln
                     and "warnings.warn" not in ln][:4],
        machine=device_line(), commit=git_commit(), date=time.strftime("%Y-%m-%d"))
    marks = run_marks(result)
    result.update(marks=[v for v, _ in marks], mark_steps=[s for _, s in marks])
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(run_dir, "checkpoint.npz")
    if os.path.exists(ckpt):
        np.savez_compressed(result_path(out, task, algo, ".policy.npz"),
                            **standard.policy_leaves(ckpt))
    write_json(result_path(out, task, algo), result)
    return result


PROGRESS = re.compile(r"(\d+)/\d+ steps\s+(\d+) steps/s")


def last_progress(text: str):
    """(env steps per seed, env steps/s per seed) of the last progress line
    in a run's output (None: it logged no chunk)."""
    found = PROGRESS.findall(text)
    return (int(found[-1][0]), float(found[-1][1])) if found else None


def seeds_scaling(task: str, algo: str, counts: List[int], minutes: float, flags: List[str],
                  quick: bool) -> Dict:
    """The agent's command with --num-seeds N for each N in `counts`, each
    stopped after `minutes`: env steps/s per seed and in all."""
    tiny = QUICK_FLAGS if quick and algo != "ppo" else []
    rows = []
    for n in counts:
        log_dir = os.path.join(ROOT, "bench", "accelerator_seeds", f"{task}__{algo}__{n}")
        cmd = [sys.executable, os.path.join(ROOT, "algos", f"{algo}.py"), "--env", task,
               "--num-seeds", str(n), "--total-timesteps", str(10 ** 9), "--eval-every", "0",
               "--checkpoint-every", "0", *tiny, *flags, "--log-dir", log_dir]
        progress = last_progress(stopped_output(cmd, minutes * 60))
        if progress is None:
            raise RuntimeError(f"{' '.join(cmd)} logged no chunk in {minutes:g} minutes")
        steps, sps = progress
        rows.append(dict(seeds=n, steps_per_seed=steps, sps_per_seed=sps, sps_total=n * sps))
    for r in rows:
        r["scaling"] = r["sps_total"] / rows[0]["sps_total"]
    return dict(task=task, algo=algo, minutes=minutes, flags=" ".join(flags), rows=rows,
                machine=device_line(), commit=git_commit(), date=time.strftime("%Y-%m-%d"))


def seeds_table(r: Dict) -> str:
    lines = [f"{r['algo']} on {r['task']}, several seeds in one program, on {r['machine']}:", "",
             "| seeds | env steps per seed | env steps/s per seed | env steps/s in all | "
             f"x {r['rows'][0]['seeds']} seed(s) |", "|---:|---:|---:|---:|---:|"]
    for row in r["rows"]:
        lines.append(f"| {row['seeds']} | {row['steps_per_seed']:,} | {row['sps_per_seed']:,.0f} | "
                     f"{row['sps_total']:,.0f} | {row['scaling']:.2f} |")
    return "\n".join(lines) + "\n"


def write_table(rows: List[Dict], out: str) -> str:
    lines = ["# The accelerator benchmark", "",
             "Each agent's own command (no flag, unless the command shows a candidate recipe's), "
             "started in a fresh process and stopped "
             "`--minutes` after it started (`stop`), compile included; the last evaluation "
             "return (10 held-out episodes) logged within 2.5, 5 and 10 minutes of the start, "
             "env steps in brackets (a run stopped before 10 minutes, as a device command "
             "must be, shows its last evaluation under 10 min; an overlapped run's evaluations "
             "after its stop signal are not read, see `run_marks`). Regenerate with "
             "`python scripts/benchmark.py accelerator report`.", "",
             "| task | command | machine | env steps/s | first log (s) | stop (min) | "
             "2.5 min | 5 min | 10 min |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        marks = run_marks(r)
        cell = lambda v, s: "" if v is None else f"{v:.0f} ({s / 1e6:.1f}M)"
        lines.append(f"| {r['task']} | `{r['command']}` | {r['machine']} | {r['sps'] or 0:,.0f} | "
                     f"{r['first_log_s']:.0f} | {r['minutes']:g} | "
                     + " | ".join(cell(v, s) for v, s in marks) + " |")
    text = "\n".join(lines) + "\n"
    if rows:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "table.md"), "w") as f:
            f.write(text)
    return text

