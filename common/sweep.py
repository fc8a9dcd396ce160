"""Hyperparameter sweeps as one vmapped program.

A sweep axis is `name=v1,v2,...` over a float hyperparameter that reaches
the compiled program as a traced value: a field of the agent's `HParams`
(the names are the agent's `Config` fields). Alias: `learning_rate` sets
every `*_lr` field of an agent that has no `learning_rate` of its own (the
actor, critic and, where there is one, dual/temperature rates together).
Everything else (network sizes, num_envs, batch size, n_step, ...) changes
array shapes or the program's structure and is refused as an axis.

The members of a sweep are the combinations (the product of the axes, the
first axis varying slowest) times the seeds, combination-major: member
m = combination m // num_seeds, seed m % num_seeds. Every combination uses
the same seed keys, so combinations differ only by their values.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Dict, List, Sequence, Tuple

import jax
import numpy as np

from common.errors import UserError

ALIAS = "learning_rate"


class Axis(tuple):
    """(name the user gave, Config/HParams fields it sets, values)."""

    def __new__(cls, name: str, fields: Tuple[str, ...], values: Tuple[float, ...]):
        return super().__new__(cls, (name, fields, values))

    name = property(lambda self: self[0])
    fields = property(lambda self: self[1])
    values = property(lambda self: self[2])


def traced_fields(hparams_cls) -> Tuple[str, ...]:
    return tuple(hparams_cls._fields)


def valid_names(hparams_cls) -> List[str]:
    fields = list(traced_fields(hparams_cls))
    if ALIAS not in fields and any(f.endswith("_lr") for f in fields):
        fields.append(ALIAS)
    return fields


def parse_axes(specs: Sequence[str], config_cls, hparams_cls, algo: str) -> List[Axis]:
    """`--sweep name=v1,v2` strings -> axes; refuses structural fields, unknown
    names, bad or repeated values with one line saying why."""
    fields = traced_fields(hparams_cls)
    valid = ", ".join(valid_names(hparams_cls))
    config_fields = {f.name: f for f in dataclasses.fields(config_cls)}
    axes, seen = [], set()
    for spec in specs:
        name, eq, values = spec.partition("=")
        name = name.strip().lstrip("-").replace("-", "_")
        if not eq or not name or not values.strip():
            raise UserError(f"--sweep {spec!r}: expected name=value1,value2,... "
                            f"(e.g. tau=0.005,0.01)")
        if name in fields:
            targets = (name,)
        elif name == ALIAS and any(f.endswith("_lr") for f in fields):
            targets = tuple(f for f in fields if f.endswith("_lr"))
        elif name in config_fields:
            kind = getattr(config_fields[name].type, "__name__", str(config_fields[name].type))
            raise UserError(f"--sweep {name}: {name} ({kind}) changes array shapes or the "
                            f"structure of the compiled program, so it cannot be vmapped in one "
                            f"program; run one sweep per value instead (e.g. "
                            f"--{name.replace('_', '-')} X in separate runs). Float "
                            f"hyperparameters that {algo} can sweep: {valid}")
        else:
            raise UserError(f"--sweep {name}: not a hyperparameter of {algo}; "
                            f"it can sweep: {valid}")
        try:
            vals = tuple(float(v) for v in values.split(",") if v.strip())
        except ValueError:
            raise UserError(f"--sweep {spec!r}: values must be numbers separated "
                            f"by commas") from None
        if not all(math.isfinite(v) for v in vals) or len(set(vals)) != len(vals):
            raise UserError(f"--sweep {spec!r}: values must be finite and distinct")
        if seen & set(targets):
            twice = ", ".join(sorted(seen & set(targets)))
            raise UserError(f"--sweep {name}: {twice} is swept twice")
        seen |= set(targets)
        axes.append(Axis(name, targets, vals))
    return axes


def combinations(axes: Sequence[Axis]) -> List[Dict[str, float]]:
    """Every combination as {axis name: value}; one empty combination without axes."""
    return [dict(zip([a.name for a in axes], vals))
            for vals in itertools.product(*[a.values for a in axes])]


def combination_config(config, axes: Sequence[Axis], combo: Dict[str, float]):
    """The config of one combination (every field an axis sets replaced)."""
    changes = {f: combo[a.name] for a in axes for f in a.fields}
    return dataclasses.replace(config, **changes)


def label(combo: Dict[str, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in combo.items())


def member_hparams(config, axes: Sequence[Axis], hparams_fn, num_seeds: int) -> Tuple[Any, list]:
    """(HParams with a leading member axis, one combination dict per member)."""
    combos = combinations(axes)
    rows = [hparams_fn(combination_config(config, axes, c))
            for c in combos for _ in range(num_seeds)]
    hps = jax.tree.map(lambda *xs: np.stack([np.asarray(x, np.float32) for x in xs]), *rows)
    return hps, [c for c in combos for _ in range(num_seeds)]


def results(axes: Sequence[Axis], final: np.ndarray, num_seeds: int,
            diverged_at=None) -> List[Dict[str, Any]]:
    """Final eval returns [members] -> one row per combination, best mean first:
    values, mean, std over seeds, per-seed returns and the env step at which
    each seed diverged (-1: it did not; `diverged_at` [members], default none).
    Combinations with a diverged seed come last, then those with a NaN mean."""
    final = np.asarray(final, np.float64).reshape(-1, num_seeds)
    steps = np.full(final.shape, -1) if diverged_at is None else \
        np.asarray(diverged_at).reshape(-1, num_seeds)
    rows = []
    for combo, r, d in zip(combinations(axes), final, steps):
        rows.append(dict(values=combo, mean=float(np.mean(r)), std=float(np.std(r)),
                         per_seed=r.tolist(), diverged_at=[int(s) for s in d]))
    rows.sort(key=lambda row: (diverged(row) is not None, not math.isfinite(row["mean"]),
                               -row["mean"] if math.isfinite(row["mean"]) else 0.0))
    return rows


def diverged(row: Dict[str, Any]):
    """The first env step at which a seed of this row diverged, or None."""
    steps = [s for s in row.get("diverged_at", ()) if s >= 0]
    return min(steps) if steps else None


def table(axes: Sequence[Axis], rows: List[Dict[str, Any]], num_seeds: int) -> str:
    """The results as aligned text, best first; a combination with a diverged
    seed reads "diverged at N" (its first such step) in place of its mean."""
    head = ["rank", *[a.name for a in axes], f"final eval return (mean ± std, {num_seeds} seed(s))",
            "per seed"]
    body = [[str(i + 1), *[f"{row['values'][a.name]:g}" for a in axes],
             f"{row['mean']:.1f} ± {row['std']:.1f}" if diverged(row) is None else
             f"diverged at {diverged(row)}", " ".join(f"{v:.1f}" for v in row["per_seed"])]
            for i, row in enumerate(rows)]
    widths = [max(len(r[j]) for r in [head, *body]) for j in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [head, *body])
