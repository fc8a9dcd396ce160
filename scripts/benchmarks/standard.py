"""Standard-budget results for scripts/benchmark.py (`standard`, part of `full`).

The six off-policy agents at 100k env steps on walker_walk and cheetah_run,
SEEDS seeds vmapped in one program per (agent, task), each with its default
config apart from the budget and the evaluation settings (10 deterministic
episodes every 10k steps, from held-out initial states). PPO gets the
wall-clock of the median off-policy run on the same task: its env-step budget
is that time times its rate, measured by a short calibration run first. So
the table compares the off-policy agents at equal env steps and PPO at equal
wall-clock.

Every finished run leaves one small JSON in `docs/results/standard/`
(`<task>__<algo>.json`: command, config, per-evaluation returns per seed and
their wall-clock times, env steps/s, commit, machine, whether another run
shared the machine) and the trained policies (actor parameters and
observation statistics of every seed, `<task>__<algo>.policy.npz`), both
meant to be committed as they land. A rerun skips the runs whose JSON is
there, resumes an interrupted run from its last checkpoint (every 25k
steps), and regenerates the table and figure from the JSONs alone.
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
from typing import Dict, List, Optional

import numpy as np

from . import published
from .util import JOBS, ROOT, git_commit, machine, tool, write_json

DOC = __doc__
HELP = ("every agent at 100k env steps (PPO at equal wall-clock) on walker_walk and cheetah_run, "
        "beside published values; resumable")
RESULTS = os.path.join(ROOT, "docs", "results", "standard")
OFF_POLICY = ("td3", "ddpg", "d4pg", "td4", "sac", "mpo")
ALGOS = OFF_POLICY + ("ppo",)
TASKS = ("walker_walk", "cheetah_run")
SEEDS = 2
STEPS = 100_000
EVAL_EVERY = 10_000
CHECKPOINT_EVERY = 25_000
PPO_ROLLOUT = 1024 * 30        # PPO's default num_envs x num_steps: budgets are whole rollouts
PPO_CALIBRATION = 20 * PPO_ROLLOUT
REPORT_STEPS = (50_000, 100_000)
QUICK = dict(algos=("td3", "ppo"), tasks=("cartpole_balance",), steps=2_000, eval_every=1_000,
             extra={"td3": ["--hidden-sizes", "16", "16", "--batch-size", "32",
                            "--learning-starts", "500"],
                    "ppo": ["--num-envs", "64", "--actor-hidden-sizes", "8",
                            "--critic-hidden-sizes", "8", "--num-minibatches", "2",
                            "--update-epochs", "1"]},
             ppo_rollout=64 * 30, ppo_calibration=4 * 64 * 30)


def result_path(out: str, task: str, algo: str, suffix: str = ".json") -> str:
    return os.path.join(out, f"{task}__{algo}{suffix}")


def load_results(out: str) -> List[Dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "*__*.json"))):
        with open(path) as f:
            rows.append(json.load(f))
    return rows


# --------------------------------------------------------------------------- the mode

def add_arguments(st) -> None:
    st.add_argument("--out", default=None,
                    help="result JSONs, table and figure (default docs/results/standard)")
    st.add_argument("--jobs", type=int, default=JOBS,
                    help="runs at a time, each pinned to its own core")
    st.add_argument("--algos", nargs="+", default=None)
    st.add_argument("--tasks", nargs="+", default=None)
    st.add_argument("--quick", action="store_true",
                    help="smoke check: td3 and ppo, tiny, cartpole_balance")
    st.add_argument("--report-only", action="store_true",
                    help="table and figure from the JSONs there, no runs")


def run(args) -> int:
    out = args.out or (os.path.join("bench", "standard") if args.quick else RESULTS)
    if args.report_only:
        write_report(load_results(out), out)
    else:
        standard_mode(out, args.jobs, args.quick, algos=args.algos, tasks=args.tasks)
    return 0


# --------------------------------------------------------------------------- one run

def command(algo: str, task: str, steps: int, eval_every: int, log_dir: str, extra=()) -> List[str]:
    return [sys.executable, os.path.join(ROOT, "algos", f"{algo}.py"), "--env", task,
            "--backend", "native", "--num-seeds", str(SEEDS), "--seed", "1",
            "--total-timesteps", str(steps), "--eval-every", str(eval_every),
            "--eval-episodes", "10", "--checkpoint-every", str(CHECKPOINT_EVERY),
            "--log-dir", log_dir, *extra]


def _run_dir(log_dir: str, task: str, algo: str) -> Optional[str]:
    dirs = sorted(glob.glob(os.path.join(log_dir, f"{task}__{algo}__*")))
    return dirs[-1] if dirs else None


def curves(run_dir: str) -> Dict:
    """Per-seed eval returns, their steps and wall-clock seconds since each
    stream began (its writer's creation, so compile included; a resumed run's
    clock includes the pause), from the run's TensorBoard logs."""
    plot = tool("plot")
    dirs = sorted(glob.glob(os.path.join(run_dir, "seed_*")),
                  key=lambda p: int(p.rsplit("_", 1)[1]))
    series = [plot.read_seed(d, "eval/episode_return")[0] for d in dirs]
    return dict(steps=[int(x) for x in series[0].steps],
                returns=[[float(v) for v in s.values] for s in series],
                seconds=[[float(t) for t in s.times] for s in series])


