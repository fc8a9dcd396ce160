"""Build release/: the best seed of every benchmark run, exported.

    python scripts/release.py    # from docs/results/standard/, humanoid/ and accelerator/
    python scripts/release.py --only humanoid_walk__td3    # that file alone; the other
                                                           # rows of release/README.md stay

For each (agent, task) result of the standard benchmark
(scripts/benchmarks/standard.py: `docs/results/standard/<task>__<algo>.json`
and its `.policy.npz`) and of the humanoid benchmark
(scripts/benchmarks/humanoid.py: a JSON and policy per seed), the seed
with the highest final evaluation return is exported with scripts/export.py
to `release/<task>__<algo>.npz`; of the accelerator benchmark's humanoid_walk
runs (scripts/benchmarks/accelerator.py: one seed per agent, 10 minutes on
one accelerator machine), the agent with the highest final return goes to
`release/humanoid_walk__<algo>__accelerator.npz`. `release/README.md` gets a table: agent,
task, env steps, that seed's final evaluation return (10 held-out episodes at
the end of training), the mean over 20 new held-out episodes
(scripts/evaluate.py's interval), the check return the test replays, and
the exact training command. The folder stays under 15 MB.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import glob
import json

from common.errors import UserError, exit_on_user_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = (os.path.join(ROOT, "docs", "results", "standard"),
           os.path.join(ROOT, "docs", "results", "humanoid"))
ACCELERATOR = os.path.join(ROOT, "docs", "results", "accelerator")
ACCELERATOR_TASK = "humanoid_walk"
RELEASE = os.path.join(ROOT, "release")
ORDER = ("td3", "ddpg", "d4pg", "td4", "sac", "mpo", "ppo")
EPISODES = 20
LIMIT_BYTES = 15 * 2**20


def best_seeds(results) -> dict:
    """{(task, algo): (final return, policy file, seed index in it, seed,
    result)} of the seed with the highest final evaluation return, over every
    result JSON with a policy file in the `results` folders (the standard
    benchmark keeps a file per run, the humanoid one a file per seed)."""
    import numpy as np
    best = {}
    for folder in results:
        for path in sorted(glob.glob(os.path.join(folder, "*__*.json"))):
            source = path[: -len(".json")] + ".policy.npz"
            if not os.path.exists(source):
                continue
            with open(path) as f:
                r = json.load(f)
            returns = r["eval_returns"]  # one list per seed; flat: one seed
            finals = [s[-1] for s in (returns if isinstance(returns[0], list) else [returns])]
            index = int(np.argmax(finals))
            seed = r.get("seed", r["config"]["seed"] + index)
            key = (r["task"], r["algo"])
            if key not in best or finals[index] > best[key][0]:
                best[key] = (finals[index], source, index, seed, r)
    return best


def best_accelerator(folder: str = ACCELERATOR, task: str = ACCELERATOR_TASK) -> dict:
    """{(task, algo): ...} as best_seeds, of the one agent whose accelerator
    run on `task` ended highest (empty without such runs)."""
    runs = {k: v for k, v in best_seeds([folder]).items() if k[0] == task}
    if not runs:
        return {}
    key = max(runs, key=lambda k: runs[k][0])
    return {key: runs[key]}


def kept_rows(release: str, only) -> list:
    """release/README.md's table rows of the files not in `only` (their lines
    as written), so that rebuilding one file evaluates only that one."""
    path = os.path.join(release, "README.md")
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.split("|")[1:-1]]
            if len(cells) == 10 and cells[0].endswith(".npz") and cells[0][:-4] not in only \
                    and os.path.exists(os.path.join(release, cells[0])):
                rows.append(dict(file=cells[0], algo=cells[1], task=cells[2], line=line.rstrip()))
    return rows


def build(results=RESULTS, release: str = RELEASE, episodes: int = EPISODES,
          accelerator: str = ACCELERATOR, only=None) -> list:
    """Export and evaluate every release (or the file names, without .npz, in
    `only`; the others' rows are kept as release/README.md has them)."""
    import jax
    import numpy as np

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import export
    import plot
    from common import policy as pol

    os.makedirs(release, exist_ok=True)
    rows = []
    runs = [(key, v, "") for key, v in sorted(best_seeds(results).items())]
    runs += [(key, v, "__accelerator") for key, v in best_accelerator(accelerator).items()]
    if only is not None:
        missing = set(only) - {f"{t}__{a}{suffix}" for (t, a), _, suffix in runs}
        if missing:
            raise UserError(f"--only: no benchmark result releases {', '.join(sorted(missing))}")
        runs = [run for run in runs if f"{run[0][0]}__{run[0][1]}{run[2]}" in only]
        rows = kept_rows(release, only)
    for (task, algo), (final, source, index, seed, r), suffix in runs:
        out = os.path.join(release, f"{task}__{algo}{suffix}.npz")
        header = export.main([source, "--seed-index", str(index), "--out", out])
        policy = pol.load_policy(out)
        returns = pol.episode_returns(policy, jax.random.split(jax.random.PRNGKey(1), episodes))
        lo, hi = plot.bootstrap_ci(returns)
        rows.append(
            dict(
                algo=algo,
                task=task,
                steps=r["eval_steps"][-1],
                seed=seed,
                final=final,
                mean=float(np.mean(returns)),
                lo=lo,
                hi=hi,
                check=header["check"]["return"],
                command=r["command"],
                where=f" ({r['minutes']:g} minutes on {r['machine']})" if suffix else "",
                file=os.path.basename(out),
                kib=os.path.getsize(out) / 1024,
            )
        )
    rows.sort(key=lambda x: (x["task"], x["file"].endswith("__accelerator.npz"),
                             ORDER.index(x["algo"]) if x["algo"] in ORDER else 99))
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(release, "*")))
    if total > LIMIT_BYTES:
        raise SystemExit(f"release/ holds {total / 2**20:.1f} MB, over the 15 MB limit")
    with open(os.path.join(release, "README.md"), "w") as f:
        f.write(readme(rows))
    return rows


