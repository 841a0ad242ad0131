"""Tests of scale_to_norm / gnr (GNTS and SBC are tested with the engine)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from tests._helpers import selectable_conds


def grads(num, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(3), num)
  return [
      {'a': jax.random.normal(keys[i], (4, 3)).astype(dtype), 'b': jnp.arange(3.0).astype(dtype)}
      for i in range(num)  # indexed: iterating compiles an unstack program per length
  ]


def test_scale_to_norm_hits_a_scheduled_target():
  tx = optax_gqc.scale_to_norm(lambda t: 1.0 + t)
  update = jax.jit(tx.update)
  state = tx.init(grads(1)[0])
  for t, g in enumerate(grads(4)):
    updates, state = update(g, state)
    assert float(optax.tree.norm(updates)) == pytest.approx(1.0 + t, rel=1e-6)
    scale = (1.0 + t) / optax.tree.norm(g)
    chex.assert_trees_all_close(updates, optax.tree.scale(scale, g), rtol=1e-6)  # same direction
    assert float(state.grad_norm) == pytest.approx(float(optax.tree.norm(g)), rel=1e-6)
    assert float(state.target) == 1.0 + t


def test_scale_to_norm_of_zero_gradient_is_zero():
  tx = optax_gqc.scale_to_norm(3.0)
  zero = jax.tree.map(jnp.zeros_like, grads(1)[0])
  updates, _ = jax.jit(tx.update)(zero, tx.init(zero))
  assert all(np.all(np.asarray(u) == 0) for u in jax.tree.leaves(updates))


@pytest.mark.parametrize('magnitude', [1e-25, 1e-21, 1e20, 1e25])
@pytest.mark.parametrize('complex_leaf', [False, True])
def test_a_gradient_whose_squared_norm_leaves_float32s_range_still_hits_its_target(
    magnitude, complex_leaf
):
  # Its squares flush to 0 or overflow: the plain norm gave a zero update.
  g = {'w': jnp.full(4, magnitude, jnp.float32), 'b': jnp.zeros(0)}
  if complex_leaf:
    g['z'] = jnp.full(2, 1j * magnitude, jnp.complex64)
  true_norm = magnitude * (6.0 if complex_leaf else 4.0) ** 0.5
  tx = optax_gqc.scale_to_norm(3.0)
  updates, state = jax.jit(tx.update)(g, tx.init(g))
  assert float(state.grad_norm) == pytest.approx(true_norm, rel=1e-6)
  assert float(optax.tree.norm(updates)) == pytest.approx(3.0, rel=1e-6)
  np.testing.assert_allclose(updates['w'], 3.0 / true_norm * magnitude, rtol=1e-6)


def test_a_norm_whose_small_squares_flushed_is_not_short():
  # The sum of squares is above float32's smallest normal while most squares
  # have flushed to 0: the norm must not be read from it.
  g = {'w': jnp.full(10_000, 1e-19, jnp.float32).at[0].set(1.2e-19)}
  tx = optax_gqc.scale_to_norm(1.0)
  updates, state = jax.jit(tx.update)(g, tx.init(g))
  assert float(state.grad_norm) == pytest.approx(1e-17, rel=1e-4)
  assert float(optax.tree.norm(updates)) == pytest.approx(1.0, rel=1e-5)


@pytest.mark.cpu_only('XLA:CPU flushes subnormals to 0, as the docstring says')
def test_a_subnormal_gradient_gives_a_zero_update():
  g = {'w': jnp.array([1e-40, 2e-40], jnp.float32)}
  tx = optax_gqc.scale_to_norm(1.0)
  updates, state = jax.jit(tx.update)(g, tx.init(g))
  assert float(state.grad_norm) == 0.0
  np.testing.assert_array_equal(updates['w'], 0.0)


def test_the_rescaled_norm_is_a_branch_xla_keeps_and_has_a_derivative():
  tx = optax_gqc.scale_to_norm(1.0)
  g = {'w': jnp.array([1e-25, 2e-25])}
  assert selectable_conds(lambda g: tx.update(g, tx.init(g))[0], g) == [False]

  def grad_norm(w):
    return tx.update({'w': w}, tx.init({'w': w}))[1].grad_norm

  np.testing.assert_allclose(jax.grad(grad_norm)(g['w']), [0.4472136, 0.8944272], rtol=1e-6)


def test_a_bad_scheduled_target_gives_a_zero_update_and_is_counted():
  # A negative target would reverse the step; NaN and inf would poison the params.
  targets = [1.0, -0.5, np.nan, np.inf, 2.0]
  tx = optax_gqc.scale_to_norm(lambda t: jnp.asarray(targets)[t])
  update = jax.jit(tx.update)
  state = tx.init(grads(1)[0])
  for t, g in enumerate(grads(len(targets))):
    updates, state = update(g, state)
    good = np.isfinite(targets[t]) and targets[t] >= 0
    expected = targets[t] if good else 0.0
    assert float(optax.tree.norm(updates)) == pytest.approx(expected, rel=1e-6)
  assert int(state.num_bad_hyperparams) == 3
  # statistics adds it to an accumulation's own count.
  tx = optax_gqc.sbc(optax.chain(optax_gqc.scale_to_norm(lambda t: -1.0), optax.sgd(0.1)), 1, 1)
  params = grads(1)[0]
  state = tx.init(params)
  for g in grads(2):
    _, state = jax.jit(tx.update)(g, state, params)
  assert int(optax_gqc.statistics(state)['num_bad_hyperparams']) == 2


def test_an_integer_update_is_refused_not_truncated():
  # [3, 4] scaled to norm 2 became [1, 1], and to norm 0.5 a zero update.
  tx = optax_gqc.scale_to_norm(2.0)
  g = {'w': jnp.array([3, 4]), 'b': jnp.ones(2)}
  with pytest.raises(TypeError, match=r"\['w'\] has dtype int32.*Cast it to a float"):
    jax.jit(tx.update)(g, tx.init(g))


def test_scale_to_norm_keeps_bf16():
  g = grads(1, jnp.bfloat16)[0]
  tx = optax_gqc.scale_to_norm(1.0)
  updates, _ = jax.jit(tx.update)(g, tx.init(g))
  assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(updates))
  assert float(optax.tree.norm(updates)) == pytest.approx(1.0, rel=1e-2)


def test_gnr_is_adam_on_rescaled_gradients():
  stream = grads(5)
  params = jax.tree.map(jnp.zeros_like, stream[0])
  tx = optax_gqc.gnr(optax.adam(1e-2), target=0.5)
  ref = optax.adam(1e-2)
  s, s_ref = tx.init(params), ref.init(params)
  for g in stream:
    u, s = jax.jit(tx.update)(g, s, params)
    u_ref, s_ref = ref.update(optax.tree.scale(0.5 / optax.tree.norm(g), g), s_ref)
    chex.assert_trees_all_close(u, u_ref, rtol=1e-5, atol=1e-8)
