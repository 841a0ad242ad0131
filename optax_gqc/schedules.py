r"""Schedules of the microbatch count, and ports of torch-gqc's recipes.

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
on, and agree with it on :math:`[0, M]`.

The recipe factories (:func:`gnts_with_cosine_schedule` and its siblings)
schedule the inner optimizer's learning rate and weight decay per microbatch
as torch-gqc's factories do: the inner optimizer is built with
``optax.inject_hyperparams`` and its hyperparameters are set from the
microbatch count before every update.
"""

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from optax_gqc import _checks, _wrappers, gates
from optax_gqc._accumulation import accumulate

__all__ = [
    'constant_with_inverse_warmup',
    'constant_with_warmup',
    'cosine_with_inverse_warmup',
    'cosine_with_warmup',
    'gns_default',
    'gns_with_cosine_schedule',
    'gnr_with_cosine_schedule',
    'gnr_with_cosine_schedule_conventional_lr',
    'gnts_with_cosine_schedule',
    'gnts_with_cosine_schedule_conventional_lr',
    'mht_with_warmup_schedule',
    'polynomial_with_inverse_warmup',
    'polynomial_with_warmup',
    'sbc_with_polynomial_schedule',
    'sbc_with_polynomial_schedule_conventional_lr',
    'scheduled_accumulation',
]


def _check_steps(warmup_steps: int, total_steps: int | None = None) -> None:
  if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
    raise ValueError(f'warmup_steps must be an int >= 0, got {warmup_steps!r}')
  if total_steps is not None and (
      isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 0
  ):
    raise ValueError(f'total_steps must be an int >= 0, got {total_steps!r}')


def _divide(x: jax.Array, divisor: float) -> jax.Array:
  """``x / divisor`` as written.

  XLA turns a division by a constant into a multiplication by its reciprocal,
  which rounds differently: ``32 * 375 / 500`` would come out 24.000002 rather
  than 24, and an SBC gate at 3 x 8 examples would miss the step that
  torch-gqc takes. The barrier keeps the division.
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
  """
  _check_steps(warmup_steps)
  return _schedule(warmup_steps, None, _warm(value), lambda p: value + 0.0 * p)


