"""scripts/render.py: a video of one full episode from a real (tiny) TD3
checkpoint, frames = episode steps, the printed return = the evaluation's;
task targets drawn where the agent saw them; camera choice; bad input.

Skipped only where no OpenGL for offscreen rendering exists (never in CI,
where .ci/run installs Mesa's EGL: there it fails instead)."""

import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import render  # noqa: E402
from common.errors import UserError  # noqa: E402


def read_video(path, width: int, height: int):
    """All frames of a video and its frame rate, decoded by ffmpeg in one
    subprocess call. imageio's reader waits at most 10 s for ffmpeg's header
    on a thread that a loaded CI machine can starve, so it fails spuriously."""
    import imageio_ffmpeg

    done = subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-i", str(path)]
        + ["-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=True,
        timeout=300,
    )
    (fps,) = re.findall(rb"Stream #0:0.*?, (\d+(?:\.\d+)?) fps", done.stderr)[:1]
    return np.frombuffer(done.stdout, np.uint8).reshape(-1, height, width, 3), float(fps)


@pytest.fixture(scope="module")
def gl():
    try:
        return render.select_gl()
    except UserError as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide offscreen GL: {e}")
        pytest.skip(f"no OpenGL for offscreen rendering here: {e}")


def write_checkpoint(module, algo: str, config, run_dir) -> None:
    """A checkpoint as cli.main writes it, of the train state's exact structure,
    with random floats (seeds differ) instead of trained ones: compiling even
    the init of a run costs seconds, a training run most of this file's time
    (the slow-marked test below renders a checkpoint from a real run)."""
    import dataclasses
    from common import checkpoint

    train = module.make_train(config)
    keys = jax.random.split(jax.random.PRNGKey(config.seed), config.num_seeds)
    template = jax.eval_shape(jax.vmap(train.init), keys)
    rng = np.random.default_rng(0)

    def fill(x):
        if np.issubdtype(x.dtype, np.floating):
            return rng.normal(0, 0.5, x.shape).astype(x.dtype)
        return np.zeros(x.shape, x.dtype)

    checkpoint.save(
        str(run_dir / checkpoint.CHECKPOINT_FILE),
        jax.tree.map(fill, template),
        {
            "algo": algo,
            "env": config.env,
            "num_seeds": config.num_seeds,
            "chunk": 0,
            "run_dir": str(run_dir),
            "config": dataclasses.asdict(config),
        },
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-seed TD3 checkpoint on cartpole_balance (dense reward) with tiny networks."""
    from algos import td3

    run = tmp_path_factory.mktemp("runs") / "cartpole_balance__td3__1__0"
    run.mkdir()
    write_checkpoint(
        td3,
        "td3",
        td3.Config(
            env="cartpole_balance",
            backend="native",
            num_seeds=2,
            total_timesteps=1000,
            learning_starts=500,
            batch_size=16,
            buffer_size=1000,
            hidden_sizes=(8, 8),
        ),
        run,
    )
    return run


def test_video_of_one_episode(gl, run_dir, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "video" / "cartpole.mp4"
    render.main(
        [
            str(run_dir),
            "--seed-index",
            "1",
            "--width",
            "64",
            "--height",
            "48",
            "--fast",
            "--gif",
            "--seed",
            "3",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    frames, fps = read_video(out, 64, 48)
    assert len(frames) == 1000 and fps == 100  # one frame per control step of the 1000-step episode
    assert frames[0].shape == (48, 64, 3)
    assert np.ptp(np.asarray(frames[0], np.float32)) > 0  # not a blank image
    gif = Image.open(out.with_suffix(".gif"))
    assert gif.format == "GIF" and gif.size == (64, 48)
    assert gif.info["duration"] == 20  # 100 fps control rate: every 2nd frame, 20 ms each

    # the printed return is that of agent.evaluate's episode (held-out pool) from the same reset key
    (ret,) = re.findall(r"episode 0: return (-?[\d.]+) over 1000 steps", printed)
    from common import agent
    from common.policy import load_policy

    policy = load_policy(str(run_dir / "checkpoint.npz"), 1)
    k_reset = jax.random.split(jax.random.PRNGKey(3))[0]
    expected = float(
        agent.evaluate(policy.env, policy.act_fn, policy.state, lambda o: o, k_reset, 1)
    )
    assert expected > 1 and float(ret) == pytest.approx(expected, abs=0.006)
    assert f"wrote {out} (1000 frames, 64x48, 100 fps" in printed


def test_mjx_checkpoint_steps_and_default_output(gl, tmp_path, capsys):
    """A checkpoint trained on MJX (a GPU's backend) renders on native physics."""
    from algos import td3

    run = tmp_path / "cartpole_balance__td3__1__0"
    run.mkdir()
    write_checkpoint(
        td3,
        "td3",
        td3.Config(
            env="cartpole_balance",
            backend="mjx",
            total_timesteps=1000,
            learning_starts=500,
            batch_size=16,
            buffer_size=1000,
            hidden_sizes=(8, 8),
        ),
        run,
    )
    render.main(
        [
            str(run / "checkpoint.npz"),
            "--steps",
            "30",
            "--width",
            "32",
            "--height",
            "32",
            "--fast",
            "--fps",
            "10",
        ]
    )
    printed = capsys.readouterr().out
    assert "(cut short by --steps)" in printed and "native physics" in printed
    frames, fps = read_video(run / "render_cartpole_balance__td3__seed0.mp4", 32, 32)
    assert fps == 10 and len(frames) == 30


def test_exported_policy_file_renders(gl, run_dir, tmp_path, capsys):
    """A file of scripts/export.py renders the episode its checkpoint renders;
    the video goes next to it by default."""
    from common.policy import export, load_policy

    path = tmp_path / "policy.npz"
    export(load_policy(str(run_dir), 1), str(path))
    args = ["--steps", "20", "--width", "32", "--height", "32", "--fast", "--seed", "3"]
    render.main([str(path), *args])
    from_file = capsys.readouterr().out
    assert (tmp_path / "render_cartpole_balance__td3__seed1.mp4").exists()
    render.main([str(run_dir), "--seed-index", "1", *args, "--out", str(tmp_path / "ckpt.mp4")])
    from_checkpoint = capsys.readouterr().out
    returns = [
        re.findall(r"episode 0: return (-?[\d.]+) over 20 steps", p)
        for p in (from_file, from_checkpoint)
    ]
    assert returns[0] == returns[1] and len(returns[0]) == 1


@pytest.mark.parametrize("name,count", [("reacher_easy", 3), ("manipulator_bring_ball", 2)])
def test_task_targets_placed_as_the_agent_saw_them(gl, name, count):
    """Each episode's target (a reacher's geom, the manipulator's target body)
    ends up in the rendered model exactly where the observation put it."""
    import mujoco
    from common import envs

    env = envs.make(name, "native", pool_size=count)
    # rendered episodes start from the held-out pool, so task_models replays its resets
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    batch = reset(jax.random.split(jax.random.PRNGKey(0), 4 * count), env.eval_pool)
    states = [jax.tree.map(lambda x: x[i], batch) for i in range(4 * count)]
    tasks = [np.asarray(s.task) for s in states]
    assert len({t.tobytes() for t in tasks}) > 1  # several different targets
    models = render.task_models(env, tasks)
    frames = render.Frames(models, 32, 32, None, fast=True)
    try:
        for s, task in zip(states, tasks):
            img = frames.draw(np.asarray(env.qpos(s)), np.asarray(env.qvel(s)), task)
            assert img.shape == (32, 32, 3)
            key = task.astype(np.float32).tobytes()
            model, data = models[key], frames.data[key]
            if name.startswith("reacher"):
                geom = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, "target")
                target = data.geom_xpos[geom, :2]
                np.testing.assert_allclose(target, task, atol=1e-6)
            else:
                body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, "target_ball")
                np.testing.assert_allclose(data.xpos[body], task[:3], atol=1e-6)
    finally:
        frames.close()


