"""Argument checks shared by the public factories.

Each error names the argument and says what to pass instead.
"""

import inspect
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_gqc._numerics import axis_names, sq_norm, varying_axes

INT32_MAX = 2**31 - 1


# optax.inject_hyperparams takes every callable argument for a schedule of its
# step count, and passes its value, an array: a dtype or a function among them.
INJECTED_FUNCTION = (
    'optax.inject_hyperparams takes a function or a dtype for a schedule, and passes its '
    "value: list it as static, optax.inject_hyperparams(f, static_args=('{name}',))"
)


def is_number(value: Any) -> bool:
  """Whether ``value`` is a real number or an array of them (a bool, NumPy's too, is not one)."""
  if isinstance(value, bool | np.bool_) or getattr(value, 'dtype', None) == np.bool_:
    return False
  return isinstance(value, numbers.Real | np.ndarray | np.generic | jax.Array)


def concrete_float(name: str, value: Any, *, schedule: bool = False) -> float | None:
  """`value` as a float, or None when it is traced (inside `inject_hyperparams`).

  ``schedule``: the argument may also be a schedule (the error says so).
  """
  if isinstance(value, jax.core.Tracer):
    return None
  if np.iscomplexobj(value):
    raise TypeError(
        f'{name} must be real, got the complex {value!r}. optax.inject_hyperparams casts '
        "hyperparameters to complex params' dtype: pass it hyperparam_dtype=jnp.float32"
    )
  if not is_number(value):
    if schedule:
      raise TypeError(
          f'{name} must be a number or a schedule (a function of the step count), '
          f'got {type(value).__name__} {value!r}: pass a float, or a function of the step count'
      )
    got = 'a function' if callable(value) else f'{type(value).__name__} {value!r}'
    raise TypeError(f'{name} must be a number, got {got}: it is not scheduled; pass one float')
  if np.ndim(value) != 0:
    raise ValueError(
        f'{name} must be a scalar, got an array of shape {np.shape(value)}: pass one number, '
        'or a schedule that returns one'
    )
  return float(value)


def _as_computed(v: float) -> list[tuple[float, str]]:
  """``v``, and its float32 rounding if another: each with how an error shows it.

  The gates and the engine compute in float32, where ``1 - 1e-9`` is 1 and
  ``1e-50`` is 0: a constant is checked as they will read it too.
  """
  with np.errstate(over='ignore'):
    v32 = float(np.float32(v))
  if v32 == v or math.isnan(v):
    return [(v, str(v))]
  return [(v, str(v)), (v32, f'{v} ({v32} in float32)')]


def check_schedule(name: str, schedule: Any, *, allow_bool: bool = True) -> None:
  """Raises unless ``schedule`` maps a traced int32 step count to a scalar.

  A bool scalar passes with ``allow_bool`` only. Traces it once
  (``jax.eval_shape``, no computation), so that a schedule that cannot run
  under ``jax.jit`` fails here, with the fix, rather than at the first update.
  """
  try:
    out = jax.eval_shape(schedule, jax.ShapeDtypeStruct((), jnp.int32))
  except Exception as e:  # any failure here would recur, less clearly, in update
    raise TypeError(
        f'{name}: the schedule fails on a traced step count ({type(e).__name__}: {e}). '
        'Schedules run under jax.jit: use jnp functions, and jnp.where instead of '
        'if/else on the step count'
    ) from e
  shape = getattr(out, 'shape', None)
  dtype = getattr(out, 'dtype', None)
  if shape != () or not (jnp.issubdtype(dtype, jnp.number) or (allow_bool and dtype == jnp.bool_)):
    raise ValueError(
        f'{name}: the schedule must return a numeric scalar, got '
        f'{out if shape is None else f"shape {shape} of {dtype}"}: make it return one number '
        'per step count'
    )


