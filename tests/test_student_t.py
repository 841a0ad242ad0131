"""The on-device Student-t quantile and tail against scipy."""

import jax
import numpy as np
import pytest
from scipy import stats

from optax_gqc import _student_t
from optax_gqc._student_t import t_quantile


@pytest.mark.slow
def test_quantile_matches_scipy_for_df_1_to_200_and_confidence_half_to_0999():
  # Confidences as float32 values, compared with scipy at exactly those values.
  conf = np.concatenate([np.linspace(0.5, 0.999, 60), [0.9, 0.95, 0.99, 0.999]]).astype(np.float32)
  c, df = np.meshgrid(conf, np.arange(1, 201))
  ours = np.asarray(jax.jit(t_quantile)(c, df))
  ref = stats.t.ppf((1 + c.astype(np.float64)) / 2, df)
  np.testing.assert_allclose(ours, ref, rtol=1e-5)


def test_quantile_of_zero_confidence_is_zero():
  assert float(t_quantile(0.0, 5)) == 0.0


SMALL_DF = [1, 2, 5, 30, 257, 512]
LARGE_DF = [513, 1000, 3000, 7441, 8012, 9287, 10000]  # the error grows as sqrt(df)


@pytest.mark.parametrize(
    'confidence, rtol, dfs',
    [
        (0.01, 2e-4, SMALL_DF),
        (0.3, 1e-5, SMALL_DF),
        (0.999999, 1e-5, SMALL_DF),
        (0.01, 1e-3, LARGE_DF),
        (0.1, 1e-4, LARGE_DF),
        (0.3, 3e-5, LARGE_DF),
        (0.5, 3e-5, LARGE_DF),
        (0.999999, 3e-5, LARGE_DF),
    ],
)
def test_quantile_at_the_edges_is_as_accurate_as_its_docstring_says(confidence, rtol, dfs):
  df = np.array(dfs)
  ours = np.asarray(t_quantile(np.float32(confidence), df))
  ref = stats.t.ppf((1 + np.float64(np.float32(confidence))) / 2, df)
  np.testing.assert_allclose(ours, ref, rtol=rtol)


def test_quantile_of_a_tiny_confidence_is_not_negative():
  # float32's tail rounding gave -0.0xx at df 1000, and an interval with low > high.
  assert float(t_quantile(1e-6, 1000)) >= 0.0


@pytest.mark.slow
def test_two_sided_tail_matches_scipy_down_to_tiny_tails():
  x, df = np.meshgrid(np.linspace(0.0, 60.0, 241).astype(np.float32), np.arange(1, 513, 3))
  ours = np.asarray(jax.jit(_student_t.two_sided_tail)(x, df))
  ref = 2 * stats.t.sf(x.astype(np.float64), df)
  keep = ref > 1e-30
  np.testing.assert_allclose(ours[keep], ref[keep], rtol=1e-4)


def test_two_sided_tail_beyond_the_series_matches_scipy_down_to_tiny_tails():
  # Hill's approximation, from df = 513 to the largest int32.
  dfs = np.array([513, 600, 2000, 10**5, 10**7, 2**31 - 1])
  x, df = np.meshgrid(np.linspace(0.0, 60.0, 241).astype(np.float32), dfs)
  ours = np.asarray(jax.jit(_student_t.two_sided_tail)(x, df))
  ref = 2 * stats.t.sf(x.astype(np.float64), df.astype(np.float64))
  keep = ref > 1e-30
  np.testing.assert_allclose(ours[keep], ref[keep], rtol=1e-4)
  assert np.all(ours[~keep] < 1e-29)


def test_two_sided_tail_of_an_infinite_x_is_zero():
  df = np.array([1, 2, 511, 512, 513, 10**6], np.int32)
  tails = np.asarray(jax.jit(_student_t.two_sided_tail)(np.full(df.shape, np.inf, np.float32), df))
  np.testing.assert_array_equal(tails, 0.0)


@pytest.mark.parametrize('confidence', [0.0, 0.5, 0.9, 0.95, 0.999, 1 - 1e-6])
def test_quantile_by_df_matches_scipy_in_its_table_and_beyond(confidence):
  # The table up to df = 512, the Cornish-Fisher expansion from 513 to the largest int32.
  df = np.concatenate([np.arange(1, 600), [1000, 10**5, 10**7, 2**31 - 1]]).astype(np.int32)
  ours = np.asarray(jax.jit(_student_t.quantile_by_df(confidence))(df))
  ref = stats.t.ppf(0.5 + 0.5 * confidence, df.astype(np.float64))
  np.testing.assert_allclose(ours, ref, rtol=2e-7, atol=0)
