"""The bare cond's step as a while loop, and with one squared norm used in several ways.

A record of the measurements behind docs/benchmarks.md ("The floor at 128
leaves"), not a benchmark: none of these steps is a usable optimizer. Each
starts from ``benchmarks/compile.py``'s bare cond (adamw in a ``lax.cond``
with a running sum and a count, stepping every 8 microbatches) and changes
one thing (every step keeps a float32 scalar in its state besides, read by
nothing, where the norm goes): the cond written as a ``lax.while_loop`` of
at most one trip, or one squared norm per leaf taken and kept in the state,
or stepped on. Each is compiled fresh and interleaved in rounds with
adamw's; the table gives the median trace + compile time of ``--rounds``
(after one untimed round) and its ratio to adamw's. Run from the repository root:

    python docs/compile/floor.py [--leaves 8 32 128] [--rounds 5]
"""

import argparse
import functools
import pathlib
import sys

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import minimal  # noqa: E402  (docs/compile/minimal.py)

from optax_gqc._numerics import kept_cond, sq_norm  # noqa: E402


def _chain(tree) -> jax.Array:
  """The squared norm as a chain of per-leaf sums, as ``optax.tree.norm`` takes it."""
  return sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree))


def floor(loop: str = 'cond', norm: str | None = None) -> optax.GradientTransformation:
  """The bare cond around adamw, with ``loop`` in place of the cond and ``norm`` used.

  ``loop``: ``'cond'``, or ``'while'`` for a ``lax.while_loop`` whose body runs
  once on a step and not otherwise. ``norm``: ``None``; ``'state'``, the new
  sum's squared norm kept in the state and read by nothing; ``'step'``, also
  stepping when it is below a threshold; ``'step_grad'``, the same on the
  gradient's; ``'step_chain'``, on the new sum's as a chain of scalar adds;
  ``'step_barrier'``, on the new sum's through ``lax.optimization_barrier``.
  """
  inner = optax.adamw(1e-3)
  norms = {
      'state': lambda acc, g: sq_norm(acc),
      'step': lambda acc, g: sq_norm(acc),
      'step_grad': lambda acc, g: sq_norm(g),
      'step_chain': lambda acc, g: _chain(acc),
      'step_barrier': lambda acc, g: jax.lax.optimization_barrier(sq_norm(acc)),
  }

  def init(params):
    zero = jnp.zeros([], jnp.float32)
    return jnp.zeros([], jnp.int32), optax.tree.zeros_like(params), inner.init(params), zero

  def update(grads, state, params=None):
    count, acc, inner_state, kept = state
    acc = jax.tree.map(lambda a, g: jnp.where(count == 0, g, a + g), acc, grads)
    n = count + 1
    step = n >= 8
    if norm is not None:
      kept = norms[norm](acc, grads)
      if norm != 'state':
        step |= kept <= 0.01

    def do_step(acc, inner_state, params):
      updates, inner_state = inner.update(jax.tree.map(lambda a: a / n, acc), inner_state, params)
      return updates, inner_state, kept_cond(jnp.asarray(True))

    def do_accumulate(acc, inner_state, params):
      return optax.tree.zeros_like(acc), inner_state, jnp.asarray(False)

    if loop == 'cond':  # as bench.cond_floor: the buffers are the cond's operands
      updates, inner_state, stepped = jax.lax.cond(
          step, do_step, do_accumulate, acc, inner_state, params
      )
    else:
      _, updates, inner_state, stepped = jax.lax.while_loop(
          lambda carry: carry[0],
          lambda carry: (jnp.asarray(False), *do_step(acc, carry[2], params)),
          (step, *do_accumulate(acc, inner_state, params)),
      )
    return updates, (jnp.where(stepped, 0, n), acc, inner_state, kept)

  return optax.GradientTransformation(init, update)


CANDIDATES = {
    'optax.adamw': lambda: optax.adamw(1e-3),
    'adamw in a bare cond, every 8': floor,
    'the same, a while loop of at most one trip': functools.partial(floor, 'while'),
    "+ the new sum's squared norm, in the state only": functools.partial(floor, norm='state'),
    '+ the same, stepped on': functools.partial(floor, norm='step'),
    "+ the gradient's, stepped on": functools.partial(floor, norm='step_grad'),
    "+ the new sum's as a chain of adds, stepped on": functools.partial(floor, norm='step_chain'),
    "+ the new sum's behind a barrier, stepped on": functools.partial(floor, norm='step_barrier'),
}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--leaves', type=int, nargs='+', default=[8, 32, 128])
  parser.add_argument('--rounds', type=int, default=5)
  args = parser.parse_args(argv)
  minimal.table(
      {name: (make, False) for name, make in CANDIDATES.items()}, args.leaves, args.rounds
  )


if __name__ == '__main__':
  main()