def test_camera_choice():
    import warnings
    import mujoco
    from dm_control import suite

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = {
            d: suite.load(d, t).physics.model.ptr
            for d, t in (("cheetah", "run"), ("reacher", "easy"), ("fish", "swim"))
        }
    name = lambda m, i: mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_CAMERA, i)
    pick = render.pick_camera
    assert name(models["cheetah"], pick(models["cheetah"], None)) == "side"  # trackcom
    assert name(models["reacher"], pick(models["reacher"], None)) == "fixed"  # not the hand's
    assert name(models["fish"], render.pick_camera(models["fish"], None)) == "tracking_top"
    assert render.pick_camera(models["cheetah"], "back") == 1
    free = render.pick_camera(models["cheetah"], "-1")
    assert isinstance(free, mujoco.MjvCamera) and free.trackbodyid == 1
    with pytest.raises(UserError, match="unknown camera 'top'.*0 \\(side\\), 1 \\(back\\)"):
        render.pick_camera(models["cheetah"], "top")


def _one_line_exit_2(args, capsys, message):
    with pytest.raises(SystemExit) as e:
        render.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_bad_input(gl, run_dir, tmp_path, capsys):
    _one_line_exit_2([str(tmp_path / "nowhere")], capsys, "no checkpoint or policy file at")
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes((run_dir / "checkpoint.npz").read_bytes()[:500])
    _one_line_exit_2([str(corrupt)], capsys, "corrupt or truncated")
    _one_line_exit_2([str(run_dir), "--seed-index", "2"], capsys, "0..1")
    _one_line_exit_2([str(run_dir), "--width", "33"], capsys, "even")
    _one_line_exit_2([str(run_dir), "--backend", "cuda"], capsys, "unknown backend")
    _one_line_exit_2([str(run_dir), "--out", str(tmp_path / "v.gif")], capsys, ".mp4")
    _one_line_exit_2([str(run_dir), "--episodes", "two"], capsys, "invalid int value")


def test_no_gl_says_what_to_install(tmp_path):
    env = dict(os.environ, MUJOCO_GL="no-such-gl", JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "render.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "libegl1 libegl-mesa0" in err and "libosmesa6" in err and "MUJOCO_GL=egl" in err


@pytest.mark.slow
def test_render_a_trained_run(gl, tmp_path, capsys):
    """End to end: the CLI's own run directory of a short TD3 run renders."""
    from algos import td3

    td3.main(
        [
            "--env",
            "cartpole_balance",
            "--total-timesteps",
            "2000",
            "--learning-starts",
            "1000",
            "--batch-size",
            "16",
            "--buffer-size",
            "2000",
            "--hidden-sizes",
            "16",
            "16",
            "--eval-episodes",
            "1",
            "--log-dir",
            str(tmp_path),
        ]
    )
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    out = render.main([str(run), "--width", "64", "--height", "48", "--fast"])
    assert len(read_video(out, 64, 48)[0]) == 1000
    assert "episode 0: return" in capsys.readouterr().out
