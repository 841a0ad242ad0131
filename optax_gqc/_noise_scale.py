"""The gradient noise scale of McCandlish et al.: its two-batch estimates, and a transformation.

:func:`noise_scale_estimates` is the arithmetic shared by the accumulation
engine (microbatches as the small batch) and :func:`noise_scale` (devices as
the small batch).
"""

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_gqc import _checks
from optax_gqc._numerics import axis_names, sq_norm, tracks_varying, varying_axes


def noise_scale_estimates(
    small_batch: Any, small_sq_norm: Any, big_batch: Any, big_sq_norm: Any
) -> tuple[jax.Array, jax.Array]:
  r"""Unbiased estimates of :math:`|G|^2` and :math:`\operatorname{tr}(\Sigma)` from two batches.

  From the squared norms of the mean gradient of a small batch of
  :math:`B_s` examples and a big batch of :math:`B_b` examples, taken at the
  same parameters (McCandlish et al. 2018, appendix A):

  .. math::

    |G|^2 \approx \frac{B_b |G_b|^2 - B_s |G_s|^2}{B_b - B_s}, \qquad
    \operatorname{tr}(\Sigma) \approx \frac{|G_s|^2 - |G_b|^2}{1/B_s - 1/B_b}.

  Average each over many steps before dividing: the noise scale
  :math:`B_\text{simple} = \operatorname{tr}(\Sigma) / |G|^2` is the ratio of
  the averages; the average of per-step ratios is badly biased.

  Args:
    small_batch: :math:`B_s`.
    small_sq_norm: :math:`|G_s|^2`.
    big_batch: :math:`B_b > B_s`.
    big_sq_norm: :math:`|G_b|^2`.

  Returns:
    ``(grad_sq_norm, trace_cov)``, float32 scalars (or arrays, broadcast).

  Raises:
    ValueError: if the batch sizes are known (not traced, scalars) and are
      not positive and finite, or equal (which gives 0 / 0).

  Example:
    >>> import optax_gqc
    >>> [float(x) for x in optax_gqc.noise_scale_estimates(8, 7.25, 64, 1.78125)]
    [1.0, 50.0]

  References:
    McCandlish et al, `An Empirical Model of Large-Batch Training
    <https://arxiv.org/abs/1812.06162>`_, 2018
  """
  known = [
      None if isinstance(b, jax.core.Tracer) or np.ndim(b) != 0 else float(b)
      for b in (small_batch, big_batch)
  ]
  if None not in known and not (
      all(0 < b < math.inf for b in known) and known[0] != known[1]
  ):  # NaN fails the bounds
    why = 'equal sizes give 0 / 0' if known[0] == known[1] else 'a size is not positive and finite'
    raise ValueError(
        f'noise_scale_estimates: the batch sizes must be positive, finite and differ, got '
        f'small_batch={known[0]:g} and big_batch={known[1]:g}: {why}'
    )
  return estimates(small_batch, small_sq_norm, big_batch, big_sq_norm)


def estimates(
    small_batch: Any, small_sq_norm: Any, big_batch: Any, big_sq_norm: Any
) -> tuple[jax.Array, jax.Array]:
  """:func:`noise_scale_estimates` without its check of the batch sizes.

  The engine computes the estimates at every microbatch, a single one too
  (``n = 1``), and folds them in only where ``n >= 2``.
  """
  b_s, g_s, b_b, g_b = (
      jnp.asarray(x, jnp.float32) for x in (small_batch, small_sq_norm, big_batch, big_sq_norm)
  )
  grad_sq_norm = (b_b * g_b - b_s * g_s) / (b_b - b_s)
  trace_cov = (g_s - g_b) / (1.0 / b_s - 1.0 / b_b)
  return grad_sq_norm, trace_cov


class NoiseScaleState(NamedTuple):
  r"""Running estimates of the noise scale: the state of :func:`noise_scale`.

  Each field is a raw EMA; ``weight`` is their total weight, so the
  bias-corrected estimate of :math:`|G|^2` is ``grad_sq_norm_ema / weight``,
  and ``noise_scale`` their ratio: NaN before any estimate, infinite while
  the estimate of :math:`|G|^2` is not positive (the noise swamps the
  signal), and 0 while that of the trace is negative. Every gate and
  ``statistics`` read it by this one rule.

  :func:`optax_gqc.accumulate` keeps one too (``state.noise``), in
  microbatches, from the scalars it keeps anyway: at every step that averaged
  :math:`n \ge 2` microbatches, the small batch is one microbatch (its squared
  norm averaged over all :math:`n`) and the big batch is their mean; see
  :func:`optax_gqc.noise_scale_estimates`. Unlike GPT-NeoX's
  ``GradientNoiseScale``, both batches come from the same parameters (it pairs
  gradients from consecutive optimizer steps) and all microbatches of the step
  form the small-batch estimate, not only the last.

  The engine's estimate is unbiased when the decision to step does not depend
  on the current microbatches (:func:`optax_gqc.gates.batch_size_at_least`,
  :func:`optax_gqc.gates.critical_batch`, ``max_draws``). A gate that reads
  them chooses where to stop: GNTS stops when the mean happens to be short,
  which biases the estimate up, and the norm test biases it down. For a noise
  scale to trust, read it from such an accumulation, or from
  :func:`optax_gqc.noise_scale` across devices.
  """

  grad_sq_norm_ema: jax.Array  # float32: raw EMA of the |G|^2 estimates.
  trace_cov_ema: jax.Array  # float32: raw EMA of the tr(Sigma) estimates.
  weight: jax.Array  # float32: 1 - decay^k after k estimates, the EMAs' total weight.

  @property
  def noise_scale(self) -> jax.Array:
    """:math:`B_\text{simple}`, in the units of the small batch."""
    return ratio(self)


