"""Ports of torch-gqc's recipe factories, and the accumulation they are built on.

The recipe factories (:func:`gnts_with_cosine_schedule` and its siblings)
schedule the inner optimizer's learning rate and weight decay per microbatch
as torch-gqc's factories do: the inner optimizer is built with
``optax.inject_hyperparams`` and its hyperparameters are set from the
microbatch count before every update.
"""

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from optax_gqc import _checks, gates
from optax_gqc._accumulation import (
    AccumulationTransformation,
    accumulate,
    check_state,
    gate_entries,
)
from optax_gqc._scale_to_norm import scale_to_norm
from optax_gqc.schedules import (
    constant_with_inverse_warmup,
    constant_with_warmup,
    cosine_with_inverse_warmup,
    cosine_with_warmup,
    polynomial_with_warmup,
)


def _check_base(name: str, value: Any) -> None:
  if hasattr(value, 'init') and hasattr(value, 'update'):  # torch's order: the optimizer first
    raise TypeError(
        f'{name} must be a number, got the transformation {type(value).__name__}: a recipe '
        f'takes {name} first and builds its optimizer from a factory, optimizer=optax.adamw'
    )
  if callable(value):
    raise TypeError(
        f'{name} must be a number, got a function: a recipe takes one value of each number '
        '(and schedules those it schedules itself). Pass one value, or build your own '
        'schedules with scheduled_accumulation'
    )
  if not _checks.is_number(value):
    raise TypeError(f'{name} must be a number, got {type(value).__name__} {value!r}')
  _checks.check_scalar_or_schedule(name, value, finite=True)


def _check_optimizer(optimizer: Any, names: Any) -> None:
  """Raises unless ``optimizer`` is a factory that takes every argument in ``names``."""
  if hasattr(optimizer, 'init') and hasattr(optimizer, 'update'):
    raise TypeError(
        'optimizer must be a factory such as optax.adamw, not a transformation built from '
        'one (optax.adamw(1e-3)): the learning rate is scheduled per microbatch. Pass the '
        'function itself, and its other arguments as keywords'
    )
  if not callable(optimizer):
    raise TypeError(
        f'optimizer must be a factory such as optax.adamw, got {type(optimizer).__name__}'
    )
  try:
    parameters = inspect.signature(optimizer).parameters
  except (TypeError, ValueError):  # no signature to read: inject_hyperparams will tell
    return
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
    return
  for name in names:
    if name not in parameters:
      if name == 'weight_decay':
        hint = (
            'pass weight_decay=None for an optimizer without one, or, for the L2 weight decay '
            "of torch's SGD and Adam, a factory that chains optax.add_decayed_weights("
            'weight_decay) before it (docs/migration.md)'
        )
      elif name in inspect.signature(accumulate).parameters:  # not a recipe's argument
        hint = (
            f"{name} is an accumulation's argument that this recipe does not take. A GNR "
            'recipe accumulates nothing: it rescales the gradient of every microbatch and '
            'steps on each. The others keep noise_decay at 0.99: for another, build the run '
            'with scheduled_accumulation'
        )
      else:
        hint = 'schedule only arguments that it takes'

      raise TypeError(
          f'optimizer {getattr(optimizer, "__name__", optimizer)} takes no argument '
          f'{name!r}: {hint}'
      )


