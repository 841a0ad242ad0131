"""Checkpoint GNTS mid-accumulation with Orbax and resume: ``python examples/checkpointing.py``.

Needs orbax-checkpoint (``pip install -e ".[checkpoint]"``). The state of
an accumulation is a pytree of arrays like any Optax state: the accumulator
of the microbatches taken since the last step, the counters, the gate's
scalars, the noise-scale estimates and the inner optimizer's state. Saved
between two microbatches and restored into the same structure, the run goes
on exactly as if it had never stopped.
"""

import argparse
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

import optax_gqc


def loss_fn(params: optax.Params, x: jax.Array, y: jax.Array) -> jax.Array:
  return jnp.mean(jnp.sum((x @ params['w'] + params['b'] - y) ** 2, -1)) / 2


def make_train_step(tx: optax.GradientTransformation):
  @jax.jit
  def train_step(params, opt_state, x, y):
    grads = jax.grad(loss_fn)(params, x, y)
    return optax_gqc.update_and_apply(tx, grads, opt_state, params)

  return train_step


def main(num_microbatches: int = 40, save_at: int = 18, seed: int = 0) -> dict:
  k = jax.random.split(jax.random.key(seed), 5)
  w_star, b_star = jax.random.normal(k[0], (8, 2)), jax.random.normal(k[1], (2,))
  init_params = {'w': w_star + 0.1 * jax.random.normal(k[2], (8, 2)), 'b': b_star}
  xs = jax.random.normal(k[3], (num_microbatches, 16, 8))
  ys = xs @ w_star + b_star + jax.random.normal(k[4], (num_microbatches, 16, 2))

  def make_optimizer():
    return optax_gqc.gnts(optax.adamw(1e-2), threshold=0.6, max_draws=8)

  # The run we compare with: never interrupted.
  tx = make_optimizer()
  train_step = make_train_step(tx)
  ref_params, ref_state = init_params, tx.init(init_params)
  for i in range(num_microbatches):
    ref_params, ref_state = train_step(ref_params, ref_state, xs[i], ys[i])

  with tempfile.TemporaryDirectory() as directory:
    # Train, saving after every microbatch; keep the last two.
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(directory, options=options) as manager:
      params, opt_state = init_params, tx.init(init_params)
      for i in range(save_at):
        params, opt_state = train_step(params, opt_state, xs[i], ys[i])
        manager.save(i, args=ocp.args.StandardSave({'params': params, 'opt_state': opt_state}))
    num_draws = int(optax_gqc.statistics(opt_state)['num_draws'])
    del params, opt_state  # the program stops here

    # A new program: a new optimizer, and a target with shapes and dtypes only.
    tx = make_optimizer()
    train_step = make_train_step(tx)
    target = jax.eval_shape(lambda p: {'params': p, 'opt_state': tx.init(p)}, init_params)
    with ocp.CheckpointManager(directory) as manager:
      last = manager.latest_step()
      restored = manager.restore(last, args=ocp.args.StandardRestore(target))
  params, opt_state = restored['params'], restored['opt_state']
  for i in range(last + 1, num_microbatches):
    params, opt_state = train_step(params, opt_state, xs[i], ys[i])

  same = all(
      np.array_equal(a, b)
      for a, b in zip(
          jax.tree.leaves((params, opt_state)),
          jax.tree.leaves((ref_params, ref_state)),
          strict=True,
      )
  )
  stats = optax_gqc.statistics(opt_state)
  print(
      f'saved after microbatch {last + 1}, with {num_draws} microbatches accumulated toward '
      f'the next step; {int(stats["num_steps"])} optimizer steps in {num_microbatches} microbatches'
  )
  print(f'resumed run equals the uninterrupted run, params and state, bitwise: {same}')
  return {'num_draws_at_save': num_draws, 'resumed_equals_uninterrupted': same}


if __name__ == '__main__':
  argparse.ArgumentParser(description=__doc__.split('\n\n')[0]).parse_args()  # --help; no flags
  sys.exit(0 if main()['resumed_equals_uninterrupted'] else 1)
