"""Acrobot: swing up and balance, dense and sparse (dm_control suite.acrobot)."""
import jax.numpy as jnp

from common.envs import register
from common.envs.base import XMAT, Task, tolerance


class Acrobot(Task):
    fields = ("qpos", "qvel", "xmat", "site_xpos")

    def observe(self, d):
        arms = d.xmat[jnp.array([self.id("body", "upper_arm"), self.id("body", "lower_arm")])]
        return {"orientations": jnp.concatenate([arms[:, XMAT["xz"]], arms[:, XMAT["zz"]]]),
                "velocity": d.qvel}

    def reward(self, d):
        target = self.id("site", "target")
        radius = float(self.model.site_size[target, 0])
        dist = jnp.linalg.norm(d.site_xpos[target] - d.site_xpos[self.id("site", "tip")])
        return tolerance(dist, bounds=(0, radius), margin=0 if self.dm_task._sparse else 1)


register("acrobot", "swingup", Acrobot)
register("acrobot", "swingup_sparse", Acrobot)
