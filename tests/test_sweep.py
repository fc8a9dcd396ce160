"""Sweeps and devices: a 2 x 2 sweep of TD3 with 2 seeds is one program of 8
members; each agrees with its own separate run (same key, same values);
the sweep through scripts/sweep.py, sharded over 4 forced CPU devices,
agrees with the unsharded program and logs one stream per member and a
results table; structural axes, indivisible member counts and runs too big
to fit are refused with one line. Programs compiled: the 8-member init and
run, the 1-member run (for all 8 separate runs) and, in a subprocess with 4
devices, the sharded sweep."""
import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from algos import td3
from common import agent, checkpoint, cli, parallel, sweep
from common.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import sweep as sweep_cli  # noqa: E402  (scripts/sweep.py)

# one chunk of 1000 steps (250 iterations of 4 envs, one update each after 200 steps), eval at
# the end
ARGS = ["--env", "cartpole_balance", "--backend", "native", "--num-envs", "4", "--num-seeds", "2",
        "--total-timesteps", "1000", "--learning-starts", "200", "--batch-size", "32",
        "--updates-per-step", "0.25", "--buffer-size", "1000", "--hidden-sizes", "16", "16",
        "--eval-every", "0", "--eval-episodes", "1", "--checkpoint-every", "0"]
SPECS = ["learning_rate=1e-4,1e-3", "tau=0.005,0.05"]
CONFIG = td3.Config(env="cartpole_balance", backend="native", num_envs=4, num_seeds=2,
                    total_timesteps=1000, learning_starts=200, batch_size=32, updates_per_step=0.25,
                    buffer_size=1000, hidden_sizes=(16, 16), eval_every=0, eval_episodes=1,
                    checkpoint_every=0)
AXES = sweep.parse_axes(SPECS, td3.Config, td3.HParams, "td3")
# Not bitwise: XLA on CPU sums in an order that depends on the batch size
# (1 ulp), and 200 updates amplify that to ~1e-4 at most here. A wrong key
# or value is off by more than 1e-2 (checked below).
PARAM_ATOL = 1e-3
RETURN_RTOL = 1e-2
FORCE_4 = "--xla_force_host_platform_device_count=4"  # the plain flag users give


def _run_dir(log_dir):
    (run_dir,) = [p for p in log_dir.iterdir() if p.is_dir()]
    return run_dir


