"""Export one seed's trained policy to a small file (for release/).

    python scripts/export.py runs/cheetah_run__td3__1__1700000000 --seed-index 0 \
        --out release/cheetah_run__td3.npz
    python scripts/export.py docs/results/standard/cheetah_run__td3.policy.npz \
        --seed-index 1 --out p.npz

The file holds the actor parameters, observation statistics and
hyperparameters of that seed, the agent, task and config, the seed's last
evaluation return (from the run's TensorBoard logs, or the result JSON next
to a standard-benchmark policy file) and a check return: one deterministic
native episode from a fixed held-out start state, replayed by
tests/test_policy.py to show the file still reproduces. Load it with
common.policy.load_policy; score it with scripts/evaluate.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import json
import math
from typing import Optional

from common.errors import ArgumentParser, UserError, exit_on_user_error


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser.from_doc(__doc__)
    p.add_argument(
        "source",
        metavar="RUN_OR_CHECKPOINT",
        help="a run directory, a checkpoint .npz, a standard-benchmark .policy.npz "
        "or an exported file",
    )
    p.add_argument(
        "--seed-index", type=int, default=0, help="which of its seeds to export (default 0)"
    )
    p.add_argument("--out", required=True, help="the policy file to write (.npz)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if not args.out.endswith(".npz"):
        raise UserError(
            f"--out {args.out!r}: a policy file is an .npz archive, name it <something>.npz"
        )
    return args


def logged_eval_return(policy) -> Optional[float]:
    """The seed's last logged evaluation return: from its TensorBoard stream
    when the policy comes from a run's checkpoint, from the result JSON next
    to a standard-benchmark policy file; None when there is none."""
    if policy.kind == "checkpoint" and not policy.header.get(
        "sweep"
    ):  # a sweep's streams are per combination
        stream = os.path.join(
            os.path.dirname(policy.path), f"seed_{policy.config.seed + policy.seed_index}"
        )
        if os.path.isdir(stream):
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import plot

            values = plot.read_seed(stream, "eval/episode_return")[0].values
            return float(values[-1]) if len(values) else None
    if policy.kind == "policy_part" and policy.path.endswith(".policy.npz"):
        result = policy.path[: -len(".policy.npz")] + ".json"
        try:
            with open(result) as f:
                return float(json.load(f)["eval_returns"][policy.seed_index][-1])
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None
    return None


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    from common.policy import export, load_policy

    policy = load_policy(args.source, args.seed_index)
    eval_return = (
        policy.eval_return if policy.eval_return is not None else logged_eval_return(policy)
    )
    header = export(policy, args.out, eval_return)
    size = os.path.getsize(args.out)
    shown = "unknown" if header["eval_return"] is None else f"{header['eval_return']:.2f}"
    check = header["check"]["return"]
    print(
        f"wrote {args.out} ({size / 1024:.1f} KiB): {policy.algo} on {policy.task}, seed index "
        f"{policy.seed_index}, eval return {shown}, check return {check:.4f}"
        f"{'' if math.isfinite(check) else ' (not finite)'}"
    )
    return header


if __name__ == "__main__":
    os.environ.setdefault("MUJOCO_GL", "disable")  # nothing is drawn: no GL probing or warnings
    main()
