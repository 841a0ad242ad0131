r"""Adaptive-sampling tests on per-example gradients, and AdAdaGrad's batch-size rule.

Pure functions over a *stacked* batch of ``b`` per-example (or per-microbatch)
gradients: a pytree whose leaves have a leading axis of size ``b``, as
``jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)`` gives. With
:math:`\bar g` the mean gradient, each test asks whether the batch estimates
the true gradient well enough:

- norm test (Byrd et al. 2012):
  :math:`\frac{1}{b}\sum_j \operatorname{Var}_j(g) \le \eta^2 \|\bar g\|^2`;
- inner-product test (Bollapragada et al. 2018):
  :math:`\frac{1}{b}\operatorname{Var}(g_i \cdot \bar g) \le \theta^2 \|\bar g\|^4`;
- orthogonality test: :math:`\frac{1}{b(b-1)} \sum_i \|g_i - \frac{g_i \cdot
  \bar g}{\|\bar g\|^2} \bar g\|^2 \le \nu^2 \|\bar g\|^2`.

Variances are sample variances (Bessel's correction). The statistics are
*whole-vector*: the pytree is one vector, so :math:`\sum_j \operatorname{Var}_j`
runs over every coordinate of every leaf and :math:`g_i \cdot \bar g` is the
global inner product. (AdAdaGrad's reference code sums per-tensor statistics,
which for the inner-product test is not the same number.) They are taken on
the gradients divided by a power of two near their largest entry, so the
decisions hold at any scale float32 holds: the inner-product test's fourth
powers would otherwise overflow near gradients of 1e10 and vanish near 1e-10.
The statistic and bound are reported in the gradients' own units, where they
may still be 0 or inf.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from optax_gqc import sampling
  >>> def loss(w, x, y):
  ...   return 0.5 * (x @ w - y) ** 2
  >>> x = jax.random.normal(jax.random.key(0), (32, 3))
  >>> y = x @ jnp.array([1.0, -2.0, 0.5])
  >>> w = jnp.zeros(3)
  >>> per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(w, x, y)
  >>> result = sampling.norm_test(per_example, eta=0.5)
  >>> bool(result.passed), int(sampling.propose_batch_size(per_example, eta=0.5))
  (True, 32)
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from optax_gqc import _checks
from optax_gqc._numerics import power_of_two_near

__all__ = [
    'TestResult',
    'inner_product_test',
    'norm_test',
    'orthogonality_test',
    'propose_batch_size',
]


class TestResult(NamedTuple):
  """Outcome of a sampling test: whether it passed, and the two numbers it compared.

  ``passed`` is ``statistic <= bound`` as the test computes them, on the
  gradients divided by a power of two; the two reported numbers are scaled
  back and may read ``0 <= 0`` where they underflow. A zero mean gradient with
  spread fails every test (see :func:`inner_product_test`).
  """

  passed: jax.Array  # bool scalar
  statistic: jax.Array  # float32: the left-hand side
  bound: jax.Array  # float32: the right-hand side


def _flat(grads: Any) -> jax.Array:
  """The stacked pytree as a ``(b, dim)`` float32 matrix; a complex entry as two real ones."""
  leaves = jax.tree.leaves(grads)
  if not leaves or not all(hasattr(x, 'shape') and np.ndim(x) >= 1 for x in leaves):
    raise TypeError(
        'the sampling tests take a tree of stacked gradients, arrays of shape (b, ...): one '
        'per example (jax.vmap of jax.grad), got ' + repr(jax.tree.map(np.shape, grads))
    )
  b = leaves[0].shape[0]
  if any(x.shape[0] != b for x in leaves):
    raise ValueError(
        'the stacked gradients must share their leading axis, the b examples, got '
        + repr(jax.tree.map(lambda x: x.shape[0], grads))
    )
  if b < 2:
    raise ValueError(f'the sampling tests need at least 2 stacked gradients, got {b}')

  def real(x):
    x = x.reshape(b, -1)
    parts = [x.real, x.imag] if jnp.iscomplexobj(x) else [x]
    return [p.astype(jnp.float32) for p in parts]

  return jnp.concatenate([p for x in leaves for p in real(x)], axis=1)


def _parts(grads: Any):
  """The matrix divided by ``scale``, a power of two near its largest entry (1 if none)."""
  g = _flat(grads)
  scale = power_of_two_near(jnp.max(jnp.abs(g)))
  g = g / scale  # exact: a power of two
  b = g.shape[0]
  mean = jnp.mean(g, axis=0)
  return g, b, mean, jnp.sum(jnp.square(mean)), scale


def _result(statistic, bound, scale, power, undirected=None):
  """Decided on the scaled numbers; reported in the gradients' own units.

  ``undirected`` fails the test whatever the statistic: a zero mean, about
  which the gradients spread, has no direction to test along.
  """
  passed = statistic <= bound
  if undirected is not None:
    passed = passed & ~undirected
  for _ in range(power):  # one power of two at a time: rounds only past float32's range
    statistic, bound = statistic * scale, bound * scale
  return TestResult(passed, statistic, bound)


def _trace_var(g, mean, b):
  """sum_j Var_j(g), Bessel-corrected: the trace of the sample covariance."""
  return jnp.sum(jnp.square(g - mean)) / (b - 1)


def _inner_var(g, mean):
  """Var(g_i . gbar), Bessel-corrected."""
  return jnp.var(g @ mean, ddof=1)


def _orth_sum(g, mean, mean_sq):
  """sum_i ||g_i - (g_i . gbar / ||gbar||^2) gbar||^2 / (b - 1)."""
  coef = (g @ mean) / jnp.where(mean_sq > 0, mean_sq, 1.0)  # a zero mean: all is orthogonal
  return jnp.sum(jnp.square(g - coef[:, None] * mean)) / (g.shape[0] - 1)


def norm_test(grads: Any, eta: float) -> TestResult:
  r"""Byrd et al.'s norm test: is the mean's variance small next to its norm?

  :math:`\frac{1}{b}\sum_j \operatorname{Var}_j(g) \le \eta^2 \|\bar g\|^2`.

  Args:
    grads: stacked per-example gradients (leading axis ``b >= 2``).
    eta: the allowed relative error of the mean.

  Returns:
    A :class:`TestResult`.
  """
  _checks.check_positive('eta', eta)
  g, b, mean, mean_sq, scale = _parts(grads)
  return _result(_trace_var(g, mean, b) / b, eta**2 * mean_sq, scale, 2)


def inner_product_test(grads: Any, theta: float) -> TestResult:
  r"""The inner-product test: do the gradients agree along the mean direction?

  :math:`\frac{1}{b}\operatorname{Var}(g_i \cdot \bar g) \le \theta^2 \|\bar g\|^4`.
  A zero mean about which the gradients spread has no direction to test along:
  the test fails there, as the norm test does.

  Args:
    grads: stacked per-example gradients (leading axis ``b >= 2``).
    theta: the allowed relative error along the mean direction.

  Returns:
    A :class:`TestResult`.
  """
  _checks.check_positive('theta', theta)
  g, b, mean, mean_sq, scale = _parts(grads)
  undirected = (mean_sq == 0) & (_trace_var(g, mean, b) > 0)
  return _result(_inner_var(g, mean) / b, theta**2 * mean_sq**2, scale, 4, undirected)


def orthogonality_test(grads: Any, nu: float) -> TestResult:
  r"""The orthogonality test: the part of each gradient orthogonal to :math:`\bar g` is small.

  :math:`\frac{1}{b(b-1)}\sum_i \|g_i - \frac{g_i \cdot \bar g}{\|\bar g\|^2}\bar g\|^2
  \le \nu^2 \|\bar g\|^2`. Against a zero mean every gradient is
  orthogonal: the test fails where they spread, and passes where all are zero.

  Args:
    grads: stacked per-example gradients (leading axis ``b >= 2``).
    nu: the allowed relative orthogonal error.

  Returns:
    A :class:`TestResult`.
  """
  _checks.check_positive('nu', nu)
  g, b, mean, mean_sq, scale = _parts(grads)
  return _result(_orth_sum(g, mean, mean_sq) / b, nu**2 * mean_sq, scale, 2)


def propose_batch_size(
    grads: Any,
    eta: float | None = None,
    *,
    theta: float | None = None,
    nu: float | None = None,
    max_batch_size: int | None = None,
) -> jax.Array:
  r"""The next batch size: the smallest that would pass the test(s), never smaller than ``b``.

  AdAdaGrad's rule. With the norm test (``eta``):
  :math:`b' = \lceil \max(b, \sum_j \operatorname{Var}_j(g) / (\eta^2 \|\bar g\|^2)) \rceil`.
  The augmented rule (``theta`` and ``nu``, Bollapragada et al.) takes the
  larger of the inner-product and orthogonality proposals,
  :math:`\operatorname{Var}(g_i \cdot \bar g) / (\theta^2 \|\bar g\|^4)` and
  :math:`\frac{1}{b-1}\sum_i \|g_i^\perp\|^2 / (\nu^2 \|\bar g\|^2)`. Capped at
  ``max_batch_size``.

  A zero mean gradient asks for the cap where the gradients spread, and for
  ``b`` where they are all equal (the tests pass). Gradients with a NaN or an
  infinity propose ``b``: no statistic can be read from them, and the tests
  fail on them (a NaN statistic).

  Args:
    grads: stacked per-example gradients (leading axis ``b >= 2``).
    eta: the norm test's parameter, or None for the augmented rule.
    theta: the inner-product test's parameter (augmented rule).
    nu: the orthogonality test's parameter (augmented rule).
    max_batch_size: the cap, at least ``b`` (a traced one is not checked), or
      None.

  Returns:
    An int32 scalar.

  References:
    Lau et al, `AdAdaGrad: Adaptive Batch Size Schemes for Adaptive Gradient
    Methods <https://arxiv.org/abs/2402.11215>`_, 2024;
    Bollapragada et al, `Adaptive Sampling Strategies for Stochastic
    Optimization <https://arxiv.org/abs/1710.11258>`_, 2018
  """
  if (eta is None) == (theta is None and nu is None):
    raise ValueError('propose_batch_size takes either eta, or theta and nu (the augmented rule)')
  if eta is None and (theta is None or nu is None):
    raise ValueError('the augmented rule needs both theta and nu')
  for name, value in (('eta', eta), ('theta', theta), ('nu', nu)):
    if value is not None:
      _checks.check_positive(name, value)
  g, b, mean, mean_sq, _ = _parts(grads)
  if max_batch_size is not None:
    _checks.check_positive_int('max_batch_size', max_batch_size)
    if not isinstance(max_batch_size, jax.core.Tracer) and max_batch_size < b:
      raise ValueError(
          f'max_batch_size ({max_batch_size}) is below the batch of these gradients ({b}): '
          'the proposal is never smaller than the batch'
      )
  trace = _trace_var(g, mean, b)
  if eta is not None:
    wanted = trace / (eta**2 * mean_sq)
  else:
    wanted = jnp.maximum(
        _inner_var(g, mean) / (theta**2 * mean_sq**2),
        _orth_sum(g, mean, mean_sq) / (nu**2 * mean_sq),
    )
  cap = 2**31 - 1 if max_batch_size is None else max_batch_size
  cap = cap if isinstance(cap, jax.core.Tracer) else float(cap)
  # Equal gradients (no spread), or gradients that are not finite, give no reason to
  # grow; a zero mean with spread asks for infinitely many samples, as does a mean whose
  # square (or its square, mean_sq**2) vanishes next to the spread (a NaN ratio): the cap.
  no_reason = ~jnp.isfinite(jnp.sum(g)) | (trace == 0)
  wanted = jnp.where(mean_sq > 0, wanted, jnp.inf)
  wanted = jnp.where(no_reason, 0.0, jnp.where(jnp.isnan(wanted), jnp.inf, wanted))
  return jnp.minimum(jnp.ceil(jnp.maximum(float(b), wanted)), cap).astype(jnp.int32)
