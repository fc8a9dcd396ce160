"""Finger: spin the body, or turn it to a target angle (dm_control suite.finger).

All observations come from sensors, as in dm_control. Turn draws the target
per episode and writes it into the model's site_pos; here it is a task
parameter instead (the target site is massless, so the dynamics never see it).
"""
import jax.numpy as jnp

from common.envs import register
from common.envs.base import Task

_SPIN_VELOCITY = 15.0


class Spin(Task):
    fields = ("qpos", "qvel", "sensordata")
    # dm_control's Spin sets this in the model at every reset. It is the same
    # each episode, so it is written once here, before a backend copies the
    # model (the native reset-time forward and MJX would otherwise keep the XML's .5).
    hinge_damping = .03

    def __init__(self, model, dm_task):
        super().__init__(model, dm_task)
        if self.hinge_damping is not None:
            model.dof_damping[model.jnt_dofadr[self.id("joint", "hinge")]] = self.hinge_damping

    def _xz(self, d, name):
        return self.sensor(d, name)[jnp.array([0, 2])]

    def tip_position(self, d):
        """(x, z) of the tip relative to the spinner's hinge."""
        return self._xz(d, "tip") - self._xz(d, "spinner")

    def observe(self, d):
        position = jnp.concatenate([self.sensor(d, "proximal"), self.sensor(d, "distal"),
                                    self.tip_position(d)])
        velocity = jnp.concatenate([self.sensor(d, n) for n in
                                    ("proximal_velocity", "distal_velocity", "hinge_velocity")])
        touch = jnp.log1p(jnp.concatenate([self.sensor(d, "touchtop"),
                                           self.sensor(d, "touchbottom")]))
        return {"position": position, "velocity": velocity, "touch": touch}

    def reward(self, d):
        return (self.sensor(d, "hinge_velocity")[0] <= -_SPIN_VELOCITY).astype(jnp.float32)


class Turn(Spin):
    num_task_params = 2  # target (x, z) relative to the hinge
    hinge_damping = None  # Turn keeps the XML's

    def episode_params(self, physics):
        return physics.target_position()

    def dist_to_target(self, d):
        """Signed distance from the tip to the target's surface (negative inside)."""
        return jnp.linalg.norm(d.task - self.tip_position(d)) - self.dm_task._target_radius

    def observe(self, d):
        obs = super().observe(d)
        obs["target_position"] = d.task
        obs["dist_to_target"] = self.dist_to_target(d)
        return obs

    def reward(self, d):
        return (self.dist_to_target(d) <= 0).astype(jnp.float32)


register("finger", "spin", Spin)
register("finger", "turn_easy", Turn)
register("finger", "turn_hard", Turn)
