"""Gates: when is the accumulated mean gradient good enough to step on?

A gate is a pure function of the running scalars in :class:`DrawStats`, plus a
few scalars of its own kept in the optimizer state. Pass one to
:func:`optax_gqc.accumulate`. Hyperparameters are floats or schedules, i.e.
functions of ``t``, the number of microbatches accepted before the current one
(torch-gqc advances its schedules once per microbatch too).

A hyperparameter that leaves its domain at run time (a schedule that returns
NaN or a negative value, a confidence outside [0, 1), a NaN injected by
``optax.inject_hyperparams``), which ``jax.jit`` cannot raise on, closes the
gate that reads it: the accumulation goes on until ``max_draws`` forces a
step (counted in ``num_forced``), and the gate counts the microbatch in
``num_bad_hyperparams``. A constant out of its domain raises at construction.
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_gqc import _checks
from optax_gqc._numerics import count_if
from optax_gqc._student_t import quantile_by_df, two_sided_tail

__all__ = [
    'DrawStats',
    'Gate',
    'all_of',
    'any_of',
    'batch_size_at_least',
    'critical_batch',
    'from_function',
    'loss_interval',
    'noise_ratio_below',
    'norm_below',
    'relative_error_below',
]


class DrawStats(NamedTuple):
  """The running scalars a gate decides from, after the latest microbatch.

  All fields are 0-d arrays; norms are global L2 norms over the whole pytree.
  """

  num_draws: jax.Array  # int32: microbatches in the current accumulation (n >= 1).
  num_microbatches: jax.Array  # int32: microbatches accepted before this one (t).
  grad_norm: jax.Array  # float32: ||g_i|| of the latest microbatch.
  acc_norm: jax.Array  # float32: ||gbar||, the norm of the mean gradient.
  sum_sq_norms: jax.Array  # float32: sum_i ||g_i||^2 over the accumulation.
  sum_norms: jax.Array  # float32: sum_i ||g_i|| over the accumulation.
  # float32: the engine's noise scale B_simple in microbatches, estimated at
  # the steps before this accumulation (NaN until one has averaged 2 draws).
  noise_scale: jax.Array

  @property
  def num_batches(self) -> jax.Array:
    """``num_microbatches``, under its name in torch-gqc and before 0.3.0."""
    return self.num_microbatches


class Gate(NamedTuple):
  """A decision rule: when is the accumulated mean gradient good enough?

  The gate state is a dict of 0-d arrays whose structure and dtypes are fixed
  by ``init`` (a combination of gates, :func:`~optax_gqc.gates.any_of` or
  :func:`~optax_gqc.gates.all_of`, holds a tuple of its gates' dicts). Its
  names say who reads them:

  - a plain name (``threshold``, ``loss_ema``, ``target_batch_size``) is for
    the user: the current value of a hyperparameter, an estimate, or a
    counter. A hyperparameter's entry reports the value the gate took from
    its argument at the latest update; writing another into the state
    changes nothing (to change one during a run, schedule it, or inject it:
    ``optax.inject_hyperparams(optax_gqc.gnts)(inner, threshold=0.5)``).
    :func:`optax_gqc.statistics` reports it, and
    ``optax.tree.get(state, name)`` finds it where no other part of the state
    has the name (``num_bad_hyperparams`` is also the engine's, and
    :func:`~optax_gqc.gates.any_of` of two ``norm_below`` holds two ``threshold``);
  - a name that begins with an underscore (``_loss_m2``) is the gate's own:
    a running sum it needs for its next decision, which means nothing
    outside it. :func:`optax_gqc.statistics` leaves it out.

  A gate with hyperparameters counts, in ``num_bad_hyperparams`` (int32), the
  microbatches at which one of them was out of its domain; it then stays
  closed. :func:`optax_gqc.statistics` reports the total over the engine
  and all its gates under that one name: 0 in a healthy run.
  """

  init: Callable[[], Any]  # () -> gate_state, the dict above.
  # (stats, gate_state, **extra_args) -> (step, gate_state), with stats a DrawStats
  # and step a boolean scalar. The engine casts an entry returned in another float
  # (or integer) dtype back to init's (a float64 hyperparameter under x64 promotes
  # it); another structure, shape or kind of dtype raises.
  update: Callable[..., tuple[jax.Array, Any]]
  # Examples per microbatch, for a gate that counts examples (batch_size_at_least,
  # critical_batch); None otherwise. accumulate reads it, so that it is given once.
  microbatch_size: int | None = None


def _value_at(name: str, hyperparam: optax.ScalarOrSchedule, t: jax.Array) -> jax.Array:
  """The hyperparameter's value at microbatch ``t``, a float32 scalar."""
  value = hyperparam(t) if callable(hyperparam) else hyperparam
  if jnp.ndim(value) != 0:
    raise ValueError(
        f'{name} must be a scalar, but it is (or its schedule returned) an array of shape '
        f'{jnp.shape(value)}: make the schedule return one number per step count'
    )
  return jnp.array(value, jnp.float32)  # a copy: never share a buffer with the caller


def _examples(num_draws: jax.Array, microbatch_size: Any) -> jax.Array:
  """``num_draws * microbatch_size`` as a float32, as the batch sizes compared with it are.

  Rounded from the int32 product, which wraps past 2**31; a product that would wrap
  is taken in float32.
  """
  wraps = num_draws > _checks.INT32_MAX // microbatch_size
  return jnp.where(
      wraps,
      num_draws.astype(jnp.float32) * microbatch_size,
      (num_draws * microbatch_size).astype(jnp.float32),
  )


def _outside(value: jax.Array, low: float = 0.0, high: float | None = None, *, strict=False):
  """Whether ``value`` is NaN or outside ``[low, high)``; ``(low, ...`` if ``strict``."""
  inside = value > low if strict else value >= low
  if high is not None:
    inside = inside & (value < high)
  return ~inside


def _traced_outside(value: Any, low: float, high: float | None = None) -> jax.Array | None:
  """``_outside`` for a constructor's number that ``inject_hyperparams`` may trace.

  A number is checked at construction (None here: nothing in the program); a
  traced one reaches the gate unchecked.
  """
  return _outside(value, low, high) if isinstance(value, jax.core.Tracer) else None


def _kept_if(bad: jax.Array | None, old: jax.Array, new: jax.Array) -> jax.Array:
  """``old`` where ``bad`` (a ``_traced_outside``), else ``new``."""
  return new if bad is None else jnp.where(bad, old, new)


def _any(*bad: jax.Array | None) -> jax.Array:
  """Whether any of ``bad`` holds; a None (a ``_traced_outside`` of a number) never does."""
  return jnp.any(jnp.stack([b for b in bad if b is not None]))


def _count_bad(gate_state: Any, *bad: jax.Array | None) -> jax.Array:
  """``num_bad_hyperparams`` plus one if any of ``bad`` holds."""
  return count_if(gate_state['num_bad_hyperparams'], _any(*bad))


def _no_bad() -> jax.Array:
  return jnp.zeros([], jnp.int32)


def _scheduled_gate(
    name: str,
    hyperparam: optax.ScalarOrSchedule,
    rule,
    also_bad: jax.Array | None = None,
    high: float | None = None,
) -> Gate:
  """A gate with one scheduled hyperparameter in ``[0, high)``, reported under ``name``.

  ``also_bad`` (a ``_traced_outside``) closes it and counts too.
  """

  def init():
    return {
        name: _value_at(name, hyperparam, jnp.zeros([], jnp.int32)),
        'num_bad_hyperparams': _no_bad(),
    }

  def update(stats, gate_state, **extra_args):
    del extra_args
    value = _value_at(name, hyperparam, stats.num_microbatches)
    bad = _any(_outside(value, 0.0, high), also_bad)
    return ~bad & rule(stats, value), {
        name: value,
        'num_bad_hyperparams': count_if(gate_state['num_bad_hyperparams'], bad),
    }

  return Gate(init, update)


def norm_below(
    threshold: optax.ScalarOrSchedule, *, relative: bool = False, decay: float = 0.99
) -> Gate:
  r"""Steps when the norm of the mean gradient is at most ``threshold``.

  The rule of Gradient Norm Threshold Scheduling (GNTS):

  .. math::

    \Big\| \frac{1}{n} \sum_{i=1}^n g_i \Big\| \le \text{threshold}(t).

  torch-gqc's ``OptimizerWrapperGNTS`` computes
  :math:`\|\sum_i g_i\| / n`, the same number. Averaging noisy microbatches
  shrinks the norm, so a lower threshold means more accumulation.

  An absolute threshold is tied to one model and one stage of training:
  gradient norms shrink several-fold as training goes. With ``relative=True``
  the threshold is a multiple of an EMA (decay ``decay``) of the recent
  single-microbatch norms :math:`\|g_i\|`, a unit that follows training.
  The EMA is bias-corrected, as Adam's moments are (kept from 0 and divided
  by its total weight :math:`1 - \text{decay}^k` after :math:`k` norms), so
  after :math:`k` norms the first weighs about :math:`1/k`: an outlier at the
  start, such as an all-zero first microbatch, does not hold the unit. While
  the unit is 0 (every norm seen was 0) the gate stays closed.
  ``threshold=0.5`` asks for the mean to be half as long as a typical
  microbatch gradient. Beware the signal-dominated regime (early training):
  there :math:`\|\bar g\|` cannot fall much below :math:`\|g_i\|` however
  many microbatches are averaged, and a ratio well below 1 waits for
  ``max_draws``; combine it with :func:`relative_error_below` through :func:`any_of`,
  which steps promptly when the noise is small.

  Args:
    threshold: an absolute L2 norm (or, with ``relative``, a ratio), constant
      or a schedule of ``t``.
    relative: measure the threshold in units of the EMA of microbatch norms.
    decay: the EMA's decay, with ``relative``.

  Returns:
    A :class:`Gate`. Its state reports ``threshold``; with ``relative`` also
    ``ratio`` (the scheduled ratio, as ``gnts(inner, ratio=...)`` names it)
    and ``grad_norm_ema`` (the unit), and ``threshold`` is their product, the
    absolute norm.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.accumulate(optax.adam(1e-3), optax_gqc.gates.norm_below(0.5))
  """
  _checks.check_scalar_or_schedule('threshold', threshold)
  _checks.check_bool('relative', relative)
  if not relative:
    return _scheduled_gate('threshold', threshold, lambda s, thr: s.acc_norm <= thr)
  _checks.check_unit_interval('decay', decay)

  def init():
    t0 = jnp.zeros([], jnp.int32)
    zero = lambda: jnp.zeros([], jnp.float32)  # noqa: E731
    return {
        'threshold': jnp.full([], jnp.nan, jnp.float32),
        'ratio': _value_at('threshold', threshold, t0),
        'grad_norm_ema': jnp.full([], jnp.nan, jnp.float32),  # NaN: no norm seen yet
        'num_bad_hyperparams': _no_bad(),
        '_norm_ema': zero(),  # the raw EMA, from 0
        '_norm_weight': zero(),  # its total weight, 1 - decay^k after k norms
    }

  def update(stats, gate_state, **extra_args):
    del extra_args
    # A bias-corrected EMA, as Adam's: after k norms the first weighs about
    # 1/k, so one outlier at the start (a zero gradient) does not hold the
    # unit for hundreds of microbatches.
    decay_bad = _traced_outside(decay, 0.0, 1.0)  # the EMA keeps its value meanwhile
    raw = decay * gate_state['_norm_ema'] + (1.0 - decay) * stats.grad_norm
    raw = _kept_if(decay_bad, gate_state['_norm_ema'], raw)
    weight = _kept_if(
        decay_bad, gate_state['_norm_weight'], decay * gate_state['_norm_weight'] + (1.0 - decay)
    )
    unit = raw / weight
    ratio = _value_at('threshold', threshold, stats.num_microbatches)
    bad = _any(_outside(ratio), decay_bad)
    limit = ratio * unit
    # While every norm seen is 0 the unit is 0, and 0 <= 0 would step on a
    # zero mean gradient: wait for a non-zero norm instead.
    return ~bad & (unit > 0) & (stats.acc_norm <= limit), {
        'threshold': limit,
        'ratio': ratio,
        'grad_norm_ema': unit,
        'num_bad_hyperparams': _count_bad(gate_state, bad),
        '_norm_ema': raw,
        '_norm_weight': weight,
    }

  return Gate(init, update)


def batch_size_at_least(logical_batch_size: optax.ScalarOrSchedule, microbatch_size: int) -> Gate:
  r"""Steps once the accumulated examples reach ``logical_batch_size``.

  The rule of Scheduled Batch Control (SBC, torch-gqc's
  ``OptimizerWrapperSBC``):

  .. math::

    n \cdot \text{microbatch\_size} \ge \text{logical\_batch\_size}(t).

  With a constant ``k * microbatch_size`` it steps every ``k`` microbatches,
  like ``optax.MultiSteps(inner, k)``.

  Args:
    logical_batch_size: examples per optimizer step, constant or a schedule.
      A constant below one microbatch is refused (it would step on every
      microbatch: a count of microbatches given where examples are meant).
      No batch reaches an infinite one: a schedule's inf, as its NaN or a
      negative value, keeps the gate closed and counts in
      ``num_bad_hyperparams``.
    microbatch_size: examples per microbatch.

  Returns:
    A :class:`Gate` whose state reports ``logical_batch_size``.
  """
  _checks.check_scalar_or_schedule('logical_batch_size', logical_batch_size)
  _checks.check_positive_int('microbatch_size', microbatch_size)
  # A JAX array may be inject_hyperparams' first value of a schedule: not checked.
  size = (
      None
      if callable(logical_batch_size) or isinstance(logical_batch_size, jax.Array)
      else float(logical_batch_size)
  )
  if size is not None and math.isinf(size):
    raise ValueError(
        'logical_batch_size is inf: no batch reaches it, so the gate never opens. Pass a finite '
        'logical_batch_size (for a step every k microbatches, k * microbatch_size)'
    )
  if (
      size is not None
      and not isinstance(microbatch_size, jax.core.Tracer)
      and size < microbatch_size
  ):
    raise ValueError(
        f'logical_batch_size ({size:g}) is under one microbatch of {microbatch_size} examples, '
        'so every microbatch would step: a logical batch is in examples. Pass k * '
        'microbatch_size for a step every k microbatches (microbatch_size itself for every one)'
    )
  gate = _scheduled_gate(
      'logical_batch_size',
      logical_batch_size,
      lambda s, size: _examples(s.num_draws, microbatch_size) >= size,
      _traced_outside(microbatch_size, 1),
      high=jnp.inf,
  )
  return gate._replace(microbatch_size=microbatch_size)


def critical_batch(
    fraction: optax.ScalarOrSchedule,
    microbatch_size: int,
    *,
    min_batch_size: int | None = None,
    max_batch_size: int | None = None,
    bootstrap_draws: int = 2,
    bootstrap_steps: int = 5,
    probe_every: int = 4,
) -> Gate:
  r"""Steps once the logical batch reaches ``fraction`` of the noise scale.

  Sets the batch from McCandlish et al.'s gradient noise scale
  :math:`B_\text{simple}`, the engine's own running estimate
  (:func:`optax_gqc.accumulate`), taken at the steps *before* the current
  accumulation:

  .. math::

    n \cdot \text{microbatch\_size} \ge
    \operatorname{clip}(\text{fraction}(t) \cdot B_\text{simple},\
    \text{min\_batch\_size}, \text{max\_batch\_size}).

  McCandlish et al. model the optimizer steps to reach a loss as
  :math:`S_\min (1 + B_\text{noise} / B)` and the examples as
  :math:`E_\min (1 + B / B_\text{noise})`: a batch of ``fraction`` times the
  noise scale spends :math:`1 + \text{fraction}` times the fewest examples and
  :math:`1 + 1 / \text{fraction}` times the fewest steps. As the noise scale
  grows during training (Merrill et al. 2025 find the critical batch near 0 at
  initialization, rising fast, then levelling off), so does the batch: a batch
  warmup that follows the measurement instead of a schedule.

  The decision reads no statistic of the current microbatches, so the
  stopping time is independent of them and the noise-scale estimate stays
  unbiased. Until the estimate rests on ``bootstrap_steps`` steps that averaged
  two microbatches or more, it steps every ``bootstrap_draws`` microbatches:
  a single early estimate is noisy, and one whose :math:`|G|^2` part comes out
  negative would read as an infinite noise scale. Past the bootstrap, an
  estimate of :math:`|G|^2 \le 0` (the noise swamps the signal) sends the
  target to ``max_batch_size``, or, without one, to the engine's ``max_draws``
  (such steps count in ``num_forced``). With neither (``max_draws=None``) no
  step ends such an accumulation, and since the estimate is refreshed only at
  steps, the run stops stepping for good. A step of one microbatch
  gives the engine no estimate, so while the target is under two
  microbatches, every ``probe_every``-th step takes two, which keeps the
  estimate following training.

  Args:
    fraction: the logical batch as a multiple of :math:`B_\text{simple}`,
      constant or a schedule of ``t``.
    microbatch_size: examples per microbatch.
    min_batch_size: the smallest logical batch, in examples; defaults to one
      microbatch.
    max_batch_size: the largest logical batch, in examples, at least two
      microbatches; defaults to no limit (the engine's ``max_draws`` still
      applies). The bootstrap's and the probes' batches are taken within
      ``[min_batch_size, max_batch_size]``, as the target is; a step still
      takes whole microbatches (the first count that reaches the batch), and
      ``max_draws`` may force one earlier.
    bootstrap_draws: microbatches per step during the bootstrap, >= 2 (its
      batch taken into the bounds).
    bootstrap_steps: steps of two or more microbatches, each an estimate,
      before the estimate is used, >= 1.
    probe_every: while the target is under two microbatches, one step in
      this many takes two; 0 never does (the estimate then stops at its last
      value while the target stays under two microbatches).

  Returns:
    A :class:`Gate` whose state reports ``fraction`` and
    ``target_batch_size``, the logical batch it aims for, in examples (the
    bootstrap's, or the clipped fraction of the noise scale; a probe's two
    microbatches do not show in it).

  Example:
    >>> import jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.accumulate(
    ...     optax.adamw(1e-3),
    ...     optax_gqc.gates.critical_batch(0.5, microbatch_size=32))
    >>> int(tx.init({'w': jnp.zeros(2)}).microbatch_size)  # given once, to the gate
    32

  References:
    McCandlish et al, `An Empirical Model of Large-Batch Training
    <https://arxiv.org/abs/1812.06162>`_, 2018;
    Merrill et al, `Critical Batch Size Revisited
    <https://arxiv.org/abs/2505.23971>`_, 2025
  """
  _checks.check_scalar_or_schedule('fraction', fraction, positive=True)
  if isinstance(microbatch_size, jax.core.Tracer):  # its bounds are set here, in Python
    raise TypeError(
        'critical_batch needs a concrete microbatch_size (the gate of gnts by default): '
        'inject_hyperparams traced it. List it as static: '
        "optax.inject_hyperparams(f, static_args=('microbatch_size',))"
    )
  _checks.check_positive_int('microbatch_size', microbatch_size)
  lower = microbatch_size if min_batch_size is None else min_batch_size
  _checks.check_positive_int('min_batch_size', lower)
  upper = jnp.inf if max_batch_size is None else max_batch_size
  if max_batch_size is not None:
    _checks.check_positive_int('max_batch_size', max_batch_size)
    if max_batch_size < lower:
      raise ValueError(f'max_batch_size ({max_batch_size}) must be >= min_batch_size ({lower})')
    if max_batch_size < 2 * microbatch_size:
      raise ValueError(
          f'max_batch_size ({max_batch_size}) must be at least two microbatches '
          f'({2 * microbatch_size}): a step of one microbatch gives no noise estimate'
      )
  _checks.check_positive_int('bootstrap_draws', bootstrap_draws)
  if bootstrap_draws < 2:
    raise ValueError(
        f'bootstrap_draws must be >= 2: one microbatch gives no noise estimate, got '
        f'{bootstrap_draws}'
    )
  _checks.check_positive_int('bootstrap_steps', bootstrap_steps)
  _checks.check_count('probe_every', probe_every)
  if probe_every > _checks.INT32_MAX:
    raise ValueError(f'probe_every must be below 2**31 (an int32 count), got {probe_every}')
  probe_every = int(probe_every)

  # The bootstrap's batch, within the bounds (at least two microbatches, as
  # the upper bound is).
  bootstrap = float(min(max(bootstrap_draws * microbatch_size, lower), upper))  # may pass 2**31

  def init():
    return {
        'fraction': _value_at('fraction', fraction, jnp.zeros([], jnp.int32)),
        'target_batch_size': jnp.array(bootstrap, jnp.float32),
        'num_bad_hyperparams': _no_bad(),
        '_steps_since_probe': jnp.zeros([], jnp.int32),
        '_estimates': jnp.zeros([], jnp.int32),
        '_last_draws': jnp.zeros([], jnp.int32),
    }

  def update(stats, gate_state, **extra_args):
    del extra_args
    f = _value_at('fraction', fraction, stats.num_microbatches)
    bad = _outside(f, strict=True)
    # An accumulation of two draws or more ended (a step, forced ones too) just
    # before this microbatch, if the count fell back to 1: the engine folded
    # one more estimate into its noise scale (or left out one that was not
    # finite, which still counts here).
    estimates = gate_state['_estimates'] + (
        (stats.num_draws == 1) & (gate_state['_last_draws'] >= 2)
    ).astype(jnp.int32)
    ready = (estimates >= bootstrap_steps) & ~jnp.isnan(stats.noise_scale)
    target = jnp.clip(f * stats.noise_scale * microbatch_size, lower, upper)
    target = jnp.where(ready, target, bootstrap)
    since = gate_state['_steps_since_probe']
    goal = target
    if probe_every:
      probe = (target < 2.0 * microbatch_size) & (since + 1 >= probe_every)
      goal = jnp.where(probe, 2.0 * microbatch_size, target)
    step = ~bad & (_examples(stats.num_draws, microbatch_size) >= goal)
    since = jnp.where(step, jnp.where(stats.num_draws >= 2, 0, since + 1), since)
    return step, {
        'fraction': f,
        'target_batch_size': target,  # before probes
        'num_bad_hyperparams': _count_bad(gate_state, bad),
        '_steps_since_probe': since,
        '_estimates': estimates,
        '_last_draws': stats.num_draws,
    }

  return Gate(init, update, microbatch_size)


def _welford(mean, m2, x, n):
  """Adds ``x`` as the ``n``-th value (n >= 1) to a running mean and sum of squared deviations."""
  mean = jnp.where(n == 1, 0.0, mean)
  m2 = jnp.where(n == 1, 0.0, m2)
  delta = x - mean
  mean = mean + delta / n
  return mean, m2 + delta * (x - mean)


def noise_ratio_below(tolerance: optax.ScalarOrSchedule) -> Gate:
  r"""Steps when the microbatch norms vary little: torch-gqc's GNS rule.

  With :math:`h_i = \|g_i\|` the norms of the :math:`n` microbatch gradients
  accumulated so far,

  .. math::

    \frac{\operatorname{var}(h)}{\operatorname{mean}(h^2) + 10^{-8}}
    \le n \cdot \text{tolerance}(t),

  with Bessel's correction in the variance, so it never steps at :math:`n = 1`.
  A heuristic on scalar norms, as in torch-gqc's ``OptimizerWrapperGNS``: it is
  *not* McCandlish's gradient noise scale, which :func:`optax_gqc.accumulate`
  estimates (``statistics(state)['noise_scale']``). The norms' mean and
  spread are kept by Welford's method, stable in float32.

  Args:
    tolerance: the allowed ratio per microbatch, constant or a schedule.

  Returns:
    A :class:`Gate` whose state reports ``tolerance``.
  """
  _checks.check_scalar_or_schedule('tolerance', tolerance)

  def init():
    zero = lambda: jnp.zeros([], jnp.float32)  # noqa: E731
    return {
        'tolerance': _value_at('tolerance', tolerance, jnp.zeros([], jnp.int32)),
        'num_bad_hyperparams': _no_bad(),
        '_norm_mean': zero(),
        '_norm_m2': zero(),
    }

  def update(stats, gate_state, **extra_args):
    del extra_args
    n = stats.num_draws
    mean, m2 = _welford(gate_state['_norm_mean'], gate_state['_norm_m2'], stats.grad_norm, n)
    variance = m2 / jnp.maximum(n - 1, 1)
    mean_sq = jnp.square(mean) + m2 / n
    tol = _value_at('tolerance', tolerance, stats.num_microbatches)
    bad = _outside(tol)
    step = ~bad & (n >= 2) & (variance / (mean_sq + 1e-8) <= n * tol)
    return step, {
        'tolerance': tol,
        'num_bad_hyperparams': _count_bad(gate_state, bad),
        '_norm_mean': mean,
        '_norm_m2': m2,
    }

  return Gate(init, update)


def loss_interval(
    confidence: optax.ScalarOrSchedule,
    percent_error: optax.ScalarOrSchedule,
    *,
    decay: float = 0.99,
) -> Gate:
  r"""Steps when a t-interval around the recent losses is tight: torch-gqc's MHT rule.

  Takes the microbatch loss through ``update(..., value=loss)``. The judged
  values are an EMA of all losses (:math:`r \leftarrow l` at the first, then
  :math:`r \leftarrow \delta r + (1 - \delta) l` with :math:`\delta` the
  ``decay``) and the :math:`n` finite losses since the last step. With
  :math:`m` and :math:`s` their mean and standard error (Bessel-corrected,
  :math:`+10^{-12}`), it steps when the Student-t interval at ``confidence``
  with :math:`n` degrees of freedom lies inside
  :math:`m (1 \pm \text{percent\_error})`:

  .. math::

    m - q s \ge m (1 - p), \quad m + q s \le m (1 + p)
    \iff P(|T_n| > p m / s) \le 1 - \text{confidence}.

  At a constant ``confidence`` the gate tests the left-hand form, as
  :math:`p m / s \ge q`, with :math:`q` for each :math:`n` from a table
  computed once, on the host, at construction. Under a schedule (or
  ``optax.inject_hyperparams``) it tests the right-hand form, the same test,
  with one t tail probability on device. The losses are kept as a running
  mean and sum of squared deviations (Welford's method), combined exactly
  with the EMA: a few scalars, no list. The port of torch-gqc's
  ``OptimizerWrapperMHT``.

  A loss that is NaN or infinite while the gradient is finite is left out of
  the test: the gate judges the finite losses alone (the microbatch's
  gradient is still accumulated) and counts it in ``num_skipped_losses``.
  With no finite loss since the last step, the gate stays closed. The
  statistics are float32: losses that spread by more than about 1e19
  overflow the squared deviations, and the gate then stays closed until
  ``max_draws`` (scale such losses down; the rule does not change).

  The half-width is relative to the mean, so the rule assumes a positive loss:
  where the mean is negative (a Gaussian negative log-likelihood, an ELBO) the
  gate never opens, and near zero it rarely does; ``max_draws`` then forces
  every step (``num_forced``), and with ``max_draws=None`` the run stops
  stepping while the mean stays negative, with no counter to show it. Pass the
  loss plus a constant that keeps it positive: the gradients do not change.

  Args:
    confidence: the interval's confidence in [0, 1), constant or a schedule.
    percent_error: its allowed half-width relative to the mean, >= 0.
    decay: the loss EMA's decay; torch-gqc's ``update_beta`` is ``1 - decay``.

  Returns:
    A :class:`Gate` whose state reports ``confidence``, ``percent_error``,
    ``loss_ema``, ``num_skipped_losses`` and ``num_bad_hyperparams``.

  Raises:
    ValueError: at the first trace, if ``update`` gets no ``value``, or a
      ``value`` that is not a scalar.
    TypeError: at the first trace, if ``value`` is not a real number (a
      string, a bool, a complex number).
  """
  _checks.check_scalar_or_schedule('confidence', confidence)
  quantile = None  # a schedule, or a value traced by inject_hyperparams: the t tail
  if not callable(confidence):
    _checks.check_unit_interval('confidence', confidence)
    fixed = _checks.concrete_float('confidence', confidence)
    if fixed is not None:  # a constant: its quantile for each n, from a table made once
      quantile = quantile_by_df(fixed)
  _checks.check_scalar_or_schedule('percent_error', percent_error)
  _checks.check_unit_interval('decay', decay)

  def init():
    zero = lambda: jnp.zeros([], jnp.float32)  # noqa: E731
    t0 = jnp.zeros([], jnp.int32)
    return {
        'confidence': _value_at('confidence', confidence, t0),
        'percent_error': _value_at('percent_error', percent_error, t0),
        'loss_ema': jnp.full([], jnp.nan, jnp.float32),  # NaN: no loss seen yet
        'num_skipped_losses': jnp.zeros([], jnp.int32),
        'num_bad_hyperparams': _no_bad(),
        '_num_losses': jnp.zeros([], jnp.int32),  # finite losses since the last step
        '_loss_mean': zero(),
        '_loss_m2': zero(),
    }

  def update(stats, gate_state, *, value=None, **extra_args):
    del extra_args
    if value is None:
      raise ValueError(
          'loss_interval needs the loss: call update(grads, state, params, value=loss) '
          '(with Flax NNX, optimizer.update(model, grads, value=loss), or '
          'optax_gqc.interop.nnx.update(optimizer, model, grads, value=loss))'
      )
    if isinstance(value, bool) or not (
        isinstance(value, int | float | jax.Array | np.ndarray | np.generic)
        and jnp.issubdtype(jnp.result_type(value), jnp.number)
        and not jnp.iscomplexobj(value)
    ):
      raise TypeError(
          f'value must be the scalar loss of the microbatch, a real number, got '
          f'{type(value).__name__} {value!r}: pass the loss itself (value=loss), as '
          'jax.value_and_grad returns it'
      )
    if jnp.ndim(value) != 0:
      raise ValueError(
          f'value must be the scalar loss of the microbatch, got shape {jnp.shape(value)}: '
          'pass its mean (value=loss.mean())'
      )
    loss = jnp.asarray(value, jnp.float32)
    decay_bad = _traced_outside(decay, 0.0, 1.0)  # the EMA keeps its value meanwhile
    finite = jnp.isfinite(loss)
    n = jnp.where(stats.num_draws == 1, 0, gate_state['_num_losses']) + finite
    ema = gate_state['loss_ema']
    ema = _kept_if(
        decay_bad,
        ema,
        jnp.where(finite, jnp.where(jnp.isnan(ema), loss, ema * decay + loss * (1.0 - decay)), ema),
    )
    mean_l, m2_l = _welford(
        gate_state['_loss_mean'], gate_state['_loss_m2'], loss, jnp.maximum(n, 1)
    )
    mean_l = jnp.where(finite, mean_l, gate_state['_loss_mean'])
    m2_l = jnp.where(finite, m2_l, gate_state['_loss_m2'])
    # The n losses together with the EMA: n + 1 values, n degrees of freedom.
    mean = (n * mean_l + ema) / (n + 1)
    m2 = m2_l + n / (n + 1) * jnp.square(ema - mean_l)
    scale = jnp.sqrt(m2 / n) / jnp.sqrt(n + 1.0) + 1e-12
    conf = _value_at('confidence', confidence, stats.num_microbatches)
    error = _value_at('percent_error', percent_error, stats.num_microbatches)
    bad = (_outside(conf, 0.0, 1.0), _outside(error), decay_bad)
    ratio = error * mean / scale
    if quantile is None:  # a schedule, or a value traced by inject_hyperparams
      inside = two_sided_tail(jnp.maximum(ratio, 0.0), jnp.maximum(n, 1)) <= 1.0 - conf
    else:
      inside = ratio >= quantile(n)
    step = ~_any(*bad) & (n >= 1) & (ratio >= 0) & inside
    return step, {
        'confidence': conf,
        'percent_error': error,
        'loss_ema': ema,
        'num_skipped_losses': gate_state['num_skipped_losses'] + ~finite,
        'num_bad_hyperparams': _count_bad(gate_state, *bad),
        '_num_losses': n,
        '_loss_mean': mean_l,
        '_loss_m2': m2_l,
    }

  return Gate(init, update)


def relative_error_below(eta: optax.ScalarOrSchedule) -> Gate:
  r"""Steps when the mean gradient's estimated relative error is at most ``eta``.

  The norm test of Byrd et al. (2012), on which AdAdaGrad builds, with the
  microbatches as the sample (:func:`optax_gqc.sampling.norm_test` is the same
  test on per-example gradients). With :math:`n \ge 2`
  microbatch gradients and their mean :math:`\bar g`,

  .. math::

    V = \frac{\sum_i \|g_i\|^2 - n \|\bar g\|^2}{n - 1}
    \text{ (the trace of their sample covariance)}, \qquad
    \frac{V}{n} \le \eta^2 \|\bar g\|^2,

  i.e. the expected squared error of the mean is at most :math:`\eta^2` times
  its squared norm. From the engine's running scalars: constant memory. It
  never steps at :math:`n = 1`, nor on a zero mean. :math:`V` is a difference
  of float32 sums, so it resolves about :math:`10^{-7} \sum_i \|g_i\|^2`: an
  ``eta`` below about ``3e-4`` asks for more than that, and the test then
  reads rounding.

  Args:
    eta: the allowed relative error, constant or a schedule.

  Returns:
    A :class:`Gate` whose state reports ``eta``.

  References:
    Byrd et al, `Sample size selection in optimization methods for machine
    learning <https://doi.org/10.1007/s10107-012-0572-5>`_, 2012;
    Lau et al, `AdAdaGrad: Adaptive Batch Size Schemes for Adaptive Gradient
    Methods <https://arxiv.org/abs/2402.11215>`_, 2024
  """
  _checks.check_scalar_or_schedule('eta', eta)

  def rule(stats, eta_value):
    n = stats.num_draws
    mean_sq = jnp.square(stats.acc_norm)
    trace = jnp.maximum(stats.sum_sq_norms - n * mean_sq, 0.0) / jnp.maximum(n - 1, 1)
    # A zero mean has no relative error to bound (0 <= 0): it waits, as norm_below does.
    return (n >= 2) & (mean_sq > 0) & (trace / n <= jnp.square(eta_value) * mean_sq)

  return _scheduled_gate('eta', eta, rule)


def from_function(rule: Callable[[DrawStats], jax.Array]) -> Gate:
  """Makes a stateless gate from a function of :class:`DrawStats`.

  Args:
    rule: ``stats -> bool`` scalar; traced, so use ``jnp`` comparisons. Any
      other output (a float, an int, an array of shape ``(1,)``) raises
      ``TypeError`` at the first trace of ``update``.

  Returns:
    A :class:`Gate` with an empty state.

  Example:
    >>> import optax_gqc
    >>> at_least_4 = optax_gqc.gates.from_function(lambda s: s.num_draws >= 4)
  """
  fix = 'pass a function of DrawStats, e.g. lambda s: s.num_draws >= 4'
  if not callable(rule):
    raise TypeError(f'rule must be callable, got {type(rule).__name__}: {fix}')
  _checks.check_takes_one_argument('rule', rule, 'the DrawStats', fix)

  def update(stats, state, **extra_args):
    del extra_args
    step = jnp.asarray(rule(stats))
    _checks.check_decision(step, 'from_function: rule')
    return step, state

  return Gate(lambda: {}, update)


def _combine(gates: tuple[Gate, ...], reduce, name: str) -> Gate:
  if not gates:
    raise ValueError(f'{name} needs at least one gate: pass gates, e.g. {name}(gate_a, gate_b)')
  for g in gates:
    if not isinstance(g, Gate):
      raise TypeError(
          f'{name} takes Gates, got {type(g).__name__}: pass gates such as gates.norm_below(0.5)'
      )

  # A size may be a JAX array (traced by inject_hyperparams): compared where concrete.
  sizes = [g.microbatch_size for g in gates if g.microbatch_size is not None]
  known = {int(s) for s in sizes if not isinstance(s, jax.core.Tracer)}
  if len(known) > 1:
    raise ValueError(
        f'{name}: its gates count examples of different microbatch sizes {sorted(known)}: '
        'give every gate the one size of the microbatches passed to update'
    )

  def init():
    return tuple(g.init() for g in gates)

  def update(stats, gate_state, **extra_args):
    steps, states = [], []
    for i, (g, s) in enumerate(zip(gates, gate_state, strict=True)):
      step, s = g.update(stats, s, **extra_args)
      _checks.check_decision(step, f'{name}: gate {i} of its {len(gates)} (counting from 0)')
      steps.append(step)
      states.append(s)
    return reduce(jnp.stack(steps)), tuple(states)

  return Gate(init, update, sizes[0] if sizes else None)


def any_of(*gates: Gate) -> Gate:
  """Steps when any of ``gates`` opens. Every gate still updates its state.

  Args:
    *gates: one or more gates; those that count examples must agree on the
      microbatch size.

  Returns:
    A gate whose state is the tuple of ``gates``' states, in order.

  Raises:
    ValueError: if no gate is given, or two give different microbatch sizes.
    TypeError: if an argument is not a :class:`Gate`.
  """
  return _combine(gates, jnp.any, 'any_of')


def all_of(*gates: Gate) -> Gate:
  """Steps when all of ``gates`` open. Every gate still updates its state.

  Args:
    *gates: one or more gates, as :func:`any_of` takes them.

  Returns:
    A gate whose state is the tuple of ``gates``' states, in order.

  Raises:
    ValueError: if no gate is given, or two give different microbatch sizes.
    TypeError: if an argument is not a :class:`Gate`.
  """
  return _combine(gates, jnp.all, 'all_of')
