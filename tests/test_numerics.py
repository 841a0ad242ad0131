"""Tests of optax_gqc._numerics.one_kernel: each scalar as it was, out of one kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import optax_gqc
from optax_gqc import _accumulation
from optax_gqc._numerics import one_kernel
from tests._helpers import PARAMS, grad_stream

# Values that an addition of +0.0, a rounding or a cast would change.
SCALARS = {
    'f32': np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, 1e-45, -3.4e38], np.float32),
    'f16': np.array([-0.0, 6.1e-5, -65504.0, np.nan], np.float16),
    'bf16': np.array([-0.0, 1.5, -np.inf], jnp.bfloat16),
    'i32': np.array([np.iinfo(np.int32).min, -1, 0, np.iinfo(np.int32).max], np.int32),
    'u8': np.array([0, 255], np.uint8),
    'bool': np.array([False, True]),
    'c64': np.array([complex(-0.0, -0.0), complex(np.nan, -1.0)], np.complex64),
}


def _fresh(tree):
  """Equal values that are new arrays to the tracer: what one_kernel packs."""
  return jax.tree.map(lambda x: jax.lax.optimization_barrier(x), tree)


@pytest.mark.cpu_only('NaN payloads: XLA:GPU writes its own NaN')
def test_one_kernel_returns_each_scalar_bit_for_bit():
  old = {name: list(values) for name, values in SCALARS.items()}
  new = jax.jit(lambda old: one_kernel(_fresh(old), old))(old)
  for name, values in SCALARS.items():
    got = np.array([np.asarray(x) for x in new[name]])
    assert got.dtype == values.dtype, name
    np.testing.assert_array_equal(got.view(np.uint8), values.view(np.uint8), err_msg=name)


def test_one_kernel_passes_old_leaves_arrays_and_weak_scalars_through():
  def check(old):
    new = dict(old, strict=old['strict'] * 2, count=old['count'] + 1)
    new.update(weak=old['weak'] + 1, vector=old['vector'] + 1)
    out = one_kernel(new, old)
    assert out['same'] is old['same']  # a donated buffer stays where it is
    assert out['vector'] is new['vector'] and out['weak'] is new['weak']
    assert out['strict'] is not new['strict'] and out['count'] is not new['count']
    return out

  old = {
      'strict': jnp.float32(1.0),
      'count': jnp.int32(0),
      'same': jnp.int32(7),
      'weak': jnp.asarray(1.0),
      'vector': jnp.zeros(3),
  }
  shapes = jax.eval_shape(check, old)
  assert jax.tree.map(lambda x: (x.dtype, x.weak_type), shapes) == jax.tree.map(
      lambda x: (x.dtype, x.aval.weak_type), old
  )
  out = jax.jit(check)(old)
  assert [float(out[k]) for k in ('strict', 'count', 'same', 'weak')] == [2.0, 1.0, 7.0, 2.0]
  np.testing.assert_array_equal(out['vector'], np.ones(3))


def test_one_kernel_under_vmap_and_grad():
  def pack(x):
    old = {'a': x, 'b': x, 'n': jnp.int32(0)}
    return one_kernel({'a': 2 * x, 'b': jnp.sin(x), 'n': old['n'] + 1}, old)

  xs = jnp.linspace(-1.0, 1.0, 5)
  out = jax.jit(jax.vmap(pack))(xs)
  np.testing.assert_array_equal(out['a'], 2 * xs)
  np.testing.assert_array_equal(out['b'], jnp.sin(xs))
  np.testing.assert_array_equal(out['n'], np.ones(5, np.int32))
  grad = jax.jit(jax.grad(lambda x: pack(x)['a'] + pack(x)['b']))(0.5)
  np.testing.assert_allclose(grad, 2 + np.cos(0.5), rtol=1e-6)


def test_one_kernel_inside_shard_map_with_scalars_that_vary_and_do_not():
  mesh = Mesh(np.array(jax.devices()[:1]), ('x',))

  def pack(v):
    old = (v[0], v[0], jnp.float32(0), jnp.int32(0))
    new = one_kernel((old[0] + 1, old[1] * 3, old[2] + 2, old[3] + 4), old)
    return jnp.stack(new[:2]), new[2], new[3]  # varying across 'x', and not

  out = jax.jit(jax.shard_map(pack, mesh=mesh, in_specs=P('x'), out_specs=(P('x'), P(), P())))(
      jnp.ones(1)
  )
  np.testing.assert_array_equal(out[0], [2.0, 3.0])
  assert (float(out[1]), int(out[2])) == (2.0, 4)


def _fusions(fn, *args) -> int:
  return jax.jit(fn).lower(*args).compile().as_text().count(' fusion(')


@pytest.mark.cpu_only("XLA:CPU's fusions: XLA:GPU fuses the dozen scalars by itself")
def test_one_kernel_computes_the_scalars_in_one_fusion():
  def scalars(x):  # a dozen scalars, each from its own arithmetic
    return {f's{i}': jnp.sin(x[i]) / (x[i] + i + 1) for i in range(12)}

  old = {f's{i}': jnp.float32(0) for i in range(12)}
  x = jnp.arange(12.0)
  assert _fusions(lambda x, old: one_kernel(scalars(x), old), x, old) == 1
  assert _fusions(lambda x, old: scalars(x), x, old) >= 12
  np.testing.assert_equal(
      jax.jit(lambda x, old: one_kernel(scalars(x), old))(x, old), jax.jit(scalars)(x)
  )


def test_the_engine_computes_its_new_scalars_in_one_fusion(monkeypatch):
  def fusions():
    tx = optax_gqc.gnts(optax.adamw(1e-3))
    return _fusions(tx.update, grad_stream(1)[0], tx.init(PARAMS), PARAMS)

  packed = fusions()
  monkeypatch.setattr(_accumulation, 'one_kernel', lambda new, old=None: new)
  unpacked = fusions()
  # A dozen counters, running sums and EMAs, the gate's state, and what it reads.
  assert packed <= unpacked - 12
