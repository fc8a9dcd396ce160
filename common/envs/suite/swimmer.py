"""Swimmer: reach the target with 6 or 15 links (dm_control suite.swimmer)."""
import jax.numpy as jnp
import mujoco
import numpy as np

from common.envs import register
from common.envs.base import Task, tolerance


class Swimmer(Task):
    fields = ("qpos", "qvel", "geom_xpos", "xmat", "sensordata")
    # dm_control moves the target geom (and a light) in the model at each
    # reset. Contacts are disabled in this model and the geom is the world's,
    # so it never touches the dynamics: its world position lives here.
    num_task_params = 3

    def __init__(self, model, dm_task):
        super().__init__(model, dm_task)
        assert model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_CONTACT
        assert model.geom_bodyid[self.id("geom", "target")] == 0
        self._target_size = float(model.geom_size[self.id("geom", "target"), 0])

    def episode_params(self, physics):
        return physics.named.data.geom_xpos["target"].copy()

    def _nose_to_target(self, d):
        """Nose to target in the head frame, (x, y)."""
        head = d.xmat[self.id("body", "head")].reshape(3, 3)
        return ((d.task - d.geom_xpos[self.id("geom", "nose")]) @ head)[:2]

    def observe(self, d):
        # sensordata[12:]: a velocimeter and a gyro per link, after 4 frame sensors
        vel = d.sensordata[12:].reshape(-1, 6)[:, np.array([0, 1, 5])]
        return {"joints": d.qpos[3:],
                "to_target": self._nose_to_target(d),
                "body_velocities": vel.ravel()}

    def reward(self, d):
        return tolerance(jnp.linalg.norm(self._nose_to_target(d)), bounds=(0, self._target_size),
                         margin=5 * self._target_size, sigmoid="long_tail")


register("swimmer", "swimmer6", Swimmer)
register("swimmer", "swimmer15", Swimmer)
