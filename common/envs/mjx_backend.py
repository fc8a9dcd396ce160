"""MJX backend: the same physics in pure JAX (traced, no host round-trip).

Runs on GPU/TPU and, slowly, on CPU. After the substeps it recomputes the
position- and velocity-dependent stages at the new state, as dm_control's
mj_step1 does, so the task code reads the same fields on both backends.
"""
from __future__ import annotations

from typing import Dict, Sequence

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from common.errors import UserError


def _mjx():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import logging
        logging.getLogger().setLevel(logging.ERROR)
        from mujoco import mjx
    return mjx


class MjxPhysics:
    def __init__(self, model: mujoco.MjModel, n_sub_steps: int, fields: Sequence[str], name: str):
        mjx = _mjx()
        self.mjx = mjx
        try:
            self.mx = mjx.put_model(model)
        except NotImplementedError as e:
            raise UserError(f"task {name!r} needs a MuJoCo feature MJX lacks ({e}); "
                            f"use --backend native") from None
        self.model = model
        self.n_sub_steps = int(n_sub_steps)
        self.fields = tuple(fields)
        self._data0 = mjx.make_data(model)

    def reset(self, qpos, qvel, act, warmstart):
        return self._data0.replace(qpos=qpos, qvel=qvel, act=act, qacc_warmstart=warmstart,
                                   ctrl=jnp.zeros_like(self._data0.ctrl))

    def _stage_vel(self, d):
        mjx = self.mjx
        d = mjx.fwd_position(self.mx, d)
        d = mjx.sensor_pos(self.mx, d)
        d = mjx.fwd_velocity(self.mx, d)
        return mjx.sensor_vel(self.mx, d)

    def step(self, d, action):
        d = d.replace(ctrl=action.astype(jnp.float32))
        d = jax.lax.fori_loop(0, self.n_sub_steps, lambda _, x: self.mjx.step(self.mx, x), d)
        d = self._stage_vel(d)
        bad = ~(jnp.isfinite(d.qpos).all() & jnp.isfinite(d.qvel).all())
        return d, self.get_fields(d), bad

    def forward(self, d):
        """Fields after dm_control's reset-time forward (actuation disabled)."""
        mx = self.mx.tree_replace({"opt.disableflags": self.mx.opt.disableflags
                                   | mujoco.mjtDisableBit.mjDSBL_ACTUATION})
        return self.get_fields(self.mjx.forward(mx, d))

    def get_fields(self, d) -> Dict[str, jnp.ndarray]:
        out = {}
        for f in self.fields:
            v = getattr(d, f)
            out[f] = v.reshape(np.shape(getattr(self._data0, f)))
        return out