def check_scalar_or_schedule(
    name: str, value: Any, *, positive: bool = False, finite: bool = False
) -> None:
  """Raises if a constant hyperparameter is NaN, negative (or zero if `positive`, inf if `finite`).

  A schedule must run on a traced step count and return a scalar.
  """
  if isinstance(value, type | np.dtype):  # callable, but no schedule: t -> dtype(t)
    raise TypeError(f'{name} must be a number or a schedule, got the dtype {value!r}')
  if callable(value):
    check_schedule(name, value, allow_bool=False)  # True would be 1.0
    return
  v = concrete_float(name, value, schedule=True)
  for x, shown in [] if v is None else _as_computed(v):
    if math.isnan(x) or x < 0 or (positive and x == 0) or (finite and math.isinf(x)):
      bound = '> 0' if positive else '>= 0'
      raise ValueError(f"{name} must be {'finite and ' if finite else ''}{bound}, got {shown}")


def check_positive(name: str, value: Any, *, finite: bool = False) -> None:
  """Raises unless a constant ``value`` is > 0 (not NaN, and not inf if ``finite``).

  Traced values pass.
  """
  v = concrete_float(name, value)
  for x, shown in [] if v is None else _as_computed(v):
    if not (x > 0.0 and (not finite or x < math.inf)):
      raise ValueError(f"{name} must be {'finite and ' if finite else ''}> 0, got {shown}")


def check_unit_interval(name: str, value: Any) -> None:
  """Raises unless a constant ``value`` lies in [0, 1); traced values pass."""
  v = concrete_float(name, value)
  for x, shown in [] if v is None else _as_computed(v):
    if not 0.0 <= x < 1.0:
      raise ValueError(f'{name} must be in [0, 1), got {shown}')


def check_positive_int(name: str, value: Any, fix: str = '') -> None:
  """Raises unless `value` is an int32 integer >= 1; a traced value passes unchecked.

  ``fix`` is added to the message (e.g. "or None for no limit").
  """
  if isinstance(value, jax.core.Tracer):
    return
  want = f'pass an integer {name} >= 1{fix}'
  if isinstance(value, bool) or not (
      isinstance(value, numbers.Integral)
      or (
          isinstance(value, np.ndarray | jax.Array)
          and np.issubdtype(value.dtype, np.integer)
          and np.ndim(value) == 0
      )
  ):
    raise TypeError(f'{name} must be an integer, got {type(value).__name__} {value!r}: {want}')
  if value < 1:
    raise ValueError(f'{name} must be >= 1, got {value}: {want}')
  if value > INT32_MAX:
    raise ValueError(
        f'{name} must be below 2**31 (it is kept as an int32), got {value}: pass at most '
        f'{INT32_MAX}{fix}'
    )


def is_variable(x: Any) -> bool:
  """Whether ``x`` is a Flax NNX Variable, in which ``nnx.Optimizer.opt_state`` keeps its leaves."""
  return hasattr(x, 'get_value') and not isinstance(x, jax.Array)


def check_count(name: str, value: Any, *, int32: bool = False) -> None:
  """Raises unless ``value`` is an integer >= 0 (NumPy's too), e.g. a number of microbatches.

  With ``int32``, also unless it is below 2**31: it is compared with an int32 count.
  """
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
    # int(x) mends the type of a 0-d integer array, not a negative value or a float.
    array = not isinstance(value, numbers.Integral) and hasattr(value, 'dtype')
    array = array and np.ndim(value) == 0 and np.issubdtype(value.dtype, np.integer)
    hint = ': pass int(x)' if array and value >= 0 else ''
    raise ValueError(f'{name} must be an int >= 0, got {value!r}{hint}')
  if int32 and value > INT32_MAX:
    raise ValueError(f'{name} must be below 2**31, the int32 microbatch count, got {value}')


