"""The standard-budget table and figure (scripts/benchmarks/standard.py) on
synthetic results with known values: returns at 50k/100k per seed, PPO's
budget from the median off-policy wall-clock, the published column, the
report regenerated from the result files alone."""
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from benchmarks import published  # noqa: E402
from benchmarks import standard as bs  # noqa: E402


def _result(algo, task, finals, wall=600.0, steps=100_000, every=10_000):
    eval_steps = list(range(every, steps + 1, every))
    # seed k's return at step s: finals[k] * s / steps (so 50k is half of the final)
    returns = [[f * s / steps for s in eval_steps] for f in finals]
    seconds = [[wall * s / steps for s in eval_steps] for _ in finals]
    return dict(algo=algo, task=task, seeds=len(finals), steps=steps, eval_steps=eval_steps,
                eval_returns=returns, eval_seconds=seconds, wall_s=wall, train_s=wall,
                sps_per_seed=steps / wall, resumed=False, shared_machine=True, command="python ...")


def test_table_reports_each_seed_at_50k_and_100k_and_the_published_sac_column():
    rows = [_result("td3", "walker_walk", [900.0, 700.0]),
            _result("sac", "walker_walk", [960.0, 980.0]),
            _result("ppo", "walker_walk", [300.0, 500.0], steps=2_000_000, every=200_000)]
    text = bs.table(rows, published.ours_column)
    lines = {ln.split("|")[2].strip(): ln for ln in text.splitlines()[2:]}
    td3 = [c.strip() for c in lines["td3"].split("|")]
    assert td3[3] == "400 (450, 350)" and td3[4] == "800 (900, 700)"     # 50k: half, 100k: final
    assert td3[5].startswith("800 (900, 700) (100k)") and td3[6] == "10 min" and td3[7] == "167"
    sac = [c.strip() for c in lines["sac"].split("|")]
    assert sac[4] == "970 (960, 980)" and "708 (TD-MPC2)" in sac[8] and "891 (CURL" in sac[8]
    ppo = [c.strip() for c in lines["ppo"].split("|")]
    assert ppo[3] == ppo[4] == "" and ppo[5] == "400 (300, 500) (2000k)"   # PPO: only its final
    assert list(lines) == ["td3", "sac", "ppo"]                          # the agents' fixed order


def test_ppo_budget_is_the_median_off_policy_wall_clock_times_its_rate():
    walls = (100, 200, 300, 400, 500, 900)
    rows = [_result(a, "cheetah_run", [1.0], wall=w) for a, w in zip(bs.OFF_POLICY, walls)]
    # median of the six walls is 350 s; less 50 s start-up, at 1000 steps/s: 300k, in whole rollouts
    assert bs.ppo_budget(rows, "cheetah_run", 1000.0, 30_720, startup=50.0) == 9 * 30_720
    assert bs.ppo_budget(rows[:5], "cheetah_run", 1000.0, 30_720) is None  # a run still missing
    assert bs.ppo_budget(rows, "walker_walk", 1000.0, 30_720) is None


def test_report_is_regenerated_from_the_result_files(tmp_path):
    for r in (_result("td3", "walker_walk", [900.0, 700.0]),
              _result("ddpg", "cheetah_run", [100.0, 300.0])):
        with open(bs.result_path(str(tmp_path), r["task"], r["algo"]), "w") as f:
            json.dump(r, f)
    rows = bs.load_results(str(tmp_path))
    assert sorted((r["task"], r["algo"]) for r in rows) == [("cheetah_run", "ddpg"),
                                                            ("walker_walk", "td3")]
    text = bs.write_report(rows, str(tmp_path))
    assert "| walker_walk | td3 | 400 (450, 350) | 800 (900, 700) |" in text
    assert "| cheetah_run | ddpg | 100 (50, 150) | 200 (100, 300) |" in text
    assert "| SimbaV2 |" in text and (tmp_path / "table.md").read_text().strip() == text.strip()
    png = tmp_path / "curves.png"
    assert png.exists() and png.stat().st_size > 10_000


def test_returns_at_a_step_that_was_not_evaluated_is_none():
    r = _result("td3", "walker_walk", [900.0, 700.0])
    assert bs.returns_at(r, 55_000) is None
    np.testing.assert_allclose(bs.returns_at(r, 30_000), [270.0, 210.0])
