"""Ball in cup: catch the ball (dm_control suite.ball_in_cup)."""
import jax.numpy as jnp

from common.envs import register
from common.envs.base import Task


class BallInCup(Task):
    fields = ("qpos", "qvel", "xpos", "site_xpos")

    def observe(self, d):
        return {"position": d.qpos, "velocity": d.qvel}

    def reward(self, d):
        # sparse: the ball centre lies inside the target box, shrunk by its radius (x and z)
        target = self.id("site", "target")
        xz = jnp.array([0, 2])
        ball_to_target = jnp.abs(d.site_xpos[target, xz] - d.xpos[self.id("body", "ball"), xz])
        ball = self.id("geom", "ball")
        room = self.model.site_size[target, [0, 2]] - self.model.geom_size[ball, 0]
        return jnp.all(ball_to_target < room).astype(jnp.float32)


register("ball_in_cup", "catch", BallInCup)
