"""TD3 end to end: smoke on both backends, seeds, target maths, resume,
CLI and bad input. Tiny networks and budgets; compiled programs are shared."""
import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import td3
from common import agent, checkpoint
from tests import agent_checks as checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = td3.Config(env="cartpole_balance", backend="native", num_envs=2, num_seeds=2,
                  total_timesteps=2000, learning_starts=500, batch_size=32, buffer_size=1000,
                  hidden_sizes=(16, 16), eval_every=1000, eval_episodes=2, checkpoint_every=1000,
                  n_step=3)


@pytest.fixture(scope="module")
def tiny_run():
    """Two seeds, two chunks; every chunk's checkpointed state kept in memory."""
    saved, logged = {}, []
    hooks = agent.Hooks(log=lambda lead, step, m: logged.append((lead, int(np.ravel(step)[0]))),
                        checkpoint=lambda lead, c, s: saved.__setitem__(int(np.ravel(c)[0]),
                                                                         jax.tree.map(np.array, s)))
    train = td3.make_train(TINY, hooks)
    keys = jax.random.split(jax.random.PRNGKey(0), TINY.num_seeds)
    run = jax.jit(jax.vmap(train.run, in_axes=(0, None)))
    states = jax.jit(jax.vmap(train.init))(keys)
    final, history = run(states, 0)
    return dict(train=train, run=run, keys=keys, final=jax.tree.map(np.asarray, final),
                history=jax.tree.map(np.asarray, history), saved=saved, logged=logged)


def test_smoke_native_two_seeds(tiny_run):
    final, history = tiny_run["final"], tiny_run["history"]
    assert final.replay.size.tolist() == [500, 500]        # 1000 rows per seed capped at capacity
    assert np.isfinite(history["eval/episode_return"]).all()
    assert np.isfinite(history["losses/qf_loss"][-1]).all()
    # one log call per chunk for both seeds together, with the vmapped lead shape
    assert tiny_run["logged"] == [((2,), 1000), ((2,), 2000)]


def test_seeds_get_their_own_streams(tiny_run):
    final = tiny_run["final"]
    a = final.actor_params["params"]["Dense_0"]["kernel"]
    assert not np.array_equal(a[0], a[1])
    assert not np.array_equal(final.env_state.obs[0], final.env_state.obs[1])
    assert not np.array_equal(final.key[0], final.key[1])


