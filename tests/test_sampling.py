"""AdAdaGrad's sampling tests against a direct numpy computation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optax_gqc import sampling


@pytest.fixture(name='grads')
def fixture_grads():
  rng = np.random.default_rng(0)
  b = 12
  signal = {'a': rng.standard_normal((3, 4)), 'b': rng.standard_normal(5)}
  return {
      k: jnp.asarray(v + 0.8 * rng.standard_normal((b, *v.shape)), jnp.float32)
      for k, v in signal.items()
  }


def as_matrix(grads):
  leaves = jax.tree.leaves(grads)
  return np.concatenate([np.asarray(x, np.float64).reshape(x.shape[0], -1) for x in leaves], 1)


def test_statistics_against_numpy(grads):
  g = as_matrix(grads)
  b = g.shape[0]
  mean = g.mean(0)
  mean_sq = mean @ mean
  norm_stat = np.var(g, axis=0, ddof=1).sum() / b
  inner_stat = np.var(g @ mean, ddof=1) / b
  orth = g - np.outer(g @ mean / mean_sq, mean)
  orth_stat = np.sum(orth**2) / (b * (b - 1))
  cases = [
      (jax.jit(sampling.norm_test, static_argnums=1)(grads, 0.5), norm_stat, 0.25 * mean_sq),
      (sampling.inner_product_test(grads, 0.3), inner_stat, 0.09 * mean_sq**2),
      (sampling.orthogonality_test(grads, 0.7), orth_stat, 0.49 * mean_sq),
  ]
  for result, stat, bound in cases:
    assert float(result.statistic) == pytest.approx(stat, rel=1e-5)
    assert float(result.bound) == pytest.approx(bound, rel=1e-5)
    assert bool(result.passed) == (stat <= bound)

  norm_size = int(np.ceil(max(b, norm_stat * b / (0.25 * mean_sq))))
  assert int(sampling.propose_batch_size(grads, eta=0.5)) == norm_size
  aug = max(inner_stat * b / (0.09 * mean_sq**2), orth_stat * b / (0.49 * mean_sq))
  assert int(sampling.propose_batch_size(grads, theta=0.3, nu=0.7)) == int(np.ceil(max(b, aug)))


def test_a_complex_gradient_is_its_real_and_imaginary_parts(grads):
  # As the real vector of twice the size: .astype(float32) kept the real part.
  complex_grads = {'z': grads['a'] + 1j * grads['a'][:, ::-1], 'b': grads['b']}
  real_grads = {'re': grads['a'], 'im': grads['a'][:, ::-1], 'b': grads['b']}
  for test, arg in ((sampling.norm_test, 0.5), (sampling.inner_product_test, 0.3)):
    got, want = test(complex_grads, arg), test(real_grads, arg)
    assert float(got.statistic) == pytest.approx(float(want.statistic), rel=1e-5)
    assert float(got.bound) == pytest.approx(float(want.bound), rel=1e-5)
  assert int(sampling.propose_batch_size(complex_grads, eta=0.5)) == int(
      sampling.propose_batch_size(real_grads, eta=0.5)
  )


def test_proposal_never_decreases_and_is_capped(grads):
  b = 12
  assert int(sampling.propose_batch_size(grads, eta=1e6)) == b  # passes easily: keep b
  assert int(sampling.propose_batch_size(grads, eta=1e-3, max_batch_size=50)) == 50
  zero_mean = jax.tree.map(lambda x: jnp.concatenate([x[:6], -x[:6]]), grads)
  assert int(sampling.propose_batch_size(zero_mean, eta=0.5, max_batch_size=64)) == 64


def test_a_traced_cap_caps_under_jit(grads):
  propose = jax.jit(lambda g, cap: sampling.propose_batch_size(g, eta=1e-3, max_batch_size=cap))
  assert int(propose(grads, 50)) == 50
  assert int(propose(grads, 2**31 - 1)) == int(sampling.propose_batch_size(grads, eta=1e-3))


def test_per_example_gradients_from_vmap_grad():
  def loss(w, x, y):
    return 0.5 * (x @ w - y) ** 2

  x = jax.random.normal(jax.random.key(0), (64, 4))
  y = x @ jnp.array([1.0, -1.0, 2.0, 0.0]) + 3.0 * jax.random.normal(jax.random.key(1), (64,))
  per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(jnp.zeros(4), x, y)
  assert per_example.shape == (64, 4)
  small = sampling.norm_test(per_example[:4], eta=0.3)
  large = sampling.norm_test(per_example, eta=0.3)
  assert float(small.statistic) > float(large.statistic)  # variance of the mean falls with b


@pytest.mark.parametrize(
    'kwargs, match',
    [
        ({}, 'either eta'),
        ({'eta': 0.5, 'theta': 0.1}, 'either eta'),
        ({'theta': 0.1}, 'both'),
        ({'eta': -0.5}, 'eta must be > 0'),
        ({'eta': float('nan')}, 'eta must be > 0'),
        ({'theta': 0.0, 'nu': 0.5}, 'theta must be > 0'),
        ({'theta': 0.5, 'nu': -1.0}, 'nu must be > 0'),
        ({'eta': 0.5, 'max_batch_size': 0}, 'max_batch_size'),
        ({'eta': 0.5, 'max_batch_size': 6}, r'max_batch_size \(6\) is below the batch .* \(12\)'),
    ],
)
def test_bad_proposal_arguments(grads, kwargs, match):
  with pytest.raises(ValueError, match=match):
    sampling.propose_batch_size(grads, **kwargs)


@pytest.mark.parametrize(
    'test, name',
    [
        (sampling.norm_test, 'eta'),
        (sampling.inner_product_test, 'theta'),
        (sampling.orthogonality_test, 'nu'),
    ],
)
def test_a_test_parameter_must_be_positive(grads, test, name):
  # A negative one acted as its absolute value (it is squared); a NaN one failed every test.
  for bad in (-0.5, float('nan')):
    with pytest.raises(ValueError, match=f'{name} must be > 0'):
      test(grads, bad)


def test_needs_two_samples():
  with pytest.raises(ValueError, match='at least 2'):
    sampling.norm_test({'w': jnp.ones((1, 3))}, 0.5)


@pytest.mark.parametrize('power', [-60, -40, 40, 60])
def test_the_decisions_hold_at_any_gradient_scale(grads, power):
  # The inner-product test's fourth powers leave float32 near gradients of 1e10 and 1e-10.
  tests = ((sampling.norm_test, 0.2, 2), (sampling.inner_product_test, 0.1, 4))
  tests += ((sampling.orthogonality_test, 0.2, 2),)
  scaled = jax.tree.map(lambda x: x * 2.0**power, grads)
  for test, arg, degree in tests:
    want, got = test(grads, arg), test(scaled, arg)
    assert bool(got.passed) == bool(want.passed)
    if abs(power * degree) < 100:  # in float32's range: the same numbers, in the new units
      assert float(got.statistic) == pytest.approx(float(want.statistic) * 2.0 ** (power * degree))
      assert float(got.bound) == pytest.approx(float(want.bound) * 2.0 ** (power * degree))
  assert {bool(test(grads, arg).passed) for test, arg, _ in tests} == {True, False}
  for kwargs in ({'eta': 0.1}, {'theta': 0.1, 'nu': 0.1}):
    want = int(sampling.propose_batch_size(grads, **kwargs))
    assert int(sampling.propose_batch_size(scaled, **kwargs)) == want > 12


def test_equal_or_non_finite_gradients_propose_the_batch(grads):
  # Each went to the cap, 2**31 - 1.
  broken = [{**grads, 'b': grads['b'].at[0, 0].set(bad)} for bad in (np.nan, np.inf)]
  for kwargs in ({'eta': 0.5}, {'theta': 0.3, 'nu': 0.7}):
    for g in ({'a': jnp.zeros((12, 5))}, {'a': jnp.ones((12, 5))}, *broken):
      assert int(sampling.propose_batch_size(g, **kwargs)) == 12
  # As before: equal gradients pass the norm test, broken ones fail it, and a zero mean
  # with spread asks for the cap.
  assert bool(sampling.norm_test({'a': jnp.ones((12, 5))}, 0.5).passed)
  assert not any(bool(sampling.norm_test(g, 0.5).passed) for g in broken)
  zero_mean = jax.tree.map(lambda x: jnp.concatenate([x[:6], -x[:6]]), grads)
  for kwargs in ({'eta': 0.5}, {'theta': 0.3, 'nu': 0.7}):
    assert int(sampling.propose_batch_size(zero_mean, max_batch_size=64, **kwargs)) == 64


def test_a_zero_mean_with_spread_fails_every_test_and_zero_gradients_pass_them(grads):
  # The inner-product test passed on it (0 <= 0), and the orthogonality test
  # read 0/0 (a NaN statistic) on it and on all-zero gradients alike.
  zero_mean = jax.tree.map(lambda x: jnp.concatenate([x[:6], -x[:6]]), grads)
  zeros = jax.tree.map(jnp.zeros_like, grads)
  tests = (
      lambda g: sampling.norm_test(g, 0.5),
      lambda g: sampling.inner_product_test(g, 0.3),
      lambda g: sampling.orthogonality_test(g, 0.7),
  )
  for test in tests:
    spread, still = test(zero_mean), test(zeros)
    assert spread.passed.dtype == jnp.bool_ and not bool(spread.passed)
    assert bool(still.passed) and np.isfinite(float(still.statistic))
  assert np.isfinite(float(tests[2](zero_mean).statistic))
