"""Planar walker: stand, walk, run (dm_control suite.walker)."""
from common.envs import register
from common.envs.base import XMAT, Task, tolerance

_STAND_HEIGHT = 1.2


class Walker(Task):
    fields = ("qpos", "qvel", "xpos", "xmat", "sensordata")

    def observe(self, d):
        return {"orientations": d.xmat[1:][:, [XMAT["xx"], XMAT["xz"]]].ravel(),
                "height": d.xpos[self.id("body", "torso"), 2],
                "velocity": d.qvel}

    def reward(self, d):
        torso = self.id("body", "torso")
        standing = tolerance(d.xpos[torso, 2], bounds=(_STAND_HEIGHT, float("inf")),
                             margin=_STAND_HEIGHT / 2)
        upright = (1 + d.xmat[torso, XMAT["zz"]]) / 2
        stand_reward = (3 * standing + upright) / 4
        speed = self.dm_task._move_speed
        if speed == 0:
            return stand_reward
        move = tolerance(self.sensor(d, "torso_subtreelinvel")[0], bounds=(speed, float("inf")),
                         margin=speed / 2, value_at_margin=0.5, sigmoid="linear")
        return stand_reward * (5 * move + 1) / 6


for _t in ("stand", "walk", "run"):
    register("walker", _t, Walker)
