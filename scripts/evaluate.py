"""Score a trained policy: mean return of N deterministic episodes with a 95% interval.

    python scripts/evaluate.py release/cheetah_run__td3.npz --episodes 100
    python scripts/evaluate.py runs/cheetah_run__td3__1__1700000000 --seed-index 1 --backend mjx

The episodes run in parallel (vmapped) from held-out initial states (the
env's evaluation pool, which no training run draws from), their keys split
from PRNGKey(--seed). The interval is the percentile bootstrap of the mean
over the episodes (scripts/plot.py's bootstrap_ci).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse

from common.errors import ArgumentParser, UserError, exit_on_user_error

BACKENDS = ("native", "mjx", "auto")  # as common.envs.BACKENDS (not imported: it loads JAX)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser.from_doc(__doc__)
    p.add_argument(
        "policy",
        metavar="FILE",
        help="an exported policy file (or a run directory, checkpoint, "
        "standard-benchmark .policy.npz)",
    )
    p.add_argument("--episodes", type=int, default=10, help="episodes to run (default 10)")
    p.add_argument(
        "--backend", default="native", help="physics backend: native (default), mjx or auto"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the episodes' initial states (default 0)"
    )
    p.add_argument(
        "--seed-index",
        type=int,
        default=0,
        help="which seed of a run or checkpoint (an exported file holds one: 0)",
    )
    return p


def parse_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.episodes < 1:
        raise UserError(f"--episodes must be positive, got {args.episodes}")
    if args.backend not in BACKENDS:
        raise UserError(f"unknown backend {args.backend!r}; choose one of {', '.join(BACKENDS)}")
    return args


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    import jax
    import numpy as np
    from common.policy import episode_returns, load_policy
    from plot import bootstrap_ci

    policy = load_policy(args.policy, args.seed_index, args.backend)
    returns = episode_returns(
        policy, jax.random.split(jax.random.PRNGKey(args.seed), args.episodes)
    )
    lo, hi = bootstrap_ci(returns)
    ci = "n/a for one episode" if np.isnan(lo) else f"[{lo:.2f}, {hi:.2f}]"
    print(
        f"{policy.algo} on {policy.task}: mean return {returns.mean():.2f}, 95% CI {ci} over "
        f"{args.episodes} episode(s) ({policy.env.backend} physics, held-out initial states, "
        f"seed {args.seed})"
    )
    return returns


if __name__ == "__main__":
    os.environ.setdefault("MUJOCO_GL", "disable")  # nothing is drawn: no GL probing or warnings
    main()
