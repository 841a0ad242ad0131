"""statistics(state): what an optimizer state holds to log, found wherever it sits."""

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from optax_gqc import _noise_scale, _scale_to_norm, _sgd_sai
from optax_gqc._accumulation import AccumulateState, gate_entries
from optax_gqc._checks import is_variable


def _flat_gate_stats(gate_state: Any, out: dict[str, jax.Array]) -> None:
  """Adds the gate's reported entries to ``out``; those named ``_*`` are its own.

  Every gate's ``num_bad_hyperparams`` adds to the one in ``out``.
  """
  for key, value in gate_entries(gate_state):
    if key == 'num_bad_hyperparams':
      out[key] = out[key] + value
      continue
    if key.startswith('_'):
      continue
    name, i = key, 1
    while name in out or name == 'num_batches':  # statistics' alias of num_microbatches
      name, i = f'{key}_{i}', i + 1
    out[name] = value


def _accumulation_report(s: AccumulateState) -> dict[str, jax.Array]:
  out = {
      name: getattr(s, name)
      for name in (
          'num_draws',
          'num_microbatches',
          'num_steps',
          'num_skipped',
          'num_forced',
          'num_bad_hyperparams',
          'last_num_draws',
          'last_grad_norm',
          'acc_norm',
          'microbatch_size',
      )
  }
  # The EMAs are in microbatches; in examples where the microbatch size is known.
  examples = jnp.where(s.microbatch_size > 0, s.microbatch_size, 1).astype(jnp.float32)
  out.update(_noise_scale.report(s.noise, examples))
  _flat_gate_stats(s.gate_state, out)
  return out


def _multi_steps_report(s: optax.MultiStepsState) -> dict[str, jax.Array]:
  return {'num_draws': s.mini_step, 'num_steps': s.gradient_step}


def _count_report(s: Any) -> dict[str, jax.Array]:
  return {'num_steps': s.count}


# Optax's states whose ``count`` counts their calls, not optimizer steps: an
# inject_hyperparams around an accumulation calls it on every microbatch;
# reduce_on_plateau counts the calls within its accumulation of losses.
_NOT_STEP_COUNTS = (
    optax.InjectHyperparamsState,
    optax.InjectStatefulHyperparamsState,
    optax.contrib.ReduceLROnPlateauState,
)


def _counts_steps(x: Any) -> bool:
  """Whether ``x`` is a state of Optax's that counts its updates (``ScaleByAdamState``...)."""
  if not hasattr(x, '_fields') or 'count' not in x._fields or isinstance(x, _NOT_STEP_COUNTS):
    return False
  count = x.count
  return (
      hasattr(count, 'dtype')
      and jnp.ndim(count) == 0
      and jnp.issubdtype(jnp.result_type(count), jnp.integer)
  )


# What statistics reports of each state the library creates: a transformation
# keeps its report beside its state, and is registered here.
_REPORTS = {
    AccumulateState: _accumulation_report,
    _scale_to_norm.ScaleToNormState: _scale_to_norm.report,
    _noise_scale.NoiseScaleState: _noise_scale.report,
    _sgd_sai.ScaleByGsnrState: _sgd_sai.gsnr_report,
    _sgd_sai.SgdSaiMomentumState: _sgd_sai.momentum_report,
    optax.MultiStepsState: _multi_steps_report,
}


def _report_of(x: Any) -> Callable[[Any], dict[str, jax.Array]] | None:
  report = _REPORTS.get(type(x))
  if report is None and _counts_steps(x):
    report = _count_report
  return report


def _find_states(state: Any, inner: bool = False) -> list[tuple[Any, bool]]:
  """The states reported on in ``state``, in traversal order, each with ``inner``.

  ``inner``: whether it sits inside an accumulation, where each of its updates
  is an optimizer step, not a microbatch.
  """

  def known(x):
    return _report_of(x) is not None

  found = []
  for x in jax.tree.leaves(state, is_leaf=known):
    if known(x):
      found.append((x, inner))
      if isinstance(x, AccumulateState):
        found.extend(_find_states(x.inner_state, True))
      elif isinstance(x, optax.MultiStepsState):
        found.extend(_find_states(x.inner_opt_state, True))
  return found


