"""How fast MPO's policy improvement climbs a fixed critic, beside DPG's
(an offline diagnostic of issue 38: does MPO fail to take off on the
humanoid because of its improvement step, or because of what its critic
learns from its own data?).

    python scripts/mpo_operator.py CHECKPOINT [--steps 3000] [--out FILE]

CHECKPOINT is a D4PG run's checkpoint (the humanoid benchmark keeps them
under benchmark_runs/humanoid/). From it: the online critic (its expected
value over the support is Q), the observation statistics and the replay
buffer's states; nothing is trained but a fresh actor, the same network and
the same initial parameters for every operator:

- dpg: the deterministic policy gradient of D4PG, DDPG and TD3: Adam on
  -Q(s, mu(s));
- mpo N sigma eps K: MPO's E-step and M-step with the policy std held at
  sigma (as the MPO probes hold it): N actions per state sampled from the
  target policy N(mu'(s), sigma^2), weights softmax(Q / eta) with eta solved
  exactly per batch (bisection) so that KL(weights || uniform) = eps, then
  Adam on the weighted negative log-likelihood of the samples under
  N(mu(s), sigma^2); the target mu' is copied from mu every K steps (K = 0:
  Polyak averaging at 0.005, as MPO's humanoid recipe does). The M-step's
  KL bounds are left out (the probes with a bound of 1e-2 did not reach it).

Every operator sees the same batches of replay states; reported: mean
Q(s, mu(s)) over held-out replay states every --every steps, beside the
checkpoint's own D4PG actor and the fresh actor.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from algos import d4pg
from common import networks, normalize

OPERATORS = {  # name: (kind, num_samples, sigma, eps, target period)
    "dpg": ("dpg", 0, 0.0, 0.0, 1),
    "mpo N20 s0.2 K25": ("mpo", 20, 0.2, 0.1, 25),
    "mpo N20 s0.2 K1": ("mpo", 20, 0.2, 0.1, 1),
    "mpo N20 s0.05 K25": ("mpo", 20, 0.05, 0.1, 25),
    "mpo N100 s0.2 K25": ("mpo", 100, 0.2, 0.1, 25),
    "mpo N20 s0.2 K25 eps1": ("mpo", 20, 0.2, 1.0, 25),
    "mpo N20 s0.2 polyak": ("mpo", 20, 0.2, 0.1, 0),   # our recipe's target: Polyak 0.005
}
TAU = 0.005


def load(path: str):
    """(config, critic params, obs stats, replay observations [rows * envs, obs]) of a
    one-seed D4PG checkpoint."""
    z = np.load(path)
    header = json.loads(bytes(z["header"]).decode())
    if header["algo"] != "d4pg":
        raise SystemExit(f"{path}: a {header['algo']} checkpoint, not D4PG's")
    leaves = {p: z[f"leaf_{i:05d}"][0] for i, p in enumerate(header["leaf_paths"])}

    def tree(prefix):
        out = {}
        for p, v in leaves.items():
            if p.startswith(prefix + "["):
                node = out
                keys = re.findall(r"\['([^']+)'\]", p[len(prefix):])
                for k in keys[:-1]:
                    node = node.setdefault(k, {})
                node[keys[-1]] = jnp.asarray(v)
        return out

    fields = d4pg.Config.__dataclass_fields__
    config = d4pg.Config(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in header["config"].items() if k in fields})
    stats = normalize.RunningStats(mean=jnp.asarray(leaves[".obs_stats.mean"]),
                                   var=jnp.asarray(leaves[".obs_stats.var"]),
                                   count=jnp.asarray(leaves[".obs_stats.count"]))
    obs = leaves[".replay.obs"]
    rows = min(int(leaves[".replay.size"]), obs.shape[0])  # filled rows of all envs
    return (config, tree(".critic_params"), tree(".actor_params"), stats,
            obs[:rows].reshape(-1, obs.shape[-1]))


def solve_temperature(q, eps, iters=40):
    """eta per batch with mean over states of KL(softmax(q / eta) || uniform) = eps."""
    n = q.shape[-1]

    def kl(log_eta):
        w = jax.nn.softmax(q / jnp.exp(log_eta), axis=-1)
        return jnp.mean(jnp.sum(w * jnp.log(w * n + 1e-30), -1))

    def body(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) / 2
        big = kl(mid) > eps  # too greedy: raise eta
        return jnp.where(big, mid, lo), jnp.where(big, hi, mid)

    lo, hi = jax.lax.fori_loop(0, iters, body, (jnp.log(1e-8), jnp.log(1e4)))
    return jnp.exp((lo + hi) / 2)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--operators", nargs="+", default=list(OPERATORS), choices=list(OPERATORS))
    p.add_argument("--out", default=None, help="JSON of the curves")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)

    config, critic_params, d4pg_actor, stats, states = load(args.checkpoint)
    critic = d4pg.Critic(networks.critic_torso(config), config.num_atoms)
    support = jnp.linspace(config.v_min, config.v_max, config.num_atoms)
    A = d4pg_actor["params"]["Dense_2"]["bias"].shape[-1]
    actor = d4pg.Actor(config.hidden_sizes, A)
    norm = lambda o: normalize.normalize(stats, o, config.obs_clip)

    def q(obs, action):  # obs normalised; actions clipped to the bounds, as critics see them
        return jax.nn.softmax(critic.apply(critic_params, obs, jnp.clip(action, -1, 1))) @ support

    rng = np.random.default_rng(0)
    order = rng.permutation(len(states))
    n_held = min(4096, len(states) // 4)
    held = jnp.asarray(norm(states[order[:n_held]]))
    train = np.asarray(norm(states[order[n_held:]]))
    value = jax.jit(lambda params: jnp.mean(q(held, actor.apply(params, held))))
    fresh = actor.init(jax.random.PRNGKey(0), held[0])
    print(f"{len(states):,} replay states; Q(s, mu(s)) on {n_held} held out: the checkpoint's "
          f"D4PG actor {float(value(d4pg_actor)):.2f}, the fresh actor {float(value(fresh)):.2f}",
          flush=True)
    tx = optax.adam(args.lr)
    batches = rng.integers(0, len(train), (args.steps, args.batch))
    curves = {}
    for name in args.operators:
        kind, n, sigma, eps, period = OPERATORS[name]

        def step(carry, xs):
            params, target, opt = carry
            i, obs, key = xs
            if kind == "dpg":
                loss = lambda th: -jnp.mean(q(obs, actor.apply(th, obs)))
            else:
                mean_t = actor.apply(target, obs)                       # [B, A]
                acts = mean_t[:, None] + sigma * jax.random.normal(key, (obs.shape[0], n, A))
                qs = q(jnp.repeat(obs[:, None], n, 1), acts)            # [B, N]
                w = jax.nn.softmax(qs / solve_temperature(qs, eps), -1)
                w = jax.lax.stop_gradient(w)
                loss = lambda th: jnp.mean(jnp.sum(
                    w * jnp.sum((acts - actor.apply(th, obs)[:, None]) ** 2, -1), -1)) / (
                    2 * sigma ** 2)
            grads = jax.grad(loss)(params)
            updates, opt = tx.update(grads, opt, params)
            params = optax.apply_updates(params, updates)
            if period:
                target = jax.tree.map(lambda t, p: jnp.where((i + 1) % period == 0, p, t),
                                      target, params)
            else:
                target = optax.incremental_update(params, target, TAU)
            return (params, target, opt), None

        run = jax.jit(lambda carry, xs: jax.lax.scan(step, carry, xs)[0])
        carry = (fresh, fresh, tx.init(fresh))
        keys = jax.random.split(jax.random.PRNGKey(1), args.steps)
        curve = [float(value(fresh))]
        for s in range(0, args.steps, args.every):
            idx = np.arange(s, min(s + args.every, args.steps))
            carry = run(carry, (jnp.asarray(idx), jnp.asarray(train[batches[idx]]),
                                keys[idx]))
            curve.append(float(value(carry[0])))
        curves[name] = curve
        print(f"{name:<24}" + " ".join(f"{v:6.2f}" for v in curve), flush=True)
    result = dict(checkpoint=args.checkpoint, steps=args.steps, every=args.every,
                  batch=args.batch, lr=args.lr, d4pg_actor=float(value(d4pg_actor)),
                  curves=curves)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
