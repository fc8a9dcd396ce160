"""Fish: get upright, or swim to a target (dm_control suite.fish).

Swim draws the target per episode and writes it into the model's geom_pos;
here it is a task parameter instead. The target is a geom of the static world
body and the model disables constraints, so it never touches the dynamics;
its world position is its geom_pos.
"""
import jax.numpy as jnp

from common.envs import register
from common.envs.base import XMAT, Task, tolerance

_JOINTS = ("tail1", "tail_twist", "tail2", "finright_roll", "finright_pitch",
           "finleft_roll", "finleft_pitch")


class Upright(Task):
    fields = ("qpos", "qvel", "xmat")

    def joint_angles(self, d):
        return jnp.stack([self.joint_qpos(d, j) for j in _JOINTS])

    def upright(self, d):
        return d.xmat[self.id("body", "torso"), XMAT["zz"]]

    def observe(self, d):
        return {"joint_angles": self.joint_angles(d), "upright": self.upright(d),
                "velocity": d.qvel}

    def reward(self, d):
        return tolerance(self.upright(d), bounds=(1, 1), margin=1)


class Swim(Upright):
    fields = ("qpos", "qvel", "xmat", "geom_xpos", "geom_xmat")
    num_task_params = 3  # target position (world frame)

    def episode_params(self, physics):
        return physics.named.model.geom_pos["target"].copy()

    def mouth_to_target(self, d):
        """Mouth-to-target vector in the mouth's frame."""
        mouth = self.id("geom", "mouth")
        return (d.task - d.geom_xpos[mouth]) @ d.geom_xmat[mouth].reshape(3, 3)

    def observe(self, d):
        return {"joint_angles": self.joint_angles(d), "upright": self.upright(d),
                "target": self.mouth_to_target(d), "velocity": d.qvel}

    def reward(self, d):
        radii = float(self.model.geom_size[self.id("geom", "mouth"), 0]
                      + self.model.geom_size[self.id("geom", "target"), 0])
        in_target = tolerance(jnp.linalg.norm(self.mouth_to_target(d)), bounds=(0, radii),
                              margin=2 * radii)
        return (7 * in_target + (self.upright(d) + 1) / 2) / 8


register("fish", "upright", Upright)
register("fish", "swim", Swim)
