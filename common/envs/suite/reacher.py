"""Two-link reacher: easy and hard (dm_control suite.reacher)."""
import jax.numpy as jnp
import mujoco

from common.envs import register
from common.envs.base import Task, tolerance


class Reacher(Task):
    fields = ("qpos", "qvel", "geom_xpos")
    # dm_control moves the target geom in the model at each reset. Contacts
    # are disabled in this model and the geom is the world's, so it never
    # touches the dynamics: its (x, y) lives here.
    num_task_params = 2

    def __init__(self, model, dm_task):
        super().__init__(model, dm_task)
        assert model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT
        assert model.geom_bodyid[self.id("geom", "target")] == 0
        self._finger = self.id("geom", "finger")
        # radius within which the finger touches the target (sizes as dm_control sets them)
        self._radii = float(dm_task._target_size + model.geom_size[self._finger, 0])

    def episode_params(self, physics):
        return physics.named.data.geom_xpos["target", :2].copy()

    def observe(self, d):
        return {"position": d.qpos,
                "to_target": d.task - d.geom_xpos[self._finger, :2],
                "velocity": d.qvel}

    def reward(self, d):
        dist = jnp.linalg.norm(d.task - d.geom_xpos[self._finger, :2])
        return tolerance(dist, (0, self._radii))


register("reacher", "easy", Reacher)
register("reacher", "hard", Reacher)