def check_transformation(name: str, value: Any) -> None:
  """Raises unless ``value`` is an optax transformation (it has ``init`` and ``update``)."""
  if hasattr(value, 'init') and hasattr(value, 'update'):
    return
  if callable(value):
    raise TypeError(
        f'{name} must be an optax transformation, got the function '
        f'{getattr(value, "__name__", value)!r}: call it with its hyperparameters, e.g. '
        f'{name}=optax.adamw(1e-3) rather than {name}=optax.adamw'
    )
  raise TypeError(
      f'{name} must be an optax transformation such as optax.adamw(1e-3), '
      f'got {type(value).__name__}'
  )


def check_bool(name: str, value: Any) -> None:
  if not isinstance(value, bool | np.bool_):
    raise TypeError(f'{name} must be True or False, got {type(value).__name__} {value!r}')


def check_float_dtype(name: str, value: Any) -> None:
  """Raises unless ``value`` is None or names a floating-point or complex dtype."""
  if value is None:
    return
  if isinstance(value, jax.Array):
    raise TypeError(f'{name} must be a dtype, got an array: {INJECTED_FUNCTION.format(name=name)}')
  try:
    dtype = jnp.dtype(value)
  except TypeError as e:
    raise TypeError(f'{name} must be a dtype such as jnp.float32, or None, got {value!r}') from e
  if not jnp.issubdtype(dtype, jnp.inexact):
    raise ValueError(
        f'{name} must be a floating-point (or complex) dtype, got {dtype}: an integer one '
        'would truncate (an accumulator, the mean; a hyperparameter, its value). Pass '
        f'{name}=jnp.float32, or None'
    )


def check_draws_reach_batch(
    logical_batch_size: Any, microbatch_size: int, max_draws: Any, name: str = 'logical_batch_size'
) -> None:
  """Raises if ``max_draws`` would force every step before a constant batch is reached.

  Schedules and traced values pass: their largest value is not known here. An
  infinite batch is the gate's to refuse (``gates.batch_size_at_least``).
  """
  if callable(logical_batch_size):
    return
  size = concrete_float(name, logical_batch_size)
  if max_draws is None or size is None:
    return
  if isinstance(max_draws, jax.core.Tracer) or isinstance(microbatch_size, jax.core.Tracer):
    return
  needed = math.ceil(size / microbatch_size)
  if max_draws < needed:
    raise ValueError(
        f'max_draws ({max_draws}) is below the {needed} microbatches of {microbatch_size} '
        f'examples that {name} ({size:g}) needs: every step would be forced by max_draws. '
        f'Pass max_draws >= {needed}, or max_draws=None for no limit'
    )


def is_zero(value: Any) -> bool:
  """Whether ``value``, a Python or NumPy number, is 0 in float32 (the gates' precision).

  A JAX array is left out: ``optax.inject_hyperparams`` builds the
  transformation at ``init`` from a schedule's first value, which may be 0.
  """
  if isinstance(value, jax.Array) or not is_number(value) or np.ndim(value) != 0:
    return False
  return np.float32(value) == 0


def check_gate_can_open(who: str, max_draws: Any, **bounds: Any) -> None:
  """Raises if bounds of 0 with no ``max_draws`` would keep the gate closed for good.

  Such a gate opens on a mean gradient (or a spread) of exactly 0 alone. It
  opens otherwise if any of ``bounds`` is above 0, a schedule or a JAX array;
  a number that float32 rounds to 0 (``1e-50``) counts as 0.
  """
  if max_draws is not None or not all(is_zero(v) for v in bounds.values()):
    return
  zeros = [
      f'{k}=0' if float(v) == 0 else f'{k}={float(v)!r} (0 in float32)' for k, v in bounds.items()
  ]
  raise ValueError(
      f"{who}: {' and '.join(zeros)} with max_draws=None: the gate would open only where the "
      'measure is exactly 0, so the run would stop stepping where it is not. Give '
      f"{' or '.join(bounds)} > 0, or a max_draws that forces a step"
  )


def check_takes_one_argument(name: str, fn: Any, what: str, fix: str) -> None:
  """Raises if ``fn``'s signature cannot bind one positional argument, ``what``.

  A callable with no signature to read (some builtins) passes: its first trace tells.
  """
  try:
    inspect.signature(fn).bind(None)
  except ValueError:
    return
  except TypeError as e:
    raise TypeError(f'{name} must take one argument, {what}: {e}: {fix}') from e