def schedule_by_microbatch(
    tx: AccumulationTransformation, **schedules: optax.Schedule
) -> AccumulationTransformation:
  """Sets the inner optimizer's hyperparameters from schedules of the *microbatch* count.

  Inside an accumulation the inner optimizer runs once per step, so its own
  schedules advance with the optimizer steps, whose pace the gate decides.
  To step at the learning rate of the tokens seen instead, build the inner
  optimizer with ``optax.inject_hyperparams`` and wrap the accumulation:
  before every update, ``schedules[name](t)`` is written into the inner
  state's hyperparameter ``name``, with ``t`` the engine's ``num_microbatches``
  (the microbatches accepted before this one); every hyperparameter of that
  name, each group's in an ``optax.partition`` (for groups at different rates,
  inject the same rate in each and scale a group's updates by its factor,
  ``optax.chain(inner, optax.scale(2.0))``). Only scalars change, outside
  the engine's ``lax.cond``: it costs nothing per parameter. The same as
  setting them by hand before each update,
  ``state = optax.tree.set(state, learning_rate=schedule(optax.tree.get(state,
  'num_microbatches')))``.

  Args:
    tx: an accumulation (:func:`optax_gqc.gnts`, :func:`optax_gqc.sbc`,
      :func:`optax_gqc.accumulate`, ...) whose inner optimizer injects
      every hyperparameter named in ``schedules``.
    **schedules: schedules of the microbatch count, by hyperparameter name.

  Returns:
    The accumulation with its hyperparameters scheduled.

  Example:
    >>> import optax, optax_gqc
    >>> schedule = optax.cosine_decay_schedule(3e-3, 10_000)  # of microbatches
    >>> inner = optax.inject_hyperparams(optax.adamw)(learning_rate=3e-3)
    >>> tx = optax_gqc.schedule_by_microbatch(optax_gqc.gnts(inner), learning_rate=schedule)
  """
  update_and_apply = getattr(tx, 'update_and_apply', None)
  if update_and_apply is None:
    raise TypeError(
        'schedule_by_microbatch takes an accumulation (gnts, sbc, accumulate, ...), got '
        f'{type(tx).__name__}'
    )
  for name, schedule in schedules.items():
    if not callable(schedule):
      raise TypeError(
          f'{name} must be a schedule (a function of the microbatch count), got {schedule!r}'
      )
    _checks.check_schedule(name, schedule)
  # A schedule_by_microbatch inside tx (a recipe's) writes its values after this one would.
  inner_names = getattr(tx.update, 'scheduled_by_microbatch', frozenset())
  twice = sorted(inner_names & schedules.keys())
  if twice:
    raise ValueError(
        f'schedule_by_microbatch: {", ".join(twice)} already follow a schedule of the microbatch '
        'count inside this accumulation (a recipe schedules its own), which would overwrite '
        'this one on every update. Build the run with scheduled_accumulation and your schedules'
    )

  def scheduled(state):
    check_state(state)
    own = functools.cache(lambda: jax.eval_shape(tx.init, state.accumulator))  # traced once
    values = {}
    for name, schedule in schedules.items():
      found = optax.tree.get_all_with_path(state.inner_state, name)
      if any(isinstance(value, float | int) for _, value in found):
        # A Python number written with optax.tree.set, overwritten below in init's dtype.
        found = optax.tree.get_all_with_path(own().inner_state, name)
      if not found:
        if jax.tree.structure(state) != jax.tree.structure(own()):
          return state  # not this transformation's state: the engine's check says what it is
        if name in dict(gate_entries(state.gate_state)):
          raise ValueError(
              f"schedule_by_microbatch: {name!r} is the gate's, not the inner optimizer's: "
              f"pass the schedule as the gate's own argument, {name}=schedule (to gnts, or to "
              "the gate's constructor), which a gate calls with the microbatch count"
          )
        injected = sorted(
            {
                k
                for _, h in optax.tree.get_all_with_path(state.inner_state, 'hyperparams')
                for k in h
            }
        )
        if injected:
          raise ValueError(
              f'schedule_by_microbatch: the inner optimizer has no injected hyperparameter '
              f'{name!r}; it injects {", ".join(injected)}. Schedule one of those, or leave '
              f"{name!r} out of the inner optimizer's static_args if it takes it"
          )
        raise ValueError(
            f'schedule_by_microbatch: the inner optimizer has no injected hyperparameter '
            f'{name!r}: build it with optax.inject_hyperparams, e.g. '
            f'optax.inject_hyperparams(optax.adamw)({name}=...), and leave {name!r} out of '
            "its static_args, which keep an argument out of the state's hyperparams"
        )
      if any(not hasattr(value, 'dtype') for _, value in found):
        raise ValueError(
            f'schedule_by_microbatch: the inner optimizer schedules {name!r} itself '
            '(optax.inject_hyperparams was given a schedule for it, which keeps a state): give '
            f'it a constant, e.g. optax.inject_hyperparams(optax.adamw)({name}=1e-3), and the '
            'schedule to schedule_by_microbatch alone'
        )
      integer = [value.dtype for _, value in found if not jnp.issubdtype(value.dtype, jnp.inexact)]
      if integer:  # the schedule's values would be truncated: 3e-3 becomes 0
        raise TypeError(
            f'schedule_by_microbatch: the inner optimizer holds {name!r} as {integer[0]}, '
            f'which would truncate the schedule (3e-3 becomes 0): give it a float, e.g. '
            f'optax.inject_hyperparams(optax.adamw)({name}=0.0), or '
            'inject_hyperparams(..., hyperparam_dtype=jnp.float32)'
        )
      narrow = [value.dtype for _, value in found if jnp.finfo(value.dtype).bits < 32]
      if narrow:  # inject_hyperparams took the params' dtype for every hyperparameter
        raise TypeError(
            f'schedule_by_microbatch: the inner optimizer holds {name!r} as {narrow[0]}, as '
            "inject_hyperparams does for every hyperparameter of low-precision params: Adam's "
            'b2=0.999 is then 1.0, and its steps NaN. Give it hyperparam_dtype=jnp.float32 '
            '(an argument of optax.inject_hyperparams, and of scheduled_accumulation)'
        )
      values[name] = jnp.asarray(schedule(state.num_microbatches), found[0][1].dtype)
    return state._replace(inner_state=optax.tree.set(state.inner_state, **values))

  def update_fn(updates, state, params=None, *loss, **extra_args):
    _checks.check_no_positional_loss(loss, 'update')
    return tx.update(updates, scheduled(state), params, **extra_args)

  def update_and_apply_fn(updates, state, params, *loss, **extra_args):
    _checks.check_no_positional_loss(loss, 'update_and_apply')
    return update_and_apply(updates, scheduled(state), params, **extra_args)

  update_fn.scheduled_by_microbatch = inner_names | frozenset(schedules)
  return AccumulationTransformation(tx.init, update_fn, update_and_apply_fn)


