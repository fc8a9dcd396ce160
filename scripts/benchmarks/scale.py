"""`scale` mode: N seeds vmapped in one program against N sequential single-seed runs.

`seeds_vs_sequential` times the run program only: compilation and the
initial states are excluded for both sides (each side's program is compiled
ahead of time, once; the sequential side runs its one compiled single-seed
program N times). No logging or checkpoint callbacks. ratio = sequential /
vmapped: how many times faster one vmapped program is than N runs in a row.
The mode reports it for one off-policy agent (TD3) and PPO.
"""
from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Optional

import numpy as np

HELP = "N seeds vmapped in one program vs N sequential runs"
DOC = """`scale` mode: wall-clock of N seeds vmapped in one compiled program
against N sequential single-seed runs of the same program size, for TD3
(1 env, 1 update per step) and PPO (its default config), compile excluded
for both (scripts/benchmarks/scale.py)."""

SETTINGS = {  # algo: (full overrides, quick overrides)
    "td3": (dict(total_timesteps=4000, learning_starts=1000),
            dict(total_timesteps=1000, learning_starts=500, hidden_sizes=(16, 16), batch_size=32)),
    "ppo": (dict(total_timesteps=1024 * 30 * 3, num_envs=1024),
            dict(total_timesteps=64 * 30 * 2, num_envs=64, actor_hidden_sizes=(8,),
                 critic_hidden_sizes=(8,))),
}


def add_arguments(sc) -> None:
    sc.add_argument("--num-seeds", type=int, default=8)
    sc.add_argument("--task", default="cheetah_run")
    sc.add_argument("--quick", action="store_true",
                    help="smoke check: 2 seeds, tiny, cartpole_balance")


def run(args) -> int:
    n = 2 if args.quick else args.num_seeds
    task = "cartpole_balance" if args.quick else args.task
    rows = []
    for algo, (full, quick) in SETTINGS.items():
        r = seeds_vs_sequential(algo, task, num_seeds=n, **(quick if args.quick else full))
        rows.append((algo, r))
    print(f"\nseeds in one program vs sequential runs ({n} seeds, {task}, compile and initial "
          f"states excluded)")
    print(f"{'agent':<6} {'steps/seed':>10} {'vmapped s':>10} {'sequential s':>13} {'ratio':>6}")
    for algo, r in rows:
        print(f"{algo:<6} {r['total_timesteps']:>10} {r['vmapped_s']:>10.1f} "
              f"{r['sequential_s']:>13.1f} {r['ratio']:>5.2f}x")
    return 0


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
    import jax
    from common import parallel
    train = module.make_train(config)
    init, run_members = parallel.compile_members(train, None)
    n = config.num_seeds
    total, compiled = 0.0, None
    for start in members[::n]:
        sl = slice(start, start + n)
        states = jax.block_until_ready(init(keys[sl], jax.tree.map(lambda x: x[sl], hps)))
        index = np.arange(start, start + n, dtype=np.int32)
        if compiled is None:
            compiled = run_members.lower(states, 0, index).compile()
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
    import jax
    from common import sweep
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
