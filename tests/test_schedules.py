"""Tests of the schedule primitives."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from optax_gqc import schedules

L, M = 10, 50
STEPS = np.arange(0, M + 30)  # past M too: ours hold the final value


def warm(w, t):
  return w * t / L


def inverse_warm(w, r, t):
  return w * (r - (r - 1) * t / L)


def progress(t):
  return min(max((t - L) / (M - L), 0.0), 1.0)


def cosine(w, a, t):
  return a + (w - a) * math.cos(math.pi / 2 * progress(t))


def poly(w, a, power, t):
  return a + (w - a) * (1 - progress(t)) ** power


CASES = {
    'constant_with_warmup': (
        schedules.constant_with_warmup(2.0, L),
        lambda t: warm(2.0, t) if t < L else 2.0,
    ),
    'constant_with_inverse_warmup': (
        schedules.constant_with_inverse_warmup(2.0, L, 5.0),
        lambda t: inverse_warm(2.0, 5.0, t) if t < L else 2.0,
    ),
    'cosine_with_warmup': (
        schedules.cosine_with_warmup(1.0, 0.1, L, M),
        lambda t: warm(1.0, t) if t < L else cosine(1.0, 0.1, t),
    ),
    'cosine_with_inverse_warmup': (
        schedules.cosine_with_inverse_warmup(0.95, 0.25, L, M, 10.0),
        lambda t: inverse_warm(0.95, 10.0, t) if t < L else cosine(0.95, 0.25, t),
    ),
    'polynomial_with_warmup': (
        schedules.polynomial_with_warmup(64.0, 512.0, L, M, 2.0),
        lambda t: warm(64.0, t) if t < L else poly(64.0, 512.0, 2.0, t),
    ),
    'polynomial_with_inverse_warmup': (
        schedules.polynomial_with_inverse_warmup(1.0, 0.0, L, M, 0.5, 3.0),
        lambda t: inverse_warm(1.0, 3.0, t) if t < L else poly(1.0, 0.0, 0.5, t),
    ),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_schedule_matches_formula_and_is_clamped(name):
  schedule, formula = CASES[name]
  ours = np.asarray(jax.jit(jax.vmap(schedule))(jnp.asarray(STEPS)))
  np.testing.assert_allclose(ours, [formula(int(t)) for t in STEPS], rtol=1e-6, atol=1e-6)
  assert ours[-1] == ours[M]  # held after M


def test_zero_warmup_and_total_not_after_warmup():
  f = schedules.cosine_with_warmup(1.0, 0.0, 0, 0)
  assert float(f(0)) == 0.0  # torch-schedule-anything: progress 1 when M <= L
  g = schedules.cosine_with_inverse_warmup(1.0, 0.0, 0, 100, 10.0)
  assert float(g(0)) == 1.0 and float(g(100)) == 0.0 and float(g(10**6)) == 0.0


@pytest.mark.parametrize('bad', [-1, 2.5, True, np.int64(-1)])
def test_bad_step_counts_raise(bad):
  with pytest.raises(ValueError, match='warmup_steps'):
    schedules.cosine_with_warmup(1.0, 0.0, bad, 10)
  with pytest.raises(ValueError, match='total_steps'):
    schedules.cosine_with_warmup(1.0, 0.0, 2, bad)


def test_numpy_step_counts_are_counts():
  ours = schedules.cosine_with_warmup(1.0, 0.0, np.int64(5), np.int32(20))
  same = schedules.cosine_with_warmup(1.0, 0.0, 5, 20)
  assert [float(ours(t)) for t in range(22)] == [float(same(t)) for t in range(22)]


@pytest.mark.parametrize('bad', [-1.0, float('nan'), float('inf'), jnp.asarray(-2.0)])
def test_a_warmup_multiplier_out_of_its_domain_raises(bad):
  with pytest.raises(ValueError, match='warmup_multiplier must be a finite number >= 0'):
    schedules.constant_with_inverse_warmup(1.0, 5, warmup_multiplier=bad)


def test_a_warmup_multiplier_may_be_an_array_or_traced():
  want = float(schedules.constant_with_inverse_warmup(1.0, 5, 10.0)(2))
  assert float(schedules.constant_with_inverse_warmup(1.0, 5, jnp.asarray(10.0))(2)) == want
  traced = jax.jit(lambda r: schedules.constant_with_inverse_warmup(1.0, 5, r)(2))
  assert float(traced(10.0)) == want


@pytest.mark.parametrize('power', [-1.0, float('nan'), float('inf'), '2', True, jnp.float32(2)])
def test_a_power_below_zero_or_not_a_number_raises(power):
  # (1 - p)^power with a negative power grows to inf at the end of the run.
  for make in (schedules.polynomial_with_warmup, schedules.polynomial_with_inverse_warmup):
    with pytest.raises(ValueError, match='power must be a number >= 0'):
      make(1.0, 0.1, 2, 10, power=power)


def test_values_may_be_arrays_or_traced_but_not_nan_or_strings():
  both = schedules.cosine_with_warmup(jnp.array([1.0, 2.0]), 0.0, 10, 100)(50)
  each = [schedules.cosine_with_warmup(v, 0.0, 10, 100)(50) for v in (1.0, 2.0)]
  np.testing.assert_array_equal(both, each)
  traced = jax.jit(lambda v: schedules.constant_with_warmup(v, 10)(20))(3.0)
  assert float(traced) == 3.0
  for bad, error in ((math.nan, ValueError), (jnp.array([1.0, math.inf]), ValueError)):
    with pytest.raises(error, match='peak_value must be finite'):
      schedules.cosine_with_warmup(bad, 0.0, 10, 100)
  with pytest.raises(TypeError, match='value must be a number'):
    schedules.constant_with_warmup('abc', 10)
  with pytest.raises(ValueError, match='total_steps must be an int >= 0, got None'):
    schedules.polynomial_with_warmup(1.0, 0.0, 10, None)
  with pytest.raises(ValueError, match=r'warmup_steps must be an int >= 0, got .*: pass int\(x\)'):
    schedules.constant_with_warmup(1.0, jnp.int32(10))
  with pytest.raises(ValueError, match=r'warmup_steps must be below 2\*\*31'):
    schedules.constant_with_warmup(1.0, 2**31)  # failed at its first call, in JAX's words
