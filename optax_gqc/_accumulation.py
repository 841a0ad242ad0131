"""Gated gradient accumulation: the engine behind every optax_gqc wrapper.

One microbatch gradient comes in per call of ``update``. The engine adds it to
an accumulator (float32 by default), refreshes a few scalar statistics, asks a gate whether
the mean gradient is good enough, and only then runs the inner optimizer on
that mean. The whole decision is one ``jax.lax.cond`` on device.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_gqc import _checks, _noise_scale
from optax_gqc._noise_scale import NoiseScaleState
from optax_gqc._numerics import complex_for, count_if, kept_cond, one_kernel, rounded, sq_norm
from optax_gqc.gates import DrawStats, Gate


class AccumulateState(NamedTuple):
  """State of :func:`accumulate`. Every field has its final shape from ``init``."""

  num_draws: jax.Array  # int32: microbatches accumulated since the last step.
  num_microbatches: jax.Array  # int32: microbatches accepted over the whole run.
  num_steps: jax.Array  # int32: inner optimizer steps taken.
  num_skipped: jax.Array  # int32: microbatches rejected for a non-finite norm.
  num_forced: jax.Array  # int32: steps forced by max_draws with the gate closed.
  # int32: microbatches at which a traced max_draws was below 1 or a traced
  # noise_decay outside [0, 1) (replaced as accumulate says).
  num_bad_hyperparams: jax.Array
  last_num_draws: jax.Array  # int32: microbatches averaged at the last step.
  last_grad_norm: jax.Array  # float32: ||gbar|| at the last step.
  sum_sq_norms: jax.Array  # float32: sum_i ||g_i||^2 over the accumulation.
  sum_norms: jax.Array  # float32: sum_i ||g_i|| over the accumulation.
  acc_norm: jax.Array  # float32: ||gbar|| after the latest microbatch.
  microbatch_size: jax.Array  # int32: examples per microbatch; 0 when not given.
  # The noise scale's EMAs, in microbatches, folded in at each step that
  # averaged n >= 2 microbatches (see _noise_scale).
  noise: NoiseScaleState
  gate_state: Any  # the gate's own scalars.
  inner_state: Any  # the inner optimizer's state, touched only on steps.
  # Sum of the current accumulation's gradients. Not zeroed on a step: the
  # next microbatch ignores it when num_draws == 0, which saves a pass.
  accumulator: Any


class AccumulationTransformation(optax.GradientTransformationExtraArgs):
  """An Optax transformation that accumulates, with a fused update-and-apply.

  It is an ordinary :class:`optax.GradientTransformationExtraArgs` (``init``,
  ``update``); :func:`optax_gqc.update_and_apply` also finds on it
  ``update_and_apply(grads, state, params, **extra_args) -> (params, state)``,
  whose single ``lax.cond`` returns the new parameters, so that no zero update
  is written and applied on the microbatches that only accumulate.
  """

  def __new__(cls, init, update, update_and_apply):
    tx = super().__new__(cls, init, update)
    tx.update_and_apply = update_and_apply
    return tx

  def __getnewargs__(self):  # copy.copy and copy.deepcopy keep the fused path
    return (self.init, self.update, self.update_and_apply)


_PASS_OWN_STATE = 'pass the state that tx.init(params) returned, then the one each update returns'


def check_state(
    state: Any, gate: Gate | None = None, inner: Any = None, params: Any = None
) -> None:
  """Raises at trace time unless ``state`` is the state of this accumulation.

  With ``gate`` and ``inner``, the state's gate state must have the structure
  of ``gate.init()``, and its inner state that of ``inner.init(params)``: the
  state of another accumulation would otherwise fail inside the gate or the
  inner optimizer, with a message about them. ``params`` are the parameters,
  or the gradients where the update has none (an inner state whose structure
  follows the dtypes would not follow the accumulator's).
  """
  if not isinstance(state, AccumulateState):
    got = 'None' if state is None else f'a {type(state).__name__}'
    onto_target = (
        'restore it onto a target, jax.eval_shape(tx.init, params) (docs/checkpointing.md)'
    )
    restored = ''
    if isinstance(state, dict) and 'accumulator' in state:
      restored = (
          '. A checkpoint restored without a target keeps the state as a mapping of its '
          'fields: ' + onto_target
      )
    elif isinstance(state, str):  # optax.chain iterated a mapping: its keys
      got = f'the str {state!r}'
      restored = (
          ". A chain whose state was restored without a target holds a mapping ('0', '1', ...) "
          'in place of its tuple, and hands its keys on: ' + onto_target
      )
    raise TypeError(
        f'accumulate: state is {got}, not the AccumulateState of this transformation: '
        + _PASS_OWN_STATE
        + restored
    )
  # Params split out of a model may hold Variables; a counter only in nnx.Optimizer's state.
  if _checks.is_variable(state.num_draws):
    raise TypeError(
        "accumulate: the state holds Flax NNX Variables: it is an nnx.Optimizer's opt_state, "
        'whose updates go through the optimizer. Call optimizer.update(model, grads), or '
        'optax_gqc.interop.nnx.update(optimizer, model, grads) for the fused step'
    )
  if gate is not None:
    expected = jax.eval_shape(gate.init)
    if jax.tree.structure(state.gate_state) != jax.tree.structure(expected):
      raise TypeError(
          'accumulate: the state does not belong to this transformation: its gate state '
          f'holds {_describe_gate_state(state.gate_state)}, but this gate keeps '
          f'{_describe_gate_state(expected)}. It is the state of another accumulation: '
          + _PASS_OWN_STATE
      )
  if inner is not None:
    try:
      expected = jax.eval_shape(inner.init, params)
    except Exception:  # noqa: BLE001 -- an init that needs the real params: no check
      return
    got_def, expected_def = jax.tree.structure(state.inner_state), jax.tree.structure(expected)
    if got_def != expected_def:
      got, want = _describe_state(state.inner_state), _describe_state(expected)
      if got == want:
        got, want = str(got_def)[:300], str(expected_def)[:300]
      if jax.tree.structure(params) != jax.tree.structure(state.accumulator):
        raise ValueError(
            'accumulate: the params do not match those given to init: '
            f'{str(jax.tree.structure(params))[:300]} vs '
            f'{str(jax.tree.structure(state.accumulator))[:300]}, so neither does the inner '
            "optimizer's state. Pass the params that tx.init(params) was given"
        )
      raise TypeError(
          'accumulate: the state does not belong to this transformation: its inner state is '
          f'{got}, but this inner optimizer keeps {want}. It is the state of an accumulation '
          'around another optimizer: ' + _PASS_OWN_STATE
      )


def _describe_gate_state(gate_state: Any) -> str:
  names = [name for name, _ in gate_entries(gate_state)]
  return f"the entries ({', '.join(names)})" if names else 'no entries'


def _describe_state(state: Any) -> str:
  """The names of the state classes in ``state``, outermost first: ``(ScaleByAdamState, ...)``."""
  names = [
      type(x).__name__
      for x in jax.tree.leaves(state, is_leaf=lambda x: hasattr(x, '_fields'))
      if hasattr(x, '_fields')
  ]
  return f"({', '.join(names)})" if names else type(state).__name__


def _one_microbatch_size(given: Any, gate_size: int | None) -> Any:
  """The microbatch size, given to accumulate or to its gate, or to both alike."""
  if gate_size is None:
    return given
  # A traced size (inject_hyperparams) cannot be compared here.
  if given is not None and not isinstance(given, jax.core.Tracer) and given != gate_size:
    raise ValueError(
        f'accumulate: microbatch_size={given}, but the gate counts microbatches of '
        f'{gate_size} examples: give it once, to the gate (accumulate reads it there)'
    )
  return gate_size if given is None else given


def _accumulator_dtype(requested: Any, param: Any) -> Any:
  """float32 or wider by default; complex for complex parameters (a Python number's too)."""
  dtype = jnp.promote_types(jnp.float32, jnp.result_type(param)) if requested is None else requested
  return complex_for(dtype, param)


def _check_accumulator_dtypes(accumulator: Any, requested: Any) -> None:
  """Raises at trace time if the state's accumulator is narrower than this accumulation keeps.

  A state restored as a plain pytree keeps the dtypes it was saved with: a
  bfloat16 accumulator in an accumulation that keeps float32 (or wider, the
  default) would silently round every later sum. A wider one only costs memory.
  """
  least = jnp.float32 if requested is None else requested
  for path, acc in jax.tree_util.tree_leaves_with_path(accumulator):
    if jnp.promote_types(acc.dtype, least) != acc.dtype:
      raise ValueError(
          f"accumulate: the state's accumulator {jax.tree_util.keystr(path)} is {acc.dtype}, "
          f'narrower than the {jnp.dtype(least)} of this accumulation '
          f'(accumulator_dtype={requested}): the state was made with other arguments. Build the '
          'optimizer with the arguments it was saved with, or cast the restored state to its '
          'own dtypes: jax.tree.map(lambda x, t: jnp.asarray(x, t.dtype), state, '
          'jax.eval_shape(tx.init, params))'
      )


def _check_scale_by_draws(scale_by_draws: Any) -> None:
  """Raises unless ``scale_by_draws`` is a function of one argument, ``n``.

  What it returns is checked where it is traced, in the step: it may read a
  mapped axis (``jax.lax.psum``) that only the step is traced under.
  """
  fix = 'pass a function of n such as jnp.sqrt'
  if not callable(scale_by_draws):
    raise TypeError(f'scale_by_draws must be a function of n, got {scale_by_draws!r}: {fix}')
  _checks.check_takes_one_argument('scale_by_draws', scale_by_draws, 'n', fix)


def _scale(scale_by_draws: Any, n: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``scale_by_draws(n)`` and whether it is NaN, infinite or negative (then 0).

  Raises at trace time unless it is a real scalar. A bad factor would write
  inf or NaN into the parameters, or reverse the step: it gives a zero update.
  """
  try:
    scale = scale_by_draws(n)
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError) as e:
    raise TypeError(
        'scale_by_draws must be a function that JAX can trace, of n an int32 array: it '
        f'called NumPy or Python math on it ({type(e).__name__}). Use jnp.sqrt, not np.sqrt or '
        'math.sqrt'
    ) from e
  if not _checks.is_number(scale) or np.iscomplexobj(scale) or jnp.ndim(scale) != 0:
    got = (
        f'an array of shape {jnp.shape(scale)} of {jnp.result_type(scale)}'
        if hasattr(scale, 'shape')
        else f'{type(scale).__name__} {scale!r}'
    )
    raise ValueError(
        f'scale_by_draws must return a real scalar, a factor for the whole step, but it '
        f'returned {got}: pass a function of n such as jnp.sqrt'
    )
  bad = ~(jnp.isfinite(scale) & (scale >= 0))
  return jnp.where(bad, jnp.zeros_like(scale), scale), bad


def accumulate(
    inner: optax.GradientTransformation,
    gate: Gate,
    *,
    max_draws: int | None = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    noise_decay: float = 0.99,
    scale_by_draws: Callable[[jax.Array], jax.Array] | None = None,
    axis_name: Any = None,
) -> AccumulationTransformation:
  r"""Accumulates microbatch gradients until ``gate`` opens, then steps ``inner``.

  Call ``update`` once per microbatch gradient :math:`g_i`. With :math:`n` the
  number of microbatches accumulated since the last step,

  .. math::

    \bar g = \frac{1}{n} \sum_{i=1}^{n} g_i, \qquad
    \text{step} = \text{gate}(\text{stats}) \lor n \ge \text{max\_draws}.

  On a step, ``inner.update`` runs on :math:`\bar g` (cast to the gradients'
  dtype) and its updates are returned; otherwise the updates are zeros and the
  inner state is left untouched. The choice is a single ``jax.lax.cond``, so
  the inner optimizer runs only on the microbatches that step, and nothing is
  read back to the host. :func:`optax_gqc.update_and_apply` runs the same step
  with the parameters inside the cond, and writes no zero update.

  The gate sees a :class:`~optax_gqc.gates.DrawStats` of running scalars
  (:math:`n`, the microbatch count :math:`t`, :math:`\|g_i\|`,
  :math:`\|\bar g\|`, :math:`\sum_i \|g_i\|^2`, :math:`\sum_i \|g_i\|`, and the
  noise scale estimated at earlier steps), so memory stays at one accumulator
  whatever the gate. Hyperparameter schedules are functions of :math:`t`, the
  number of microbatches accepted before the current one.

  A microbatch whose squared norm is not finite (it holds a NaN or an Inf, or
  its float32 squared norm overflows) is rejected when ``skip_nonfinite``: the
  accumulator, the counters and the gate state stay as they were, and
  ``num_skipped`` counts it. A step that ``max_draws`` forces while the gate is
  still closed counts in ``num_forced``: if it grows, the gate is starved
  (see :func:`statistics`).

  Args:
    inner: the optimizer that steps on the mean gradient.
    gate: the decision rule, e.g. :func:`optax_gqc.gates.norm_below`.
    max_draws: the most microbatches accumulated before a step is forced;
      None for none below int32's largest count (a step is forced after
      2**31 - 1 microbatches). It may be traced, so
      ``optax.inject_hyperparams`` can change it mid-run; a traced value below
      1 is taken as 1 (a step on every microbatch) and counted in
      ``num_bad_hyperparams``.
    microbatch_size: examples per microbatch; used to report the noise scale
      in examples. Optional; None takes the gate's, where the gate counts
      examples (:func:`optax_gqc.gates.critical_batch`), and another value
      than the gate's raises ``ValueError``.
    accumulator_dtype: dtype of the accumulator. None (the default) means
      float32, or the gradients' own dtype where it is wider (float64) or
      complex; bf16 gradients are accumulated in float32. (None rather than
      ``jnp.float32``, because ``optax.inject_hyperparams`` would take a dtype,
      a callable, for a schedule.) A dtype of a narrower range than float32
      (``jnp.float16``, whose largest value is 65504, or a float8) raises
      ``ValueError``: a running sum of finite gradients would overflow to inf
      there, and the parameters with it. ``jnp.bfloat16`` has float32's range
      but 8 significant bits: a long sum rounds new microbatches away (with
      gradients of 1/3, the mean of 1024 comes out at 0.125); use it with
      a ``max_draws`` of a few tens.
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    noise_decay: EMA decay of the noise-scale estimates (see below), in
      [0, 1); a traced value outside it leaves the estimates as they are, and
      counts in ``num_bad_hyperparams``.
    scale_by_draws: optional function of :math:`n` (an int32 scalar) that
      returns the scalar by which the inner updates are multiplied at a step
      that averaged :math:`n` microbatches: the step then follows the batch.
      ``jnp.sqrt`` is the usual rule for Adam-like optimizers, ``lambda n: n``
      for SGD. A factor that comes out NaN, infinite or negative (``1 / (n -
      1)`` at :math:`n = 1`) gives a zero update, and the step counts in
      ``num_bad_hyperparams``.
    axis_name: inside ``jax.shard_map``, the mapped axis (or tuple of axes)
      over which the *parameters* are sharded, as in FSDP: every squared norm
      the gate and the noise scale read is summed across it, so every device
      takes the same decision. Under ``shard_map``'s default
      ``check_vma=True``, a parameter replicated across an axis counts once
      there; with ``check_vma=False`` JAX does not say which are replicated,
      so every gradient leaf must then be a shard. Leave it None when each
      device holds whole gradients (plain data parallelism after a ``pmean``,
      or ``jax.jit`` with sharded arrays, where the norms are global
      already). With ``check_vma=True``, a decision that would differ between
      devices raises at trace time, naming the axes (devices that each train
      a model of their own, an ensemble, need ``check_vma=False``).

  The engine also estimates the gradient noise scale
  :math:`B_\text{simple}` of McCandlish et al. from the same scalars, with no
  extra buffer (``state.noise``, a :class:`~optax_gqc.NoiseScaleState`, in
  microbatches); :func:`statistics` reports it, in examples when
  ``microbatch_size`` is given. See :class:`~optax_gqc.NoiseScaleState` for
  how, and when to trust it.

  Returns:
    An :class:`AccumulationTransformation`, an
    :class:`optax.GradientTransformationExtraArgs`. Extra keyword arguments of
    ``update`` (such as ``value=loss``) reach both the gate and ``inner``.

  Example:
    >>> import jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.accumulate(
    ...     optax.sgd(0.1), optax_gqc.gates.norm_below(1.0), max_draws=4)
    >>> params = {'w': jnp.zeros(3)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({'w': jnp.full(3, 2.0)}, state)
    >>> int(state.num_draws), int(state.num_steps)  # ||g|| = 3.46 > 1: wait
    (1, 0)
    >>> updates, state = tx.update({'w': jnp.full(3, -1.5)}, state)
    >>> int(state.num_draws), int(state.num_steps)  # ||mean|| = 0.43: step
    (0, 1)
  """
  _checks.check_transformation('inner', inner)
  if not isinstance(gate, Gate):
    if callable(gate):
      raise TypeError(
          'gate must be an optax_gqc.gates.Gate (init, update); wrap a plain '
          'function of DrawStats with optax_gqc.gates.from_function'
      )
    raise TypeError(
        f'gate must be an optax_gqc.gates.Gate, got {type(gate).__name__}: pass one of '
        'optax_gqc.gates, e.g. gates.norm_below(0.5)'
    )
  if max_draws is None:
    max_draws = jnp.iinfo(jnp.int32).max
  _checks.check_positive_int('max_draws', max_draws, ', or max_draws=None for no limit')
  if microbatch_size is not None:
    _checks.check_positive_int('microbatch_size', microbatch_size, ', or None')
  microbatch_size = _one_microbatch_size(microbatch_size, gate.microbatch_size)
  _checks.check_accumulator_dtype(accumulator_dtype)
  _checks.check_bool('skip_nonfinite', skip_nonfinite)
  _checks.check_unit_interval('noise_decay', noise_decay)
  if isinstance(scale_by_draws, jax.Array):
    raise TypeError(
        'scale_by_draws must be a function of n, got an array: '
        + _checks.INJECTED_FUNCTION.format(name='scale_by_draws')
    )
  if scale_by_draws is not None:
    _check_scale_by_draws(scale_by_draws)
  inner = with_extra_args(inner)

  def init_fn(params):
    for path, p in jax.tree_util.tree_leaves_with_path(params):
      where = f'accumulate: param {jax.tree_util.keystr(path)}'
      _checks.check_not_torch(where, p)
      if jax.dtypes.issubdtype(getattr(p, 'dtype', None), jax.dtypes.prng_key):
        raise TypeError(
            f'{where} is a PRNG key, which no optimizer updates: leave keys out of the params '
            '(with Flax NNX, nnx.Optimizer(model, tx, wrt=nnx.Param), not wrt=nnx.Variable)'
        )

    # A separate array per field: a donated state must not hold one buffer twice.
    def zero_i():
      return jnp.zeros([], jnp.int32)

    def zero_f():
      return jnp.zeros([], jnp.float32)

    return AccumulateState(
        num_draws=zero_i(),
        num_microbatches=zero_i(),
        num_steps=zero_i(),
        num_skipped=zero_i(),
        num_forced=zero_i(),
        num_bad_hyperparams=zero_i(),
        last_num_draws=zero_i(),
        last_grad_norm=zero_f(),
        sum_sq_norms=zero_f(),
        sum_norms=zero_f(),
        acc_norm=zero_f(),
        # Not `microbatch_size or 0`: inject_hyperparams may trace it.
        microbatch_size=jnp.array(0 if microbatch_size is None else microbatch_size, jnp.int32),
        noise=_noise_scale.init_noise_scale(),
        # A Python number too, as an array of its default dtype.
        gate_state=jax.tree.map(lambda x: jnp.asarray(x, jnp.asarray(x).dtype), gate.init()),
        inner_state=inner.init(params),
        # zeros_like keeps the params' sharding, and their type inside shard_map.
        accumulator=jax.tree.map(
            lambda p: jnp.zeros_like(p, _accumulator_dtype(accumulator_dtype, p)), params
        ),
    )

  def step_fn(updates, state, params, extra_args, apply):
    """One microbatch; with ``apply``, returns new params in place of updates."""
    check_state(state, gate, inner, updates if params is None else params)
    _checks.check_params_like_init(params, state.accumulator)
    _checks.check_like_params(updates, state.accumulator)
    _check_accumulator_dtypes(state.accumulator, accumulator_dtype)
    if isinstance(microbatch_size, jax.Array):  # injected: it may change between updates
      state = _resized(state, microbatch_size)
    grad_sq = _checks.global_sq_norm(updates, axis_name)
    ok = jnp.isfinite(grad_sq) if skip_nonfinite else jnp.asarray(True)
    accumulator = _add(state.accumulator, updates, ok, fresh=state.num_draws == 0)
    stats = one_kernel(_draw_stats(state, grad_sq, sq_norm(accumulator, axis_name)))

    # When it steps: the gate opens, or max_draws forces it, never on a
    # rejected microbatch.
    gate_step, gate_state = _checks.check_gate_output(
        gate.update(stats, state.gate_state, **extra_args), state.gate_state
    )
    gate_state = jax.tree.map(  # a Python number too (a gate's constant)
        lambda new, old: jnp.asarray(new, jnp.asarray(old).dtype), gate_state, state.gate_state
    )
    forced = ok & ~gate_step & (stats.num_draws >= jnp.maximum(max_draws, 1))
    step = ok & (gate_step | forced)
    _checks.check_global_decision(grad_sq, step, axis_name)

    # The step's factor, a scalar of n: a bad one zeroes the update (and counts).
    scale, bad_scale = (
        (None, False) if scale_by_draws is None else _scale(scale_by_draws, stats.num_draws)
    )

    # One cond: the inner optimizer runs in the step branch alone. The large
    # buffers are operands, not closures, so XLA updates them in place and
    # copies nothing; the scalars after it read the decision back from the
    # cond (`stepped`, equal to `step`) rather than recompute the gate's.
    do_step, do_accumulate = _branches(
        inner, extra_args, scale, stats.num_draws, updates, state, params, apply
    )
    out, inner_state, stepped = jax.lax.cond(
        step, do_step, do_accumulate, accumulator, state.inner_state, params
    )
    new_state = _count(state, stats, ok, stepped, forced, max_draws, noise_decay, bad_scale)
    new_state = new_state._replace(gate_state=optax.tree.where(ok, gate_state, state.gate_state))
    # The new scalars in one kernel (see _numerics.one_kernel); the inner state
    # and the accumulator are left out, as the cond and the write return them.
    buffers = dict(inner_state=None, accumulator=None)
    new_state = one_kernel(new_state._replace(**buffers), state._replace(**buffers))
    return out, new_state._replace(inner_state=inner_state, accumulator=accumulator)

  def update_fn(updates, state, params=None, *loss, **extra_args):
    _checks.check_no_positional_loss(loss, 'update')
    return step_fn(updates, state, params, extra_args, apply=False)

  def update_and_apply_fn(updates, state, params, *loss, **extra_args):
    _checks.check_no_positional_loss(loss, 'update_and_apply')
    return step_fn(updates, state, params, extra_args, apply=True)

  return AccumulationTransformation(init_fn, update_fn, update_and_apply_fn)


def _resized(state: AccumulateState, microbatch_size: jax.Array) -> AccumulateState:
  """The state with a new (injected) ``microbatch_size``, its noise estimates in its units.

  The trace EMA is kept per microbatch: in microbatches ``new / old`` times as
  large it reads ``old / new`` times as much, so that the noise scale in
  examples carries over. Where either size is not above 0 it is kept. The
  microbatches of an accumulation under way when the size changes enter its
  step's estimate as they are, in mixed units.
  """
  old, new = state.microbatch_size, jnp.asarray(microbatch_size, jnp.int32)
  both = (old > 0) & (new > 0)
  factor = jnp.where(both, old.astype(jnp.float32) / jnp.where(both, new, 1), 1.0)
  noise = state.noise._replace(trace_cov_ema=state.noise.trace_cov_ema * factor)
  return state._replace(microbatch_size=new, noise=noise)


def _add(accumulator: Any, updates: Any, ok: jax.Array, fresh: jax.Array) -> Any:
  """The running sum with this microbatch: the donated accumulator, written in place.

  A stale accumulator (``fresh``: the first microbatch after a step) is
  overwritten, never zeroed; a rejected microbatch leaves it as it was.
  """

  def add(acc, g):
    g = g.astype(acc.dtype)
    return jnp.where(ok, jnp.where(fresh, g, acc + g), acc)

  return jax.tree.map(add, accumulator, updates)


def _draw_stats(state: AccumulateState, grad_sq: jax.Array, acc_sq: jax.Array) -> DrawStats:
  """What the gate reads: the running scalars with this microbatch counted."""
  n = optax.safe_increment(state.num_draws)  # stops at int32's largest
  grad_norm = jnp.sqrt(grad_sq)
  keep = jnp.where(state.num_draws == 0, 0.0, 1.0)  # the sums restart after a step
  return DrawStats(
      num_draws=n,
      num_microbatches=state.num_microbatches,
      grad_norm=grad_norm,
      acc_norm=jnp.sqrt(acc_sq) / n,
      sum_sq_norms=keep * state.sum_sq_norms + grad_sq,
      sum_norms=keep * state.sum_norms + grad_norm,
      noise_scale=_noise_scale.ratio(state.noise),
  )


def _mean_as(acc: jax.Array, n: jax.Array, dtype: Any) -> jax.Array:
  """The mean ``acc / n`` in the gradients' ``dtype``.

  The mean of finite gradients is within their dtype's range, but a bfloat16
  accumulator of float16 gradients may round it past (65504 to 65536): where
  the accumulator's range is wider, a finite mean is clipped to the gradients'.
  """
  mean = acc / n
  if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(acc.dtype).max > jnp.finfo(dtype).max:
    mean = mean.astype(jnp.promote_types(acc.dtype, dtype))  # holds both ranges' ends
    top = float(jnp.finfo(dtype).max)
    mean = jnp.where(jnp.isinf(mean), mean, jnp.clip(mean, -top, top))
  return mean.astype(dtype)


def _branches(inner, extra_args, scale, n, updates, state, params, apply):
  """The cond's two branches: step the inner optimizer on the mean, or pass through.

  Each takes ``(accumulator, inner_state, params)`` and returns ``(out,
  inner_state, stepped)``, where ``out`` is the updates, or with ``apply`` the
  new params, the step's multiplied by ``scale`` unless it is None. The inner
  state keeps the dtypes of init (bf16 params may give float32 moments), as
  ``optax.MultiSteps`` does, so both branches agree.
  """
  grad_dtypes = jax.tree.map(lambda g: g.dtype, updates)
  # The zero updates take the shapes do_step records as lax.cond traces it,
  # first. jax.eval_shape would trace inner again, as long as the first time:
  # it is the fallback, should cond ever trace do_accumulate first.
  step_shapes = []

  def do_step(accumulator, inner_state, params):
    mean = jax.tree.map(lambda acc, dt: _mean_as(acc, n, dt), accumulator, grad_dtypes)
    new_updates, new_state = _inner_update(inner, extra_args, mean, inner_state, params)
    new_state = optax.tree.cast_like(new_state, inner_state)
    # Without it, XLA:GPU turns the cond into selects and steps on every microbatch.
    stepped = kept_cond(jnp.asarray(True))
    if scale is not None:
      new_updates = jax.tree.map(lambda u: (u * scale).astype(u.dtype), new_updates)
    if apply:
      # n < 0 is a zero the compiler cannot see: see _numerics.rounded.
      new_updates = rounded(new_updates, (n < 0).astype(jnp.int32))
      _checks.check_params_take_updates(params, new_updates)
      return optax.apply_updates(params, new_updates), new_state, stepped
    step_shapes.append(jax.eval_shape(lambda: new_updates))
    return new_updates, new_state, stepped

  def do_accumulate(accumulator, inner_state, params):
    del accumulator
    if apply:
      return params, inner_state, jnp.asarray(False)
    if not step_shapes:
      step_shapes.append(
          jax.eval_shape(
              functools.partial(_inner_update, inner, extra_args), updates, inner_state, params
          )[0]
      )
    return optax.tree.zeros_like(step_shapes[0]), inner_state, jnp.asarray(False)

  return do_step, do_accumulate


def _count(state, stats, ok, stepped, forced, max_draws, noise_decay, bad_scale) -> AccumulateState:
  """The new counters, running sums and noise scale; the buffers as they were."""
  n = stats.num_draws

  def pick(on_step, on_accumulate, on_reject):
    return jnp.where(stepped, on_step, jnp.where(ok, on_accumulate, on_reject))

  # max_draws and noise_decay may be traced (optax.inject_hyperparams), where
  # jit cannot raise on a bad value: it is replaced, and counted.
  draws_ok = jnp.asarray(max_draws) >= 1
  decay_ok = _noise_scale.decay_ok(noise_decay)
  # This step's estimates, in microbatches: the small batch is one microbatch.
  grad_sq_est, trace_est = _noise_scale.estimates(
      1.0, stats.sum_sq_norms / n, n, jnp.square(stats.acc_norm)
  )

  zero_f = jnp.zeros([], jnp.float32)
  return state._replace(
      num_draws=pick(0, n, state.num_draws),
      num_microbatches=count_if(state.num_microbatches, ok),
      num_steps=count_if(state.num_steps, stepped),
      num_skipped=count_if(state.num_skipped, ~ok),
      num_forced=count_if(state.num_forced, forced),
      num_bad_hyperparams=count_if(
          state.num_bad_hyperparams, ok & ~(draws_ok & decay_ok) | stepped & bad_scale
      ),
      last_num_draws=pick(n, state.last_num_draws, state.last_num_draws),
      last_grad_norm=pick(stats.acc_norm, state.last_grad_norm, state.last_grad_norm),
      sum_sq_norms=pick(zero_f, stats.sum_sq_norms, state.sum_sq_norms),
      sum_norms=pick(zero_f, stats.sum_norms, state.sum_norms),
      acc_norm=pick(stats.acc_norm, stats.acc_norm, state.acc_norm),
      noise=_noise_scale.fold(
          state.noise, grad_sq_est, trace_est, noise_decay, stepped & (n >= 2) & decay_ok
      ),
  )


def update_and_apply(
    tx: optax.GradientTransformation,
    grads: Any,
    opt_state: Any,
    params: Any,
    *loss: Any,
    **extra_args: Any,
) -> tuple[Any, Any]:
  r"""One optimizer call that returns the new parameters: update and apply, fused.

  For an accumulation (:func:`accumulate`, and every ready-made optimizer and
  recipe built on it), the engine's ``lax.cond`` returns the new parameters:
  on a step, the parameters plus the inner update; otherwise the parameters,
  passed through unread. No zero update is written or applied on the
  microbatches that only accumulate, which is most of what they cost on the
  Optax path (``tx.update`` then ``optax.apply_updates``). For any other
  transformation it is that Optax path. Either way the parameters and the
  state equal the Optax path's.

  Under ``jax.jit``, donate the parameters and the state so that both are
  updated in place, and take them in the order they are returned, as in the
  example: jax gives each output the first donated buffer of its shape and
  dtype, in argument order, so jitting ``update_and_apply`` itself with
  ``donate_argnums=(2, 3)`` hands the parameters the buffers of the state's
  moments, and XLA copies them around (two param-sized temporaries for AdamW).

  Args:
    tx: an Optax transformation.
    grads: the gradients of one microbatch, like ``params``.
    opt_state: ``tx``'s state.
    params: the parameters.
    *loss: nothing: a loss given by position (torch's ``step(loss)``) raises
      a :class:`TypeError` that says to pass ``value=loss``.
    **extra_args: extra keyword arguments of ``update`` (e.g. ``value=loss``).

  Returns:
    ``(new_params, new_opt_state)``.

  Example:
    >>> import functools, jax, jax.numpy as jnp, optax, optax_gqc
    >>> tx = optax_gqc.sbc(optax.sgd(0.5), logical_batch_size=2, microbatch_size=1)
    >>> @functools.partial(jax.jit, donate_argnums=(0, 1))
    ... def train_step(params, state, grads):
    ...   return optax_gqc.update_and_apply(tx, grads, state, params)
    >>> params = {'w': jnp.ones(2)}
    >>> state = tx.init(params)
    >>> params, state = train_step(params, state, {'w': jnp.ones(2)})
    >>> params['w']  # accumulating: unchanged
    Array([1., 1.], dtype=float32)
    >>> params, state = train_step(params, state, {'w': jnp.full(2, 3.0)})
    >>> params['w']  # stepped on the mean gradient, 2
    Array([0., 0.], dtype=float32)
  """
  _checks.check_no_positional_loss(loss, 'update_and_apply')
  if params is None:  # optax.apply_updates(None, updates) is None: the step would be lost
    raise TypeError('update_and_apply returns the new params: pass the params to update')
  fused = getattr(tx, 'update_and_apply', None)
  if fused is not None:
    return fused(grads, opt_state, params, **extra_args)
  updates, opt_state = with_extra_args(tx).update(grads, opt_state, params, **extra_args)
  return optax.apply_updates(params, updates), opt_state


def with_extra_args(tx: Any) -> optax.GradientTransformationExtraArgs:
  """``optax.with_extra_args_support``, but passing them on to an ``optax.MultiSteps``.

  Optax's wrapper drops the extra arguments (``value=loss``) of every object
  that is not a ``GradientTransformationExtraArgs``; ``optax.MultiSteps`` (and
  its ``gradient_transformation()``) is not one, but its update takes them and
  passes them to its inner optimizer.
  """
  owner = getattr(tx.update, '__self__', None)
  if isinstance(tx, optax.MultiSteps) or isinstance(owner, optax.MultiSteps):
    return optax.GradientTransformationExtraArgs(tx.init, tx.update)
  return optax.with_extra_args_support(tx)


def _inner_update(inner, extra_args, updates, inner_state, params):
  return inner.update(updates, inner_state, params, **extra_args)


def gate_entries(gate_state: Any):
  """The ``(name, value)`` entries of a gate state, of combined gates' too."""
  if isinstance(gate_state, dict):
    yield from gate_state.items()
  elif isinstance(gate_state, tuple | list):
    for sub in gate_state:
      yield from gate_entries(sub)