def policy_leaves(checkpoint: str) -> Dict[str, np.ndarray]:
    """The policy part of a training checkpoint (actor parameters, observation
    statistics, hyperparameters; every seed), keyed by leaf path."""
    with np.load(checkpoint) as z:
        header = json.loads(bytes(z["header"]).decode())
        keep = {f"leaf_{i:05d}": p for i, p in enumerate(header["leaf_paths"])
                if p.split("[")[0].split(".")[1] in ("actor_params", "obs_stats", "hp")}
        arrays = {p: z[k] for k, p in keep.items()}
    meta = {k: header[k] for k in ("algo", "env", "num_seeds", "config", "chunk")}
    arrays["header"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    return arrays


def one_run(algo: str, task: str, steps: int, out: str, log_dir: str, eval_every: int, extra=(),
            core: Optional[int] = None, shared: bool = False) -> Dict:
    """The agent's own CLI in a fresh process pinned to `core`; resumes its
    interrupted run directory when there is one; writes the result JSON and
    the policies."""
    cmd = command(algo, task, steps, eval_every, log_dir, extra)
    previous = _run_dir(log_dir, task, algo)
    resumed = bool(previous and os.path.exists(os.path.join(previous, "checkpoint.npz")))
    run_cmd = cmd + (["--resume", previous] if resumed else [])
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    commit = git_commit(mark_dirty=False)
    t0 = time.time()
    r = subprocess.run(run_cmd, capture_output=True, text=True, cwd=ROOT, preexec_fn=pin)
    wall = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(run_cmd)} failed:\n{r.stderr[-3000:]}")
    run_dir = previous if resumed else _run_dir(log_dir, task, algo)
    c = curves(run_dir)
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    train_s = max(s[-1] for s in c["seconds"])
    # env steps/s per seed between the first and the last evaluation (evaluations included)
    span = max(s[-1] - s[0] for s in c["seconds"])
    i = cmd.index("--log-dir")
    result = dict(algo=algo, task=task, seeds=SEEDS, steps=steps, command=" ".join(
        ["python", os.path.relpath(cmd[1], ROOT), *cmd[2:i], *cmd[i + 2:]]),
        config=config, eval_steps=c["steps"], eval_returns=c["returns"], eval_seconds=c["seconds"],
        wall_s=wall, train_s=train_s,
        sps_per_seed=(c["steps"][-1] - c["steps"][0]) / span if span > 0 else float("nan"),
        resumed=resumed, shared_machine=shared, commit=commit, date=time.strftime("%Y-%m-%d"),
        machine=machine(), core=core)
    np.savez_compressed(result_path(out, task, algo, ".policy.npz"),
                        **policy_leaves(os.path.join(run_dir, "checkpoint.npz")))
    write_json(result_path(out, task, algo), result)
    return result


