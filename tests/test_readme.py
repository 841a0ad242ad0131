"""The README's Example is the code a new user copies: it must run, and train."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / 'README.md'


def _example_code():
  section = README.read_text().split('## Example', 1)[1]
  return re.search(r'```python\n(.*?)```', section, re.DOTALL).group(1)


@pytest.mark.slow
def test_readme_example_trains_a_model_whose_gradient_norms_are_large():
  kx, kw, ke, kp = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(kx, (2048, 16))
  y = 10.0 * (jnp.tanh(x @ jax.random.normal(kw, (16,))) + 0.3 * jax.random.normal(ke, (2048,)))

  def loss_fn(params, batch):
    xb, yb = batch
    return jnp.mean((jnp.tanh(xb @ params['w1']) @ params['w2'] - yb) ** 2)

  k1, k2 = jax.random.split(kp)
  params = {'w1': jax.random.normal(k1, (16, 64)) / 4, 'w2': jax.random.normal(k2, (64,)) / 8}
  start = loss_fn(params, (x, y))
  namespace = {'params': params, 'loss_fn': loss_fn, 'batch': (x[:16], y[:16])}
  exec(_example_code(), namespace)  # the README's lines, as they are

  train_step, state, params = namespace['train_step'], namespace['state'], namespace['params']
  # Sliced on the host: a jax slice of each new offset would compile a program of its own.
  x, y = np.asarray(x), np.asarray(y)
  for i in range(1, 300):
    batch = (x[16 * i % 2048 :][:16], y[16 * i % 2048 :][:16])
    params, state = train_step(params, state, batch)
  stats = namespace['optax_gqc'].statistics(state)
  assert loss_fn(params, (x, y)) < 0.4 * start
  assert 300 / 16 < int(stats['num_steps']) < 300 and int(stats['num_forced']) == 0