def init_noise_scale() -> NoiseScaleState:
  """Estimates before any: a weight of 0. Separate arrays, so that a donated state may hold them."""
  return NoiseScaleState(*(jnp.zeros([], jnp.float32) for _ in NoiseScaleState._fields))


def decay_ok(decay: Any) -> jax.Array:
  """Whether ``decay`` is in [0, 1): a traced one (``optax.inject_hyperparams``) is unchecked."""
  return (jnp.asarray(decay) >= 0) & (jnp.asarray(decay) < 1)


def fold(
    state: NoiseScaleState, grad_sq_norm: Any, trace_cov: Any, decay: Any, where: Any = True
) -> NoiseScaleState:
  """Folds one pair of estimates into the EMAs, where ``where``; keeps them elsewhere.

  A pair that is not finite (from a gradient that is not, or from sums of
  finite squared norms that overflow float32) is not folded: one would hold
  the EMAs at NaN for good.
  """
  where = where & jnp.isfinite(grad_sq_norm) & jnp.isfinite(trace_cov)

  def ema(old, new):  # in the state's dtype, whatever the decay's (a float64 one under x64)
    return jnp.where(where, decay * old + (1.0 - decay) * new, old).astype(old.dtype)

  return NoiseScaleState(
      ema(state.grad_sq_norm_ema, grad_sq_norm),
      ema(state.trace_cov_ema, trace_cov),
      ema(state.weight, 1.0),
  )


def ratio(state: NoiseScaleState) -> jax.Array:
  r"""The noise scale :math:`B_\text{simple} = \operatorname{tr}(\Sigma) / |G|^2` of the EMAs.

  The one edge rule of the package: NaN before any estimate; :math:`+\infty`
  while the estimate of :math:`|G|^2` is not positive (the noise swamps the
  signal); a negative estimate of the trace counts as 0. The EMAs' bias
  correction cancels in the ratio.
  """
  g, t = state.grad_sq_norm_ema, jnp.maximum(state.trace_cov_ema, 0.0)
  b = jnp.where(g > 0, t / jnp.where(g > 0, g, 1.0), jnp.inf)
  return jnp.where(state.weight > 0, b, jnp.nan)


def report(state: NoiseScaleState, examples: Any = 1.0) -> dict[str, jax.Array]:
  """What ``statistics`` logs of the estimates: bias-corrected, NaN before any.

  ``examples`` converts the small batch's units to examples (the engine's
  microbatch size).
  """
  weight = jnp.where(state.weight > 0, state.weight, jnp.nan)
  return {
      'noise_scale': ratio(state) * examples,
      'grad_sq_norm_est': state.grad_sq_norm_ema / weight,
      'trace_cov_est': state.trace_cov_ema / weight * examples,
  }


