"""A replay harness: one gradient stream through a PyTorch optimizer and an Optax transformation.

:func:`replay` feeds one stream of microbatch gradients (and losses, for a gate
that reads them) to a PyTorch optimizer, or a torch-gqc wrapper with its
schedule, and to an Optax transformation, and records both sides after every
microbatch. :func:`first_divergence` names the first microbatch where they part,
and why.

Needs PyTorch: ``pip install "optax-gqc[torch]"``.
"""

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

try:
  import torch
except ImportError as e:
  raise ImportError(
      'optax_gqc.interop.torch_replay needs PyTorch; install it with: '
      'pip install "optax-gqc[torch]"'
  ) from e

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_gqc import _checks
from optax_gqc._accumulation import with_extra_args
from optax_gqc._statistics import statistics
from optax_gqc.interop.torch import _check_same_names, set_grads, to_jax, to_torch

__all__ = [
    'DEFAULT_HYPERPARAM_NAMES',
    'DEFAULT_STAT_NAMES',
    'Divergence',
    'Record',
    'first_divergence',
    'replay',
]


class Record(NamedTuple):
  """Both sides of :func:`replay` after one microbatch.

  Parameters are NumPy copies keyed by name. ``*_stats`` are the sides'
  statistics (torch-gqc's ``statistics()``; ours :func:`optax_gqc.statistics`);
  ``*_hyperparams`` the values the microbatch was processed with (torch: the
  scalars of the first param group before the schedule advances; ours:
  ``optax.tree.get(state, 'hyperparams')``).
  """

  index: int  # the microbatch, from 0
  loss: float | None  # its loss, when replay was given losses
  torch_stepped: bool  # whether torch's optimizer stepped on it
  optax_stepped: bool  # whether ours did (its num_steps grew)
  torch_params: dict[str, np.ndarray]  # torch's parameters after it
  optax_params: dict[str, np.ndarray]  # ours after it
  torch_stats: dict[str, Any]  # torch-gqc's statistics() after it
  optax_stats: dict[str, Any]  # optax_gqc.statistics after it
  torch_hyperparams: dict[str, float]  # the first param group's scalars it was processed with
  optax_hyperparams: dict[str, float]  # the injected hyperparameters it was processed with


def _numpy(tensor: torch.Tensor) -> np.ndarray:
  if tensor.dtype == torch.bfloat16:
    return np.asarray(to_jax(tensor))  # NumPy has no bfloat16 of its own
  return tensor.detach().cpu().numpy().copy()


def _scalar(value: Any) -> Any:
  """A Python number from a number or a 0-d array/tensor; anything else as is."""
  if isinstance(value, torch.Tensor) and value.ndim == 0:
    return value.item()
  if isinstance(value, np.ndarray | np.generic | jax.Array) and np.ndim(value) == 0:
    return np.asarray(value).item()
  return value


def _torch_hyperparams(optimizer: Any) -> dict[str, float]:
  group = optimizer.param_groups[0]
  out = {}
  for name, value in group.items():
    value = _scalar(value)
    if name != 'params' and isinstance(value, numbers.Real) and not isinstance(value, bool):
      out[name] = value
  return out


def _default_torch_stats(optimizer: Any) -> dict[str, Any]:
  """torch-gqc's ``statistics()``; nothing for a plain torch optimizer."""
  stats = getattr(type(optimizer), 'statistics', None)
  return dict(optimizer.statistics()) if callable(stats) else {}


def _default_torch_step(optimizer: Any, loss: float | None) -> bool | None:
  # A torch optimizer's step takes a closure, not a loss; torch-gqc's loss-driven
  # wrappers (MHT) take the loss.
  if loss is None or isinstance(optimizer, torch.optim.Optimizer):
    return optimizer.step()
  return optimizer.step(loss)


def _default_optax_stats(state: Any) -> dict[str, Any]:
  """:func:`optax_gqc.statistics` of the state, as Python numbers."""
  try:
    stats = statistics(state)
  except ValueError:
    return {}
  return {k: _scalar(v) for k, v in jax.device_get(stats).items()}