def scheduled_accumulation(
    optimizer: Callable[..., optax.GradientTransformation],
    gate: gates.Gate,
    hyperparams: Mapping[str, optax.Schedule],
    *,
    max_draws: int | None = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    noise_decay: float = 0.99,
    axis_name: Any = None,
    hyperparam_dtype: Any = jnp.float32,
    static_args: str | Iterable[str] = (),
    **optimizer_kwargs: Any,
) -> AccumulationTransformation:
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
    max_draws: the most microbatches accumulated before a step is forced;
      None for no limit.
    microbatch_size: examples per microbatch (optional, for statistics).
    accumulator_dtype: dtype of the accumulator; None as in
      :func:`optax_gqc.accumulate`.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    scale_by_draws: multiplies the inner updates by a function of the draws
      averaged; see :func:`optax_gqc.accumulate`.
    noise_decay: EMA decay of the noise-scale estimates; see
      :func:`optax_gqc.accumulate`.
    axis_name: inside ``jax.shard_map``, the mapped axis (or axes) over which
      the parameters are sharded; see :func:`optax_gqc.accumulate`.
    hyperparam_dtype: dtype of the injected hyperparameters, float32 by
      default whatever the params' dtype: in bfloat16 (what
      ``optax.inject_hyperparams`` would pick for bf16 params) Adam's
      ``b2=0.999`` rounds to 1 and its updates turn NaN.
    static_args: names of ``optimizer_kwargs`` passed to the optimizer as they
      are, as in ``optax.inject_hyperparams``: a function that is no schedule
      (masks, whose names end in ``mask``, and dtypes pass so already).
    **optimizer_kwargs: the other arguments of ``optimizer``: numbers, masks
      and dtypes, and what ``static_args`` names; a schedule goes in
      ``hyperparams``.

  Returns:
    An :class:`~optax_gqc.AccumulationTransformation`. The values are in
    ``optax.tree.get(state, 'hyperparams')``, written before each update at
    its microbatch count: after an accepted microbatch, the values it was
    taken at; after a rejected one (which does not advance the count), those
    the next microbatch will be taken at.

  Example:
    >>> import optax, optax_gqc
    >>> from optax_gqc import gates
    >>> tx = optax_gqc.scheduled_accumulation(
    ...     optax.adamw, gates.norm_below(0.5),
    ...     {'learning_rate': optax.cosine_decay_schedule(1e-3, 10_000)}, weight_decay=0.1)
  """
  if not isinstance(hyperparams, Mapping):
    raise TypeError(
        f'hyperparams must be a dict of schedules by argument name, got '
        f'{type(hyperparams).__name__}: pass e.g. {{"learning_rate": schedule}}'
    )
  for name, schedule in hyperparams.items():
    if not callable(schedule):
      raise TypeError(
          f'hyperparams[{name!r}] must be a schedule (a function of the microbatch count), '
          f'got {schedule!r}: pass a constant as a keyword argument of the optimizer'
      )
    _checks.check_schedule(f'hyperparams[{name!r}]', schedule)
  _check_optimizer(optimizer, hyperparams)
  _checks.check_float_dtype('hyperparam_dtype', hyperparam_dtype)
  if hyperparam_dtype is not None and jnp.finfo(hyperparam_dtype).bits < 32:
    raise ValueError(
        f'hyperparam_dtype {jnp.dtype(hyperparam_dtype)} is too narrow for the schedules: '
        "Adam's b2=0.999 rounds to 1 in it and its steps turn NaN. Pass hyperparam_dtype="
        'jnp.float32 (the default)'
    )
  both = sorted(set(hyperparams) & set(optimizer_kwargs))
  if both:
    raise ValueError(
        f'{", ".join(both)} both scheduled in hyperparams and passed as a constant: give each '
        'either a schedule in hyperparams or a number as a keyword, not both'
    )
  given = (static_args,) if isinstance(static_args, str) else tuple(static_args)
  unknown = [name for name in given if name not in optimizer_kwargs]
  if unknown:
    raise ValueError(
        f'static_args names {unknown}, not among the optimizer arguments passed '
        f'({sorted(optimizer_kwargs)}): name arguments passed as keywords'
    )
  static = tuple(dict.fromkeys([*_static_args(optimizer_kwargs), *given]))
  for name, value in optimizer_kwargs.items():
    if callable(value) and name not in static:
      raise TypeError(
          f'{name} is a function: as an argument of the optimizer, inject_hyperparams would '
          "make it a schedule of the inner optimizer's steps, whose pace the gate decides. "
          f'Pass a schedule in hyperparams ({{{name!r}: schedule}}), where it follows the '
          "microbatch count (a recipe's own schedules do; build such a run with "
          'scheduled_accumulation). A function that is no schedule reaches the optimizer as it '
          f"is when scheduled_accumulation's static_args names it (static_args=({name!r},)); "
          'masks (names ending in mask) and dtypes do so already'
      )
  inner = optax.inject_hyperparams(
      optimizer, static_args=static, hyperparam_dtype=hyperparam_dtype
  )(**optimizer_kwargs, **{k: _first_value(s, hyperparam_dtype) for k, s in hyperparams.items()})
  engine = _engine(
      max_draws, microbatch_size, accumulator_dtype, skip_nonfinite, scale_by_draws, axis_name
  )
  tx = accumulate(inner, gate, noise_decay=noise_decay, **engine)

  return schedule_by_microbatch(tx, **hyperparams)


def _first_value(schedule: optax.Schedule, dtype: Any) -> jax.Array:
  """``schedule(0)``, a float: an integer one would make inject_hyperparams keep an int."""
  value = schedule(jnp.zeros([], jnp.int32))
  if jnp.issubdtype(jnp.result_type(value), jnp.inexact):
    return value
  return jnp.asarray(value, jnp.float32 if dtype is None else dtype)


# torch-gqc's names of the recipes' arguments, which would reach the optimizer as its own.
_TORCH_GQC_NAMES = {
    'num_training_steps': 'total_microbatches',
    'num_warmup_steps': 'warmup_microbatches',
    'max_batch_draws': 'max_draws',
    'physical_batch_size': 'microbatch_size',
    'polynomial_power': 'power',
    'update_beta': 'decay (decay = 1 - update_beta)',
    'confidence_level': 'confidence',
    'percent_error_threshold': 'percent_error',
    'distributed_mode': (
        'nothing: pass the mean gradient over the devices (see docs/scale.md), and carry over '
        "the units of torch-gqc's that change with the devices: a replicated SBC's batch, a "
        "sharded GNTS's or GNR's norm"
    ),
}


def _run(
    total_microbatches: int | None,
    warmup_microbatches: int | None,
    total_steps: int | None,
    warmup_steps: int | None,
    optimizer_kwargs: Mapping[str, Any],
) -> tuple[int | None, int | None, int | None, int | None]:
  """A recipe's counts, as given; raises on an argument under its torch-gqc name."""
  for name in optimizer_kwargs:
    if name in _TORCH_GQC_NAMES:
      raise TypeError(
          f"{name} is torch-gqc's name: its port here is {_TORCH_GQC_NAMES[name]} "
          '(docs/migration.md lists them all)'
      )
  return total_microbatches, warmup_microbatches, total_steps, warmup_steps


