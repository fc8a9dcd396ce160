"""Throughput benchmarks, each printed next to a reference measured in the same run.

    python scripts/benchmark.py envs              # env steps/s: raw MuJoCo vs native vs mjx
    python scripts/benchmark.py envs --quick      # a smoke check in well under a minute

`envs` mode, per task and batch size, in env (control) steps per second:

* raw     `mujoco.rollout.rollout` stepping the same batch from the same
          states with MuJoCo's own thread pool (one thread per core) and no
          JAX: n_sub_steps physics steps per control step, random controls.
          The physical limit of this machine.
* native  `envs.make(task, "native")` inside `jax.jit`: `lax.scan` over
          control steps of a vmapped `env.step` with auto-reset, random
          actions drawn in JAX.
* mjx     the same program on the `mjx` backend on the default JAX device. On
          a CPU MJX is 50-100x slower than native (and a jitted call at 1024
          envs has hung there), so it runs a smaller batch (`--mjx-envs`) for
          fewer steps; `--skip-mjx` leaves it out.

Timed calls are interleaved (raw, native, mjx, raw, ...) after a compiling
warm-up, so that load from other processes hits all of them alike; the table
shows medians over `--repeats` and the median of the per-repeat ratios.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _median(xs: List[float]) -> float:
    import numpy as np
    return float(np.median(xs)) if xs else float("nan")


# --- envs mode ----------------------------------------------------------------

class RawRollout:
    """`n` simulations of `env`'s model, stepped by `mujoco.rollout.rollout`
    from the given carried states; continues from where the last call ended."""

    def __init__(self, env, states, nthread: int, chunk: int, seed: int = 0):
        import mujoco
        import numpy as np
        from common.envs.native import CARRIED_SPEC, decode

        m = env.model
        self.model, self.n_sub_steps = m, env.n_sub_steps
        rows = decode(np.asarray(states.physics)).reshape(-1, env.native.nstate)
        self.n = rows.shape[0]
        full = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
        d = mujoco.MjData(m)
        self.state = np.zeros((self.n, mujoco.mj_stateSize(m, full)))
        self.warmstart = np.zeros((self.n, m.nv))
        for i, row in enumerate(rows):
            mujoco.mj_setState(m, d, row, CARRIED_SPEC)
            mujoco.mj_getState(m, d, self.state[i], full)
            self.warmstart[i] = d.qacc_warmstart
        self.datas = [mujoco.MjData(m) for _ in range(nthread)]
        self.chunk = chunk  # control steps per rollout call (bounds the output buffers)
        rng = np.random.default_rng(seed)
        lo, hi = m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]
        u = rng.uniform(-1, 1, (self.n, chunk, m.nu))
        u = np.where(m.actuator_ctrllimited.astype(bool), np.clip(u, lo, hi), u)
        self.control = np.repeat(u, self.n_sub_steps, axis=1)  # held for a control step
        nstep = chunk * self.n_sub_steps
        self.out_state = np.empty((self.n, nstep, self.state.shape[1]))
        self.out_sensor = np.empty((self.n, nstep, m.nsensordata))

    def run(self, steps: int) -> None:
        from mujoco import rollout
        done = 0
        while done < steps:
            k = min(self.chunk, steps - done)
            nstep = k * self.n_sub_steps
            rollout.rollout(self.model, self.datas, self.state, self.control[:, :nstep],
                            initial_warmstart=self.warmstart, nstep=nstep,
                            state=self.out_state[:, :nstep], sensordata=self.out_sensor[:, :nstep],
                            persistent_pool=True)
            self.state = self.out_state[:, nstep - 1].copy()
            self.warmstart = None
            done += k


class JaxRollout:
    """`steps` control steps of a vmapped env.step with random actions, as one
    jitted lax.scan; continues from where the last call ended."""

    def __init__(self, env, n: int, steps: int, seed: int = 0):
        import jax

        def run(states, key):
            def body(carry, _):
                s, k = carry
                k, sub = jax.random.split(k)
                a = jax.random.uniform(sub, (n, env.action_size), minval=-1.0, maxval=1.0)
                return (jax.vmap(env.step)(s, a), k), None
            return jax.lax.scan(body, (states, key), None, length=steps)[0]

        self.env, self.steps = env, steps
        self._run = jax.jit(run)
        keys = jax.random.split(jax.random.PRNGKey(seed), n)
        self.carry = (jax.jit(jax.vmap(env.reset))(keys), jax.random.PRNGKey(seed + 1))

    def run(self) -> None:
        import jax
        self.carry = jax.block_until_ready(self._run(*self.carry))


def _timed(fn: Callable[[], None], times: int = 1) -> float:
    return _timed_cpu(fn, times)[0]


def _timed_cpu(fn: Callable[[], None], times: int = 1) -> Tuple[float, float]:
    """Wall-clock and process CPU seconds (all threads) of `times` calls."""
    t, c = time.perf_counter(), time.process_time()
    for _ in range(times):
        fn()
    return time.perf_counter() - t, time.process_time() - c


def _calls_for(fn: Callable[[], None], min_time: float) -> int:
    """How many calls of a warmed-up `fn` take about `min_time` seconds."""
    return max(1, math.ceil(min_time / max(_timed(fn), 1e-9)))


def bench_envs(args) -> int:
    import jax
    import numpy as np
    from common import envs
    from common.envs.native import default_threads

    nthread = args.nthread or default_threads()
    print(f"envs benchmark: JAX {jax.__version__} on {jax.default_backend()} "
          f"({jax.devices()[0].device_kind}); {nthread} threads for MuJoCo; "
          f"{args.steps} control steps per call; median of {args.repeats} timed repeats "
          f"of at least {args.min_time:g}s each")
    if args.skip_mjx:
        print("mjx: skipped (--skip-mjx)")
    else:
        print(f"mjx: at most {args.mjx_envs} envs and {args.mjx_steps} steps per call "
              f"(MJX on a CPU is 50-100x slower than native and takes minutes to compile; "
              f"--skip-mjx leaves it out)")
    rows, mjx_cache = [], {}
    for task in args.tasks:
        for n in args.num_envs:
            env = envs.make(task, "native", pool_size=min(n, args.pool_size), nthread=nthread)
            native = JaxRollout(env, n, args.steps, seed=args.seed)
            raw = RawRollout(env, native.carry[0], nthread, chunk=min(args.steps, 10),
                             seed=args.seed)
            n_mjx = min(n, args.mjx_envs)
            mjx, mjx_note = None, "skipped"
            if not args.skip_mjx:
                if (task, n_mjx) not in mjx_cache:
                    try:
                        env_mjx = envs.make(task, "mjx", pool_size=min(n_mjx, args.pool_size))
                        mjx = JaxRollout(env_mjx, n_mjx, args.mjx_steps, seed=args.seed)
                        mjx.compile_time = _timed(mjx.run)
                    except Exception as e:  # report it and go on: the other columns stand
                        mjx = f"failed: {type(e).__name__}: {' '.join(str(e).split())[:60]}"
                    mjx_cache[task, n_mjx] = mjx
                mjx = mjx_cache[task, n_mjx]
                if isinstance(mjx, str):
                    mjx, mjx_note = None, mjx
            # warm-up: compile, move off the reset states into mid-episode, and
            # size each timed repeat to last at least --min-time
            t_compile = _timed(native.run)
            k_nat = _calls_for(native.run, args.min_time)
            k_raw = _calls_for(lambda: raw.run(args.steps), args.min_time)
            t_raw, t_nat, t_mjx, ratio, cpu_ratio = [], [], [], [], []
            for _ in range(args.repeats):  # interleaved, so that load hits all alike
                w_raw, c_raw = _timed_cpu(lambda: raw.run(args.steps), k_raw)
                w_nat, c_nat = _timed_cpu(native.run, k_nat)
                t_raw.append(w_raw / k_raw)
                t_nat.append(w_nat / k_nat)
                ratio.append(t_raw[-1] / t_nat[-1])
                cpu_ratio.append((c_raw / k_raw) / max(c_nat / k_nat, 1e-9))
                if mjx is not None:
                    t_mjx.append(_timed(mjx.run))
            sps = lambda ts, n_, steps: n_ * steps / _median(ts)
            row = dict(task=task, n=n, raw=sps(t_raw, n, args.steps),
                       native=sps(t_nat, n, args.steps), ratio=_median(ratio),
                       cpu_ratio=_median(cpu_ratio), compile=t_compile)
            if mjx is not None:
                row["mjx"] = sps(t_mjx, n_mjx, args.mjx_steps)
                mjx_note = f"{row['mjx']:.0f} ({n_mjx} envs)"
            row["mjx_note"] = mjx_note
            rows.append(row)
            nonfinite = int(np.asarray(native.carry[0].info["nonfinite"]).sum())
            print(f"  {task} x{n}: raw {row['raw']:.0f}/s, native {row['native']:.0f}/s "
                  f"(ratio {row['ratio']:.2f}, per CPU-second {row['cpu_ratio']:.2f}; "
                  f"first call with compile {t_compile:.1f}s; "
                  f"{nonfinite} non-finite resets), mjx {mjx_note}", flush=True)
    _print_table(rows, nthread)
    return 0


def _print_table(rows: List[Dict], nthread: int) -> None:
    head = (f"{'task':<16} {'envs':>5} {'raw rollout':>12} {'native':>10} {'native/raw':>10} "
            f"{'(CPU-time)':>10}  {'mjx':<24}")
    print()
    print("env steps/s (control steps; raw = mujoco.rollout on "
          f"{nthread} threads, no JAX: this machine's limit)")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['task']:<16} {r['n']:>5} {r['raw']:>12.0f} {r['native']:>10.0f} "
              f"{r['ratio']:>10.2f} {r['cpu_ratio']:>10.2f}  {r['mjx_note']:<24}")
    print("native/raw: wall-clock ratio, median over interleaved repeats; (CPU-time): the same "
          "per CPU-second used, which load from other processes hardly moves")


# --- command line ------------------------------------------------------------

TRAIN_DOC = """`train` mode: env steps/s of whole training runs (compile excluded), per agent
and task, next to references measured in the same run:

