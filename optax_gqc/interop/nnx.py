"""Flax NNX: the fused update-and-apply for an ``nnx.Optimizer``.

``optimizer.update(model, grads)`` runs ``tx.update`` and then
``optax.apply_updates``: the Optax path, which writes a zero update and adds
it to the parameters on every microbatch that only accumulates.
:func:`update` takes the same arguments and leaves the model and the
optimizer as ``optimizer.update`` does, bit for bit (a ``-0.0`` parameter
aside, see docs/fused.md), through
:func:`optax_gqc.update_and_apply`, whose ``lax.cond`` returns the new
parameters.

Needs Flax (``pip install flax``), with the ``nnx.Optimizer(model, tx,
wrt=...)`` API of Flax 0.12 and later.
"""

from typing import Any

try:
  from flax import nnx
except ImportError as e:
  raise ImportError(
      'optax_gqc.interop.nnx needs Flax NNX; install it with: pip install flax'
  ) from e

from optax_gqc import _checks
from optax_gqc._accumulation import update_and_apply

__all__ = ['update']


def update(
    optimizer: nnx.Optimizer, model: nnx.Module, grads: Any, /, *loss: Any, **extra_args: Any
) -> None:
  """``optimizer.update(model, grads)``, with the update fused into the apply.

  Reads the parameters that ``optimizer`` tracks (its ``wrt`` filter) from
  ``model`` and the gradients from ``grads``, runs
  :func:`optax_gqc.update_and_apply` with ``optimizer.tx`` on them and on
  ``optimizer.opt_state``, writes the new parameters into ``model`` and the new
  state into ``optimizer``, and advances ``optimizer.step`` by one, as
  ``nnx.Optimizer.update`` does. The model and the optimizer end up bitwise
  equal to what ``optimizer.update(model, grads)`` leaves; when ``tx`` is an
  accumulation (:func:`optax_gqc.accumulate`, :func:`optax_gqc.gnts`, a
  recipe, ...), the microbatches that only accumulate write no zero update.
  For any other ``tx`` it is ``optimizer.update``. Call it inside
  ``nnx.jit``, like ``optimizer.update``.

  Args:
    optimizer: an ``nnx.Optimizer`` built on ``model``.
    model: the model whose parameters ``optimizer`` updates.
    grads: the gradients of one microbatch, e.g. from ``nnx.grad(loss_fn)(model)``.
    *loss: nothing: a loss given by position raises a :class:`TypeError` that
      says to pass ``value=loss``.
    **extra_args: extra keyword arguments of ``tx.update`` (e.g. ``value=loss``
      for :func:`optax_gqc.mht`).

  Returns:
    None: unlike ``optimizer.update``, there are no updates to return.

  Example:
    >>> import jax.numpy as jnp, optax, optax_gqc
    >>> from flax import nnx
    >>> from optax_gqc.interop import nnx as gqc_nnx
    >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    >>> tx = optax_gqc.gnts(optax.adamw(1e-2), threshold=0.0, max_draws=2)
    >>> optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    >>> @nnx.jit
    ... def train_step(model, optimizer, x):
    ...   grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
    ...   gqc_nnx.update(optimizer, model, grads)
    >>> for _ in range(4):
    ...   train_step(model, optimizer, jnp.ones((3, 2)))
    >>> int(optimizer.step[...]), int(optax_gqc.statistics(optimizer.opt_state)['num_steps'])
    (4, 2)
  """
  _checks.check_no_positional_loss(loss, 'update')
  if not isinstance(optimizer, nnx.Optimizer):
    raise TypeError(
        f'update takes (optimizer, model, grads), as optimizer.update(model, grads) reads; '
        f'its first argument is a {type(optimizer).__name__}, not an nnx.Optimizer'
    )
  # As nnx.Optimizer.update reads and writes them (Flax 0.12); `graph` is
  # passed on only where the optimizer has one, as older Flax has none.
  graph = getattr(optimizer, 'graph', None)
  graph_kw = {} if graph is None else {'graph': graph}
  params = nnx.as_pure(nnx.state(model, optimizer.wrt, **graph_kw))
  grads = nnx.as_pure(nnx.state(grads, optimizer.wrt, **graph_kw))
  opt_state = nnx.as_pure(optimizer.opt_state)
  new_params, new_opt_state = update_and_apply(
      optimizer.tx, grads, opt_state, params, **nnx.as_pure(extra_args)
  )
  nnx.update(model, new_params)
  nnx.update(optimizer.opt_state, nnx.state(new_opt_state, **graph_kw))
  optimizer.step[...] += 1
