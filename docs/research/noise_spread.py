"""How far the default gnts's noise scale strays from the truth on Gaussian gradients.

    python docs/research/noise_spread.py D GMEAN

As ``bootstrap_inf.py``: microbatch gradients ``GMEAN + N(0, I)`` in ``D``
dimensions (a noise scale of ``1 / GMEAN**2`` microbatches), 32 seeds of 3,000
microbatches through ``gnts(optax.sgd(0.0))``. Prints, after 201, 1,001 and
3,000 microbatches, how many seeds read a finite noise scale and the median
and quartiles of those readings, then the median optimizer steps.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_gqc


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('d', type=int, help='dimensions of the gradient')
  parser.add_argument('gmean', type=float, help='each entry of the true gradient')
  args = parser.parse_args(argv)
  tx = optax_gqc.gnts(optax.sgd(0.0))
  params = {'w': jnp.zeros(args.d)}

  def one(key):
    def body(state, k):
      _, state = tx.update({'w': args.gmean + jax.random.normal(k, (args.d,))}, state, params)
      return state, optax_gqc.statistics(state)['noise_scale']

    state, b = jax.lax.scan(body, tx.init(params), jax.random.split(key, 3000))
    return b, state.num_steps

  b, steps = map(np.asarray, jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(1), 32)))
  print(f'd={args.d}, B={1 / args.gmean**2:.1f} microbatches')
  for t in (200, 1000, 2999):
    x = b[:, t][np.isfinite(b[:, t])]
    low, mid, high = np.percentile(x, [25, 50, 75])
    print(f'  after {t + 1}: {x.size}/32 finite, median {mid:.1f}, quartiles {low:.1f}-{high:.1f}')
  print(f'  optimizer steps: median {np.median(steps):.0f}')


if __name__ == '__main__':
  main()
