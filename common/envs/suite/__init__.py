"""dm_control suite tasks: observation and reward in jax.numpy, one module a domain."""
import importlib

DOMAINS = ("acrobot", "ball_in_cup", "cartpole", "cheetah", "finger", "fish", "hopper", "humanoid",
           "manipulator", "pendulum", "point_mass", "quadruped", "reacher", "swimmer", "walker")

for _d in DOMAINS:
    try:
        importlib.import_module(f"{__name__}.{_d}")
    except ModuleNotFoundError as e:  # a domain not ported yet
        if e.name != f"{__name__}.{_d}":
            raise
