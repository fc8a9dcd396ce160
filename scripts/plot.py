"""Learning curves and a table of final returns from the TensorBoard logs of runs.

    python scripts/plot.py runs/cheetah_run__td3__1__1700000000 runs/cheetah_run__sac__1__1700000100
    python scripts/plot.py runs/ --tag charts/episode_return --format png pdf --out results/returns

Each argument is a run directory (runs/<env>__<algo>__<seed>__<time>/, with
config.json and one `seed_<n>/` folder of event files per seed; a sweep's
`<combination>/seed_<n>/`) or a folder of run directories. Seeds of runs of
the same task and agent are pooled. Per task, a panel shows each agent's mean
over seeds with a 95% bootstrap confidence band, against env steps and against
wall-clock time (event time minus the first event's, per seed). The markdown
table gives each (task, agent)'s final return (each seed's last logged value):
mean, 95% bootstrap confidence interval, number of seeds, env steps.

Reads the event files directly (TFRecord framing, tensorboardX's protobufs):
no TensorBoard install needed.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import glob
import json
import struct
from collections import defaultdict
from typing import Dict, Iterator, List, NamedTuple, Tuple

import numpy as np

from common.errors import ArgumentParser, UserError, exit_on_user_error

FORMATS = ("png", "pdf")
RESAMPLES = 10_000  # bootstrap resamples for the table (the curves use fewer)


# --------------------------------------------------------------------------- reading

def records(path: str) -> Iterator[bytes]:
    """Payloads of a TFRecord file; stops at a torn tail (a run still writing)."""
    from tensorboardX.record_writer import masked_crc32c
    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if len(header) < 12:
                return
            length, crc = struct.unpack("<QI", header)
            if masked_crc32c(header[:8]) != crc:
                raise UserError(f"corrupt event file {path!r} (bad record header)")
            data = f.read(length)
            if len(data) < length or len(f.read(4)) < 4:
                return
            yield data


def scalar_value(value) -> float:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    t = value.tensor
    if t.float_val:
        return float(t.float_val[0])
    if t.double_val:
        return float(t.double_val[0])
    if t.tensor_content:
        dtype = {1: np.float32, 2: np.float64}.get(t.dtype, np.float32)
        return float(np.frombuffer(t.tensor_content, dtype)[0])
    return float("nan")


class Series(NamedTuple):
    steps: np.ndarray   # int64, increasing
    values: np.ndarray  # float64
    times: np.ndarray   # seconds since the stream's first event


def read_seed(directory: str, tag: str) -> Tuple[Series, set]:
    """One seed's stream from all its event files (a resumed run adds one),
    in the order they were started; a step logged twice keeps the later
    value. Times are seconds since the stream's first event (the writer's
    creation, before compiling). Also returns every tag seen."""
    from tensorboardX.proto import event_pb2
    files = []
    for path in glob.glob(os.path.join(directory, "*tfevents*")):
        events = []
        for data in records(path):
            try:
                events.append(event_pb2.Event.FromString(data))
            except Exception:
                raise UserError(f"corrupt event file {path!r} (undecodable record)") from None
        if events:
            files.append((events[0].wall_time, path, events))
    files.sort()
    points, tags = {}, set()
    start = files[0][0] if files else 0.0
    for _, _, events in files:
        for event in events:
            for value in event.summary.value:
                tags.add(value.tag)
                if value.tag == tag:
                    points[int(event.step)] = (scalar_value(value), event.wall_time - start)
    steps = np.array(sorted(points), np.int64)
    values = np.array([points[s][0] for s in steps], np.float64)
    times = np.array([points[s][1] for s in steps], np.float64)
    return Series(steps, values, times), tags


class Group(NamedTuple):
    task: str
    agent: str


def run_dirs(path: str) -> List[str]:
    if not os.path.isdir(path):
        raise UserError(f"no run directory at {path!r}")
    if glob.glob(os.path.join(path, "**", "seed_*"), recursive=True) and (
            os.path.exists(os.path.join(path, "config.json"))
            or glob.glob(os.path.join(path, "seed_*"))):
        return [path]
    found = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(path, "*", "config.json")))
    if not found:
        raise UserError(f"{path!r} is neither a run directory (config.json and seed_<n>/ folders) "
                        f"nor a folder of run directories")
    return found


def describe_run(run: str) -> Tuple[str, str]:
    """(task, agent) of a run: config.json's env, the agent from the run
    directory's name <env>__<algo>__<seed>__<time>."""
    name = os.path.basename(os.path.normpath(run))
    parts = name.split("__")
    task = parts[0]
    try:
        with open(os.path.join(run, "config.json")) as f:
            task = json.load(f).get("env", task)
    except (OSError, ValueError):
        pass
    agent = parts[1] if len(parts) >= 4 else name
    return task, agent


def load(paths: List[str], tag: str, by_run: bool = False) -> Dict[Group, List[Series]]:
    """Every seed's series of `tag`, grouped by (task, agent)."""
    groups: Dict[Group, List[Series]] = defaultdict(list)
    seen_tags = set()
    runs = list(dict.fromkeys(os.path.abspath(r) for p in paths for r in run_dirs(p)))
    for run in runs:
        task, agent = describe_run(run)
        if by_run:
            agent = os.path.basename(run)
        seeds = sorted(glob.glob(os.path.join(run, "**", "seed_*"), recursive=True))
        for seed_dir in seeds:
            if not os.path.isdir(seed_dir):
                continue
            series, tags = read_seed(seed_dir, tag)
            seen_tags |= tags
            if len(series.steps) == 0:
                continue
            member = os.path.relpath(os.path.dirname(seed_dir), run)  # a sweep's combination
            label = agent if member == "." else f"{agent} {member}"
            groups[Group(task, label)].append(series)
    if not groups:
        have = ", ".join(sorted(seen_tags)) or "none"
        raise UserError(f"no {tag!r} scalars in {', '.join(paths)}; tags found: {have}")
    return dict(sorted(groups.items()))


