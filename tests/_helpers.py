"""Helpers shared by the test modules: microbatch gradient streams and a jitted run over them."""

import jax
import jax.numpy as jnp
import optax

PARAMS = {'w': jnp.arange(12.0).reshape(3, 4) / 10, 'b': jnp.ones(4)}


def grad_stream(num, seed=0, scale=1.0, params=PARAMS):
  """Random microbatch gradients shaped like ``params``."""
  keys = jax.random.split(jax.random.key(seed), num)
  # Indexed: iterating over a key array compiles an unstack program per length.
  return [
      jax.tree.map(lambda p, k=keys[i]: scale * jax.random.normal(k, p.shape, p.dtype), params)
      for i in range(num)
  ]


def run(tx, grads, params=PARAMS, apply=True, **extra_args):
  """Runs ``tx`` under jit over ``grads``; returns per-call updates, states, params."""
  update = jax.jit(tx.update)
  state = tx.init(params)
  out = []
  for g in grads:
    updates, state = update(g, state, params, **extra_args)
    if apply:
      params = optax.apply_updates(params, updates)
    out.append((updates, state, params))
  return out
