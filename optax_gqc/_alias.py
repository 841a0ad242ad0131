"""The published GQC algorithms: the engine composed with a gate."""

from typing import Any

import optax

from optax_gqc import _checks, gates
from optax_gqc._accumulation import AccumulationTransformation, accumulate
from optax_gqc._scale_to_norm import scale_to_norm


def gnts(
    inner: optax.GradientTransformation,
    threshold: optax.ScalarOrSchedule | None = None,
    *,
    ratio: optax.ScalarOrSchedule | None = None,
    eta: optax.ScalarOrSchedule | None = None,
    max_draws: int | None = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    axis_name: Any = None,
) -> AccumulationTransformation:
  r"""Gradient Norm Threshold Scheduling: accumulate until the mean is short.

  Steps ``inner`` on the mean :math:`\bar g` of the accumulated microbatch
  gradients as soon as it is short enough (or after ``max_draws``
  microbatches). Two modes:

  - *Scale-free* (the default, no ``threshold``): short means shorter than
    ``ratio`` times an EMA of the recent microbatch norms :math:`\|g_i\|`, a
    unit that follows the model and the stage of training,
    :func:`optax_gqc.gates.norm_below` with ``relative=True``; or the mean
    passes the norm test at ``eta``, :func:`optax_gqc.gates.relative_error_below`.
    The norm test is the valve for the signal-dominated start of training,
    where the mean of many microbatches is hardly shorter than one and a ratio
    below 1 alone would wait for ``max_draws``:

    .. math::

      \|\bar g\| \le \text{ratio} \cdot \overline{\|g_i\|}
      \quad \lor \quad \frac{V}{n} \le \eta^2 \|\bar g\|^2 .

  - *Absolute* (``threshold`` given): torch-gqc's ``OptimizerWrapperGNTS``,
    :math:`\|\bar g\| \le \text{threshold}(t)`, an L2 norm that must suit the
    model's gradients: one below the norms the model sees starves the gate,
    and every step is then forced (``statistics(state)['num_forced']``).
    ``eta``, if given, adds the valve.

  See :func:`optax_gqc.accumulate` for the mechanics and
  :func:`optax_gqc.gnts_with_cosine_schedule` for torch-gqc's recipe.

  Args:
    inner: the optimizer that steps on the mean gradient.
    threshold: None for the scale-free gate; else the absolute L2 norm of the
      mean gradient, constant or a schedule of the microbatch count.
    ratio: the scale-free threshold as a multiple of the EMA of microbatch
      norms, constant or a schedule; 0.5 by default. Only without
      ``threshold``.
    eta: the valve's allowed relative error of the mean; 0.8 by default
      without ``threshold``, no valve with one.
    max_draws: the most microbatches accumulated before a step is forced.
    microbatch_size: examples per microbatch (optional, for statistics).
    accumulator_dtype: dtype of the accumulator; None means float32.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    axis_name: inside ``jax.shard_map``, the mapped axis (or axes) over which
      the parameters are sharded (FSDP), so that the norms, and the decision,
      are global; see :func:`optax_gqc.accumulate`.

  Returns:
    An :class:`~optax_gqc.AccumulationTransformation`, called once per
    microbatch.

  Raises:
    ValueError: if both ``threshold`` and ``ratio`` are given.

  Example:
    >>> import jax, jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.gnts(optax.adamw(1e-3))  # scale-free
    >>> params = {'w': jnp.ones(4)}
    >>> state = tx.init(params)
    >>> update = jax.jit(tx.update)
    >>> for g in (1.0, -0.8, 0.9):  # the mean of the first two is short: a step
    ...   updates, state = update({'w': jnp.full(4, g)}, state, params)
    ...   print(int(state.num_draws), int(state.num_steps))
    1 0
    0 1
    1 1
    >>> parity = optax_gqc.gnts(optax.adamw(1e-3), threshold=0.5)  # torch-gqc's rule

  References:
    torch-gqc, `Gradient Quality Control <https://pypi.org/project/torch-gqc/>`_;
    Byrd et al, `Sample size selection in optimization methods for machine
    learning <https://doi.org/10.1007/s10107-012-0572-5>`_, 2012
  """
  if threshold is None:
    gate = gates.any_of(
        gates.norm_below(0.5 if ratio is None else ratio, relative=True),
        gates.relative_error_below(0.8 if eta is None else eta),
    )
  elif ratio is not None:
    raise ValueError(
        "gnts: give either threshold (an absolute norm, torch-gqc's rule) or ratio (the "
        'scale-free threshold, relative to the microbatch norms), not both'
    )
  elif eta is None:
    gate = gates.norm_below(threshold)
  else:
    gate = gates.any_of(gates.norm_below(threshold), gates.relative_error_below(eta))
  return accumulate(
      inner,
      gate,
      max_draws=max_draws,
      microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
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
      schedule that returns NaN or a negative value keeps the gate closed,
      so no step is taken until it returns a valid value again (for good, if
      it never does); only ``num_bad_hyperparams`` in :func:`statistics`
      shows it. Log it, or pass a ``max_draws`` so that such a stretch still
      steps every ``max_draws`` microbatches.
    accumulator_dtype: dtype of the accumulator; None means float32.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
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
    axis_name: Any = None,
) -> AccumulationTransformation:
  """Accumulates until the microbatch norms vary little (torch-gqc's GNS wrapper).

  ``accumulate(inner, gates.noise_ratio_below(tolerance))``: see
  :func:`optax_gqc.gates.noise_ratio_below`, a heuristic on the spread of the
  microbatch norms. The port of torch-gqc's ``OptimizerWrapperGNS``, also
  available as :func:`optax_gqc.gns`, torch-gqc's name. Despite that name it
  is not McCandlish's gradient noise scale; for that, read
  ``statistics(state)['noise_scale']`` of any accumulation. Other arguments
  as in :func:`gnts`.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.noise_ratio_accumulation(optax.adamw(1e-3), tolerance=0.05)
  """
  return accumulate(
      inner,
      gates.noise_ratio_below(tolerance),
      max_draws=max_draws,
      microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
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
    axis_name: Any = None,
) -> AccumulationTransformation:
  """Accumulates until a t-interval on the loss is tight (torch-gqc's MHT wrapper).

  ``accumulate(inner, gates.loss_interval(confidence, percent_error, decay=decay))``:
  call ``update(grads, state, params, value=loss)`` with each microbatch's
  loss; see :func:`optax_gqc.gates.loss_interval`. The port of torch-gqc's
  ``OptimizerWrapperMHT``. Other arguments as in :func:`gnts`. Inside
  ``jax.shard_map``, pass the loss averaged across the devices
  (``jax.lax.pmean``), so that they all decide alike.

  Example:
    >>> import jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.05)
    >>> params = {'w': jnp.ones(2)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({'w': jnp.ones(2)}, state, params, value=1.5)
  """
  return accumulate(
      inner,
      gates.loss_interval(confidence, percent_error, decay=decay),
      max_draws=max_draws,
      microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
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
    axis_name: Any = None,
) -> AccumulationTransformation:
  """Accumulates until the mean gradient passes the norm test (Byrd et al., AdAdaGrad).

  ``accumulate(inner, gates.relative_error_below(eta))``: steps when the estimated
  variance of the mean gradient is at most ``eta**2`` times its squared norm,
  with the microbatches as the sample; see :func:`optax_gqc.gates.relative_error_below`.
  Other arguments as in :func:`gnts`.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.norm_test_accumulation(optax.adagrad(1e-2), eta=0.5)
  """
  return accumulate(
      inner,
      gates.relative_error_below(eta),
      max_draws=max_draws,
      microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
      axis_name=axis_name,
  )


def gnr(
    inner: optax.GradientTransformation, target: optax.ScalarOrSchedule
) -> optax.GradientTransformationExtraArgs:
  """Gradient Norm Rescaling: ``inner`` on gradients rescaled to ``target``.

  ``optax.chain(scale_to_norm(target), inner)``: steps every microbatch, with
  a gradient of global norm ``target(t)``. The port of torch-gqc's
  ``OptimizerWrapperGNR``.

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
