"""What a run decides and says before it trains: the physics backend `auto`
picks for the platform (CPU, TPU, GPU, faked here: CI has only a CPU), the
first line (where physics and learning run), the one warning for MJX on a
TPU, and JAX's persistent compilation cache (on by default, off with
--no-compile-cache, refused by JAX for programs with host callbacks).
Nothing here trains: the CLI is stopped where the run would start."""
import importlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import td3
from common import cli, envs, hostcall
from common.envs import native

TINY = ["--env", "cartpole_balance", "--num-envs", "4", "--hidden-sizes", "8",
        "--total-timesteps", "2000", "--learning-starts", "1000", "--eval-episodes", "1"]


# --------------------------------------------------------------------- backend auto

@pytest.mark.parametrize("platform, expected", [("cpu", "native"), ("tpu", "native"),
                                                ("gpu", "mjx"), ("cuda", "mjx"),
                                                ("rocm", "mjx")])
def test_auto_picks_native_on_cpu_and_tpu_and_mjx_on_gpu(platform, expected, monkeypatch):
    assert envs.resolve_backend("auto", platform) == expected
    monkeypatch.setattr(envs, "current_platform", lambda: platform)
    assert envs.resolve_backend("auto") == expected
    assert envs.resolve_backend("native") == "native" and envs.resolve_backend("mjx") == "mjx"
    # one warning line, for an explicit MJX on a TPU only
    warning = envs.backend_warning("mjx")
    assert (warning is not None) == (platform == "tpu")
    if warning:
        assert len(warning.splitlines()) == 1 and "minutes" in warning and "native" in warning
    assert envs.backend_warning("native") is None and envs.backend_warning("auto") is None


def test_auto_follows_this_machine_and_builds_that_env(monkeypatch):
    assert envs.current_platform() == jax.default_backend()
    monkeypatch.setattr(envs, "current_platform", lambda: "tpu")
    assert envs.make("cartpole_balance", "auto", pool_size=2).backend == "native"
    with pytest.raises(envs.UserError, match="unknown backend 'gpu'"):
        envs.resolve_backend("gpu")


class _Stop(Exception):
    pass