def _optax_hyperparams(state: Any) -> dict[str, float]:
  try:
    hyper = optax.tree.get(state, 'hyperparams')
  except KeyError:  # several inject_hyperparams: which one is ambiguous
    return {}
  if not isinstance(hyper, Mapping):
    return {}
  return {k: _scalar(v) for k, v in jax.device_get(dict(hyper)).items() if np.ndim(v) == 0}


def _optax_step_eager(tx, params, state, grads, extra_args):
  tx = with_extra_args(tx)
  updates, state = tx.update(grads, state, params, **extra_args)
  return optax.apply_updates(params, updates), state


# Static in the transformation: replaying the same one again reuses the compiled step.
_optax_step = jax.jit(_optax_step_eager, static_argnums=0)


def replay(
    torch_side: Callable[[list[torch.nn.Parameter]], Any],
    optax_side: optax.GradientTransformation,
    params: Mapping[str, Any],
    grad_stream: Iterable[Mapping[str, Any]],
    losses: Iterable[float] | None = None,
    *,
    torch_step: Callable[[Any, float | None], bool | None] | None = None,
    torch_stats: Callable[[Any], Mapping[str, Any]] | None = None,
    optax_stats: Callable[[Any], Mapping[str, Any]] | None = None,
    jit: bool = True,
) -> list[Record]:
  """Feeds one gradient stream to a torch optimizer and an Optax transformation.

  Both sides start from ``params``. For every microbatch gradient ``g`` (and
  loss, when ``losses`` is given), in order, ``g`` cast to each parameter's
  dtype on both sides (torch's ``.grad`` must have it):

  - torch: ``g`` is added to the parameters' ``.grad`` through autograd (see
    :func:`~optax_gqc.interop.torch.set_grads`), as ``loss.backward()``
    would; then ``torch_step`` (by default ``optimizer.step()``, or
    ``optimizer.step(loss)`` for a wrapper that is not a
    ``torch.optim.Optimizer`` when losses are given); the
    statistics and hyperparameters are read; the schedule, if any, steps; and
    a plain torch optimizer (its ``step`` returns None) has its gradients
    cleared, as a training loop would. This is torch-gqc's loop:
    ``loss.backward(); wrapper.step(); schedule.step()``.
  - Optax: ``update(g, state, params)`` (with ``value=loss`` when losses are
    given), jitted, then ``optax.apply_updates``.

  A torch side stepped when its ``step`` returned True (or None, a plain
  optimizer). Ours stepped when its statistics' ``num_steps`` grew, or on
  every microbatch when they have no ``num_steps`` (``optax.sgd`` with a
  constant rate, say).

  Args:
    torch_side: called with the torch parameters (one ``nn.Parameter`` per
      entry of ``params``, in order); returns a torch optimizer, a torch-gqc
      wrapper, or a pair ``(optimizer, schedule)`` with a schedule stepped
      after every microbatch (e.g. torch-gqc's factories).
    optax_side: the Optax transformation, called once per microbatch.
    params: the initial parameters, ``{name: array}``; the arrays may be
      torch tensors (``dict(model.named_parameters())``).
    grad_stream: the microbatch gradients, each a dict like ``params``.
    losses: one loss per microbatch, for gates that read it; torch-gqc's
      MHT wrapper takes it as ``step(loss)``, ours as ``update(..., value=loss)``.
    torch_step: ``(optimizer, loss or None) -> stepped``, to call a torch
      side some other way.
    torch_stats: ``optimizer -> dict``; by default torch-gqc's
      ``statistics()``, or nothing for a plain optimizer.
    optax_stats: ``state -> dict``; by default :func:`optax_gqc.statistics`
      (with its values as Python numbers).
    jit: jit the Optax update (compiled once per transformation).

  Returns:
    One :class:`Record` per microbatch.

  Example:
    >>> import jax.numpy as jnp, optax, torch
    >>> from optax_gqc.interop.torch_replay import first_divergence, replay
    >>> params = {'w': jnp.ones(3)}
    >>> stream = [{'w': jnp.full(3, 0.5 * i)} for i in range(4)]
    >>> records = replay(
    ...     lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    ...     optax.sgd(0.1, momentum=0.9), params, stream)
    >>> last = records[-1]
    >>> print(last.torch_params['w'], last.optax_params['w'])
    [0.5245 0.5245 0.5245] [0.5245 0.5245 0.5245]
    >>> print(first_divergence(records))
    None
  """
  torch_step = torch_step or _default_torch_step
  torch_stats = torch_stats or _default_torch_stats
  optax_stats = optax_stats or _default_optax_stats
  step_fn = _optax_step if jit else _optax_step_eager
  if not isinstance(params, Mapping):
    raise TypeError(
        f'replay: params must be a flat {{name: array}} dict, got {type(params).__name__}'
    )
  names = list(params)

  # Both sides start from JAX's arrays: the dtypes JAX gives (float32 for a
  # NumPy float64 while jax_enable_x64 is off), not two precisions.
  jax_params = {k: _to_jax_array(params[k], f'params[{k!r}]') for k in names}
  torch_params = [torch.nn.Parameter(to_torch(jax_params[k])) for k in names]
  built = torch_side(torch_params)
  optimizer, schedule = built if isinstance(built, tuple) else (built, None)

  state = optax_side.init(jax_params)
  steps_before = optax_stats(state).get('num_steps', 0)
  loss_iter = iter(losses) if losses is not None else None

  records = []
  for index, grads in enumerate(grad_stream):
    loss = None
    if loss_iter is not None:
      try:
        loss = float(next(loss_iter))
      except StopIteration:
        raise ValueError(f'replay: losses ran out at microbatch {index}') from None
    if not isinstance(grads, Mapping):
      raise TypeError(
          f'replay: microbatch {index} must be a {{name: array}} dict like params, got '
          f'{type(grads).__name__}'
      )
    _check_same_names(f'replay: microbatch {index}', params, grads)
    # The same values to both sides: in the parameter's dtype, as torch's .grad must be.
    grads = {
        k: _as_param_dtype(
            _to_jax_array(grads[k], f'microbatch {index}[{k!r}]'), jax_params[k], index, k
        )
        for k in names
    }

    set_grads(dict(zip(names, torch_params, strict=True)), grads, accumulate=True)
    result = torch_step(optimizer, loss)
    t_stats = {k: _scalar(v) for k, v in torch_stats(optimizer).items()}
    t_hyper = _torch_hyperparams(optimizer)
    if schedule is not None:
      schedule.step()
    if result is None:
      optimizer.zero_grad(set_to_none=True)

    extra = {} if loss is None else {'value': jnp.asarray(loss, jnp.float32)}
    jax_params, state = step_fn(optax_side, jax_params, state, grads, extra)
    o_stats = dict(optax_stats(state))
    steps = o_stats.get('num_steps')
    o_stepped = True if steps is None else steps > steps_before
    steps_before = steps if steps is not None else steps_before

    records.append(
        Record(
            index=index,
            loss=loss,
            torch_stepped=True if result is None else bool(result),
            optax_stepped=bool(o_stepped),
            torch_params={k: _numpy(p) for k, p in zip(names, torch_params, strict=True)},
            optax_params={k: np.asarray(v) for k, v in jax_params.items()},
            torch_stats=t_stats,
            optax_stats=o_stats,
            torch_hyperparams=t_hyper,
            optax_hyperparams=_optax_hyperparams(state),
        )
    )
  return records