def _precedence(x: Any) -> int:
  """Accumulations first, then the other states of optax_gqc, then Optax's."""
  if isinstance(x, AccumulateState):
    return 0
  if isinstance(x, optax.MultiStepsState):
    return 1
  return 2 if type(x) in _REPORTS else 3


# The fields of each state of Optax's that statistics reads a count of steps from
# (ScaleByAdamState: count, mu, nu), kept as a mapping.
_OPTAX_COUNTS = frozenset(
    frozenset(cls._fields)
    for module in (optax, optax.contrib)
    for cls in vars(module).values()
    if isinstance(cls, type)
    and issubclass(cls, tuple)
    and 'count' in getattr(cls, '_fields', ())
    and not issubclass(cls, _NOT_STEP_COUNTS)
)
# Fields that name a state of the library's, or MultiSteps', kept as a mapping.
_SIGNATURES = {
    cls.__name__: frozenset(fields)
    for cls, fields in (
        (AccumulateState, ('num_draws', 'num_microbatches', 'num_steps', 'num_forced')),
        (_scale_to_norm.ScaleToNormState, ('target', 'grad_norm', 'num_bad_hyperparams')),
        (_noise_scale.NoiseScaleState, ('grad_sq_norm_ema', 'trace_cov_ema')),
        (_sgd_sai.ScaleByGsnrState, ('computed', 'gsnr', 'normalizer')),
        (optax.MultiStepsState, ('mini_step', 'gradient_step', 'inner_opt_state')),
    )
}


def _check_typed(state: Any) -> None:
  """Raises if ``state`` holds one of the reported states as a mapping of its fields.

  ``nnx.state(optimizer)``, ``nnx.to_pure_dict`` and a checkpoint restored
  without a target keep a NamedTuple state so, without its type, and drop its
  empty fields: what it holds cannot be read reliably.
  """
  if isinstance(state, Mapping):
    held = [name for name, fields in _SIGNATURES.items() if fields <= set(state)]
    if set(state) in _OPTAX_COUNTS:
      held.append('Optax state that counts its updates (ScaleByAdamState, say)')  # num_steps
    if held:
      raise TypeError(
          f"statistics: the state holds {'an' if held[0][0] in 'AEIOU' else 'a'} {held[0]} as a "
          'mapping of its fields, as nnx.state(optimizer), nnx.to_pure_dict or a checkpoint '
          'restored without a target keep it, without the types that statistics reads. Pass '
          'optimizer.opt_state (or the nnx.Optimizer), or restore the checkpoint onto a target, '
          'jax.eval_shape(tx.init, params)'
      )
    values = state.values()
  elif isinstance(state, tuple | list):
    values = state
  else:
    return
  for value in values:
    _check_typed(value)


