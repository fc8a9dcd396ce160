"""Runs that never hang, never learn from a broken step, and evaluate on
held-out states: the README's multi-device command with the plain XLA flag,
the stall watchdog, every size field and every out-of-range float refused in
one line, diverged steps masked out of every learner, non-finite actions
kept from the physics, a diverging run reported (exit 1) and its checkpoint
neither resumed nor exported, per-seed training pools and a held-out
evaluation pool, and `--seed s --num-seeds N` member m == `--seed s+m`."""
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import d4pg, ddpg, mpo, ppo, sac, td3, td4
from common import cli, envs, hostcall
from common.errors import UserError
from common.envs import native as native_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGENTS = {"ddpg": ddpg, "td3": td3, "d4pg": d4pg, "td4": td4, "sac": sac, "mpo": mpo, "ppo": ppo}


# --------------------------------------------------------------------- several devices

def _readme_command(marker: str) -> str:
    """The one command line starting with `marker` in README.md and docs/*.md."""
    import glob
    lines = []
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                                "*.md"))):
        with open(path) as f:
            lines += [ln.strip() for ln in f if ln.strip().startswith(marker)]
    (line,) = lines
    return line


def test_readme_multi_device_command_finishes(tmp_path):
    """The README's command with the plain flag (4 CPU devices on 2 cores)
    runs to the end and writes its checkpoint: it used to hang in its last
    chunk (the callbacks' device_put onto a CPU device that was itself
    blocked in a callback)."""
    line = _readme_command("XLA_FLAGS=--xla_force_host_platform_device_count=4 python algos/td3.py")
    assign, *argv = shlex.split(line)
    name, value = assign.split("=", 1)
    env = dict(os.environ, **{name: value}, JAX_PLATFORMS="cpu", RL_STALL_TIMEOUT="300")
    argv[0] = sys.executable
    out = subprocess.run(argv + ["--log-dir", str(tmp_path)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on 4 device(s)" in out.stdout
    (run_dir,) = list(tmp_path.iterdir())
    assert (run_dir / "checkpoint.npz").exists()
    streams = sorted(p.name for p in run_dir.iterdir() if p.is_dir())
    assert streams == [f"seed_{s}" for s in (1, 2, 3, 4)]


def test_watchdog_fires_on_a_run_that_stops_calling_the_host():
    stalled = []
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    step = jax.jit(lambda x: hostcall.call(lambda a: a + 1, scalar, x))
    with cli.Watchdog(0.3, stalled.append, poll=0.05):
        step(jnp.zeros(()))            # armed by a host call ...
        time.sleep(1.0)                # ... then nothing: stuck
    assert len(stalled) == 1 and stalled[0] >= 0.3
    quiet = []
    with cli.Watchdog(0.3, quiet.append, poll=0.05):
        time.sleep(0.6)                # no host call yet (compiling): not armed
    with cli.Watchdog(0.3, quiet.append, poll=0.05):
        for _ in range(10):            # calls keep coming: no stall
            step(jnp.zeros(()))
            time.sleep(0.1)
    assert quiet == []


def _checkpoint_chunk(run_dir) -> int:
    try:
        with np.load(run_dir / "checkpoint.npz") as z:
            return int(json.loads(bytes(z["header"]).decode())["chunk"])
    except (OSError, KeyError, ValueError):  # not written yet
        return -1


def _stop_after_a_checkpoint(argv, tmp_path, sig, after_chunk=-1):
    """Run `argv`, send `sig` once its checkpoint is past `after_chunk`; returns
    (returncode, stdout, stderr, run dir). A run that ignores the signal (it
    used to, for the whole run) fails the wait's 60 s."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_backend_optimization_level=0")
    out, err = open(tmp_path / f"{sig}.out", "w+"), open(tmp_path / f"{sig}.err", "w+")
    proc = subprocess.Popen(argv, cwd=ROOT, text=True, env=env, stdout=out, stderr=err)
    try:
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            dirs = [d for d in (tmp_path / "runs").glob("*") if d.is_dir()]
            if dirs and _checkpoint_chunk(dirs[0]) > after_chunk:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it was signalled"
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read())
        f.close()
    return code, *texts, dirs[0]


def test_ctrl_c_stops_a_run_at_once_and_its_checkpoint_resumes(tmp_path):
    """Ctrl-C used to be ignored until the whole compiled run returned (hours:
    the main thread waits inside XLA). Now the run stops within seconds, logs
    closed, checkpoint whole, and `--resume` continues from it; SIGTERM too."""
    import signal
    args = [sys.executable, os.path.join(ROOT, "algos", "td3.py"), "--env", "cartpole_balance",
            "--num-envs", "2", "--hidden-sizes", "8", "--total-timesteps", "100000000",
            "--learning-starts", "100", "--batch-size", "16", "--buffer-size", "4000",
            "--eval-every", "0", "--checkpoint-every", "500",
            "--log-dir", str(tmp_path / "runs")]
    code, out, err, run_dir = _stop_after_a_checkpoint(args, tmp_path, signal.SIGINT)
    assert code == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(
        f"SIGINT: the run is stopped, its logs closed; its last checkpoint is {run_dir}"), err
    assert "Traceback" not in err
    chunk = _checkpoint_chunk(run_dir)
    assert chunk >= 0 and not list(run_dir.glob(".ckpt-*"))  # whole, no half-written file
    assert list((run_dir / "seed_1").glob("events.out.tfevents.*"))

    code, out, err, _ = _stop_after_a_checkpoint(
        args[:-2] + ["--resume", str(run_dir)], tmp_path, signal.SIGTERM, after_chunk=chunk)
    assert code == 143, err[-2000:]
    assert f"resuming {run_dir} after chunk {chunk + 1}" in out
    assert _checkpoint_chunk(run_dir) > chunk


# --------------------------------------------------------------------- size fields

def _int_fields(config_cls):
    """(flag, type) of every integer and integer-tuple field but the seed."""
    hints = typing.get_type_hints(config_cls)
    out = []
    for f in dataclasses.fields(config_cls):
        t = hints[f.name]
        if f.name != "seed" and (t is int or t == typing.Tuple[int, ...]):
            out.append((f.name, t))
    return out


ZERO_ALLOWED = {"eval_every", "checkpoint_every", "learning_starts",  # 0: "only at the end" / none
                "exploration_decay_steps", "lr_decay_steps",  # 0: a constant std, rates
                "decay_start_steps",  # 0: the decays begin at once
                "policy_target_period"}  # MPO's 0: Polyak averaging


@pytest.mark.parametrize("algo", sorted(AGENTS))
def test_every_size_field_zero_or_negative_is_one_line_and_exit_2(algo, tmp_path, capsys):
    mod = AGENTS[algo]
    fields = _int_fields(mod.Config)
    assert {"num_envs", "num_seeds", "total_timesteps", "eval_episodes"} <= {n for n, _ in fields}
    for name, t in fields:
        for value in (["-1"] if name in ZERO_ALLOWED else ["0", "-1"]):
            flag = "--" + name.replace("_", "-")
            args = [flag, value] if t is int else [flag, "64", value]
            with pytest.raises(SystemExit) as e:
                mod.main(["--env", "cartpole_balance", "--log-dir", str(tmp_path / "runs"), *args])
            err = capsys.readouterr().err.strip()
            assert e.value.code == 2, (algo, args, err)
            assert len(err.splitlines()) == 1 and "Traceback" not in err and flag in err, \
                (algo, args, err)
    assert not (tmp_path / "runs").exists()


def test_sweep_script_refuses_bad_sizes_in_one_line(capsys):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import sweep as sweep_cli
    for args in (["--num-seeds", "-1"], ["--num-envs", "0"], ["--batch-size", "-3"]):
        with pytest.raises(SystemExit) as e:
            sweep_cli.main(["--algo", "td3", "--env", "cartpole_balance", "--sweep",
                            "tau=0.005,0.01", *args])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and args[0] in err, err


# --------------------------------------------------------------------- float ranges

def _float_fields(config_cls):
    return [f.name for f in dataclasses.fields(config_cls) if f.type in (float, "float")]


def _contract(name: str, algo: str):
    """(value, accepted) pairs that issue 39 fixes for a float field, read off
    its name: finite everywhere; gamma and tau in (0, 1]; learning rates,
    KL bounds, temperatures, alphas, stds of a policy and clip bounds > 0;
    noise stds >= 0; max_grad_norm >= 0 where 0 means off (PPO: > 0)."""
    pairs = [(float("nan"), False), (float("inf"), False), (float("-inf"), False)]
    if name in ("gamma", "tau"):
        pairs += [(0.0, False), (-0.1, False), (1.5, False), (1.0, True), (0.5, True)]
    elif name.endswith("_lr") or name == "learning_rate" or name.startswith(("epsilon", "init_")) \
            and name not in ("init_log_std",) or name.endswith("_clip") or name == "clip_coef":
        pairs += [(0.0, False), (-1e-3, False), (1e-3, True)]
    elif "noise" in name:
        pairs += [(-0.2, False), (0.0, True)]
    elif name == "max_grad_norm":
        pairs += [(-1.0, False), (0.0, algo != "ppo"), (1.0, True)]
    return pairs


@pytest.mark.parametrize("algo", sorted(AGENTS))
def test_every_float_field_has_a_range_and_out_of_range_values_are_refused(algo):
    mod = AGENTS[algo]
    spec, floats = mod.AGENT, _float_fields(mod.Config)
    assert spec.ranges is mod.RANGES and sorted(mod.RANGES) == sorted(floats)
    plain = mod.Config(env="cartpole_balance")
    mod.validate(plain)
    for name in floats:
        for value, accepted in _contract(name, algo):
            config = dataclasses.replace(plain, **{name: value})
            if accepted:
                mod.validate(config)
                continue
            with pytest.raises(UserError) as e:
                mod.validate(config)
            assert "--" + name.replace("_", "-") in str(e.value), (algo, name, value)
            with pytest.raises(UserError):              # the Python entry point too
                spec.config_for("cartpole_balance", **{name: value})
    if "v_min" in floats:
        with pytest.raises(UserError, match="--v-min 5.0 must be below --v-max 5.0"):
            mod.validate(dataclasses.replace(plain, v_min=5.0, v_max=5.0))
    if "exploration_decay_steps" in {f.name for f in dataclasses.fields(mod.Config)}:
        rising = dict(exploration_noise=0.1, exploration_noise_final=0.2)
        mod.validate(dataclasses.replace(plain, **rising))            # no schedule: unused
        with pytest.raises(UserError, match="--exploration-noise-final 0.2 must be at most"):
            mod.validate(dataclasses.replace(plain, exploration_decay_steps=1000, **rising))
    # a task's defaults are checked as overrides are
    bad = dataclasses.replace(spec, task_defaults={"humanoid": {floats[0]: float("nan")}})
    with pytest.raises(UserError, match="must be a finite number"):
        bad.config_for("humanoid_walk")


@pytest.mark.parametrize("algo,args", [
    ("td3", ["--gamma", "1.5"]), ("td3", ["--tau", "2"]), ("td3", ["--exploration-noise", "-0.2"]),
    ("td3", ["--gamma", "nan"]), ("td3", ["--actor-lr", "nan"]),
    ("td3", ["--exploration-noise", "nan"]), ("sac", ["--gamma", "1.5"]), ("sac", ["--tau", "2"]),
    ("sac", ["--gamma", "nan"]), ("sac", ["--actor-lr", "nan"]),
    ("d4pg", ["--env", "humanoid_walk", "--exploration-noise-final", "-0.1"]),
    ("d4pg", ["--exploration-noise", "nan"]), ("mpo", ["--epsilon", "0"]),
    ("ppo", ["--gamma", "0"]), ("ddpg", ["--ou-theta", "-1"]), ("td4", ["--policy-noise", "-1"])])
def test_the_issue_s_bad_values_are_one_line_and_exit_2(algo, args, tmp_path, capsys):
    env = [] if "--env" in args else ["--env", "cartpole_balance"]
    with pytest.raises(SystemExit) as e:
        AGENTS[algo].main([*env, "--log-dir", str(tmp_path / "runs"), *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert args[-2] in err, err
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------- diverged steps

def _diverging(env: envs.Env) -> envs.Env:
    """The same env with an actuator gear so large that any action blows the
    simulation up (qvel beyond mjMAXVAL in the first substep)."""
    model = native_mod.copy_model(env.model)
    model.actuator_gear[:, 0] *= 1e30
    env.native = native_mod.NativePhysics(model, env.n_sub_steps, env.native.fields)
    return env


def test_a_diverged_step_is_counted_marked_invalid_and_reset():
    env = _diverging(envs.make("cartpole_balance", "native", pool_size=8))
    state = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), 3))
    step = jax.jit(jax.vmap(env.step))
    calm = step(state, jnp.zeros((3, 1)))     # zero force: a normal step
    assert not np.asarray(calm.info["invalid"]).any()
    broken = step(calm, jnp.ones((3, 1)))
    assert np.asarray(broken.info["invalid"]).all() and np.asarray(broken.truncated).all()
    # a non-finite action never reaches the physics: it steps as zero force, calmly
    masked = step(calm, jnp.array([[jnp.nan], [jnp.inf], [0.0]]))
    assert not np.asarray(masked.info["invalid"]).any()
    for a, b in zip(jax.tree.leaves(masked), jax.tree.leaves(step(calm, jnp.zeros((3, 1))))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(broken.info["nonfinite"]).tolist() == [1, 1, 1]
    assert np.isfinite(np.asarray(broken.obs)).all() and (np.asarray(broken.reward) == 0).all()
    # the next episode starts from a pool state
    pool_obs = np.asarray(env.pool.obs)
    assert all((pool_obs == o).all(-1).any() for o in np.asarray(broken.obs))


TINY = dict(env="cartpole_balance", backend="native", num_seeds=1, total_timesteps=600,
            eval_every=0, eval_episodes=1, checkpoint_every=0)
OFF_POLICY = dict(num_envs=2, learning_starts=100, batch_size=16, buffer_size=600,
                  hidden_sizes=(8,))


@pytest.mark.parametrize("algo", ["td3", "sac", "mpo", "d4pg", "ppo"])
def test_learners_ignore_diverged_steps(algo, monkeypatch):
    """Every step diverges: every transition is invalid, so no loss has
    anything to learn from and the networks stay exactly as initialised
    (Adam's update of a zero gradient is zero), while the env counts every
    step as non-finite."""
    mod = AGENTS[algo]
    if algo == "ppo":
        config = mod.Config(**TINY, num_envs=4, num_steps=25, num_minibatches=2, update_epochs=1,
                            actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
    else:
        config = mod.Config(**TINY, **OFF_POLICY)
    make = envs.make
    monkeypatch.setattr(mod.envs, "make", lambda *a, **k: _diverging(make(*a, **k)))
    train = mod.make_train(config)
    key = jax.random.PRNGKey(0)
    start = jax.jit(train.init)(key)
    final, history = jax.jit(train.run, static_argnums=1)(start, 0)
    steps = train.schedule.total_steps
    assert int(np.asarray(final.env_state.info["nonfinite"]).sum()) == steps

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    assert same(start.critic_params, final.critic_params)
    if algo == "ppo":  # the state-independent log std still follows the entropy bonus
        drop = lambda p: {k: v for k, v in p["params"].items() if k != "log_std"}
        assert same(drop(start.actor_params), drop(final.actor_params))
    else:
        assert same(start.actor_params, final.actor_params)
        assert not np.asarray(final.replay.valid).any()
    assert np.isfinite(np.asarray(history["eval/episode_return"])[-1])


# --------------------------------------------------------------------- diverged runs

def test_a_diverging_run_ends_with_exit_1_naming_the_step_and_is_not_resumed_or_exported(
        tmp_path, capsys):
    """Learning rates of 1e9: the critic's Adam state overflows within the
    first chunk (1000 env steps, updates from step 200), so the run is marked
    diverged at its end, step 1000, not at the run's end (2000). Both
    evaluations are NaN (none logged), the progress line counts it, TensorBoard
    gets the step, the checkpoint says so: --resume and export refuse it."""
    args = ["--env", "cartpole_balance", "--backend", "native", "--num-envs", "2",
            "--total-timesteps", "2000", "--learning-starts", "200", "--batch-size", "16",
            "--buffer-size", "2000", "--hidden-sizes", "8", "--eval-every", "1000",
            "--eval-episodes", "1", "--checkpoint-every", "0", "--actor-lr", "1e9",
            "--critic-lr", "1e9", "--log-dir", str(tmp_path / "runs")]
    with pytest.raises(SystemExit) as e:
        td3.main(args)
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert e.value.code == 1 and len(errors) == 1, err
    assert errors[0].startswith("error: diverged: seed 1 at env step 1000 ("), errors[0]
    assert "diverged 1/1" in out and "final eval return nan" in out
    (run_dir,) = list((tmp_path / "runs").iterdir())
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import plot
    stream = str(run_dir / "seed_1")
    assert plot.read_seed(stream, "stats/diverged_at")[0].values.tolist() == [1000, 1000]
    assert len(plot.read_seed(stream, "eval/episode_return")[0].values) == 0
    assert cli.ckpt.read_header(str(run_dir))["diverged_at"] == [1000]
    with pytest.raises(SystemExit) as e:
        td3.main([*args, "--resume", str(run_dir)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "diverged (seed 1 at env step 1000)" in err and "cannot continue" in err
    import export
    with pytest.raises(SystemExit) as e:
        export.main([str(run_dir), "--out", str(tmp_path / "p.npz")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert "diverged at env step 1000" in err and not (tmp_path / "p.npz").exists()


# --------------------------------------------------------------------- initial-state pools

def test_each_seed_trains_from_its_own_pool_and_evaluation_from_held_out_states():
    env = envs.make("cartpole_swingup", "native", pool_size=32)
    keys = jnp.asarray(cli.seed_keys(1, 2))
    pools = jax.jit(jax.vmap(env.make_pool))(keys)
    a, b = np.asarray(pools.obs[0]), np.asarray(pools.obs[1])
    assert not (a[:, None] == b[None]).all(-1).any()             # no state in common
    held_out = np.asarray(env.eval_pool.obs)
    for p in (a, b):
        assert not (p[:, None] == held_out[None]).all(-1).any()
    # a pool is dm_control's own resets, from a seed drawn from the run's key
    seed = int(jax.random.randint(keys[0], (), 0, envs.EVAL_POOL_SEED))
    rows, _ = envs._initial_pool(env.name, 32, seed)
    np.testing.assert_array_equal(np.asarray(pools.physics[0]), native_mod.encode(rows))
    # the same key makes the same pool (reproducible, resumable)
    again = jax.jit(env.make_pool)(keys[0])
    np.testing.assert_array_equal(np.asarray(again.obs), a)


# --------------------------------------------------------------------- seed labels

SEEDS = ["--env", "cartpole_balance", "--backend", "native", "--num-envs", "2",
         "--total-timesteps", "400", "--learning-starts", "100", "--batch-size", "16",
         "--buffer-size", "400", "--hidden-sizes", "8", "--eval-every", "0", "--eval-episodes", "1",
         "--checkpoint-every", "0"]


def test_member_m_of_a_multi_seed_run_is_the_single_run_of_seed_plus_m(tmp_path):
    """Same key, same pool, same initial networks and env states, bit for bit;
    after training the same parameters to float32 rounding (XLA on CPU sums a
    vmapped matmul in an order that depends on the member count: 1 ulp)."""
    config = td3.Config(env="cartpole_balance", backend="native", **OFF_POLICY, total_timesteps=400,
                        eval_every=0, eval_episodes=1, checkpoint_every=0)
    train = td3.make_train(config)
    init = jax.jit(jax.vmap(train.init))
    two, one = init(jnp.asarray(cli.seed_keys(1, 2))), init(jnp.asarray(cli.seed_keys(2, 1)))
    for x, y in zip(jax.tree.leaves(two), jax.tree.leaves(one)):
        np.testing.assert_array_equal(np.asarray(x)[1], np.asarray(y)[0])
    both, _ = td3.main([*SEEDS, "--seed", "1", "--num-seeds", "2",
                        "--log-dir", str(tmp_path / "a")])
    second, _ = td3.main([*SEEDS, "--seed", "2", "--num-seeds", "1",
                          "--log-dir", str(tmp_path / "b")])
    warmup = config.learning_starts // config.num_envs  # rows written before the first update
    np.testing.assert_array_equal(np.asarray(both.replay.obs)[1, :warmup],
                                  np.asarray(second.replay.obs)[0, :warmup])
    for x, y in zip(jax.tree.leaves(both.actor_params), jax.tree.leaves(second.actor_params)):
        np.testing.assert_allclose(np.asarray(x)[1], np.asarray(y)[0], rtol=1e-5, atol=1e-7)
    (run_a,) = list((tmp_path / "a").iterdir())
    assert sorted(p.name for p in run_a.iterdir() if p.is_dir()) == ["seed_1", "seed_2"]


@pytest.mark.parametrize("setting", ["110,0.4", "x,0.4,/tmp/p", "5,0,/tmp/p"])
def test_a_bad_profile_setting_is_one_line_and_exit_2_before_any_run_directory(setting, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", RL_PROFILE=setting)
    argv = ["--env", "cartpole_balance", "--num-envs", "2", "--total-timesteps", "2000",
            "--learning-starts", "100", "--log-dir", str(tmp_path)]
    out = subprocess.run([sys.executable, "algos/td3.py", *argv], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert "RL_PROFILE must be AT,SECONDS,DIR" in line
    assert not list(tmp_path.iterdir())


def test_checkpoints_are_written_beside_the_run_and_the_last_before_it_returns(tmp_path,
                                                                              monkeypatch):
    """A thread of its own writes each checkpoint while the run goes on (the
    first write lasts until the next chunk's log has arrived: a save that
    blocked the run would wait out the timeout instead), and the final one
    is on disk when main returns; another writes the logs, every chunk's
    written by then too."""
    from common import checkpoint, logging as run_logging
    orig_save, orig_write = checkpoint.save, run_logging.RunLogger.write
    writing, logged = [], threading.Event()
    seen = dict(threads=set(), logs_while_writing=0, chunks=[])

    def slow_save(path, state, header):
        writing.append(1)
        seen["threads"].add(threading.current_thread().name.split("_")[0])
        if not seen["chunks"]:
            logged.wait(30)
        orig_save(path, state, header)
        seen["chunks"].append(header["chunk"])
        writing.pop()

    def write(self, step, metrics):
        seen.setdefault("log_threads", set()).add(threading.current_thread().name.split("_")[0])
        seen.setdefault("steps", []).append(step)
        if writing:
            seen["logs_while_writing"] += 1
            logged.set()
        orig_write(self, step, metrics)

    monkeypatch.setattr(checkpoint, "save", slow_save)
    monkeypatch.setattr(run_logging.RunLogger, "write", write)
    argv = [a if a != "400" else "4000" for a in SEEDS[:-1]] + ["1000", "--log-dir", str(tmp_path)]
    td3.main(argv)
    (run_dir,) = list(tmp_path.iterdir())
    assert seen["threads"] == {"checkpoint"} and seen["log_threads"] == {"log"}, seen
    assert seen["steps"] == sorted(seen["steps"]) and seen["steps"][-1] == 4000, seen
    assert seen["logs_while_writing"] > 0, seen
    assert checkpoint.read_header(str(run_dir))["chunk"] == seen["chunks"][-1] == 3, seen