def constant_with_inverse_warmup(
    value: float, warmup_steps: int, warmup_multiplier: float = 20.0
) -> optax.Schedule:
  """Linear from ``warmup_multiplier * value`` down to ``value``, then constant.

  Mirrors torch-schedule-anything's ``constant_with_inverse_warmup``.
  """
  _check_steps(warmup_steps)
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
  return _schedule(
      warmup_steps, total_steps, _warm(peak_value), _cosine(peak_value, end_value)
  )


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
  """
  _check_steps(warmup_steps, total_steps)
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
  """
  _check_steps(warmup_steps, total_steps)
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
  """
  _check_steps(warmup_steps, total_steps)
  return _schedule(
      warmup_steps,
      total_steps,
      _inverse_warm(peak_value, warmup_multiplier),
      _polynomial(peak_value, end_value, power),
  )


# The recipes. torch-gqc's factories take a built torch optimizer and scale its
# learning rate and weight decay by schedules of the microbatch count. Here the
# inner optimizer is built from a factory such as ``optax.adamw``.


def _check_base(name: str, value: Any) -> None:
  if callable(value):
    raise TypeError(f'{name} must be a number: this recipe schedules it per microbatch')
  _checks.check_scalar_or_schedule(name, value)


def scheduled_accumulation(
    optimizer: Callable[..., optax.GradientTransformation],
    gate: gates.Gate,
    hyperparams: Mapping[str, optax.Schedule],
    *,
    max_draws: int = 64,
    microbatch_size: int | None = None,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """An accumulation whose inner hyperparameters follow schedules of the *microbatch* count.

  ``accumulate(inject_hyperparams(optimizer)(**optimizer_kwargs, **hyperparams), gate)``,
  except that before every update ``hyperparams[k](t)`` is written into the
  inner state, with ``t`` the engine's microbatch count: a schedule of tokens
  seen, as torch-gqc's schedules are, rather than of optimizer steps, whose
  pace the gate decides. Only scalars change, outside the engine's
  ``lax.cond``, so it costs nothing per parameter. The recipe factories of
  this module are built on it.

  Args:
    optimizer: a factory such as ``optax.adamw``.
    gate: the accumulation's gate.
    hyperparams: schedules of the microbatch count, by argument name of
      ``optimizer`` (e.g. ``{'learning_rate': ...}``).
    max_draws: the most microbatches accumulated before a step is forced.
    microbatch_size: examples per microbatch (optional, for statistics).
    **optimizer_kwargs: the other arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`; the current values are in
    ``optax.tree.get(state, 'hyperparams')``.

  Example:
    >>> import optax, optax_gqc
    >>> from optax_gqc import gates, schedules
    >>> tx = schedules.scheduled_accumulation(
    ...     optax.adamw, gates.norm_below(0.5),
    ...     {'learning_rate': optax.cosine_decay_schedule(1e-3, 10_000)}, weight_decay=0.1)
  """
  inner = optax.inject_hyperparams(optimizer)(
      **optimizer_kwargs, **{k: s(jnp.zeros([], jnp.int32)) for k, s in hyperparams.items()}
  )
  tx = accumulate(inner, gate, max_draws=max_draws, microbatch_size=microbatch_size)

  def update_fn(updates, state, params=None, **extra_args):
    hyper = dict(state.inner_state.hyperparams)
    for k, schedule in hyperparams.items():
      hyper[k] = jnp.asarray(schedule(state.num_batches), hyper[k].dtype)
    state = state._replace(inner_state=state.inner_state._replace(hyperparams=hyper))
    return tx.update(updates, state, params, **extra_args)

  return optax.GradientTransformationExtraArgs(tx.init, update_fn)


def _constant_lr_decaying_wd(learning_rate, weight_decay, warmup_steps, total_steps):
  """torch-gqc's usual recipe: lr warms up and stays; weight decay warms up, then anneals to 0."""
  _check_base('learning_rate', learning_rate)
  out = {'learning_rate': constant_with_warmup(learning_rate, warmup_steps)}
  if weight_decay is not None:
    _check_base('weight_decay', weight_decay)
    out['weight_decay'] = cosine_with_warmup(weight_decay, 0.0, warmup_steps, total_steps)
  return out


def _conventional_lr(learning_rate, warmup_steps, total_steps):
  """The ``_conventional_lr`` recipes: lr warms up, then a quarter cosine to 0."""
  _check_base('learning_rate', learning_rate)
  return {'learning_rate': cosine_with_warmup(learning_rate, 0.0, warmup_steps, total_steps)}


def gnts_with_cosine_schedule(
    learning_rate: float,
    total_steps: int,
    warmup_steps: int,
    initial_threshold: float = 0.95,
    final_threshold: float = 0.25,
    warmup_multiplier: float = 10.0,
    max_draws: int = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNTS with a constant learning rate and an annealed threshold.

  The port of torch-gqc's ``make_gnts_with_cosine_annealing_schedule``. All
  schedules advance once per microbatch:

  - learning rate: linear warmup to ``learning_rate``, then constant;
  - threshold: inverse warmup from ``warmup_multiplier * initial_threshold``
    down to ``initial_threshold``, then a quarter cosine to ``final_threshold``;
  - weight decay: linear warmup to ``weight_decay``, then a quarter cosine to 0.

  Args:
    learning_rate: the inner optimizer's learning rate after warmup.
    total_steps: microbatches in the run (torch-gqc's ``num_training_steps``).
    warmup_steps: microbatches of warmup (``num_warmup_steps``).
    initial_threshold: threshold at the end of the warmup.
    final_threshold: threshold at ``total_steps``.
    warmup_multiplier: the threshold starts at this times ``initial_threshold``.
    max_draws: the most microbatches accumulated before a step is forced.
    optimizer: a factory of the inner optimizer taking ``learning_rate`` (and
      ``weight_decay`` unless it is None), e.g. ``optax.adamw``.
    weight_decay: the inner weight decay after warmup; None for an optimizer
      without one. torch's ``AdamW`` default, 0.01, by default.
    **optimizer_kwargs: further arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` called once per
    microbatch; the current learning rate and weight decay are in
    ``optax.tree.get(state, 'hyperparams')``.

  Example:
    >>> import optax_gqc
    >>> tx = optax_gqc.schedules.gnts_with_cosine_schedule(
    ...     3e-3, total_steps=10_000, warmup_steps=500)
  """
  threshold = cosine_with_inverse_warmup(
      initial_threshold, final_threshold, warmup_steps, total_steps, warmup_multiplier
  )
  hyperparams = _constant_lr_decaying_wd(learning_rate, weight_decay, warmup_steps, total_steps)
  gate = gates.norm_below(threshold)
  return scheduled_accumulation(
      optimizer, gate, hyperparams, max_draws=max_draws, **optimizer_kwargs)


def gnts_with_cosine_schedule_conventional_lr(
    learning_rate: float,
    total_steps: int,
    warmup_steps: int,
    initial_threshold: float = 0.95,
    final_threshold: float = 0.25,
    warmup_multiplier: float = 10.0,
    max_draws: int = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNTS with a warmup-cosine learning rate and an annealed threshold.

  The port of torch-gqc's ``make_gnts_with_cosine_annealing_schedule_conventional_lr``:
  the learning rate warms up linearly, then anneals by a quarter cosine to 0;
  the threshold follows :func:`gnts_with_cosine_schedule`; the weight decay
  (in ``optimizer_kwargs``) is not scheduled. Arguments as in
  :func:`gnts_with_cosine_schedule`.
  """
  threshold = cosine_with_inverse_warmup(
      initial_threshold, final_threshold, warmup_steps, total_steps, warmup_multiplier
  )
  hyperparams = _conventional_lr(learning_rate, warmup_steps, total_steps)
  gate = gates.norm_below(threshold)
  return scheduled_accumulation(
      optimizer, gate, hyperparams, max_draws=max_draws, **optimizer_kwargs)


