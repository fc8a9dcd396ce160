"""common/policy.py, scripts/export.py, scripts/evaluate.py: a trained policy
as a file. One tiny real TD3 run (2 seeds, cartpole_balance, observation
normalisation on) through the CLI; its policy loaded from the run
directory, the checkpoint, bench_standard's policy part and an exported
file acts bit for bit as the agent's own make_act on that seed's train
state; an exported file reproduces its recorded check episode; every bad
file ends in one line and exit status 2; every file in release/ still
reproduces its check."""

import contextlib
import dataclasses
import glob
import io
import json
import os
import re
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from benchmarks import standard as bench_standard  # noqa: E402
import evaluate as evaluate_script  # noqa: E402
import export as export_script  # noqa: E402
import release as release_script  # noqa: E402
from algos import td3  # noqa: E402
from common import agent, envs  # noqa: E402
from common.errors import UserError  # noqa: E402
from common.policy import (  # noqa: E402
    PolicyState, check_actions, check_return, cpu_model, export, load_policy)

CONFIG = td3.Config(
    env="cartpole_balance",
    backend="native",
    num_envs=2,
    num_seeds=2,
    total_timesteps=400,
    learning_starts=100,
    batch_size=16,
    buffer_size=400,
    hidden_sizes=(8,),
    eval_every=0,
    eval_episodes=1,
    checkpoint_every=0,
    normalize_obs=True,
)
FLAGS = [
    "--env",
    "cartpole_balance",
    "--backend",
    "native",
    "--num-envs",
    "2",
    "--num-seeds",
    "2",
    "--total-timesteps",
    "400",
    "--learning-starts",
    "100",
    "--batch-size",
    "16",
    "--buffer-size",
    "400",
    "--hidden-sizes",
    "8",
    "--eval-every",
    "0",
    "--eval-episodes",
    "1",
    "--checkpoint-every",
    "0",
    "--normalize-obs",
]


@dataclasses.dataclass
class Trained:
    run: str
    states: td3.TrainState  # both seeds' final states, as the CLI returned them
    history: dict
    exported: str  # seed 1, written by scripts/export.py
    export_printed: str
    part: str  # bench_standard's policy part of the checkpoint

    def state(self, index):
        return jax.tree.map(lambda x: np.asarray(x)[index], self.states)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("policy")
    with contextlib.redirect_stdout(io.StringIO()):
        states, history = td3.main(FLAGS + ["--log-dir", str(tmp / "runs")])
    (run,) = glob.glob(str(tmp / "runs" / "*"))
    exported, printed = str(tmp / "seed1.npz"), io.StringIO()
    with contextlib.redirect_stdout(printed):
        export_script.main([run, "--seed-index", "1", "--out", exported])
    part = str(tmp / "cartpole_balance__td3.policy.npz")
    np.savez_compressed(part, **bench_standard.policy_leaves(os.path.join(run, "checkpoint.npz")))
    return Trained(
        run, states, jax.tree.map(np.asarray, history), exported, printed.getvalue(), part
    )


def reference_act():
    # make_act compiled, as Policy.act is: run op by op instead, XLA's fused
    # normalisation rounds the last bit differently (not a round-trip matter)
    env = envs.make(CONFIG.env, "native")
    return env, jax.jit(td3.make_act(CONFIG, env), static_argnums=3)


def test_every_source_acts_bit_for_bit_as_make_act(trained):
    env, ref = reference_act()
    obs = env.reset(jax.random.PRNGKey(5), env.eval_pool).obs
    batch = 2 * jax.random.normal(jax.random.PRNGKey(6), (5, env.observation_size))
    assert np.any(trained.state(1).obs_stats.mean != 0)  # the normalisation is exercised
    sources = [
        (trained.run, 1),
        (os.path.join(trained.run, "checkpoint.npz"), 1),
        (trained.part, 1),
        (trained.exported, 0),
    ]
    for source, index in sources:
        policy = load_policy(source, index)
        assert (policy.algo, policy.task, policy.seed_index) == ("td3", "cartpole_balance", 1)
        assert isinstance(policy.state, PolicyState) and isinstance(policy.config, td3.Config)
        assert policy.config.hidden_sizes == (8,) and policy.config.normalize_obs
        for o in (obs, batch):
            action = np.asarray(policy.act(o))
            assert action.shape == o.shape[:-1] + (env.action_size,)
            np.testing.assert_array_equal(
                action, np.asarray(ref(trained.state(1), o, None, True)), err_msg=source
            )
    other = load_policy(trained.run, 0)  # the seed index picks the seed
    assert not np.array_equal(
        np.asarray(other.act(batch)), np.asarray(ref(trained.state(1), batch, None, True))
    )


