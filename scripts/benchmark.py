"""Throughput benchmarks, each printed next to a reference measured in the same run.

    python scripts/benchmark.py envs              # env steps/s: raw MuJoCo vs native vs mjx
    python scripts/benchmark.py envs --quick      # a smoke check in well under a minute
    python scripts/benchmark.py MODE --help       # what a mode measures, and its options

The one command line of the benchmarks; each mode is a module of
scripts/benchmarks/ (its docstring says what the modes share and how to add
one).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = {  # mode: its module in scripts/benchmarks/, in the order --help lists them
    "envs": "envs",
    "train": "train",
    "scale": "scale",
    "learn": "learn",
    "full": "full",
    "standard": "standard",
    "humanoid": "humanoid",
    "profile": "profile_loop",
    "accelerator": "accelerator",
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every mode (imports each mode's module: no JAX yet)."""
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=raw)
    modes = p.add_subparsers(dest="mode", required=True)
    for mode, module in MODES.items():
        m = importlib.import_module(f"benchmarks.{module}")
        m.add_arguments(modes.add_parser(mode, help=m.HELP, description=m.DOC,
                                         formatter_class=raw))
    return p


def main(argv: Optional[List[str]] = None) -> int:
    from common.errors import UserError
    args = build_parser().parse_args(argv)
    if getattr(args, "jobs", 1) < 1:
        raise UserError("--jobs must be positive")
    return importlib.import_module(f"benchmarks.{MODES[args.mode]}").run(args)


if __name__ == "__main__":
    from common.errors import exit_on_user_error
    sys.exit(exit_on_user_error(main)())