def check_no_positional_loss(loss: tuple[Any, ...], who: str) -> None:
  """Raises if ``update`` was given a fourth positional argument: torch's ``step(loss)``."""
  if loss:
    raise TypeError(
        f"{who} takes the loss as a keyword, value=loss (an extra argument of Optax's "
        f'update), not by position: got {len(loss)} more positional argument(s) after the params'
    )


def check_decision(step: Any, who: str) -> None:
  """Raises at trace time unless ``step`` is a boolean scalar, as a gate's decision must be."""
  if jnp.shape(step) != () or jnp.result_type(step) != jnp.bool_:
    raise TypeError(
        f"{who} must return a boolean scalar as the gate's decision, got "
        f'{jnp.result_type(step)} of shape {jnp.shape(step)}: compare, e.g. '
        'stats.acc_norm <= 0.5 (and reduce an array with jnp.all or jnp.any)'
    )


def check_accumulator_dtype(dtype: Any) -> None:
  """Raises unless ``dtype`` is None or a float dtype with at least float32's range."""
  check_float_dtype('accumulator_dtype', dtype)
  # Python's float and complex are JAX's default dtypes, float32 without x64: not refused.
  explicit = dtype is not None and dtype not in (float, complex)
  if explicit and jnp.dtype(dtype) != jax.dtypes.canonicalize_dtype(dtype):
    raise ValueError(
        f'accumulator_dtype {jnp.dtype(dtype)} needs 64-bit JAX, which is off: JAX would make '
        f'{jax.dtypes.canonicalize_dtype(dtype)} arrays. Turn it on first, '
        "jax.config.update('jax_enable_x64', True), or pass accumulator_dtype=None"
    )
  if dtype is not None and jnp.finfo(dtype).maxexp < jnp.finfo(jnp.float32).maxexp:
    # float16 overflows a running sum of ordinary gradients (its largest value
    # is 65504); bfloat16 has float32's range.
    raise ValueError(
        f'accumulator_dtype {jnp.dtype(dtype)} is too narrow for a running sum: '
        f'its largest value is {float(jnp.finfo(dtype).max):g}, so a sum of finite '
        'gradients overflows to inf and the parameters are lost. Pass '
        "accumulator_dtype=None (float32), or jnp.bfloat16 (float32's range, but 8 "
        'significant bits: for accumulations of a few tens of microbatches)'
    )
  if dtype is not None and jnp.finfo(dtype).nmant < jnp.finfo(jnp.bfloat16).nmant:
    raise ValueError(  # float8_e8m0fnu: float32's range, but powers of two alone, and no sign
        f'accumulator_dtype {jnp.dtype(dtype)} has {jnp.finfo(dtype).nmant} mantissa bits, too '
        'few to hold a sum of gradients. Pass accumulator_dtype=None (float32)'
    )


def check_not_torch(where: str, x: Any) -> None:
  """Raises if ``x`` is a torch tensor, which JAX reads no dtype of."""
  if type(x).__module__.split('.')[0] == 'torch':
    raise TypeError(
        f'{where} is a torch tensor: convert it first, with optax_gqc.interop.torch.to_jax '
        '(jax.tree.map(to_jax, tree) for a tree), or params_to_jax(module) and '
        "grads_to_jax(module) for a module's"
    )


def check_inexact(where: str, g: Any, truncated: str) -> None:
  """Raises unless the gradient ``g`` is floating point or complex (else ``truncated`` would be)."""
  check_not_torch(where, g)
  if g.dtype == jax.dtypes.float0:
    raise TypeError(
        f'{where} is float0, the gradient jax.grad(..., allow_int=True) gives an integer leaf: '
        'leave integer leaves out of the tree that jax.grad differentiates and the optimizer '
        'updates (split them off the params first)'
    )
  if not jnp.issubdtype(g.dtype, jnp.inexact):
    raise TypeError(
        f'{where} has dtype {g.dtype}: gradients must be floating point or complex ({truncated} '
        'would be truncated). Cast it to a float, or keep integer leaves out of the optimizer '
        '(optax.partition, optax.set_to_zero)'
    )


