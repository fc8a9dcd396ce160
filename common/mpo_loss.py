"""The pure pieces of MPO's policy loss (algos/mpo.py): the map from the
duals' free parameters to positive multipliers, the non-parametric E-step
and the KL penalty of the M-step with its dual loss. Only MPO uses them;
they live here so that algos/mpo.py reads as the algorithm."""
import jax
import jax.numpy as jnp

MIN_DUAL_PARAM = -18.0  # dual parameters are projected to >= this (softplus(-18) ~ 1.5e-8)


def positive(param):
    """A dual's free parameter -> its value: softplus + 1e-8, as in Acme."""
    return jax.nn.softplus(param) + 1e-8


def inverse_positive(value):
    """softplus^-1, stable for large values (softplus^-1(1000) = 1000)."""
    return value + jnp.log(-jnp.expm1(-value))


def batch_mean(x, mask):
    """Mean over the batch (axis 0) of the states that count (mask 1; None: all)."""
    if mask is None:
        return x.mean(0)
    mask = mask.reshape(mask.shape + (1,) * (x.ndim - 1))
    return (mask * x).sum(0) / jnp.maximum(mask.sum(), 1.0)


def e_step(q, temperature, epsilon, mask=None):
    """Non-parametric E-step over N sampled actions per state (q: [N, B]).

    Returns the weights softmax_j(q_ij / eta) (no gradient; each column sums
    to 1), the temperature dual loss eta * epsilon + eta * mean_i log mean_j
    exp(q_ij / eta) (whose gradient in eta is epsilon - KL(weights || uniform)),
    and that mean KL, over the states that count (mask 1)."""
    q = jax.lax.stop_gradient(q)
    tempered = q / temperature
    weights = jax.lax.stop_gradient(jax.nn.softmax(tempered, axis=0))
    log_mean_exp = jax.nn.logsumexp(tempered, axis=0) - jnp.log(q.shape[0])
    loss = temperature * (epsilon + batch_mean(log_mean_exp, mask))
    kl = batch_mean(jnp.sum(weights * (jax.nn.log_softmax(tempered, axis=0)
                                       + jnp.log(q.shape[0])), axis=0), mask)
    return weights, loss, kl


def action_cost(actions):
    """-||a - clip(a, -1, 1)|| per sampled action (policy units, [N, B, A] ->
    [N, B]): 0 inside the bounds, minus the distance to them outside."""
    return -jnp.linalg.norm(actions - jnp.clip(actions, -1.0, 1.0), axis=-1)


def kl_penalty_and_dual_loss(kl, alpha, epsilon, per_dim: bool, mask=None):
    """kl: [B, A]. Penalty stopgrad(alpha) * KL on the policy and dual loss
    alpha * (epsilon - stopgrad(KL)) on the multiplier, with the KL averaged
    over the batch, per dimension or summed over dimensions."""
    mean_kl = batch_mean(kl, mask) if per_dim else batch_mean(kl.sum(-1), mask)[None]
    penalty = jnp.sum(jax.lax.stop_gradient(alpha) * mean_kl)
    dual_loss = jnp.sum(alpha * (epsilon - jax.lax.stop_gradient(mean_kl)))
    return penalty, dual_loss, mean_kl
