"""The published GQC algorithms: the engine composed with a gate."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from optax_gqc import _checks, gates
from optax_gqc._accumulation import AccumulationTransformation, accumulate
from optax_gqc._scale_to_norm import scale_to_norm

_NOISE_DECAY = 0.99  # accumulate's default, given where the aliases' noise_decay is None


def gnts(
    inner: optax.GradientTransformation,
    threshold: optax.ScalarOrSchedule | None = None,
    *,
    fraction: optax.ScalarOrSchedule | None = None,
    ratio: optax.ScalarOrSchedule | None = None,
    eta: optax.ScalarOrSchedule | None = None,
    max_draws: int | None = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    noise_decay: float | None = None,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None | str = 'default',
    axis_name: Any = None,
) -> AccumulationTransformation:
  r"""Gradient Norm Threshold Scheduling: accumulate until the mean is short enough.

  Steps ``inner`` on the mean :math:`\bar g` of the accumulated microbatch
  gradients once it is short enough (or after ``max_draws`` microbatches).
  Three modes:

  - *Noise-following* (the default): the threshold is on the noise of the
    mean, relative to the gradient itself. With :math:`G` the true gradient
    and :math:`B` the gradient noise scale in microbatches, the mean of
    :math:`n` microbatches has
    :math:`\mathbb{E}\|\bar g - G\|^2 = \|G\|^2 B / n`, so asking for
    at most :math:`1/f` of :math:`\|G\|^2` means

    .. math::

      n \ge f \cdot B_\text{simple}, \qquad n \ge 2,

    with :math:`B_\text{simple}` the engine's running estimate from the steps
    *before* this accumulation, :func:`optax_gqc.gates.critical_batch` with
    ``fraction`` :math:`f` (0.5 by default). The batch follows the noise
    scale as it grows in training, and the decision reads no statistic of
    the microbatches it judges, so the estimate stays unbiased. Each step is
    scaled by :math:`\sqrt{n}`, the rule for Adam-like optimizers: a mean of
    :math:`n` microbatches has :math:`n` times less noise. McCandlish et al.
    put the best batch for steps and examples together near the noise
    scale: :math:`f = 0.5` spends 1.5x the fewest examples and 3x the fewest
    steps.
  - *Relative* (``ratio`` given): shorter than ``ratio`` times an EMA of the
    microbatch norms, :func:`optax_gqc.gates.norm_below` with
    ``relative=True``, or the norm test at ``eta`` (0.8 by default),
    :func:`optax_gqc.gates.relative_error_below`. Where the noise dominates,
    the mean of :math:`n` microbatches has a norm about
    :math:`\|g_i\| / \sqrt{n}`, so this is a fixed batch of about
    :math:`1 / \text{ratio}^2` microbatches there, whatever the noise scale.
  - *Absolute* (``threshold`` given): torch-gqc's ``OptimizerWrapperGNTS``,
    :math:`\|\bar g\| \le \text{threshold}(t)`, an L2 norm that must suit the
    model's gradients: one below the norms the model sees starves the gate,
    and every step is then forced (``statistics(state)['num_forced']``).
    ``eta``, if given, adds the norm test as a valve.

  See :func:`optax_gqc.accumulate` for the mechanics, and
  :func:`optax_gqc.schedule_by_microbatch` for a learning rate that follows
  the microbatches seen (tokens) rather than the optimizer steps.

  Args:
    inner: the optimizer that steps on the mean gradient.
    threshold: None for the noise-following or relative gate; else the
      absolute L2 norm of the mean gradient, constant or a schedule of the
      microbatch count.
    fraction: the noise-following batch as a multiple of the noise scale,
      constant or a schedule; 0.5 by default.
    ratio: the relative threshold as a multiple of the EMA of microbatch
      norms, constant or a schedule; selects the relative mode.
    eta: the norm test's allowed relative error of the mean; 0.8 by default
      in the relative mode, no valve in the absolute mode.
    max_draws: the most microbatches accumulated before a step is forced;
      None for no limit, but for the noise-following gate, which needs one
      (it raises ``ValueError``).
    microbatch_size: examples per microbatch (optional, for statistics: the
      noise scale and ``target_batch_size`` are then in examples).
    accumulator_dtype: dtype of the accumulator; None means float32, or the
      gradients' own dtype where it is wider or complex (see
      :func:`optax_gqc.accumulate`).
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    noise_decay: the EMA decay of the noise-scale estimates, which the
      noise-following batch reads (see :func:`optax_gqc.accumulate`), in
      [0, 1); None for 0.99 (a default that ``optax.inject_hyperparams``
      leaves alone, where it would cast a number to the params' dtype).
    scale_by_draws: a function of :math:`n` that multiplies the inner update
      of a step that averaged :math:`n` microbatches (see
      :func:`optax_gqc.accumulate`); by default ``jnp.sqrt`` in the
      noise-following mode and None (no scaling, as torch-gqc) in the others.
    axis_name: inside ``jax.shard_map``, the mapped axis (or axes) over which
      the parameters are sharded (FSDP), so that the norms, and the decision,
      are global; see :func:`optax_gqc.accumulate`.

  Returns:
    An :class:`~optax_gqc.AccumulationTransformation`, called once per
    microbatch.

  Raises:
    ValueError: if more than one of ``threshold``, ``ratio`` and ``fraction``
      is given, ``eta`` without ``ratio`` or ``threshold``, or ``max_draws``
      None or 1 with the noise-following gate.

  Example:
    >>> import jax, jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.gnts(optax.adamw(1e-3))  # noise-following
    >>> params = {'w': jnp.ones(4)}
    >>> state = tx.init(params)
    >>> update = jax.jit(tx.update)
    >>> for g in (1.0, -0.8, 0.9):  # two microbatches per step until B is known
    ...   updates, state = update({'w': jnp.full(4, g)}, state, params)
    ...   print(int(state.num_draws), int(state.num_steps))
    1 0
    0 1
    1 1
    >>> relative = optax_gqc.gnts(optax.adamw(1e-3), ratio=0.5)
    >>> parity = optax_gqc.gnts(optax.adamw(1e-3), threshold=0.5)  # torch-gqc's rule

  References:
    torch-gqc, `Gradient Quality Control <https://pypi.org/project/torch-gqc/>`_;
    McCandlish et al, `An Empirical Model of Large-Batch Training
    <https://arxiv.org/abs/1812.06162>`_, 2018;
    Byrd et al, `Sample size selection in optimization methods for machine
    learning <https://doi.org/10.1007/s10107-012-0572-5>`_, 2012
  """
  modes = [
      name
      for name, v in (('threshold', threshold), ('ratio', ratio), ('fraction', fraction))
      if v is not None
  ]
  if len(modes) > 1:
    raise ValueError(
        f"gnts: give at most one of threshold (an absolute norm, torch-gqc's rule), ratio "
        f'(relative to the microbatch norms) and fraction (of the noise scale); got {modes}'
    )
  if eta is not None and threshold is None and ratio is None:
    raise ValueError(
        'gnts: eta is the norm test of the relative or absolute mode: pass ratio=... or '
        'threshold=... with it'
    )
  if isinstance(scale_by_draws, str) and scale_by_draws != 'default':
    raise ValueError(f'scale_by_draws must be a function of n or None, got {scale_by_draws!r}')
  noise_following = threshold is None and ratio is None
  if noise_following:
    if max_draws is None:
      raise ValueError(
          'gnts: max_draws=None with the noise-following gate (the default): where the noise '
          'swamps the signal, the noise scale and the batch are infinite, and the estimate is '
          'refreshed only at steps, so it would stop stepping for good. Give max_draws (64 by '
          'default), or pass ratio=... or threshold=... for a gate that needs no limit'
      )
    _checks.check_positive_int('max_draws', max_draws)
    if not isinstance(max_draws, jax.core.Tracer) and max_draws == 1:
      raise ValueError(
          'gnts: max_draws=1 with the noise-following gate (the default), which steps on two '
          'microbatches at least: every step would be forced, on one microbatch, and no noise '
          'scale ever estimated. Give max_draws >= 2 (64 by default)'
      )
  if scale_by_draws == 'default':
    scale_by_draws = jnp.sqrt if noise_following else None
  if noise_following:
    size = 1 if microbatch_size is None else microbatch_size
    _checks.check_positive_int('microbatch_size', size, ', or None')
    if not isinstance(size, jax.core.Tracer):
      size = int(size)  # 2 * size: not in a NumPy int32, which wraps
      if 2 * size > _checks.INT32_MAX:
        raise ValueError(
            f'microbatch_size must be below 2**30 here, got {size}: the default gate waits '
            'for two microbatches, a batch it keeps as an int32'
        )
    gate = gates.critical_batch(
        0.5 if fraction is None else fraction, size, min_batch_size=2 * size
    )
    # Without a size the gate counts in microbatches: no size for accumulate to report.
    gate = gate._replace(microbatch_size=microbatch_size)
  elif threshold is None:
    _checks.check_scalar_or_schedule('ratio', ratio)  # norm_below's check names its threshold
    _checks.check_gate_can_open('gnts', max_draws, ratio=ratio, eta=0.8 if eta is None else eta)
    gate = gates.any_of(
        gates.norm_below(ratio, relative=True),
        gates.relative_error_below(0.8 if eta is None else eta),
    )
  elif eta is None:
    _checks.check_gate_can_open('gnts', max_draws, threshold=threshold)
    gate = gates.norm_below(threshold)
  else:
    _checks.check_gate_can_open('gnts', max_draws, threshold=threshold, eta=eta)
    gate = gates.any_of(gates.norm_below(threshold), gates.relative_error_below(eta))
  return accumulate(
      inner,
      gate,
      max_draws=max_draws,
      microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
      noise_decay=_NOISE_DECAY if noise_decay is None else noise_decay,
      scale_by_draws=scale_by_draws,
      axis_name=axis_name,
  )


def sbc(
    inner: optax.GradientTransformation,
    logical_batch_size: optax.ScalarOrSchedule,
    microbatch_size: int,
    *,
    max_draws: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    noise_decay: float | None = None,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
) -> AccumulationTransformation:
  r"""Scheduled Batch Control: step once ``logical_batch_size`` examples are in.

  Steps ``inner`` when :math:`n \cdot \text{microbatch\_size} \ge
  \text{logical\_batch\_size}(t)`. With a constant ``k * microbatch_size`` it
  gives the same updates as ``optax.MultiSteps(inner, k)``, for every ``k``,
  but runs ``inner`` only on the microbatches that step. The port of
  torch-gqc's ``OptimizerWrapperSBC``, except that ``max_draws`` defaults to
  no limit (torch-gqc's 64 would cap a logical batch of more than 64
  microbatches, and nothing would say so).

  Args:
    inner: the optimizer that steps on the mean gradient.
    logical_batch_size: examples per optimizer step, constant or a schedule
      of the microbatch count.
    microbatch_size: examples per microbatch.
    max_draws: the most microbatches accumulated before a step is forced;
      None (the default) for no limit. With a constant
      ``logical_batch_size`` it must be at least
      ``ceil(logical_batch_size / microbatch_size)``. With no limit, a
      schedule that returns NaN, inf or a negative value keeps the gate closed,
      so no step is taken until it returns a valid value again (for good, if
      it never does); only ``num_bad_hyperparams`` in :func:`statistics`
      shows it. Log it, or pass a ``max_draws`` so that such a stretch still
      steps every ``max_draws`` microbatches.
    accumulator_dtype: dtype of the accumulator; None means float32, or the
      gradients' own dtype where it is wider or complex (see
      :func:`optax_gqc.accumulate`).
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    noise_decay: as in :func:`gnts`.
    scale_by_draws: a function of :math:`n` that multiplies the inner update
      of a step that averaged :math:`n` microbatches (see
      :func:`optax_gqc.accumulate`); None (the default, as ``MultiSteps``)
      for no scaling.
    axis_name: as in :func:`gnts`.

  Returns:
    An :class:`~optax_gqc.AccumulationTransformation`, called once per
    microbatch.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.sbc(optax.adam(1e-3), logical_batch_size=256, microbatch_size=32)
  """
  tx = accumulate(
      inner,
      gates.batch_size_at_least(logical_batch_size, microbatch_size),
      max_draws=max_draws,
      microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
      noise_decay=_NOISE_DECAY if noise_decay is None else noise_decay,
      scale_by_draws=scale_by_draws,
      axis_name=axis_name,
  )
  _checks.check_draws_reach_batch(logical_batch_size, microbatch_size, max_draws)
  return tx


def noise_ratio_accumulation(
    inner: optax.GradientTransformation,
    tolerance: optax.ScalarOrSchedule,
    *,
    max_draws: int | None = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    noise_decay: float | None = None,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
) -> AccumulationTransformation:
  """Accumulates until the microbatch norms vary little (torch-gqc's GNS wrapper).

  ``accumulate(inner, gates.noise_ratio_below(tolerance))``: see
  :func:`optax_gqc.gates.noise_ratio_below`, a heuristic on the spread of the
  microbatch norms. The port of torch-gqc's ``OptimizerWrapperGNS``, also
  available as :func:`optax_gqc.gns`, torch-gqc's name. Despite that name it
  is not McCandlish's gradient noise scale; for that, read
  ``statistics(state)['noise_scale']`` of any accumulation.

  The engine's arguments (``max_draws``, ``microbatch_size``, ...) are as in
  :func:`gnts`.

  Args:
    inner: the optimizer, stepped on the mean gradient.
    tolerance: the gate's bound on the spread of the microbatch norms,
      constant or a schedule of the microbatch count (see
      :func:`optax_gqc.gates.noise_ratio_below`).

  Returns:
    An :class:`AccumulationTransformation`.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.noise_ratio_accumulation(optax.adamw(1e-3), tolerance=0.05)
  """
  _checks.check_gate_can_open('noise_ratio_accumulation', max_draws, tolerance=tolerance)
  return accumulate(
      inner,
      gates.noise_ratio_below(tolerance),
      max_draws=max_draws,
      microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
      noise_decay=_NOISE_DECAY if noise_decay is None else noise_decay,
      scale_by_draws=scale_by_draws,
      axis_name=axis_name,
  )


# torch-gqc's name, where its users will look for it.
gns = noise_ratio_accumulation


def mht(
    inner: optax.GradientTransformation,
    confidence: optax.ScalarOrSchedule,
    percent_error: optax.ScalarOrSchedule,
    *,
    decay: float = 0.99,
    max_draws: int | None = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    noise_decay: float | None = None,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
) -> AccumulationTransformation:
  """Accumulates until a t-interval on the loss is tight (torch-gqc's MHT wrapper).

  ``accumulate(inner, gates.loss_interval(confidence, percent_error, decay=decay))``:
  call ``update(grads, state, params, value=loss)`` with each microbatch's
  loss; see :func:`optax_gqc.gates.loss_interval`. The port of torch-gqc's
  ``OptimizerWrapperMHT``. Inside ``jax.shard_map``, pass the loss averaged
  across the devices (``jax.lax.pmean``), so that they all decide alike.

  The engine's arguments (``max_draws``, ``microbatch_size``, ...) are as in
  :func:`gnts`.

  Args:
    inner: the optimizer, stepped on the mean gradient.
    confidence: the interval's confidence in [0, 1), constant or a schedule.
    percent_error: its allowed half-width relative to the mean loss, >= 0;
      constant or a schedule.
    decay: the loss EMA's decay; torch-gqc's ``update_beta`` is ``1 - decay``.

  Returns:
    An :class:`AccumulationTransformation`, whose ``update`` takes
    ``value=loss``.

  Example:
    >>> import jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.05)
    >>> params = {'w': jnp.ones(2)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({'w': jnp.ones(2)}, state, params, value=1.5)
  """
  if not _checks.is_zero(confidence):  # at confidence 0 the interval is empty: it opens
    _checks.check_gate_can_open('mht', max_draws, percent_error=percent_error)
  return accumulate(
      inner,
      gates.loss_interval(confidence, percent_error, decay=decay),
      max_draws=max_draws,
      microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
      noise_decay=_NOISE_DECAY if noise_decay is None else noise_decay,
      scale_by_draws=scale_by_draws,
      axis_name=axis_name,
  )


def norm_test_accumulation(
    inner: optax.GradientTransformation,
    eta: optax.ScalarOrSchedule,
    *,
    max_draws: int | None = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    noise_decay: float | None = None,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
) -> AccumulationTransformation:
  """Accumulates until the mean gradient passes the norm test (Byrd et al., AdAdaGrad).

  ``accumulate(inner, gates.relative_error_below(eta))``: steps when the estimated
  variance of the mean gradient is at most ``eta**2`` times its squared norm,
  with the microbatches as the sample; see :func:`optax_gqc.gates.relative_error_below`.

  The engine's arguments (``max_draws``, ``microbatch_size``, ...) are as in
  :func:`gnts`.

  Args:
    inner: the optimizer, stepped on the mean gradient.
    eta: the test's bound on the mean gradient's relative error, > 0;
      constant or a schedule.

  Returns:
    An :class:`AccumulationTransformation`.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.norm_test_accumulation(optax.adagrad(1e-2), eta=0.5)
  """
  _checks.check_gate_can_open('norm_test_accumulation', max_draws, eta=eta)
  return accumulate(
      inner,
      gates.relative_error_below(eta),
      max_draws=max_draws,
      microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
      noise_decay=_NOISE_DECAY if noise_decay is None else noise_decay,
      scale_by_draws=scale_by_draws,
      axis_name=axis_name,
  )


def gnr(
    inner: optax.GradientTransformation, target: optax.ScalarOrSchedule
) -> optax.GradientTransformationExtraArgs:
  """Gradient Norm Rescaling: ``inner`` on gradients rescaled to ``target``.

  ``optax.chain(scale_to_norm(target), inner)``: steps every microbatch, with
  a gradient of global norm ``target(t)``. The port of torch-gqc's
  ``OptimizerWrapperGNR``. The inner state keeps the dtypes ``inner`` gives
  it alone: ``optax.adam`` with bfloat16 params and float32 gradients makes
  its moments float32 at the first update, which retraces ``jax.jit`` and
  breaks a ``lax.scan`` carry; the GNR recipes
  (:func:`gnr_with_cosine_schedule`) cast it back to ``init``'s dtypes, as
  the accumulations do.

  Args:
    inner: the optimizer.
    target: the gradient norm the optimizer sees, constant or a schedule.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.gnr(optax.adamw(1e-3), target=1.0)
  """
  _checks.check_transformation('inner', inner)
  return optax.chain(scale_to_norm(target), inner)
