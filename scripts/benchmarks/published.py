"""Published evaluation returns of state-based agents on walker_walk and
cheetah_run at 50k and 100k env steps, shown beside ours by the
`standard` mode (standard.py). Every source counts env steps as native control
steps (1000 per episode); those with action repeat 2 (AR2) took half as many
decisions. Ours use action repeat 1, so at 100k env steps they took 100k
decisions: the comparison is at equal env steps (samples of the simulator).
Where each number comes from, and how it was checked, is in
docs/results/standard/published_sources.md."""
from typing import Dict, List, Optional

# method, source, seeds, action repeat, {(task, step): mean}
PUBLISHED: List[Dict] = [
    dict(method="SAC", source="TD-MPC2 repo results/sac", seeds=3, ar="2",
         values={("walker_walk", 100_000): 708.2, ("cheetah_run", 100_000): 310.1}),
    dict(method="SAC", source="SimBa repo results/sac", seeds=10, ar="2",
         values={("walker_walk", 50_000): 340.9, ("walker_walk", 100_000): 782.8,
                 ("cheetah_run", 50_000): 178.6, ("cheetah_run", 100_000): 328.6}),
    dict(method="SAC", source="SimbaV2 repo results/baseline/sac", seeds="2 / 3", ar="2",
         values={("walker_walk", 100_000): 448.6, ("cheetah_run", 100_000): 177.8}),
    dict(method="State SAC", source="CURL (arXiv 2004.04136) Table 1", seeds="n/a", ar="n/a",
         values={("walker_walk", 100_000): 891.0, ("cheetah_run", 100_000): 616.0}),
    dict(method="TD7", source="SimBa repo results/td7", seeds=5, ar="n/a",
         values={("walker_walk", 50_000): 20.3, ("walker_walk", 100_000): 671.9,
                 ("cheetah_run", 50_000): 2.3, ("cheetah_run", 100_000): 470.1}),
    dict(method="BRO (UTD 10)", source="SimbaV2 repo results/baseline/bro_utd10", seeds=5, ar="1",
         values={("walker_walk", 50_000): 933.8, ("walker_walk", 100_000): 963.2,
                 ("cheetah_run", 50_000): 372.8, ("cheetah_run", 100_000): 530.9}),
    dict(method="SimBa", source="SimBa repo results/sac_simba", seeds=10, ar="2",
         values={("walker_walk", 50_000): 900.1, ("walker_walk", 100_000): 951.4,
                 ("cheetah_run", 50_000): 429.0, ("cheetah_run", 100_000): 558.9}),
    dict(method="SimbaV2", source="SimbaV2 repo results/baseline/simbaV2_utd2", seeds=10, ar="2",
         values={("walker_walk", 100_000): 961.5, ("cheetah_run", 100_000): 641.8}),
    dict(method="TD-MPC2", source="TD-MPC2 repo results/tdmpc2", seeds=3, ar="2",
         values={("walker_walk", 100_000): 961.9, ("cheetah_run", 100_000): 519.1}),
    dict(method="DreamerV3", source="TD-MPC2 repo results/dreamerv3", seeds=3, ar="2",
         values={("walker_walk", 100_000): 630.1, ("cheetah_run", 100_000): 335.7}),
]
TASKS = ("walker_walk", "cheetah_run")
STEPS = (50_000, 100_000)


def cell(method_prefix: str, task: str, step: int = 100_000) -> str:
    """The published values of methods whose name starts with `method_prefix`
    (e.g. "SAC" for our SAC row), as 'value (source)'."""
    hits = [(p["values"][(task, step)], p["source"]) for p in PUBLISHED
            if p["method"].split()[-1].startswith(method_prefix) and (task, step) in p["values"]]
    return "; ".join(f"{v:.0f} ({s.split(' ')[0]})" for v, s in hits)


def table(tasks=TASKS, steps=STEPS) -> str:
    """Markdown: every published entry at each task and step."""
    cols = [(t, s) for t in tasks for s in steps]
    head = ("| method | source | seeds | action repeat | "
            + " | ".join(f"{t} {s // 1000}k" for t, s in cols) + " |")
    lines = [head, "|" + "---|" * (4 + len(cols))]
    for p in PUBLISHED:
        vals = [f"{p['values'][c]:.0f}" if c in p["values"] else "" for c in cols]
        lines.append(f"| {p['method']} | {p['source']} | {p['seeds']} | {p['ar']} | "
                     + " | ".join(vals) + " |")
    return "\n".join(lines)


def ours_column(task: str, algo: str) -> Optional[str]:
    """Published values for the same algorithm as one of ours (only SAC has
    published state-based numbers at this budget among our seven)."""
    return cell("SAC", task) if algo == "sac" else None