def check_params_like_init(params: Any, accumulator: Any) -> None:
  """Raises at trace time if ``params`` have the tree of those ``init`` was given, other shapes.

  The accumulator mirrors the params given to ``init``. Another tree may be
  the inner optimizer's (``optax.lookahead`` takes its fast and slow params).
  """
  if params is None or jax.tree.structure(params) != jax.tree.structure(accumulator):
    return
  paths = jax.tree_util.tree_leaves_with_path(params)
  for (path, p), a in zip(paths, jax.tree.leaves(accumulator), strict=True):
    if jnp.shape(p) != a.shape:
      raise ValueError(
          f'accumulate: param {jax.tree_util.keystr(path)} has shape {jnp.shape(p)}, but the '
          f'params given to init had {a.shape}: pass the params that tx.init(params) was given'
      )


def check_params_take_updates(params: Any, updates: Any) -> None:
  """Raises at trace time if the fused step's params cannot take the inner update.

  An inner optimizer whose state ignores the params (``optax.sgd``) lets
  params unlike init's reach ``optax.apply_updates``, whose error names no param.
  """
  if jax.tree.structure(params) == jax.tree.structure(updates):
    return
  keys = {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(params)}
  want = {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(updates)}
  missing, extra = sorted(want - keys), sorted(keys - want)
  raise ValueError(
      'update_and_apply: the params do not match the inner update'
      + (f'; missing {", ".join(missing)}' if missing else '')
      + (f'; not updated {", ".join(extra)}' if extra else '')
      + f': {jax.tree.structure(params)} vs {jax.tree.structure(updates)}. Pass the params '
      'that tx.init(params) was given'
  )


def check_like_params(updates: Any, accumulator: Any) -> None:
  """Raises at trace time if the gradients do not match the params from init."""
  if jax.tree.structure(updates) != jax.tree.structure(accumulator):
    empty = not jax.tree.leaves(updates) and jax.tree.leaves(accumulator)
    raise ValueError(
        'accumulate: the gradient tree does not match the params given to init: '
        f'{jax.tree.structure(updates)} vs {jax.tree.structure(accumulator)}. Pass gradients '
        'of those params (jax.grad of the loss with respect to them)'
        + (
            '. It holds no arrays: with Flax NNX, pass the State that nnx.grad or nnx.split '
            "gives, whose Variables the optimizer's wrt filter selects (a pure dict, "
            'nnx.as_pure or nnx.to_pure_dict, has none)'
            if empty
            else ''
        )
        + (
            '. With optax.lookahead inside, init the accumulation with the fast params, '
            'tx.init(params.fast), and pass the LookaheadParams to update; or put the '
            'accumulation inside lookahead: optax.lookahead(optax_gqc.sbc(...), ...)'
            if isinstance(accumulator, optax.LookaheadParams)
            else ''
        )
    )
  for path, g, a in zip(
      jax.tree_util.tree_leaves_with_path(updates),
      jax.tree.leaves(updates),
      jax.tree.leaves(accumulator),
      strict=True,
  ):
    key = jax.tree_util.keystr(path[0])
    where = f'accumulate: gradient {key}' if key else 'accumulate: the gradient'
    if not (hasattr(g, 'shape') and hasattr(g, 'dtype')):
      raise TypeError(
          f'{where} is a {type(g).__name__} ({g!r}), not an array: pass arrays, as jax.grad '
          'returns them (jnp.asarray(x) of a number)'
      )
    if g.shape != a.shape:
      raise ValueError(
          f'{where} has shape {g.shape}, but the params given to init had {a.shape}: pass '
          'gradients of those params'
      )
    check_inexact(where, g, 'an integer mean')
    if jnp.iscomplexobj(g) and not jnp.iscomplexobj(a):
      raise TypeError(
          f'{where} is complex ({g.dtype}), but the params given to init were real: '
          'initialize with the complex params'
      )