def noise_scale(
    decay: float = 0.99, *, axis_name: Any, microbatch_size: int | None = None
) -> optax.GradientTransformation:
  r"""Estimates the gradient noise scale across data-parallel devices; passes updates through.

  Under ``shard_map`` (or ``pmap``, or a named ``vmap``) over ``axis_name``,
  each of the :math:`D` devices holds the gradient of its own batch: that is
  the small batch (:math:`B_s`, its squared norm averaged over the devices),
  and their ``pmean`` the big one (:math:`B_b = D B_s`), both at the same
  parameters; see :func:`optax_gqc.noise_scale_estimates`. The estimates of
  :math:`|G|^2` and :math:`\operatorname{tr}(\Sigma)` are smoothed by EMAs
  (bias corrected, ``decay``) and divided: ``state.noise_scale`` is
  :math:`B_\text{simple}`, in examples when ``microbatch_size`` (each
  device's batch) is given, in device batches otherwise.

  Place it on the local gradients, before they are averaged. It costs one
  ``pmean`` of the gradient, and scalar work. A step whose gradients are not
  finite (on any device) leaves the estimates as they were, and so does one
  whose ``decay`` is outside [0, 1) (a traced one, under
  :func:`optax.inject_hyperparams`; a number is checked here). Over an axis of
  one device there is no second batch: the state stays as ``init`` made it,
  with a NaN noise scale (no estimate). On one device,
  :func:`optax_gqc.accumulate` estimates the same quantity from its
  microbatches.

  Under ``jax.shard_map``'s default ``check_vma=True``, the gradient of a
  parameter replicated across ``axis_name`` is already summed over the
  devices (the transpose of the implicit broadcast is a ``psum``): every
  device holds the same total, and :math:`B_\text{simple}` would come out
  near 0. This transformation raises then (it cannot tell under ``vmap``,
  ``pmap`` or ``check_vma=False``, where gradients already averaged give a
  noise scale of 0 without a word). To keep each device's own
  gradient, differentiate with respect to a varying copy of the parameters,
  and average the gradients for the optimizer after this transformation::

    def local_step(params, opt_state, batch):  # inside shard_map over 'data'
      local = jax.lax.pcast(params, 'data', to='varying')
      grads = jax.grad(loss_fn)(local, batch)  # this device's batch only
      grads, noise_state = noise_tx.update(grads, noise_state)
      grads = jax.lax.pmean(grads, 'data')  # the mean, for the optimizer
      ...

  or pass ``check_vma=False`` to ``shard_map``, where the gradients are local.

  Optax's ``optax.measure_with_ema`` smooths a measurement of the updates, but
  does not fit here: its ``init`` applies the measurement to the params, so a
  measurement that calls ``pmean`` would need ``axis_name`` bound where
  ``init`` runs, usually outside ``shard_map``; and it smooths one
  measurement, where :math:`B_\text{simple}` is the ratio of two separately
  smoothed EMAs (smoothing the per-step ratio is badly biased).

  Args:
    decay: EMA decay.
    axis_name: the data-parallel axis name (or a tuple of them).
    microbatch_size: examples per device batch (optional).

  Returns:
    A :class:`optax.GradientTransformation` that returns its input.

  Raises:
    ValueError: at trace time, under ``check_vma=True``, if a gradient leaf
      does not vary across ``axis_name``, i.e. is already summed.

  Example:
    Four devices as the lanes of a named ``vmap``, one gradient each:

    >>> import jax, jax.numpy as jnp, optax_gqc
    >>> tx = optax_gqc.noise_scale(decay=0.5, axis_name='data')
    >>> state = tx.init({'w': jnp.zeros(2)})
    >>> grads = {'w': jnp.array([[4.0, 1.0], [0.0, -1.0], [2.0, 1.0], [2.0, -1.0]])}
    >>> update = jax.vmap(tx.update, axis_name='data', in_axes=(0, None), out_axes=(0, None))
    >>> _, state = update(grads, state)
    >>> float(state.noise_scale)  # tr(Sigma) / |G|^2 = 4 / 3, in device batches
    1.3333333730697632

  References:
    McCandlish et al, `An Empirical Model of Large-Batch Training
    <https://arxiv.org/abs/1812.06162>`_, 2018
  """
  _checks.check_unit_interval('decay', decay)
  if axis_name is None or axis_name == ():
    raise ValueError(
        "noise_scale needs the data-parallel axis_name: it compares each device's gradient "
        'with their mean over that axis. On one device, the noise scale of an accumulation '
        '(optax_gqc.statistics of gnts, sbc, ...) needs none'
    )
  if microbatch_size is not None:
    _checks.check_positive_int('microbatch_size', microbatch_size)
  batch = 1.0 if microbatch_size is None else microbatch_size  # injected: a traced int

  def init_fn(params):
    del params
    return init_noise_scale()

  def update_fn(updates, state, params=None):
    del params
    try:
      devices = jax.lax.psum(1, axis_name)
    except NameError as e:
      raise NameError(
          f'noise_scale: axis_name {axis_name!r} is not a mapped axis here ({e}): call update '
          f'inside jax.shard_map (or pmap, or vmap with axis_name={axis_name!r}) over the '
          'data-parallel axis'
      ) from e
    _check_per_device(updates, axis_name)
    if isinstance(devices, int) and devices < 2:
      return updates, state  # one batch is both the small and the big one: no estimate
    small_sq = jax.lax.pmean(sq_norm(updates), axis_name)
    big_sq = sq_norm(jax.lax.pmean(updates, axis_name))
    grad_sq, trace = estimates(batch, small_sq, devices * batch, big_sq)
    return updates, fold(state, grad_sq, trace, decay, where=decay_ok(decay))

  return optax.GradientTransformation(init_fn, update_fn)


def _check_per_device(updates: Any, axis_name: Any) -> None:
  """Raises at trace time if JAX types a gradient leaf as the same on every device."""
  axes = axis_names(axis_name)
  if not tracks_varying(axes):
    return
  summed = [
      jax.tree_util.keystr(path)
      for path, g in jax.tree_util.tree_leaves_with_path(updates)
      if not set(axes) <= varying_axes(g)
  ]
  if summed:
    # A bare array has the empty path.
    which = f'gradients {", ".join(summed)} do' if any(summed) else 'gradient (a bare array) does'
    raise ValueError(
        f'noise_scale: the {which} not vary across '
        f'axis_name={axis_name!r}. Under shard_map with check_vma=True, JAX '
        'has already summed the gradients of parameters replicated across it, '
        'so no device holds the gradient of its own batch and the noise scale '
        'would be near 0. Differentiate with respect to '
        f"jax.lax.pcast(params, {axis_name!r}, to='varying') (then pmean the "
        'gradients after noise_scale), or pass check_vma=False to shard_map'
    )
