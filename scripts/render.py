"""Render a trained agent: one episode of its deterministic policy to MP4 (and GIF).

    python scripts/render.py runs/cheetah_run__td3__1__1700000000
    python scripts/render.py runs/.../checkpoint.npz --seed-index 2 --gif --width 320 --height 240
    python scripts/render.py release/cheetah_run__td3.npz          # an exported policy file

Works for every agent through the agent protocol (common.policy.load_policy:
the file's header names the agent and its config; `algos/<algo>.py`'s
`make_train` gives the env and the shape of the state, `make_act` the
policy), from held-out initial states (the env's evaluation pool). The episode runs on
either physics backend (`--backend`, default native: a checkpoint trained on
a GPU renders on a laptop). Each frame is the physics state the policy acted
on (qpos, qvel, and the episode's task parameters such as a reacher's target,
placed exactly as dm_control placed them), drawn by MuJoCo's offscreen
renderer. The camera is the model's first tracking camera (trackcom) for
tasks that move about, its fixed world camera for those that stay in place,
else a free camera following the root body; `--camera` picks another.

Headless: with MUJOCO_GL unset, EGL is tried, then OSMesa (Debian:
`apt-get install libegl1 libegl-mesa0` or `libosmesa6`).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import copy
import math
import re
import subprocess
from typing import TYPE_CHECKING, Dict, List, Optional

from common.errors import ArgumentParser, UserError, exit_on_user_error

if TYPE_CHECKING:  # annotations only: the heavy imports wait until they are needed
    import mujoco
    import numpy as np

GL_BACKENDS = ("egl", "osmesa")
BACKENDS = ("native", "mjx", "auto")  # as common.envs.BACKENDS (not imported: it loads JAX)
_PROBE = (
    "import mujoco\n"
    "m = mujoco.MjModel.from_xml_string('<mujoco/>')\n"
    "r = mujoco.Renderer(m, 16, 16)\n"
    "r.update_scene(mujoco.MjData(m))\n"
    "r.render()\n"
    "r.close()\n"
)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser.from_doc(__doc__)
    p.add_argument(
        "checkpoint",
        metavar="RUN_OR_CHECKPOINT",
        help="a run directory (runs/<env>__<algo>__<seed>__<time>), a checkpoint .npz "
        "or an exported policy file (scripts/export.py)",
    )
    p.add_argument(
        "--seed-index",
        type=int,
        default=0,
        help="which of the checkpoint's seeds (sweep members) to render (default 0)",
    )
    p.add_argument(
        "--backend", default="native", help="physics backend: native (default), mjx or auto"
    )
    length = p.add_mutually_exclusive_group()
    length.add_argument(
        "--episodes", type=int, default=1, help="full episodes to render (default 1)"
    )
    length.add_argument(
        "--steps",
        type=int,
        default=None,
        help="render exactly this many control steps instead (episodes reset as in training)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the episode's initial state (default 0)"
    )
    p.add_argument(
        "--width", type=int, default=640, help="frame width in pixels, even (default 640)"
    )
    p.add_argument(
        "--height", type=int, default=480, help="frame height in pixels, even (default 480)"
    )
    p.add_argument(
        "--fps",
        type=float,
        default=None,
        help="frames per second (default: the task's control rate, i.e. real time)",
    )
    p.add_argument(
        "--camera",
        default=None,
        help="camera name or index in the model; -1 for a free camera following the root body "
        "(default: chosen per model, see above)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output .mp4 (default <run dir>/render_<env>__<algo>__seed<index>.mp4)",
    )
    p.add_argument("--gif", action="store_true", help="also write a GIF next to the MP4")
    p.add_argument(
        "--fast",
        action="store_true",
        help="no shadows, reflections or anti-aliasing: about 10x faster on software GL "
        "(llvmpipe/OSMesa without a GPU), for previews",
    )
    return p


def parse_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.episodes is not None and args.episodes < 1:
        raise UserError(f"--episodes must be positive, got {args.episodes}")
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be positive, got {args.steps}")
    for name in ("width", "height"):
        v = getattr(args, name)
        if v < 2 or v % 2:
            raise UserError(f"--{name} must be a positive even number of pixels (H.264), got {v}")
    if args.fps is not None and not args.fps > 0:
        raise UserError(f"--fps must be positive, got {args.fps}")
    if args.seed_index < 0:
        raise UserError(f"--seed-index must be >= 0, got {args.seed_index}")
    if args.out is not None and os.path.splitext(args.out)[1].lower() not in (
        "",
        ".mp4",
        ".mkv",
        ".mov",
    ):
        raise UserError(f"--out {args.out!r}: the video is H.264, write it as .mp4 (or .mkv, .mov)")
    if args.backend not in BACKENDS:
        raise UserError(f"unknown backend {args.backend!r}; choose one of {', '.join(BACKENDS)}")
    return args


# --------------------------------------------------------------------------- OpenGL


def _probe(backend: str) -> bool:
    env = dict(os.environ, MUJOCO_GL=backend)
    if backend in GL_BACKENDS and "PYOPENGL_PLATFORM" not in os.environ:
        env["PYOPENGL_PLATFORM"] = backend
    try:
        return (
            subprocess.run(
                [sys.executable, "-c", _PROBE],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=120,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def select_gl() -> str:
    """Make MuJoCo's offscreen rendering work headless, before mujoco is
    imported: the user's MUJOCO_GL if set, else EGL, else OSMesa. Each is
    tried in a child process (a failed GL import cannot be undone in this one)."""
    wanted = os.environ.get("MUJOCO_GL")
    for backend in [wanted] if wanted else GL_BACKENDS:
        if _probe(backend):
            os.environ["MUJOCO_GL"] = backend
            if backend in GL_BACKENDS:
                os.environ.setdefault("PYOPENGL_PLATFORM", backend)
            return backend
    tried = f"MUJOCO_GL={wanted}" if wanted else "MUJOCO_GL=egl and MUJOCO_GL=osmesa"
    raise UserError(
        f"no OpenGL for offscreen rendering ({tried} failed); install EGL "
        f"(Debian: apt-get install libegl1 libegl-mesa0) or OSMesa (apt-get install libosmesa6) "
        f"and set MUJOCO_GL=egl or MUJOCO_GL=osmesa"
    )


# --------------------------------------------------------------------------- agent


def rollout(env, act, state, key, n_steps: int) -> Dict[str, "np.ndarray"]:
    """n_steps control steps of the deterministic policy `act(state, obs,
    key, deterministic)` from the held-out state that agent.evaluate(...,
    split(key)[0], 1) starts from (finished episodes reset from the same
    evaluation pool); per step the physics state the policy acted on, the task
    parameters, the reward and whether the episode ended with that step."""
    import jax
    import numpy as np

    @jax.jit
    def run(state, key):
        k_reset, k_act = jax.random.split(key)
        first = env.reset(jax.random.split(k_reset, 1)[0], env.eval_pool)

        def step(s, k):
            nxt = env.step(s, act(state, s.obs, k, True), env.eval_pool)
            return nxt, {
                "qpos": env.qpos(s),
                "qvel": env.qvel(s),
                "task": s.task,
                "reward": nxt.reward,
                "done": nxt.terminated | nxt.truncated,
            }

        return jax.lax.scan(step, first, jax.random.split(k_act, n_steps))[1]

    return jax.tree.map(np.asarray, run(state, key))


def episodes_of(done) -> List[slice]:
    """Slices of whole (and a trailing partial) episode in a step sequence."""
    import numpy as np

    ends = list(np.flatnonzero(done) + 1)
    if not ends or ends[-1] != len(done):
        ends.append(len(done))
    return [slice(a, b) for a, b in zip([0] + ends[:-1], ends)]


# --------------------------------------------------------------------------- scene


def task_models(
    env, params: List["np.ndarray"], pool_seed: Optional[int] = None
) -> Dict[bytes, "mujoco.MjModel"]:
    """One model per distinct task-parameter vector, as dm_control left it
    after drawing those parameters: an initial-state pool is made of the
    resets of a dm_control env seeded with the pool's seed (default the
    evaluation pool's, envs.EVAL_POOL_SEED, which `rollout` draws from), so
    replaying those resets finds the very model (target geoms, sites,
    bodies, lights) the agent saw."""
    import warnings
    import numpy as np
    from common import envs

    pool_seed = envs.EVAL_POOL_SEED if pool_seed is None else pool_seed
    wanted = {np.asarray(p, np.float32).tobytes() for p in params}
    domain, task, _ = envs._REGISTRY[env.name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from dm_control import suite

        dm_env = suite.load(domain, task, task_kwargs={"random": pool_seed})
    found = {}
    for _ in range(8192):
        dm_env.reset()
        got = np.asarray(env.task.episode_params(dm_env.physics), np.float64).reshape(-1)
        key = got.astype(np.float32).tobytes()
        if key in wanted and key not in found:
            found[key] = copy.copy(dm_env.physics.model.ptr)
            if len(found) == len(wanted):
                break
    if len(found) < len(wanted):
        print(
            "warning: some episodes' task parameters (targets) were not found among dm_control's "
            "resets; they are drawn where the last reset put them",
            file=sys.stderr,
        )
        last = copy.copy(dm_env.physics.model.ptr)
        found.update({k: last for k in wanted - set(found)})
    return found


def pick_camera(model, requested: Optional[str]):
    """A camera id, or an MjvCamera following the root body."""
    import mujoco

    mode = mujoco.mjtCamLight
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
    if requested is not None:
        if requested in names:
            return names.index(requested)
        if re.fullmatch(r"-?\d+", requested) and -1 <= int(requested) < model.ncam:
            if int(requested) >= 0:
                return int(requested)
        else:
            raise UserError(
                f"unknown camera {requested!r}; this model has "
                f"{', '.join(f'{i} ({n})' for i, n in enumerate(names)) or 'no cameras'}, "
                f"or -1 for a free camera following the root body"
            )
    else:
        # a body that moves about: the first camera tracking its centre of mass
        for i in range(model.ncam):
            if model.cam_mode[i] == mode.mjCAMLIGHT_TRACKCOM:
                return i
        # a body fixed in place (reacher, finger, manipulator): the world's fixed camera
        # (their `track` cameras are close-ups of a hand)
        for i in range(model.ncam):
            if model.cam_mode[i] == mode.mjCAMLIGHT_FIXED and model.cam_bodyid[i] == 0:
                return i
        for i in range(model.ncam):
            if model.cam_mode[i] == mode.mjCAMLIGHT_TRACK:
                return i
    cam = mujoco.MjvCamera()
    mujoco.mjv_defaultFreeCamera(model, cam)
    if model.nbody > 1:
        cam.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        cam.trackbodyid = 1
    return cam


class Frames:
    """Draws physics states with MuJoCo's offscreen renderer."""

    def __init__(
        self,
        models: Dict[bytes, "mujoco.MjModel"],
        width: int,
        height: int,
        camera,
        fast: bool = False,
    ):
        import mujoco

        self.mujoco = mujoco
        self.models = models
        self.fast = fast
        for m in models.values():
            m.vis.global_.offwidth = max(int(m.vis.global_.offwidth), width)
            m.vis.global_.offheight = max(int(m.vis.global_.offheight), height)
            if fast:
                m.vis.quality.offsamples = 0
        self.data = {k: mujoco.MjData(m) for k, m in models.items()}
        first = next(iter(models.values()))
        self.camera = pick_camera(first, camera)
        try:
            self.renderer = mujoco.Renderer(first, height, width)
        except Exception as e:  # a GL that passed the probe but fails here
            raise UserError(
                f"MuJoCo's offscreen renderer failed with MUJOCO_GL="
                f"{os.environ.get('MUJOCO_GL')}: {e}"
            ) from None

    def draw(self, qpos, qvel, task) -> "np.ndarray":
        key = task.astype("float32").tobytes()
        model, data = self.models[key], self.data[key]
        data.qpos[:] = qpos
        data.qvel[:] = qvel
        self.mujoco.mj_forward(model, data)
        self.renderer.update_scene(data, camera=self.camera)
        if self.fast:
            for flag in (
                self.mujoco.mjtRndFlag.mjRND_SHADOW,
                self.mujoco.mjtRndFlag.mjRND_REFLECTION,
            ):
                self.renderer.scene.flags[flag] = 0
        return self.renderer.render()

    def close(self):
        self.renderer.close()


