"""`learn` mode: every agent on a few tasks, several seeds vmapped in one
program per (agent, task), a fixed budget of env steps.

Each run is the agent's own command line (`algos/<algo>.py`, default config
apart from the budget, evaluation interval and seeds), so its TensorBoard
logs, config and checkpoint land in `<out>/runs/` like any user run, and
scripts/plot.py draws the curves from them. Results are appended to
`<out>/learn.json` as runs finish; a rerun skips the runs already there, so a
half-finished benchmark resumes where it stopped.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List

import numpy as np

from .util import JOBS, ROOT, tool

HELP = "learning table: final eval return of every agent on 3 tasks"
DOC = """`learn` mode: the final evaluation return (10 deterministic episodes) of
every agent on cheetah_run, walker_walk and cartpole_swingup, 3 seeds vmapped
in one program per agent and task, each agent's default config with a budget
of env steps per seed chosen so that one run takes about 5 minutes of
training on one core of a 2-core CPU (scripts/benchmarks/learn.py: BUDGET; with
compile and two runs at a time, one per core (--jobs), 6-7.5 minutes here),
and the eval return each run had after 4 minutes of wall-clock (the fixed
wall-clock comparison, from its curve). Each run is the agent's own
command, so its TensorBoard logs and checkpoint land in <out>/runs/;
<out>/learn.json collects results as they finish, and a rerun resumes."""


def add_arguments(lp) -> None:
    lp.add_argument("--out", default="bench", help="directory for runs, learn.json, plots")
    lp.add_argument("--algos", nargs="+", default=None)
    lp.add_argument("--tasks", nargs="+", default=None)
    lp.add_argument("--quick", action="store_true",
                    help="smoke check: td3 and ppo, tiny, cartpole_balance")
    lp.add_argument("--jobs", type=int, default=JOBS,
                    help="runs at a time, each pinned to its own core")


def run(args) -> int:
    rows = learn_mode(args.out, args.quick, args.algos, args.tasks, args.jobs)
    print(learn_table(rows))
    seconds = wall_seconds(args.quick)
    print(f"\neval return after {seconds / 60:g} min of wall-clock:")
    print(wall_table(rows, args.out, seconds))
    for path in plots(rows, args.out):
        print(f"figure: {path}")
    return 0


ALGOS = ("td3", "ddpg", "d4pg", "td4", "sac", "mpo", "ppo")
TASKS = ("cheetah_run", "walker_walk", "cartpole_swingup")
SEEDS = 3
# Env steps per seed, chosen so that one run takes about 5 minutes on one core
# of this 2-core machine (the full benchmark runs two at a time, one per core).
# Measured rates of 3 vmapped seeds on one core, cheetah_run, default configs
# (env steps/s summed over seeds): td3 201, ddpg 267, d4pg 176, td4 134,
# sac 160, mpo 51, ppo 23666; so per seed about 270 s x rate / 3. PPO's
# budget is whole rollouts (1024 envs x 30 steps). Off-policy agents start
# learning after a fifth of their budget (their default warm-up of 5-10k
# random steps would be most of it).
BUDGET = {"td3": 18_000, "ddpg": 24_000, "d4pg": 15_000, "td4": 12_000, "sac": 14_000,
          "mpo": 5_000, "ppo": 70 * 1024 * 30,
          # (agent, task) exceptions: walker's physics costs PPO ~3x cheetah's
          # (its 2.15M-step run took 16 min on 2026-12-03)
          ("ppo", "walker_walk"): 20 * 1024 * 30}
EXTRA = {a: ["--learning-starts", str(BUDGET[a] // 5)]
         for a in ("td3", "ddpg", "d4pg", "td4", "sac", "mpo")}
EST_SECONDS = 400  # per run, on one core of two both busy (2026-12-03: 350-460 s, compile included)
# The fixed wall-clock comparison: each run's eval return at this many seconds
# since its TensorBoard stream began (compile included), from its curve.
WALL_SECONDS = 240
QUICK = dict(algos=("td3", "ppo"), tasks=("cartpole_balance",), seeds=2, wall_seconds=30,
             budget={"td3": 2_000, "ppo": 2 * 64 * 30},
             extra={"td3": ["--hidden-sizes", "16", "16", "--batch-size", "32",
                            "--learning-starts", "500"],
                    "ppo": ["--num-envs", "64", "--actor-hidden-sizes", "8",
                            "--critic-hidden-sizes", "8", "--num-minibatches", "2",
                            "--update-epochs", "1"]})


def run_args(algo: str, task: str, steps: int, seeds: int, log_dir: str, extra=()) -> List[str]:
    every = max(steps // 10, 1)
    return ["--env", task, "--backend", "native", "--num-seeds", str(seeds), "--seed", "1",
            "--total-timesteps", str(steps), "--eval-every", str(every), "--eval-episodes", "10",
            "--checkpoint-every", "0", "--log-dir", log_dir, *extra]


def one_run(algo: str, task: str, steps: int, seeds: int, out: str, extra=(), core=None) -> Dict:
    """The agent's CLI in a fresh process (its own compile caches and memory),
    pinned to `core` when given; wall-clock of the whole command, compile
    included."""
    log_dir = os.path.join(out, "runs")
    pattern = os.path.join(log_dir, f"{task}__{algo}__*")
    before = set(glob.glob(pattern))
    cmd = [sys.executable, os.path.join(ROOT, "algos", f"{algo}.py"),
           *run_args(algo, task, steps, seeds, log_dir, extra)]
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, preexec_fn=pin)
    wall = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    # Run directories are named <task>__<algo>__<seed>__<unix time>; the same
    # (algo, task) never runs twice at once, so the newest new one is ours.
    run_dir = sorted(set(glob.glob(pattern)) - before)[-1]
    final = _final_returns(r.stdout)
    return dict(algo=algo, task=task, steps=steps, seeds=seeds, wall_s=wall,
                returns=final, mean=float(np.mean(final)), run_dir=os.path.relpath(run_dir, out))


def _final_returns(stdout: str) -> List[float]:
    """The per-seed final eval returns the CLI prints on its last line."""
    line = [ln for ln in stdout.splitlines() if "final eval return" in ln][-1]
    return [float(x) for x in line.split("per seed [")[1].split("]")[0].split(",")]


def bootstrap_ci(x, n: int = 2000, seed: int = 0):
    x = np.asarray(x, np.float64)
    if len(x) < 2 or np.all(x == x[0]):
        return float(x.mean()), float(x.mean())
    idx = np.random.default_rng(seed).integers(0, len(x), (n, len(x)))
    means = x[idx].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def wall_seconds(quick: bool) -> float:
    return QUICK["wall_seconds"] if quick else WALL_SECONDS


def budget_of(budget: Dict, algo: str, task: str) -> int:
    return budget.get((algo, task), budget[algo])


def plan(out: str, quick: bool = False, algos=None, tasks=None):
    """(runs to do, results so far, seeds, budget) for `out`."""
    path = os.path.join(out, "learn.json")
    done = json.load(open(path)) if os.path.exists(path) else []
    q = QUICK if quick else None
    algos = algos or (q["algos"] if q else ALGOS)
    tasks = tasks or (q["tasks"] if q else TASKS)
    seeds = q["seeds"] if q else SEEDS
    budget = q["budget"] if q else BUDGET

    def current(r):  # a result of this plan (a changed budget makes a stale one)
        return r["steps"] == budget_of(budget, r["algo"], r["task"]) and r["seeds"] == seeds
    todo = [(a, t) for t in tasks for a in algos
            if not any(r["algo"] == a and r["task"] == t and current(r) for r in done)]
    kept = [r for r in done if r["algo"] in algos and r["task"] in tasks and current(r)]
    return todo, kept, seeds, budget


def learn_mode(out: str, quick: bool = False, algos=None, tasks=None, jobs: int = 1) -> List[Dict]:
    """Runs what `plan` leaves, `jobs` at a time (each pinned to its own core
    when jobs > 1), appending each result to learn.json as it finishes."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "learn.json")
    todo, _, seeds, budget = plan(out, quick, algos, tasks)
    done = json.load(open(path)) if os.path.exists(path) else []
    q = QUICK if quick else None
    cores = sorted(os.sched_getaffinity(0))
    pin = jobs > 1 and len(cores) > 1  # a lone last run keeps the same conditions: one core
    jobs = max(1, min(jobs, len(cores), len(todo) or 1))
    est = (EST_SECONDS if not quick else 30) * len(todo) / jobs
    print(f"learn: {len(todo)} run(s) to do ({seeds} seeds each), {jobs} at a time, "
          f"about {est / 60:.0f} min", flush=True)
    lock = threading.Lock()
    free = list(cores[-jobs:]) if pin else [None]

    def work(item):
        algo, task = item
        extra = q["extra"].get(algo, []) if q else EXTRA.get(algo, [])
        with lock:
            core = free.pop()
        try:
            r = one_run(algo, task, budget_of(budget, algo, task), seeds, out, extra, core)
        finally:
            with lock:
                free.append(core)
        with lock:  # learn.json is rewritten whole and atomically after each run
            done.append(r)
            with open(path + ".tmp", "w") as f:
                json.dump(done, f, indent=1)
            os.replace(path + ".tmp", path)
            print(f"  {task:<16} {algo:<5} {r['steps']:>9} steps/seed  {r['wall_s']:6.0f}s  "
                  f"return {r['mean']:7.1f}  per seed {np.round(r['returns'], 1).tolist()}",
                  flush=True)

    with ThreadPoolExecutor(jobs) as pool:
        for f in [pool.submit(work, item) for item in todo]:
            f.result()
    return plan(out, quick, algos, tasks)[1]


