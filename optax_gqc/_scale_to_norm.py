"""Gradient Norm Rescaling: rescale the gradient to a target global norm."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_gqc import _checks
from optax_gqc._numerics import count_if, kept_cond, sq_norm, widened


class ScaleToNormState(NamedTuple):
  """State of :func:`scale_to_norm`."""

  count: jax.Array  # int32: updates seen, the argument of the target schedule.
  target: jax.Array  # float32: the target norm used at the latest update.
  grad_norm: jax.Array  # float32: ||g|| of the latest gradient, before rescaling.
  # int32: updates at which a scheduled target was NaN, infinite or negative
  # (their update is zero).
  num_bad_hyperparams: jax.Array


def scale_to_norm(target: optax.ScalarOrSchedule) -> optax.GradientTransformation:
  r"""Rescales the gradient to a target global norm (Gradient Norm Rescaling).

  .. math::

    g \leftarrow g \cdot \frac{\text{target}(t)}{\|g\|},

  and a zero update when :math:`\|g\| = 0`, or when a scheduled target is
  NaN, infinite or negative, which ``num_bad_hyperparams`` counts (a negative
  target would reverse the step). Chain it in front of any
  optimizer; :func:`gnr` does that. Unlike ``optax.clip_by_global_norm`` it
  also scales short gradients up.

  Optax's ``optax.normalize_by_update_norm`` is close, but takes a constant
  scale and divides by :math:`\|g\| + \epsilon`, so a gradient whose norm is
  near :math:`\epsilon` comes out short of its target. This one takes a
  schedule, divides by the norm itself (every non-zero gradient comes out at
  the target norm, and a zero gradient gives an exact zero update), and
  reports the norm and the target in its state, for logging.

  The norm and the scale are float32 (complex64), whatever the gradients'
  dtype, as the accumulation's norms are: float64 gradients come out at the
  target to float32's accuracy (about 1e-8 relative), and a float64 gradient
  whose norm is beyond float32's range (above about 3e38, or every entry
  below about 1e-45) gives a zero update, its ``grad_norm`` reading inf or 0.
  So does a gradient whose entries are all subnormal (below about 1e-38),
  which XLA on the CPU flushes to 0.

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
  _checks.check_scalar_or_schedule('target', target, finite=True)  # inf: a zero update

  def value_at(count):
    return jnp.array(target(count) if callable(target) else target, jnp.float32)

  def init_fn(params):
    del params
    count = jnp.zeros([], jnp.int32)
    zero_f, zero_i = jnp.zeros([], jnp.float32), jnp.zeros([], jnp.int32)
    return ScaleToNormState(count, value_at(count), zero_f, zero_i)

  def update_fn(updates, state, params=None):
    del params
    for path, g in jax.tree_util.tree_leaves_with_path(updates):
      where = f'scale_to_norm: update {jax.tree_util.keystr(path)}'
      _checks.check_inexact(where, g, 'a scaled integer update')
    norm = _norm(updates)
    goal = value_at(state.count)
    bad = ~(jnp.isfinite(goal) & (goal >= 0))
    scale = jnp.where((norm > 0) & ~bad, goal / jnp.where(norm > 0, norm, 1.0), 0.0)
    updates = jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates)
    num_bad = count_if(state.num_bad_hyperparams, bad)
    return updates, ScaleToNormState(optax.safe_increment(state.count), goal, norm, num_bad)

  return optax.GradientTransformation(init_fn, update_fn)


def _norm(updates: Any) -> jax.Array:
  """The global L2 norm in float32, also where its square leaves float32's range.

  The squares of entries below about 1e-19 flush to 0, and those above 1e19
  overflow: the plain norm would then be 0, short, or inf for a gradient that
  has a norm. Unless its square is far enough above float32's smallest normal
  that what flushed cannot move it (every square flushed is below that
  number), the gradient is divided by its largest modulus first, in a branch
  that runs only then (``kept_cond``: XLA keeps it a branch).
  """
  sq = sq_norm(updates)
  leaves = jax.tree.leaves(updates)
  if not leaves:
    return jnp.sqrt(sq)

  def rescaled(leaves):
    top = jnp.max(jnp.stack([jnp.max(jnp.abs(widened(x)), initial=0.0) for x in leaves]))
    ok = (top > 0) & (top < jnp.inf)  # else 0 (a zero gradient), inf or NaN, as it is
    # The norm does not depend on the scale: no derivative through it (its
    # square would underflow there).
    scale = jax.lax.stop_gradient(jnp.where(ok, top, 1.0))
    norm = scale * jnp.sqrt(sq_norm([widened(x) / scale for x in leaves]))
    return kept_cond(jnp.where(ok, norm, top))

  f32 = jnp.finfo(jnp.float32)
  size = sum(jnp.size(x) for x in leaves)
  in_range = (sq >= size * float(f32.tiny) / float(f32.eps)) & (sq < jnp.inf)
  return jax.lax.cond(in_range, lambda _: jnp.sqrt(sq), rescaled, leaves)


def report(s: ScaleToNormState) -> dict[str, jax.Array]:
  """What ``statistics`` logs; it steps on every microbatch: as many microbatches as steps."""
  return {
      'num_microbatches': s.count,
      'num_steps': s.count,
      'target': s.target,
      'grad_norm': s.grad_norm,
      'num_bad_hyperparams': s.num_bad_hyperparams,
  }
