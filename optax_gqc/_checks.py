"""Argument checks shared by the public factories."""

import math
import numbers
from typing import Any

import jax
import numpy as np


def _concrete_float(name: str, value: Any) -> float | None:
  """`value` as a float, or None when it is traced (inside `inject_hyperparams`)."""
  if isinstance(value, jax.core.Tracer):
    return None
  if isinstance(value, bool) or not isinstance(
      value, numbers.Real | np.ndarray | np.generic | jax.Array
  ):
    raise TypeError(
        f'{name} must be a number or a schedule (a function of the step count), '
        f'got {type(value).__name__}'
    )
  if np.ndim(value) != 0:
    raise ValueError(f'{name} must be a scalar, got shape {np.shape(value)}')
  return float(value)


def check_scalar_or_schedule(name: str, value: Any, *, positive: bool = False) -> None:
  """Raises if a constant hyperparameter is NaN, negative (or zero if `positive`)."""
  if callable(value):
    return
  v = _concrete_float(name, value)
  if v is None:
    return
  if math.isnan(v) or v < 0 or (positive and v == 0):
    bound = '> 0' if positive else '>= 0'
    raise ValueError(f'{name} must be {bound}, got {v}')


def check_unit_interval(name: str, value: Any) -> None:
  """Raises unless a constant ``value`` lies in [0, 1); traced values pass."""
  v = _concrete_float(name, value)
  if v is not None and not 0.0 <= v < 1.0:
    raise ValueError(f'{name} must be in [0, 1), got {v}')


def check_positive_int(name: str, value: Any) -> None:
  """Raises unless `value` is an integer >= 1; a traced value passes unchecked."""
  if isinstance(value, jax.core.Tracer):
    return
  if isinstance(value, bool) or not (
      isinstance(value, numbers.Integral)
      or (
          isinstance(value, np.ndarray | jax.Array)
          and np.issubdtype(value.dtype, np.integer)
          and np.ndim(value) == 0
      )
  ):
    raise TypeError(f'{name} must be an integer, got {value!r}')
  if value < 1:
    raise ValueError(f'{name} must be >= 1, got {value}')


def check_draws_reach_batch(
    logical_batch_size: Any, microbatch_size: int, max_draws: Any, name: str = 'logical_batch_size'
) -> None:
  """Raises if ``max_draws`` would force every step before a constant batch is reached.

  Schedules and traced values pass: their largest value is not known here.
  """
  if max_draws is None or callable(logical_batch_size):
    return
  size = _concrete_float(name, logical_batch_size)
  if size is None or isinstance(max_draws, jax.core.Tracer) or math.isinf(size):
    return
  needed = math.ceil(size / microbatch_size)
  if max_draws < needed:
    raise ValueError(
        f'max_draws ({max_draws}) is below the {needed} microbatches of {microbatch_size} '
        f'examples that {name} ({size:g}) needs: every step would be forced by max_draws. '
        f'Pass max_draws >= {needed}, or max_draws=None for no limit'
    )
