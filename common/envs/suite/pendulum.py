"""Pendulum: swing up and balance (dm_control suite.pendulum)."""
import jax.numpy as jnp
import numpy as np

from common.envs import register
from common.envs.base import XMAT, Task, tolerance

_COSINE_BOUND = float(np.cos(np.deg2rad(8)))


class Pendulum(Task):
    fields = ("qpos", "qvel", "xmat")

    def observe(self, d):
        pole = d.xmat[self.id("body", "pole")]
        return {"orientation": pole[jnp.array([XMAT["zz"], XMAT["xz"]])],
                "velocity": self.joint_qvel(d, "hinge")}

    def reward(self, d):
        return tolerance(d.xmat[self.id("body", "pole"), XMAT["zz"]], (_COSINE_BOUND, 1))


register("pendulum", "swingup", Pendulum)
