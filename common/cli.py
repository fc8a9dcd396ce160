"""The command line of every agent: `python algos/<name>.py ...` is
`cli.main(AGENT, argv)`, with AGENT the script's `agent.Agent`.

`main` parses, checks, trains, logs, checkpoints and resumes, one function
a step:

1. `parse`: tyro parses the agent's Config (the module docstring heads --help);
   from here on JAX's persistent compilation cache is on (`compile_cache`,
   unless --no-compile-cache);
2. `check_inputs`: the agent's sizes, the backend, the task and the sweep
   axes, each refused with one line (exit status 2) before any work;
3. `plan_members`: the members (seeds x sweep combinations, scripts/sweep.py),
   their keys and hyperparameters, the device mesh (common/parallel.py);
4. `read_resume`: a checkpoint's header (this process's own, `own_checkpoint`),
   refused for another agent, task, sweep or set of members;
5. make_train, `parallel.check_fits` (the members' states must fit); the first
   line (`where_line`: where physics and learning run), a warning for MJX on
   a TPU, the task's recipe line and a summary line;
6. `starting_point`: a new run directory, or the checkpoint's states and chunk;
7. `train_members`: logs and checkpoints (`open_run`'s hooks), init or
   the loaded states, the run under the stall `Watchdog` and `Interrupt`
   (Ctrl-C or SIGTERM: logs closed, the last checkpoint kept, exit 130/143);
   a fresh run that fails leaves no run directory;
8. `report`: the final evaluation returns, a sweep's table of results, and
   one line naming every member that diverged (agent.make_runner) and its
   env step; a run (not a sweep) with a diverged member then exits 1.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import jax
import numpy as np

from common import agent
from common import checkpoint as ckpt
from common.errors import UserError
from common.logging import RunLogger, run_name


class Plan(NamedTuple):
    """The members of one run: seeds x sweep combinations, combination-major."""
    config: Any
    axes: list                   # sweep axes (empty without --sweep)
    hps: Any                     # the agent's HParams with a leading member axis
    combos: List[dict]           # {axis name: value} per member
    keys: np.ndarray             # a PRNG key per member
    mesh: Any                    # jax Mesh over several devices, or None
    sweep_meta: Optional[list]   # [[axis name, values], ...] for checkpoint headers

    @property
    def num_members(self) -> int:
        return len(self.combos)


def main(spec: agent.Agent, argv=None, sweep_specs: Optional[Sequence[str]] = None) -> Any:
    """Parse, check, train, log, checkpoint, resume (the steps are in the
    module docstring). `sweep_specs` (`name=v1,v2` strings, scripts/sweep.py):
    train every combination x seed in the same program. Members are sharded
    over the devices when JAX sees several. Returns (states, history)."""
    from common import envs, parallel
    parallel.initialize_distributed()  # before anything asks JAX for its backend
    config = parse(spec, argv, announce=False)
    with compile_cache(config.compile_cache), matmul_precision():
        axes = check_inputs(spec, config, sweep_specs or ())
        plan = plan_members(spec, config, axes)
        header = read_resume(spec, plan) if config.resume else None
        train = spec.make_train(config)  # validates sizes and memory
        estimate = parallel.check_fits(train, plan.num_members, plan.mesh)
        devices = 1 if plan.mesh is None else plan.mesh.devices.size
        print(where_line(train.env, config.num_envs * plan.num_members // devices, devices),
              flush=True)
        warning = envs.backend_warning(config.backend)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        recipe = recipe_line(spec, config)
        if recipe:
            print(recipe)
        print(f"{spec.name} on {config.env}: backend {train.env.backend}, {config.num_seeds} "
              f"seed(s) x {plan.num_members // config.num_seeds} combination(s) x "
              f"{config.num_envs} env(s), {train.schedule.total_steps} env steps each; "
              f"{plan.num_members} member(s) on {devices} device(s), about "
              f"{estimate['total'] / 2**20:.1f} MiB of state", flush=True)
        run_dir, states, start_chunk = starting_point(spec, plan, train, header)
        states, history, seconds = train_members(
            spec, plan, train, run_dir, states, start_chunk,
            None if header is None else header.get("diverged_at"))
        history = parallel.fetch(history)
    diverged = report(plan, run_dir, history, seconds, start_chunk >= train.schedule.num_chunks)
    if diverged and not plan.axes:  # a sweep ranks its diverged members last instead
        raise SystemExit(1)
    return states, history


def where_line(env, batch: int, devices: int) -> str:
    """The first line of a run: where its physics runs (native MuJoCo on the
    host threads that step `batch` envs at once, or MJX on the device) and
    where it learns (the devices' kind, and the float32 matmul precision
    where it is not the platform's own)."""
    from common import envs
    learning = envs.describe_device()
    precision = jax.config.jax_default_matmul_precision
    if precision and envs.current_platform() != "cpu":
        learning += f", float32 matmuls at precision {precision}"
    return (f"physics: {envs.describe_physics(env, batch)}; learning: "
            f"{f'{devices} x ' if devices > 1 else ''}{learning}")


# --------------------------------------------------------------------------- matmul precision

PRECISION_VAR = "JAX_DEFAULT_MATMUL_PRECISION"


@contextlib.contextmanager
def matmul_precision(platform: Optional[str] = None):
    """Float32 matmuls at precision `highest` on a TPU, unless
    $JAX_DEFAULT_MATMUL_PRECISION says otherwise. A TPU's default runs them as
    bfloat16 passes; our recipes were found on CPUs, at full float32, and
    D4PG learned slower per env step on the chip at the default (docs/accelerator.md).
    `highest` costs 1.7x a bare [256, 256] update at batch 256, a small part of
    an agent's update. CPUs and GPUs keep JAX's default."""
    from common import envs
    where = envs.current_platform() if platform is None else platform
    before = jax.config.jax_default_matmul_precision
    if where == "tpu" and not os.environ.get(PRECISION_VAR):
        jax.config.update("jax_default_matmul_precision", "highest")
    try:
        yield jax.config.jax_default_matmul_precision
    finally:
        jax.config.update("jax_default_matmul_precision", before)


# --------------------------------------------------------------------------- compilation cache

CACHE_VAR = "RL_COMPILE_CACHE_DIR"
_CACHE_OPTIONS = ("jax_enable_compilation_cache", "jax_compilation_cache_dir",
                  "jax_persistent_cache_min_compile_time_secs",
                  "jax_persistent_cache_min_entry_size_bytes")


def compile_cache_dir() -> str:
    """Where the compilation cache lives: $RL_COMPILE_CACHE_DIR, else
    jax-mujoco-rl/xla under the user's cache directory ($XDG_CACHE_HOME or ~/.cache)."""
    if os.environ.get(CACHE_VAR):
        return os.environ[CACHE_VAR]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jax-mujoco-rl", "xla")


@contextlib.contextmanager
def compile_cache(enabled: bool):
    """JAX's persistent compilation cache on (in `compile_cache_dir()`, every
    program whatever its compile time) or off for what compiles inside; JAX's
    settings as they were afterwards. JAX refuses to store a program with host
    callbacks, which every training program has (docs/throughput.md)."""
    from jax.experimental.compilation_cache import compilation_cache as cc
    before = {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}
    path = compile_cache_dir() if enabled else None
    if path:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            print(f"warning: compilation cache off: cannot use {path!r} ({e.strerror}; "
                  f"${CACHE_VAR} sets another directory)", file=sys.stderr, flush=True)
            path = None
    want = {"jax_enable_compilation_cache": bool(path), "jax_compilation_cache_dir": path,
            "jax_persistent_cache_min_compile_time_secs": 0.0,
            "jax_persistent_cache_min_entry_size_bytes": -1}

    def apply(values):
        for name, value in values.items():
            jax.config.update(name, value)
        cc.reset_cache()  # JAX settles the cache once per process otherwise

    apply(want)
    try:
        yield path
    finally:
        apply(before)


def parse(spec: agent.Agent, argv, announce: bool = True) -> Any:
    """The Config of the command line. The task (--env) is read first: where
    its domain has defaults of its own (the agent's TASK_DEFAULTS, e.g. the
    humanoid recipe), they replace the plain defaults, every flag given
    still wins, and a line says which values came from them (`recipe_line`;
    printed here when `announce`, else `main` prints it after the first line)."""
    import tyro
    argv = list(sys.argv[1:] if argv is None else argv)
    env = _flag_value(argv, "--env") or spec.Config().env
    config = tyro.cli(spec.Config, args=argv, description=spec.doc,
                      default=spec.config_for(env))
    line = recipe_line(spec, config)
    if announce and line:
        print(line, flush=True)
    return config


def recipe_line(spec: agent.Agent, config) -> Optional[str]:
    """Which values of `config` came from its task's TASK_DEFAULTS and, on an
    accelerator, from the agent's ACCELERATOR_DEFAULTS, or None."""
    from common import envs
    env = config.env
    accelerator = spec.accelerator_defaults_for(env)
    used = {k: v for k, v in spec.defaults_for(env).items() if getattr(config, k) == v}
    if not used:
        return None
    task = " ".join(as_flag(k, v) for k, v in used.items() if k not in accelerator)
    fast = " ".join(as_flag(k, v) for k, v in used.items() if k in accelerator)
    parts = ([f"{spec.name}'s {env.split('_')[0]} defaults (TASK_DEFAULTS): {task}"] if task
             else []) + ([f"on this {envs.current_platform()}, its accelerator recipe "
                          f"(ACCELERATOR_DEFAULTS): {fast}"] if fast else [])
    return f"{env}: " + "; ".join(parts) + f" (algos/{spec.name}.py; any flag overrides them)"


def _flag_value(argv: Sequence[str], flag: str) -> Optional[str]:
    """The value of `flag` in argv (`--flag v` or `--flag=v`; the last wins), or None."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def as_flag(field: str, value) -> str:
    """`field=value` as the command-line flag that sets it."""
    name = field.replace("_", "-")
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    if isinstance(value, (tuple, list)):
        return f"--{name} " + " ".join(str(v) for v in value)
    return f"--{name} {value}"


def check_inputs(spec: agent.Agent, config, sweep_specs: Sequence[str]) -> list:
    """Refuse, before any work, what the run cannot do: the agent's sizes
    (first), the backend, the task, the sweep axes and each combination's
    sizes. Starts jax.distributed when asked to. Returns the sweep axes."""
    from common import envs, parallel, sweep
    spec.validate(config)
    parallel.initialize_distributed()
    envs.resolve_backend(config.backend)
    if config.env not in envs.names():
        raise UserError(f"unknown task {config.env!r}; valid tasks: {', '.join(envs.names())}")
    axes = sweep.parse_axes(sweep_specs, spec.Config, spec.HParams, spec.name)
    for combo in sweep.combinations(axes) if axes else ():
        spec.validate(sweep.combination_config(config, axes, combo))
    return axes


def plan_members(spec: agent.Agent, config, axes: list) -> Plan:
    from common import parallel, sweep
    hps, combos = sweep.member_hparams(config, axes, spec.hparams, config.num_seeds)
    mesh = parallel.make_mesh(len(combos),
                              "--num-seeds x the sweep combinations" if axes else "--num-seeds")
    keys = np.tile(seed_keys(config.seed, config.num_seeds), (len(combos) // config.num_seeds, 1))
    return Plan(config, axes, hps, combos, keys, mesh,
                [[a.name, list(a.values)] for a in axes] or None)


def seed_keys(seed: int, num_seeds: int) -> np.ndarray:
    """Member m of `--seed s --num-seeds N` runs with PRNGKey(s + m), so it is
    the very run `--seed s+m` would be alone (a 4-seed run is 4 single runs)."""
    return np.stack([np.asarray(jax.random.PRNGKey(seed + m)) for m in range(num_seeds)])


def read_resume(spec: agent.Agent, plan: Plan) -> dict:
    """The header of the checkpoint to resume, refused when it is for another
    agent, task or sweep, or when a member of a run (not a sweep, where
    diverged members stay diverged) had diverged: its networks are not
    finite, there is nothing to continue. In a run over several processes
    each process resumes its own checkpoint (`own_checkpoint`), which must
    hold the members this process runs."""
    from common import parallel
    config = plan.config
    path = own_checkpoint(config.resume)
    header = ckpt.read_header(path)
    for key, want in (("algo", spec.name), ("env", config.env), ("sweep", plan.sweep_meta)):
        if header.get(key) != want:
            raise UserError(f"checkpoint {path!r} is for {key}={header.get(key)!r}, "
                            f"not {want!r}")
    diverged = {m: s for m, s in zip(header.get("members") or (), header.get("diverged_at") or ())
                if s >= 0}
    if diverged and not plan.axes:
        raise UserError(f"checkpoint {config.resume!r} is of a run that diverged "
                        f"({diverged_list(plan, diverged)}): its networks are not finite, so "
                        f"--resume cannot continue it; start a new run ({DIVERGED_HINT})")
    if jax.process_count() > 1:
        local = parallel.local_members(plan.mesh, plan.num_members).tolist()
        if header.get("members") != local:
            raise UserError(f"checkpoint {path!r} holds members {header.get('members')}, but "
                            f"process {jax.process_index()} of {jax.process_count()} runs "
                            f"members {local}: resume with the processes and devices of the run")
    return dict(header, path=path)


def own_checkpoint(path: str) -> str:
    """The checkpoint this process resumes from `path`. In a run over several
    processes every process has its own run directory (`<run>__process<k>`),
    so the same command resumes on every host: given any process's run
    directory or checkpoint, or the run's name without the suffix, process
    k takes `<run>__process<k>`."""
    if jax.process_count() == 1:
        return path
    path = path.rstrip(os.sep)
    directory, name = (os.path.dirname(path), os.path.basename(path)) \
        if os.path.isfile(path) or path.endswith(".npz") else (path, ckpt.CHECKPOINT_FILE)
    base = re.sub(r"__process\d+$", "", directory)
    return os.path.join(f"{base}__process{jax.process_index()}", name)


def starting_point(spec: agent.Agent, plan: Plan, train: agent.Train,
                   header: Optional[dict]) -> Tuple[str, Any, int]:
    """(run directory, states, first chunk to run): a new directory, no
    states and chunk 0; or, resuming, the checkpoint's directory, its states
    and the chunk after its own."""
    from common import parallel
    config = plan.config
    if header is None:
        algo = spec.name + ("_sweep" if plan.axes else "")
        run_dir = os.path.join(config.log_dir, run_name(config.env, algo, config.seed,
                                                        parallel.same_time()))
        if jax.process_count() > 1:
            run_dir += f"__process{jax.process_index()}"
        return run_dir, None, 0
    local = parallel.local_members(plan.mesh, plan.num_members)
    template = jax.eval_shape(jax.vmap(train.init), plan.keys[local],
                              jax.tree.map(lambda x: np.asarray(x)[local], plan.hps))
    states, header = ckpt.load(header["path"], template, {
        "algo": spec.name, "env": config.env, "num_seeds": config.num_seeds})
    start_chunk = int(header["chunk"]) + 1
    parallel.check_same(start_chunk, "the chunk their checkpoints resume after",
                        "resume from checkpoints of the same chunk")
    print(f"resuming {header['run_dir']} after chunk {start_chunk} of {train.schedule.num_chunks}")
    return header["run_dir"], states, start_chunk


class Background:
    """Runs writes on a thread of its own (`name`), one at a time and in
    order, each holding `lock`, while the device trains on. submit() first
    waits for the write before it, so at most one is pending and its error
    reaches the next submit. Interrupt takes the lock: a write under way is
    finished, and one not yet begun is not made (the process ends)."""

    def __init__(self, name: str, lock: Optional[threading.Lock] = None):
        import concurrent.futures
        self.lock, self.last = lock or threading.Lock(), None
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)

    def _locked(self, write: Callable[[], None]) -> None:
        with self.lock:
            write()

    def submit(self, write: Callable[[], None]) -> None:
        self.wait()
        self.last = self.pool.submit(self._locked, write)

    def wait(self) -> None:
        """Until the last write is made (its error, if any, raised)."""
        if self.last is not None:
            self.last.result()

    def close(self) -> None:
        """wait(), and the thread ends."""
        try:
            self.wait()
        finally:
            self.pool.shutdown()


def open_run(spec: agent.Agent, plan: Plan, train: agent.Train,
             run_dir: str) -> Tuple[RunLogger, agent.Hooks, Tuple[Background, Background]]:
    """The run directory's logger (a TensorBoard stream per local member),
    the hooks that log and checkpoint into it, each call gathered from the
    shards of all devices first (parallel.Gather), and the two Background
    writers (logs, checkpoints) that write them beside the run. The device
    waited on each write: a chunk's log writes in about 0.6 ms (a 2-core
    CPU), and D4PG's 35 ms chunks on a TPU waited 1.35 ms in the chunk's own
    host call; a checkpoint of its 350 MiB state cost a TPU run 2.8 s
    written inside the call, 2.0-2.1 s written beside it, the rest being the
    state's transfer (docs/accelerator.md)."""
    from common import parallel, sweep
    config = plan.config
    local = parallel.local_members(plan.mesh, plan.num_members)
    seeds = [int(config.seed + m % config.num_seeds) for m in local]
    if plan.axes:
        streams = [f"{sweep.label(plan.combos[m])}/seed_{s}" for m, s in zip(local, seeds)]
        tags = [dict(plan.combos[m], seed=s, member=int(m)) for m, s in zip(local, seeds)]
    else:
        streams, tags = seeds, None
    logger = RunLogger(run_dir, config, train.schedule.total_steps, streams, tags=tags)
    ckpt_path = os.path.join(run_dir, ckpt.CHECKPOINT_FILE)

    logs, saver = Background("log", logger.busy), Background("checkpoint")

    def log(step, members, metrics):  # metrics: Gather's own copies, safe on the thread
        logs.submit(lambda: logger.write(step, metrics))

    def save(chunk, members, state_and_diverged):  # state: Gather's own copies
        state, diverged_at = state_and_diverged
        header = {"algo": spec.name, "env": config.env, "num_seeds": config.num_seeds,
                  "chunk": chunk, "run_dir": run_dir, "sweep": plan.sweep_meta,
                  "members": members.tolist(),
                  # per member: the env step it diverged at, -1: none
                  "diverged_at": diverged_at.tolist(), "config": dataclasses.asdict(config)}
        saver.submit(lambda: ckpt.save(ckpt_path, state, header))

    gather_log, gather_save = parallel.Gather(log, local), parallel.Gather(save, local)

    def checkpoint(lead, chunk, state, diverged_at, member):
        saver.wait()  # the last write done before Gather copies the next state: one copy at most
        gather_save(chunk, member, (state, diverged_at))

    hooks = agent.Hooks(lambda lead, step, metrics, member: gather_log(step, member, metrics),
                        checkpoint)
    return logger, hooks, (logs, saver)


