"""Cheetah: run forward (dm_control suite.cheetah)."""
from common.envs import register
from common.envs.base import Task, tolerance

_RUN_SPEED = 10.0


class Cheetah(Task):
    fields = ("qpos", "qvel", "sensordata")

    def observe(self, d):
        return {"position": d.qpos[1:], "velocity": d.qvel}

    def reward(self, d):
        speed = self.sensor(d, "torso_subtreelinvel")[0]
        return tolerance(speed, bounds=(_RUN_SPEED, float("inf")), margin=_RUN_SPEED,
                         value_at_margin=0, sigmoid="linear")


register("cheetah", "run", Cheetah)
