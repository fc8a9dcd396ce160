"""Checks shared by the agent tests (test_<agent>.py): one compiled tiny run
per test module, bitwise resume, checkpoint refusal, bad input (every agent);
the smoke checks, the MJX smoke and learning runs of the off-policy agents;
the categorical projection (D4PG, TD4). Each takes the agent's module, so
the test files hold only what is particular to their agent."""
import dataclasses
import functools
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import agent, checkpoint, cli

# --------------------------------------------------------------------- compiled runs

# XLA CPU options for the MJX smoke runs: about 3x less compile time for MJX's
# large programs (the slowest part of the suite), the same HLO, slower code
# (irrelevant for a few hundred steps).
MJX_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def tiny_run(mod, config, seed: int = 0) -> dict:
    """Run `config` (2 chunks) vmapped over its seeds with in-memory hooks
    (given at run time, closed over before jit): every chunk's checkpointed
    state is kept, every log call recorded."""
    saved, logged = {}, []

    def log(lead, step, metrics):
        logged.append((lead, int(np.ravel(step)[0])))

    def save(lead, chunk, state, diverged_at):
        saved[int(np.ravel(chunk)[0])] = jax.tree.map(np.array, state)

    train = mod.make_train(config)
    keys = jax.random.split(jax.random.PRNGKey(seed), config.num_seeds)
    run = jax.jit(jax.vmap(functools.partial(train.run, hooks=agent.Hooks(log, save)),
                           in_axes=(0, None)))
    states = jax.jit(jax.vmap(train.init))(keys)
    final, history = run(states, 0)
    return dict(config=config, train=train, run=run, keys=keys,
                final=jax.tree.map(np.asarray, final), history=jax.tree.map(np.asarray, history),
                saved=saved, logged=logged)


