"""Checkpoints: everything needed to continue a run exactly.

One .npz file holds every leaf of the (batched) train state (parameters,
targets, optimiser states, replay, RNG keys, env states, normaliser
statistics, counters) plus a JSON header (algo, task, sizes, config, chunk).
It is written to a temporary file and renamed over the old one, so a crash
mid-write never replaces a good checkpoint.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from typing import Any, Dict, Tuple

import jax
import numpy as np

from common.errors import UserError

CHECKPOINT_FILE = "checkpoint.npz"


def _leaves(tree) -> Tuple[list, Any]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return flat, treedef


def save(path: str, state: Any, header: Dict[str, Any]) -> None:
    flat, _ = _leaves(state)
    arrays = {f"leaf_{i:05d}": np.asarray(v) for i, (_, v) in enumerate(flat)}
    meta = dict(header, leaf_paths=[jax.tree_util.keystr(p) for p, _ in flat])
    arrays["header"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def resolve(path: str) -> str:
    """A checkpoint file, or a run directory that holds one."""
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT_FILE)
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path!r}")
    return path


def read_header(path: str) -> Dict[str, Any]:
    path = resolve(path)
    try:
        with np.load(path) as z:
            return json.loads(bytes(z["header"]).decode())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as e:
        raise UserError(f"unreadable checkpoint {path!r} ({type(e).__name__})") from None


def load(path: str, template: Any, expect: Dict[str, Any]) -> Tuple[Any, Dict[str, Any]]:
    """Restore a state shaped like `template`; refuse one of another agent,
    task or shape with a clear message."""
    path = resolve(path)
    header = read_header(path)
    for key, want in expect.items():
        got = header.get(key)
        if got != want:
            raise UserError(f"checkpoint {path!r} has {key}={got!r}, this run has {key}={want!r}")
    flat, treedef = _leaves(template)
    have = header.get("leaf_paths", [])
    if len(flat) != len(have):
        want = [jax.tree_util.keystr(p) for p, _ in flat]
        first = next((f"; it has {p}" for p in have if p not in set(want)),
                     next((f"; it lacks {p}" for p in want if p not in set(have)), ""))
        raise UserError(f"checkpoint {path!r} does not match this configuration "
                        f"({len(have)} arrays, expected {len(flat)}{first})")
    leaves = []
    try:
        with np.load(path) as z:
            for i, (p, t) in enumerate(flat):
                a = z[f"leaf_{i:05d}"]
                if a.shape != np.shape(t) or a.dtype != np.dtype(t.dtype):
                    raise UserError(f"checkpoint {path!r}: {jax.tree_util.keystr(p)} is "
                                    f"{a.dtype}{list(a.shape)}, this configuration needs "
                                    f"{np.dtype(t.dtype)}{list(np.shape(t))}")
                leaves.append(a)
    except UserError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise UserError(f"unreadable checkpoint {path!r} ({type(e).__name__})") from None
    return jax.tree_util.tree_unflatten(treedef, leaves), header