def statistics(state: Any) -> dict[str, jax.Array]:
  r"""Returns what an optimizer state holds to log: counters, hyperparameters, estimates.

  Finds the states of optax_gqc's transformations wherever they sit in a
  nested optimizer state (inside ``optax.chain``, ``optax.inject_hyperparams``,
  ``optax.MultiSteps``, an accumulation's inner state, or the ``opt_state`` of
  a Flax ``nnx.Optimizer``; not ``nnx.state(optimizer)`` or a checkpoint
  restored without a target, which keep a state as a mapping of its fields
  without its type, and raise ``TypeError``), and reports each as below.
  Where two report the same name, an accumulation's entry comes first
  (optax_gqc's, then ``optax.MultiSteps``'), then the others in traversal
  order; pass a part of the state (``statistics(state[0])``) to read another.
  A state inside an accumulation (its inner optimizer's) reports no
  ``num_microbatches``: each of its updates is a step. Works under
  ``jax.jit``.

  An accumulation (:func:`accumulate`, and every optimizer and recipe built on
  it) reports ``num_draws`` (microbatches since the last step),
  ``num_microbatches`` (accepted over the run; also under torch-gqc's name
  ``num_batches``), ``num_steps`` (of the inner optimizer),
  ``num_skipped``, ``num_forced``, ``num_bad_hyperparams``,
  ``last_num_draws``, ``last_grad_norm``,
  ``acc_norm`` (the norm of the current mean gradient), ``microbatch_size``
  (0 when not given); the noise scale ``noise_scale``
  (:math:`B_\text{simple}`) with its parts ``grad_sq_norm_est`` and
  ``trace_cov_est`` (bias-corrected EMAs; NaN until a step has averaged
  two microbatches; ``noise_scale`` is infinite while the estimate of
  :math:`|G|^2` is not positive, where noise swamps the signal, the rule
  the gates read too); and the gate's reported entries: its current
  hyperparameters (e.g. ``threshold``), estimates and counters, but not the
  running sums it keeps for itself (see :class:`~optax_gqc.gates.Gate`). A
  gate entry whose name is taken (``num_batches`` included) gets a suffix
  ``_1``, ``_2``, ...

  :func:`scale_to_norm` (and so :func:`gnr` and its recipes) reports
  ``num_microbatches`` and ``num_steps`` (equal: it steps on every microbatch),
  ``target`` (the target norm at the latest update),
  ``grad_norm`` (the gradient's norm before rescaling) and
  ``num_bad_hyperparams``. :func:`noise_scale`
  reports ``noise_scale``, ``grad_sq_norm_est`` and ``trace_cov_est``.
  :func:`scale_by_gsnr` (and so :func:`sgd_sai`) reports ``gsnr_min`` and
  ``gsnr_max`` over the leaves that have their g-SNR (NaN while none has),
  ``num_pending_gsnr``, the leaves still waiting for a non-zero gradient,
  and, in :func:`sgd_sai`, ``num_microbatches`` and ``num_steps``; the per-leaf
  factors are in ``optax.tree.get(state, 'gsnr')``.

  Any other Optax state reports what Optax counts, so that a run of a plain
  optimizer logs under the same names: ``num_steps`` from the ``count`` of a
  state that keeps one (``optax.adamw``'s ``ScaleByAdamState``, a schedule's
  ``ScaleByScheduleState``), and from ``optax.MultiSteps``'s state
  ``num_steps`` and ``num_draws``. A state with no counter (``optax.sgd``
  with a constant learning rate) gives an empty dict. The ``count`` of such a
  state comes after the entries of optax_gqc's own states.

  ``num_forced`` counts the steps that ``max_draws`` forced while the gate was
  closed. A few are normal (a noisy stretch); if it grows with ``num_steps``,
  the gate is starved: its threshold is out of reach for this model (an
  absolute threshold below the gradient norms it sees, say), and the run is
  in effect a fixed accumulation of ``max_draws`` microbatches. Follow the
  noise scale (the default of :func:`optax_gqc.gnts`) or use a relative
  threshold (``gnts(inner, ratio=0.5)``), raise the threshold, or
  combine the gate with :func:`optax_gqc.gates.relative_error_below` through
  :func:`optax_gqc.gates.any_of`.

  ``num_bad_hyperparams`` counts the microbatches at which a hyperparameter
  was out of its domain at run time, where ``jax.jit`` cannot raise: a
  schedule that returned NaN or a negative value, or a bad value injected by
  ``optax.inject_hyperparams``. It adds up the engine's count (``max_draws``,
  ``noise_decay``), every gate's (which stays closed meanwhile, so that
  ``max_draws`` forces the steps) and :func:`scale_to_norm`'s (whose update
  is zero meanwhile). It is 0 in a healthy run.

  Args:
    state: an optimizer state.

  Returns:
    A dict of 0-d arrays; empty if ``state`` holds nothing to report. They
    are copies: a step that donates the state leaves them readable.
  """
  if isinstance(state, optax.GradientTransformation):
    raise TypeError(
        'statistics takes an optimizer state (what init and update return), not the '
        'transformation: statistics(state)'
    )
  state = jax.tree.map(lambda x: x.get_value() if is_variable(x) else x, state, is_leaf=is_variable)
  _check_typed(state)
  # Stable: in traversal order within a precedence.
  found = sorted(_find_states(state), key=lambda found: _precedence(found[0]))
  out = {}
  for s, inner in found:
    for name, value in _report_of(s)(s).items():
      if inner and name == 'num_microbatches':  # it counts the steps of the outer one
        continue
      if name == 'num_bad_hyperparams' and name in out:
        out[name] = out[name] + value
      else:
        out.setdefault(name, value)
  if 'num_microbatches' in out:  # torch-gqc's name, where its users log it
    out['num_batches'] = out['num_microbatches']
  # Copies, not the state's own arrays, which the next step deletes where it donates the
  # state; kept for later, they would fail to read (under jit the copies cost nothing).
  return {name: jnp.array(value, copy=True) for name, value in out.items()}
