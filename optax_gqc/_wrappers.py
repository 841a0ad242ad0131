"""The published GQC algorithms as Optax transformations."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_gqc import _checks, gates
from optax_gqc._accumulation import _sq_norm, accumulate, noise_scale_estimates


def gnts(
    inner: optax.GradientTransformation,
    threshold: optax.ScalarOrSchedule,
    *,
    max_draws: int = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
) -> optax.GradientTransformationExtraArgs:
  r"""Gradient Norm Threshold Scheduling: accumulate until the mean is short.

  Steps ``inner`` on the mean of the accumulated microbatch gradients as soon
  as :math:`\|\bar g\| \le \text{threshold}(t)` (or after ``max_draws``
  microbatches). The Optax port of torch-gqc's ``OptimizerWrapperGNTS``; see
  :func:`optax_gqc.accumulate` for the mechanics and
  :func:`optax_gqc.schedules.gnts_with_cosine_schedule` for its recipe.

  Args:
    inner: the optimizer that steps on the mean gradient.
    threshold: absolute L2 norm of the mean gradient, constant or a schedule
      of the microbatch count.
    max_draws: the most microbatches accumulated before a step is forced.
    microbatch_size: examples per microbatch (optional, for statistics).
    accumulator_dtype: dtype of the accumulator; None means float32.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`, called once per
    microbatch.

  Example:
    >>> import jax, jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.gnts(optax.adamw(1e-3), threshold=0.5, max_draws=8)
    >>> params = {'w': jnp.ones(4)}
    >>> state = tx.init(params)
    >>> grads = {'w': jnp.full(4, 0.1)}
    >>> updates, state = jax.jit(tx.update)(grads, state, params)
    >>> int(optax_gqc.statistics(state)['num_steps'])
    1

  References:
    torch-gqc, `Gradient Quality Control <https://pypi.org/project/torch-gqc/>`_
  """
  return accumulate(
      inner, gates.norm_below(threshold), max_draws=max_draws,
      microbatch_size=microbatch_size, accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
  )


def sbc(
    inner: optax.GradientTransformation,
    logical_batch_size: optax.ScalarOrSchedule,
    microbatch_size: int,
    *,
    max_draws: int = 64,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
) -> optax.GradientTransformationExtraArgs:
  r"""Scheduled Batch Control: step once ``logical_batch_size`` examples are in.

  Steps ``inner`` when :math:`n \cdot \text{microbatch\_size} \ge
  \text{logical\_batch\_size}(t)`. With a constant ``k * microbatch_size`` it
  gives the same updates as ``optax.MultiSteps(inner, k)``, but runs ``inner``
  only on the microbatches that step. The port of torch-gqc's
  ``OptimizerWrapperSBC``.

  Args:
    inner: the optimizer that steps on the mean gradient.
    logical_batch_size: examples per optimizer step, constant or a schedule
      of the microbatch count.
    microbatch_size: examples per microbatch.
    max_draws: the most microbatches accumulated before a step is forced.
    accumulator_dtype: dtype of the accumulator; None means float32.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.sbc(optax.adam(1e-3), logical_batch_size=256, microbatch_size=32)
  """
  return accumulate(
      inner, gates.batch_size_at_least(logical_batch_size, microbatch_size),
      max_draws=max_draws, microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype, skip_nonfinite=skip_nonfinite,
  )


def gns(
    inner: optax.GradientTransformation,
    tolerance: optax.ScalarOrSchedule,
    *,
    max_draws: int = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
) -> optax.GradientTransformationExtraArgs:
  """Accumulates until the microbatch norms vary little (torch-gqc's GNS wrapper).

  ``accumulate(inner, gates.noise_ratio_below(tolerance))``: see
  :func:`optax_gqc.gates.noise_ratio_below`, a heuristic on scalar norms
  (despite the name, not McCandlish's noise scale; for that, read
  ``statistics(state)['noise_scale']`` of any accumulation). The port of
  torch-gqc's ``OptimizerWrapperGNS``. Other arguments as in :func:`gnts`.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.gns(optax.adamw(1e-3), tolerance=0.05)
  """
  return accumulate(
      inner, gates.noise_ratio_below(tolerance), max_draws=max_draws,
      microbatch_size=microbatch_size, accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
  )


def mht(
    inner: optax.GradientTransformation,
    confidence: optax.ScalarOrSchedule,
    percent_error: optax.ScalarOrSchedule,
    *,
    beta: float = 0.01,
    max_draws: int = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
) -> optax.GradientTransformationExtraArgs:
  """Accumulates until a t-interval on the loss is tight (torch-gqc's MHT wrapper).

  ``accumulate(inner, gates.loss_interval(confidence, percent_error, beta=beta))``:
  call ``update(grads, state, params, value=loss)`` with each microbatch's
  loss; see :func:`optax_gqc.gates.loss_interval`. The port of torch-gqc's
  ``OptimizerWrapperMHT``. Other arguments as in :func:`gnts`.

  Example:
    >>> import jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.05)
    >>> params = {'w': jnp.ones(2)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({'w': jnp.ones(2)}, state, params, value=1.5)
  """
  return accumulate(
      inner, gates.loss_interval(confidence, percent_error, beta=beta), max_draws=max_draws,
      microbatch_size=microbatch_size, accumulator_dtype=accumulator_dtype,
      skip_nonfinite=skip_nonfinite,
  )


def norm_test_accumulation(
    inner: optax.GradientTransformation,
    eta: optax.ScalarOrSchedule,
    *,
    max_draws: int = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
) -> optax.GradientTransformationExtraArgs:
  """Accumulates until the mean gradient passes the norm test (Byrd et al., AdAdaGrad).

  ``accumulate(inner, gates.norm_test(eta))``: steps when the estimated
  variance of the mean gradient is at most ``eta**2`` times its squared norm,
  with the microbatches as the sample; see :func:`optax_gqc.gates.norm_test`.
  Other arguments as in :func:`gnts`.

  Example:
    >>> import optax, optax_gqc
    >>> tx = optax_gqc.norm_test_accumulation(optax.adagrad(1e-2), eta=0.5)
  """
  return accumulate(
      inner, gates.norm_test(eta), max_draws=max_draws, microbatch_size=microbatch_size,
      accumulator_dtype=accumulator_dtype, skip_nonfinite=skip_nonfinite,
  )


class NoiseScaleState(NamedTuple):
  """State of :func:`noise_scale`."""

  grad_sq_norm_ema: jax.Array  # float32: raw EMA of the |G|^2 estimates.
  trace_cov_ema: jax.Array  # float32: raw EMA of the tr(Sigma) estimates.
  noise_weight: jax.Array  # float32: 1 - beta^k after k updates, the EMAs' weight.
  noise_scale: jax.Array  # float32: B_simple, the ratio of the EMAs.


def noise_scale(
    beta: float = 0.99, *, axis_name: Any, microbatch_size: int | None = None
) -> optax.GradientTransformation:
  r"""Estimates the gradient noise scale across data-parallel devices; passes updates through.

  Under ``shard_map`` (or ``pmap``, or a named ``vmap``) over ``axis_name``,
  each of the :math:`D` devices holds the gradient of its own batch: that is
  the small batch (:math:`B_s`, its squared norm averaged over the devices),
  and their ``pmean`` the big one (:math:`B_b = D B_s`), both at the same
  parameters; see :func:`optax_gqc.noise_scale_estimates`. The estimates of
  :math:`|G|^2` and :math:`\operatorname{tr}(\Sigma)` are smoothed by EMAs
  (bias corrected, ``beta``) and divided: ``state.noise_scale`` is
  :math:`B_\text{simple}`, in examples when ``microbatch_size`` (each
  device's batch) is given, in device batches otherwise.

  Place it on the local gradients, before they are averaged. It costs one
  ``pmean`` of the gradient, and scalar work. On one device,
  :func:`optax_gqc.accumulate` estimates the same quantity from its
  microbatches.

  Args:
    beta: EMA decay.
    axis_name: the data-parallel axis name.
    microbatch_size: examples per device batch (optional).

  Returns:
    A :class:`optax.GradientTransformation` that returns its input.

  References:
    McCandlish et al, `An Empirical Model of Large-Batch Training
    <https://arxiv.org/abs/1812.06162>`_, 2018
  """
  _checks.check_unit_interval('beta', beta)
  if microbatch_size is not None:
    _checks.check_positive_int('microbatch_size', microbatch_size)
  batch = 1.0 if microbatch_size is None else float(microbatch_size)

  def init_fn(params):
    del params
    zero = lambda: jnp.zeros([], jnp.float32)  # noqa: E731
    return NoiseScaleState(zero(), zero(), zero(), jnp.full([], jnp.nan, jnp.float32))

  def update_fn(updates, state, params=None):
    del params
    devices = jax.lax.psum(1, axis_name)
    small_sq = jax.lax.pmean(_sq_norm(updates), axis_name)
    big_sq = _sq_norm(jax.lax.pmean(updates, axis_name))
    grad_sq, trace = noise_scale_estimates(batch, small_sq, devices * batch, big_sq)

    def ema(old, new):
      return beta * old + (1.0 - beta) * new

    g_ema, t_ema = ema(state.grad_sq_norm_ema, grad_sq), ema(state.trace_cov_ema, trace)
    return updates, NoiseScaleState(g_ema, t_ema, ema(state.noise_weight, 1.0), t_ema / g_ema)

  return optax.GradientTransformation(init_fn, update_fn)


class ScaleToNormState(NamedTuple):
  """State of :func:`scale_to_norm`."""

  count: jax.Array  # int32: updates seen, the argument of the target schedule.
  target: jax.Array  # float32: the target norm used at the latest update.
  grad_norm: jax.Array  # float32: ||g|| of the latest gradient, before rescaling.


def scale_to_norm(target: optax.ScalarOrSchedule) -> optax.GradientTransformation:
  r"""Rescales the gradient to a target global norm (Gradient Norm Rescaling).

  .. math::

    g \leftarrow g \cdot \frac{\text{target}(t)}{\|g\|},

  and a zero update when :math:`\|g\| = 0`. Chain it in front of any
  optimizer; :func:`gnr` does that. Unlike ``optax.clip_by_global_norm`` it
  also scales short gradients up.

  Args:
    target: the global L2 norm of the output, constant or a schedule of the
      update count.

  Returns:
    A :class:`optax.GradientTransformation`.

  Example:
    >>> import jax.numpy as jnp, optax_gqc
    >>> tx = optax_gqc.scale_to_norm(2.0)
    >>> g = {'w': jnp.array([3.0, 4.0])}
    >>> updates, _ = tx.update(g, tx.init(g))
    >>> updates['w']
    Array([1.2, 1.6], dtype=float32)
  """
  _checks.check_scalar_or_schedule('target', target)

  def value_at(count):
    return jnp.array(target(count) if callable(target) else target, jnp.float32)

  def init_fn(params):
    del params
    count = jnp.zeros([], jnp.int32)
    return ScaleToNormState(count, value_at(count), jnp.zeros([], jnp.float32))

  def update_fn(updates, state, params=None):
    del params
    norm = jnp.sqrt(_sq_norm(updates))
    goal = value_at(state.count)
    scale = jnp.where(norm > 0, goal / jnp.where(norm > 0, norm, 1.0), 0.0)
    updates = jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates)
    return updates, ScaleToNormState(optax.safe_increment(state.count), goal, norm)

  return optax.GradientTransformation(init_fn, update_fn)


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
  return optax.chain(scale_to_norm(target), inner)