def check_smoke(tiny) -> None:
    config, final, history = tiny["config"], tiny["final"], tiny["history"]
    rows = config.buffer_size // config.num_envs
    full = min(rows, config.total_timesteps // config.num_envs)
    assert final.replay.size.tolist() == [full] * config.num_seeds
    assert np.isfinite(history["eval/episode_return"]).all()
    for name in ("losses/qf_loss", "losses/actor_loss", "losses/qf1_values"):
        assert np.isfinite(history[name][:, -1]).all(), name
    # one log call per chunk for all seeds together, with the vmapped lead shape
    steps = tiny["train"].schedule.steps_per_chunk
    assert tiny["logged"] == [((config.num_seeds,), steps * (c + 1))
                              for c in range(tiny["train"].schedule.num_chunks)]


def check_seeds_differ(tiny) -> None:
    final = tiny["final"]
    a = final.actor_params["params"]["Dense_0"]["kernel"]
    assert not np.array_equal(a[0], a[1])
    assert not np.array_equal(final.env_state.obs[0], final.env_state.obs[1])
    assert not np.array_equal(final.key[0], final.key[1])


def check_resume_bitwise(tiny, algo: str, tmp_path) -> None:
    """Checkpoint after chunk 0, write and read it, continue: same state and
    metrics (every one logged for chunk 1)."""
    env = tiny["config"].env
    path = str(tmp_path / "checkpoint.npz")
    checkpoint.save(path, tiny["saved"][0], {"algo": algo, "env": env, "num_seeds": 2, "chunk": 0})
    template = jax.eval_shape(jax.vmap(tiny["train"].init), tiny["keys"])
    restored, header = checkpoint.load(path, template, {"algo": algo, "env": env})
    resumed, history = tiny["run"](restored, header["chunk"] + 1)
    for a, b in zip(jax.tree.leaves(tiny["final"]), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(a, np.asarray(b))
    for name, values in tiny["history"].items():
        if name != "host_calls":
            np.testing.assert_array_equal(values[:, 1], np.asarray(history[name])[:, 1],
                                          err_msg=name)
    # the final in-program checkpoint equals the final state too
    last = max(tiny["saved"])
    for a, b in zip(jax.tree.leaves(tiny["final"]), jax.tree.leaves(tiny["saved"][last])):
        np.testing.assert_array_equal(a, b)


def check_checkpoint_refused(tiny, mod, algo: str, tmp_path, capsys,
                             bigger=(("hidden_sizes", (32, 16)),)) -> None:
    """Another agent's checkpoint is refused by load and by the CLI (one line,
    exit 2, before anything compiles); so is one of other network shapes
    (`bigger`: the config changes that make them)."""
    from common.errors import UserError
    config = tiny["config"]
    path = str(tmp_path / "c.npz")
    state = tiny["saved"][0]
    template = jax.eval_shape(jax.vmap(tiny["train"].init), tiny["keys"])
    checkpoint.save(path, state, {"algo": "sac", "env": config.env, "num_seeds": 2, "chunk": 0})
    with pytest.raises(UserError, match="algo"):
        checkpoint.load(path, template, {"algo": algo, "env": config.env})
    with pytest.raises(SystemExit) as e:
        mod.main(["--env", config.env, "--resume", path, "--log-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "algo='sac'" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()
    other = mod.make_train(dataclasses.replace(config, **dict(bigger)))
    template2 = jax.eval_shape(jax.vmap(other.init), tiny["keys"])
    checkpoint.save(path, state, {"algo": algo, "env": config.env})
    with pytest.raises(UserError, match="this configuration needs"):
        checkpoint.load(path, template2, {"algo": algo, "env": config.env})


def check_mjx_smoke(mod, config) -> None:
    """A few hundred steps on MJX, one env per seed, two seeds. CI runs it for
    TD3 only (each costs about 30 s of the suite's 15 minutes), the other
    off-policy agents' under -m slow: they reach the physics only through the
    env API and agent.step_and_learn, the same path as TD3's."""
    cfg = dataclasses.replace(config, backend="mjx", num_envs=1, total_timesteps=400,
                              learning_starts=100, eval_episodes=1, eval_every=0,
                              checkpoint_every=0)
    train = mod.make_train(cfg)
    assert train.env.backend == "mjx"
    run = jax.jit(jax.vmap(train), compiler_options=MJX_COMPILE)
    states, history = run(jax.random.split(jax.random.PRNGKey(3), 2))
    assert np.isfinite(np.asarray(history["losses/qf_loss"])[:, -1]).all()
    assert np.isfinite(np.asarray(history["eval/episode_return"])[:, -1]).all()
    assert np.asarray(states.replay.size).tolist() == [400, 400]


def learning_run(mod, config, with_history: bool = False):
    """Evaluation returns [seed, evaluation] of a whole run, in order; prints
    the budget, the last ones and the time taken (with compilation). With
    `with_history`, also the run's whole metric history (numpy, [seed, log])."""
    t0 = time.time()
    train = mod.make_train(config)
    keys = jnp.asarray(cli.seed_keys(config.seed, config.num_seeds))
    _, history = jax.jit(jax.vmap(train))(keys)
    returns = np.asarray(history["eval/episode_return"])
    returns = returns[:, np.isfinite(returns).all(0)]
    print(f"{mod.__name__} on {config.env}: {config.total_timesteps} steps, last evaluations "
          f"{returns[:, -5:].round(1).tolist()}, {time.time() - t0:.0f}s with compilation")
    if with_history:
        return returns, {k: np.asarray(v) for k, v in history.items()}
    return returns


# --------------------------------------------------------------------- CLI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(algo: str, *args, timeout=300) -> subprocess.CompletedProcess:
    """`python algos/<algo>.py ARGS`, as a user runs it."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "algos", f"{algo}.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def check_script_help(algo: str, *words: str) -> None:
    out = run_script(algo, "--help")
    assert out.returncode == 0
    for word in ("--env", "--num-seeds", "--resume", *words):
        assert word in out.stdout, word


def check_script_run_resume_and_corrupt(algo: str, args, tmp_path, field: str, value) -> None:
    """A whole run of the script writes its run directory (config, logs, a
    checkpoint); resuming the finished run runs nothing; a checkpoint of
    another task or a corrupt one is refused (exit 2, no traceback) and the
    good one is left as it was. `field`: a config field `args` set to `value`."""
    args = [*args, "--log-dir", str(tmp_path)]
    out = run_script(algo, *args)
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (run_dir / "checkpoint.npz").exists()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"] == "cartpole_balance" and config[field] == value
    events = list((run_dir / "seed_1").iterdir())
    assert events and events[0].stat().st_size > 0
    good = (run_dir / "checkpoint.npz").read_bytes()
    out = run_script(algo, *args, "--resume", str(run_dir))   # already finished: nothing to run
    assert out.returncode == 0 and "resuming" in out.stdout, out.stderr[-2000:]
    out = run_script(algo, *args, "--env", "cartpole_swingup", "--resume", str(run_dir))
    assert out.returncode == 2 and "env" in out.stderr and "Traceback" not in out.stderr
    bad = tmp_path / "corrupt.npz"
    bad.write_bytes(good[:1000])
    out = run_script(algo, *args, "--resume", str(bad))
    assert out.returncode == 2 and "unreadable checkpoint" in out.stderr
    assert "Traceback" not in out.stderr
    assert (run_dir / "checkpoint.npz").read_bytes() == good


def check_help(mod, capsys, *fields: str) -> None:
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for field in ("--env", "--num-seeds", "--resume", "--n-step", *fields):
        assert field in out, field


# Bad input every agent refuses (COMMON_BAD) and the off-policy agents' too (BAD).
COMMON_BAD = [
    (["--env", "cheetah_walk"], "unknown task"),
    (["--backend", "cuda"], "unknown backend"),
    (["--num-envs", "0"], "num-envs must be positive"),
    (["--total-timesteps", "-5"], "total-timesteps must be positive"),
]
BAD = COMMON_BAD + [
    (["--total-timesteps", "5000", "--learning-starts", "5000"], "learning-starts"),
    (["--batch-size", "512", "--buffer-size", "256"], "larger than --buffer-size"),
    (["--buffer-size", str(10 ** 12), "--batch-size", "4"], "GiB"),
    (["--updates-per-step", "0.3"], "whole number"),
    (["--n-step", "0"], "n-step must be positive"),
]


def check_bad_input(mod, args, message, tmp_path, capsys) -> None:
    """One line naming the problem, exit status 2, no run directory."""
    with pytest.raises(SystemExit) as e:
        mod.main(["--log-dir", str(tmp_path / "runs"), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------- categorical critic

def reference_projection(reward, discount, probs, v_min, v_max):
    """C51's projection written the usual way (floor/ceil and scatter), in numpy."""
    B, K = probs.shape
    support = np.linspace(v_min, v_max, K)
    delta = (v_max - v_min) / (K - 1)
    out = np.zeros((B, K))
    for n in range(B):
        for j in range(K):
            tz = np.clip(reward[n] + discount[n] * support[j], v_min, v_max)
            b = (tz - v_min) / delta
            lo, hi = int(np.floor(b)), int(np.ceil(b))
            if lo == hi:
                out[n, lo] += probs[n, j]
            else:
                out[n, lo] += probs[n, j] * (hi - b)
                out[n, hi] += probs[n, j] * (b - lo)
    return out


def check_projection(project) -> None:
    """`project(reward, discount, probs, v_min, v_max)`: the categorical
    projection of an agent module, on hand-computed cases and against the
    reference."""
    p = lambda *a: np.asarray(project(*(jnp.asarray(x, jnp.float32) for x in a)))
    # support 0, 1, 2, 3, 4: atom 1 moved to 1.5 splits half-half
    np.testing.assert_allclose(p([0.5], [1.0], [[0, 1, 0, 0, 0]], 0, 4), [[0, .5, .5, 0, 0]],
                               atol=1e-6)
    # atoms 0..4 -> 1, 1.5, 2, 2.5, 3 under r = 1, discount 0.5
    np.testing.assert_allclose(p([1.0], [0.5], [[.2, .3, .5, 0, 0]], 0, 4), [[0, .35, .65, 0, 0]],
                               atol=1e-6)
    # edges: mass beyond the support lands on the end atoms
    uniform = np.full((1, 5), 0.2)
    np.testing.assert_allclose(p([2.0], [1.0], uniform, 0, 4), [[0, 0, .2, .2, .6]], atol=1e-6)
    np.testing.assert_allclose(p([-2.0], [1.0], uniform, 0, 4), [[.6, .2, .2, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(p([10.0], [0.99], uniform, 0, 4), [[0, 0, 0, 0, 1]], atol=1e-6)
    np.testing.assert_allclose(p([-10.0], [0.99], uniform, 0, 4), [[1, 0, 0, 0, 0]], atol=1e-6)
    # terminal transition (discount 0): all mass at the return, whatever the next distribution
    for probs in (uniform, [[1, 0, 0, 0, 0]], [[0, 0, 0, 0, 1]]):
        np.testing.assert_allclose(p([2.25], [0.0], probs, 0, 4), [[0, 0, .75, .25, 0]], atol=1e-6)
        np.testing.assert_allclose(p([9.0], [0.0], probs, 0, 4), [[0, 0, 0, 0, 1]], atol=1e-6)
    # a support that does not start at 0: -2, -1, 0, 1, 2
    np.testing.assert_allclose(p([0.3], [0.0], uniform, -2, 2), [[0, 0, .7, .3, 0]], atol=1e-6)

    # the default support (101 atoms on [0, 100]), random distributions and returns
    rng = np.random.default_rng(0)
    B, K = 64, 101
    probs = rng.dirichlet(np.full(K, 0.3), B)
    reward = rng.uniform(-20, 120, B)
    discount = rng.choice([0.0, 0.99 ** 5, 0.5, 1.0], B)
    got = p(reward, discount, probs, 0, 100)
    assert got.min() >= 0
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)                   # mass conserved
    np.testing.assert_allclose(got, reference_projection(reward, discount, probs, 0, 100),
                               atol=1e-5)
    # the same under jit with traced support bounds (they are swept hyperparameters)
    args = (reward, discount, probs, 0, 100)
    traced = jax.jit(project)(*(jnp.asarray(x, jnp.float32) for x in args))
    np.testing.assert_allclose(np.asarray(traced), got, atol=1e-6)