def _until_start(monkeypatch, capsys, argv):
    """td3's CLI up to where the run would start (its lines printed, the
    compilation cache set): (stdout lines, stderr lines, JAX's cache settings then)."""
    seen = {}

    def stop(*args):
        seen.update(dir=jax.config.jax_compilation_cache_dir,
                    on=jax.config.jax_enable_compilation_cache,
                    precision=jax.config.jax_default_matmul_precision)
        raise _Stop

    monkeypatch.setattr(cli, "starting_point", stop)
    with pytest.raises(_Stop):
        td3.main(argv)
    out, err = capsys.readouterr()
    return out.splitlines(), err.splitlines(), seen


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_first_line_says_where_physics_and_learning_run(platform, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(envs, "current_platform", lambda: platform)
    monkeypatch.setenv(cli.CACHE_VAR, str(tmp_path / "cache"))
    monkeypatch.delenv(cli.PRECISION_VAR, raising=False)
    out, err, seen = _until_start(monkeypatch, capsys, TINY + ["--log-dir", str(tmp_path)])
    threads = min(native.default_threads(), 4)  # 4 envs a step call
    device = jax.devices()[0]
    precision = ", float32 matmuls at precision highest" if platform == "tpu" else ""
    assert out[0] == (f"physics: native MuJoCo on {threads} host thread"
                      f"{'s' if threads > 1 else ''}; learning: {device.device_kind} "
                      f"({device.platform}){precision}"), out
    assert "backend native" in out[1] and not err
    assert seen["precision"] == ("highest" if platform == "tpu" else None)
    assert jax.config.jax_default_matmul_precision is None  # as it was, after the run
    # explicit MJX: where it runs, and on a TPU one warning line
    out, err, _ = _until_start(monkeypatch, capsys,
                               TINY + ["--backend", "mjx", "--log-dir", str(tmp_path)])
    assert out[0].startswith(f"physics: MJX on {device.device_kind} ({device.platform}); "), out
    assert len(err) == (platform == "tpu") and all("--backend mjx on a TPU" in e for e in err)
    # the task's recipe line comes after the first line
    out, _, _ = _until_start(monkeypatch, capsys,
                             ["--env", "humanoid_walk", "--num-envs", "4", "--buffer-size",
                              "1000", "--hidden-sizes", "8", "--log-dir", str(tmp_path)])
    assert out[0].startswith("physics: native MuJoCo") and "TASK_DEFAULTS" in out[1], out
    assert not (tmp_path / "runs").exists()


def test_matmul_precision_highest_on_a_tpu_unless_the_user_says(monkeypatch):
    """A TPU runs float32 matmuls as bfloat16 passes by default; runs there use
    `highest` (the recipes' CPU numerics), $JAX_DEFAULT_MATMUL_PRECISION wins,
    and JAX's setting is back as it was afterwards."""
    monkeypatch.delenv(cli.PRECISION_VAR, raising=False)
    for platform, expected in (("tpu", "highest"), ("cpu", None), ("gpu", None)):
        with cli.matmul_precision(platform) as got:
            assert got == expected == jax.config.jax_default_matmul_precision
        assert jax.config.jax_default_matmul_precision is None
    monkeypatch.setenv(cli.PRECISION_VAR, "default")
    with cli.matmul_precision("tpu") as got:
        assert got is None
    # and the setting reaches what compiles inside: a dot traced there carries it
    monkeypatch.delenv(cli.PRECISION_VAR)
    x = jnp.ones((2, 2), jnp.float32)
    with cli.matmul_precision("tpu"):
        text = str(jax.make_jaxpr(lambda a: a @ a)(x))
    assert "HIGHEST" in text.upper(), text


def test_accelerator_recipe_replaces_the_task_defaults_on_an_accelerator_only(monkeypatch,
                                                                              capsys, tmp_path):
    """An agent's ACCELERATOR_DEFAULTS apply where learning runs on an
    accelerator, on top of its TASK_DEFAULTS, each printed and each
    overridden by its flag; on a CPU they are not used."""
    import dataclasses
    spec = dataclasses.replace(td3.AGENT, accelerator_defaults={"cartpole": dict(batch_size=64,
                                                                               tau=0.02)})
    monkeypatch.setattr(td3, "AGENT", spec)
    monkeypatch.setenv(cli.CACHE_VAR, str(tmp_path / "cache"))
    for platform in ("cpu", "tpu", "gpu"):
        monkeypatch.setattr(envs, "current_platform", lambda: platform)
        config = cli.parse(spec, TINY, announce=False)
        on = platform != "cpu"
        assert (config.batch_size, config.tau) == ((64, 0.02) if on else (256, 0.005))
        assert spec.config_for("cartpole_balance", platform) == dataclasses.replace(
            td3.Config(), env="cartpole_balance", **(dict(batch_size=64, tau=0.02) if on else {}))
        assert spec.config_for("walker_walk", platform).batch_size == 256  # another domain
        line = cli.recipe_line(spec, config)
        assert (line is not None) == on
        if on:
            assert line == (f"cartpole_balance: on this {platform}, its accelerator recipe "
                            "(ACCELERATOR_DEFAULTS): --batch-size 64 --tau 0.02 "
                            "(algos/td3.py; any flag overrides them)")
    # a flag wins, and the line names only what the recipe still sets
    config = cli.parse(spec, TINY + ["--batch-size", "32"], announce=False)
    assert (config.batch_size, config.tau) == (32, 0.02)
    assert cli.recipe_line(spec, config).endswith("--tau 0.02 (algos/td3.py; any flag "
                                                   "overrides them)")
    # both kinds in one line, on the task that has both
    spec = dataclasses.replace(spec, accelerator_defaults={"humanoid": dict(batch_size=1024)})
    config = cli.parse(spec, ["--env", "humanoid_walk"], announce=False)
    line = cli.recipe_line(spec, config)
    assert config.batch_size == 1024 and "TASK_DEFAULTS): --num-envs 256" in line
    assert "; on this gpu, its accelerator recipe (ACCELERATOR_DEFAULTS): --batch-size 1024" in line


@pytest.mark.parametrize("algo", ("ddpg", "td3", "d4pg", "td4", "sac", "mpo"))
def test_off_policy_agents_overlap_physics_on_an_accelerator_humanoid_only(
        algo, monkeypatch, tmp_path):
    """The off-policy accelerator recipe: --overlap-physics and a checkpoint
    every 5M env steps on the humanoid tasks where learning runs on an
    accelerator, nowhere on a CPU (the one-core benchmark's program is
    unchanged), and --no-overlap-physics turns the first off."""
    mod = importlib.import_module(f"algos.{algo}")
    monkeypatch.setenv(cli.CACHE_VAR, str(tmp_path / "cache"))
    envs_default = mod.AGENT.defaults_for("humanoid_run")["num_envs"]
    for platform in ("cpu", "tpu", "gpu"):
        monkeypatch.setattr(envs, "current_platform", lambda: platform)
        for task in ("humanoid_walk", "humanoid_run", "walker_walk"):
            config = cli.parse(mod.AGENT, ["--env", task], announce=False)
            assert config.overlap_physics == (platform != "cpu" and task != "walker_walk")
            if task != "walker_walk":  # checkpoints every few minutes wherever it runs
                assert config.checkpoint_every == (1_000_000 if platform == "cpu" else 5_000_000)
        config = cli.parse(mod.AGENT, ["--env", "humanoid_run", "--no-overlap-physics"],
                           announce=False)
        assert not config.overlap_physics and config.num_envs == envs_default


# --------------------------------------------------------------------- compilation cache

def _entries(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def test_compilation_cache_stores_programs_without_host_callbacks_only(monkeypatch, tmp_path):
    """Every program but those with host callbacks (JAX refuses those: every
    training program, docs/throughput.md); off, nothing is written; JAX's
    settings are back as they were afterwards."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(cli.CACHE_VAR, str(cache))
    before = (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache)
    x = jnp.arange(7.0, dtype=jnp.float32)   # shapes no other test compiles for
    with cli.compile_cache(False):
        jax.jit(lambda v: v * 3.0 - 1.0)(x).block_until_ready()
    assert not cache.exists()
    with cli.compile_cache(True) as path:
        assert path == str(cache)
        def plain(v):
            return jnp.sin(v) * 2.0 + 0.5

        def calls_the_host(v):
            return hostcall.call(lambda a: a + 1, jax.ShapeDtypeStruct((7,), jnp.float32), v) * 2

        np.testing.assert_allclose(jax.jit(plain)(x), np.sin(np.arange(7.0)) * 2 + 0.5,
                                   rtol=1e-6)
        stored = _entries(cache)
        assert len(stored) == 1 and stored[0].startswith("jit_plain-"), stored
        np.testing.assert_allclose(jax.jit(calls_the_host)(x), (np.arange(7.0) + 1) * 2)
        assert _entries(cache) == stored      # refused: it calls the host
    assert (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache) == before


def test_cli_turns_the_cache_on_by_default_and_off_with_the_flag(monkeypatch, capsys, tmp_path):
    cache = tmp_path / "cache"
    monkeypatch.setenv(cli.CACHE_VAR, str(cache))
    assert cli.parse(td3.AGENT, []).compile_cache is True
    assert cli.parse(td3.AGENT, ["--no-compile-cache"]).compile_cache is False
    argv = TINY + ["--log-dir", str(tmp_path)]
    _, _, seen = _until_start(monkeypatch, capsys, argv)
    assert (seen["dir"], seen["on"]) == (str(cache), True) and cache.is_dir()
    _, _, seen = _until_start(monkeypatch, capsys, argv + ["--no-compile-cache"])
    assert (seen["dir"], seen["on"]) == (None, False)
    # the user's cache directory unless told otherwise
    monkeypatch.delenv(cli.CACHE_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cli.compile_cache_dir() == str(tmp_path / "xdg" / "jax-mujoco-rl" / "xla")
    # a directory that cannot be made: one warning line, the run goes on without the cache
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cli.CACHE_VAR, str(tmp_path / "file" / "cache"))
    _, err, seen = _until_start(monkeypatch, capsys, argv)
    assert seen["on"] is False and len(err) == 1 and "compilation cache off" in err[0], err
