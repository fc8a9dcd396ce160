"""The humanoid recipe probes: short one-core runs, each kept as a small JSON,
and the table of all of them (docs/results/humanoid/probes.md).

    python scripts/probes.py run NAME --core 1 -- python algos/td3.py --env humanoid_walk ...
    python scripts/probes.py record NAME RUN_DIR --command "python algos/..."
    python scripts/probes.py table

`run` starts the agent's own command pinned to one core, with its logs under
bench/probes/NAME (kept out of git), and records it when it ends. `record`
reads a finished (or stopped) run's TensorBoard logs: its evaluation returns
with their env steps and wall-clock seconds since the run began (compile
included), its env steps/s, its config. `table` regenerates probes.md: a row
per probe with its command, minutes, env steps and the last evaluation
return at 10, 20, 30, 60 and 120 minutes of its own wall-clock.

Minutes are measured, not computed: a probe that shared its core's machine
with tests or compiles records that in its `note`. Its env-step columns are
load-independent.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import glob
import json
import shlex
import subprocess
import time
from typing import Dict, List, Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "results", "humanoid", "probes")
LOGS = os.path.join(ROOT, "bench", "probes")
MARKS = (10, 20, 30, 60, 120)  # minutes


def curve(run_dir: str) -> Dict:
    """Evaluation returns of the run: steps, returns (the mean over its
    seeds), seconds (the first seed's), and with several seeds each seed's
    returns (`seed_returns`)."""
    import plot
    seeds = sorted(glob.glob(os.path.join(run_dir, "seed_*")),
                   key=lambda p: int(p.rsplit("_", 1)[1]))
    series = [plot.read_seed(s, "eval/episode_return")[0] for s in seeds]
    sps, _ = plot.read_seed(seeds[0], "charts/sps")
    n = min(len(x.values) for x in series)
    out = dict(steps=[int(s) for s in series[0].steps[:n]],
               returns=[float(np.mean([x.values[i] for x in series])) for i in range(n)],
               seconds=[float(t) for t in series[0].times[:n]],
               sps=float(np.median(sps.values[len(sps.values) // 2:])) if len(sps.values)
               else None)
    if len(series) > 1:
        out["seed_returns"] = [[float(v) for v in x.values[:n]] for x in series]
    return out


def record(name: str, run_dir: str, command: str, note: str = "", device: str = "cpu") -> Dict:
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    result = dict(name=name, command=command, note=note, config=config, run_dir=run_dir,
                  device=device, date=time.strftime("%Y-%m-%d"), **curve(run_dir))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    table()
    return result


def at_minutes(result: Dict, minutes: float) -> Optional[float]:
    """The last evaluation return logged within `minutes` of the run's start."""
    within = [r for r, s in zip(result["returns"], result["seconds"]) if s <= minutes * 60]
    return within[-1] if within else None


def at_steps(result: Dict, steps: int) -> Optional[float]:
    """The last evaluation return logged at or before `steps` env steps."""
    within = [r for r, s in zip(result["returns"], result["steps"]) if s <= steps]
    return within[-1] if within and result["steps"][-1] >= 0.95 * steps else None


def table(out: Optional[str] = None) -> str:
    out = out or OUT
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        with open(path) as f:
            rows.append(json.load(f))
    rows.sort(key=lambda r: (r["config"]["env"], r["name"]))
    lines = ["# Humanoid recipe probes", "",
             "One run per row, one seed unless its note says (then the mean over seeds), "
             "pinned to one core of a 2-core machine (two probes at "
             "a time). Returns are the mean of 10 deterministic evaluation episodes from held-out "
             "initial states, the last evaluation within each mark of the run's own wall-clock "
             "(compile included), and at 1M and 1.5M env steps. Probes run on the TPU machine "
             "(device `tpu`: several in one program, see their notes) have no minute "
             "columns: their minutes are not one core's. Regenerate with "
             "`python scripts/probes.py table`.", "",
             "| probe | command (flags beyond the agent and task) | env steps/s | env steps | "
             + " | ".join(f"{m} min" for m in MARKS) + " | 1M steps | 1.5M steps | best | note |",
             "|---|---|---|---|" + "---|" * len(MARKS) + "---|---|---|---|"]
    for r in rows:
        # a mark the run reached (within 10%: a 30-minute probe ends near 28-30 min)
        on_cpu = r.get("device", "cpu") == "cpu"
        marks = [at_minutes(r, m) if on_cpu and r["seconds"] and r["seconds"][-1] >= 0.9 * m * 60
                 else None for m in MARKS] + [at_steps(r, 1_000_000), at_steps(r, 1_500_000)]
        cells = ["" if v is None else f"{v:.0f}" for v in marks]
        minutes = r["seconds"][-1] / 60 if r["seconds"] else 0
        where = f"{minutes:.0f} min" if on_cpu else f"{minutes:.0f} min on the {r['device']}"
        note = r["note"]
        if r.get("seed_returns"):
            per = ", ".join(f"{v[-1]:.0f}" for v in r["seed_returns"])
            note = (f"{len(r['seed_returns'])} seeds in one process (returns: their mean; "
                    f"at the last evaluation {per})" + ("; " + note if note else ""))
        lines.append(f"| {r['name']} | `{r['command']}` | {r['sps'] or 0:.0f} | "
                     f"{r['steps'][-1] if r['steps'] else 0:,} ({where}) | "
                     + " | ".join(cells) + f" | {max(r['returns'] or [0]):.0f} | {note} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(os.path.dirname(out), "probes.md"), "w") as f:
        f.write(text)
    if rows:
        figure(rows, os.path.join(os.path.dirname(out), "probes.png"))
    return text


def probe_algo(row: Dict) -> str:
    """The agent a probe ran (from its command; else its name's first word)."""
    m = re.search(r"algos/(\w+)\.py|--algo (\w+)", row.get("command", ""))
    return (m.group(1) or m.group(2)) if m else row["name"].split("_")[0]


def figure(rows: List[Dict], path: str) -> str:
    """Eval return against env steps, one panel per agent (one panel of every
    probe has too many lines to read); minutes are in the table."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups: Dict[str, List[Dict]] = {}
    for r in rows:
        groups.setdefault(probe_algo(r), []).append(r)
    algos = sorted(groups)
    cols = min(4, len(algos))
    nrows = -(-len(algos) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.6 * nrows), squeeze=False)
    for ax, algo in zip(axes.flat, algos):
        for r in groups[algo]:
            ax.plot(np.asarray(r["steps"]) / 1e6, r["returns"], lw=1.2, label=r["name"])
        ax.set(title=f"{algo} probes, humanoid_walk", xlabel="env steps (millions)",
               ylabel="eval return (10 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(algos):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def run(name: str, core: Optional[int], argv: List[str], note: str) -> Dict:
    log_dir = os.path.join(LOGS, name)
    cmd = [sys.executable if a == "python" else a for a in argv] + ["--log-dir", log_dir]
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    with open(os.path.join(LOGS, name + ".log"), "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=pin)
    run_dir = sorted(glob.glob(os.path.join(log_dir, "*")))[-1]
    return record(name, run_dir, " ".join(shlex.quote(a) for a in argv), note)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("name")
    r.add_argument("--core", type=int)
    r.add_argument("--note", default="")
    c = sub.add_parser("record")
    c.add_argument("name")
    c.add_argument("run_dir")
    c.add_argument("--command", required=True)
    c.add_argument("--note", default="")
    c.add_argument("--device", default="cpu",
                   help="where it ran: cpu (one core) or the accelerator's kind (tpu, gpu)")
    sub.add_parser("table")
    return p


def main() -> None:
    p = build_parser()
    argv = sys.argv[1:]
    cmd = argv[argv.index("--") + 1:] if "--" in argv else []
    a = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    os.makedirs(LOGS, exist_ok=True)
    if a.mode == "run":
        run(a.name, a.core, cmd, a.note)
    elif a.mode == "record":
        record(a.name, a.run_dir, a.command, a.note, a.device)
    print(table())


if __name__ == "__main__":
    main()