# --------------------------------------------------------------------------- the plan

def ppo_budget(rows: List[Dict], task: str, rate: float, rollout: int, off_policy=OFF_POLICY,
               startup: float = 0.0) -> Optional[int]:
    """PPO's env steps per seed for the median off-policy wall-clock on
    `task` (whole command, compile included) at `rate` env steps/s per seed,
    less PPO's own `startup` seconds (compile, pools); None until every run
    of `off_policy` on the task is in."""
    walls = [r["wall_s"] for r in rows if r["task"] == task and r["algo"] in off_policy]
    if len(walls) < len(off_policy):
        return None
    return max(1, int((np.median(walls) - startup) * rate // rollout)) * rollout


def standard_mode(out: str = RESULTS, jobs: int = 2, quick: bool = False,
                  log_dir: Optional[str] = None, algos=None, tasks=None) -> List[Dict]:
    """Runs what is missing (off-policy first, then PPO per task), `jobs` at a
    time each pinned to its own core, then writes the table and figure."""
    q = QUICK if quick else None
    algos, tasks = algos or (q["algos"] if q else ALGOS), tasks or (q["tasks"] if q else TASKS)
    steps, eval_every = (q["steps"], q["eval_every"]) if q else (STEPS, EVAL_EVERY)
    rollout, calibration = ((q["ppo_rollout"], q["ppo_calibration"]) if q
                            else (PPO_ROLLOUT, PPO_CALIBRATION))
    # a quick check's runs live beside its results: a fresh --out never resumes a
    # checkpoint some older code left behind
    log_dir = log_dir or (os.path.join(out, "runs") if quick
                          else os.path.join(ROOT, "benchmark_runs", "standard"))
    os.makedirs(out, exist_ok=True)
    done = lambda t, a: os.path.exists(result_path(out, t, a))
    extra = lambda a: (q["extra"].get(a, []) if q else [])
    # MPO last: the slowest runs, started when the others are in
    todo = [(t, a) for a in sorted((a for a in algos if a != "ppo"), key=lambda a: a == "mpo")
            for t in tasks if not done(t, a)]
    cores = sorted(os.sched_getaffinity(0))
    jobs = max(1, min(jobs, len(cores)))
    free, lock = list(cores[-jobs:]) if jobs > 1 else [None], threading.Lock()
    print(f"standard: {len(todo)} off-policy run(s) to do, {jobs} at a time", flush=True)

    def work(item, steps=steps, kind="run", every=eval_every):
        task, algo = item
        with lock:
            core = free.pop()
        try:
            calibration_dir = os.path.join(log_dir, "calibration")
            r = one_run(algo, task, steps, out if kind == "run" else calibration_dir,
                        log_dir if kind == "run" else calibration_dir,
                        every if kind == "run" else steps // 4, extra(algo), core,
                        shared=jobs > 1)
        finally:
            with lock:
                free.append(core)
        print(f"  {task:<14} {algo:<5} {r['steps']:>9} steps/seed  {r['wall_s'] / 60:5.1f} min  "
              f"final {np.mean([s[-1] for s in r['eval_returns']]):7.1f}", flush=True)
        return r

    def ppo(task):
        """Calibrate PPO's rate on `task` (under the same load as the
        off-policy runs: `jobs` runs at a time), then its equal-wall-clock run."""
        cal_dir = os.path.join(log_dir, "calibration")
        os.makedirs(cal_dir, exist_ok=True)
        cal_path = result_path(cal_dir, task, "ppo")
        cal = json.load(open(cal_path)) if os.path.exists(cal_path) else \
            work((task, "ppo"), calibration, "cal")
        rate = cal["sps_per_seed"]
        startup = max(0.0, cal["wall_s"] - cal["steps"] / rate)
        budget = ppo_budget(load_results(out), task, rate, rollout,
                            [a for a in algos if a != "ppo"], startup)
        if budget is None:
            print(f"  {task}: PPO waits for every off-policy run of the task", flush=True)
            return
        print(f"  {task}: PPO at {rate:.0f} env steps/s per seed, {startup:.0f} s start-up "
              f"-> {budget} steps", flush=True)
        work((task, "ppo"), budget, "run", max(rollout, budget // 10 // rollout * rollout))

    with ThreadPoolExecutor(jobs) as pool:
        for f in [pool.submit(work, item) for item in todo]:
            f.result()
    if "ppo" in algos:
        with ThreadPoolExecutor(jobs) as pool:
            for f in [pool.submit(ppo, t) for t in tasks if not done(t, "ppo")]:
                f.result()
    rows = load_results(out)
    write_report(rows, out)
    return rows


# --------------------------------------------------------------------------- table and figure

def returns_at(r: Dict, step: int) -> Optional[List[float]]:
    """Per-seed eval returns of the evaluation at `step` (None if not logged)."""
    if step not in r["eval_steps"]:
        return None
    i = r["eval_steps"].index(step)
    return [s[i] for s in r["eval_returns"]]


def _cell(values: Optional[List[float]]) -> str:
    if values is None:
        return ""
    return f"{np.mean(values):.0f} ({', '.join(f'{v:.0f}' for v in values)})"


def table(rows: List[Dict], published=None, report_steps=REPORT_STEPS) -> str:
    """Markdown: per task and agent, the eval return at each reporting step
    (mean over seeds, then each seed), the final one (PPO's, with its
    budget), wall-clock and env steps/s per seed; `published(task, algo)`
    (None or a string) fills a last column."""
    head = "| task | agent | " + " | ".join(f"at {s // 1000}k steps" for s in report_steps) + \
           " | final (steps) | wall-clock | env steps/s per seed | published at 100k |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    order = {a: i for i, a in enumerate(ALGOS)}
    for r in sorted(rows, key=lambda r: (r["task"], order.get(r["algo"], 99))):
        cells = [_cell(returns_at(r, s)) if r["algo"] != "ppo" else "" for s in report_steps]
        final = [s[-1] for s in r["eval_returns"]]
        pub = (published(r["task"], r["algo"]) if published else None) or ""
        flags = " (resumed)" if r.get("resumed") else ""
        lines.append(f"| {r['task']} | {r['algo']} | " + " | ".join(cells) +
                     f" | {_cell(final)} ({r['eval_steps'][-1] / 1000:.0f}k) "
                     f"| {r['wall_s'] / 60:.0f} min{flags} | {r['sps_per_seed']:.0f} | {pub} |")
    return "\n".join(lines)


def figure(rows: List[Dict], path: str) -> str:
    """Eval return against env steps (left) and wall-clock (right), a panel
    row per task, a line per seed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 4 * len(tasks)), squeeze=False)
    colors = dict(zip(ALGOS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for row, task in zip(axes, tasks):
        for r in [r for r in rows if r["task"] == task]:
            for k, (ret, sec) in enumerate(zip(r["eval_returns"], r["eval_seconds"])):
                label = r["algo"] if k == 0 else None
                color = colors.get(r["algo"])
                row[0].plot(r["eval_steps"], ret, color=color, label=label, alpha=0.8, lw=1.2)
                row[1].plot(np.asarray(sec) / 60, ret, color=color, label=label, alpha=0.8, lw=1.2)
        # Log scale: PPO's millions of steps beside the off-policy agents' 100k.
        row[0].set(title=f"{task}: eval return vs env steps (one line per seed)",
                   xlabel="env steps (log scale)", ylabel="eval return", xscale="log")
        row[1].set(title=f"{task}: vs wall-clock since the first log", xlabel="minutes",
                   ylabel="eval return")
        for ax in row:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(rows: List[Dict], out: str) -> str:
    text = table(rows, published.ours_column) + "\n\nPublished (env steps at the native control " \
        "rate; sources in published_sources.md):\n\n" + published.table()
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text + "\n")
    if rows:
        figure(rows, os.path.join(out, "curves.png"))
    print(text)
    return text
