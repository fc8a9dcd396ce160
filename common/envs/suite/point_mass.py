"""Point mass: reach the target (dm_control suite.point_mass; the easy task,
whose actuator gains are fixed)."""
import jax.numpy as jnp

from common.envs import register
from common.envs.base import Task, tolerance


class PointMass(Task):
    fields = ("qpos", "qvel", "geom_xpos")

    def observe(self, d):
        return {"position": d.qpos, "velocity": d.qvel}

    def reward(self, d):
        target = self.id("geom", "target")
        size = float(self.model.geom_size[target, 0])
        dist = jnp.linalg.norm(d.geom_xpos[target] - d.geom_xpos[self.id("geom", "pointmass")])
        near_target = tolerance(dist, bounds=(0, size), margin=size)
        small_control = tolerance(d.ctrl, margin=1, value_at_margin=0, sigmoid="quadratic").mean()
        return near_target * (small_control + 4) / 5


register("point_mass", "easy", PointMass)
