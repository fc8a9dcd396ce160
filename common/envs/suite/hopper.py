"""Hopper: stand and hop (dm_control suite.hopper)."""
import jax.numpy as jnp

from common.envs import register
from common.envs.base import Task, tolerance

_STAND_HEIGHT = 0.6
_HOP_SPEED = 2.0


class Hopper(Task):
    fields = ("qpos", "qvel", "xipos", "sensordata")

    def observe(self, d):
        touch = jnp.concatenate([self.sensor(d, "touch_toe"), self.sensor(d, "touch_heel")])
        return {"position": d.qpos[1:], "velocity": d.qvel, "touch": jnp.log1p(touch)}

    def reward(self, d):
        height = d.xipos[self.id("body", "torso"), 2] - d.xipos[self.id("body", "foot"), 2]
        standing = tolerance(height, (_STAND_HEIGHT, 2))
        if self.dm_task._hopping:
            hopping = tolerance(self.sensor(d, "torso_subtreelinvel")[0],
                                bounds=(_HOP_SPEED, float("inf")), margin=_HOP_SPEED / 2,
                                value_at_margin=0.5, sigmoid="linear")
            return standing * hopping
        small_control = tolerance(d.ctrl, margin=1, value_at_margin=0, sigmoid="quadratic").mean()
        return standing * (small_control + 4) / 5


register("hopper", "stand", Hopper)
register("hopper", "hop", Hopper)