def test_exploration_policy_needs_a_key(trained):
    env, ref = reference_act()
    policy = load_policy(trained.exported)
    obs = env.reset(jax.random.PRNGKey(5), env.eval_pool).obs
    key = jax.random.PRNGKey(9)
    np.testing.assert_array_equal(
        np.asarray(policy.act(obs, key, deterministic=False)),
        np.asarray(ref(trained.state(1), obs, key, False)),
    )
    batch = np.stack([obs] * 4)
    noisy = np.asarray(policy.act(batch, key, deterministic=False))
    assert len({row.tobytes() for row in noisy}) == 4  # a key per observation
    assert np.all(noisy >= env.action_low) and np.all(noisy <= env.action_high)
    with pytest.raises(UserError, match="needs a key"):
        policy.act(obs, deterministic=False)
    with pytest.raises(UserError, match=r"\[5\] or \[batch, 5\], got \[3\]"):
        policy.act(np.zeros(3))


def test_exported_file(trained):
    with np.load(trained.exported) as z:
        header = json.loads(bytes(z["header"]).decode())
        assert sorted(z.files) == ["header"] + [
            f"leaf_{i:05d}" for i in range(len(header["leaf_paths"]))
        ]
    assert (
        header["format"],
        header["version"],
        header["algo"],
        header["env"],
        header["seed_index"],
    ) == ("rl-policy", 1, "td3", "cartpole_balance", 1)
    assert all(
        p.split("[")[0]
        in (".actor_params", ".obs_stats.mean", ".obs_stats.var", ".obs_stats.count")
        or p.startswith(".hp.")
        for p in header["leaf_paths"]
    )  # nothing else: no replay
    assert header["config"]["hidden_sizes"] == [8]
    # the seed's last logged evaluation (stream seed_2: --seed 1, index 1)
    assert header["eval_return"] == pytest.approx(
        float(trained.history["eval/episode_return"][1, -1]), rel=1e-6
    )
    assert os.path.getsize(trained.exported) < 20_000
    check = header["check"]
    assert (check["backend"], check["steps"]) == ("native", 1000) and check["return"] > 0
    assert re.fullmatch(
        rf"wrote {re.escape(trained.exported)} \([\d.]+ KiB\): td3 on cartpole_balance, "
        rf"seed index 1, eval return {header['eval_return']:.2f}, "
        rf"check return {check['return']:.4f}\n",
        trained.export_printed,
    )

    # export -> load -> the check episode reproduces the recorded return
    policy = load_policy(trained.exported)
    assert policy.eval_return == header["eval_return"] and policy.check == check
    assert check_return(policy) == pytest.approx(check["return"], rel=1e-5)
    assert check["cpu"] == cpu_model() and np.shape(check["actions"]) == (5, 1)
    np.testing.assert_allclose(check_actions(policy), check["actions"], atol=1e-5)


def test_export_from_a_policy_part_with_its_result(trained, tmp_path):
    """bench_standard's policy files: the eval return comes from the result JSON beside them."""
    part = tmp_path / "cartpole_balance__td3.policy.npz"
    part.write_bytes(open(trained.part, "rb").read())
    (tmp_path / "cartpole_balance__td3.json").write_text(
        json.dumps({"eval_returns": [[1.0, 2.0], [3.0, 4.5]]})
    )
    out = tmp_path / "again.npz"
    header = export_script.main([str(part), "--seed-index", "1", "--out", str(out)])
    assert header["eval_return"] == 4.5 and header["seed_index"] == 1
    with open(trained.exported, "rb") as f:
        first = json.loads(bytes(np.load(f)["header"]).decode())
    assert header["check"] == first["check"]  # the same policy, the same check episode
    header = export(load_policy(str(out)), str(tmp_path / "third.npz"))
    assert (header["eval_return"], header["seed_index"]) == (4.5, 1)  # kept through a re-export


