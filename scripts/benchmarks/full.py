"""`full` mode: envs, train, scale, learn and standard in one resumable command.

The timing parts (envs, train, scale) each run as their own
`scripts/benchmark.py MODE` process, so that one part's compile caches and
thread pools do not weigh on the next; their printed output is kept under
--out and a part that finished is not rerun. Then the learning table
(learn.py) and the standard runs (standard.py), and the report.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from . import learn, standard
from .util import ENTRY, JOBS, cpu_model, git_commit

HELP = "everything for the README, resumable, under 2 hours here"
DOC = """`full` mode: the README's numbers in one command. Runs, in order, `envs`,
`train`, the seeds-in-one-program vs sequential comparison (`scale`) and
`learn`, writing each part's output under --out and, at the end,
<out>/results.md (machine, commit, tables, figures). Prints the expected
duration first. A part that finished is not rerun: rerun the same command
to resume a half-finished benchmark (the learning table resumes run by run)."""

PARTS = (  # name, arguments, arguments in quick mode, expected minutes (full, quick)
    ("envs", ["envs"], ["envs", "--quick"], 3, 0.5),
    ("train", ["train", "--steps-1env", "2000", "--steps-many", "25600"],
     ["train", "--quick", "--algos", "td3", "ppo"], 28, 2),
    ("scale", ["scale"], ["scale", "--quick"], 7, 1),
)


def add_arguments(f) -> None:
    f.add_argument("--out", default="bench",
                   help="directory for results (rerun with the same --out to resume)")
    f.add_argument("--quick", action="store_true", help="smoke check of every part (a few minutes)")
    f.add_argument("--jobs", type=int, default=JOBS,
                   help="learning runs at a time, each pinned to its own core")


def run(args) -> int:
    return full_mode(args.out, args.quick, args.jobs)


def machine() -> str:
    import platform
    cpu = cpu_model(platform.processor() or "cpu")
    import jax
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM; JAX {jax.__version__} on "
            f"{jax.default_backend()}, Python {platform.python_version()}")


def full_mode(out: str, quick: bool, jobs: int = 2) -> int:
    os.makedirs(out, exist_ok=True)
    learn_left = len(learn.plan(out, quick)[0])
    todo = [p for p in PARTS if not _part_done(out, p[0])]
    parallel = max(1, min(jobs, len(os.sched_getaffinity(0)), learn_left))
    minutes = sum(p[4 if quick else 3] for p in todo) + (
        (0.5 if quick else learn.EST_SECONDS / 60) * learn_left / parallel)
    print(f"full benchmark{' (quick)' if quick else ''} into {out}/: about {minutes:.0f} minutes "
          f"({', '.join(p[0] for p in todo) or 'no'} part(s) left, then learn: {learn_left} "
          f"run(s) left); rerun the same command to resume", flush=True)
    for name, full_args, quick_args, _, _ in todo:
        t0 = time.time()
        args = [sys.executable, ENTRY, *(quick_args if quick else full_args)]
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
    rows = learn.learn_mode(out, quick, jobs=jobs)
    print("== standard", flush=True)
    standard.standard_mode(os.path.join(out, "standard") if quick else standard.RESULTS,
                           jobs, quick)
    figures = learn.plots(rows, out)
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
    parts = [f"# Benchmark results{' (quick smoke run: not results)' if quick else ''}",
             "", f"- date: {datetime.date.today().isoformat()}", f"- commit: {git_commit()}",
             f"- machine: {machine()}",
             f"- learning runs: {learn.SEEDS if not quick else learn.QUICK['seeds']} "
             "seeds vmapped in one program per agent and task, default configs, budgets in env "
             "steps per seed as listed; wall-clock is the whole command (compile included)", ""]
    for name, title in (("envs", "Environment throughput"), ("train", "Training throughput"),
                        ("scale", "Seeds in one program vs sequential runs")):
        path = os.path.join(out, f"{name}.txt")
        if os.path.exists(path):
            parts += [f"## {title}", "", "```", _table_of(open(path).read()).strip(), "```", ""]
    seconds = learn.wall_seconds(quick)
    parts += ["## Learning: final eval return, mean [95% bootstrap CI] over seeds", "",
              learn.learn_table(rows), "",
              f"## Learning at a fixed wall-clock: eval return after {seconds / 60:g} min "
              "(compile included; mean over seeds, env steps per seed reached)", "",
              learn.wall_table(rows, out, seconds), ""]
    for fig in figures:
        if fig.endswith(".png"):
            parts += [f"![{os.path.basename(fig)}]({os.path.relpath(fig, out)})", ""]
    return "\n".join(parts)
