"""The humanoid benchmark's plan, budget, resumable loop and report
(scripts/benchmarks/humanoid.py), without training: the runs it would start
are recorded by a stand-in, the report is built from result files written
here."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))
from benchmarks import humanoid  # noqa: E402


def test_plan_is_every_agent_on_walk_and_the_best_on_stand_and_run():
    runs = humanoid.plan()
    assert runs[0] == ("humanoid_walk", humanoid.BEST[0], 1)   # the best agent starts first
    walk = [(a, s) for t, a, s in runs if t == "humanoid_walk"]
    assert sorted(a for a, s in walk if s == 1) == sorted(humanoid.ALGOS)
    assert sorted(a for a, s in walk if s == 2) == sorted(humanoid.BEST)
    for task in ("humanoid_stand", "humanoid_run"):
        assert [(a, s) for t, a, s in runs if t == task] == [(humanoid.BEST[0], 1),
                                                              (humanoid.BEST[0], 2)]
    assert len(runs) == len(set(runs)) == 18   # 7 + 7 second seeds + 2 x 2


def test_budget_is_the_rate_measured_alone_times_two_hours():
    assert humanoid.budget(1285.0) == 1285 * 7200
    assert humanoid.command("td3", "humanoid_walk", 2, 1_200_000, "x")[-12:] == [
        "--seed", "2", "--total-timesteps", "1200000", "--eval-every", "100000",
        "--eval-episodes", "10", "--checkpoint-every", "100000", "--log-dir", "x"]


def fake_result(task, algo, seed, returns, steps=1_200_000, rate=1000.0):
    evals = [steps * (k + 1) // 12 for k in range(12)]
    return dict(algo=algo, task=task, seed=seed, steps=steps, rate={"env_steps_per_s": rate},
                wall_s=7200.0, schedule=humanoid.SCHEDULE,
                eval_steps=evals[:len(returns)], eval_returns=[returns],
                eval_seconds=[[600.0 * (k + 1) for k in range(len(returns))]])


def test_mode_calibrates_once_and_runs_only_what_is_missing(tmp_path, monkeypatch):
    started, calibrated = [], []
    monkeypatch.setattr(humanoid, "calibrate",
                        lambda algo, *a: calibrated.append(algo) or {"env_steps_per_s": 10.0})

    def one_run(task, algo, seed, rate, out, *a):
        started.append((task, algo, seed))
        with open(humanoid.result_path(out, task, algo, seed), "w") as f:
            json.dump(fake_result(task, algo, seed, [1.0] * 12), f)
        return fake_result(task, algo, seed, [1.0] * 12)

    monkeypatch.setattr(humanoid, "one_run", one_run)
    done = ("humanoid_walk", "d4pg", 1)
    with open(humanoid.result_path(str(tmp_path), *done), "w") as f:
        json.dump(fake_result(*done, [5.0] * 12), f)
    humanoid.humanoid_mode(str(tmp_path), jobs=1, log_dir=str(tmp_path / "logs"))
    assert sorted(started) == sorted(r for r in humanoid.plan() if r != done)
    assert sorted(calibrated) == sorted(set(humanoid.ALGOS))  # once per agent with runs to do
    started.clear()
    humanoid.humanoid_mode(str(tmp_path), jobs=1, log_dir=str(tmp_path / "logs"))
    assert started == []  # everything is in: a rerun starts nothing
    only = humanoid.plan()[1]
    os.remove(humanoid.result_path(str(tmp_path), *only))
    humanoid.humanoid_mode(str(tmp_path), jobs=1, only=[f"{only[0]}:{only[1]}"],
                           log_dir=str(tmp_path / "logs"))
    assert started == [only]


def test_table_reports_quarter_half_and_full_budget_beside_roxie(tmp_path):
    rows = [fake_result("humanoid_walk", "sac", 1, [10.0 * (k + 1) for k in range(12)]),
            fake_result("humanoid_walk", "sac", 2, [20.0 * (k + 1) for k in range(12)]),
            fake_result("humanoid_run", "d4pg", 1, [3.0] * 5)]   # stopped early
    text = humanoid.write_report(rows, str(tmp_path))
    walk = next(line for line in text.splitlines() if line.startswith("| humanoid_walk | sac"))
    cells = [c.strip() for c in walk.split("|")[1:-1]]
    # evaluations 3, 6 and 12 of 12: mean over the seeds, then each seed
    assert cells[4:7] == ["45 (30, 60)", "90 (60, 120)", "180 (120, 240)"]
    assert cells[7:10] == ["841", "573", "274 (plain SAC)"]
    run = next(line for line in text.splitlines() if line.startswith("| humanoid_run | d4pg"))
    assert [c.strip() for c in run.split("|")[1:-1]][4:8] == ["3", "3", "3", "692"]
    assert (tmp_path / "table.md").read_text().startswith("| task | agent |")
    # a row of the first schedule (no `schedule` field) is marked
    old = dict(fake_result("humanoid_stand", "d4pg", 1, [5.0] * 12), schedule=None)
    stand = next(line for line in humanoid.table([old]).splitlines()
                 if line.startswith("| humanoid_stand"))
    assert [c.strip() for c in stand.split("|")[1:-1]][6] == "5 *"
    assert (tmp_path / "curves.png").stat().st_size > 10_000


@pytest.mark.parametrize("fraction,expected", [(0.25, 30.0), (0.5, 60.0), (1.0, 120.0)])
def test_at_fraction_takes_the_last_evaluation_within_it(fraction, expected):
    r = fake_result("humanoid_walk", "td3", 1, [10.0 * (k + 1) for k in range(12)])
    assert humanoid.at_fraction(r, fraction)[0] == expected
    # the loop rounds each evaluation up to a whole chunk of env steps (TD3's
    # benchmark run: its third evaluation at 3,517,440 of a 14,064,227 budget)
    r["eval_steps"] = [s + 1380 for s in r["eval_steps"]]
    assert humanoid.at_fraction(r, fraction)[0] == expected


def test_a_pause_between_sessions_changes_neither_rate_nor_core_hours():
    """A run resumed in a later session: its clock includes the pause, its
    rate and its budget clock must not."""
    steps = [100_000 * (k + 1) for k in range(6)]
    steady = [100.0 * (k + 1) for k in range(6)]
    paused = steady[:3] + [t + 86_400.0 for t in steady[3:]]
    assert humanoid.active_rate(steps, steady) == pytest.approx(1000.0)
    assert humanoid.active_rate(steps, paused) == pytest.approx(1000.0)
    r = fake_result("humanoid_walk", "td3", 1, [1.0] * 12, steps=7_200_000, rate=1000.0)
    r["eval_seconds"] = [[t + (86_400.0 if k >= 6 else 0.0) for k, t in
                          enumerate(r["eval_seconds"][0])]]
    assert humanoid.core_hours(r)[-1] == pytest.approx(2.0)
    assert humanoid.core_hours(r)[5] == pytest.approx(1.0)


@pytest.mark.parametrize("algo", ["d4pg", "ppo"])
def test_budget_is_whole_evaluation_periods_so_the_12th_evaluation_ends_the_run(algo):
    """A budget that was not a multiple of the period made every run
    evaluate a 13th time one chunk after the 12th (issue 38)."""
    from algos import d4pg, ppo
    mod = {"d4pg": d4pg, "ppo": ppo}[algo]
    chunk = humanoid.chunk_steps(algo, "humanoid_walk")
    raw = humanoid.budget(2362.33)
    steps = humanoid.whole_periods(raw, chunk)
    assert raw - humanoid.EVALS * chunk < steps <= raw
    cmd = humanoid.command(algo, "humanoid_walk", 1, steps, "x")
    every = int(cmd[cmd.index("--eval-every") + 1])
    config = mod.AGENT.config_for("humanoid_walk", total_timesteps=steps, eval_every=every,
                                  checkpoint_every=every)
    schedule = (mod.make_schedule(config) if algo == "ppo" else
                d4pg.agent.make_schedule(config, iters_per_step_unit=1))
    assert schedule.steps_per_chunk == chunk
    # the last chunk is the 12th evaluation chunk: no evaluation after it
    assert schedule.num_chunks == humanoid.EVALS * schedule.eval_every
    assert schedule.total_steps == steps
