"""--overlap-physics (the off-policy agents' accelerator recipe): the native
step split around the device's work (`Env.step_while`), the agents'
iteration in that order (agent.step_and_learn), and what it changes: replay
takes each step one iteration later, nothing else."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import envs, hostcall

OFF_POLICY = ("ddpg", "td3", "d4pg", "td4", "sac", "mpo")


@pytest.fixture(scope="module")
def cartpole():
    return envs.make("cartpole_balance", "native", pool_size=16)


@pytest.mark.parametrize("packed,groups", [(False, 1), (True, 1), (False, 3), (True, 3)])
def test_step_while_is_the_step_bit_for_bit_with_fn_in_between(cartpole, monkeypatch, packed,
                                                               groups):
    """Nested vmap (seeds x envs): one start and one finish host call per
    step and group (groups: the envs handed over in equal parts, every start
    before the first finish), the same states as vmap(step), and fn's
    result. packed: as on an accelerator, each host call's operands packed
    into one array each way (hostcall.call(pack=None)), against the
    unpacked step."""
    env, calls = cartpole, []
    for name in ("host_start", "host_finish"):
        orig = getattr(env.native, name)
        monkeypatch.setattr(env.native, name, lambda *a, orig=orig, name=name: (
            calls.append((name, a[0].shape)), orig(*a))[1])
    seeds, n, steps = 2, 3, 5
    keys = jax.random.split(jax.random.PRNGKey(0), seeds * n).reshape(seeds, n, 2)
    acts = jax.random.uniform(jax.random.PRNGKey(1), (steps, seeds, n, env.action_size),
                              minval=-1, maxval=1)
    reset = jax.vmap(jax.vmap(env.reset))

    @jax.jit
    def plain(keys, acts):
        step = jax.vmap(jax.vmap(env.step))
        return jax.lax.scan(lambda s, a: (step(s, a), None), reset(keys), acts)[0]

    @jax.jit
    def split(keys, acts):
        step = jax.vmap(lambda s, a, x: env.step_while(s, a, env.pool, lambda x: x + 1.0, x,
                                                       groups=groups))
        return jax.lax.scan(lambda c, a: (step(*c[:1], a, c[1]), None),
                            (reset(keys), jnp.zeros(seeds)), acts)[0]

    ref = plain(keys, acts)
    monkeypatch.setattr(hostcall, "packs_by_default", lambda: packed)
    operands = [(len(e.invars), len(e.outvars))
                for e in _nested_host_calls(jax.make_jaxpr(split)(keys, acts).jaxpr)]
    assert sorted(operands) == sorted(([(1, 1)] * 2 if packed else [(2, 1), (1, 3)]) * groups), \
        operands
    out, counted = split(keys, acts)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(counted), np.full(seeds, steps))
    assert [c[0] for c in calls] == (["host_start"] * groups + ["host_finish"] * groups) * steps, \
        calls
    assert all(shape[:2] == (seeds, n // groups) for _, shape in calls), calls
    assert not env.native._jobs  # every started step was taken


def _nested_host_calls(jaxpr):
    for e in jaxpr.eqns:
        if e.primitive.name == "host_call":
            yield e
        for p in e.params.values():
            sub = getattr(p, "jaxpr", p)
            if hasattr(sub, "eqns"):
                yield from _nested_host_calls(sub)


def _host_calls(jaxpr, name):
    return [e for e in jaxpr.eqns if e.primitive.name == "host_call"
            and e.params["fn"].fn.__name__ == name]


def _downstream(jaxpr, eqns):
    """Every value computed, in the top-level jaxpr, from the outputs of `eqns`."""
    after = {v for e in eqns for v in e.outvars}
    for e in jaxpr.eqns:  # in order
        if any(not hasattr(v, "val") and v in after for v in e.invars):
            after.update(e.outvars)
    return after


def _size(eqn) -> int:
    subs = [s if hasattr(s, "eqns") else s.jaxpr for p in eqn.params.values()
            for s in (p if isinstance(p, (tuple, list)) else [p])
            if hasattr(s, "eqns") or hasattr(s, "jaxpr")]
    return 1 + sum(_size(e) for j in subs for e in j.eqns)


def _traced_iteration(algo, **flags):
    mod = importlib.import_module(f"algos.{algo}")
    train = mod.make_train(mod.Config(env="cartpole_balance", backend="native", num_envs=2,
                                      total_timesteps=40_000, eval_every=0, checkpoint_every=0,
                                      **flags))
    state = jax.eval_shape(train.init, jax.random.PRNGKey(0))
    jaxpr = jax.make_jaxpr(train.iteration)(state, jnp.int32(5)).jaxpr
    learn = max((e for e in jaxpr.eqns if e.primitive.name == "cond"), key=_size)
    assert _size(learn) > 100
    return jaxpr, learn


def _uses(eqn, values) -> bool:
    return any(not hasattr(v, "val") and v in values for v in eqn.invars)


@pytest.mark.parametrize("algo", OFF_POLICY)
def test_the_updates_run_while_the_host_steps(algo):
    """Traced, not compiled. With --overlap-physics the updates (the learn
    `cond`) come after the step's start (they take its ticket) and before its
    finish (which takes their results), and nothing of the step reaches them;
    without it, they learn from the step's results, as before."""
    jaxpr, learn = _traced_iteration(algo, overlap_physics=True)
    (start,), (finish,) = _host_calls(jaxpr, "host_start"), _host_calls(jaxpr, "host_finish")
    assert _uses(learn, _downstream(jaxpr, [start]))
    assert not _uses(learn, _downstream(jaxpr, [finish]))
    assert _uses(finish, _downstream(jaxpr, [learn]))
    jaxpr, learn = _traced_iteration(algo)
    assert not _host_calls(jaxpr, "host_start")
    assert _uses(learn, _downstream(jaxpr, _host_calls(jaxpr, "host_step")))


