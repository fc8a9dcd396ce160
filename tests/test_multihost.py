"""Several hosts, on loopback: two processes with one CPU device each
(jax.distributed from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID) run one tiny TD3 with --num-seeds 2, one member each. Both
finish; each writes its own member's logs and checkpoint in its own run
directory (`..._process<k>`); and the same resume command on both, with a
larger budget, continues each process from its own checkpoint."""
import json
import os
import socket
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--env", "cartpole_balance", "--num-seeds", "2", "--num-envs", "2", "--hidden-sizes", "8",
        "--learning-starts", "500", "--batch-size", "16", "--buffer-size", "4000",
        "--eval-every", "1000", "--checkpoint-every", "1000", "--eval-episodes", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(args, tmp_path):
    """Both processes of one run; returns their (returncode, stdout, stderr)."""
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
               JAX_NUM_PROCESSES="2", RL_STALL_TIMEOUT="120")
    # one CPU device per process (no forced device count), compiled cheaply: this
    # checks the processes' plumbing, not the numbers (a third less time, 2026-12-06)
    env["XLA_FLAGS"] = ("--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0 "
                        "--xla_llvm_disable_expensive_passes=true")
    logs = tmp_path.parent / f"{tmp_path.name}_logs"
    logs.mkdir(exist_ok=True)
    procs, files = [], []
    for k in range(2):  # output to files: a full pipe must not block one process
        out, err = open(logs / f"{port}_{k}.out", "w+"), open(logs / f"{port}_{k}.err", "w+")
        files.append((out, err))
        # the second host's clock runs 5 s ahead (a later start, or skew): the
        # run's name must not depend on which host's clock names it
        skew = [] if k == 0 else ["-c", "import runpy, sys, time; t = time.time; "
                                  "time.time = lambda: t() + 5; sys.argv = sys.argv[1:]; "
                                  "runpy.run_path(sys.argv[0], run_name='__main__')"]
        procs.append(subprocess.Popen(
            [sys.executable, *skew, os.path.join(ROOT, "algos", "td3.py"), *args, "--log-dir",
             str(tmp_path)], cwd=ROOT, text=True, env=dict(env, JAX_PROCESS_ID=str(k)),
            stdout=out, stderr=err))
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = []
    for code, (out, err) in zip(codes, files):
        out.seek(0), err.seek(0)
        results.append((code, out.read(), err.read()))
        out.close(), err.close()
    return results


def _header(run_dir):
    with np.load(run_dir / "checkpoint.npz") as z:
        return json.loads(bytes(z["header"]).decode())


def test_two_processes_on_loopback_train_checkpoint_and_resume(tmp_path):
    results = _two_processes(ARGS + ["--total-timesteps", "2000"], tmp_path)
    for k, (code, out, err) in enumerate(results):
        assert code == 0, (k, err[-3000:])
        assert "2 member(s) on 2 device(s)" in out and "final eval return" in out, out
    dirs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [d.name.rsplit("__", 1)[1] for d in dirs] == ["process0", "process1"], dirs
    # one run, one name: process 0's clock, even when the processes start seconds apart
    assert len({d.name.rsplit("__", 1)[0] for d in dirs}) == 1, dirs
    for k, run_dir in enumerate(dirs):
        streams = sorted(p.name for p in run_dir.iterdir() if p.is_dir())
        assert streams == [f"seed_{k + 1}"], streams          # its own member's logs
        assert any(f.stat().st_size > 0 for f in (run_dir / streams[0]).iterdir())
        header = _header(run_dir)
        assert header["members"] == [k] and header["chunk"] == 1, header
    # resume: the same command on both processes (any process's run directory),
    # each continuing its own members from its own checkpoint
    saved = [_header(d)["leaf_paths"] for d in dirs]
    results = _two_processes(ARGS + ["--total-timesteps", "3000", "--resume", str(dirs[0])],
                             tmp_path)
    for k, (code, out, err) in enumerate(results):
        assert code == 0, (k, err[-3000:])
        assert f"resuming {dirs[k]} after chunk 2 of 3" in out, out
    assert sorted(p for p in tmp_path.iterdir() if p.is_dir()) == dirs   # no new run directory
    for k, run_dir in enumerate(dirs):
        header = _header(run_dir)
        assert header["members"] == [k] and header["chunk"] == 2, header
        assert header["leaf_paths"] == saved[k]