def _gnr_recipe(target, optimizer, hyperparams, optimizer_kwargs):
  # GNR steps on every microbatch, so the optimizer's own count is the
  # microbatch count and inject_hyperparams can evaluate the schedules itself.
  return optax.chain(
      _wrappers.scale_to_norm(target),
      optax.inject_hyperparams(optimizer)(**optimizer_kwargs, **hyperparams),
  )


def gnr_with_cosine_schedule(
    learning_rate: float,
    initial_norm: float,
    final_norm: float,
    total_steps: int,
    warmup_steps: int,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNR with a constant learning rate and an annealed target norm.

  The port of torch-gqc's ``make_gnr_with_cosine_annealing_schedule``:

  - learning rate: linear warmup to ``learning_rate``, then constant;
  - target norm: linear warmup to ``initial_norm``, then a quarter cosine to
    ``final_norm``;
  - weight decay: linear warmup to ``weight_decay``, then a quarter cosine to 0.

  Args:
    learning_rate: the inner optimizer's learning rate after warmup.
    initial_norm: target gradient norm at the end of the warmup.
    final_norm: target gradient norm at ``total_steps``.
    total_steps: microbatches in the run.
    warmup_steps: microbatches of warmup.
    optimizer: a factory of the inner optimizer, e.g. ``optax.adamw``.
    weight_decay: the inner weight decay after warmup; None for an optimizer
      without one.
    **optimizer_kwargs: further arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`.
  """
  _check_base('initial_norm', initial_norm)
  _check_base('final_norm', final_norm)
  target = cosine_with_warmup(initial_norm, final_norm, warmup_steps, total_steps)
  hyperparams = _constant_lr_decaying_wd(learning_rate, weight_decay, warmup_steps, total_steps)
  return _gnr_recipe(target, optimizer, hyperparams, optimizer_kwargs)


def gnr_with_cosine_schedule_conventional_lr(
    learning_rate: float,
    initial_norm: float,
    final_norm: float,
    total_steps: int,
    warmup_steps: int,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNR with a warmup-cosine learning rate and an annealed target norm.

  The port of torch-gqc's ``make_gnr_with_cosine_annealing_schedule_conventional_lr``:
  the learning rate warms up, then anneals by a quarter cosine to 0; the target
  norm follows :func:`gnr_with_cosine_schedule`; the weight decay is not
  scheduled. Arguments as in :func:`gnr_with_cosine_schedule`.
  """
  _check_base('initial_norm', initial_norm)
  _check_base('final_norm', final_norm)
  target = cosine_with_warmup(initial_norm, final_norm, warmup_steps, total_steps)
  hyperparams = _conventional_lr(learning_rate, warmup_steps, total_steps)
  return _gnr_recipe(target, optimizer, hyperparams, optimizer_kwargs)


def sbc_with_polynomial_schedule(
    learning_rate: float,
    microbatch_size: int,
    initial_batch_size: float,
    final_batch_size: float,
    total_steps: int,
    warmup_steps: int,
    power: float = 2.0,
    max_draws: int = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """SBC with a polynomially growing logical batch and a constant learning rate.

  The port of torch-gqc's ``make_sbc_with_polynomial_schedule``:

  - logical batch size: linear warmup from 0 to ``initial_batch_size`` (so it
    steps on every microbatch early on), then
    ``final - (final - initial) (1 - p)^power``;
  - learning rate: linear warmup to ``learning_rate``, then constant;
  - weight decay: linear warmup to ``weight_decay``, then a quarter cosine to 0.

  Args:
    learning_rate: the inner optimizer's learning rate after warmup.
    microbatch_size: examples per microbatch (``physical_batch_size``).
    initial_batch_size: logical batch size at the end of the warmup.
    final_batch_size: logical batch size at ``total_steps``.
    total_steps: microbatches in the run.
    warmup_steps: microbatches of warmup.
    power: exponent of the polynomial (``polynomial_power``).
    max_draws: the most microbatches accumulated before a step is forced.
    optimizer: a factory of the inner optimizer, e.g. ``optax.adamw``.
    weight_decay: the inner weight decay after warmup; None for an optimizer
      without one.
    **optimizer_kwargs: further arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` called once per microbatch.
  """
  batch = polynomial_with_warmup(
      initial_batch_size, final_batch_size, warmup_steps, total_steps, power
  )
  hyperparams = _constant_lr_decaying_wd(learning_rate, weight_decay, warmup_steps, total_steps)
  gate = gates.batch_size_at_least(batch, microbatch_size)
  return scheduled_accumulation(
      optimizer, gate, hyperparams, max_draws=max_draws, **optimizer_kwargs)


def sbc_with_polynomial_schedule_conventional_lr(
    learning_rate: float,
    microbatch_size: int,
    initial_batch_size: float,
    final_batch_size: float,
    total_steps: int,
    warmup_steps: int,
    power: float = 2.0,
    max_draws: int = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """SBC with a polynomially growing logical batch and a warmup-cosine learning rate.

  The port of torch-gqc's ``make_sbc_with_polynomial_schedule_conventional_lr``:
  the learning rate warms up, then anneals by a quarter cosine to 0; the
  logical batch follows :func:`sbc_with_polynomial_schedule`; the weight decay
  is not scheduled. Arguments as in :func:`sbc_with_polynomial_schedule`.
  """
  batch = polynomial_with_warmup(
      initial_batch_size, final_batch_size, warmup_steps, total_steps, power
  )
  hyperparams = _conventional_lr(learning_rate, warmup_steps, total_steps)
  gate = gates.batch_size_at_least(batch, microbatch_size)
  return scheduled_accumulation(
      optimizer, gate, hyperparams, max_draws=max_draws, **optimizer_kwargs)


def gns_with_cosine_schedule(
    learning_rate: float,
    initial_tolerance: float,
    final_tolerance: float,
    total_steps: int,
    warmup_steps: int,
    warmup_multiplier: float = 10.0,
    max_draws: int = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNS with a warmup-cosine learning rate and an annealed tolerance.

  The port of torch-gqc's ``make_gns_with_cosine_annealing_schedule``: the
  learning rate warms up, then anneals by a quarter cosine to 0; the tolerance
  of :func:`optax_gqc.gates.noise_ratio_below` falls from ``warmup_multiplier *
  initial_tolerance`` to ``initial_tolerance`` over the warmup, then by a
  quarter cosine to ``final_tolerance``. Schedules advance per microbatch.

  Args:
    learning_rate: the inner optimizer's peak learning rate.
    initial_tolerance: tolerance at the end of the warmup.
    final_tolerance: tolerance at ``total_steps``.
    total_steps: microbatches in the run.
    warmup_steps: microbatches of warmup.
    warmup_multiplier: the tolerance starts at this times ``initial_tolerance``.
    max_draws: the most microbatches accumulated before a step is forced.
    optimizer: a factory of the inner optimizer, e.g. ``optax.adamw``.
    **optimizer_kwargs: further arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`.
  """
  tolerance = cosine_with_inverse_warmup(
      initial_tolerance, final_tolerance, warmup_steps, total_steps, warmup_multiplier
  )
  hyperparams = _conventional_lr(learning_rate, warmup_steps, total_steps)
  gate = gates.noise_ratio_below(tolerance)
  return scheduled_accumulation(
      optimizer, gate, hyperparams, max_draws=max_draws, **optimizer_kwargs)


def gns_default(
    learning_rate: float,
    tolerance: float,
    total_steps: int,
    warmup_steps: int,
    max_draws: int = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNS with a warmup-cosine learning rate and a constant tolerance after an inverse warmup.

  The port of torch-gqc's ``make_gns_default``: the learning rate as in
  :func:`gns_with_cosine_schedule`; the tolerance falls from 20 times
  ``tolerance`` (torch-schedule-anything's default multiplier, which that
  factory keeps) to ``tolerance`` over the warmup, then stays. Arguments as in
  :func:`gns_with_cosine_schedule`.
  """
  hyperparams = _conventional_lr(learning_rate, warmup_steps, total_steps)
  gate = gates.noise_ratio_below(constant_with_inverse_warmup(tolerance, warmup_steps))
  return scheduled_accumulation(
      optimizer, gate, hyperparams, max_draws=max_draws, **optimizer_kwargs)


def mht_with_warmup_schedule(
    learning_rate: float,
    confidence: float,
    percent_error: float,
    total_steps: int,
    warmup_steps: int,
    max_draws: int = 64,
    *,
    beta: float = 0.01,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """MHT with a warmup-cosine learning rate and warmed-up test parameters.

  The port of torch-gqc's ``make_mht_with_warmup_schedule``: the learning
  rate warms up, then anneals by a quarter cosine to 0; the confidence and
  the percent error of :func:`optax_gqc.gates.loss_interval` warm up linearly
  from 0 to ``confidence`` and ``percent_error``, then stay (so early steps
  come fast). Call ``update(..., value=loss)``.

  Args:
    learning_rate: the inner optimizer's peak learning rate.
    confidence: the interval's confidence after the warmup.
    percent_error: its allowed relative half-width after the warmup.
    total_steps: microbatches in the run.
    warmup_steps: microbatches of warmup.
    max_draws: the most microbatches accumulated before a step is forced.
    beta: the weight of a new loss in the loss EMA.
    optimizer: a factory of the inner optimizer, e.g. ``optax.adamw``.
    **optimizer_kwargs: further arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`.
  """
  gate = gates.loss_interval(
      cosine_with_warmup(confidence, confidence, warmup_steps, total_steps),
      cosine_with_warmup(percent_error, percent_error, warmup_steps, total_steps),
      beta=beta,
  )
  hyperparams = _conventional_lr(learning_rate, warmup_steps, total_steps)
  return scheduled_accumulation(
      optimizer, gate, hyperparams, max_draws=max_draws, **optimizer_kwargs)
