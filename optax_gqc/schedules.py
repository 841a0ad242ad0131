r"""Schedules of the microbatch count: warmups and anneals.

The schedules are those of torch-schedule-anything, as torch-gqc uses them.
With value :math:`W` reached at the end of a warmup of :math:`L` steps, a final
value :math:`A` at step :math:`M`, and :math:`p = \mathrm{clip}((t - L) / (M - L),
0, 1)`:

- warmup: :math:`W t / L`; inverse warmup: :math:`W (R - (R - 1) t / L)`,
  starting at :math:`R` times the value it settles to;
- quarter-cosine anneal: :math:`A + (W - A) \cos(\pi p / 2)`;
- polynomial anneal: :math:`A + (W - A) (1 - p)^P`.

Difference from torch-schedule-anything: it does not clamp :math:`p`, so past
:math:`M` its cosine turns back and its factors can turn negative (a weight
decay that pushes weights away from zero). Ours hold :math:`A` from :math:`M`
on, and agree with it on :math:`[0, M]`. Where :math:`M \le L`, both take
:math:`p = 1` after the warmup: the value goes from the warmup's end straight
to :math:`A`.

This module imports nothing else of optax_gqc but its checks.
"""

import math
import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_gqc import _checks

__all__ = [
    'constant_with_inverse_warmup',
    'constant_with_warmup',
    'cosine_with_inverse_warmup',
    'cosine_with_warmup',
    'polynomial_with_inverse_warmup',
    'polynomial_with_warmup',
]


def _check_steps(warmup_steps: int, total_steps: int) -> None:
  """An anneal's counts: its warmup, and its end, which it needs."""
  _checks.check_count('warmup_steps', warmup_steps, int32=True)
  _checks.check_count('total_steps', total_steps)


def _check_values(**values: Any) -> None:
  """Raises unless each value is a real number, or an array of them, all finite.

  Traced values pass.
  """
  for name, value in values.items():
    if isinstance(value, jax.core.Tracer):
      continue
    if not _checks.is_number(value):
      raise TypeError(f'{name} must be a number (or an array of them), got {value!r}')
    if not np.all(np.isfinite(np.asarray(value))):
      raise ValueError(f'{name} must be finite, got {value}')


def _check_power(power: float) -> None:
  if isinstance(power, bool) or not isinstance(power, numbers.Real) or not 0 <= power < math.inf:
    hint = ' (pass float(power))' if np.ndim(power) == 0 and hasattr(power, 'dtype') else ''
    raise ValueError(
        f'power must be a number >= 0, finite, got {power!r}{hint}: the anneal is '
        '(1 - p)^power, which a negative power sends to inf at the end of the run, and an '
        'infinite one turns into a step'
    )


def _divide(x: jax.Array, divisor: float) -> jax.Array:
  """``x / divisor`` as written.

  XLA turns a division by a constant into a multiplication by its reciprocal,
  which rounds differently: ``32 * 375 / 500`` would come out 24.000002 rather
  than 24, and an SBC gate at 3 x 8 examples would miss the step that
  torch-gqc takes. The barrier keeps the division. On the GPU the float32
  division is not correctly rounded, so there it can still come out 24.000002.
  """
  return x / jax.lax.optimization_barrier(jnp.float32(divisor))


def _schedule(
    warmup_steps: int,
    total_steps: int | None,
    warm: Callable[[jax.Array, int], jax.Array],
    anneal: Callable[[jax.Array], jax.Array],
) -> optax.Schedule:
  """``warm(t, L)`` before step ``L``, then ``anneal(p)`` with ``p`` clamped.

  The arithmetic follows torch-schedule-anything's order of operations, so that
  values it computes exactly (in float64) are exact here too.
  """

  def schedule(count):
    t = jnp.asarray(count, jnp.float32)
    if total_steps is None or total_steps <= warmup_steps:
      p = jnp.ones_like(t)  # torch-schedule-anything: progress 1 when M <= L
    else:
      p = jnp.clip(_divide(t - warmup_steps, total_steps - warmup_steps), 0.0, 1.0)
    if warmup_steps == 0:
      return anneal(p)
    return jnp.where(t < warmup_steps, warm(t, warmup_steps), anneal(p))

  return schedule


def _warm(peak_value: float):
  return lambda t, length: _divide(peak_value * t, length)


def _inverse_warm(peak_value: float, warmup_multiplier: float):
  r = warmup_multiplier
  value = _checks.concrete_float('warmup_multiplier', r)  # None when traced
  if value is not None and not 0 <= value < float('inf'):
    raise ValueError(
        f'warmup_multiplier must be a finite number >= 0, got {r!r}: the warmup starts at '
        'warmup_multiplier times the peak'
    )
  return lambda t, length: peak_value * (r - _divide((r - 1.0) * t, length))


def _cosine(peak_value: float, end_value: float):
  # sin(pi/2 (1 - p)) == cos(pi/2 p), but exactly 0 at p = 1 in float32, where
  # cos(pi/2) is -4e-8 and an anneal to 0 would end slightly negative.
  return lambda p: end_value + (peak_value - end_value) * jnp.sin(jnp.pi / 2 * (1.0 - p))


def _polynomial(peak_value: float, end_value: float, power: float):
  return lambda p: end_value + (peak_value - end_value) * (1.0 - p) ** power