def test_wrong_seed_or_agent_is_one_line(trained, tmp_path):
    with pytest.raises(UserError, match=r"seed index 2 is out of range: .* 2 seed\(s\).* 0\.\.1"):
        load_policy(trained.run, 2)
    with pytest.raises(UserError, match="seed index -1 is out of range"):
        load_policy(trained.run, -1)
    with pytest.raises(UserError, match="an exported policy file holds one seed, index 0"):
        load_policy(trained.exported, 1)
    nope = rewrite(trained.exported, tmp_path / "nope.npz", algo="nope")
    with pytest.raises(UserError, match="is for agent 'nope', which is not one of .*td3"):
        load_policy(nope)
    with pytest.raises(UserError, match="unknown backend 'cuda'"):
        load_policy(trained.exported, backend="cuda")


def rewrite(src, dst, nan_leaf=None, **changes) -> str:
    """A copy of an npz file with its header changed and, with `nan_leaf` (a
    leaf path), that leaf NaN (every seed's)."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    header = dict(json.loads(bytes(arrays["header"]).decode()), **changes)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    if nan_leaf is not None:  # leaf_<i> in a checkpoint or exported file, the path in a part
        name = f"leaf_{header['leaf_paths'].index(nan_leaf):05d}" if "leaf_paths" in header \
            else nan_leaf
        arrays[name] = np.full_like(arrays[name], np.nan)
    np.savez(dst, **arrays)
    return str(dst)


def bad_files(good: str, tmp_path):
    """(file, what the error line must say) for every way a file can be bad."""
    data = open(good, "rb").read()
    corrupt = bytearray(data)
    middle = len(data) // 2
    corrupt[middle : middle + 64] = bytes(b ^ 0xFF for b in corrupt[middle : middle + 64])
    (tmp_path / "corrupt.npz").write_bytes(bytes(corrupt))
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "text.npz").write_text("not a policy\n")
    np.savez(tmp_path / "foreign.npz", weights=np.arange(3.0))
    with np.load(good) as z:
        config = json.loads(bytes(z["header"]).decode())["config"]
    return [
        (str(tmp_path / "corrupt.npz"), "corrupt or truncated"),
        (str(tmp_path / "truncated.npz"), "corrupt or truncated"),
        (str(tmp_path / "empty.npz"), "not an npz archive, it is empty"),
        (str(tmp_path / "text.npz"), "not an npz archive"),
        (str(tmp_path / "foreign.npz"), "without this project's header"),
        (
            rewrite(good, tmp_path / "other.npz", format="other-format"),
            "is a 'other-format' file, not an 'rl-policy' policy file",
        ),
        (
            rewrite(good, tmp_path / "v2.npz", version=2),
            "rl-policy version 2; this code reads version 1",
        ),
        (rewrite(good, tmp_path / "v0.npz", version="1"), "no valid rl-policy version (found '1')"),
        (
            rewrite(good, tmp_path / "wide.npz", config=dict(config, hidden_sizes=[16])),
            "['Dense_0']['bias'] is float32[8], this td3 config needs float32[16]",
        ),
        (str(tmp_path / "missing.npz"), "no checkpoint or policy file at"),
    ]


def one_line_exit_2(main, argv, capsys, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert message in err, err
    assert captured.out == ""


def test_bad_files_one_line_and_exit_2(trained, tmp_path, capsys):
    out = tmp_path / "out.npz"
    for path, message in bad_files(trained.exported, tmp_path):
        one_line_exit_2(export_script.main, [path, "--out", str(out)], capsys, message)
        one_line_exit_2(evaluate_script.main, [path, "--episodes", "2"], capsys, message)
    assert not out.exists()


def test_bad_arguments_one_line_and_exit_2(trained, tmp_path, capsys):
    one_line_exit_2(
        export_script.main,
        [trained.run, "--seed-index", "5", "--out", str(tmp_path / "o.npz")],
        capsys,
        "0..1",
    )
    one_line_exit_2(
        export_script.main, [trained.run, "--out", str(tmp_path / "o.pt")], capsys, ".npz"
    )
    one_line_exit_2(export_script.main, [trained.run], capsys, "--out")
    one_line_exit_2(
        export_script.main,
        [trained.run, "--out", "/proc/no/such/dir/o.npz"],
        capsys,
        "cannot write",
    )
    one_line_exit_2(evaluate_script.main, [trained.exported, "--episodes", "0"], capsys, "positive")
    one_line_exit_2(
        evaluate_script.main, [trained.exported, "--backend", "cuda"], capsys, "unknown backend"
    )


def test_a_policy_with_a_non_finite_weight_is_not_exported_or_released(trained, tmp_path, capsys):
    """A NaN actor weight (a diverged run's policy): scripts/export.py and
    evaluate.py refuse the file, scripts/release.py the benchmark result it
    would release (one line, exit 2, nothing written)."""
    kernel = ".actor_params['params']['Dense_0']['kernel']"
    nan_file = rewrite(trained.exported, tmp_path / "nan.npz", nan_leaf=kernel)
    out = tmp_path / "out.npz"
    for main, args in ((export_script.main, ["--out", str(out)]),
                       (evaluate_script.main, ["--episodes", "1"])):
        one_line_exit_2(main, [nan_file, *args], capsys,
                        "its run diverged (non-finite weights or losses)")
    results = tmp_path / "results"
    results.mkdir()
    rewrite(trained.part, results / "cartpole_balance__td3.policy.npz", nan_leaf=kernel)
    (results / "cartpole_balance__td3.json").write_text(json.dumps(
        {"task": "cartpole_balance", "algo": "td3", "config": {"seed": 1},
         "eval_returns": [[1.0], [2.0]]}))
    one_line_exit_2(release_script.main, ["--results", str(results), "--release",
                                          str(tmp_path / "release")], capsys, "seed index 1")
    assert not out.exists() and not glob.glob(str(tmp_path / "release" / "*.npz"))


def test_release_picks_the_accelerator_walker_that_ended_highest(tmp_path):
    """The accelerator benchmark keeps one seed per agent (flat eval_returns):
    of its humanoid_walk runs with a policy, the highest final return is
    released; other tasks and runs without a policy are not candidates."""
    def result(task, algo, returns, policy=True):
        (tmp_path / f"{task}__{algo}.json").write_text(json.dumps(
            {"task": task, "algo": algo, "config": {"seed": 1}, "eval_returns": returns}))
        if policy:
            (tmp_path / f"{task}__{algo}.policy.npz").write_bytes(b"")
    result("humanoid_walk", "td3", [300.0, 802.0, 790.0])
    result("humanoid_walk", "d4pg", [400.0, 852.0, 800.0])
    result("humanoid_walk", "sac", [900.0], policy=False)
    result("humanoid_run", "d4pg", [950.0])
    ((key, (final, source, index, seed, _)),) = release_script.best_accelerator(
        str(tmp_path)).items()
    assert key == ("humanoid_walk", "d4pg") and final == 800.0 and (index, seed) == (0, 1)
    assert source.endswith("humanoid_walk__d4pg.policy.npz")
    assert release_script.best_accelerator(str(tmp_path), task="cheetah_run") == {}


def test_release_only_rebuilds_the_named_file_and_keeps_the_other_rows(trained, tmp_path,
                                                                       capsys):
    """`--only`: that file is exported and evaluated again; the other rows of
    release/README.md stay as written (their policies are not evaluated
    again); a name no result releases is one line and exit 2."""
    import shutil
    results, release, empty = tmp_path / "results", tmp_path / "release", tmp_path / "none"
    for d in (results, release, empty):
        d.mkdir()
    shutil.copy(trained.part, results / "cartpole_balance__td3.policy.npz")
    (results / "cartpole_balance__td3.json").write_text(json.dumps(
        {"task": "cartpole_balance", "algo": "td3", "config": {"seed": 1}, "command": "td3 cmd",
         "eval_steps": [1000], "eval_returns": [[1.0], [2.0]]}))
    kept = ("| walker_walk__sac.npz | sac | walker_walk | 100,000 | 1 | 9.0 | 8.0 [7.0, 9.0] | "
            "9.50 | 1 KiB | `sac cmd` |")
    (release / "walker_walk__sac.npz").write_bytes(b"not evaluated")
    (release / "README.md").write_text("# Released policies\n\n| file |\n|---|\n" + kept + "\n"
                                       "| cartpole_balance__td3.npz | td3 | cartpole_balance | "
                                       "1 | 1 | 0.0 | 0.0 [0.0, 0.0] | 0.00 | 1 KiB | `old` |\n")
    args = ["--results", str(results), "--release", str(release), "--accelerator", str(empty),
            "--episodes", "2"]
    release_script.main(args + ["--only", "cartpole_balance__td3"])
    text = (release / "README.md").read_text()
    assert kept in text.splitlines()
    (row,) = [ln for ln in text.splitlines() if ln.startswith("| cartpole_balance__td3.npz")]
    assert "`td3 cmd`" in row and "| 2 | 2.0 |" in row  # seed 2, the higher final return
    assert load_policy(str(release / "cartpole_balance__td3.npz")).check is not None
    capsys.readouterr()
    one_line_exit_2(release_script.main, args + ["--only", "walker_walk__ddpg"], capsys,
                    "--only: no benchmark result releases walker_walk__ddpg")


def test_evaluate_prints_mean_and_interval(trained, capsys):
    returns = evaluate_script.main([trained.exported, "--episodes", "3", "--seed", "1"])
    printed = capsys.readouterr().out
    ((mean, lo, hi),) = re.findall(
        r"td3 on cartpole_balance: mean return (-?[\d.]+), 95% CI "
        r"\[(-?[\d.]+), (-?[\d.]+)\] over 3 episode\(s\) \(native physics",
        printed,
    )
    assert returns.shape == (3,) and float(lo) <= float(mean) <= float(hi)
    assert float(mean) == pytest.approx(returns.mean(), abs=0.006)
    # the same held-out episodes the training run's evaluation draws with that key
    policy = load_policy(trained.exported)
    expected = agent.evaluate(
        policy.env, policy.act_fn, policy.state, lambda o: o, jax.random.PRNGKey(1), 3
    )
    assert returns.mean() == pytest.approx(float(expected), rel=1e-5)


def test_release_files_reproduce_their_check():
    """Every shipped policy still loads and replays its recorded check episode,
    and the release holds every agent on both standard tasks and every
    (task, agent) of the humanoid benchmark's committed results."""
    paths = sorted(glob.glob(os.path.join(ROOT, "release", "*.npz")))
    algos = ("ddpg", "td3", "d4pg", "td4", "sac", "mpo", "ppo")
    expected = {f"{t}__{a}.npz" for t in ("walker_walk", "cheetah_run") for a in algos}
    humanoid = glob.glob(os.path.join(ROOT, "docs", "results", "humanoid", "*__*__seed*.json"))
    expected |= {"__".join(os.path.basename(p).split("__")[:2]) + ".npz" for p in humanoid}
    expected |= {f"{t}__{a}__accelerator.npz" for t, a in release_script.best_accelerator()}
    assert {os.path.basename(p) for p in paths} == expected
    for path in paths:
        policy = load_policy(path)
        assert policy.kind == "exported" and policy.check is not None, path
        # the first actions reproduce on any machine; the whole episode's return only on
        # the CPU model that recorded it (a chaotic episode amplifies the last bit of the
        # arithmetic), and there exactly
        np.testing.assert_allclose(check_actions(policy), policy.check["actions"], atol=1e-3,
                                   err_msg=path)
        if policy.check["cpu"] == cpu_model():
            assert check_return(policy) == pytest.approx(policy.check["return"], rel=1e-5), path
