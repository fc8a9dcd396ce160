"""The benchmarks behind `python scripts/benchmark.py MODE`, one module per mode.

    envs.py          env steps/s: raw mujoco.rollout vs the native backend vs MJX
    train.py         training env steps/s against Python-loop references; loop efficiency
    scale.py         N seeds vmapped in one program vs N sequential runs
    learn.py         the five-minute learning table (every agent, three tasks)
    standard.py      every agent at 100k env steps beside published values
    humanoid.py      every agent on humanoid_walk (the best on stand and run), 2 core-hours a seed
    full.py          envs, train, scale, learn and standard in one resumable command
    profile_loop.py  where an off-policy loop spends time beyond its update
    published.py     published returns at 50k and 100k env steps (data, not a mode)
    util.py          timers, paths, the machine and commit lines (shared, not a mode)

A mode module provides four names:

    HELP                   one line, listed by `benchmark.py --help`
    DOC                    its `--help` description
    add_arguments(parser)  its options
    run(args) -> int       the mode itself; the exit status

and keeps its top-level imports light (JAX is imported inside the functions
that need it), so `--help` starts quickly. A new mode is a new module here
plus one line in MODES of scripts/benchmark.py.

Imports go one way: util and published import no other module here; envs,
scale, learn and standard import util (standard also published); humanoid
imports util and standard; train imports envs; profile_loop imports train;
full imports learn and standard and starts the other parts as
`scripts/benchmark.py` subprocesses. No module here imports
scripts/benchmark.py (tests/test_benchmark.py checks the graph).
"""
import os
import sys

# algos/ and common/, for the modules here and for whoever imports them
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
