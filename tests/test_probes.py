"""scripts/probes.py: a probe recorded from synthetic TensorBoard logs, and the
table's columns: returns at minutes of one core's wall-clock (none for a
probe run on an accelerator) and at 1M and 1.5M env steps."""
import json
import os
import sys
import time

from tensorboardX import SummaryWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import probes  # noqa: E402


def fake_run(path, seeds):
    """A run directory as RunLogger writes it: config.json and seed_<n>/ event
    files, evaluation k (of steps 0.5M, 1.0M, 1.5M) logged 400 s x k after
    the stream starts."""
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"env": "humanoid_walk"}, f)
    t0 = time.time()
    for seed, values in seeds.items():
        w = SummaryWriter(os.path.join(path, f"seed_{seed}"))
        w.add_scalar("charts/sps", 0.0, 0, walltime=t0)
        for k, v in enumerate(values, 1):
            w.add_scalar("eval/episode_return", v, 500_000 * k, walltime=t0 + 400.0 * k)
            w.add_scalar("charts/sps", 1400.0, 500_000 * k, walltime=t0 + 400.0 * k)
        w.close()


def test_probe_table_reads_minutes_on_one_core_and_env_steps_anywhere(tmp_path, monkeypatch):
    out = tmp_path / "probes"
    monkeypatch.setattr(probes, "OUT", str(out))
    fake_run(str(tmp_path / "cpu"), {1: [2.0, 210.0, 300.0]})
    fake_run(str(tmp_path / "tpu"), {1: [2.0, 100.0, 400.0], 2: [4.0, 300.0, 500.0]})
    probes.record("a_cpu", str(tmp_path / "cpu"), "python algos/td3.py --env humanoid_walk")
    r = probes.record("b_tpu", str(tmp_path / "tpu"), "python scripts/sweep.py --algo td3",
                      note="two seeds", device="tpu")
    assert r["device"] == "tpu" and r["seed_returns"] == [[2.0, 100.0, 400.0],
                                                           [4.0, 300.0, 500.0]]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")
            for line in (tmp_path / "probes.md").read_text().splitlines()
            if line.startswith("| a_cpu") or line.startswith("| b_tpu")}
    # columns: probe, command, sps, env steps, 10/20/30/60/120 min, 1M, 1.5M, best, note
    cpu, tpu = rows["a_cpu"], rows["b_tpu"]
    assert cpu[3] == "1,500,000 (20 min)" and cpu[4:9] == ["2", "300", "", "", ""]
    assert cpu[9:12] == ["210", "300", "300"]
    assert tpu[3] == "1,500,000 (20 min on the tpu)" and tpu[4:9] == [""] * 5
    assert tpu[9:12] == ["200", "450", "450"]   # the mean over its two seeds
    assert "2 seeds in one process" in tpu[12] and "400, 500" in tpu[12]
    assert (tmp_path / "probes.png").stat().st_size > 0


def test_probe_algo_reads_the_agent_from_the_command_or_the_name():
    rows = [dict(name="x_one", command="python algos/td3.py --env humanoid_walk"),
            dict(name="y_two", command="python scripts/sweep.py --algo mpo --sweep a=1,2"),
            dict(name="d4pg_three", command="")]
    assert [probes.probe_algo(r) for r in rows] == ["td3", "mpo", "d4pg"]
