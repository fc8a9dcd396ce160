"""Humanoid: stand, walk, run (dm_control suite.humanoid)."""
import jax.numpy as jnp

from common.envs import register
from common.envs.base import XMAT, Task, tolerance

_STAND_HEIGHT = 1.4


class Humanoid(Task):
    fields = ("qpos", "qvel", "xpos", "xmat", "sensordata")

    def _extremities(self, d):
        torso = self.id("body", "torso")
        frame = d.xmat[torso].reshape(3, 3)
        out = []
        for side in ("left_", "right_"):
            for limb in ("hand", "foot"):
                out.append((d.xpos[self.id("body", side + limb)] - d.xpos[torso]) @ frame)
        return jnp.concatenate(out)

    def observe(self, d):
        torso = self.id("body", "torso")
        return {"joint_angles": d.qpos[7:],
                "head_height": d.xpos[self.id("body", "head"), 2],
                "extremities": self._extremities(d),
                "torso_vertical": d.xmat[torso, XMAT["zx"]:],
                "com_velocity": self.sensor(d, "torso_subtreelinvel"),
                "velocity": d.qvel}

    def reward(self, d):
        torso = self.id("body", "torso")
        standing = tolerance(d.xpos[self.id("body", "head"), 2],
                             bounds=(_STAND_HEIGHT, float("inf")), margin=_STAND_HEIGHT / 4)
        upright = tolerance(d.xmat[torso, XMAT["zz"]], bounds=(0.9, float("inf")), sigmoid="linear",
                            margin=1.9, value_at_margin=0)
        stand_reward = standing * upright
        small_control = tolerance(d.ctrl, margin=1, value_at_margin=0, sigmoid="quadratic").mean()
        small_control = (4 + small_control) / 5
        com_vel = self.sensor(d, "torso_subtreelinvel")[:2]
        speed = self.dm_task._move_speed
        if speed == 0:
            return small_control * stand_reward * tolerance(com_vel, margin=2).mean()
        move = tolerance(jnp.linalg.norm(com_vel), bounds=(speed, float("inf")), margin=speed,
                         value_at_margin=0, sigmoid="linear")
        return small_control * stand_reward * (5 * move + 1) / 6


for _t in ("stand", "walk", "run"):
    register("humanoid", _t, Humanoid)
