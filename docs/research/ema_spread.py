"""How far the engine's noise-scale reading strays late in a run, at the default decay.

    python docs/research/ema_spread.py D N [--noise-scale B] [--microbatches T]

A fixed accumulation of N microbatches (``sbc``) on Gaussian gradients in D
dimensions, with |G|^2 = 1 and isotropic noise of trace B per microbatch, so
B_simple = B microbatches. Prints the median of the readings after the first
1,000 steps (ten time constants of the 0.99 EMA), the share that read
infinite, and the shares above twice and below half the truth.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_gqc


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('d', type=int)
  parser.add_argument('n', type=int)
  parser.add_argument('--noise-scale', type=float, default=32.0)
  parser.add_argument('--microbatches', type=int, default=20_000)
  args = parser.parse_args()
  d, n, b = args.d, args.n, args.noise_scale
  tx = optax_gqc.sbc(optax.sgd(0.0), n, 1)
  params = {'w': jnp.zeros(d)}
  signal = jnp.zeros(d).at[0].set(1.0)

  def body(state, key):
    grads = {'w': signal + jnp.sqrt(b / d) * jax.random.normal(key, (d,))}
    _, state = tx.update(grads, state, params)
    return state, optax_gqc.statistics(state)['noise_scale']

  keys = jax.random.split(jax.random.key(0), args.microbatches)
  _, readings = jax.jit(lambda s: jax.lax.scan(body, s, keys))(tx.init(params))
  late = np.asarray(readings)[1000 * n :]
  print(
      f'd={d} n={n} B={b:g}: median {np.median(late):.1f}, infinite {np.mean(np.isinf(late)):.1%}, '
      f'above 2B {np.mean(late > 2 * b):.1%}, below B/2 {np.mean(late < b / 2):.1%}'
  )


if __name__ == '__main__':
  main()
