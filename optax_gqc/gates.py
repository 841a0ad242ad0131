"""Gates: when is the accumulated mean gradient good enough to step on?

A gate is a pure function of the running scalars in :class:`DrawStats`, plus a
few scalars of its own kept in the optimizer state. Pass one to
:func:`optax_gqc.accumulate`. Hyperparameters are floats or schedules, i.e.
functions of ``t``, the number of microbatches accepted before the current one
(torch-gqc advances its schedules once per microbatch too).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from optax_gqc import _checks
from optax_gqc._accumulation import DrawStats, Gate

__all__ = [
    'DrawStats',
    'Gate',
    'all_of',
    'any_of',
    'batch_size_at_least',
    'from_function',
    'norm_below',
]


def _value_at(hyperparam: optax.ScalarOrSchedule, t: jax.Array) -> jax.Array:
  value = hyperparam(t) if callable(hyperparam) else hyperparam
  return jnp.array(value, jnp.float32)  # a copy: never share a buffer with the caller


def _scheduled_gate(name: str, hyperparam: optax.ScalarOrSchedule, rule) -> Gate:
  """A gate with one scheduled hyperparameter, reported under ``name``."""

  def init():
    return {name: _value_at(hyperparam, jnp.zeros([], jnp.int32))}

  def update(stats, gate_state, **extra_args):
    del gate_state, extra_args
    value = _value_at(hyperparam, stats.num_batches)
    return rule(stats, value), {name: value}

  return Gate(init, update)


def norm_below(threshold: optax.ScalarOrSchedule) -> Gate:
  r"""Steps when the norm of the mean gradient is at most ``threshold``.

  The rule of Gradient Norm Threshold Scheduling (GNTS):

  .. math::

    \Big\| \frac{1}{n} \sum_{i=1}^n g_i \Big\| \le \text{threshold}(t).

  torch-gqc's ``OptimizerWrapperGNTS`` computes
  :math:`\|\sum_i g_i\| / n`, the same number. Averaging noisy microbatches
  shrinks the norm, so a lower threshold means more accumulation.

  Args:
    threshold: an absolute L2 norm, constant or a schedule of ``t``.

  Returns:
    A :class:`Gate` whose state reports ``threshold``.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.accumulate(optax.adam(1e-3), optax_gqc.gates.norm_below(0.5))
  """
  _checks.check_scalar_or_schedule('threshold', threshold)
  return _scheduled_gate('threshold', threshold, lambda s, thr: s.acc_norm <= thr)


def batch_size_at_least(
    logical_batch_size: optax.ScalarOrSchedule, microbatch_size: int
) -> Gate:
  r"""Steps once the accumulated examples reach ``logical_batch_size``.

  The rule of Scheduled Batch Control (SBC, torch-gqc's
  ``OptimizerWrapperSBC``):

  .. math::

    n \cdot \text{microbatch\_size} \ge \text{logical\_batch\_size}(t).

  With a constant ``k * microbatch_size`` it steps every ``k`` microbatches,
  like ``optax.MultiSteps(inner, k)``.

  Args:
    logical_batch_size: examples per optimizer step, constant or a schedule.
    microbatch_size: examples per microbatch.

  Returns:
    A :class:`Gate` whose state reports ``logical_batch_size``.
  """
  _checks.check_scalar_or_schedule('logical_batch_size', logical_batch_size)
  _checks.check_positive_int('microbatch_size', microbatch_size)
  return _scheduled_gate(
      'logical_batch_size',
      logical_batch_size,
      lambda s, size: s.num_draws * microbatch_size >= size,
  )


def from_function(rule: Callable[[DrawStats], jax.Array]) -> Gate:
  """Makes a stateless gate from a function of :class:`DrawStats`.

  Args:
    rule: ``stats -> bool`` scalar; traced, so use ``jnp`` comparisons.

  Returns:
    A :class:`Gate` with an empty state.

  Example:
    >>> import optax_gqc
    >>> at_least_4 = optax_gqc.gates.from_function(lambda s: s.num_draws >= 4)
  """
  if not callable(rule):
    raise TypeError(f'rule must be callable, got {type(rule).__name__}')
  return Gate(lambda: {}, lambda stats, state, **_: (jnp.asarray(rule(stats)), state))


def _combine(gates: tuple[Gate, ...], reduce, name: str) -> Gate:
  if not gates:
    raise ValueError(f'{name} needs at least one gate')
  for g in gates:
    if not isinstance(g, Gate):
      raise TypeError(f'{name} takes Gates, got {type(g).__name__}')

  def init():
    return tuple(g.init() for g in gates)

  def update(stats, gate_state, **extra_args):
    steps, states = zip(
        *(g.update(stats, s, **extra_args) for g, s in zip(gates, gate_state, strict=True)),
        strict=True,
    )
    return reduce(jnp.stack(steps)), tuple(states)

  return Gate(init, update)


def any_of(*gates: Gate) -> Gate:
  """Steps when any of ``gates`` opens. Every gate still updates its state."""
  return _combine(gates, jnp.any, 'any_of')


def all_of(*gates: Gate) -> Gate:
  """Steps when all of ``gates`` open. Every gate still updates its state."""
  return _combine(gates, jnp.all, 'all_of')
