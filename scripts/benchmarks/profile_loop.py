"""Where an off-policy agent's loop spends time beyond its update floor.

    python scripts/benchmark.py profile sac cheetah_run [--iters 300 --repeats 7]

Two checks, at 1 env and 1 update per env step from a replay buffer filled
to capacity (the setup of `benchmark.py train`'s loop efficiency):
1. XLA's optimised HLO of the scanned loop: every op whose result is at
   least as large as a replay column, by kind. In-place writes show up as
   dynamic-update-slice fusions; a `copy` of that size would be a buffer
   copied through the scan or the learning `cond`.
2. Interleaved timings (medians) of the loop as written and of variants
   with the learning `cond` removed (update every iteration) and with the
   per-step metrics dropped: what that plumbing costs.
The variants are made by editing the agent's source text in memory; the
file on disk is not touched.
"""
from __future__ import annotations

import collections
import importlib.util
import os
import re
import sys
import time

import numpy as np

from common.errors import UserError

from .train import agent_config
from .util import ROOT

HELP = "where an off-policy agent's loop spends time beyond its update (HLO, timings)"
DOC = __doc__
OFF_POLICY = ("ddpg", "td3", "d4pg", "td4", "sac", "mpo")
COND = "agent.step_and_learn(env, state, action, learn, due,"
METRICS = "return state, {**metrics, **agent.episode_metrics(next_state)}"


def variants(src: str):
    no_cond = src.replace(COND, COND.replace("due,", "None,"))
    return {"as written": src, "no cond": no_cond,
            "no metrics": src.replace(METRICS, "return state, {}"),
            "no cond, no metrics": no_cond.replace(METRICS, "return state, {}")}


def compiled_loop(algo: str, env: str, src: str, iters: int, tag: int):
    import jax
    import jax.numpy as jnp
    from common import replay
    name = f"_profiled_{algo}_{tag}"  # registered: dataclasses look their module up
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    sys.modules[name] = mod
    mod.__file__ = os.path.join(ROOT, "algos", f"{algo}.py")
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    base = agent_config(algo, env, 1, 10 * iters + 10 ** 6, learning_starts=iters,
                        updates_per_step=1.0)[1]
    config = mod.Config(**{k: getattr(base, k) for k in base.__dataclass_fields__})
    train = mod.make_train(config)
    state = jax.jit(train.init)(jax.random.PRNGKey(0))
    fill = jax.jit(lambda s, k: s._replace(
        replay=replay.synthetic(s.replay, k, train.env.episode_length)))
    state = fill(state, jax.random.PRNGKey(1))
    fn = jax.jit(lambda s: jax.lax.scan(train.iteration, s, iters + jnp.arange(iters))[0],
                 donate_argnums=0).lower(state).compile()
    return fn, jax.block_until_ready(fn(state)), config.buffer_size


def big_ops(hlo: str, rows: int):
    """(op kind, dtype, shape) -> count, for results with >= `rows` elements."""
    found = collections.Counter()
    for m in re.finditer(r"= (\w+)\[([\d,]*)\]\S* (copy|fusion|dynamic-update-slice)\(", hlo):
        n = int(np.prod([int(d) for d in m.group(2).split(",") if d]))
        if n >= rows:
            found[(m.group(3), m.group(1), m.group(2))] += 1
    return found


def profile(algo: str, env: str, iters: int = 300, repeats: int = 7):
    import jax
    if algo not in OFF_POLICY:
        raise UserError(f"{algo!r} is not one of the off-policy agents {', '.join(OFF_POLICY)}")
    src = open(os.path.join(ROOT, "algos", f"{algo}.py")).read()
    runs = {}
    for tag, (name, code) in enumerate(variants(src).items()):
        if name != "as written" and code == src:
            raise UserError(f"{algo}.py has no `{COND}` or `{METRICS}` line to vary")
        fn, state, rows = compiled_loop(algo, env, code, iters, tag)
        runs[name] = [fn, state]
        if name == "as written":
            print(f"{algo} {env}: ops of replay-column size or more ({rows} rows) in the loop:")
            for (kind, dtype, shape), n in sorted(big_ops(fn.as_text(), rows).items()):
                print(f"  {n} x {kind} {dtype}[{shape}]")
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (fn, state) in runs.items():
            t0 = time.perf_counter()
            runs[name][1] = jax.block_until_ready(fn(state))
            times[name].append(time.perf_counter() - t0)
    for name, t in times.items():
        print(f"  {name:20s} {1e3 * np.median(t) / iters:.3f} ms per env step "
              f"(range {1e3 * min(t) / iters:.3f}-{1e3 * max(t) / iters:.3f})")


def add_arguments(parser) -> None:
    parser.add_argument("algo", help="an off-policy agent: " + ", ".join(OFF_POLICY))
    parser.add_argument("task", help="a task, e.g. cheetah_run")
    parser.add_argument("--iters", type=int, default=300, help="loop iterations per timing")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timings per variant")


def run(args) -> int:
    if args.iters < 1 or args.repeats < 1:
        raise UserError("--iters and --repeats must be positive")
    profile(args.algo, args.task, args.iters, args.repeats)
    return 0
