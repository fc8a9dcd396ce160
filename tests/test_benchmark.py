"""scripts/benchmark.py runs end to end (smoke check only: timed assertions do
not belong in tests)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "benchmark.py")


def _run(*args, timeout=240):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_envs_quick_prints_a_table():
    r = _run("envs", "--quick")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    head = [i for i, l in enumerate(lines) if "raw rollout" in l and "native/raw" in l]
    assert head, r.stdout
    rows = [l for l in lines[head[-1] + 2:] if l.startswith("cartpole_balance")]
    assert len(rows) == 1, r.stdout
    fields = rows[0].split()
    assert fields[1] == "16"
    raw, native, ratio, cpu_ratio = (float(x) for x in fields[2:6])
    assert raw > 0 and native > 0 and ratio > 0 and cpu_ratio > 0
    assert abs(ratio - native / raw) < 0.5  # the ratio column is about native/raw
    assert re.search(r"mjx: skipped", r.stdout)


def test_bad_task_is_one_line_and_exit_2():
    r = _run("envs", "--tasks", "cheetah_fly", "--skip-mjx")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and "cheetah_fly" in err[0] and "cheetah_run" in err[0]


def test_mode_is_required():
    r = _run()
    assert r.returncode == 2
    assert "envs" in r.stderr


def test_train_quick_prints_reference_and_agent_rows():
    r = _run("train", "--quick", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [l for l in r.stdout.splitlines() if l.startswith("cartpole_balance")]
    assert len(rows) == 3, r.stdout
    assert "reference TD3" in rows[0] and "1.00x" in rows[0]
    # columns: ... env steps/s, vs ref, wall s (no eval return in these rows)
    sps, ratio = rows[1].split()[-3:-1]
    assert " td3 " in rows[1] and float(sps) > 0 and ratio.endswith("x") and float(ratio[:-1]) > 0
