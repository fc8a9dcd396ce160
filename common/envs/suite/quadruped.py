"""Quadruped: walk and run (dm_control suite.quadruped; not in BENCHMARKING)."""
import numpy as np
import jax.numpy as jnp
from mujoco import mjtJoint, mjtSensor

from common.envs import register
from common.envs.base import XMAT, Task, tolerance


class Move(Task):
    # Reset randomises the state only (orientation, then height): no task params.
    fields = ("qpos", "qvel", "act", "xmat", "sensordata")

    def __init__(self, model, dm_task):
        super().__init__(model, dm_task)
        hinges = np.flatnonzero(model.jnt_type == mjtJoint.mjJNT_HINGE)
        self._hinge_qpos = model.jnt_qposadr[hinges]
        self._hinge_dof = model.jnt_dofadr[hinges]
        self._imu = self._sensors(mjtSensor.mjSENS_GYRO, mjtSensor.mjSENS_ACCELEROMETER)
        self._force_torque = self._sensors(mjtSensor.mjSENS_FORCE, mjtSensor.mjSENS_TORQUE)

    def _sensors(self, *types):
        """sensordata indices of every sensor of these types, in sensor order (as dm_control)."""
        m = self.model
        ids = np.flatnonzero(np.isin(m.sensor_type, [int(t) for t in types]))
        return np.concatenate([np.arange(m.sensor_adr[i], m.sensor_adr[i] + m.sensor_dim[i])
                               for i in ids])

    def _upright(self, d):
        return d.xmat[self.id("body", "torso"), XMAT["zz"]]

    def observe(self, d):
        return {"egocentric_state": jnp.concatenate([d.qpos[self._hinge_qpos],
                                                     d.qvel[self._hinge_dof], d.act]),
                "torso_velocity": self.sensor(d, "velocimeter"),
                "torso_upright": self._upright(d),
                "imu": d.sensordata[self._imu],
                "force_torque": jnp.arcsinh(d.sensordata[self._force_torque])}

    def reward(self, d):
        speed = self.dm_task._desired_speed
        upright = tolerance(self._upright(d), bounds=(1, float("inf")), sigmoid="linear",
                            margin=2, value_at_margin=0)
        move = tolerance(self.sensor(d, "velocimeter")[0], bounds=(speed, float("inf")),
                         margin=speed, value_at_margin=0.5, sigmoid="linear")
        return upright * move


register("quadruped", "walk", Move)
register("quadruped", "run", Move)