def check_gate_output(output: Any, old_state: Any) -> tuple[Any, Any]:
  """``(step, new_state)`` of a gate's update; raises at trace time if it breaks the protocol.

  A float entry may come back in another float dtype (a float64
  hyperparameter under x64 promotes it), as an integer in another integer
  dtype: the engine casts it back.
  """
  if not (isinstance(output, tuple | list) and len(output) == 2) or isinstance(
      output[0], dict | tuple | list
  ):
    raise TypeError(
        'gate: update must return a pair (decision, state), the decision first: a boolean '
        f"scalar and a state like gate.init()'s, got {type(output).__name__} "
        f'{jax.tree.map(jnp.shape, output)!r:.120}'
    )
  step, new_state = output
  check_decision(step, 'gate: update')

  def kind(x):
    dtype = jnp.result_type(x)
    return next((k for k in (jnp.floating, jnp.integer) if jnp.issubdtype(dtype, k)), dtype)

  def describe(x):
    return f'{jnp.result_type(x)}{list(jnp.shape(x))}'

  fix = 'keep the entries of gate.init(), and cast new values to their dtypes'
  if jax.tree.structure(new_state) != jax.tree.structure(old_state):
    raise TypeError(
        'gate: update must return a state with the structure of gate.init(): '
        f'{jax.tree.structure(old_state)}, got {jax.tree.structure(new_state)}; {fix}'
    )
  paths = jax.tree_util.tree_leaves_with_path(old_state)
  for (path, old), new in zip(paths, jax.tree.leaves(new_state), strict=True):
    if kind(new) != kind(old) or jnp.shape(new) != jnp.shape(old):
      raise TypeError(
          f'gate: update returned the state entry {jax.tree_util.keystr(path)} as '
          f'{describe(new)}, where gate.init() has {describe(old)}; {fix}'
      )
  return step, new_state


def global_sq_norm(updates: Any, axis_name: Any) -> jax.Array:
  """The gradient's squared norm (``sq_norm``), with an error that names ``axis_name``."""
  try:
    return sq_norm(updates, axis_name)
  except NameError as e:  # JAX's message names axis_index, which the user never called
    raise NameError(
        f'accumulate: axis_name {axis_name!r} is not a mapped axis here ({e}). It names the '
        'axes of jax.shard_map over which the parameters are sharded; under jax.jit with '
        'sharded arrays the norms are global already: leave axis_name None'
    ) from e


def check_global_decision(grad_sq: jax.Array, step: jax.Array, axis_name: Any = None) -> None:
  """Raises at trace time if, inside ``jax.shard_map``, devices could decide apart.

  JAX tracks which values vary across the mapped axes (``check_vma=True``, the
  default); the decision to step must not.
  """
  axes = sorted(varying_axes(grad_sq))
  if axes:
    every = (*axis_names(axis_name), *axes)  # the axes summed already, and those still varying
    name = repr(every[0]) if len(every) == 1 else repr(every)
    raise ValueError(
        f'accumulate: the gradient norm varies across the mapped axes {axes}, so '
        'devices would step at different microbatches. If the parameters are '
        f'sharded across them (FSDP), pass axis_name={name}; if each device holds '
        'whole gradients of its own data, average them across the data axes first '
        '(jax.lax.pmean); if each device trains a model of its own (an ensemble), '
        'pass check_vma=False to shard_map'
    )
  axes = varying_axes(step)
  if axes:
    raise ValueError(
        f"accumulate: the gate's decision varies across the mapped axes {sorted(axes)}: "
        'an extra argument it reads (such as value=loss) differs between devices; '
        'average it across those axes first (jax.lax.pmean)'
    )
