"""`envs` mode: env steps/s of raw MuJoCo, the native backend and MJX.

RawRollout (raw `mujoco.rollout` on the batch) is also the physics
reference of the `train` mode's PPO rows.
"""
from __future__ import annotations

from typing import Dict, List

from common.errors import UserError

from .util import calls_for, median, timed, timed_cpu

HELP = "env steps/s: raw mujoco.rollout vs native vs mjx"
DOC = """Throughput benchmarks, each printed next to a reference measured in the same run.

    python scripts/benchmark.py envs              # env steps/s: raw MuJoCo vs native vs mjx
    python scripts/benchmark.py envs --quick      # a smoke check in well under a minute

`envs` mode, per task and batch size, in env (control) steps per second:

* raw     `mujoco.rollout.rollout` stepping the same batch from the same
          states with MuJoCo's own thread pool (one thread per core) and no
          JAX: n_sub_steps physics steps per control step, random controls.
          The physical limit of this machine.
* native  `envs.make(task, "native")` inside `jax.jit`: `lax.scan` over
          control steps of a vmapped `env.step` with auto-reset, random
          actions drawn in JAX.
* mjx     the same program on the `mjx` backend on the default JAX device. On
          a CPU MJX is 50-100x slower than native (and a jitted call at 1024
          envs has hung there), so it runs a smaller batch (`--mjx-envs`) for
          fewer steps; `--skip-mjx` leaves it out.

Timed calls are interleaved (raw, native, mjx, raw, ...) after a compiling
warm-up, so that load from other processes hits all of them alike; the table
shows medians over `--repeats` and the median of the per-repeat ratios.
"""


def add_arguments(e) -> None:
    e.add_argument("--tasks", nargs="+", default=["humanoid_walk", "cheetah_run"])
    e.add_argument("--num-envs", nargs="+", type=int, default=[256, 1024])
    e.add_argument("--steps", type=int, default=20, help="control steps per jitted call")
    e.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement (median)")
    e.add_argument("--min-time", type=float, default=1.0,
                   help="seconds a timed repeat lasts at least (calls are repeated to fill it)")
    e.add_argument("--nthread", type=int, default=0, help="MuJoCo threads (0: one per core)")
    e.add_argument("--pool-size", type=int, default=1024,
                   help="dm_control resets in the reset pool")
    e.add_argument("--skip-mjx", action="store_true", help="leave out the mjx backend")
    e.add_argument("--mjx-envs", type=int, default=64,
                   help="batch size for mjx (at most --num-envs)")
    e.add_argument("--mjx-steps", type=int, default=5, help="control steps per timed mjx call")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--quick", action="store_true",
                   help="smoke check: cartpole_balance, 16 envs, few steps, no mjx")