# --------------------------------------------------------------------------- statistics

def bootstrap_ci(values, resamples: int = RESAMPLES, seed: int = 0) -> Tuple[float, float]:
    """95% percentile-bootstrap interval of the mean; NaN for one value."""
    values = np.asarray(values, np.float64)
    if len(values) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    # equal values: exactly that value, not a rounding of their mean
    return (float(np.clip(lo, values.min(), values.max())),
            float(np.clip(hi, values.min(), values.max())))


class Curve(NamedTuple):
    steps: np.ndarray
    times: np.ndarray   # mean over the seeds logged at each step
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


def curve(seeds: List[Series], resamples: int = 1000) -> Curve:
    steps = np.unique(np.concatenate([s.steps for s in seeds]))
    rows = []
    for step in steps:
        vals, times = [], []
        for s in seeds:
            i = np.searchsorted(s.steps, step)
            if i < len(s.steps) and s.steps[i] == step:
                vals.append(s.values[i])
                times.append(s.times[i])
        rows.append((np.mean(times), np.mean(vals), *bootstrap_ci(vals, resamples)))
    times, mean, lo, hi = map(np.array, zip(*rows))
    return Curve(steps, times, mean, lo, hi)


class Final(NamedTuple):
    task: str
    agent: str
    mean: float
    lo: float
    hi: float
    seeds: int
    steps: Tuple[int, int]  # min and max over seeds of the last logged step


def finals(groups: Dict[Group, List[Series]]) -> List[Final]:
    out = []
    for g, seeds in groups.items():
        last = np.array([s.values[-1] for s in seeds])
        steps = [int(s.steps[-1]) for s in seeds]
        out.append(Final(g.task, g.agent, float(last.mean()), *bootstrap_ci(last), len(seeds),
                         (min(steps), max(steps))))
    return out


def table(rows: List[Final], tag: str) -> str:
    lines = [f"Final `{tag}` (each seed's last logged value): mean over seeds, "
             f"95% bootstrap confidence interval of the mean.", "",
             "| task | agent | mean | 95% CI | seeds | env steps |", "|---|---|---:|---|---:|---:|"]
    for r in rows:
        ci = "n/a (1 seed)" if r.seeds < 2 else f"[{r.lo:.1f}, {r.hi:.1f}]"
        steps = f"{r.steps[0]}" if r.steps[0] == r.steps[1] else f"{r.steps[0]}-{r.steps[1]}"
        lines.append(f"| {r.task} | {r.agent} | {r.mean:.1f} | {ci} | {r.seeds} | {steps} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- figure

def time_unit(seconds: float) -> Tuple[str, float]:
    if seconds >= 2 * 3600:
        return "h", 3600.0
    if seconds >= 2 * 60:
        return "min", 60.0
    return "s", 1.0


def figure(groups: Dict[Group, List[Series]], tag: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = list(dict.fromkeys(g.task for g in groups))
    agents = list(dict.fromkeys(g.agent for g in groups))
    colors = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(agents)}
    curves = {g: curve(seeds) for g, seeds in groups.items()}
    fig, axes = plt.subplots(2, len(tasks), figsize=(4.5 * len(tasks), 7), squeeze=False)
    for col, task in enumerate(tasks):
        mine = {g: c for g, c in curves.items() if g.task == task}
        unit, scale = time_unit(max(c.times.max() for c in mine.values()))
        axes_x = ((lambda c: c.steps, "env steps"),
                  (lambda c: c.times / scale, f"wall-clock time ({unit})"))
        for row, (x_of, xlabel) in enumerate(axes_x):
            ax = axes[row, col]
            for g, c in mine.items():
                n = len(groups[g])
                ax.plot(x_of(c), c.mean, color=colors[g.agent],
                        label=f"{g.agent} ({n} seed{'s' * (n > 1)})")
                if n > 1:
                    ax.fill_between(x_of(c), c.lo, c.hi, color=colors[g.agent], alpha=0.2,
                                    linewidth=0)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(tag)
            ax.set_title(task)
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories, or folders of them")
    p.add_argument("--tag", default="eval/episode_return",
                   help="scalar to plot (default eval/episode_return; e.g. charts/episode_return)")
    p.add_argument("--out", default="returns",
                   help="output path without extension: writes OUT.<format> and OUT.md "
                        "(default returns)")
    p.add_argument("--format", nargs="+", default=["png"], choices=FORMATS,
                   help="figure format(s) (default png)")
    p.add_argument("--by-run", action="store_true",
                   help="one curve per run directory instead of pooling the runs of an agent")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    groups = load(args.runs, args.tag, args.by_run)
    out = os.path.splitext(args.out)[0] if args.out.endswith((".png", ".pdf", ".md")) else args.out
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    text = table(finals(groups), args.tag)
    with open(out + ".md", "w") as f:
        f.write(text)
    fig = figure(groups, args.tag)
    written = []
    for fmt in dict.fromkeys(args.format):
        fig.savefig(f"{out}.{fmt}", dpi=120)
        written.append(f"{out}.{fmt}")
    print(text)
    print(f"wrote {', '.join(written)} and {out}.md")
    return text


if __name__ == "__main__":
    main()
