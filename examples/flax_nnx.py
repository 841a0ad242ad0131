"""GNTS with Flax NNX: an MLP on scikit-learn's digits, ``python examples/flax_nnx.py``.

Needs Flax and scikit-learn (``pip install -e ".[examples]"``).

``optimizer.update`` runs once per microbatch. ``optax_gqc.gnts(inner)``, the
library's default, adds each microbatch gradient to its accumulator and steps
AdamW on the mean once it has averaged half the gradient noise scale (at least
two microbatches, at most ``max_draws``, 64), each step scaled by the square
root of the microbatches it averaged; until then the updates are zeros. There
is no threshold to tune: the noise scale is estimated as it trains.
``examples/flax_linen.py`` runs torch-gqc's rule instead, a scheduled threshold
on the mean's norm. ``optimizer.step`` counts microbatches, not optimizer
steps: those are ``optax_gqc.statistics(optimizer.opt_state)['num_steps']``.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits

import optax_gqc


def warn_if_stalled(stats) -> None:
  """Says so when a hyperparameter was out of its domain, or microbatches were rejected.

  Under jax.jit nothing raises at run time: a schedule that returns NaN keeps
  the gate closed (with max_draws=None the run stops stepping for good), and a
  NaN gradient is skipped. Both only show as counters: see docs/robustness.md.
  """
  bad, skipped = int(stats['num_bad_hyperparams']), int(stats['num_skipped'])
  if bad or skipped:
    print(
        f'  WARNING: {bad} microbatches with a hyperparameter out of its domain '
        f'(num_bad_hyperparams), {skipped} rejected for a non-finite gradient (num_skipped)'
    )


def loss_fn(model: nnx.Module, x: jax.Array, y: jax.Array) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@nnx.jit
def train_step(
    model: nnx.Module, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array
) -> jax.Array:
  loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
  optimizer.update(model, grads)  # a zero update while GNTS accumulates
  return loss


@nnx.jit
def evaluate(model: nnx.Module, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
  return loss_fn(model, x, y), jnp.mean(jnp.argmax(model(x), -1) == y)


def main(
    num_microbatches: int = 1000, microbatch_size: int = 16, seed: int = 0, log_every: int = 0
) -> dict[str, float]:
  x, y = load_digits(return_X_y=True)  # 1797 8x8 images: 1400 to train on, the rest to test
  order = np.random.default_rng(seed).permutation(len(x))
  x, y = (x[order] / 16.0).astype(np.float32), y[order]
  rngs = nnx.Rngs(seed)
  model = nnx.Sequential(nnx.Linear(64, 128, rngs=rngs), nnx.relu, nnx.Linear(128, 10, rngs=rngs))
  # The default: with microbatch_size, statistics reports the noise scale in examples.
  tx = optax_gqc.gnts(optax.adamw(3e-3), microbatch_size=microbatch_size)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  initial_loss, initial_accuracy = evaluate(model, x[1400:], y[1400:])
  rng = np.random.default_rng(seed)
  for i in range(num_microbatches):
    batch = rng.integers(0, 1400, microbatch_size)
    loss = train_step(model, optimizer, x[batch], y[batch])
    if log_every and (i + 1) % log_every == 0:
      stats = {k: float(v) for k, v in optax_gqc.statistics(optimizer.opt_state).items()}
      print(
          f'microbatch {i + 1:5d}  loss {float(loss):.3f}  optimizer steps '
          f'{stats["num_steps"]:4.0f}  last step: draws {stats["last_num_draws"]:2.0f}  '
          f'noise scale {stats["noise_scale"]:6.1f} examples, next batch '
          f'{stats["target_batch_size"]:5.0f}'
      )
      warn_if_stalled(stats)
  final_loss, final_accuracy = evaluate(model, x[1400:], y[1400:])
  return {
      'initial_loss': float(initial_loss),
      'initial_accuracy': float(initial_accuracy),
      'final_loss': float(final_loss),
      'final_accuracy': float(final_accuracy),
      'optimizer_step': int(optimizer.step[...]),  # microbatches, i.e. calls of update
      'num_steps': int(optax_gqc.statistics(optimizer.opt_state)['num_steps']),
  }


if __name__ == '__main__':
  argparse.ArgumentParser(description=__doc__.split('\n\n')[0]).parse_args()  # --help; no flags
  result = main(log_every=100)
  print(
      f'test accuracy {result["initial_accuracy"]:.3f} -> {result["final_accuracy"]:.3f}, '
      f'{result["num_steps"]} optimizer steps in {result["optimizer_step"]} microbatches'
  )