def train_members(spec: agent.Agent, plan: Plan, train: agent.Train, run_dir: str, states,
                  start_chunk: int, diverged_at=None) -> Tuple[Any, Any, float]:
    """Every member from `start_chunk` on, from `states` (None: init), as one
    program; returns (states, history, seconds). `diverged_at`: a resumed
    checkpoint's steps of divergence per member (None: none). A fresh run
    that fails leaves no run directory behind."""
    from common import parallel
    mesh, resumed = plan.mesh, states is not None
    profile = Profile.from_env()
    created = not os.path.exists(run_dir)
    logger, hooks, writers = open_run(spec, plan, train, run_dir)
    logs, saver = writers
    ckpt_path = os.path.join(run_dir, ckpt.CHECKPOINT_FILE)
    init, run = parallel.compile_members(train, mesh, hooks)
    try:
        if resumed:  # this process's members
            states = parallel.put(states, mesh, plan.num_members,
                                  parallel.local_members(mesh, plan.num_members))
        else:
            states = init(parallel.put(plan.keys, mesh), parallel.put(plan.hps, mesh))
        t0 = time.time()
        members = parallel.put(np.arange(plan.num_members, dtype=np.int32), mesh)
        if diverged_at is not None:  # from this process's checkpoint: its members only
            diverged_at = parallel.put(np.asarray(diverged_at, np.int32), mesh, plan.num_members,
                                       parallel.local_members(mesh, plan.num_members))
        with Watchdog(stall_timeout(), lambda idle: _stalled(idle, ckpt_path)), \
                Interrupt(Locks(logger.busy, saver.lock), logger.close,
                          lambda sig: _interrupted(sig, ckpt_path)), \
                profile:
            states, history = run(states, start_chunk, members, diverged_at)
            jax.block_until_ready(states)
            logs.close()
            saver.close()
    except BaseException:
        for writer in writers:  # a failed run still writes the good checkpoint it handed over
            try:
                writer.close()
            except Exception:
                pass
        logger.close()
        if created and not resumed and not os.path.exists(ckpt_path):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    logger.close()
    return states, history, time.time() - t0


