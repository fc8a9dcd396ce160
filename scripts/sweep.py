"""Hyperparameter sweep: every combination x seed trained at once, in one program.

    python scripts/sweep.py --algo sac --env cheetah_run --num-seeds 4 \\
        --sweep learning_rate=1e-4,3e-4,1e-3 --sweep tau=0.005,0.01

compiles one program that trains the 3 x 2 combinations x 4 seeds = 24
members together (vmapped; the float hyperparameters are traced values), and
shards the members over the devices when JAX sees several. Each member logs
to its own TensorBoard stream, runs/<env>__<algo>_sweep__<seed>__<time>/
<name=value,...>/seed_<s>, tagged with its values; the run ends with a table
of final evaluation returns per combination (mean and spread over seeds),
best first, also saved as results.json.

Axes are the agent's float hyperparameters (its HParams fields; see the
error line for the list), plus `learning_rate`, which sets every *_lr field
of an agent without a learning_rate of its own. Integer and structural
fields (network sizes, num_envs, batch size, ...) change array shapes and
are refused: run those as separate sweeps. Every other option goes to the
agent (`--algo sac --help` lists them); members use the same seed keys in
every combination.
"""
import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.errors import UserError, exit_on_user_error

ALGOS = ("ddpg", "td3", "d4pg", "td4", "sac", "mpo", "ppo")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit status 2, not argparse's usage block
        raise UserError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="scripts/sweep.py", add_help=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", choices=ALGOS, help="agent to sweep")
    p.add_argument("--sweep", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="a float hyperparameter and its values; repeat for more axes (product)")
    p.add_argument("-h", "--help", action="store_true",
                   help="this help; with --algo, the agent's options too")
    return p


@exit_on_user_error
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    p = build_parser()
    args, rest = p.parse_known_args(argv)
    if args.help:
        p.print_help()
        if args.algo is None:
            raise SystemExit(0)
        print(f"\noptions of --algo {args.algo}:")
        rest = ["--help"]
    if args.algo is None:
        raise UserError(f"--algo is required; one of {', '.join(ALGOS)}")
    from common import cli
    module = importlib.import_module(f"algos.{args.algo}")
    return cli.main(module.AGENT, rest, sweep_specs=args.sweep)


if __name__ == "__main__":
    main()
