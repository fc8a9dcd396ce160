"""Running mean and variance of observations over all envs (Chan et al.'s
parallel update), carried in the train state and the checkpoint."""
from typing import NamedTuple

import jax.numpy as jnp


class RunningStats(NamedTuple):
    mean: jnp.ndarray
    var: jnp.ndarray
    count: jnp.ndarray


def init(size: int) -> RunningStats:
    return RunningStats(jnp.zeros(size, jnp.float32), jnp.ones(size, jnp.float32),
                        jnp.full((), 1e-4, jnp.float32))


def update(stats: RunningStats, x: jnp.ndarray) -> RunningStats:
    """Fold a batch x [N, size] into the statistics."""
    x = x.reshape(-1, x.shape[-1])
    n = x.shape[0]
    b_mean, b_var = x.mean(0), x.var(0)
    total = stats.count + n
    delta = b_mean - stats.mean
    mean = stats.mean + delta * n / total
    m2 = stats.var * stats.count + b_var * n + delta ** 2 * stats.count * n / total
    return RunningStats(mean, m2 / total, total)


def normalize(stats: RunningStats, x: jnp.ndarray, clip: float = 10.0) -> jnp.ndarray:
    return jnp.clip((x - stats.mean) / jnp.sqrt(stats.var + 1e-8), -clip, clip)
