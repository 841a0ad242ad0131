"""Gated gradient accumulation: the engine behind every optax_gqc wrapper.

One microbatch gradient comes in per call of ``update``. The engine adds it to
a float32 accumulator, refreshes a few scalar statistics, asks a gate whether
the mean gradient is good enough, and only then runs the inner optimizer on
that mean. The whole decision is one ``jax.lax.cond`` on device.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_gqc import _checks
from optax_gqc._noise_scale import noise_scale_estimates
from optax_gqc._numerics import sq_norm
from optax_gqc.gates import DrawStats, Gate


class AccumulateState(NamedTuple):
  """State of :func:`accumulate`. Every field has its final shape from ``init``."""

  num_draws: jax.Array  # int32: microbatches accumulated since the last step.
  num_batches: jax.Array  # int32: microbatches accepted over the whole run.
  num_steps: jax.Array  # int32: inner optimizer steps taken.
  num_skipped: jax.Array  # int32: microbatches rejected for a non-finite norm.
  last_num_draws: jax.Array  # int32: microbatches averaged at the last step.
  last_grad_norm: jax.Array  # float32: ||gbar|| at the last step.
  sum_sq_norms: jax.Array  # float32: sum_i ||g_i||^2 over the accumulation.
  sum_norms: jax.Array  # float32: sum_i ||g_i|| over the accumulation.
  acc_norm: jax.Array  # float32: ||gbar|| after the latest microbatch.
  # Noise scale: raw EMAs of the two-batch estimates of |G|^2 and tr(Sigma),
  # and the total weight of those EMAs, 1 - decay^k after k estimates (their
  # bias correction is a division by it).
  grad_sq_norm_ema: jax.Array  # float32
  trace_cov_ema: jax.Array  # float32
  noise_weight: jax.Array  # float32
  gate_state: Any  # the gate's own scalars.
  inner_state: Any  # the inner optimizer's state, touched only on steps.
  # Sum of the current accumulation's gradients. Not zeroed on a step: the
  # next microbatch ignores it when num_draws == 0, which saves a pass.
  accumulator: Any


def _check_like_params(updates: Any, accumulator: Any) -> None:
  """Raises at trace time if the gradients do not match the params from init."""
  if jax.tree.structure(updates) != jax.tree.structure(accumulator):
    raise ValueError(
        'accumulate: the gradient tree does not match the params given to init: '
        f'{jax.tree.structure(updates)} vs {jax.tree.structure(accumulator)}'
    )
  for path, g, a in zip(
      jax.tree_util.tree_leaves_with_path(updates),
      jax.tree.leaves(updates),
      jax.tree.leaves(accumulator),
      strict=True,
  ):
    if g.shape != a.shape:
      raise ValueError(
          f'accumulate: gradient {jax.tree_util.keystr(path[0])} has shape '
          f'{g.shape}, but the params given to init had {a.shape}'
      )


def accumulate(
    inner: optax.GradientTransformation,
    gate: Gate,
    *,
    max_draws: int = 64,
    microbatch_size: int | None = None,
    accumulator_dtype: Any = None,
    skip_nonfinite: bool = True,
    noise_decay: float = 0.99,
) -> optax.GradientTransformationExtraArgs:
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
  read back to the host.

  The gate sees a :class:`DrawStats` of running scalars (:math:`n`, the
  microbatch count :math:`t`, :math:`\|g_i\|`, :math:`\|\bar g\|`,
  :math:`\sum_i \|g_i\|^2`, :math:`\sum_i \|g_i\|`), so memory stays at one
  accumulator whatever the gate. Hyperparameter schedules are functions of
  :math:`t`, the number of microbatches accepted before the current one.

  A microbatch whose squared norm is not finite (it holds a NaN or an Inf, or
  its float32 squared norm overflows) is rejected when ``skip_nonfinite``: the
  accumulator, the counters and the gate state stay as they were, and
  ``num_skipped`` counts it.

  Args:
    inner: the optimizer that steps on the mean gradient.
    gate: the decision rule, e.g. :func:`optax_gqc.gates.norm_below`.
    max_draws: the most microbatches accumulated before a step is forced. It
      may be traced, so ``optax.inject_hyperparams`` can change it mid-run.
    microbatch_size: examples per microbatch; used to report the noise scale
      in examples. Optional.
    accumulator_dtype: dtype of the accumulator; None means float32, also
      for bf16 gradients. (None rather than ``jnp.float32`` as the default, because
      ``optax.inject_hyperparams`` would take a dtype, a callable, for a schedule.)
    skip_nonfinite: reject microbatches with a non-finite gradient norm.
    noise_decay: EMA decay of the noise-scale estimates (see below).

  The engine also estimates the gradient noise scale
  :math:`B_\text{simple} = \operatorname{tr}(\Sigma) / |G|^2` of McCandlish et al.
  from the same scalars, with no extra buffer: at every step that averaged
  :math:`n \ge 2` microbatches, the small batch is one microbatch (its squared
  norm averaged over all :math:`n`) and the big batch is their mean; see
  :func:`optax_gqc.noise_scale_estimates`. The two estimates are smoothed
  separately by a bias-corrected EMA and divided (:func:`statistics` reports
  ``noise_scale``, ``grad_sq_norm_est``, ``trace_cov_est``), in examples when
  ``microbatch_size`` is given, in microbatches otherwise. Unlike GPT-NeoX's
  ``GradientNoiseScale``, both batches come from the same parameters (it pairs
  gradients from consecutive optimizer steps) and all microbatches of the step
  form the small-batch estimate, not only the last.

  The estimate is unbiased when the decision to step does not depend on the
  gradients (:func:`optax_gqc.gates.batch_size_at_least`, ``max_draws``). A
  gate that reads them chooses where to stop: GNTS stops when the mean happens
  to be short, which biases the estimate up, and the norm test biases it down
  (by +60% and -30% on a linear-regression test). For a noise scale to trust,
  read it from an SBC accumulation, or from :func:`optax_gqc.noise_scale`
  across devices.

  Returns:
    A :class:`optax.GradientTransformationExtraArgs`. Extra keyword arguments
    of ``update`` (such as ``value=loss``) reach both the gate and ``inner``.

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
  if not isinstance(gate, Gate):
    if callable(gate):
      raise TypeError(
          'gate must be an optax_gqc.gates.Gate (init, update); wrap a plain '
          'function of DrawStats with optax_gqc.gates.from_function'
      )
    raise TypeError(f'gate must be an optax_gqc.gates.Gate, got {type(gate).__name__}')
  _checks.check_positive_int('max_draws', max_draws)
  if microbatch_size is not None:
    _checks.check_positive_int('microbatch_size', microbatch_size)
  if accumulator_dtype is None:
    accumulator_dtype = jnp.float32
  _checks.check_unit_interval('noise_decay', noise_decay)
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    # A separate array per field: a donated state must not hold one buffer twice.
    def zero_i():
      return jnp.zeros([], jnp.int32)

    def zero_f():
      return jnp.zeros([], jnp.float32)

    return AccumulateState(
        num_draws=zero_i(),
        num_batches=zero_i(),
        num_steps=zero_i(),
        num_skipped=zero_i(),
        last_num_draws=zero_i(),
        last_grad_norm=zero_f(),
        sum_sq_norms=zero_f(),
        sum_norms=zero_f(),
        acc_norm=zero_f(),
        grad_sq_norm_ema=zero_f(),
        trace_cov_ema=zero_f(),
        noise_weight=zero_f(),
        gate_state=gate.init(),
        inner_state=inner.init(params),
        accumulator=optax.tree.zeros_like(params, dtype=accumulator_dtype),
    )

  def update_fn(updates, state, params=None, **extra_args):
    _check_like_params(updates, state.accumulator)
    grad_sq = sq_norm(updates)
    ok = jnp.isfinite(grad_sq) if skip_nonfinite else jnp.asarray(True)
    fresh = state.num_draws == 0
    n = state.num_draws + 1

    # The new running sum goes straight into the (donated) accumulator, before
    # the cond: XLA writes it in place and the norm below reads it with no
    # temporary. A stale accumulator (num_draws == 0) is overwritten, never
    # zeroed; a rejected microbatch leaves it as it was.
    def add(acc, g):
      g = g.astype(acc.dtype)
      return jnp.where(ok, jnp.where(fresh, g, acc + g), acc)

    accumulator = jax.tree.map(add, state.accumulator, updates)
    acc_norm = jnp.sqrt(sq_norm(accumulator)) / n
    grad_norm = jnp.sqrt(grad_sq)
    keep = jnp.where(fresh, 0.0, 1.0)
    stats = DrawStats(
        num_draws=n,
        num_batches=state.num_batches,
        grad_norm=grad_norm,
        acc_norm=acc_norm,
        sum_sq_norms=keep * state.sum_sq_norms + grad_sq,
        sum_norms=keep * state.sum_norms + grad_norm,
    )
    gate_step, gate_state = gate.update(stats, state.gate_state, **extra_args)
    step = ok & (gate_step | (n >= max_draws))

    grad_dtypes = jax.tree.map(lambda g: g.dtype, updates)
    out_shape, _ = jax.eval_shape(
        functools.partial(_inner_update, inner, extra_args),
        updates,
        state.inner_state,
        params,
    )

    # The large buffers are operands, not closures: the step branch only reads
    # the accumulator and updates the inner state in place; the other branch
    # passes the inner state through unread. So XLA copies nothing.
    def do_step(accumulator, inner_state, params):
      mean = jax.tree.map(lambda acc, dt: (acc / n).astype(dt), accumulator, grad_dtypes)
      return _inner_update(inner, extra_args, mean, inner_state, params)

    def do_accumulate(accumulator, inner_state, params):
      del accumulator, params
      return optax.tree.zeros_like(out_shape), inner_state

    new_updates, inner_state = jax.lax.cond(
        step, do_step, do_accumulate, accumulator, state.inner_state, params
    )

    def pick(on_step, on_accumulate, on_reject):
      return jnp.where(step, on_step, jnp.where(ok, on_accumulate, on_reject))

    # The noise-scale estimates of this step, folded into their EMAs on a step
    # that averaged n >= 2 microbatches.
    batch = 1.0 if microbatch_size is None else microbatch_size
    grad_sq_est, trace_est = noise_scale_estimates(
        batch, stats.sum_sq_norms / n, n * batch, jnp.square(acc_norm)
    )
    fold = step & (n >= 2)

    def ema(old, new):
      return jnp.where(fold, noise_decay * old + (1.0 - noise_decay) * new, old)

    zero_f = jnp.zeros([], jnp.float32)
    new_state = AccumulateState(
        num_draws=pick(0, n, state.num_draws),
        num_batches=pick(state.num_batches + 1, state.num_batches + 1, state.num_batches),
        num_steps=pick(state.num_steps + 1, state.num_steps, state.num_steps),
        num_skipped=state.num_skipped + jnp.where(ok, 0, 1),
        last_num_draws=pick(n, state.last_num_draws, state.last_num_draws),
        last_grad_norm=pick(acc_norm, state.last_grad_norm, state.last_grad_norm),
        sum_sq_norms=pick(zero_f, stats.sum_sq_norms, state.sum_sq_norms),
        sum_norms=pick(zero_f, stats.sum_norms, state.sum_norms),
        acc_norm=pick(acc_norm, acc_norm, state.acc_norm),
        grad_sq_norm_ema=ema(state.grad_sq_norm_ema, grad_sq_est),
        trace_cov_ema=ema(state.trace_cov_ema, trace_est),
        noise_weight=ema(state.noise_weight, 1.0),
        gate_state=optax.tree.where(ok, gate_state, state.gate_state),
        inner_state=inner_state,
        accumulator=accumulator,
    )
    return new_updates, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _inner_update(inner, extra_args, updates, inner_state, params):
  return inner.update(updates, inner_state, params, **extra_args)


def _is_variable(x: Any) -> bool:
  # Flax NNX keeps optimizer state leaves in Variables (nnx.Optimizer.opt_state).
  return hasattr(x, 'get_value') and not isinstance(x, jax.Array)


def _flat_gate_stats(gate_state: Any, out: dict[str, jax.Array]) -> None:
  if isinstance(gate_state, dict):
    for key, value in gate_state.items():
      name, i = key, 1
      while name in out:
        name, i = f'{key}_{i}', i + 1
      out[name] = value
  elif isinstance(gate_state, tuple | list):
    for sub in gate_state:
      _flat_gate_stats(sub, out)


def statistics(state: Any) -> dict[str, jax.Array]:
  r"""Returns the accumulation statistics of an optimizer state, for logging.

  Finds the :class:`AccumulateState` wherever it sits in a nested optimizer
  state (inside ``optax.chain``, ``optax.inject_hyperparams``, or the
  ``opt_state`` of a Flax ``nnx.Optimizer``); with several, the first one in
  traversal order. Works under ``jax.jit``.

  Args:
    state: an optimizer state that contains an accumulation state.

  Returns:
    A dict of 0-d arrays: ``num_draws``, ``num_batches``, ``num_steps``,
    ``num_skipped``, ``last_num_draws``, ``last_grad_norm``, ``acc_norm`` (the
    norm of the current mean gradient); the noise scale ``noise_scale``
    (:math:`B_\text{simple}`) with its parts ``grad_sq_norm_est`` and
    ``trace_cov_est`` (bias-corrected EMAs; NaN until a step has averaged
    two microbatches); and the gate's current hyperparameters (e.g.
    ``threshold``). A gate entry whose name is taken gets a suffix ``_1``,
    ``_2``, ...

  Raises:
    ValueError: if ``state`` holds no accumulation state.
  """
  found = [
      s
      for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, AccumulateState))
      if isinstance(s, AccumulateState)
  ]
  if not found:
    raise ValueError('statistics: the optimizer state holds no accumulation state')
  s = jax.tree.map(
      lambda x: x.get_value() if _is_variable(x) else x, found[0], is_leaf=_is_variable
  )
  out = {
      name: getattr(s, name)
      for name in (
          'num_draws',
          'num_batches',
          'num_steps',
          'num_skipped',
          'last_num_draws',
          'last_grad_norm',
          'acc_norm',
      )
  }
  weight = jnp.where(s.noise_weight > 0, s.noise_weight, jnp.nan)
  out['grad_sq_norm_est'] = s.grad_sq_norm_ema / weight
  out['trace_cov_est'] = s.trace_cov_ema / weight
  out['noise_scale'] = out['trace_cov_est'] / out['grad_sq_norm_est']
  _flat_gate_stats(s.gate_state, out)
  return out