DIVERGED_HINT = "smaller learning rates, or a gradient clip with --max-grad-norm"


def diverged_list(plan: Plan, diverged: Dict[int, int]) -> str:
    """{member: env step} -> "seed 2 at env step 3000, ..." (sweep members by
    their stream, e.g. "learning_rate=1e+09/seed_1")."""
    from common import sweep
    config = plan.config
    names = {m: (f"{sweep.label(plan.combos[m])}/seed_{config.seed + m % config.num_seeds}"
                 if plan.axes else f"seed {config.seed + m % config.num_seeds}") for m in diverged}
    return ", ".join(f"{names[m]} at env step {s}" for m, s in sorted(diverged.items()))


def report(plan: Plan, run_dir: str, history, seconds: float,
           was_finished: bool) -> Dict[int, int]:
    """The final evaluation returns; one line (stderr) naming every diverged
    member and its env step; for a sweep, its table of results (kept in
    run_dir/results.json; a resumed finished sweep shows it as it was), the
    diverged combinations last. Returns {member: step} of the diverged."""
    from common import sweep
    config, axes = plan.config, plan.axes
    final = np.asarray(history["eval/episode_return"])[:, -1]
    steps = np.asarray(history["stats/diverged_at"])[:, -1]
    diverged = {m: int(s) for m, s in enumerate(steps) if np.isfinite(s)}
    print(f"done in {seconds:.0f}s: final eval return {np.mean(final):.1f} "
          f"(per {'member' if axes else 'seed'} {[round(float(x), 1) for x in final]}); "
          f"logs and checkpoint in {run_dir}")
    if diverged:
        then = ("ranked last below" if axes else
                f"its checkpoint says so and will not resume; try {DIVERGED_HINT}")
        print(f"{'diverged' if axes else 'error: diverged'}: {diverged_list(plan, diverged)} "
              f"(non-finite network parameters or losses; its evaluations from then on are NaN; "
              f"{then})", file=sys.stderr, flush=True)
    if not axes:
        return diverged
    results_path = os.path.join(run_dir, "results.json")
    if was_finished and os.path.exists(results_path):
        with open(results_path) as f:
            rows = json.load(f)
    else:
        rows = sweep.results(axes, final, config.num_seeds, np.where(np.isfinite(steps), steps, -1))
        if jax.process_index() == 0:
            with open(results_path, "w") as f:
                json.dump(rows, f, indent=2)
    print(sweep.table(axes, rows, config.num_seeds))
    return diverged


