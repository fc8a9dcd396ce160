"""`train` mode: training env steps/s of every agent and the loop-efficiency table.

`agent_throughput` times any agent through the agent protocol (compiled
first, then one timed run); `reference_td3` and `reference_sac` are the
usual way JAX TD3 and SAC are written (CleanRL style): the env stepped from
Python, a numpy replay buffer and one jitted update per env step, with the
same networks and batch. `loop_efficiency` sets an agent's whole loop
against its own update.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import time
from typing import Dict

import numpy as np

HELP = "training env steps/s of agents vs a Python-loop reference TD3"
DOC = """`train` mode: env steps/s of whole training runs (compile excluded), per agent
and task, next to references measured in the same run:

* TD3 and SAC written the usual way (CleanRL style): the dm_control env
  stepped from Python, a numpy replay buffer and one jitted update per env
  step, with the same networks ([256, 256]) and batch (256). Each off-policy
  agent runs at that setting (1 env, 1 update per env step) and at 256 envs
  with 1 update per 16 env steps; its ratio is against the reference of its
  family (TD3 for DDPG/D4PG/TD3/TD4, SAC for SAC/MPO), and ms/update is the
  wall-clock per gradient update, env steps included.
* PPO with its default config at 1024 envs on the native backend, beside raw
  `mujoco.rollout` physics on the same batch (the machine's limit), and on
  mjx for cheetah_run.
With --budget, a last row per agent trains for about that many seconds at
1 env and reports the final evaluation return (10 episodes).

Then the loop-efficiency table (scripts/benchmarks/train.py: loop_efficiency), per
off-policy agent and task, at 1 env with 1 update per env step and at 16
envs with 1 update per iteration, through the agent protocol
(Train.iteration, Train.update): the acting cost per env step, the agent's
update alone (its floor, scanned over a replay buffer filled to capacity)
and the whole loop from that same buffer; efficiency = floor / loop. Below
it, the update-cost ratios D4PG/TD3, TD4/TD3 and MPO/SAC at 1 env."""


def add_arguments(t) -> None:
    t.add_argument("--algos", nargs="+",
                   default=["td3", "ddpg", "d4pg", "td4", "sac", "mpo", "ppo"])
    t.add_argument("--tasks", nargs="+", default=["cheetah_run", "humanoid_walk"])
    t.add_argument("--steps-1env", type=int, default=3000,
                   help="timed env steps at 1 env (after 1000 warm-up)")
    t.add_argument("--steps-many", type=int, default=51200, help="env steps at 256 envs")
    t.add_argument("--ppo-steps", type=int, default=307_200,
                   help="env steps of the PPO native rows (the mjx row runs 3 rollouts)")
    t.add_argument("--ppo-mjx-envs", type=int, default=None,
                   help="envs of the PPO mjx row on cheetah_run (default 1024 on an accelerator, "
                        "128 on a CPU, where MJX is 50-100x slower; 0: skip)")
    t.add_argument("--budget", type=float, default=0.0,
                   help="wall-clock seconds for a fixed-budget return row per agent at 1 env "
                        "(0: skip; the `learn` mode's table is the fixed-budget comparison)")
    t.add_argument("--efficiency-iters", type=int, default=300,
                   help="iterations per timed call of the loop-efficiency table (0: skip it)")
    t.add_argument("--torso-costs", action="store_true",
                   help="only the critic-torso table: each off-policy agent's update and loop "
                        "with the SimBa critic torso against the layer-normed MLP, at 256 envs "
                        "and 1 update per 16 env steps (the humanoid recipes' setting; "
                        "--efficiency-iters iterations per timing, 32 is enough)")
    t.add_argument("--member-axis", action="store_true",
                   help="only the member-axis table: each agent's one-seed run at its "
                        "humanoid_walk recipe (--member-steps env steps), compiled as the "
                        "command line compiles it (parallel.over_members: no vmap for a "
                        "single member) and vmapped over a member axis of 1, timed in turn")
    t.add_argument("--member-steps", type=int, default=16384,
                   help="env steps per run of the member-axis table (at least one chunk)")
    t.add_argument("--quick", action="store_true",
                   help="smoke check: cartpole_balance, tiny nets, few steps")


def run(args) -> int:
    import jax
    if args.ppo_mjx_envs is None:
        args.ppo_mjx_envs = 128 if jax.default_backend() == "cpu" else 1024
    if args.torso_costs:
        args.tasks = ["cartpole_balance"] if args.quick else args.tasks
        print_torso_table(torso_costs(args.algos, args.tasks,
                                      20 if args.quick else args.efficiency_iters,
                                      2 if args.quick else 3, args.quick))
        return 0
    if args.member_axis:
        print_member_table(member_axis_costs(args.algos, args.member_steps,
                                             2 if args.quick else 5, args.quick))
        return 0
    if args.quick:
        args.tasks, args.steps_1env, args.steps_many = ["cartpole_balance"], 300, 5120
        args.budget = 0
        args.ppo_steps, args.ppo_mjx_envs = 64 * 30 * 2, 0
    rows = train_mode(args.algos, args.tasks, args.steps_1env, args.steps_many,
                      args.ppo_steps, args.budget, args.ppo_mjx_envs, args.quick)
    print_train_table(rows)
    if args.efficiency_iters > 0:
        eff = efficiency_mode(args.algos, args.tasks, 20 if args.quick else args.efficiency_iters,
                              2 if args.quick else 5, args.quick)
        print_efficiency_table(eff)
    return 0


def load_algo(name: str):
    return importlib.import_module(f"algos.{name}")


def agent_config(algo: str, env: str, num_envs: int, total_timesteps: int, **overrides):
    mod = load_algo(algo)
    fields = {f.name for f in dataclasses.fields(mod.Config)}
    base = dict(env=env, backend="native", num_envs=num_envs, num_seeds=1,
                total_timesteps=total_timesteps, eval_every=0, eval_episodes=1, checkpoint_every=0)
    base.update({k: v for k, v in overrides.items() if k in fields})
    return mod, mod.Config(**base)


def agent_throughput(algo: str, env: str, num_envs: int, total_timesteps: int,
                     num_seeds: int = 1, **overrides) -> Dict[str, float]:
    """Env steps/s of one compiled run (compile excluded; the final evaluation,
    one episode unless overridden, is included), and its final eval return.
    The seeds are members as the command line runs them (parallel.over_members)."""
    import jax
    from common import parallel
    mod, config = agent_config(algo, env, num_envs, total_timesteps, **overrides)
    config = dataclasses.replace(config, num_seeds=num_seeds)
    train = mod.make_train(config)
    keys = jax.random.split(jax.random.PRNGKey(0), num_seeds)
    t0 = time.perf_counter()
    compiled = jax.jit(parallel.over_members(train)).lower(keys).compile()
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, history = compiled(keys)
    jax.block_until_ready(history)
    wall = time.perf_counter() - t0
    steps = train.schedule.total_steps * num_seeds
    ret = np.asarray(history["eval/episode_return"])[:, -1]
    return {"sps": steps / wall, "wall_s": wall, "compile_s": compile_s, "steps": steps,
            "eval_return": float(np.mean(ret))}


def loop_efficiency(algo: str, env: str, num_envs: int, updates_per_step: float,
                    iters: int = 500, repeats: int = 3, **overrides) -> Dict[str, float]:
    """One agent's loop against its own floor, in one process (compile
    excluded, medians of `repeats` interleaved timings), through the agent
    protocol (Train.iteration, Train.update), no agent code copied:
    - acting: `iteration` scanned over warm-up iterations (uniform actions,
      no update due; the policy is evaluated all the same), per env step;
    - floor: `update` alone scanned over `iters` (at least 64) updates from a replay
      buffer filled to capacity with synthetic rows, per update;
    - loop: `iteration` scanned over `iters` learning iterations from that
      same full buffer, per env step; efficiency = floor x updates per env
      step / loop."""
    import jax
    import jax.numpy as jnp
    from common import agent, replay
    warm = iters * num_envs
    mod, config = agent_config(algo, env, num_envs, 10 * warm + 10 ** 6, learning_starts=warm,
                               updates_per_step=updates_per_step, **overrides)
    train = mod.make_train(config)
    state = jax.jit(train.init)(jax.random.PRNGKey(0))
    full = jax.jit(lambda s, k: s._replace(replay=replay.synthetic(s.replay, k,
                                                                  train.env.episode_length)))
    state = full(state, jax.random.PRNGKey(1))
    n_updates, period = agent.update_period(config)
    # The state is donated and threaded from call to call: without donation
    # every call would first copy the replay buffer (hundreds of MB), which
    # would be timed with it.
    # The floor scans at least 64 updates per call: on a TPU each call's own
    # cost (dispatch, the wait for it) spread over 16 updates added half again
    # to D4PG's 0.23 ms update (docs/accelerator.md).
    n_floor = max(iters, 64)
    scan = lambda f, start, n=iters: jax.jit(
        lambda s: jax.lax.scan(f, s, start + jnp.arange(n))[0], donate_argnums=0)
    fns = {"acting": scan(train.iteration, 0), "floor": scan(train.update, 0, n_floor),
           "loop": scan(train.iteration, iters)}
    compiled, compile_s = {}, 0.0
    for name, fn in fns.items():
        t0 = time.perf_counter()
        compiled[name] = fn.lower(state).compile()
        compile_s += time.perf_counter() - t0
        state = jax.block_until_ready(compiled[name](state))  # first call: allocation, pools
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in compiled.items():
            t0 = time.perf_counter()
            state = jax.block_until_ready(fn(state))
            times[name].append(time.perf_counter() - t0)
    med = {name: float(np.median(t)) for name, t in times.items()}
    acting = med["acting"] / warm
    floor = med["floor"] / n_floor * n_updates / (period * num_envs)  # per env step
    loop = med["loop"] / warm
    return {"ms_acting": 1e3 * acting, "ms_update": 1e3 * med["floor"] / n_floor,
            "ms_floor": 1e3 * floor, "ms_loop": 1e3 * loop, "efficiency": floor / loop,
            "ms_overhead": 1e3 * (loop - floor - acting), "compile_s": compile_s}


def _dm_loop(env: str, seed: int):
    """A dm_control env stepped from Python, observations flattened."""
    from dm_control import suite
    domain, task = _split(env)
    dm = suite.load(domain, task, task_kwargs={"random": seed})
    def flat(ts):
        return np.concatenate([np.ravel(v) for v in ts.observation.values()]).astype(np.float32)
    return dm, flat, dm.action_spec().shape[0]


def _python_loop(env: str, policy, update, state, key, total_timesteps: int, learning_starts: int,
                 batch_size: int, seed: int) -> Dict[str, float]:
    """The usual way: step the env from Python, store in numpy, sample a
    numpy batch and call a jitted update once per env step."""
    import jax
    dm, flat, A = _dm_loop(env, seed)
    obs = flat(dm.reset())
    D = obs.shape[0]
    cap = total_timesteps
    buf_o, buf_o2 = np.zeros((cap, D), np.float32), np.zeros((cap, D), np.float32)
    buf_a = np.zeros((cap, A), np.float32)
    buf_r, buf_d = np.zeros(cap, np.float32), np.zeros(cap, np.float32)
    rng = np.random.default_rng(seed)
    t_start = s_start = None
    for t in range(total_timesteps):
        if t == learning_starts + 10:  # after the first (compiling) updates
            jax.block_until_ready(state)
            t_start, s_start = time.perf_counter(), t
        key, k_act, k_up = jax.random.split(key, 3)
        if t < learning_starts:
            a = rng.uniform(-1, 1, A).astype(np.float32)
        else:
            a = np.asarray(policy(state, obs, k_act))
        ts = dm.step(a)
        o2 = flat(ts)
        buf_o[t], buf_a[t], buf_r[t], buf_o2[t] = obs, a, ts.reward, o2
        buf_d[t] = 0.0  # dm_control tasks only truncate
        obs = flat(dm.reset()) if ts.last() else o2
        if t >= learning_starts:
            idx = rng.integers(0, t + 1, batch_size)
            batch = (buf_o[idx], buf_a[idx], buf_r[idx], buf_d[idx], buf_o2[idx])
            state = update(state, batch, k_up, t)
    jax.block_until_ready(state)
    wall = time.perf_counter() - t_start
    steps = total_timesteps - s_start
    return {"sps": steps / wall, "wall_s": wall, "ms_per_update": 1000 * wall / steps}


def _reference_nets(mod, env: str, hidden, seed: int):
    """The agent module's own actor and twin critic (plain MLP torso, no
    LayerNorm), initialised for `env`."""
    import jax
    import jax.numpy as jnp
    from common import networks
    dm, flat, A = _dm_loop(env, seed)
    D = flat(dm.reset()).shape[0]
    actor = mod.Actor(tuple(hidden), A)
    critic = mod.TwinCritic(networks.Torso("mlp", tuple(hidden), layer_norm=False))
    k1, k2, key = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (actor, critic, actor.init(k1, jnp.zeros(D)),
            critic.init(k2, jnp.zeros(D), jnp.zeros(A)), key, A)


def reference_td3(env: str, total_timesteps: int, learning_starts: int, batch_size: int = 256,
                  hidden=(256, 256), seed: int = 0) -> Dict[str, float]:
    """TD3 (CleanRL style): twin critics, smoothing, policy delay 2."""
    import jax
    import jax.numpy as jnp
    import optax
    actor, critic, ap, cp, key, _ = _reference_nets(load_algo("td3"), env, hidden, seed)
    tx = optax.adam(3e-4)
    state = (ap, cp, ap, cp, tx.init(ap), tx.init(cp))

    @jax.jit
    def policy(state, o, key):
        a = actor.apply(state[0], o)
        return jnp.clip(a + 0.1 * jax.random.normal(key, a.shape), -1, 1)

    @jax.jit
    def update(state, batch, key, step):
        ap, cp, at, ct, ao, co = state
        o, a, r, d, o2 = batch
        noise = jnp.clip(0.2 * jax.random.normal(key, a.shape), -0.5, 0.5)
        a2 = jnp.clip(actor.apply(at, o2) + noise, -1, 1)
        y = r + 0.99 * (1 - d) * critic.apply(ct, o2, a2).min(0)

        def closs(cp):
            return ((critic.apply(cp, o, a) - y) ** 2).sum(0).mean()

        g = jax.grad(closs)(cp)
        u, co = tx.update(g, co, cp)
        cp = optax.apply_updates(cp, u)

        def actor_step(args):
            ap, at, ct, ao = args
            g = jax.grad(lambda p: -critic.apply(cp, o, actor.apply(p, o))[0].mean())(ap)
            u, ao = tx.update(g, ao, ap)
            ap = optax.apply_updates(ap, u)
            return (ap, optax.incremental_update(ap, at, 0.005),
                    optax.incremental_update(cp, ct, 0.005), ao)

        ap, at, ct, ao = jax.lax.cond(step % 2 == 0, actor_step, lambda x: x, (ap, at, ct, ao))
        return ap, cp, at, ct, ao, co

    return _python_loop(env, policy, update, state, key, total_timesteps, learning_starts,
                        batch_size, seed)


def reference_sac(env: str, total_timesteps: int, learning_starts: int, batch_size: int = 256,
                  hidden=(256, 256), seed: int = 0) -> Dict[str, float]:
    """SAC (CleanRL style, learned temperature): every env step one critic,
    one actor and one temperature update and a Polyak target update."""
    import jax
    import jax.numpy as jnp
    import optax
    actor, critic, ap, cp, key, A = _reference_nets(load_algo("sac"), env, hidden, seed)
    tx = optax.adam(3e-4)
    log_alpha = jnp.zeros(())
    state = (ap, cp, cp, log_alpha, tx.init(ap), tx.init(cp), tx.init(log_alpha))

    def sample(ap, o, key):
        mean, log_std = actor.apply(ap, o)
        std = jnp.exp(log_std)
        u = mean + std * jax.random.normal(key, mean.shape)
        a = jnp.tanh(u)
        logp = (-0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)
        return a, logp - jnp.log(1 - a ** 2 + 1e-6).sum(-1)

    @jax.jit
    def policy(state, o, key):
        return sample(state[0], o, key)[0]

    @jax.jit
    def update(state, batch, key, step):
        ap, cp, ct, la, ao, co, lo = state
        o, a, r, d, o2 = batch
        k1, k2 = jax.random.split(key)
        alpha = jnp.exp(la)
        a2, logp2 = sample(ap, o2, k1)
        y = r + 0.99 * (1 - d) * (critic.apply(ct, o2, a2).min(0) - alpha * logp2)
        g = jax.grad(lambda p: ((critic.apply(p, o, a) - y) ** 2).sum(0).mean())(cp)
        u, co = tx.update(g, co, cp)
        cp = optax.apply_updates(cp, u)

        def aloss(p):
            pa, logp = sample(p, o, k2)
            return (alpha * logp - critic.apply(cp, o, pa).min(0)).mean(), logp

        g, logp = jax.grad(aloss, has_aux=True)(ap)
        u, ao = tx.update(g, ao, ap)
        ap = optax.apply_updates(ap, u)
        g = jax.grad(lambda la: (-jnp.exp(la) * (jax.lax.stop_gradient(logp) - A)).mean())(la)
        u, lo = tx.update(g, lo, la)
        la = optax.apply_updates(la, u)
        ct = optax.incremental_update(cp, ct, 0.005)
        return ap, cp, ct, la, ao, co, lo

    return _python_loop(env, policy, update, state, key, total_timesteps, learning_starts,
                        batch_size, seed)


def _split(env: str):
    from common import envs
    envs.names()
    domain, task, _ = envs._REGISTRY[env]
    return domain, task


OFF_POLICY = ("td3", "ddpg", "d4pg", "td4", "sac", "mpo")
REFERENCE_OF = {"td3": "td3", "ddpg": "td3", "d4pg": "td3", "td4": "td3", "sac": "sac",
                "mpo": "sac"}
NETS = dict(batch_size=256, hidden_sizes=(256, 256))
SETTINGS = {
    # name: (num_envs, overrides); the first is the references' setting
    "1 env, 1 update/step": (1, dict(updates_per_step=1.0, **NETS)),
    "256 envs, 1 update/16 steps": (256, dict(updates_per_step=1 / 16, **NETS)),
}
PPO_ENVS = 1024


def raw_physics(task: str, num_envs: int, steps: int = 20, repeats: int = 3) -> float:
    """Env steps/s of raw mujoco.rollout on the same batch (this machine's limit)."""
    import jax
    from common import envs

    from .envs import RawRollout
    env = envs.make(task, "native", pool_size=min(num_envs, 1024))
    states = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), num_envs))
    raw = RawRollout(env, states, nthread=os.cpu_count() or 1, chunk=steps)
    raw.run(2)
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        raw.run(steps)
        rates.append(steps * num_envs / (time.perf_counter() - t))
    return float(np.median(rates))