def readme(rows: list) -> str:
    lines = [
        "# Released policies",
        "",
        "The best seed (highest final evaluation return) of each run of the standard",
        "benchmark (`python scripts/benchmark.py standard`: walker_walk and cheetah_run,",
        "2 seeds per run, default configs, native physics) and of the humanoid benchmark",
        "(`python scripts/benchmark.py humanoid`: 2 core-hours per seed, each agent's",
        "humanoid defaults, native physics), and the best humanoid walker of the",
        "accelerator benchmark (`python scripts/benchmark.py accelerator runs`: each agent's",
        "command with no flag, 10 minutes on one TPU machine; `__accelerator` in its name),",
        "exported by",
        "`scripts/release.py` with `scripts/export.py`. Each file holds that seed's actor",
        "parameters, observation statistics, config, task, agent, format version,",
        "evaluation return and a check (one deterministic native episode from a fixed",
        "held-out start state: its return, exact on the CPU model that recorded it, and its",
        "first actions, equal to rounding on any machine; tests/test_policy.py replays both).",
        "",
        "```python",
        "import jax",
        "from common.policy import load_policy",
        'policy = load_policy("release/walker_walk__sac.npz")',
        "state = policy.env.reset(jax.random.PRNGKey(0), policy.env.eval_pool)",
        "state = policy.env.step(state, policy.act(state.obs))",
        "```",
        "",
        "`python scripts/render.py release/walker_walk__sac.npz` renders one; "
        "`python scripts/evaluate.py release/walker_walk__sac.npz --episodes 100` scores one.",
        "",
        f"| file | agent | task | env steps | seed | final eval return (10 episodes) | "
        f"mean of {EPISODES} new held-out episodes [95% CI] | check return | size | trained with |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(r["line"] if "line" in r else
            f"| {r['file']} | {r['algo']} | {r['task']} | {r['steps']:,} | {r['seed']} | "
            f"{r['final']:.1f} | {r['mean']:.1f} [{r['lo']:.1f}, {r['hi']:.1f}] | "
            f"{r['check']:.2f} | {r['kib']:.0f} KiB | `{r['command']}`{r.get('where', '')} |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", nargs="+", default=list(RESULTS),
                   help="folders of benchmark results (default: standard and humanoid)")
    p.add_argument("--accelerator", default=ACCELERATOR,
                   help="folder of accelerator benchmark results (its best humanoid walker)")
    p.add_argument("--release", default=RELEASE)
    p.add_argument("--episodes", type=int, default=EPISODES)
    p.add_argument("--only", nargs="+", metavar="FILE",
                   help="rebuild these releases alone (names without .npz, e.g. "
                        "humanoid_walk__td3); the other rows of release/README.md stay")
    return p


@exit_on_user_error
def main(argv=None):
    args = build_parser().parse_args(argv)
    for r in build(args.results, args.release, args.episodes, args.accelerator, args.only):
        if "line" in r:
            continue
        print(
            f"{r['file']:<28} seed {r['seed']}  final {r['final']:7.1f}  "
            f"held-out mean {r['mean']:7.1f} [{r['lo']:.1f}, {r['hi']:.1f}]  {r['kib']:.0f} KiB"
        )


if __name__ == "__main__":
    os.environ.setdefault("MUJOCO_GL", "disable")
    main()