# --------------------------------------------------------------------------- stalls

STALL_VAR = "RL_STALL_TIMEOUT"


def stall_timeout() -> float:
    """Seconds without any host call (physics step, log, checkpoint) after
    which a started run counts as stuck ($RL_STALL_TIMEOUT, default 1200)."""
    try:
        return float(os.environ.get(STALL_VAR, "1200"))
    except ValueError:
        raise UserError(f"${STALL_VAR} must be a number of seconds, "
                        f"got {os.environ[STALL_VAR]!r}") from None


class Watchdog:
    """While the compiled run executes, checks that it keeps calling the host
    (common/hostcall heartbeats: every native physics step, every chunk's log)
    and calls on_stall(idle_seconds) once when it has not for `timeout`
    seconds. It arms at the first host call, so compilation never counts."""

    def __init__(self, timeout: float, on_stall: Callable[[float], None], poll: float = 5.0):
        from common import hostcall
        self.timeout, self.on_stall, self.poll, self.hostcall = timeout, on_stall, poll, hostcall
        self.stop = threading.Event()

    def _watch(self) -> None:
        start = time.monotonic()
        while not self.stop.wait(min(self.poll, self.timeout)):
            last = self.hostcall.last_call()
            if last > start and time.monotonic() - last > self.timeout:
                self.on_stall(time.monotonic() - last)
                return

    def __enter__(self):
        if self.timeout > 0:
            threading.Thread(target=self._watch, daemon=True, name="watchdog").start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()