def constant_with_warmup(value: float, warmup_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to ``value`` over ``warmup_steps``, then constant.

  Mirrors torch-schedule-anything's ``constant_with_warmup``.

  Args:
    value: the value after the warmup.
    warmup_steps: length of the warmup, in microbatches (0: none).

  Returns:
    A schedule, a function of the step count.
  """
  _checks.check_count('warmup_steps', warmup_steps, int32=True)
  _check_values(value=value)
  return _schedule(warmup_steps, None, _warm(value), lambda p: value + 0.0 * p)


def constant_with_inverse_warmup(
    value: float, warmup_steps: int, warmup_multiplier: float = 20.0
) -> optax.Schedule:
  """Linear from ``warmup_multiplier * value`` down to ``value``, then constant.

  Mirrors torch-schedule-anything's ``constant_with_inverse_warmup``.

  Args:
    value: the value after the warmup.
    warmup_steps: length of the warmup, in microbatches (0: none).
    warmup_multiplier: the warmup starts at this times ``value``; >= 0.

  Returns:
    A schedule, a function of the step count.
  """
  _checks.check_count('warmup_steps', warmup_steps, int32=True)
  _check_values(value=value)
  return _schedule(
      warmup_steps, None, _inverse_warm(value, warmup_multiplier), lambda p: value + 0.0 * p
  )


def cosine_with_warmup(
    peak_value: float, end_value: float, warmup_steps: int, total_steps: int
) -> optax.Schedule:
  """Linear warmup to ``peak_value``, then a quarter cosine to ``end_value``.

  Mirrors torch-schedule-anything's ``cosine_annealing_with_warmup``, with the
  anneal clamped at ``total_steps``.

  Args:
    peak_value: value at the end of the warmup.
    end_value: value at ``total_steps`` and after.
    warmup_steps: length of the warmup, in microbatches.
    total_steps: step at which the anneal ends.

  Returns:
    A schedule, a function of the step count.

  Example:
    >>> from optax_gqc import schedules
    >>> f = schedules.cosine_with_warmup(1.0, 0.0, warmup_steps=10, total_steps=110)
    >>> [round(float(f(t)), 4) for t in (0, 5, 10, 110, 500)]
    [0.0, 0.5, 1.0, 0.0, 0.0]
  """
  _check_steps(warmup_steps, total_steps)
  _check_values(peak_value=peak_value, end_value=end_value)
  return _schedule(warmup_steps, total_steps, _warm(peak_value), _cosine(peak_value, end_value))


def cosine_with_inverse_warmup(
    peak_value: float,
    end_value: float,
    warmup_steps: int,
    total_steps: int,
    warmup_multiplier: float = 20.0,
) -> optax.Schedule:
  """Linear from ``warmup_multiplier * peak_value`` down, then a quarter cosine.

  Mirrors torch-schedule-anything's ``cosine_annealing_with_inverse_warmup``
  (clamped). GNTS thresholds start high so that early training, where the
  gradient is mostly signal, steps on every microbatch.

  Args:
    peak_value: value at the end of the warmup.
    end_value: value at ``total_steps`` and after.
    warmup_steps: length of the warmup, in microbatches.
    total_steps: step at which the anneal ends.
    warmup_multiplier: the warmup starts at this times ``peak_value``; >= 0.

  Returns:
    A schedule, a function of the step count.
  """
  _check_steps(warmup_steps, total_steps)
  _check_values(peak_value=peak_value, end_value=end_value)
  return _schedule(
      warmup_steps,
      total_steps,
      _inverse_warm(peak_value, warmup_multiplier),
      _cosine(peak_value, end_value),
  )


def polynomial_with_warmup(
    peak_value: float, end_value: float, warmup_steps: int, total_steps: int, power: float = 2.0
) -> optax.Schedule:
  """Linear warmup to ``peak_value``, then ``end + (peak - end) (1 - p)^power``.

  Mirrors torch-schedule-anything's ``polynomial_schedule_with_warmup`` (clamped).

  Args:
    peak_value: value at the end of the warmup.
    end_value: value at ``total_steps`` and after.
    warmup_steps: length of the warmup, in microbatches.
    total_steps: step at which the anneal ends.
    power: the anneal's exponent, ``p`` the progress from 0 to 1 after the
      warmup.

  Returns:
    A schedule, a function of the step count.
  """
  _check_steps(warmup_steps, total_steps)
  _check_values(peak_value=peak_value, end_value=end_value)
  _check_power(power)
  return _schedule(
      warmup_steps, total_steps, _warm(peak_value), _polynomial(peak_value, end_value, power)
  )


def polynomial_with_inverse_warmup(
    peak_value: float,
    end_value: float,
    warmup_steps: int,
    total_steps: int,
    power: float = 2.0,
    warmup_multiplier: float = 20.0,
) -> optax.Schedule:
  """Inverse warmup to ``peak_value``, then the polynomial anneal.

  Mirrors torch-schedule-anything's ``polynomial_schedule_with_inverse_warmup``
  (clamped).

  Args:
    peak_value: value at the end of the warmup.
    end_value: value at ``total_steps`` and after.
    warmup_steps: length of the warmup, in microbatches.
    total_steps: step at which the anneal ends.
    power: the anneal's exponent, as in :func:`polynomial_with_warmup`.
    warmup_multiplier: the warmup starts at this times ``peak_value``; >= 0.

  Returns:
    A schedule, a function of the step count.
  """
  _check_steps(warmup_steps, total_steps)
  _check_values(peak_value=peak_value, end_value=end_value)
  _check_power(power)
  return _schedule(
      warmup_steps,
      total_steps,
      _inverse_warm(peak_value, warmup_multiplier),
      _polynomial(peak_value, end_value, power),
  )
