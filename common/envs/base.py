"""What a task is: observation and reward in jax.numpy, written once against
the MuJoCo fields it reads, and shared by the native and MJX backends."""
from __future__ import annotations

from typing import Any, Dict, Sequence

import jax.numpy as jnp
import mujoco
import numpy as np

# dm_control's named xmat columns: 'xx' is entry 0 of the row-major 3x3.
XMAT = {"xx": 0, "xy": 1, "xz": 2, "yx": 3, "yy": 4, "yz": 5, "zx": 6, "zy": 7, "zz": 8}


class Fields(dict):
    """MuJoCo fields of one env after a step (float32), by mjData name.

    `task` holds the per-episode parameters a task drew at reset (targets that
    dm_control writes into the model); `ctrl` is the action just applied.
    """

    def __getattr__(self, name: str) -> jnp.ndarray:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Task:
    """One dm_control suite task. Subclasses set `fields` and implement
    `observe` (an ordered dict, as dm_control's `get_observation`) and `reward`.

    `dm_task` is dm_control's own task object, read for its parameters only.
    """

    fields: Sequence[str] = ("qpos", "qvel")
    # mjData fields MJX must compute after a step, beyond the defaults.
    num_task_params: int = 0

    def __init__(self, model: mujoco.MjModel, dm_task: Any):
        self.model = model
        self.dm_task = dm_task

    # --- per-episode parameters (targets written into the model at reset) ---
    def episode_params(self, physics) -> np.ndarray:
        """Read the parameters dm_control drew in `initialize_episode`."""
        return np.zeros(self.num_task_params)

    # --- the task itself ---
    def observe(self, d: Fields) -> Dict[str, jnp.ndarray]:
        raise NotImplementedError

    def reward(self, d: Fields) -> jnp.ndarray:
        raise NotImplementedError

    def terminate(self, d: Fields) -> jnp.ndarray:
        return jnp.zeros((), bool)

    # --- name lookups, resolved once from the model ---
    def id(self, kind: str, name: str) -> int:
        i = mujoco.mj_name2id(self.model, getattr(mujoco.mjtObj, f"mjOBJ_{kind.upper()}"), name)
        if i < 0:
            raise KeyError(f"{kind} {name!r} not in model")
        return i

    def sensor(self, d: Fields, name: str) -> jnp.ndarray:
        i = self.id("sensor", name)
        adr, dim = int(self.model.sensor_adr[i]), int(self.model.sensor_dim[i])
        return d.sensordata[adr:adr + dim]

    def joint_qpos(self, d: Fields, name: str) -> jnp.ndarray:
        j = self.id("joint", name)
        return d.qpos[int(self.model.jnt_qposadr[j])]

    def joint_qvel(self, d: Fields, name: str) -> jnp.ndarray:
        j = self.id("joint", name)
        return d.qvel[int(self.model.jnt_dofadr[j])]


def flatten(obs: Dict[str, jnp.ndarray]) -> jnp.ndarray:
    """dm_control's flatten_observation: concatenate raveled values in order."""
    return jnp.concatenate([jnp.ravel(jnp.asarray(v, jnp.float32)) for v in obs.values()])


# --- dm_control.utils.rewards.tolerance, in jax.numpy ---

def _sigmoid(x, value_at_1: float, kind: str):
    if kind == "gaussian":
        scale = np.sqrt(-2 * np.log(value_at_1))
        return jnp.exp(-0.5 * (x * scale) ** 2)
    if kind == "hyperbolic":
        scale = np.arccosh(1 / value_at_1)
        return 1 / jnp.cosh(x * scale)
    if kind == "long_tail":
        scale = np.sqrt(1 / value_at_1 - 1)
        return 1 / ((x * scale) ** 2 + 1)
    if kind == "reciprocal":
        scale = 1 / value_at_1 - 1
        return 1 / (jnp.abs(x) * scale + 1)
    if kind == "cosine":
        s = x * (np.arccos(2 * value_at_1 - 1) / np.pi)
        return jnp.where(jnp.abs(s) < 1, (1 + jnp.cos(np.pi * s)) / 2, 0.0)
    if kind == "linear":
        s = x * (1 - value_at_1)
        return jnp.where(jnp.abs(s) < 1, 1 - s, 0.0)
    if kind == "quadratic":
        s = x * np.sqrt(1 - value_at_1)
        return jnp.where(jnp.abs(s) < 1, 1 - s ** 2, 0.0)
    if kind == "tanh_squared":
        scale = np.arctanh(np.sqrt(1 - value_at_1))
        return 1 - jnp.tanh(x * scale) ** 2
    raise ValueError(f"unknown sigmoid {kind!r}")


def tolerance(x, bounds=(0.0, 0.0), margin=0.0, sigmoid="gaussian", value_at_margin=0.1):
    """1 inside `bounds`, decaying to `value_at_margin` at distance `margin`."""
    lower, upper = bounds
    x = jnp.asarray(x, jnp.float32)
    in_bounds = (lower <= x) & (x <= upper)
    if margin == 0:
        return jnp.where(in_bounds, 1.0, 0.0)
    d = jnp.where(x < lower, lower - x, x - upper) / margin
    return jnp.where(in_bounds, 1.0, _sigmoid(d, value_at_margin, sigmoid))
