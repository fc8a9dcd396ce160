"""The humanoid benchmark (`python scripts/benchmark.py humanoid`): every
agent on humanoid_walk, the best on humanoid_stand and humanoid_run, at two
hours of one core per seed, beside Roxie's table and published 1M-step values.

Runs (`plan`): every agent on humanoid_walk, seed 1; the best agents
(BEST: D4PG, first at two hours, and TD4, second; DDPG, which led the
recipe probes and whose second seed ran first; TD3, the promised command;
MPO and SAC, then PPO, added last) also seed 2; the best of them (BEST[0]) on
humanoid_stand and humanoid_run, seeds 1 and 2. Each run is the agent's own
command line with its humanoid defaults (TASK_DEFAULTS in algos/<agent>.py),
one seed per process, pinned to its own core, `--jobs` (2) at a time.

A budget that load cannot change: each agent's env steps/s is measured
first, alone (a short calibration run of its recipe on humanoid_walk, pinned
to one core, nothing else of the benchmark running), and its runs get
rate x 7200 s of env steps (the three humanoid tasks share one model, so one
rate serves them all). The measurements are kept in rates.json beside the
results, so tests or compiles beside a run change its wall-clock, never its
result. Evaluation every 1/12 of the budget: 10 deterministic episodes from
held-out initial states.

Every finished run leaves `docs/results/humanoid/<task>__<algo>__seed<s>.json`
(command, config, per-evaluation returns with their env steps and
wall-clock, env steps/s, rate measurement, commit) and its policy
(`.policy.npz`), meant to be committed as they land. A rerun skips finished
runs, resumes an interrupted one from its last checkpoint (every 1/12 of the
budget, under benchmark_runs/humanoid/), and regenerates table.md and
curves.png from the JSONs alone (`--report-only`: nothing but that).
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
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import standard
from .util import JOBS, ROOT, git_commit, machine, tool, write_json

DOC = __doc__
HELP = ("every agent on humanoid_walk (the best also on stand and run) at 2 hours of one core "
        "per seed, beside Roxie's table")
RESULTS = os.path.join(ROOT, "docs", "results", "humanoid")
ALGOS = ("td3", "ddpg", "d4pg", "td4", "sac", "mpo", "ppo")
TASKS = ("humanoid_stand", "humanoid_walk", "humanoid_run")
# At two hours, seed 1: D4PG 887 (935 seed 2), TD4 895, SAC 833, TD3 814, DDPG 672 (750).
# DDPG led the recipe probes, so its second seed ran before the table said otherwise;
# TD3's `python algos/td3.py --env humanoid_walk` is the command the README promises;
# MPO and SAC (one seed each until 2026-12-07) ran their second seeds last, then PPO's
BEST = ("d4pg", "td4", "ddpg", "td3", "mpo", "sac", "ppo")
BUDGET_S = 7200          # one core, per seed
EVALS = 12
CALIBRATION = {"ppo": 1_048_576}  # env steps of a calibration run; off-policy: the default
CALIBRATION_STEPS = 270_336
QUICK = dict(tasks=("cartpole_balance",), algos=("td3",), best=("td3",), budget_s=30,
             calibration=8_192,
             extra=["--num-envs", "4", "--hidden-sizes", "16", "16", "--batch-size", "32",
                    "--learning-starts", "500", "--updates-per-step", "0.25"])

# Roxie (github vittorione94/roxie, images/release-scores.md): mean of the last
# 10 evaluations after 500M env steps, one seed; CPU: EnvPool (dm_control's own
# physics), GPU: MuJoCo Playground's port on mujoco_warp (another task: other
# solver settings, sim_dt 0.005, no joint randomisation at reset).
ROXIE = {  # algo: ((stand, walk, run) CPU, (stand, walk, run) GPU)
    "ddpg": ((924, 812, 498), (848, 846, 119)),
    "td3": ((922, 820, 534), (860, 830, 140)),
    "d4pg": ((960, 952, 692), (898, 378, 161)),
    "td4": ((957, 908, 616), (38, 985, 150)),
    "sac": ((917, 841, 475), (925, 573, 450)),
    "mpo": ((836, 775, 589), (725, 826, 153)),
    "ppo": ((6, 830, 761), (229, 25, 7)),
}
# The same plain algorithms at 1M env steps, 1 env (published_sources.md)
AT_1M = {"sac": ("plain SAC", (353, 274, 117)), "ddpg": ("plain DDPG", (171, 171, 44))}


def result_path(out: str, task: str, algo: str, seed: int, suffix: str = ".json") -> str:
    return os.path.join(out, f"{task}__{algo}__seed{seed}{suffix}")


def load_results(out: str) -> List[Dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "*__*__seed*.json"))):
        with open(path) as f:
            rows.append(json.load(f))
    return rows


def plan(algos=ALGOS, best=BEST, tasks=TASKS) -> List[Tuple[str, str, int]]:
    """(task, algo, seed) of every run, in the order they start: the best
    agent first, then every other agent's walker, then the second seeds,
    then stand and run."""
    walk = "humanoid_walk" if "humanoid_walk" in tasks else tasks[0]
    lead = best[0]
    runs = [(walk, lead, 1)] + [(walk, a, 1) for a in algos if a != lead]
    runs += [(walk, a, 2) for a in best]
    runs += [(t, lead, s) for t in tasks if t != walk for s in (1, 2)]
    return runs


# --------------------------------------------------------------------------- the mode

def add_arguments(p) -> None:
    p.add_argument("--out", default=None,
                   help="result JSONs, rates, table and figure (default docs/results/humanoid)")
    p.add_argument("--jobs", type=int, default=JOBS,
                   help="runs at a time, each pinned to its own core")
    p.add_argument("--only", nargs="+", default=None, metavar="TASK:ALGO[:SEED]",
                   help="run only these (e.g. humanoid_walk:d4pg); the rest waits")
    p.add_argument("--report-only", action="store_true",
                   help="table and figure from the JSONs there, no runs")
    p.add_argument("--quick", action="store_true",
                   help="smoke check: td3, tiny, cartpole_balance, 30 s budget")


def run(args) -> int:
    out = args.out or (os.path.join(ROOT, "bench", "humanoid") if args.quick else RESULTS)
    if not args.report_only:
        humanoid_mode(out, args.jobs, args.quick, args.only)
    write_report(load_results(out), out)
    return 0


# --------------------------------------------------------------------------- calibration

def _pinned(core: Optional[int]):
    return (lambda: os.sched_setaffinity(0, {core})) if core is not None else None


def calibrate(algo: str, out: str, log_dir: str, core: Optional[int], quick: bool) -> Dict:
    """The agent's env steps/s on its humanoid recipe, alone on one core:
    from the second third of a short run to its last log before the final
    evaluation (compile and the warm-up of random actions left out)."""
    rates_path = os.path.join(out, "rates.json")
    rates = json.load(open(rates_path)) if os.path.exists(rates_path) else {}
    if algo in rates:
        return rates[algo]
    q = QUICK if quick else None
    task = q["tasks"][0] if q else "humanoid_walk"
    steps = q["calibration"] if q else CALIBRATION.get(algo, CALIBRATION_STEPS)
    cal_dir = os.path.join(log_dir, "calibration", algo)
    cmd = [sys.executable, os.path.join(ROOT, "algos", f"{algo}.py"), "--env", task,
           "--backend", "native", "--total-timesteps", str(steps), "--eval-every", "0",
           "--eval-episodes", "1", "--checkpoint-every", "0", "--log-dir", cal_dir,
           *(q["extra"] if q else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, preexec_fn=_pinned(core))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    run_dir = sorted(glob.glob(os.path.join(cal_dir, "*")))[-1]
    sps, _ = tool("plot").read_seed(os.path.join(run_dir, "seed_1"), "charts/sps")
    k = len(sps.steps) // 3
    rate = float((sps.steps[-2] - sps.steps[k]) / (sps.times[-2] - sps.times[k]))
    entry = dict(env_steps_per_s=rate, steps=steps, task=task, core=core,
                 date=time.strftime("%Y-%m-%d"), commit=git_commit(mark_dirty=False),
                 machine=machine())
    rates = json.load(open(rates_path)) if os.path.exists(rates_path) else {}
    rates[algo] = entry
    write_json(rates_path, rates)
    print(f"  calibration {algo}: {rate:.0f} env steps/s alone on one core", flush=True)
    return entry


def budget(rate: float, seconds: float = BUDGET_S) -> int:
    return int(rate * seconds)


# Result files written since the schedule ends on its 12th evaluation say so; older
# ones evaluated a 13th time a chunk or two after the 12th, and the table
# read that one (marked in the table).
SCHEDULE = "whole periods"


def chunk_steps(algo: str, task: str, extra=()) -> int:
    """Env steps per chunk of the agent's command on `task` (with `extra`
    flags): evaluations and checkpoints fall on chunk ends."""
    import importlib

    import tyro

    from common import agent
    mod = importlib.import_module(f"algos.{algo}")
    config = tyro.cli(mod.Config, args=list(extra), default=mod.AGENT.config_for(task))
    if hasattr(mod, "make_schedule"):  # PPO: chunks of whole rollouts
        return mod.make_schedule(config).steps_per_chunk
    return agent.make_schedule(config,
                               iters_per_step_unit=agent.update_period(config)[1]).steps_per_chunk


def whole_periods(steps: int, chunk: int) -> int:
    """The budget rounded down to EVALS evaluation periods of whole chunks,
    so the 12th evaluation ends the run (at most EVALS chunks fewer)."""
    return max(1, steps // EVALS // chunk) * chunk * EVALS


# --------------------------------------------------------------------------- one run

def command(algo: str, task: str, seed: int, steps: int, log_dir: str, extra=()) -> List[str]:
    every = max(1, steps // EVALS)
    return [sys.executable, os.path.join(ROOT, "algos", f"{algo}.py"), "--env", task,
            "--backend", "native", "--seed", str(seed), "--total-timesteps", str(steps),
            "--eval-every", str(every), "--eval-episodes", "10", "--checkpoint-every", str(every),
            "--log-dir", log_dir, *extra]


def one_run(task: str, algo: str, seed: int, rate: Dict, out: str, log_dir: str,
            core: Optional[int], quick: bool, shared: bool) -> Dict:
    """The agent's own command line, pinned to `core`; resumes its interrupted
    run directory when there is one; writes the result JSON and the policy."""
    q = QUICK if quick else None
    extra = q["extra"] if q else ()
    steps = whole_periods(budget(rate["env_steps_per_s"], q["budget_s"] if q else BUDGET_S),
                          chunk_steps(algo, task, extra))
    run_log = os.path.join(log_dir, f"{task}__{algo}__seed{seed}")
    cmd = command(algo, task, seed, steps, run_log, extra)
    dirs = sorted(glob.glob(os.path.join(run_log, "*")))
    resumed = bool(dirs and os.path.exists(os.path.join(dirs[-1], "checkpoint.npz")))
    run_cmd = cmd + (["--resume", dirs[-1]] if resumed else [])
    commit = git_commit(mark_dirty=False)
    t0 = time.time()
    r = subprocess.run(run_cmd, capture_output=True, text=True, cwd=ROOT,
                       preexec_fn=_pinned(core))
    wall = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(run_cmd)} failed:\n{r.stderr[-3000:]}")
    run_dir = sorted(glob.glob(os.path.join(run_log, "*")))[-1]
    c = standard.curves(run_dir)
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    i = cmd.index("--log-dir")
    result = dict(
        algo=algo, task=task, seed=seed, steps=config["total_timesteps"], budget_s=BUDGET_S,
        rate=rate, command=" ".join(["python", os.path.relpath(cmd[1], ROOT), *cmd[2:i],
                                     *cmd[i + 2:]]),
        config=config, eval_steps=c["steps"], eval_returns=c["returns"],
        eval_seconds=c["seconds"], wall_s=wall,
        sps=active_rate(c["steps"], c["seconds"][0]),
        resumed=resumed, shared_machine=shared, schedule=SCHEDULE, commit=commit,
        date=time.strftime("%Y-%m-%d"),
        machine=machine(), core=core)
    np.savez_compressed(result_path(out, task, algo, seed, ".policy.npz"),
                        **standard.policy_leaves(os.path.join(run_dir, "checkpoint.npz")))
    write_json(result_path(out, task, algo, seed), result)
    return result


def active_rate(steps: List[int], seconds: List[float]) -> float:
    """Env steps/s while the run was running: the median over evaluation
    intervals, so the pause of a run resumed in a later session (its clock
    includes the pause) does not count."""
    rates = [(s1 - s0) / (t1 - t0) for s0, s1, t0, t1 in
             zip(steps, steps[1:], seconds, seconds[1:]) if t1 > t0]
    return float(np.median(rates)) if rates else float("nan")


def core_hours(r: Dict) -> np.ndarray:
    """The budget's clock: env steps over the rate measured alone, so 2.0 is
    the whole budget whatever ran beside the run or paused it."""
    return np.asarray(r["eval_steps"]) / r["rate"]["env_steps_per_s"] / 3600


def humanoid_mode(out: str = RESULTS, jobs: int = JOBS, quick: bool = False,
                  only: Optional[List[str]] = None,
                  log_dir: Optional[str] = None) -> List[Tuple[str, str, int]]:
    """Calibrates the agents that have no rate yet (one at a time, alone),
    then runs what is missing, `jobs` at a time each pinned to its own core.
    Returns the runs it started."""
    q = QUICK if quick else None
    runs = plan(q["algos"], q["best"], q["tasks"]) if q else plan()
    if only:
        keep = [tuple(o.split(":")) for o in only]
        runs = [r for r in runs if (r[0], r[1]) in keep or (r[0], r[1], str(r[2])) in keep]
    log_dir = log_dir or (os.path.join(out, "runs") if q  # as standard_mode's quick check
                          else os.path.join(ROOT, "benchmark_runs", "humanoid"))
    os.makedirs(out, exist_ok=True)
    todo = [r for r in runs if not os.path.exists(result_path(out, *r))]
    cores = sorted(os.sched_getaffinity(0))
    jobs = max(1, min(jobs, len(cores)))
    print(f"humanoid: {len(todo)} run(s) to do, {jobs} at a time", flush=True)
    rates = {a: calibrate(a, out, log_dir, cores[-1], quick)
             for a in dict.fromkeys(a for _, a, _ in todo)}
    free, lock = list(cores[-jobs:]), threading.Lock()

    def work(item):
        task, algo, seed = item
        with lock:
            core = free.pop()
        try:
            r = one_run(task, algo, seed, rates[algo], out, log_dir, core, quick, jobs > 1)
        finally:
            with lock:
                free.append(core)
        print(f"  {task:<15} {algo:<5} seed {seed}  {r['steps']:>10,} steps  "
              f"{r['wall_s'] / 60:6.1f} min  final {r['eval_returns'][0][-1]:7.1f}", flush=True)
        return r

    with ThreadPoolExecutor(jobs) as pool:
        for f in [pool.submit(work, item) for item in todo]:
            f.result()
    return todo


# --------------------------------------------------------------------------- table and figure

def merged(rows: List[Dict]) -> Dict[Tuple[str, str], List[Dict]]:
    """The seeds of each (task, agent), in seed order."""
    groups: Dict[Tuple[str, str], List[Dict]] = {}
    for r in sorted(rows, key=lambda r: r["seed"]):
        groups.setdefault((r["task"], r["algo"]), []).append(r)
    return groups


def at_fraction(r: Dict, fraction: float) -> Optional[Tuple[float, int]]:
    """(return, env steps) of the evaluation at `fraction` of the budget: the
    last one before the mark plus half an evaluation interval, since the loop
    rounds each evaluation's step up to a whole chunk of env steps."""
    limit = (fraction + 0.5 / EVALS) * r["steps"]
    hits = [(v, s) for v, s in zip(r["eval_returns"][0], r["eval_steps"]) if s <= limit]
    return hits[-1] if hits else None