@pytest.fixture(scope="module")
def swept():
    """The 8 members in one vmapped program on one device, with recording hooks."""
    hps, combos = sweep.member_hparams(CONFIG, AXES, td3.AGENT.hparams, CONFIG.num_seeds)
    keys = np.tile(cli.seed_keys(CONFIG.seed, 2), (4, 1))  # as the CLI: PRNGKey(seed + m)
    logged = []

    def log(lead, step, metrics, member):
        logged.append((lead, np.asarray(member).tolist()))

    hooks = agent.Hooks(log=log, checkpoint=lambda *a: None)
    init, run = parallel.compile_members(td3.make_train(CONFIG), None, hooks)
    start = jax.tree.map(np.asarray, init(keys, hps))
    states, history = run(start, 0, np.arange(8, dtype=np.int32))
    return dict(hps=hps, combos=combos, keys=keys, start=start, logged=logged,
                states=jax.tree.map(np.asarray, states), history=jax.tree.map(np.asarray, history))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """scripts/sweep.py with the same sweep, in a process that sees 4 CPU devices."""
    log_dir = tmp_path_factory.mktemp("sharded")
    env = dict(os.environ, XLA_FLAGS=FORCE_4, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sweep.py"),
                          "--algo", "td3", *ARGS, *[a for s in SPECS for a in ("--sweep", s)],
                          "--log-dir", str(log_dir)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(stdout=out.stdout, run_dir=_run_dir(log_dir))


def test_members_are_the_product_of_axes_times_seeds(swept):
    hps, combos = swept["hps"], swept["combos"]
    assert combos[:3] == ([{"learning_rate": 1e-4, "tau": 0.005}] * 2
                          + [{"learning_rate": 1e-4, "tau": 0.05}])
    # learning_rate sets both of TD3's learning rates; combination-major, first axis slowest
    np.testing.assert_allclose(hps.actor_lr, [1e-4] * 4 + [1e-3] * 4)
    np.testing.assert_allclose(hps.critic_lr, hps.actor_lr)
    np.testing.assert_allclose(hps.tau, [0.005, 0.005, 0.05, 0.05] * 2)
    np.testing.assert_allclose(hps.gamma, [CONFIG.gamma] * 8)
    # the swept values reach the state, optimiser included (it takes them at init)
    s = swept["states"]
    np.testing.assert_allclose(s.hp.actor_lr, hps.actor_lr)
    np.testing.assert_allclose(s.actor_opt.hyperparams["learning_rate"], hps.actor_lr)
    np.testing.assert_allclose(s.critic_opt.hyperparams["learning_rate"], hps.critic_lr)
    np.testing.assert_array_equal(s.replay.size, [250] * 8)        # 1000 rows / 4 envs, full
    # same seed keys in every combination: equal start, different results
    start = swept["start"].actor_params["params"]["Dense_0"]["kernel"]
    np.testing.assert_array_equal(start[0], start[2])
    assert not np.allclose(start[0], start[1], atol=1e-2)
    moved = lambda m, n: max(np.abs(a[m] - a[n]).max() for a in jax.tree.leaves(s.critic_target))
    assert moved(0, 2) > 1e-2 and moved(0, 4) > 1e-2 and moved(0, 1) > 1e-2   # tau, lr, seed
    # one log call per chunk for all members, with their global indices
    assert swept["logged"] == [((8,), list(range(8)))]


def test_each_member_agrees_with_its_own_separate_run(swept):
    """8 separate runs (one member each: same key, same values) by one
    compiled single-member program."""
    hps, s = swept["hps"], swept["states"]
    final = swept["history"]["eval/episode_return"][:, -1]
    logged = []
    hooks = agent.Hooks(log=lambda lead, step, metrics, member: logged.append(
        (lead, np.shape(metrics["eval/episode_return"]), np.asarray(member).tolist())),
        checkpoint=lambda *a: None)
    _, run = parallel.compile_members(td3.make_train(CONFIG), None, hooks)
    for m in range(8):
        one = jax.tree.map(lambda x: x[m:m + 1], swept["start"])
        np.testing.assert_array_equal(one.hp.tau, hps.tau[m:m + 1])
        s1, h1 = run(one, 0, np.array([m], np.int32))
        # run without the vmap (over_members), its host calls still get the member axis
        assert logged[-1] == ((1,), (1,), [m])
        s1 = jax.tree.map(np.asarray, s1)
        # warm-up: exact
        np.testing.assert_array_equal(s.replay.obs[m, :50], s1.replay.obs[0, :50])
        for part in ("actor_params", "critic_params", "actor_target", "critic_target"):
            for a, b in zip(jax.tree.leaves(getattr(s, part)), jax.tree.leaves(getattr(s1, part))):
                np.testing.assert_allclose(a[m], b[0], atol=PARAM_ATOL,
                                           err_msg=f"member {m} {part}")
        np.testing.assert_allclose(final[m], np.asarray(h1["eval/episode_return"])[0, -1],
                                   rtol=RETURN_RTOL)


def test_a_single_member_is_traced_without_the_vmap(swept):
    """One member (one seed, the usual run) runs the agent's own unbatched
    program: XLA compiles a batch of one slower (docs/throughput.md); two
    members are vmapped. Traced only (eval_shape), not compiled."""
    train = td3.make_train(CONFIG)
    batched = []

    def spy(state, *args):
        batched.append(type(state.key).__name__ == "BatchTracer")  # vmap's tracer
        return train.run(state, *args)

    init, run = parallel.compile_members(dataclasses.replace(train, run=spy), None)
    for n in (1, 2):
        states = jax.eval_shape(init, swept["keys"][:n], jax.tree.map(lambda x: x[:n],
                                                                      swept["hps"]))
        assert jax.tree.leaves(states)[0].shape[0] == n
        out, history = jax.eval_shape(run, states, 0, np.arange(n, dtype=np.int32))
        assert jax.tree.map(lambda x: x.shape, out) == jax.tree.map(lambda x: x.shape, states)
        assert history["eval/episode_return"].shape == (n, CONFIG.total_timesteps // 1000)
    assert batched == [False, True]


def test_sharded_sweep_agrees_with_unsharded(swept, sharded):
    assert "8 member(s) on 4 device(s)" in sharded["stdout"]
    run_dir = sharded["run_dir"]
    # the final checkpoint is gathered from the 4 devices' shards, members in order
    template = jax.eval_shape(jax.vmap(td3.make_train(CONFIG).init), swept["keys"], swept["hps"])
    state, header = checkpoint.load(str(run_dir), template, {"algo": "td3", "num_seeds": 2})
    assert header["members"] == list(range(8))
    assert header["sweep"] == [[a.name, list(a.values)] for a in AXES]
    s = swept["states"]
    np.testing.assert_array_equal(s.hp.tau, state.hp.tau)
    np.testing.assert_array_equal(s.replay.obs[:, :50], state.replay.obs[:, :50])
    for part in ("actor_params", "critic_params", "actor_target", "critic_target"):
        for a, b in zip(jax.tree.leaves(getattr(s, part)), jax.tree.leaves(getattr(state, part))):
            np.testing.assert_allclose(a, b, atol=PARAM_ATOL, err_msg=part)
    final = swept["history"]["eval/episode_return"][:, -1]
    rows = json.loads((run_dir / "results.json").read_text())
    for row in rows:
        c = swept["combos"].index(row["values"])
        np.testing.assert_allclose(row["per_seed"], final[c:c + 2], rtol=RETURN_RTOL)


def test_sweep_logs_one_stream_per_member_and_ends_with_the_table(sharded):
    run_dir = sharded["run_dir"]
    members = json.loads((run_dir / "members.json").read_text())
    assert [m["stream"] for m in members][:3] == [
        "learning_rate=0.0001,tau=0.005/seed_1", "learning_rate=0.0001,tau=0.005/seed_2",
        "learning_rate=0.0001,tau=0.05/seed_1"]
    assert members[7] == {"stream": "learning_rate=0.001,tau=0.05/seed_2", "learning_rate": 1e-3,
                          "tau": 0.05, "seed": 2, "member": 7}
    for m in members:
        events = list((run_dir / m["stream"]).iterdir())
        assert events and events[0].stat().st_size > 0
    rows = json.loads((run_dir / "results.json").read_text())
    means = [r["mean"] for r in rows]
    assert len(rows) == 4 and means == sorted(means, reverse=True)
    for r in rows:
        np.testing.assert_allclose(r["mean"], np.mean(r["per_seed"]), rtol=1e-6)
        np.testing.assert_allclose(r["std"], np.std(r["per_seed"]), rtol=1e-6, atol=1e-9)
    table = sharded["stdout"].strip().splitlines()[-5:]              # printed last, best first
    assert table[0].split()[:3] == ["rank", "learning_rate", "tau"]
    assert [float(line.split()[3]) for line in table[1:]] == pytest.approx(means, abs=0.051)


# --------------------------------------------------------------------- refusals

@pytest.mark.parametrize("axis,why", [("hidden_sizes=16,32", "changes array shapes"),
                                      ("batch_size=32,64", "changes array shapes"),
                                      ("num_envs=2,4", "run one sweep per value"),
                                      ("entropy=0.1", "can sweep: gamma, tau"),
                                      ("tau", "expected name=value1"),
                                      ("tau=0.1,x", "numbers"),
                                      ("tau=0.1,0.1", "distinct")])
def test_bad_axes_are_refused_with_one_line(axis, why, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sweep_cli.main(["--algo", "td3", *ARGS, "--sweep", axis,
                        "--log-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and why in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("algo,specs,why", [
    ("d4pg", ["v_min=0,200"], "--v-min 200.0 must be below"),
    ("td3", ["actor_lr=1e-3,1e9", "gamma=0.99,1.5"], "--gamma must be in (0, 1], got 1.5"),
    ("sac", ["learning_rate=3e-4,-1"], "--actor-lr must be positive, got -1.0"),
    ("td3", ["exploration_noise=0.1,-0.2"], "--exploration-noise must be >= 0, got -0.2")])
def test_swept_values_are_validated_like_the_config(algo, specs, why, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sweep_cli.main(["--algo", algo, *ARGS, *[a for s in specs for a in ("--sweep", s)],
                        "--log-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and why in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_a_diverging_member_is_ranked_last_and_marked(tmp_path, capsys):
    """learning_rate=1e9 blows the critic's Adam state up within the only
    chunk (1000 env steps): that member is diverged at step 1000, its
    evaluation is NaN, the sweep still exits 0 and ranks it last."""
    args = list(ARGS)
    args[args.index("--num-seeds") + 1] = "1"
    sweep_cli.main(["--algo", "td3", *args, "--sweep", "learning_rate=1e9,1e-3",
                    "--log-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert "diverged: learning_rate=1e+09/seed_1 at env step 1000 (" in err, err
    run_dir = _run_dir(tmp_path)
    rows = json.loads((run_dir / "results.json").read_text())
    assert [r["values"]["learning_rate"] for r in rows] == [1e-3, 1e9]
    assert [r["diverged_at"] for r in rows] == [[-1], [1000]]
    assert np.isfinite(rows[0]["mean"]) and not np.isfinite(rows[1]["mean"])
    last = out.strip().splitlines()[-1].split()
    assert last[:5] == ["2", "1e+09", "diverged", "at", "1000"], out
    assert checkpoint.read_header(str(run_dir))["diverged_at"] == [1000, -1]


def test_members_not_divisible_by_devices_are_refused(monkeypatch):
    monkeypatch.setattr(jax, "devices", lambda *a: ["d0", "d1", "d2", "d3"])
    share = "6 members, which 4 devices cannot share evenly; use a multiple of 4"
    with pytest.raises(UserError, match=share):
        parallel.make_mesh(6, "--num-seeds x the sweep combinations")
    assert parallel.make_mesh(1) is None          # one member: one device, nothing to share


def test_cli_refuses_seeds_not_divisible_by_forced_devices(tmp_path):
    env = dict(os.environ, XLA_FLAGS=FORCE_4, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "algos", "td3.py"), *ARGS[:6],
                          "--num-seeds", "3", "--log-dir", str(tmp_path / "runs")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2
    assert "--num-seeds gives 3 members, which 4 devices cannot share" in err[-1]
    assert "Traceback" not in out.stderr and not (tmp_path / "runs").exists()


def test_memory_estimate_and_refusal(monkeypatch):
    train = td3.make_train(CONFIG)
    est = parallel.estimate_memory(train, 8)
    rows = CONFIG.buffer_size // CONFIG.num_envs
    from common import replay
    obs, act = train.env.observation_size, train.env.action_size
    want = replay.nbytes(rows, CONFIG.num_envs, obs, act,
                         replay.final_slots(rows, train.env.episode_length))
    assert want <= est["replay"] <= want + 64                # + counters
    assert est["env states"] > 0 and est["params and optimiser"] > 0
    assert est["total"] == 8 * est["per_member"]
    monkeypatch.setattr(parallel, "device_limit", lambda device=None: (est["total"], "the host"))
    refusal = r"needs about .* GiB on the host \(8 member\(s\).* but only .* GiB"
    with pytest.raises(UserError, match=refusal):
        parallel.check_fits(train, 8, None)
    parallel.check_fits(train, 4, None)                      # half of it fits