* TD3 and SAC written the usual way (CleanRL style): the dm_control env
  stepped from Python, a numpy replay buffer and one jitted update per env
  step, with the same networks ([256, 256]) and batch (256). Each off-policy
  agent runs at that setting (1 env, 1 update per env step) and at 256 envs
  with 1 update per 16 env steps; its ratio is against the reference of its
  family (TD3 for DDPG/D4PG/TD3/TD4, SAC for SAC/MPO), and ms/update is the
  wall-clock per gradient update, env steps included.
* PPO with its default config at 1024 envs on the native backend, beside raw
  `mujoco.rollout` physics on the same batch (the machine's limit), and on
  mjx for cheetah_run.
With --budget, a last row per agent trains for about that many seconds at
1 env and reports the final evaluation return (10 episodes).

Then the loop-efficiency table (scripts/bench_train.py: loop_efficiency), per
off-policy agent and task, at 1 env with 1 update per env step and at 16
envs with 1 update per iteration, through the agent protocol
(Train.iteration, Train.update): the acting cost per env step, the agent's
update alone (its floor, scanned over a replay buffer filled to capacity)
and the whole loop from that same buffer; efficiency = floor / loop. Below
it, the update-cost ratios D4PG/TD3, TD4/TD3 and MPO/SAC at 1 env."""

LEARN_DOC = """`learn` mode: the final evaluation return (10 deterministic episodes) of
every agent on cheetah_run, walker_walk and cartpole_swingup, 3 seeds vmapped
in one program per agent and task, each agent's default config with a budget
of env steps per seed chosen so that one run takes about 5 minutes of
training on one core of a 2-core CPU (scripts/bench_learn.py: BUDGET; with
compile and two runs at a time, one per core (--jobs), 6-7.5 minutes here),
and the eval return each run had after 4 minutes of wall-clock (the fixed
wall-clock comparison, from its curve). Each run is the agent's own
command, so its TensorBoard logs and checkpoint land in <out>/runs/;
<out>/learn.json collects results as they finish, and a rerun resumes."""

FULL_DOC = """`full` mode: the README's numbers in one command. Runs, in order, `envs`,
`train`, the seeds-in-one-program vs sequential comparison (`scale`) and
`learn`, writing each part's output under --out and, at the end,
<out>/results.md (machine, commit, tables, figures). Prints the expected
duration first. A part that finished is not rerun: rerun the same command
to resume a half-finished benchmark (the learning table resumes run by run)."""

SCALE_DOC = """`scale` mode: wall-clock of N seeds vmapped in one compiled program
against N sequential single-seed runs of the same program size, for TD3
(1 env, 1 update per step) and PPO (its default config), compile excluded
for both (scripts/bench_scale.py)."""

SCALE_SETTINGS = {  # algo: (full overrides, quick overrides)
    "td3": (dict(total_timesteps=4000, learning_starts=1000),
            dict(total_timesteps=1000, learning_starts=500, hidden_sizes=(16, 16), batch_size=32)),
    "ppo": (dict(total_timesteps=1024 * 30 * 3, num_envs=1024),
            dict(total_timesteps=64 * 30 * 2, num_envs=64, actor_hidden_sizes=(8,),
                 critic_hidden_sizes=(8,))),
}


def scale_mode(args) -> int:
    import bench_scale
    n = 2 if args.quick else args.num_seeds
    task = "cartpole_balance" if args.quick else args.task
    rows = []
    for algo, (full, quick) in SCALE_SETTINGS.items():
        r = bench_scale.seeds_vs_sequential(algo, task, num_seeds=n,
                                            **(quick if args.quick else full))
        rows.append((algo, r))
    print(f"\nseeds in one program vs sequential runs ({n} seeds, {task}, compile and initial "
          f"states excluded)")
    print(f"{'agent':<6} {'steps/seed':>10} {'vmapped s':>10} {'sequential s':>13} {'ratio':>6}")
    for algo, r in rows:
        print(f"{algo:<6} {r['total_timesteps']:>10} {r['vmapped_s']:>10.1f} "
              f"{r['sequential_s']:>13.1f} {r['ratio']:>5.2f}x")
    return 0


FULL_PARTS = (  # name, arguments, arguments in quick mode, expected minutes (full, quick)
    ("envs", ["envs"], ["envs", "--quick"], 3, 0.5),
    ("train", ["train", "--steps-1env", "2000", "--steps-many", "25600"],
     ["train", "--quick", "--algos", "td3", "ppo"], 28, 2),
    ("scale", ["scale"], ["scale", "--quick"], 7, 1),
)


def _git_commit() -> str:
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                       cwd=root)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, cwd=root)
    return (r.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty.stdout.strip()
                                              else "")


def _machine() -> str:
    import platform
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import jax
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM; JAX {jax.__version__} on "
            f"{jax.default_backend()}, Python {platform.python_version()}")


def full_mode(out: str, quick: bool, jobs: int = 2) -> int:
    import subprocess
    import bench_learn
    os.makedirs(out, exist_ok=True)
    learn_left = len(bench_learn.plan(out, quick)[0])
    todo = [p for p in FULL_PARTS if not _part_done(out, p[0])]
    parallel = max(1, min(jobs, len(os.sched_getaffinity(0)), learn_left))
    minutes = sum(p[4 if quick else 3] for p in todo) + (
        (0.5 if quick else bench_learn.EST_SECONDS / 60) * learn_left / parallel)
    print(f"full benchmark{' (quick)' if quick else ''} into {out}/: about {minutes:.0f} minutes "
          f"({', '.join(p[0] for p in todo) or 'no'} part(s) left, then learn: {learn_left} "
          f"run(s) left); rerun the same command to resume", flush=True)
    for name, full_args, quick_args, _, _ in todo:
        t0 = time.time()
        args = [sys.executable, os.path.abspath(__file__), *(quick_args if quick else full_args)]
        print(f"== {name}: {' '.join(args[1:])}", flush=True)
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout[-3000:] + r.stderr[-3000:])
            raise SystemExit(f"benchmark part {name!r} failed (rerun to resume)")
        with open(os.path.join(out, f"{name}.txt.tmp"), "w") as fh:
            fh.write(r.stdout)
        os.replace(os.path.join(out, f"{name}.txt.tmp"), os.path.join(out, f"{name}.txt"))
        print(_table_of(r.stdout) + f"\n({time.time() - t0:.0f}s)", flush=True)
    print("== learn", flush=True)
    rows = bench_learn.learn_mode(out, quick, jobs=jobs)
    print("== standard", flush=True)
    import bench_standard
    bench_standard.standard_mode(os.path.join(out, "standard") if quick else bench_standard.RESULTS,
                                 jobs, quick)
    figures = bench_learn.plots(rows, out)
    report = os.path.join(out, "results.md")
    with open(report, "w") as fh:
        fh.write(_report(out, rows, figures, quick))
    print(f"report: {report}")
    return 0


def _part_done(out: str, name: str) -> bool:
    return os.path.exists(os.path.join(out, f"{name}.txt"))


def _table_of(stdout: str) -> str:
    """The printed table of a part: from its first header line on."""
    lines = stdout.splitlines()
    start = next((i for i, ln in enumerate(lines)
                  if ln.startswith(("env steps/s", "\ntraining", "training", "seeds"))), 0)
    return "\n".join(lines[start:])


def _report(out: str, rows, figures, quick: bool) -> str:
    import datetime
    import bench_learn
    parts = [f"# Benchmark results{' (quick smoke run: not results)' if quick else ''}",
             "", f"- date: {datetime.date.today().isoformat()}", f"- commit: {_git_commit()}",
             f"- machine: {_machine()}",
             f"- learning runs: {bench_learn.SEEDS if not quick else bench_learn.QUICK['seeds']} "
             "seeds vmapped in one program per agent and task, default configs, budgets in env "
             "steps per seed as listed; wall-clock is the whole command (compile included)", ""]
    for name, title in (("envs", "Environment throughput"), ("train", "Training throughput"),
                        ("scale", "Seeds in one program vs sequential runs")):
        path = os.path.join(out, f"{name}.txt")
        if os.path.exists(path):
            parts += [f"## {title}", "", "```", _table_of(open(path).read()).strip(), "```", ""]
    seconds = bench_learn.wall_seconds(quick)
    parts += ["## Learning: final eval return, mean [95% bootstrap CI] over seeds", "",
              bench_learn.learn_table(rows), "",
              f"## Learning at a fixed wall-clock: eval return after {seconds / 60:g} min "
              "(compile included; mean over seeds, env steps per seed reached)", "",
              bench_learn.wall_table(rows, out, seconds), ""]
    for fig in figures:
        if fig.endswith(".png"):
            parts += [f"![{os.path.basename(fig)}]({os.path.relpath(fig, out)})", ""]
    return "\n".join(parts)


def bench_standard_doc() -> str:
    import bench_standard
    return bench_standard.__doc__


def main(argv: Optional[List[str]] = None) -> int:
    import bench_learn
    from common.errors import UserError

    RAW = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=RAW)
    modes = p.add_subparsers(dest="mode", required=True)
    e = modes.add_parser("envs", help="env steps/s: raw mujoco.rollout vs native vs mjx",
                         description=__doc__, formatter_class=RAW)
    e.add_argument("--tasks", nargs="+", default=["humanoid_walk", "cheetah_run"])
    e.add_argument("--num-envs", nargs="+", type=int, default=[256, 1024])
    e.add_argument("--steps", type=int, default=20, help="control steps per jitted call")
    e.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median)")
    e.add_argument("--min-time", type=float, default=1.0,
                   help="seconds a timed repeat lasts at least (calls are repeated to fill it)")
    e.add_argument("--nthread", type=int, default=0, help="MuJoCo threads (0: one per core)")
    e.add_argument("--pool-size", type=int, default=1024,
                   help="dm_control resets in the reset pool")
    e.add_argument("--skip-mjx", action="store_true", help="leave out the mjx backend")
    e.add_argument("--mjx-envs", type=int, default=64,
                   help="batch size for mjx (at most --num-envs)")
    e.add_argument("--mjx-steps", type=int, default=5, help="control steps per timed mjx call")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--quick", action="store_true",
                   help="smoke check: cartpole_balance, 16 envs, few steps, no mjx")
    t = modes.add_parser("train",
                         help="training env steps/s of agents vs a Python-loop reference TD3",
                         description=TRAIN_DOC, formatter_class=RAW)
    t.add_argument("--algos", nargs="+",
                   default=["td3", "ddpg", "d4pg", "td4", "sac", "mpo", "ppo"])
    t.add_argument("--tasks", nargs="+", default=["cheetah_run", "humanoid_walk"])
    t.add_argument("--steps-1env", type=int, default=3000,
                   help="timed env steps at 1 env (after 1000 warm-up)")
    t.add_argument("--steps-many", type=int, default=51200, help="env steps at 256 envs")
    t.add_argument("--ppo-steps", type=int, default=307_200,
                   help="env steps of the PPO native rows (the mjx row runs 3 rollouts)")
    t.add_argument("--ppo-mjx-envs", type=int, default=None,
                   help="envs of the PPO mjx row on cheetah_run (default 1024 on an accelerator, "
                        "128 on a CPU, where MJX is 50-100x slower; 0: skip)")
    t.add_argument("--budget", type=float, default=0.0,
                   help="wall-clock seconds for a fixed-budget return row per agent at 1 env "
                        "(0: skip; the `learn` mode's table is the fixed-budget comparison)")
    t.add_argument("--efficiency-iters", type=int, default=300,
                   help="iterations per timed call of the loop-efficiency table (0: skip it)")
    t.add_argument("--quick", action="store_true",
                   help="smoke check: cartpole_balance, tiny nets, few steps")
    sc = modes.add_parser("scale", help="N seeds vmapped in one program vs N sequential runs",
                          description=SCALE_DOC, formatter_class=RAW)
    sc.add_argument("--num-seeds", type=int, default=8)
    sc.add_argument("--task", default="cheetah_run")
    sc.add_argument("--quick", action="store_true",
                    help="smoke check: 2 seeds, tiny, cartpole_balance")
    lp = modes.add_parser("learn",
                          help="learning table: final eval return of every agent on 3 tasks",
                          description=LEARN_DOC, formatter_class=RAW)
    lp.add_argument("--out", default="bench", help="directory for runs, learn.json, plots")
    lp.add_argument("--algos", nargs="+", default=None)
    lp.add_argument("--tasks", nargs="+", default=None)
    lp.add_argument("--quick", action="store_true",
                    help="smoke check: td3 and ppo, tiny, cartpole_balance")
    lp.add_argument("--jobs", type=int, default=bench_learn.JOBS,
                    help="runs at a time, each pinned to its own core")
    f = modes.add_parser("full", help="everything for the README, resumable, under 2 hours here",
                         description=FULL_DOC, formatter_class=RAW)
    f.add_argument("--out", default="bench",
                   help="directory for results (rerun with the same --out to resume)")
    f.add_argument("--quick", action="store_true", help="smoke check of every part (a few minutes)")
    f.add_argument("--jobs", type=int, default=bench_learn.JOBS,
                   help="learning runs at a time, each pinned to its own core")
    st = modes.add_parser("standard", help="every agent at 100k env steps (PPO at equal "
                          "wall-clock) on walker_walk and cheetah_run, beside published values; "
                          "resumable",
                          description=bench_standard_doc(), formatter_class=RAW)
    st.add_argument("--out", default=None,
                    help="result JSONs, table and figure (default docs/results/standard)")
    st.add_argument("--jobs", type=int, default=bench_learn.JOBS,
                    help="runs at a time, each pinned to its own core")
    st.add_argument("--algos", nargs="+", default=None)
    st.add_argument("--tasks", nargs="+", default=None)
    st.add_argument("--quick", action="store_true",
                    help="smoke check: td3 and ppo, tiny, cartpole_balance")
    st.add_argument("--report-only", action="store_true",
                    help="table and figure from the JSONs there, no runs")
    args = p.parse_args(argv)
    if getattr(args, "jobs", 1) < 1:
        raise UserError("--jobs must be positive")

    if args.mode == "scale":
        return scale_mode(args)
    if args.mode == "learn":
        rows = bench_learn.learn_mode(args.out, args.quick, args.algos, args.tasks, args.jobs)
        print(bench_learn.learn_table(rows))
        seconds = bench_learn.wall_seconds(args.quick)
        print(f"\neval return after {seconds / 60:g} min of wall-clock:")
        print(bench_learn.wall_table(rows, args.out, seconds))
        for path in bench_learn.plots(rows, args.out):
            print(f"figure: {path}")
        return 0
    if args.mode == "full":
        return full_mode(args.out, args.quick, args.jobs)
    if args.mode == "standard":
        import bench_standard
        out = args.out or (os.path.join("bench", "standard") if args.quick
                           else bench_standard.RESULTS)
        if args.report_only:
            bench_standard.write_report(bench_standard.load_results(out), out)
        else:
            bench_standard.standard_mode(out, args.jobs, args.quick, algos=args.algos,
                                         tasks=args.tasks)
        return 0

    if args.mode == "train":
        import bench_train
        import jax
        if args.ppo_mjx_envs is None:
            args.ppo_mjx_envs = 128 if jax.default_backend() == "cpu" else 1024
        if args.quick:
            args.tasks, args.steps_1env, args.steps_many = ["cartpole_balance"], 300, 5120
            args.budget = 0
            args.ppo_steps, args.ppo_mjx_envs = 64 * 30 * 2, 0
        rows = bench_train.train_mode(args.algos, args.tasks, args.steps_1env, args.steps_many,
                                      args.ppo_steps, args.budget, args.ppo_mjx_envs, args.quick)
        bench_train.print_train_table(rows)
        if args.efficiency_iters > 0:
            eff = bench_train.efficiency_mode(args.algos, args.tasks,
                                              20 if args.quick else args.efficiency_iters,
                                              2 if args.quick else 5, args.quick)
            bench_train.print_efficiency_table(eff)
        return 0

    if args.mode == "envs":
        if args.quick:
            args.tasks, args.num_envs, args.steps, args.repeats = ["cartpole_balance"], [16], 5, 2
            args.pool_size, args.skip_mjx, args.min_time = 16, True, 0.05
        from common import envs
        for t in args.tasks:
            if t not in envs.names():
                raise UserError(f"unknown task {t!r}; valid tasks: {', '.join(envs.names())}")
        for name in ("steps", "repeats", "mjx_envs", "mjx_steps", "pool_size", "min_time"):
            if getattr(args, name) <= 0:
                raise UserError(f"--{name.replace('_', '-')} must be positive")
        if min(args.num_envs) < 1 or args.nthread < 0:
            raise UserError("--num-envs must be positive and --nthread non-negative")
        return bench_envs(args)
    return 2  # pragma: no cover - argparse rejects unknown modes


if __name__ == "__main__":
    from common.errors import exit_on_user_error
    sys.exit(exit_on_user_error(main)())