def _cell(values: List[Optional[Tuple[float, int]]]) -> str:
    got = [v for v, _ in (x for x in values if x is not None)]
    if not got:
        return ""
    each = ", ".join(f"{v:.0f}" for v in got)
    return f"{np.mean(got):.0f}" + (f" ({each})" if len(got) > 1 else "")


def table(rows: List[Dict]) -> str:
    head = ("| task | agent | seeds | env steps per seed (rate) | at 30 min | at 1 h | at 2 h | "
            "Roxie CPU (500M steps) | Roxie GPU | same algorithm at 1M steps |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    order = {a: i for i, a in enumerate(ALGOS)}
    for (task, algo), seeds in sorted(merged(rows).items(),
                                      key=lambda kv: (TASKS.index(kv[0][0])
                                                      if kv[0][0] in TASKS else 9,
                                                      order.get(kv[0][1], 99))):
        t = TASKS.index(task) if task in TASKS else None
        cells = [_cell([at_fraction(r, f) for r in seeds]) for f in (0.25, 0.5, 1.0)]
        if any(r.get("schedule") != SCHEDULE for r in seeds):
            cells[-1] += " *"
        steps = seeds[0]["eval_steps"][-1]
        roxie = ROXIE.get(algo)
        cpu, gpu = (("", "") if roxie is None or t is None
                    else (str(roxie[0][t]), str(roxie[1][t])))
        name, pub = AT_1M.get(algo, ("", None))
        published = f"{pub[t]} ({name})" if pub and t is not None else ""
        lines.append(f"| {task} | {algo} | {len(seeds)} | {steps / 1e6:.1f}M "
                     f"({seeds[0]['rate']['env_steps_per_s']:.0f}/s) | " + " | ".join(cells)
                     + f" | {cpu} | {gpu} | {published} |")
    return "\n".join(lines)


def figure(rows: List[Dict], path: str) -> str:
    """Eval return against env steps (left) and core-hours (right), a panel
    row per task, a line per seed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = [t for t in TASKS if any(r["task"] == t for r in rows)] or \
        sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 3.8 * len(tasks)), squeeze=False)
    colors = dict(zip(ALGOS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for row, task in zip(axes, tasks):
        for (t, algo), seeds in merged(rows).items():
            if t != task:
                continue
            for k, r in enumerate(seeds):
                kw = dict(color=colors.get(algo), alpha=0.85, lw=1.3,
                          ls="-" if k == 0 else "--", label=f"{algo} seed {r['seed']}")
                row[0].plot(np.asarray(r["eval_steps"]) / 1e6, r["eval_returns"][0], **kw)
                row[1].plot(core_hours(r), r["eval_returns"][0], **kw)
        row[0].set(title=f"{task}: eval return vs env steps", xlabel="env steps (millions)",
                   ylabel="eval return (10 episodes)")
        row[1].set(title=f"{task}: vs core-hours (one core per seed)",
                   xlabel="core-hours (env steps / rate alone)", ylabel="eval return")
        for ax in row:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


NOTE = ("Budgets differ: ours are 2 hours of one core per seed (the env-step budget fixed "
        "from each agent's rate measured alone, rates.json), Roxie's 500M env steps per run on "
        "about 5 cores for 7-22 hours (35-110 core-hours, one seed), the 1M-step values one env "
        "with one update per step. Returns: the last evaluation within each mark (10 "
        "deterministic episodes from held-out initial states), mean over seeds, each seed in "
        "brackets. Sources of the published values: published_sources.md.")
OLD_SCHEDULE = (" A * marks rows run under the first schedule: their budget was not a whole "
                "number of evaluation periods, so each run evaluated a 13th time, shortly after "
                "the 12th (2,048 env steps later for D4PG), and the 2 h column reads that one; "
                "runs since end on their 12th.")


def write_report(rows: List[Dict], out: str) -> str:
    text = table(rows) + "\n\n" + NOTE + OLD_SCHEDULE
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text + "\n")
    if rows:
        figure(rows, os.path.join(out, "curves.png"))
    print(text)
    return text
