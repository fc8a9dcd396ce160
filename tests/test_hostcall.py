"""hostcall.call(pack=True): one operand each way, the same values as unpacked."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from common import hostcall

SHAPES = (jax.ShapeDtypeStruct((2, 3), jnp.float32), jax.ShapeDtypeStruct((), jnp.bool_),
          jax.ShapeDtypeStruct((4,), jnp.uint32), jax.ShapeDtypeStruct((), jnp.int8))


def host(x, flags, d):
    """Every packable kind in and out; lead axes (vmap) kept on each."""
    lead = flags.shape
    return (x[..., :2, :3] * 2 + d["i"][..., None, None].astype(np.float32),
            ~flags, np.broadcast_to(d["u"][..., :1] + np.arange(4, dtype=np.uint32), lead + (4,)),
            (d["i"] - 3).astype(np.int8))


def args():
    k = jax.random.split(jax.random.PRNGKey(0), 2)
    x = jax.random.normal(k[0], (2, 3, 3)).at[0, 0, 0].set(jnp.nan)  # NaN's bits go through
    flags = jnp.array([True, False])
    d = {"i": jnp.array([-5, 7], jnp.int32),
         "u": jax.random.bits(k[1], (2, 5), jnp.uint32)}
    return x, flags, d


@pytest.mark.parametrize("nested", [False, True])
def test_packed_call_returns_what_the_unpacked_one_does_under_vmap(nested):
    def f(pack):
        g = jax.vmap(lambda x, fl, d: hostcall.call(host, SHAPES, x, fl, d, pack=pack))
        if nested:  # a second batch axis, as seeds x envs
            g = jax.vmap(g)
        return jax.jit(g)

    a = args()
    if nested:
        a = jax.tree.map(lambda v: jnp.stack([v, v[::-1]]), a)
    plain, packed = f(False)(*a), f(True)(*a)
    for p, q, s in zip(plain, packed, SHAPES):
        assert q.dtype == s.dtype and q.shape == p.shape
        np.testing.assert_array_equal(np.asarray(p).view(np.uint8), np.asarray(q).view(np.uint8))
    # one operand to the host and one result back
    jaxpr = jax.make_jaxpr(lambda *a: hostcall.call(host, SHAPES, *a, pack=True))(
        *jax.tree.map(lambda v: v[0], args()))
    eqn, = [e for e in jaxpr.eqns if e.primitive.name == "host_call"]
    assert len(eqn.invars) == 1 and len(eqn.outvars) == 1


def test_pack_refuses_what_it_cannot_carry_exactly():
    with pytest.raises(TypeError, match="pack=True"):
        jax.jit(lambda x: hostcall.call(lambda a: a, jax.ShapeDtypeStruct((2,), jnp.float16), x,
                                        pack=True))(jnp.ones(2, jnp.float16))