PROFILE_VAR = "RL_PROFILE"


class Profile:
    """$RL_PROFILE=AT,SECONDS,DIR: a jax.profiler trace of SECONDS, started AT
    seconds after the run's first host call (so after its compile), written
    under DIR (`python scripts/benchmark.py accelerator profile` sets it and
    summarises the trace). Off when unset. The trace's collection takes host
    time: the run is slower while it lasts and for a while after."""

    def __init__(self, setting: str):
        try:
            at, seconds, self.dir = setting.split(",", 2)
            self.at, self.seconds = float(at), float(seconds)
        except ValueError:
            self.at = self.seconds = -1.0
        if min(self.at, self.seconds) < 0 or self.seconds == 0:
            raise UserError(f"${PROFILE_VAR} must be AT,SECONDS,DIR (seconds after the run's "
                            f"first host call, seconds of trace, its folder), got {setting!r}")
        self.stop = threading.Event()

    @classmethod
    def from_env(cls):
        setting = os.environ.get(PROFILE_VAR, "")
        return cls(setting) if setting else contextlib.nullcontext()

    def _take(self) -> None:
        from common import hostcall
        start = time.monotonic()
        while hostcall.last_call() < start:
            if self.stop.wait(0.05):
                return
        if self.stop.wait(self.at):
            return
        jax.profiler.start_trace(self.dir)
        self.stop.wait(self.seconds)
        jax.profiler.stop_trace()
        print(f"\nprofile: a {self.seconds:g} s trace is in {self.dir}", file=sys.stderr,
              flush=True)

    def __enter__(self):
        threading.Thread(target=self._take, daemon=True, name="profile").start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()


