"""Categorical return distributions (C51, D4PG, TD4, DMPO): the projection
of a shifted and scaled distribution back onto a fixed support, shared by
every agent with a categorical critic."""
import jax
import jax.numpy as jnp


def categorical_projection(reward, discount, probs, v_min, v_max, dense=None):
    """Project the distribution of reward + discount * Z onto the support
    (C51's projection, Bellemare, Dabney and Munos 2017).

    Z has probabilities `probs` [..., K] on K atoms evenly spaced on
    [v_min, v_max]; reward and discount are [...]. Each shifted atom is
    clipped to [v_min, v_max] and its mass split between the two nearest
    atoms in proportion to closeness (all of it to an atom it lands on), so
    the result [..., K] keeps the total mass. On a CPU as two scatter-adds
    of K values per distribution (O(K); the dense form cost a quarter of the
    update at 101 atoms there); on an accelerator (`dense`, default: not on
    a CPU) as a [K, K] triangle-kernel product, since scatters serialise on
    a TPU (scripts/benchmark.py accelerator)."""
    K = probs.shape[-1]
    delta = (v_max - v_min) / (K - 1)
    shifted = jnp.clip(reward[..., None] + discount[..., None] * jnp.linspace(v_min, v_max, K),
                       v_min, v_max)
    position = (shifted - v_min) / delta                  # in [0, K - 1]
    dense = jax.default_backend() != "cpu" if dense is None else dense
    if dense:
        share = jnp.maximum(0.0, 1 - jnp.abs(position[..., None] - jnp.arange(K)))
        return jnp.einsum("...i,...ij->...j", probs, share,
                          precision=jax.lax.Precision.HIGHEST)
    lower = jnp.clip(jnp.floor(position), 0, K - 2)
    upper_share = (position - lower).reshape(-1)
    rows = K * jnp.arange(upper_share.size // K)[:, None]
    index = (rows + lower.reshape(-1, K).astype(jnp.int32)).reshape(-1)
    mass = probs.reshape(-1)
    out = jnp.zeros(mass.shape, probs.dtype).at[index].add(mass * (1 - upper_share))
    return out.at[index + 1].add(mass * upper_share).reshape(probs.shape)


def expected_q(logits, v_min, v_max):
    """The mean of a categorical critic's distribution: [..., K] -> [...]."""
    support = jnp.linspace(v_min, v_max, logits.shape[-1])
    return (jax.nn.softmax(logits) * support).sum(-1)