def _to_jax_array(value: Any, what: str) -> jax.Array:
  """A copy in JAX of an array or a torch tensor (one that requires grad included)."""
  if value is None or isinstance(value, Mapping | list | tuple):
    raise TypeError(
        f'replay: {what} is {"None" if value is None else type(value).__name__}, not an array: '
        'params and every microbatch are flat {name: array} dicts with the same names (a '
        'frozen parameter gets a zero gradient, or stays out of both sides)'
    )
  return to_jax(value) if isinstance(value, torch.Tensor) else jnp.array(value)


def _as_param_dtype(grad: jax.Array, param: jax.Array, index: int, name: str) -> jax.Array:
  """``grad`` in ``param``'s dtype; refused where finite values would become inf."""
  cast = grad.astype(param.dtype)
  if jnp.issubdtype(param.dtype, jnp.inexact) and bool(
      jnp.any(jnp.isfinite(grad) & ~jnp.isfinite(cast))
  ):
    raise OverflowError(
        f'replay: microbatch {index}[{name!r}] holds finite values beyond the largest '
        f"{param.dtype}, its parameter's dtype: they would become inf on both sides. Scale "
        'them first'
    )
  return cast


# Where the two sides part.

#: torch-gqc statistic -> optax_gqc statistic, compared when both sides report it.
DEFAULT_STAT_NAMES: dict[str, str] = {
    'num_draws': 'num_draws',
    'num_batches': 'num_microbatches',
    'num_steps': 'num_steps',
    'last_num_draws': 'last_num_draws',
    'last_grad_norm': 'last_grad_norm',
    'gradient_norm_threshold': 'threshold',
    'logical_batch_size': 'logical_batch_size',
}

