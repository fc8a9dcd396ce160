"""Cartpole: balance and swing-up, dense and sparse (dm_control suite.cartpole)."""
import jax.numpy as jnp

from common.envs import register
from common.envs.base import XMAT, Task, tolerance


class Cartpole(Task):
    fields = ("qpos", "qvel", "xmat")
    sparse = False

    def _cart_position(self, d):
        return self.joint_qpos(d, "slider")

    def _pole_angle_cosine(self, d):
        return d.xmat[2:, XMAT["zz"]]

    def observe(self, d):
        position = jnp.concatenate([self._cart_position(d)[None],
                                    d.xmat[2:][:, [XMAT["zz"], XMAT["xz"]]].ravel()])
        return {"position": position, "velocity": d.qvel}

    def reward(self, d):
        if self.sparse:
            cart_in_bounds = tolerance(self._cart_position(d), (-0.25, 0.25))
            angle_in_bounds = tolerance(self._pole_angle_cosine(d), (0.995, 1)).prod()
            return cart_in_bounds * angle_in_bounds
        upright = (self._pole_angle_cosine(d) + 1) / 2
        centered = (1 + tolerance(self._cart_position(d), margin=2)) / 2
        small_control = tolerance(d.ctrl, margin=1, value_at_margin=0, sigmoid="quadratic")[0]
        small_control = (4 + small_control) / 5
        small_velocity = (1 + tolerance(d.qvel[1:], margin=5).min()) / 2
        return upright.mean() * small_control * small_velocity * centered


class CartpoleSparse(Cartpole):
    sparse = True


register("cartpole", "balance", Cartpole)
register("cartpole", "balance_sparse", CartpoleSparse)
register("cartpole", "swingup", Cartpole)
register("cartpole", "swingup_sparse", CartpoleSparse)