def _grid(rows: List[Dict], cell) -> str:
    """Markdown table, an agent a row and a task a column; cell(run) fills
    each (agent, task) that has a run (its latest)."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    algos = list(dict.fromkeys(r["algo"] for r in rows))
    lines = ["| agent | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for a in algos:
        runs = [[x for x in rows if x["algo"] == a and x["task"] == t] for t in tasks]
        lines.append(f"| {a} | " + " | ".join(cell(r[-1]) if r else "" for r in runs) + " |")
    return "\n".join(lines)


def learn_table(rows: List[Dict]) -> str:
    """Markdown: final eval return (mean over seeds, 95% bootstrap CI), steps
    per seed and wall-clock of the whole run (compile included)."""
    def cell(r):
        lo, hi = bootstrap_ci(r["returns"])
        return (f"{r['mean']:.0f} [{lo:.0f}, {hi:.0f}] ({r['steps'] / 1000:.0f}k steps, "
                f"{r['wall_s'] / 60:.1f} min)")
    return _grid(rows, cell)


def wall_table(rows: List[Dict], out: str, seconds: float) -> str:
    """Markdown: per agent and task, the eval return (mean over seeds) of the
    last evaluation logged within `seconds` of wall-clock, and the env steps
    per seed it had reached; from the runs' TensorBoard logs (scripts/plot.py
    reads them). A run that ended sooner shows its final evaluation."""
    plot = tool("plot")

    def cell(r):
        run = os.path.join(out, r["run_dir"])
        if not os.path.isdir(run):
            return ""
        series = [s for g in plot.load([run], "eval/episode_return").values() for s in g]
        picks = [(s.values[i[-1]], s.steps[i[-1]]) for s in series
                 for i in [np.nonzero(s.times <= seconds)[0]] if len(i)]
        if not picks or len(picks) < len(series):
            return "no eval yet"
        value, steps = np.mean([v for v, _ in picks]), np.mean([st for _, st in picks])
        return f"{value:.0f} ({steps / 1000:.0f}k steps)"
    return _grid(rows, cell)


def plots(rows: List[Dict], out: str) -> List[str]:
    """Curves against env steps and wall-clock, by scripts/plot.py."""
    run_dirs = [os.path.join(out, r["run_dir"]) for r in rows]
    script = os.path.join(ROOT, "scripts", "plot.py")
    if not run_dirs or not os.path.exists(script):
        return []
    target = os.path.join(out, "learning_curves")
    r = subprocess.run([sys.executable, script, *run_dirs, "--out", target], capture_output=True,
                       text=True, cwd=ROOT)
    if r.returncode != 0:
        print(f"plot.py failed: {r.stderr.strip().splitlines()[-1:]}")
        return []
    return sorted(glob.glob(target + "*"))
