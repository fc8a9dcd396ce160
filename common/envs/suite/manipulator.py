"""Planar manipulator: bring the ball to the target (dm_control suite.manipulator)."""
import jax.numpy as jnp
import numpy as np

from common.envs import register
from common.envs.base import Task, tolerance

_CLOSE = .01
_ARM_JOINTS = ("arm_root", "arm_shoulder", "arm_elbow", "arm_wrist",
               "finger", "fingertip", "thumb", "thumbtip")
_TOUCH_SENSORS = ("palm_touch", "finger_touch", "thumb_touch", "fingertip_touch", "thumbtip_touch")
_OBJECT_JOINTS = ("ball_x", "ball_z", "ball_y")
# (x, z) of a position and (qw, qy) of a quaternion: the planar pose dm_control reports.
_XZ = _WY = np.array([0, 2])


class Bring(Task):
    fields = ("qpos", "qvel", "xpos", "xquat", "site_xpos", "sensordata")
    # dm_control moves the target body in the model at each reset. It is a
    # ghost (contype = conaffinity = 0, welded to the world), so it never
    # touches the dynamics: its world position (3) and (qw, qy) live here.
    num_task_params = 5

    def __init__(self, model, dm_task):
        super().__init__(model, dm_task)
        assert not dm_task._use_peg and not dm_task._insert, "only bring_ball is ported"
        self._qpos = np.array([model.jnt_qposadr[self.id("joint", j)] for j in _ARM_JOINTS])
        self._dof = np.array([model.jnt_dofadr[self.id("joint", j)] for j in _ARM_JOINTS])
        self._obj_dof = np.array([model.jnt_dofadr[self.id("joint", j)] for j in _OBJECT_JOINTS])
        self._touch = np.array([model.sensor_adr[self.id("sensor", s)] for s in _TOUCH_SENSORS])
        target = self.id("body", "target_ball")
        assert model.body_parentid[target] == 0 and model.body_jntnum[target] == 0
        first = model.body_geomadr[target]
        geoms = range(first, first + model.body_geomnum[target])
        assert all(model.geom_contype[g] == 0 and model.geom_conaffinity[g] == 0 for g in geoms)
        # The target site sits at the target body's origin, so its position is the body's.
        assert not model.site_pos[self.id("site", "target_ball")].any()

    def episode_params(self, physics):
        data = physics.named.data
        return np.concatenate([data.xpos["target_ball"], data.xquat["target_ball"][_WY]])

    def _pose(self, d, body):
        i = self.id("body", body)
        return jnp.concatenate([d.xpos[i, _XZ], d.xquat[i, _WY]])

    def observe(self, d):
        q = d.qpos[self._qpos]
        return {"arm_pos": jnp.stack([jnp.sin(q), jnp.cos(q)], -1),
                "arm_vel": d.qvel[self._dof],
                "touch": jnp.log1p(d.sensordata[self._touch]),
                "hand_pos": self._pose(d, "hand"),
                "object_pos": self._pose(d, "ball"),
                "object_vel": d.qvel[self._obj_dof],
                "target_pos": jnp.concatenate([d.task[:3][_XZ], d.task[3:]])}

    def reward(self, d):
        dist = jnp.linalg.norm(d.site_xpos[self.id("site", "ball")] - d.task[:3])
        return tolerance(dist, (0, _CLOSE), _CLOSE * 2)


register("manipulator", "bring_ball", Bring)