def train_mode(algos, tasks, steps_1env: int, steps_many: int, ppo_steps: int, budget_s: float,
               mjx_envs: int, quick: bool = False) -> list:
    """Rows of the training-throughput table. Per task: the Python-loop
    references (TD3, SAC), every off-policy agent at both SETTINGS (its
    ratio against the reference of its family at the references' setting),
    PPO at PPO_ENVS envs beside raw physics at the same batch, and, with a
    budget, the return each agent reaches in about `budget_s` seconds."""
    rows = []
    row = lambda **kw: rows.append({**dict(ratio=float("nan"), eval_return=float("nan"),
                                           ms_update=float("nan"), backend="native"), **kw})
    small = dict(batch_size=32, hidden_sizes=(32, 32)) if quick else {}
    for task in tasks:
        refs = {}
        for name, fn in (("td3", reference_td3), ("sac", reference_sac)):
            if not any(REFERENCE_OF.get(a) == name for a in algos):
                continue
            kw = dict(batch_size=32, hidden=(32, 32)) if quick else {}
            r = fn(task, learning_starts=1000, total_timesteps=1000 + steps_1env, **kw)
            refs[name] = r["sps"]
            row(task=task, agent=f"reference {name.upper()} (Python env loop)",
                setting="1 env, 1 update/step", sps=r["sps"], ratio=1.0,
                ms_update=r["ms_per_update"], wall=r["wall_s"])
        for algo in algos:
            if algo == "ppo":
                continue
            for i, (setting, (num_envs, over)) in enumerate(SETTINGS.items()):
                steps = steps_1env + 1000 if num_envs == 1 else steps_many
                starts = 1000 if num_envs == 1 else 10 * num_envs
                r = agent_throughput(algo, task, num_envs, steps, learning_starts=starts,
                                     **{**over, **small})
                row(task=task, agent=algo, setting=setting, sps=r["sps"], wall=r["wall_s"],
                    ratio=r["sps"] / refs[REFERENCE_OF[algo]] if i == 0 else float("nan"),
                    ms_update=1000 / (r["sps"] * over["updates_per_step"]))
            if budget_s > 0:
                # fixed wall clock: the steps the measured 1-env rate allows in the budget
                sps = [x for x in rows if x["agent"] == algo and x["task"] == task][0]["sps"]
                steps = max(2000, int(sps * budget_s) // 1000 * 1000)
                r = agent_throughput(algo, task, 1, steps, learning_starts=min(10_000, steps // 4),
                                     eval_episodes=10)
                row(task=task, agent=algo, setting=f"return after ~{budget_s:.0f}s ({steps} steps)",
                    sps=r["sps"], eval_return=r["eval_return"], wall=r["wall_s"])
        if "ppo" in algos:
            n = 64 if quick else PPO_ENVS
            raw = raw_physics(task, n)
            row(task=task, agent="raw mujoco.rollout (physics only)", setting=f"{n} envs", sps=raw,
                ratio=1.0, wall=float("nan"))
            over = dict(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)) if quick else {}
            for backend, envs_n in (("native", n), ("mjx", mjx_envs)):
                if backend == "mjx" and (envs_n <= 0 or task != "cheetah_run"):
                    continue
                num_steps = load_algo("ppo").Config().num_steps
                rollouts = max(ppo_steps // (envs_n * num_steps), 2) if backend == "native" else 3
                steps = rollouts * envs_n * num_steps
                r = agent_throughput("ppo", task, envs_n, steps, backend=backend, **over)
                row(task=task, agent="ppo", setting=f"{envs_n} envs, default config",
                    backend=backend, sps=r["sps"],
                    ratio=r["sps"] / raw if backend == "native" else float("nan"),
                    wall=r["wall_s"])
    return rows


EFFICIENCY_SETTINGS = {  # name: (num_envs, updates per env step)
    "1 env, 1 update/step": (1, 1.0),
    "16 envs, 1 update/iteration": (16, 1 / 16),
}
UPDATE_TARGETS = (("d4pg", "td3", 1.1), ("td4", "td3", 1.3), ("mpo", "sac", 2.0))
EFFICIENCY_TARGET = 0.85


def efficiency_mode(algos, tasks, iters: int = 300, repeats: int = 5, quick: bool = False) -> list:
    """Rows of the loop-efficiency table: every off-policy agent, per task and
    EFFICIENCY_SETTINGS, its acting cost, update floor and whole loop
    (`loop_efficiency`), at the default sizes (batch 256, [256, 256])."""
    rows = []
    settings = list(EFFICIENCY_SETTINGS.items())[:1] if quick else EFFICIENCY_SETTINGS.items()
    small = dict(batch_size=32, hidden_sizes=(32, 32), buffer_size=10_000) if quick else {}
    for task in tasks:
        for algo in algos:
            if algo not in OFF_POLICY:
                continue
            for setting, (num_envs, ups) in settings:
                r = loop_efficiency(algo, task, num_envs, ups, iters=iters, repeats=repeats,
                                    **small)
                rows.append(dict(task=task, agent=algo, setting=setting, **r))
    return rows


def print_efficiency_table(rows) -> None:
    print("\nloop efficiency (compile excluded; medians of interleaved timings in one process): "
          "acting = env step, policy and replay write per env step (warm-up iterations); "
          "update = the agent's update alone, scanned over a replay buffer filled to capacity; "
          "floor = update x updates per env step; loop = the whole iteration per env step; "
          f"efficiency = floor / loop (target >= {EFFICIENCY_TARGET:.0%} at 1 env); "
          "overhead = loop - floor - acting")
    head = (f"{'task':<16} {'agent':<6} {'setting':<28} {'acting ms':>9} {'update ms':>9} "
            f"{'floor ms':>8} {'loop ms':>8} {'efficiency':>10} {'overhead ms':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['task']:<16} {r['agent']:<6} {r['setting']:<28} {r['ms_acting']:>9.3f} "
              f"{r['ms_update']:>9.3f} {r['ms_floor']:>8.3f} {r['ms_loop']:>8.3f} "
              f"{r['efficiency']:>10.1%} {r['ms_overhead']:>11.3f}")
    for task in dict.fromkeys(r["task"] for r in rows):
        one = {r["agent"]: r["ms_update"] for r in rows
               if r["task"] == task and r["setting"] == next(iter(EFFICIENCY_SETTINGS))}
        ratios = [f"{a}/{b} {one[a] / one[b]:.2f}x (target <= {t}x)"
                  for a, b, t in UPDATE_TARGETS if a in one and b in one]
        if ratios:
            print(f"{task}: update cost ratios at 1 env: " + ", ".join(ratios))


def print_train_table(rows) -> None:
    head = (f"{'task':<16} {'agent':<34} {'backend':<7} {'setting':<30} {'env steps/s':>11} "
            f"{'ratio':>6} {'ms/update':>9} {'eval return':>11} {'wall s':>7}")
    print("\ntraining env steps/s (compile excluded). ratio: agents at 1 env against the "
          "reference of their family (TD3 for ddpg/d4pg/td3/td4, SAC for sac/mpo); ppo against raw "
          "physics at the same batch")
    print(head)
    print("-" * len(head))
    fmt = lambda v, f: "" if not np.isfinite(v) else format(v, f)
    for r in rows:
        ratio = "" if not np.isfinite(r["ratio"]) else f"{r['ratio']:.2f}x"
        print(f"{r['task']:<16} {r['agent']:<34} {r['backend']:<7} {r['setting']:<30} "
              f"{r['sps']:>11.0f} {ratio:>6} {fmt(r['ms_update'], '.2f'):>9} "
              f"{fmt(r['eval_return'], '.1f'):>11} {fmt(r['wall'], '.0f'):>7}")


TORSOS = {"mlp + layer norm": dict(critic_layer_norm=True),
          "simba 128 x 1 block": dict(critic_torso="simba", simba_width=128, simba_blocks=1),
          "simba 128 x 2 blocks": dict(critic_torso="simba", simba_width=128, simba_blocks=2)}


def torso_costs(algos, tasks, iters: int = 100, repeats: int = 5, quick: bool = False) -> list:
    """Per off-policy agent and task, `loop_efficiency` of each critic torso of
    TORSOS at 256 envs and 1 update per 16 env steps (batch 256, [256, 256])."""
    small = dict(batch_size=32, hidden_sizes=(32, 32), buffer_size=10_000) if quick else {}
    num_envs = 4 if quick else 256
    rows = []
    for task in tasks:
        for algo in algos:
            if algo not in OFF_POLICY:
                continue
            for name, torso in TORSOS.items():
                r = loop_efficiency(algo, task, num_envs, 1 / 16, iters=iters, repeats=repeats,
                                    **small, **torso)
                rows.append(dict(task=task, agent=algo, torso=name, **r))
    return rows


def print_torso_table(rows) -> None:
    print("\ncritic torso cost at 256 envs, 1 update per 16 env steps (compile excluded; "
          "medians): update = one gradient update alone; loop = the whole iteration per env "
          "step; ratios against the same agent's layer-normed MLP")
    head = (f"{'task':<16} {'agent':<6} {'torso':<22} {'update ms':>9} {'x mlp':>6} "
            f"{'loop ms/step':>12} {'x mlp':>6}")
    print(head)
    print("-" * len(head))
    base = {(r["task"], r["agent"]): r for r in rows if r["torso"] == next(iter(TORSOS))}
    for r in rows:
        b = base[(r["task"], r["agent"])]
        print(f"{r['task']:<16} {r['agent']:<6} {r['torso']:<22} {r['ms_update']:>9.2f} "
              f"{r['ms_update'] / b['ms_update']:>5.2f}x {r['ms_loop']:>12.3f} "
              f"{r['ms_loop'] / b['ms_loop']:>5.2f}x")


def member_axis_costs(algos, steps: int, repeats: int = 5, quick: bool = False) -> list:
    """Per agent, env steps/s of one seed's whole run (compile excluded;
    medians of `repeats` timings, the two programs in turn) at its
    humanoid_walk recipe, compiled two ways: as the command line does
    (parallel.over_members: the single member without a vmap) and vmapped
    over a member axis of length 1 (how every run compiled before)."""
    import jax
    from common import parallel
    task = "cartpole_balance" if quick else "humanoid_walk"
    rows = []
    for algo in algos:
        spec = load_algo(algo).AGENT
        recipe = {k: v for k, v in spec.defaults_for("humanoid_walk").items()
                  if k not in ("total_timesteps", "eval_every", "checkpoint_every")}
        if quick:
            recipe.update(hidden_sizes=(16, 16), buffer_size=4096, batch_size=32)
        num_envs = recipe.pop("num_envs", 256)
        num_envs = min(num_envs, 16) if quick else num_envs
        mod, config = agent_config(algo, task, num_envs, steps, learning_starts=4 * num_envs,
                                   **recipe)
        train = mod.make_train(config)
        keys = jax.random.split(jax.random.PRNGKey(0), 1)
        progs = {"one member": jax.jit(parallel.over_members(train)).lower(keys).compile(),
                 "vmap over 1": jax.jit(jax.vmap(train)).lower(keys).compile()}
        times = {name: [] for name in progs}
        for _ in range(repeats):
            for name, prog in progs.items():
                t0 = time.perf_counter()
                jax.block_until_ready(prog(keys))
                times[name].append(time.perf_counter() - t0)
        sps = {name: train.schedule.total_steps / float(np.median(t)) for name, t in times.items()}
        rows.append(dict(agent=algo, task=task, envs=num_envs, **sps))
        print(f"  {algo}: {sps['one member']:,.0f} env steps/s as one member, "
              f"{sps['vmap over 1']:,.0f} vmapped over 1", flush=True)
    return rows


def print_member_table(rows) -> None:
    from .util import device_line
    print(f"\nOne seed's run at its humanoid recipe on {device_line()}, env steps/s (compile "
          f"excluded, medians; the final evaluation included):\n")
    print("| agent | task | envs | as one member | vmapped over 1 | ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['agent']} | {r['task']} | {r['envs']} | {r['one member']:,.0f} | "
              f"{r['vmap over 1']:,.0f} | {r['one member'] / r['vmap over 1']:.2f} |")
