"""The ready-made accumulations: gnts's scale-free default against torch-gqc's absolute rule."""

import jax
import jax.numpy as jnp
import optax
import pytest

import optax_gqc


def _train(tx, num=400, microbatch=16, d=16, hidden=64, scale=10.0):
  """A tanh MLP regressing targets of scale ``scale``: gradient norms of about 25."""
  kx, kw, ke, k1, k2, kb = jax.random.split(jax.random.key(0), 6)
  x = jax.random.normal(kx, (4096, d))
  y = scale * (jnp.tanh(x @ jax.random.normal(kw, (d,))) + 0.3 * jax.random.normal(ke, (4096,)))
  params = {
      'w1': jax.random.normal(k1, (d, hidden)) / jnp.sqrt(d),
      'b1': jnp.zeros(hidden),
      'w2': jax.random.normal(k2, (hidden,)) / jnp.sqrt(hidden),
      'b2': jnp.zeros(()),
  }

  def loss(p, xb, yb):
    return jnp.mean((jnp.tanh(xb @ p['w1'] + p['b1']) @ p['w2'] + p['b2'] - yb) ** 2)

  def body(carry, idx):
    p, s = carry
    grads = jax.grad(loss)(p, x[idx], y[idx])
    p, s = optax_gqc.update_and_apply(tx, grads, s, p)
    return (p, s), optax.tree.norm(grads)

  batches = jax.random.randint(kb, (num, microbatch), 0, 4096)
  run = jax.jit(lambda p: jax.lax.scan(body, (p, tx.init(p)), batches))
  (params_end, state), norms = run(params)
  return float(loss(params, x, y)), float(loss(params_end, x, y)), state, norms


@pytest.mark.slow
def test_default_gnts_trains_where_an_absolute_threshold_starves():
  start, end, state, norms = _train(optax_gqc.gnts(optax.adamw(3e-3)))
  stats = optax_gqc.statistics(state)
  assert float(jnp.median(norms)) > 10  # gradient norms far above any threshold near 1
  assert end < 0.3 * start
  assert int(stats['num_forced']) <= 0.02 * int(stats['num_steps'])
  assert 400 / 8 < int(stats['num_steps']) < 400  # it accumulates, and steps often

  # torch-gqc's absolute rule at a threshold of 0.5: every step is forced
  # by max_draws, and statistics says so.
  start, starved, state, _ = _train(optax_gqc.gnts(optax.adamw(3e-3), 0.5, max_draws=32))
  stats = optax_gqc.statistics(state)
  assert int(stats['num_forced']) == int(stats['num_steps']) == 400 // 32
  assert starved > 2 * end


def test_gnts_takes_a_threshold_or_a_ratio_not_both():
  with pytest.raises(ValueError, match='threshold.*ratio'):
    optax_gqc.gnts(optax.sgd(0.1), 0.5, ratio=0.5)


def test_gnts_absolute_threshold_with_a_valve_steps_on_the_norm_test():
  # An absolute threshold far below the gradients' norms: alone it never opens;
  # with the valve, two microbatches pointing the same way pass the norm test.
  g = {'w': jnp.full(4, 3.0)}
  for eta, steps in ((None, 0), (0.5, 1)):
    tx = optax_gqc.gnts(optax.sgd(0.1), 1e-3, eta=eta, max_draws=8)
    state = tx.init({'w': jnp.zeros(4)})
    for _ in range(2):
      _, state = jax.jit(tx.update)(g, state)
    assert int(state.num_steps) == steps
