"""The critics' hidden layers, one choice shared by the off-policy agents.

`--critic-torso mlp` (the default): `hidden_sizes` Dense + ReLU layers, with
LayerNorm before each ReLU under `--critic-layer-norm`.

`--critic-torso simba`: SimBa (Lee et al., "SimBa: Simplicity Bias for
Scaling Up Parameters in Deep Reinforcement Learning", ICLR 2025,
arXiv:2410.09754): a linear embedding of width `simba_width`, `simba_blocks`
residual blocks that normalise their input first (LayerNorm, Dense 4 x width,
ReLU, Dense width, added back), and a final LayerNorm. The residual path
keeps a deeper critic close to a linear map at initialisation; the
pre-LayerNorm keeps each block's input on one scale whatever the
observations' units.
"""
from __future__ import annotations

import dataclasses
from typing import Tuple

import flax.linen as nn
import jax

from common.agent import orthogonal

TORSOS = ("mlp", "simba")


@dataclasses.dataclass(frozen=True)
class Torso:
    """A critic's hidden layers. Called inside a compact module's __call__,
    so its layers join that module's scope (the MLP's parameters keep the
    names Dense_0, LayerNorm_0, ... that the critics have always had)."""
    kind: str = "mlp"
    hidden_sizes: Tuple[int, ...] = (256, 256)
    layer_norm: bool = False
    simba_width: int = 128
    simba_blocks: int = 1

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.kind == "simba":
            return SimbaTorso(self.simba_width, self.simba_blocks)(x)
        for h in self.hidden_sizes:
            x = nn.Dense(h)(x)
            if self.layer_norm:
                x = nn.LayerNorm()(x)
            x = nn.relu(x)
        return x


def critic_torso(config) -> Torso:
    """The torso a config's critic_* fields choose."""
    return Torso(config.critic_torso, tuple(config.hidden_sizes), config.critic_layer_norm,
                 config.simba_width, config.simba_blocks)


class SimbaTorso(nn.Module):
    width: int
    blocks: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        he = nn.initializers.he_normal()
        x = nn.Dense(self.width, kernel_init=orthogonal(1.0))(x)  # no LAPACK QR: see orthogonal
        for _ in range(self.blocks):
            y = nn.LayerNorm()(x)
            y = nn.relu(nn.Dense(4 * self.width, kernel_init=he)(y))
            x = x + nn.Dense(self.width, kernel_init=he)(y)
        return nn.LayerNorm()(x)
