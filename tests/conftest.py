import os

# Keep JAX on CPU and quiet in tests; MuJoCo renders offscreen.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")

# Runs started by the tests keep JAX's compilation cache (common/cli.py, on by
# default) in a directory of this session, not in the user's ~/.cache.
if "RL_COMPILE_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile
    os.environ["RL_COMPILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="rl-tests-jax-cache-")
    atexit.register(shutil.rmtree, os.environ["RL_COMPILE_CACHE_DIR"], True)

# One core per xdist worker, set before JAX and MuJoCo size their thread pools:
# two workers (and their subprocesses) each with pools for both cores
# oversubscribe them (test_td3.py and test_mpo.py on 2 workers, 2026-12-04:
# unpinned 234 s and 431 CPU-s, pinned 211 s and 363 CPU-s).
# test_envs.py checks the multi-threaded physics pool explicitly.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cores = sorted(os.sched_getaffinity(0))
    if len(_cores) > 1:
        os.sched_setaffinity(0, {_cores[int(_worker[2:]) % len(_cores)]})

# xdist hands out whole files (--dist loadfile); send the longest first so
# that the last files to start are short ones and neither worker idles at the
# end (ranked by the seconds each file took on its pinned worker, 2026-12-04).
LONGEST_FIRST = ("test_benchmark.py", "test_reliability.py", "test_sac.py", "test_td3.py",
                 "test_mpo.py", "test_ppo.py", "test_ingredients.py", "test_td4.py", "test_d4pg.py",
                 "test_ddpg.py", "test_multihost.py", "test_envs_mjx.py", "test_sweep.py",
                 "test_policy.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