#: torch param-group entry -> Optax hyperparameter, compared when both are there.
DEFAULT_HYPERPARAM_NAMES: dict[str, str] = {
    'lr': 'learning_rate',
    'weight_decay': 'weight_decay',
    'momentum': 'momentum',  # SGD's and SGD-SaI's, on both sides
    'eps': 'eps',
}


class Divergence(NamedTuple):
  """The first disagreement found by :func:`first_divergence`."""

  index: int  # the microbatch
  what: str  # 'step', "stat 'num_draws'", "hyperparam 'lr'", "param 'w'[2, 0]"
  torch_value: Any  # torch's side there
  optax_value: Any  # ours

  def __str__(self) -> str:
    return (
        f'microbatch {self.index}: {self.what} differs: torch {self.torch_value!r}, '
        f'optax {self.optax_value!r}'
    )


# Counts, compared exactly: at rtol=1e-2, for bfloat16, 150 and 149 would agree.
_COUNTS = frozenset({'num_draws', 'num_microbatches', 'num_steps', 'last_num_draws'})


def _close(torch_value: Any, optax_value: Any, rtol: float, atol: float) -> bool:
  # np.isclose(x, y) scales rtol by |y|: the torch value is the reference.
  return bool(
      np.isclose(float(optax_value), float(torch_value), rtol=rtol, atol=atol, equal_nan=True)
  )