def test_replay_takes_each_step_one_iteration_later_and_nothing_else_changes(tmp_path):
    """D4PG during its warm-up (uniform actions, no update), 6 iterations with
    and without --overlap-physics from the same key: the same env states; the
    overlapped replay holds the invalid placeholder, then the other's rows,
    and its pending transition is the other's last row. A checkpoint of one
    does not load as the other: one line that names the difference."""
    from algos import d4pg
    from common import checkpoint
    from common.errors import UserError
    k = 6
    out, init = {}, {}
    for overlap in (False, True):
        train = d4pg.make_train(d4pg.Config(
            env="cartpole_balance", backend="native", num_envs=2, total_timesteps=40_000,
            learning_starts=1000, buffer_size=64, batch_size=16, hidden_sizes=(8, 8), num_atoms=11,
            eval_every=0, checkpoint_every=0, overlap_physics=overlap))
        run = jax.jit(lambda s: jax.lax.scan(train.iteration, s, jnp.arange(k))[0])
        out[overlap] = jax.device_get(run(train.init(jax.random.PRNGKey(3))))
        init[overlap] = train.init
    off, on = out[False], out[True]
    for a, b in zip(jax.tree.leaves(off.env_state), jax.tree.leaves(on.env_state)):
        np.testing.assert_array_equal(a, b)
    assert int(off.replay.size) == k and int(on.replay.size) == k
    assert not on.replay.valid[0].any() and off.replay.valid[:k].all()
    for field in ("obs", "action", "reward", "terminated", "truncated", "valid"):
        np.testing.assert_array_equal(getattr(on.replay, field)[1:k],
                                      getattr(off.replay, field)[:k - 1], err_msg=field)
        np.testing.assert_array_equal(getattr(on.pending, field),
                                      getattr(off.replay, field)[k - 1], err_msg=field)
    assert off.pending is None
    path = str(tmp_path / "c.npz")
    checkpoint.save(path, on, {"algo": "d4pg"})
    with pytest.raises(UserError, match=r"does not match this configuration .*it has \.pending"):
        checkpoint.load(path, jax.eval_shape(init[False], jax.random.PRNGKey(0)), {"algo": "d4pg"})


def test_env_groups_change_the_schedule_of_host_calls_and_no_state(monkeypatch):
    """$RL_ENV_GROUPS=2: D4PG's overlapped iterations, updates included, end
    in the same state bit for bit as with one group, from two host starts
    per step; a value that does not divide the envs is one clear error."""
    from algos import d4pg
    from common import agent
    from common.errors import UserError
    config = d4pg.Config(env="cartpole_balance", backend="native", num_envs=4,
                         total_timesteps=40_000, learning_starts=16, buffer_size=64,
                         batch_size=8, hidden_sizes=(8, 8), num_atoms=11, eval_every=0,
                         checkpoint_every=0, overlap_physics=True)
    out = {}
    for groups in ("1", "2"):
        monkeypatch.setenv(agent.GROUPS_VAR, groups)
        train = d4pg.make_train(config)
        scan = lambda s: jax.lax.scan(train.iteration, s, jnp.arange(12))[0]
        starts = _host_calls(jax.make_jaxpr(train.iteration)(
            jax.eval_shape(train.init, jax.random.PRNGKey(0)), jnp.int32(5)).jaxpr, "host_start")
        assert len(starts) == int(groups)
        out[groups] = jax.device_get(jax.jit(scan)(train.init(jax.random.PRNGKey(3))))
    first = jax.device_get(train.init(jax.random.PRNGKey(3)))
    assert not all(np.array_equal(a, b) for a, b in zip(  # the updates ran
        jax.tree.leaves(first.critic_params), jax.tree.leaves(out["2"].critic_params)))
    for a, b in zip(jax.tree.leaves(out["1"]), jax.tree.leaves(out["2"])):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setenv(agent.GROUPS_VAR, "3")
    with pytest.raises(UserError, match=r"RL_ENV_GROUPS must .* divides --num-envs \(4\)"):
        jax.eval_shape(d4pg.make_train(config).iteration,
                       jax.eval_shape(train.init, jax.random.PRNGKey(0)), jnp.int32(5))


def test_split_times_report_physics_and_the_devices_wait(cartpole, monkeypatch, capsys):
    """RL_SPLIT_TIMES=N: every N split steps one stderr line of medians
    (physics, when the device asked for the results, how long it waited);
    results unchanged. Without it the worker returns the plain results."""
    from common.envs import native
    env = cartpole
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    acts = jnp.zeros((6, 3, env.action_size))

    @jax.jit
    def run(keys, acts):
        def body(s, a):
            s, out = env.step_while(s, a, None, lambda x: x + 1.0, jnp.zeros(()))
            return s, out
        return jax.lax.scan(body, jax.vmap(env.reset)(keys), acts)

    plain = jax.block_until_ready(run(keys, acts))
    assert capsys.readouterr().err.count("split step") == 0
    monkeypatch.setattr(native, "_SPLIT_TIMES", native.SplitTimes(3))
    timed = jax.block_until_ready(run.lower(keys, acts).compile()(keys, acts))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("split step")]
    assert len(lines) == 2, lines   # 6 steps, a line every 3
    physics = float(lines[0].split("physics ")[1].split(" ms")[0])
    assert physics > 0 and "waited" in lines[0] and "asked after the physics ended in" in lines[0]
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(timed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
