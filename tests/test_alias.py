"""The ready-made accumulations: gnts's noise-following default, its relative mode, and
torch-gqc's absolute rule."""

import functools

import chex
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


@pytest.mark.parametrize(
    'kwargs',
    [
        {'threshold': 0.5, 'ratio': 0.5},
        {'threshold': 0.5, 'fraction': 0.5},
        {'ratio': 0.5, 'fraction': 0.5},
    ],
)
def test_gnts_takes_one_of_threshold_ratio_and_fraction(kwargs):
  with pytest.raises(ValueError, match='at most one of threshold'):
    optax_gqc.gnts(optax.sgd(0.1), **kwargs)


def test_gnts_eta_needs_the_relative_or_absolute_mode():
  with pytest.raises(ValueError, match='eta is the norm test'):
    optax_gqc.gnts(optax.sgd(0.1), eta=0.5)
  with pytest.raises(ValueError, match='scale_by_draws must be'):
    optax_gqc.gnts(optax.sgd(0.1), scale_by_draws='sqrt')


def _noisy_stream(noise_scales, num, d=512, seed=0):
  """Microbatch gradients G + noise with |G|^2 = 1 and tr(Sigma) = B, B per phase."""
  direction = jnp.ones(d) / jnp.sqrt(d)
  keys = jax.random.split(jax.random.key(seed), len(noise_scales))
  phases = [
      direction + jnp.sqrt(b / d) * jax.random.normal(k, (num, d))
      for b, k in zip(noise_scales, keys, strict=True)
  ]
  return {'w': jnp.concatenate(phases)}


def _draws_per_step(tx, grads):
  """Runs ``tx`` over the stream: the microbatches averaged at each step, in order."""
  params = {'w': jnp.zeros(grads['w'].shape[1])}

  def body(state, g):
    _, state = tx.update(g, state, params)
    return state, (state.num_draws == 0, state.last_num_draws)

  _, (stepped, draws) = jax.jit(lambda s: jax.lax.scan(body, s, grads))(tx.init(params))
  return draws[stepped]


def test_default_gnts_batch_follows_the_noise_scale():
  # The noise scale is 4 microbatches, then 60: the default steps on about
  # max(2, B / 2) microbatches in each phase.
  draws = _draws_per_step(optax_gqc.gnts(optax.sgd(0.1)), _noisy_stream((4.0, 60.0), 3000))
  first = draws[: len(draws) // 2]
  quiet = float(jnp.mean(first[10:100]))
  noisy = float(jnp.mean(draws[-20:]))
  assert 2.0 <= quiet <= 3.5
  assert 20.0 <= noisy <= 45.0
  # The relative mode is a fixed batch of about 1 / ratio^2 = 4 where noise dominates.
  relative = _draws_per_step(
      optax_gqc.gnts(optax.sgd(0.1), ratio=0.5), _noisy_stream((4.0, 60.0), 3000)
  )
  assert 3.0 <= float(jnp.mean(relative[-20:])) <= 7.0


@pytest.mark.parametrize(
    'make, scale',
    [
        (lambda inner: optax_gqc.gnts(inner), jnp.sqrt(2.0)),  # the default: sqrt(n)
        (lambda inner: optax_gqc.gnts(inner, scale_by_draws=None), 1.0),
        (lambda inner: optax_gqc.gnts(inner, threshold=0.0, max_draws=2), 1.0),  # parity
        (lambda inner: optax_gqc.gnts(inner, ratio=0.0, max_draws=2), 1.0),
        (lambda inner: optax_gqc.sbc(inner, 2, 1, scale_by_draws=lambda n: n), 2.0),
        (
            lambda inner: optax_gqc.noise_ratio_accumulation(
                inner, 0.0, max_draws=2, scale_by_draws=jnp.sqrt
            ),
            jnp.sqrt(2.0),
        ),
        (
            lambda inner: optax_gqc.norm_test_accumulation(
                inner, 0.0, max_draws=2, scale_by_draws=jnp.sqrt
            ),
            jnp.sqrt(2.0),
        ),
        (
            lambda inner: optax_gqc.mht(inner, 0.9, 0.0, max_draws=2, scale_by_draws=jnp.sqrt),
            jnp.sqrt(2.0),
        ),
    ],
)
def test_the_step_follows_the_batch(make, scale):
  # Two microbatches per step (the default's bootstrap, or forced): sgd(1)'s
  # update is the mean gradient times the scale.
  tx = make(optax.sgd(1.0))
  params = {'w': jnp.zeros(3)}
  state = tx.init(params)
  update = jax.jit(functools.partial(tx.update, value=jnp.float32(1.0)))
  _, state = update({'w': jnp.full(3, 1.0)}, state, params)
  updates, state = update({'w': jnp.full(3, 3.0)}, state, params)
  assert int(state.num_steps) == 1
  chex.assert_trees_all_close(updates, {'w': jnp.full(3, -2.0 * scale)}, rtol=1e-6)


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


@pytest.mark.parametrize('size, reported', [(None, 0), (8, 8)])
def test_default_gnts_reports_the_microbatch_size_it_was_given(size, reported):
  state = optax_gqc.gnts(optax.sgd(0.1), microbatch_size=size).init({'w': jnp.zeros(2)})
  assert int(optax_gqc.statistics(state)['microbatch_size']) == reported


@pytest.mark.parametrize(
    'make',
    [
        lambda **kw: optax_gqc.gnts(optax.sgd(0.1), max_draws=4, **kw),
        lambda **kw: optax_gqc.sbc(optax.sgd(0.1), 2, 1, **kw),
        lambda **kw: optax_gqc.noise_ratio_accumulation(optax.sgd(0.1), 0.0, max_draws=2, **kw),
        lambda **kw: optax_gqc.norm_test_accumulation(optax.sgd(0.1), 0.0, max_draws=2, **kw),
        lambda **kw: optax_gqc.mht(optax.sgd(0.1), 0.9, 0.0, max_draws=2, **kw),
    ],
    ids=['gnts', 'sbc', 'noise_ratio', 'norm_test', 'mht'],
)
def test_noise_decay_reaches_the_engine(make):
  def noise_weight(**kw):
    tx = make(**kw)
    params = {'w': jnp.zeros(3)}
    state = tx.init(params)
    for i in range(12):  # steps of two microbatches or more
      g = {'w': jnp.array([1.0, -1.0, 0.5]) * (1 + i % 3)}
      _, state = jax.jit(tx.update)(g, state, params, value=1.0 + i % 2)
    return float(state.noise.weight)

  assert noise_weight(noise_decay=0.0) == 1.0  # 1 - 0**k: the last estimate alone
  assert 0.0 < noise_weight() < 0.1  # 1 - 0.99**k after a few steps


@pytest.mark.parametrize('dtype', [jnp.complex64, jnp.bfloat16])
def test_inject_hyperparams_leaves_the_default_noise_decay_alone(dtype):
  # A float default would be injected and cast to the params' dtype: complex
  # refused, bfloat16 0.98828125.
  params = {'w': jnp.zeros(3, dtype)}
  tx = optax.inject_hyperparams(optax_gqc.sbc)(
      optax.sgd(0.1), logical_batch_size=16, microbatch_size=8
  )
  state = tx.init(params)
  assert 'noise_decay' not in state.hyperparams
  for i in range(2):
    _, state = jax.jit(tx.update)({'w': (jnp.arange(3.0) * (i + 1)).astype(dtype)}, state, params)
  assert float(state.inner_state.noise.weight) == pytest.approx(0.01, rel=1e-6)