def _given(name: str, value: int | None, alias: str, alias_value: int | None) -> tuple[str, int]:
  """The count passed as ``name`` or as its ``alias``, and the name it was passed as."""
  if value is not None and alias_value is not None:
    raise TypeError(
        f'{name} and {alias} are one argument, {alias} its alias: pass one of them, not both'
    )
  if alias_value is not None:
    return alias, alias_value
  if value is None:
    raise TypeError(
        f'missing the argument {name} (a number of microbatches, calls of update; '
        f'{alias} is its alias)'
    )
  return name, value


def _run_length(
    total_microbatches: int | None,
    warmup_microbatches: int | None,
    total_steps: int | None,
    warmup_steps: int | None,
    **numbers: Any,
) -> tuple[int, int]:
  """The run's and the warmup's microbatches, checked with the recipe's other numbers.

  Raises unless both counts are given once (by name or alias), the warmup fits
  in the run, and every number is >= 0. ``numbers`` are values after the
  warmup, not schedules: the recipe schedules them per microbatch. Errors
  name each count as it was passed.
  """
  total_name, total = _given('total_microbatches', total_microbatches, 'total_steps', total_steps)
  warmup_name, warmup = _given(
      'warmup_microbatches', warmup_microbatches, 'warmup_steps', warmup_steps
  )
  _checks.check_count(warmup_name, warmup, int32=True)
  _checks.check_count(total_name, total)
  if warmup > total:
    raise ValueError(
        f'{warmup_name} ({warmup}) must be <= {total_name} ({total}): the warmup is part of '
        f'the run. Pass {warmup_name} <= {total_name}'
    )
  for name, value in numbers.items():
    _check_base(name, value)
  return total, warmup


def _schedules(
    run: tuple[int | None, int | None, int | None, int | None],
    learning_rate: float,
    weight_decay: float | None,
    conventional_lr: bool,
    **numbers: Any,
) -> tuple[int, int, dict[str, optax.Schedule]]:
  """The run's and the warmup's microbatches, and the schedules of the inner optimizer.

  ``run`` is the recipe's ``(total_microbatches, warmup_microbatches,
  total_steps, warmup_steps)``, checked with ``learning_rate`` and ``numbers``
  by :func:`_run_length`. torch-gqc's usual schedules: the learning rate warms
  up and stays; the weight decay, unless None, warms up, then anneals by a
  quarter cosine to 0. With ``conventional_lr`` (the ``_conventional_lr``,
  GNS and MHT recipes) the learning rate warms up, then anneals by a quarter
  cosine to 0, and the weight decay, unless None, stays constant.
  """
  total, warmup = _run_length(*run, learning_rate=learning_rate, **numbers)
  if conventional_lr:
    hyperparams = {'learning_rate': cosine_with_warmup(learning_rate, 0.0, warmup, total)}
  else:
    hyperparams = {'learning_rate': constant_with_warmup(learning_rate, warmup)}
  if weight_decay is not None:
    _check_base('weight_decay', weight_decay)
    hyperparams['weight_decay'] = (
        optax.constant_schedule(weight_decay)
        if conventional_lr
        else cosine_with_warmup(weight_decay, 0.0, warmup, total)
    )
  return total, warmup, hyperparams


def _engine(
    max_draws, microbatch_size, accumulator_dtype, skip_nonfinite, scale_by_draws, axis_name
) -> dict[str, Any]:
  """The arguments that a recipe passes on to :func:`optax_gqc.accumulate`, by name."""
  return {
      'max_draws': max_draws,
      'microbatch_size': microbatch_size,
      'accumulator_dtype': accumulator_dtype,
      'skip_nonfinite': skip_nonfinite,
      'scale_by_draws': scale_by_draws,
      'axis_name': axis_name,
  }


def _accumulating_recipe(
    optimizer: Callable[..., optax.GradientTransformation],
    gate: gates.Gate,
    hyperparams: Mapping[str, optax.Schedule],
    optimizer_kwargs: Mapping[str, Any],
    engine: Mapping[str, Any],
) -> AccumulationTransformation:
  """A recipe's accumulation: :func:`scheduled_accumulation` with its gate and schedules."""
  _check_optimizer(optimizer, [*hyperparams, *optimizer_kwargs])
  return scheduled_accumulation(optimizer, gate, hyperparams, **engine, **optimizer_kwargs)


def _rescaling_recipe(
    optimizer: Callable[..., optax.GradientTransformation],
    target: optax.Schedule,
    hyperparams: Mapping[str, optax.Schedule],
    optimizer_kwargs: Mapping[str, Any],
) -> optax.GradientTransformationExtraArgs:
  """A GNR recipe: ``optimizer``, its hyperparameters scheduled, behind :func:`scale_to_norm`."""
  _check_optimizer(optimizer, [*hyperparams, *optimizer_kwargs])
  # GNR steps on every microbatch, so the optimizer's own count is the
  # microbatch count and inject_hyperparams can evaluate the schedules.
  injected = optax.inject_hyperparams(
      optimizer, static_args=_static_args(optimizer_kwargs), hyperparam_dtype=jnp.float32
  )
  return optax.chain(
      scale_to_norm(target), _keeping_dtypes(injected(**optimizer_kwargs, **hyperparams))
  )


