"""N seeds vmapped in one program against N sequential single-seed runs.

    python scripts/bench_scale.py --algo td3 --env cartpole_balance --num-seeds 8

`seeds_vs_sequential` times the run program only: compilation and the
initial states are excluded for both sides (each side's program is compiled
ahead of time, once; the sequential side runs its one compiled single-seed
program N times). No logging or checkpoint callbacks. ratio = sequential /
vmapped: how many times faster one vmapped program is than N runs in a row.
scripts/benchmark.py reports it for one off-policy agent and PPO.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np

from common import parallel, sweep


def bench_config(algo: str, env: str, num_seeds: int, total_timesteps: Optional[int], **overrides):
    """The agent's defaults, made benchmark-sized: evaluation and checkpoint
    only at the end (one episode), replay no bigger than the run, learning
    from a quarter of the run; `overrides` win. total_timesteps None: 20k
    steps for an off-policy agent, two rollouts for PPO."""
    module = importlib.import_module(f"algos.{algo}")
    fields = {f.name: f.default for f in dataclasses.fields(module.Config)}
    fields.update(overrides)
    if total_timesteps is None:
        total_timesteps = (2 * fields["num_envs"] * fields["num_steps"] if "num_steps" in fields
                           else 20_000)
    base = dict(env=env, backend="native", num_seeds=num_seeds, total_timesteps=total_timesteps,
                eval_every=0, eval_episodes=1, checkpoint_every=0)
    if "buffer_size" in fields:
        base["buffer_size"] = min(fields["buffer_size"], total_timesteps)
    if "learning_starts" in fields:
        base["learning_starts"] = min(fields["learning_starts"], total_timesteps // 4)
    base.update(overrides)
    return module, module.Config(**base)


def _time_members(module, config, members: range, keys, hps) -> float:
    """Seconds the compiled run takes for `members`, one program call each
    group (compile and init excluded)."""
    train = module.make_train(config)
    init, run = parallel.compile_members(train, None)
    n = config.num_seeds
    total, compiled = 0.0, None
    for start in members[::n]:
        sl = slice(start, start + n)
        states = jax.block_until_ready(init(keys[sl], jax.tree.map(lambda x: x[sl], hps)))
        index = np.arange(start, start + n, dtype=np.int32)
        if compiled is None:
            compiled = run.lower(states, 0, index).compile()
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(states, 0, index))
        total += time.perf_counter() - t0
    return total


def seeds_vs_sequential(algo: str, env: str, num_seeds: int = 8,
                        total_timesteps: Optional[int] = None, **config_overrides) -> dict:
    """Wall-clock of `num_seeds` seeds vmapped in one program vs the same
    seeds as sequential single-seed runs (same keys and hyperparameters),
    compilation and initial states excluded for both; ratio = sequential /
    vmapped."""
    module, config = bench_config(algo, env, num_seeds, total_timesteps, **config_overrides)
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(config.seed), num_seeds))
    hps, _ = sweep.member_hparams(config, [], module.AGENT.hparams, num_seeds)
    vmapped = _time_members(module, config, range(num_seeds), keys, hps)
    sequential = _time_members(module, dataclasses.replace(config, num_seeds=1), range(num_seeds),
                               keys, hps)
    steps = num_seeds * config.total_timesteps
    return dict(algo=algo, env=env, num_seeds=num_seeds, total_timesteps=config.total_timesteps,
                vmapped_s=vmapped, sequential_s=sequential, ratio=sequential / vmapped,
                vmapped_steps_per_s=steps / vmapped, sequential_steps_per_s=steps / sequential,
                note="compile and initial states excluded for both")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", default="td3")
    p.add_argument("--env", default="cartpole_balance")
    p.add_argument("--num-seeds", type=int, default=8)
    p.add_argument("--total-timesteps", type=int, default=None,
                   help="per seed (default: 20000 off-policy, two rollouts for PPO)")
    args = p.parse_args(argv)
    r = seeds_vs_sequential(args.algo, args.env, args.num_seeds, args.total_timesteps)
    print(f"{r['algo']} on {r['env']}, {r['num_seeds']} seeds x {r['total_timesteps']} steps: "
          f"vmapped {r['vmapped_s']:.2f}s ({r['vmapped_steps_per_s']:.0f} steps/s), sequential "
          f"{r['sequential_s']:.2f}s ({r['sequential_steps_per_s']:.0f} steps/s), ratio "
          f"{r['ratio']:.2f}x ({r['note']})")
    return r


if __name__ == "__main__":
    main()
