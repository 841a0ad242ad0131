"""How often the default gnts reads an infinite noise scale after its bootstrap.

    python docs/research/bootstrap_inf.py D GMEAN [--grow] [--bootstrap-steps N]

Gaussian microbatch gradients ``GMEAN + N(0, I)`` in ``D`` dimensions: the
noise scale is ``1 / GMEAN**2`` microbatches, the default gate aims at half of
it. 32 seeds of 3,000 microbatches each, through ``gnts(optax.sgd(0.0))`` (the
parameters do not move, so the noise scale stays put). Prints how many seeds
read B = inf (an estimate of ``|G|^2 <= 0``) just after the five bootstrap
steps of two microbatches, how many microbatches those take to read a finite B
again, and the steps each group took. ``--grow`` wraps the gate so that while
B reads inf after the bootstrap the batch doubles at each step (from two
microbatches, up to ``max_draws``) in place of jumping to ``max_draws``.
``--bootstrap-steps N`` gives the gate a bootstrap of N steps in place of 5
(``accumulate`` with ``gates.critical_batch(..., bootstrap_steps=N)``).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_gqc
from optax_gqc import gates


def growing(gate: gates.Gate, bootstrap_steps: int) -> gates.Gate:
  """``gate``, except that while the noise scale reads inf the batch doubles at each step."""

  def init():
    return {**gate.init(), '_grown': jnp.ones([], jnp.float32)}

  def update(stats, state, **extra_args):
    inner = {k: v for k, v in state.items() if k != '_grown'}
    step, inner = gate.update(stats, inner, **extra_args)
    grown = jnp.where(stats.num_draws == 1, 2.0 * state['_grown'], state['_grown'])
    swamped = jnp.isinf(stats.noise_scale) & (inner['_estimates'] >= bootstrap_steps)
    step = jnp.where(swamped, stats.num_draws >= grown, step)
    return step, {**inner, '_grown': jnp.where(swamped, grown, 1.0)}

  return gates.Gate(init, update, gate.microbatch_size)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('d', type=int, help='dimensions of the gradient')
  parser.add_argument('gmean', type=float, help='each entry of the true gradient')
  parser.add_argument('--grow', action='store_true', help='double the batch while B reads inf')
  parser.add_argument(
      '--bootstrap-steps', type=int, default=5, help="the gate's bootstrap steps (default: 5)"
  )
  args = parser.parse_args(argv)
  count, seeds = 3000, 32
  default = optax_gqc.gnts(optax.sgd(0.0))  # its gate: critical_batch(0.5, 1, min 2 microbatches)
  gate = gates.critical_batch(0.5, 1, min_batch_size=2, bootstrap_steps=args.bootstrap_steps)
  gate = gate._replace(microbatch_size=None)  # as gnts gives it
  if args.grow:
    gate = growing(gate, args.bootstrap_steps)
  tx = optax_gqc.accumulate(optax.sgd(0.0), gate, scale_by_draws=jnp.sqrt)
  if not args.grow and args.bootstrap_steps == 5:
    tx = default
  params = {'w': jnp.zeros(args.d)}

  def one(key):
    def body(state, k):
      _, state = tx.update({'w': args.gmean + jax.random.normal(k, (args.d,))}, state, params)
      b = optax_gqc.statistics(state)['noise_scale']
      return state, (jnp.isinf(b), state.num_steps)

    _, out = jax.lax.scan(body, tx.init(params), jax.random.split(key, count))
    return out

  keys = jax.random.split(jax.random.key(0), seeds)
  inf, steps = map(np.asarray, jax.jit(jax.vmap(one))(keys))
  end = 2 * args.bootstrap_steps  # the microbatch after the bootstrap's steps of two
  after = inf[:, end]
  back = [int(np.argmax(~r[end:])) + end if (~r[end:]).any() else count for r in inf[after]]
  print(
      f'd={args.d}, B={1 / args.gmean**2:.1f} microbatches, grow={args.grow}, '
      f'bootstrap_steps={args.bootstrap_steps}: '
      f'{after.sum()}/{seeds} seeds read inf after the bootstrap; microbatches until B is '
      f'finite again {sorted(back)}; steps in {count}: those seeds median '
      f'{np.median(steps[after, -1]) if after.any() else "-"}, the others '
      f'{np.median(steps[~after, -1])}'
  )


if __name__ == '__main__':
  main()