def _keeping_dtypes(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """``tx`` with its state cast back to the dtypes ``init`` gave it after each update.

  float32 hyperparameters (``b1``...) would make bfloat16 moments float32 on
  the first update: a state that changes type retraces ``jax.jit`` and breaks
  ``lax.scan``. An accumulation casts its inner state back alike.
  """
  tx = optax.with_extra_args_support(tx)

  def update_fn(updates, state, params=None, **extra_args):
    updates, new_state = tx.update(updates, state, params, **extra_args)
    return updates, optax.tree.cast_like(new_state, state)

  return optax.GradientTransformationExtraArgs(tx.init, update_fn)


def _static_args(optimizer_kwargs: Mapping[str, Any]) -> tuple[str, ...]:
  """The optimizer's arguments that are a mask (a function of the params) or a dtype.

  They pass to the optimizer as they are: ``optax.inject_hyperparams`` would
  take them, as every function, for schedules of its step count. Any other
  function is such a schedule: :func:`scheduled_accumulation` refuses it (the
  gate paces the steps), ``gnr``'s recipes, which step on every microbatch,
  keep it.
  """
  return tuple(
      name
      for name, value in optimizer_kwargs.items()
      if callable(value) and (name.endswith('mask') or isinstance(value, type))
  )


def _annealed(
    name,
    gate,
    conventional_lr,
    run,
    learning_rate,
    weight_decay,
    annealing,
    optimizer,
    optimizer_kwargs,
    engine,
):
  """GNTS's and GNS's recipes: a gate whose ``name`` anneals, as ``gate(schedule)``.

  ``annealing`` is ``(initial, final, warmup_multiplier)``: the value falls from
  ``warmup_multiplier * initial`` to ``initial`` over the warmup, then by a
  quarter cosine to ``final``.
  """
  initial, final, warmup_multiplier = annealing
  total, warmup, hyperparams = _schedules(
      run,
      learning_rate,
      weight_decay,
      conventional_lr,
      **{f'initial_{name}': initial, f'final_{name}': final},
      warmup_multiplier=warmup_multiplier,
  )
  _checks.check_gate_can_open('the recipe', engine['max_draws'], **{f'final_{name}': final})
  schedule = cosine_with_inverse_warmup(initial, final, warmup, total, warmup_multiplier)
  return _accumulating_recipe(optimizer, gate(schedule), hyperparams, optimizer_kwargs, engine)


# GNTS's recipes: the threshold of gates.norm_below annealed.
_gnts = functools.partial(_annealed, 'threshold', gates.norm_below)


def _gnr(conventional_lr, run, learning_rate, weight_decay, norms, optimizer, optimizer_kwargs):
  """:func:`gnr_with_cosine_schedule`, or its ``_conventional_lr`` sibling."""
  initial_norm, final_norm = norms
  total, warmup, hyperparams = _schedules(
      run,
      learning_rate,
      weight_decay,
      conventional_lr,
      initial_norm=initial_norm,
      final_norm=final_norm,
  )
  target = cosine_with_warmup(initial_norm, final_norm, warmup, total)
  return _rescaling_recipe(optimizer, target, hyperparams, optimizer_kwargs)


def _sbc(
    conventional_lr,
    run,
    learning_rate,
    weight_decay,
    batch_sizes,
    optimizer,
    optimizer_kwargs,
    engine,
):
  """:func:`sbc_with_polynomial_schedule`, or its ``_conventional_lr`` sibling."""
  initial_batch_size, final_batch_size, power = batch_sizes
  total, warmup, hyperparams = _schedules(
      run,
      learning_rate,
      weight_decay,
      conventional_lr,
      initial_batch_size=initial_batch_size,
      final_batch_size=final_batch_size,
      power=power,
  )
  batch_size = polynomial_with_warmup(initial_batch_size, final_batch_size, warmup, total, power)
  gate = gates.batch_size_at_least(batch_size, engine['microbatch_size'])
  return _accumulating_recipe(optimizer, gate, hyperparams, optimizer_kwargs, engine)


def gnts_with_cosine_schedule(
    learning_rate: float,
    total_microbatches: int | None = None,
    warmup_microbatches: int | None = None,
    initial_threshold: float = 0.95,
    final_threshold: float = 0.25,
    warmup_multiplier: float = 10.0,
    max_draws: int | None = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
    total_steps: int | None = None,
    warmup_steps: int | None = None,
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
    total_microbatches: microbatches in the run, calls of ``update``
      (torch-gqc's ``num_training_steps``).
    warmup_microbatches: microbatches of warmup (``num_warmup_steps``).
    initial_threshold: threshold at the end of the warmup.
    final_threshold: threshold at ``total_microbatches``.
    warmup_multiplier: the threshold starts at this times ``initial_threshold``.
    max_draws: the most microbatches accumulated before a step is forced.
    optimizer: a factory of the inner optimizer taking ``learning_rate`` (and
      ``weight_decay`` unless it is None), e.g. ``optax.adamw``.
    weight_decay: the inner weight decay after warmup; None for an optimizer
      without one. torch's ``AdamW`` default, 0.01, by default.
    microbatch_size: examples per microbatch (optional: the noise scale is
      then reported in examples).
    accumulator_dtype: dtype of the accumulator; None as in
      :func:`optax_gqc.accumulate`.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    scale_by_draws: multiplies each step by a function of the microbatches it
      averaged (e.g. ``jnp.sqrt``); None, torch-gqc's behaviour, by default.
    axis_name: inside ``jax.shard_map``, the mapped axis (or axes) over which
      the parameters are sharded; see :func:`optax_gqc.accumulate`.
    total_steps: the former name of ``total_microbatches``, still accepted;
      pass one or the other.
    warmup_steps: the former name of ``warmup_microbatches``, still accepted.
    **optimizer_kwargs: further arguments of ``optimizer``.

  The hyperparameters of ``optimizer`` are kept in float32 whatever the
  params' dtype (see :func:`scheduled_accumulation`), so the recipes work on
  bfloat16 params.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` called once per
    microbatch; the current learning rate and weight decay are in
    ``optax.tree.get(state, 'hyperparams')``.

  Example:
    >>> import optax_gqc
    >>> tx = optax_gqc.gnts_with_cosine_schedule(
    ...     3e-3, total_microbatches=10_000, warmup_microbatches=500)
  """
  run = _run(total_microbatches, warmup_microbatches, total_steps, warmup_steps, optimizer_kwargs)
  thresholds = (initial_threshold, final_threshold, warmup_multiplier)
  engine = _engine(
      max_draws, microbatch_size, accumulator_dtype, skip_nonfinite, scale_by_draws, axis_name
  )
  return _gnts(
      False, run, learning_rate, weight_decay, thresholds, optimizer, optimizer_kwargs, engine
  )


def gnts_with_cosine_schedule_conventional_lr(
    learning_rate: float,
    total_microbatches: int | None = None,
    warmup_microbatches: int | None = None,
    initial_threshold: float = 0.95,
    final_threshold: float = 0.25,
    warmup_multiplier: float = 10.0,
    max_draws: int | None = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
    total_steps: int | None = None,
    warmup_steps: int | None = None,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNTS with a warmup-cosine learning rate and an annealed threshold.

  The port of torch-gqc's ``make_gnts_with_cosine_annealing_schedule_conventional_lr``:
  the learning rate warms up linearly, then anneals by a quarter cosine to 0;
  the threshold follows :func:`gnts_with_cosine_schedule`; the weight decay
  stays at ``weight_decay`` (torch's ``AdamW`` default, 0.01, by default;
  None for an optimizer without one). Arguments as in
  :func:`gnts_with_cosine_schedule`.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`, called once per microbatch, as
    :func:`gnts_with_cosine_schedule` returns.
  """
  run = _run(total_microbatches, warmup_microbatches, total_steps, warmup_steps, optimizer_kwargs)
  thresholds = (initial_threshold, final_threshold, warmup_multiplier)
  engine = _engine(
      max_draws, microbatch_size, accumulator_dtype, skip_nonfinite, scale_by_draws, axis_name
  )
  return _gnts(
      True, run, learning_rate, weight_decay, thresholds, optimizer, optimizer_kwargs, engine
  )


def gnr_with_cosine_schedule(
    learning_rate: float,
    initial_norm: float,
    final_norm: float,
    total_microbatches: int | None = None,
    warmup_microbatches: int | None = None,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    total_steps: int | None = None,
    warmup_steps: int | None = None,
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
    final_norm: target gradient norm at ``total_microbatches``.
    total_microbatches: microbatches in the run, calls of ``update``
      (torch-gqc's ``num_training_steps``).
    warmup_microbatches: microbatches of warmup (``num_warmup_steps``).
    optimizer: a factory of the inner optimizer, e.g. ``optax.adamw``.
    weight_decay: the inner weight decay after warmup; None for an optimizer
      without one.
    total_steps: the former name of ``total_microbatches``, still accepted;
      pass one or the other.
    warmup_steps: the former name of ``warmup_microbatches``, still accepted.
    **optimizer_kwargs: further arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`.
  """
  run = _run(total_microbatches, warmup_microbatches, total_steps, warmup_steps, optimizer_kwargs)
  norms = (initial_norm, final_norm)
  return _gnr(False, run, learning_rate, weight_decay, norms, optimizer, optimizer_kwargs)


def gnr_with_cosine_schedule_conventional_lr(
    learning_rate: float,
    initial_norm: float,
    final_norm: float,
    total_microbatches: int | None = None,
    warmup_microbatches: int | None = None,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    total_steps: int | None = None,
    warmup_steps: int | None = None,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNR with a warmup-cosine learning rate and an annealed target norm.

  The port of torch-gqc's ``make_gnr_with_cosine_annealing_schedule_conventional_lr``:
  the learning rate warms up, then anneals by a quarter cosine to 0; the target
  norm follows :func:`gnr_with_cosine_schedule`; the weight decay stays at
  ``weight_decay`` (0.01 by default; None for an optimizer without one).
  Arguments as in :func:`gnr_with_cosine_schedule`.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`, called once per microbatch, as
    :func:`gnr_with_cosine_schedule` returns.
  """
  run = _run(total_microbatches, warmup_microbatches, total_steps, warmup_steps, optimizer_kwargs)
  norms = (initial_norm, final_norm)
  return _gnr(True, run, learning_rate, weight_decay, norms, optimizer, optimizer_kwargs)


def sbc_with_polynomial_schedule(
    learning_rate: float,
    microbatch_size: int,
    initial_batch_size: float,
    final_batch_size: float,
    total_microbatches: int | None = None,
    warmup_microbatches: int | None = None,
    power: float = 2.0,
    max_draws: int | None = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
    total_steps: int | None = None,
    warmup_steps: int | None = None,
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
    microbatch_size: examples per microbatch (``physical_batch_size``); the
      noise scale is reported in examples.
    initial_batch_size: logical batch size at the end of the warmup.
    final_batch_size: logical batch size at ``total_microbatches``.
    total_microbatches: microbatches in the run, calls of ``update``
      (torch-gqc's ``num_training_steps``).
    warmup_microbatches: microbatches of warmup (``num_warmup_steps``).
    power: exponent of the polynomial (``polynomial_power``).
    max_draws: the most microbatches accumulated before a step is forced
      (torch-gqc's default, 64; None for no limit). Steps that it forces
      before the logical batch is reached count in ``num_forced``.
    optimizer: a factory of the inner optimizer, e.g. ``optax.adamw``.
    weight_decay: the inner weight decay after warmup; None for an optimizer
      without one.
    accumulator_dtype: dtype of the accumulator; None as in
      :func:`optax_gqc.accumulate`.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    scale_by_draws: multiplies each step by a function of the microbatches it
      averaged (e.g. ``jnp.sqrt``); None, torch-gqc's behaviour, by default.
    axis_name: inside ``jax.shard_map``, the mapped axis (or axes) over which
      the parameters are sharded; see :func:`optax_gqc.accumulate`.
    total_steps: the former name of ``total_microbatches``, still accepted;
      pass one or the other.
    warmup_steps: the former name of ``warmup_microbatches``, still accepted.
    **optimizer_kwargs: further arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs` called once per microbatch.
  """
  run = _run(total_microbatches, warmup_microbatches, total_steps, warmup_steps, optimizer_kwargs)
  batch_sizes = (initial_batch_size, final_batch_size, power)
  engine = _engine(
      max_draws, microbatch_size, accumulator_dtype, skip_nonfinite, scale_by_draws, axis_name
  )
  return _sbc(
      False, run, learning_rate, weight_decay, batch_sizes, optimizer, optimizer_kwargs, engine
  )


def sbc_with_polynomial_schedule_conventional_lr(
    learning_rate: float,
    microbatch_size: int,
    initial_batch_size: float,
    final_batch_size: float,
    total_microbatches: int | None = None,
    warmup_microbatches: int | None = None,
    power: float = 2.0,
    max_draws: int | None = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
    total_steps: int | None = None,
    warmup_steps: int | None = None,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """SBC with a polynomially growing logical batch and a warmup-cosine learning rate.

  The port of torch-gqc's ``make_sbc_with_polynomial_schedule_conventional_lr``:
  the learning rate warms up, then anneals by a quarter cosine to 0; the
  logical batch follows :func:`sbc_with_polynomial_schedule`; the weight decay
  stays at ``weight_decay`` (0.01 by default; None for an optimizer without
  one). Arguments as in :func:`sbc_with_polynomial_schedule`.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`, called once per microbatch, as
    :func:`sbc_with_polynomial_schedule` returns.
  """
  run = _run(total_microbatches, warmup_microbatches, total_steps, warmup_steps, optimizer_kwargs)
  batch_sizes = (initial_batch_size, final_batch_size, power)
  engine = _engine(
      max_draws, microbatch_size, accumulator_dtype, skip_nonfinite, scale_by_draws, axis_name
  )
  return _sbc(
      True, run, learning_rate, weight_decay, batch_sizes, optimizer, optimizer_kwargs, engine
  )


def gns_with_cosine_schedule(
    learning_rate: float,
    initial_tolerance: float,
    final_tolerance: float,
    total_microbatches: int | None = None,
    warmup_microbatches: int | None = None,
    warmup_multiplier: float = 10.0,
    max_draws: int | None = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
    total_steps: int | None = None,
    warmup_steps: int | None = None,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNS with a warmup-cosine learning rate and an annealed tolerance.

  The port of torch-gqc's ``make_gns_with_cosine_annealing_schedule``: the
  learning rate warms up, then anneals by a quarter cosine to 0; the tolerance
  of :func:`optax_gqc.gates.noise_ratio_below` falls from ``warmup_multiplier *
  initial_tolerance`` to ``initial_tolerance`` over the warmup, then by a
  quarter cosine to ``final_tolerance``; the weight decay stays at
  ``weight_decay``. Schedules advance per microbatch.

  Args:
    learning_rate: the inner optimizer's peak learning rate.
    initial_tolerance: tolerance at the end of the warmup.
    final_tolerance: tolerance at ``total_microbatches``.
    total_microbatches: microbatches in the run, calls of ``update``
      (torch-gqc's ``num_training_steps``).
    warmup_microbatches: microbatches of warmup (``num_warmup_steps``).
    warmup_multiplier: the tolerance starts at this times ``initial_tolerance``.
    max_draws: the most microbatches accumulated before a step is forced.
    optimizer: a factory of the inner optimizer, e.g. ``optax.adamw``.
    weight_decay: the inner weight decay, constant; None for an optimizer
      without one. torch's ``AdamW`` default, 0.01, by default (``optax.adamw``'s
      own is 1e-4).
    microbatch_size: examples per microbatch (optional, for statistics).
    accumulator_dtype: dtype of the accumulator; None as in
      :func:`optax_gqc.accumulate`.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    scale_by_draws: multiplies each step by a function of the microbatches it
      averaged (e.g. ``jnp.sqrt``); None, torch-gqc's behaviour, by default.
    axis_name: inside ``jax.shard_map``, the mapped axis (or axes) over which
      the parameters are sharded; see :func:`optax_gqc.accumulate`.
    total_steps: the former name of ``total_microbatches``, still accepted;
      pass one or the other.
    warmup_steps: the former name of ``warmup_microbatches``, still accepted.
    **optimizer_kwargs: further arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`.
  """
  run = _run(total_microbatches, warmup_microbatches, total_steps, warmup_steps, optimizer_kwargs)
  tolerances = (initial_tolerance, final_tolerance, warmup_multiplier)
  engine = _engine(
      max_draws, microbatch_size, accumulator_dtype, skip_nonfinite, scale_by_draws, axis_name
  )
  return _annealed(
      'tolerance',
      gates.noise_ratio_below,
      True,
      run,
      learning_rate,
      weight_decay,
      tolerances,
      optimizer,
      optimizer_kwargs,
      engine,
  )


def gns_default(
    learning_rate: float,
    tolerance: float,
    total_microbatches: int | None = None,
    warmup_microbatches: int | None = None,
    max_draws: int | None = 64,
    *,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
    total_steps: int | None = None,
    warmup_steps: int | None = None,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """GNS with a warmup-cosine learning rate and a constant tolerance after an inverse warmup.

  The port of torch-gqc's ``make_gns_default``: the learning rate as in
  :func:`gns_with_cosine_schedule`; the tolerance falls from 20 times
  ``tolerance`` (torch-schedule-anything's default multiplier, which that
  factory keeps) to ``tolerance`` over the warmup, then stays; the weight
  decay stays at ``weight_decay``. Arguments as in
  :func:`gns_with_cosine_schedule`.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`, called once per microbatch, as
    :func:`gns_with_cosine_schedule` returns.
  """
  run = _run(total_microbatches, warmup_microbatches, total_steps, warmup_steps, optimizer_kwargs)
  engine = _engine(
      max_draws, microbatch_size, accumulator_dtype, skip_nonfinite, scale_by_draws, axis_name
  )
  total, warmup, hyperparams = _schedules(
      run, learning_rate, weight_decay, True, tolerance=tolerance
  )
  _checks.check_gate_can_open('gns_default', max_draws, tolerance=tolerance)
  gate = gates.noise_ratio_below(constant_with_inverse_warmup(tolerance, warmup))
  return _accumulating_recipe(optimizer, gate, hyperparams, optimizer_kwargs, engine)


def mht_with_warmup_schedule(
    learning_rate: float,
    confidence: float,
    percent_error: float,
    total_microbatches: int | None = None,
    warmup_microbatches: int | None = None,
    max_draws: int | None = 64,
    *,
    decay: float = 0.99,
    optimizer: Callable[..., optax.GradientTransformation] = optax.adamw,
    weight_decay: float | None = 0.01,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
    total_steps: int | None = None,
    warmup_steps: int | None = None,
    **optimizer_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """MHT with a warmup-cosine learning rate and warmed-up test parameters.

  The port of torch-gqc's ``make_mht_with_warmup_schedule``: the learning
  rate warms up, then anneals by a quarter cosine to 0; the confidence and
  the percent error of :func:`optax_gqc.gates.loss_interval` warm up linearly
  from 0 to ``confidence`` and ``percent_error``, then stay (so early steps
  come fast); the weight decay stays at ``weight_decay``. Call
  ``update(..., value=loss)``.

  Args:
    learning_rate: the inner optimizer's peak learning rate.
    confidence: the interval's confidence after the warmup.
    percent_error: its allowed relative half-width after the warmup.
    total_microbatches: microbatches in the run, calls of ``update``
      (torch-gqc's ``num_training_steps``).
    warmup_microbatches: microbatches of warmup (``num_warmup_steps``).
    max_draws: the most microbatches accumulated before a step is forced.
    decay: the loss EMA's decay (torch-gqc's ``update_beta`` is ``1 - decay``).
    optimizer: a factory of the inner optimizer, e.g. ``optax.adamw``.
    weight_decay: the inner weight decay, constant; None for an optimizer
      without one. torch's ``AdamW`` default, 0.01, by default (``optax.adamw``'s
      own is 1e-4).
    microbatch_size: examples per microbatch (optional, for statistics).
    accumulator_dtype: dtype of the accumulator; None as in
      :func:`optax_gqc.accumulate`.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    scale_by_draws: multiplies each step by a function of the microbatches it
      averaged (e.g. ``jnp.sqrt``); None, torch-gqc's behaviour, by default.
    axis_name: inside ``jax.shard_map``, the mapped axis (or axes) over which
      the parameters are sharded; see :func:`optax_gqc.accumulate`.
    total_steps: the former name of ``total_microbatches``, still accepted;
      pass one or the other.
    warmup_steps: the former name of ``warmup_microbatches``, still accepted.
    **optimizer_kwargs: further arguments of ``optimizer``.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`.
  """
  run = _run(total_microbatches, warmup_microbatches, total_steps, warmup_steps, optimizer_kwargs)
  engine = _engine(
      max_draws, microbatch_size, accumulator_dtype, skip_nonfinite, scale_by_draws, axis_name
  )
  total, warmup, hyperparams = _schedules(
      run,
      learning_rate,
      weight_decay,
      True,
      confidence=confidence,
      percent_error=percent_error,
      decay=decay,
  )
  _checks.check_unit_interval('confidence', confidence)
  if not _checks.is_zero(confidence):  # at confidence 0 the interval is empty: it opens
    _checks.check_gate_can_open('mht_with_warmup_schedule', max_draws, percent_error=percent_error)
  gate = gates.loss_interval(
      cosine_with_warmup(confidence, confidence, warmup, total),
      cosine_with_warmup(percent_error, percent_error, warmup, total),
      decay=decay,
  )
  return _accumulating_recipe(optimizer, gate, hyperparams, optimizer_kwargs, engine)