def test_resume_is_bitwise_identical(tiny_run, tmp_path):
    """Checkpoint after chunk 0, write and read it, continue: same state and metrics."""
    path = str(tmp_path / "checkpoint.npz")
    checkpoint.save(path, tiny_run["saved"][0], {"algo": "td3", "env": TINY.env, "num_seeds": 2, "chunk": 0})
    template = jax.eval_shape(jax.vmap(tiny_run["train"].init), tiny_run["keys"])
    restored, header = checkpoint.load(path, template, {"algo": "td3", "env": TINY.env})
    resumed, history = tiny_run["run"](restored, header["chunk"] + 1)
    for a, b in zip(jax.tree.leaves(tiny_run["final"]), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(a, np.asarray(b))
    np.testing.assert_array_equal(tiny_run["history"]["eval/episode_return"][:, 1],
                                  np.asarray(history["eval/episode_return"])[:, 1])
    # the final in-program checkpoint equals the final state too
    for a, b in zip(jax.tree.leaves(tiny_run["final"]), jax.tree.leaves(tiny_run["saved"][1])):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_of_other_agent_or_shape_is_refused(tiny_run, tmp_path):
    from common.errors import UserError
    path = str(tmp_path / "c.npz")
    state = tiny_run["saved"][0]
    template = jax.eval_shape(jax.vmap(tiny_run["train"].init), tiny_run["keys"])
    checkpoint.save(path, state, {"algo": "ddpg", "env": TINY.env})
    with pytest.raises(UserError, match="algo"):
        checkpoint.load(path, template, {"algo": "td3", "env": TINY.env})
    bigger = td3.make_train(dataclasses.replace(TINY, hidden_sizes=(32, 16)))
    template2 = jax.eval_shape(jax.vmap(bigger.init), tiny_run["keys"])
    checkpoint.save(path, state, {"algo": "td3", "env": TINY.env})
    with pytest.raises(UserError, match="this configuration needs"):
        checkpoint.load(path, template2, {"algo": "td3", "env": TINY.env})


# --------------------------------------------------------------------- target maths

def test_td_target_takes_min_of_twins_and_respects_discount():
    q = jnp.array([[1.0, 5.0, 3.0], [2.0, 4.0, -1.0]])
    y = td3.td_target(jnp.array([1.0, 1.0, 1.0]), jnp.array([0.5, 0.0, 0.9]), q)
    np.testing.assert_allclose(y, [1.5, 1.0, 1.0 - 0.9], rtol=1e-6)


def test_target_smoothing_noise_is_clipped_and_actions_bounded():
    hp = td3.hparams(dataclasses.replace(TINY, policy_noise=1e6, noise_clip=0.5))
    low, high = -jnp.ones(3), jnp.ones(3)
    base = jnp.zeros((1000, 3))
    a = td3.smoothed_target_action(base, jax.random.PRNGKey(0), hp, low, high)
    assert np.allclose(np.abs(a), 0.5)                        # huge noise clipped to +-noise_clip
    a = td3.smoothed_target_action(base + 0.9, jax.random.PRNGKey(0), hp, low, high)
    assert a.max() <= 1.0 and np.isclose(a.max(), 1.0)       # then clipped to the bounds
    hp = td3.hparams(dataclasses.replace(TINY, policy_noise=0.2, noise_clip=0.5))
    a = td3.smoothed_target_action(base, jax.random.PRNGKey(1), hp, low, high)
    assert 0.15 < float(jnp.std(a)) < 0.25


# --------------------------------------------------------------------- mjx backend

def test_smoke_mjx_two_seeds():
    cfg = dataclasses.replace(TINY, backend="mjx", num_envs=1, total_timesteps=400, learning_starts=100,
                              eval_episodes=1, eval_every=0)
    train = td3.make_train(dataclasses.replace(cfg))
    assert train.env.backend == "mjx"
    run = jax.jit(jax.vmap(train), compiler_options=checks.MJX_COMPILE)
    states, history = run(jax.random.split(jax.random.PRNGKey(3), 2))
    assert np.isfinite(np.asarray(history["losses/qf_loss"])[:, -1]).all()
    assert np.asarray(states.replay.size).tolist() == [400, 400]


# --------------------------------------------------------------------- CLI

def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, os.path.join(ROOT, "algos", "td3.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_cli_help():
    out = _cli("--help")
    assert out.returncode == 0
    for field in ("--env", "--num-seeds", "--policy-delay", "--resume", "target networks"):
        assert field in out.stdout


BAD = [
    (["--env", "cheetah_walk"], "unknown task"),
    (["--backend", "cuda"], "unknown backend"),
    (["--num-envs", "0"], "num-envs must be positive"),
    (["--total-timesteps", "-5"], "total-timesteps must be positive"),
    (["--total-timesteps", "5000", "--learning-starts", "5000"], "learning-starts"),
    (["--batch-size", "512", "--buffer-size", "256"], "larger than --buffer-size"),
    (["--buffer-size", str(10 ** 12), "--batch-size", "4"], "GiB"),
    (["--updates-per-step", "0.3"], "whole number"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_one_line_exit_2_no_run_dir(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        td3.main(["--log-dir", str(tmp_path / "runs"), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_cli_run_then_resume_and_refuse_corrupt(tmp_path):
    args = ["--env", "cartpole_balance", "--total-timesteps", "1000", "--learning-starts", "500",
            "--batch-size", "16", "--buffer-size", "1000", "--hidden-sizes", "8", "8",
            "--eval-episodes", "1", "--log-dir", str(tmp_path)]
    out = _cli(*args)
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (run_dir / "checkpoint.npz").exists()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"] == "cartpole_balance" and config["batch_size"] == 16
    events = list((run_dir / "seed_1").iterdir())
    assert events and events[0].stat().st_size > 0
    good = (run_dir / "checkpoint.npz").read_bytes()
    out = _cli(*args, "--resume", str(run_dir))          # already finished: nothing to run
    assert out.returncode == 0 and "resuming" in out.stdout
    out = _cli(*args, "--env", "cartpole_swingup", "--resume", str(run_dir))
    assert out.returncode == 2 and "env" in out.stderr and "Traceback" not in out.stderr
    bad = tmp_path / "corrupt.npz"
    bad.write_bytes(good[:1000])
    out = _cli(*args, "--resume", str(bad))
    assert out.returncode == 2 and "unreadable checkpoint" in out.stderr and "Traceback" not in out.stderr
    assert (run_dir / "checkpoint.npz").read_bytes() == good


# --------------------------------------------------------------------- learning

def test_learns_cartpole_balance():
    """Zero action scores 714 here and random actions 325-413; >= 950 needs a
    policy that balances. One seed, deterministic on CPU."""
    cfg = td3.Config(env="cartpole_balance", backend="native", num_envs=1, num_seeds=1,
                     total_timesteps=40_000, learning_starts=1000, hidden_sizes=(64, 64), n_step=3,
                     critic_layer_norm=True, actor_lr=1e-3, critic_lr=1e-3, updates_per_step=2,
                     eval_every=5000, eval_episodes=5, checkpoint_every=0)
    train = td3.make_train(cfg)
    _, history = jax.jit(jax.vmap(train))(jax.random.split(jax.random.PRNGKey(1), 1))
    evals = np.asarray(history["eval/episode_return"])[0]
    assert evals[-1] >= 950, evals