def run(args) -> int:
    if args.quick:
        args.tasks, args.num_envs, args.steps, args.repeats = ["cartpole_balance"], [16], 5, 2
        args.pool_size, args.skip_mjx, args.min_time = 16, True, 0.05
    from common import envs
    for t in args.tasks:
        if t not in envs.names():
            raise UserError(f"unknown task {t!r}; valid tasks: {', '.join(envs.names())}")
    for name in ("steps", "repeats", "mjx_envs", "mjx_steps", "pool_size", "min_time"):
        if getattr(args, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive")
    if min(args.num_envs) < 1 or args.nthread < 0:
        raise UserError("--num-envs must be positive and --nthread non-negative")
    return bench_envs(args)


class RawRollout:
    """`n` simulations of `env`'s model, stepped by `mujoco.rollout.rollout`
    from the given carried states; continues from where the last call ended."""

    def __init__(self, env, states, nthread: int, chunk: int, seed: int = 0):
        import mujoco
        import numpy as np
        from common.envs.native import CARRIED_SPEC, decode

        m = env.model
        self.model, self.n_sub_steps = m, env.n_sub_steps
        rows = decode(np.asarray(states.physics)).reshape(-1, env.native.nstate)
        self.n = rows.shape[0]
        full = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
        d = mujoco.MjData(m)
        self.state = np.zeros((self.n, mujoco.mj_stateSize(m, full)))
        self.warmstart = np.zeros((self.n, m.nv))
        for i, row in enumerate(rows):
            mujoco.mj_setState(m, d, row, CARRIED_SPEC)
            mujoco.mj_getState(m, d, self.state[i], full)
            self.warmstart[i] = d.qacc_warmstart
        self.datas = [mujoco.MjData(m) for _ in range(nthread)]
        self.chunk = chunk  # control steps per rollout call (bounds the output buffers)
        rng = np.random.default_rng(seed)
        lo, hi = m.actuator_ctrlrange[:, 0], m.actuator_ctrlrange[:, 1]
        u = rng.uniform(-1, 1, (self.n, chunk, m.nu))
        u = np.where(m.actuator_ctrllimited.astype(bool), np.clip(u, lo, hi), u)
        self.control = np.repeat(u, self.n_sub_steps, axis=1)  # held for a control step
        nstep = chunk * self.n_sub_steps
        self.out_state = np.empty((self.n, nstep, self.state.shape[1]))
        self.out_sensor = np.empty((self.n, nstep, m.nsensordata))

    def run(self, steps: int) -> None:
        from mujoco import rollout
        done = 0
        while done < steps:
            k = min(self.chunk, steps - done)
            nstep = k * self.n_sub_steps
            rollout.rollout(self.model, self.datas, self.state, self.control[:, :nstep],
                            initial_warmstart=self.warmstart, nstep=nstep,
                            state=self.out_state[:, :nstep], sensordata=self.out_sensor[:, :nstep],
                            persistent_pool=True)
            self.state = self.out_state[:, nstep - 1].copy()
            self.warmstart = None
            done += k


class JaxRollout:
    """`steps` control steps of a vmapped env.step with random actions, as one
    jitted lax.scan; continues from where the last call ended."""

    def __init__(self, env, n: int, steps: int, seed: int = 0):
        import jax

        def run(states, key):
            def body(carry, _):
                s, k = carry
                k, sub = jax.random.split(k)
                a = jax.random.uniform(sub, (n, env.action_size), minval=-1.0, maxval=1.0)
                return (jax.vmap(env.step)(s, a), k), None
            return jax.lax.scan(body, (states, key), None, length=steps)[0]

        self.env, self.steps = env, steps
        self._run = jax.jit(run)
        keys = jax.random.split(jax.random.PRNGKey(seed), n)
        self.carry = (jax.jit(jax.vmap(env.reset))(keys), jax.random.PRNGKey(seed + 1))

    def run(self) -> None:
        import jax
        self.carry = jax.block_until_ready(self._run(*self.carry))


def bench_envs(args) -> int:
    import jax
    import numpy as np
    from common import envs
    from common.envs.native import default_threads

    nthread = args.nthread or default_threads()
    print(f"envs benchmark: JAX {jax.__version__} on {jax.default_backend()} "
          f"({jax.devices()[0].device_kind}); {nthread} threads for MuJoCo; "
          f"{args.steps} control steps per call; median of {args.repeats} timed repeats "
          f"of at least {args.min_time:g}s each")
    if args.skip_mjx:
        print("mjx: skipped (--skip-mjx)")
    else:
        print(f"mjx: at most {args.mjx_envs} envs and {args.mjx_steps} steps per call "
              f"(MJX on a CPU is 50-100x slower than native and takes minutes to compile; "
              f"--skip-mjx leaves it out)")
    rows, mjx_cache = [], {}
    for task in args.tasks:
        for n in args.num_envs:
            env = envs.make(task, "native", pool_size=min(n, args.pool_size), nthread=nthread)
            native = JaxRollout(env, n, args.steps, seed=args.seed)
            raw = RawRollout(env, native.carry[0], nthread, chunk=min(args.steps, 10),
                             seed=args.seed)
            n_mjx = min(n, args.mjx_envs)
            mjx, mjx_note = None, "skipped"
            if not args.skip_mjx:
                if (task, n_mjx) not in mjx_cache:
                    try:
                        env_mjx = envs.make(task, "mjx", pool_size=min(n_mjx, args.pool_size))
                        mjx = JaxRollout(env_mjx, n_mjx, args.mjx_steps, seed=args.seed)
                        mjx.compile_time = timed(mjx.run)
                    except Exception as e:  # report it and go on: the other columns stand
                        mjx = f"failed: {type(e).__name__}: {' '.join(str(e).split())[:60]}"
                    mjx_cache[task, n_mjx] = mjx
                mjx = mjx_cache[task, n_mjx]
                if isinstance(mjx, str):
                    mjx, mjx_note = None, mjx
            # warm-up: compile, move off the reset states into mid-episode, and
            # size each timed repeat to last at least --min-time
            t_compile = timed(native.run)
            k_nat = calls_for(native.run, args.min_time)
            k_raw = calls_for(lambda: raw.run(args.steps), args.min_time)
            t_raw, t_nat, t_mjx, ratio, cpu_ratio = [], [], [], [], []
            for _ in range(args.repeats):  # interleaved, so that load hits all alike
                w_raw, c_raw = timed_cpu(lambda: raw.run(args.steps), k_raw)
                w_nat, c_nat = timed_cpu(native.run, k_nat)
                t_raw.append(w_raw / k_raw)
                t_nat.append(w_nat / k_nat)
                ratio.append(t_raw[-1] / t_nat[-1])
                cpu_ratio.append((c_raw / k_raw) / max(c_nat / k_nat, 1e-9))
                if mjx is not None:
                    t_mjx.append(timed(mjx.run))
            sps = lambda ts, n_, steps: n_ * steps / median(ts)
            row = dict(task=task, n=n, raw=sps(t_raw, n, args.steps),
                       native=sps(t_nat, n, args.steps), ratio=median(ratio),
                       cpu_ratio=median(cpu_ratio), compile=t_compile)
            if mjx is not None:
                row["mjx"] = sps(t_mjx, n_mjx, args.mjx_steps)
                mjx_note = f"{row['mjx']:.0f} ({n_mjx} envs)"
            row["mjx_note"] = mjx_note
            rows.append(row)
            nonfinite = int(np.asarray(native.carry[0].info["nonfinite"]).sum())
            print(f"  {task} x{n}: raw {row['raw']:.0f}/s, native {row['native']:.0f}/s "
                  f"(ratio {row['ratio']:.2f}, per CPU-second {row['cpu_ratio']:.2f}; "
                  f"first call with compile {t_compile:.1f}s; "
                  f"{nonfinite} non-finite resets), mjx {mjx_note}", flush=True)
    print_table(rows, nthread)
    return 0


def print_table(rows: List[Dict], nthread: int) -> None:
    head = (f"{'task':<16} {'envs':>5} {'raw rollout':>12} {'native':>10} {'native/raw':>10} "
            f"{'(CPU-time)':>10}  {'mjx':<24}")
    print()
    print("env steps/s (control steps; raw = mujoco.rollout on "
          f"{nthread} threads, no JAX: this machine's limit)")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['task']:<16} {r['n']:>5} {r['raw']:>12.0f} {r['native']:>10.0f} "
              f"{r['ratio']:>10.2f} {r['cpu_ratio']:>10.2f}  {r['mjx_note']:<24}")
    print("native/raw: wall-clock ratio, median over interleaved repeats; (CPU-time): the same "
          "per CPU-second used, which load from other processes hardly moves")
