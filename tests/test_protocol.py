"""The agent protocol (common/agent.py): every algos/<name>.py declares what
it provides in its `AGENT`, its Config opens with the fields all agents
share (same names, types, defaults and help text), its HParams are float
Config fields, and `make_train(config)` is an immutable `Train` that vmaps
over keys and hyperparameters. No program is compiled here."""
import ast
import dataclasses
import importlib
import inspect
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import agent

ALGOS = ("ddpg", "td3", "d4pg", "td4", "sac", "mpo", "ppo")
SHARED = ("env", "backend", "num_envs", "num_seeds", "total_timesteps", "seed", "eval_every",
          "eval_episodes", "log_dir", "checkpoint_every", "resume", "compile_cache")
# PPO's on-policy budget: many envs, a longer run, rarer evaluations and checkpoints
PPO_OWN = {"num_envs": 1024, "total_timesteps": 60_000_000, "eval_every": 5_000_000,
           "checkpoint_every": 5_000_000}
PPO_HELP = {"total_timesteps": "env steps per seed (rounded down to whole rollouts of num_envs x "
                               "num_steps)"}


def module(algo):
    return importlib.import_module(f"algos.{algo}")


def help_texts(config_cls):
    """{field: its docstring}, as tyro reads them for --help."""
    body = ast.parse(textwrap.dedent(inspect.getsource(config_cls))).body[0].body
    return {a.target.id: inspect.cleandoc(b.value.value) for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)}


def shared_fields(algo):
    config = module(algo).Config
    fields, helps = {f.name: f for f in dataclasses.fields(config)}, help_texts(config)
    return {name: (fields[name].type, fields[name].default, helps.get(name)) for name in SHARED}


@pytest.mark.parametrize("algo", ALGOS)
def test_each_agent_declares_what_it_provides(algo):
    mod = module(algo)
    spec = mod.AGENT
    assert isinstance(spec, agent.Agent) and spec.name == algo and spec.doc == mod.__doc__
    assert (spec.Config, spec.HParams, spec.validate, spec.make_train, spec.make_act) == \
        (mod.Config, mod.HParams, mod.validate, mod.make_train, mod.make_act)
    assert callable(mod.main)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"
    # the traced hyperparameters are float fields of the config, as the config sets them
    floats = {f.name for f in dataclasses.fields(mod.Config) if f.type in (float, "float")}
    assert set(spec.HParams._fields) <= floats, set(spec.HParams._fields) - floats
    hp = spec.hparams(mod.Config())
    assert all(x.dtype == jnp.float32 and x.shape == () for x in hp)
    assert [float(x) for x in hp] == [float(np.float32(getattr(mod.Config(), f)))
                                      for f in spec.HParams._fields]


def test_configs_share_the_common_fields_with_the_same_defaults_and_help():
    reference = shared_fields("td3")
    assert all(reference[name][2] for name in SHARED)             # each has a help line
    for algo in ALGOS:
        names = [f.name for f in dataclasses.fields(module(algo).Config)]
        assert names[:len(SHARED)] == list(SHARED), algo           # first, in the same order
        want = dict(reference)
        if algo == "ppo":
            for name, default in PPO_OWN.items():
                want[name] = (want[name][0], default, PPO_HELP.get(name, want[name][2]))
        assert shared_fields(algo) == want, algo


def test_train_is_immutable_and_vmaps_over_keys_and_hyperparameters():
    from algos import td3
    config = td3.Config(env="cartpole_balance", backend="native", total_timesteps=400,
                        learning_starts=100, batch_size=16, buffer_size=400, hidden_sizes=(8,),
                        eval_every=0, eval_episodes=1, checkpoint_every=0)
    train = td3.make_train(config)
    assert isinstance(train, agent.Train)
    with pytest.raises(dataclasses.FrozenInstanceError):
        train.run = None
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    hps = jax.tree.map(lambda x: jnp.full(2, x), td3.AGENT.hparams(config))
    hps = hps._replace(tau=jnp.array([0.005, 0.05], jnp.float32))
    # traced, not compiled: the README's one-liners have the shapes they should
    states, history = jax.eval_shape(jax.vmap(train), keys, hps)
    assert states.hp.tau.shape == (2,) and history["eval/episode_return"].shape == (2, 1)
    states, history = jax.eval_shape(jax.vmap(train), keys)
    assert states.actor_params["params"]["Dense_0"]["kernel"].shape[0] == 2