# --------------------------------------------------------------------------- video


def gif_stride(fps: float) -> int:
    """Keep every k-th frame so a GIF frame lasts >= 20 ms (browsers slow
    shorter delays down to 100 ms)."""
    return max(1, math.ceil(0.02 * fps - 1e-9))


def write_video(out: str, frames, fps: float, gif: bool, count: int) -> Optional[str]:
    import warnings
    import imageio.v2 as imageio
    from PIL import Image

    # imageio-ffmpeg starts ffmpeg with fork+exec; JAX's warning about fork does not apply
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    stride, gif_frames = gif_stride(fps), []
    progress = sys.stdout.isatty()
    with imageio.get_writer(
        out,
        fps=fps,
        codec="libx264",
        quality=8,
        pixelformat="yuv420p",
        macro_block_size=2,
        ffmpeg_log_level="error",
    ) as writer:
        for t, frame in enumerate(frames):
            writer.append_data(frame)
            if gif and t % stride == 0:
                gif_frames.append(
                    Image.fromarray(frame).quantize(256, method=Image.Quantize.FASTOCTREE)
                )
            if progress and t % 100 == 99:
                sys.stdout.write(f"\rrendered {t + 1}/{count} frames")
                sys.stdout.flush()
    if progress:
        sys.stdout.write("\r" + " " * 40 + "\r")
    if not gif:
        return None
    gif_path = os.path.splitext(out)[0] + ".gif"
    gif_frames[0].save(
        gif_path,
        save_all=True,
        append_images=gif_frames[1:],
        duration=round(1000 * stride / fps),
        loop=0,
    )
    return gif_path