def first_divergence(
    records: Sequence[Record],
    *,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    stat_names: Mapping[str, str] | None = None,
    hyperparam_names: Mapping[str, str] | None = None,
    compare_params: bool = True,
) -> Divergence | None:
  """The first microbatch where the two sides of :func:`replay` disagree.

  At each microbatch, in this order: the step decision (exactly); the
  statistics and hyperparameters named on both sides (the counts
  ``num_draws``, ``num_microbatches``, ``num_steps`` and ``last_num_draws``
  exactly); every parameter's shape, then its every element. Scalars agree
  when ``|torch - optax| <= atol + rtol * |torch|``. A parameter entry
  agrees when ``|torch - optax| <= atol + rtol * s``, with ``s`` the largest
  finite magnitude in its leaf on the torch side: float32 rounding is
  relative to the scale of the arithmetic, and an entry passing near zero
  keeps an absolute error of that scale. NaNs agree with NaNs, and an
  infinity with the same infinity only. A statistic one side does not
  report (torch-gqc's ``last_grad_norm`` before the first step) is not
  compared.

  The default ``rtol`` suits float32 parameters. Others need their own: the
  two sides round differently within the first steps, by a bfloat16 rounding
  for bfloat16 parameters (its epsilon is 2**-7: an ``rtol`` of about 1e-2;
  an Adam replay of 20 steps needs it) and by a float16 one for float16
  parameters (about 1e-3). Those roundings add up over the steps, the more
  so where the update is large beside the parameter: a bfloat16 SGD-SaI
  replay can part by more than 1e-2 within a few steps, each side as far
  from a float64 run as the other. Compare such a replay with a float64
  reference run, not with each other.

  Args:
    records: the output of :func:`replay`.
    rtol: relative tolerance.
    atol: absolute tolerance.
    stat_names: torch statistic name -> ours; :data:`DEFAULT_STAT_NAMES` by default.
    hyperparam_names: torch param-group entry -> ours;
      :data:`DEFAULT_HYPERPARAM_NAMES` by default.
    compare_params: also compare the parameters.

  Returns:
    A :class:`Divergence` (its ``str`` says where and what), or None when
    the sides agree throughout.
  """
  for name, tol in (('rtol', rtol), ('atol', atol)):  # True would be 1; inf agrees with all
    if not _checks.is_number(tol) or np.ndim(tol) != 0:
      raise TypeError(f'{name} must be a number, got {type(tol).__name__} {tol!r}')
    if not 0 <= tol < math.inf:
      raise ValueError(f'{name} must be a finite number >= 0, got {tol!r}')
  _checks.check_bool('compare_params', compare_params)
  stat_names = DEFAULT_STAT_NAMES if stat_names is None else stat_names
  hyperparam_names = DEFAULT_HYPERPARAM_NAMES if hyperparam_names is None else hyperparam_names
  for r in records:
    if r.torch_stepped != r.optax_stepped:
      return Divergence(
          r.index,
          'step',
          'stepped' if r.torch_stepped else 'accumulated',
          'stepped' if r.optax_stepped else 'accumulated',
      )
    for kind, names, t_side, o_side in (
        ('stat', stat_names, r.torch_stats, r.optax_stats),
        ('hyperparam', hyperparam_names, r.torch_hyperparams, r.optax_hyperparams),
    ):
      for t_name, o_name in names.items():
        t, o = t_side.get(t_name), o_side.get(o_name)
        if t is None or o is None:
          continue
        exact = kind == 'stat' and o_name in _COUNTS
        if not (float(t) == float(o) if exact else _close(t, o, rtol, atol)):
          label = t_name if t_name == o_name else f'{t_name}/{o_name}'
          return Divergence(r.index, f'{kind} {label!r}', t, o)
    if compare_params:
      for name in r.optax_params.keys() - r.torch_params.keys():
        return Divergence(r.index, f'param {name!r}', 'missing', 'present')
      for name, t in r.torch_params.items():
        if name not in r.optax_params:
          return Divergence(r.index, f'param {name!r}', 'present', 'missing')
        t = np.asarray(t, np.float64)
        o = np.asarray(r.optax_params[name], np.float64)
        if t.shape != o.shape:  # broadcasting would compare (3,) with (1, 3) as equal
          return Divergence(r.index, f'param {name!r} shape', t.shape, o.shape)
        scale = np.max(np.abs(t), initial=0.0, where=np.isfinite(t))
        with np.errstate(invalid='ignore'):  # inf - inf: equal infinities agree below
          err = np.abs(t - o)
        bad = ~((err <= atol + rtol * scale) | (t == o) | (np.isnan(t) & np.isnan(o)))
        if bad.any():
          worst = np.where(bad, np.nan_to_num(err, nan=np.inf), -1.0)
          where = np.unravel_index(np.argmax(worst), t.shape)
          at = f"[{', '.join(str(int(i)) for i in where)}]" if t.ndim else ''
          return Divergence(r.index, f'param {name!r}{at}', float(t[where]), float(o[where]))
  return None