class Locks:
    """Several locks taken as one, in order."""

    def __init__(self, *locks: threading.Lock):
        self.locks = locks

    def __enter__(self):
        for lock in self.locks:
            lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        for lock in reversed(self.locks):
            lock.release()


class Interrupt:
    """Ctrl-C (SIGINT) or SIGTERM while the compiled run executes. The main
    thread waits inside XLA and would act on a signal only when the whole run
    returns: on a CPU a run went on for minutes after Ctrl-C, and on a TPU an
    overlapped run (--overlap-physics) kept running after it with its last
    chunk broken. Python's C-level handler writes the signal's number to a
    wakeup socket from whichever thread the kernel picks; a thread reading it
    waits for a log write or checkpoint save under way (`busy`: the logger's
    and the checkpoint writer's locks, so neither is cut in half), calls close() (the
    logs) and on_signal(signum), which ends the process. Off the main thread
    (where signals cannot be set) it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, busy: Any, close: Callable[[], None],
                 on_signal: Callable[[int], None]):
        self.busy, self.close, self.on_signal = busy, close, on_signal
        self.sockets = None

    def _watch(self) -> None:
        while True:
            (signum,) = self.sockets[0].recv(1) or b"\0"
            if signum == 0:  # __exit__
                return
            if signum in self.SIGNALS:
                with self.busy:
                    self.close()
                    self.on_signal(signum)
                return

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        self.sockets = socket.socketpair()
        self.sockets[1].setblocking(False)
        self.old_fd = signal.set_wakeup_fd(self.sockets[1].fileno(), warn_on_full_buffer=False)
        # a Python handler (one that does nothing) is what makes the C handler write
        self.old = {s: signal.signal(s, lambda *_: None) for s in self.SIGNALS}
        self.thread = threading.Thread(target=self._watch, daemon=True, name="interrupt")
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.sockets is None:
            return
        for s, handler in self.old.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(self.old_fd)
        self.sockets[1].send(b"\0")
        self.thread.join()
        for sock in self.sockets:
            sock.close()


def _interrupted(signum: int, ckpt_path: str) -> None:
    saved = (f"its last checkpoint is {ckpt_path} (--resume {os.path.dirname(ckpt_path)} "
             "continues from it)") if os.path.exists(ckpt_path) else "no checkpoint was written"
    print(f"\n{signal.Signals(signum).name}: the run is stopped, its logs closed; {saved}",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)


def _stalled(idle: float, ckpt_path: str) -> None:
    saved = f"its last checkpoint is {ckpt_path}" if os.path.exists(ckpt_path) else \
        "no checkpoint was written"
    print(f"\nerror: the run made no progress for {idle:.0f} s (no physics step, log or "
          f"checkpoint) and is stopped instead of hanging; {saved} (${STALL_VAR} sets the limit)",
          file=sys.stderr, flush=True)
    os._exit(3)