# --------------------------------------------------------------------------- main


@exit_on_user_error
def main(argv=None):
    args = parse_args(argv)
    gl = select_gl()  # first: the GL probes are child processes, forked before JAX starts threads
    import jax
    from common.policy import load_policy

    policy = load_policy(args.checkpoint, args.seed_index, args.backend)
    env = policy.env
    n_steps = args.steps if args.steps is not None else args.episodes * env.episode_length
    out = rollout(env, policy.act_fn, policy.state, jax.random.PRNGKey(args.seed), n_steps)
    spans = episodes_of(out["done"])
    if args.steps is None:
        spans = spans[: args.episodes]
    n_frames = spans[-1].stop
    for i, s in enumerate(spans):
        whole = bool(out["done"][s.stop - 1])
        print(
            f"episode {i}: return {out['reward'][s].sum():.2f} over {s.stop - s.start} steps"
            f"{'' if whole else ' (cut short by --steps)'}"
        )

    fps = args.fps or 1.0 / env.control_timestep
    dest = args.out or os.path.join(
        os.path.dirname(policy.path),
        f"render_{policy.task}__{policy.algo}__seed{policy.seed_index}.mp4",
    )
    if not os.path.splitext(dest)[1]:
        dest += ".mp4"
    frames = Frames(
        task_models(env, list(out["task"][:n_frames])),
        args.width,
        args.height,
        args.camera,
        args.fast,
    )
    try:
        drawn = (
            frames.draw(out["qpos"][t], out["qvel"][t], out["task"][t]) for t in range(n_frames)
        )
        gif_path = write_video(dest, drawn, fps, args.gif, n_frames)
    except OSError as e:
        raise UserError(f"cannot write {dest!r} ({e.strerror or e})") from None
    finally:
        frames.close()
    print(
        f"wrote {dest} ({n_frames} frames, {args.width}x{args.height}, {fps:g} fps, "
        f"{policy.algo} on {policy.task}, {env.backend} physics, MUJOCO_GL={gl})"
        + (f" and {gif_path} (every {gif_stride(fps)} frame(s))" if gif_path else "")
    )
    return dest


if __name__ == "__main__":
    main()
