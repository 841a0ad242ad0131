"""The fused GNTS step with Flax NNX, on scikit-learn's digits: ``python examples/fused_nnx.py``.

Needs Flax and scikit-learn (``pip install -e ".[examples]"``).

``optimizer.update(model, grads)`` is the Optax path: on each microbatch
where GNTS only accumulates, it still writes a zero update and adds it to
every parameter. ``optax_gqc.interop.nnx.update(optimizer, model, grads)``
leaves the model and the optimizer bit for bit as ``optimizer.update`` does,
but its ``lax.cond`` returns the new parameters: an accumulating microbatch
touches only the accumulator. Donating the model and the optimizer lets XLA
update both in place.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits

import optax_gqc
from optax_gqc.interop import nnx as gqc_nnx


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


def cross_entropy(model: nnx.Module, x: jax.Array, y: jax.Array) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@nnx.jit(donate_argnums=(0, 1))
def fused_step(model: nnx.Module, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array):
  loss, grads = nnx.value_and_grad(cross_entropy)(model, x, y)
  gqc_nnx.update(optimizer, model, grads)  # in place of optimizer.update(model, grads)
  return loss


@nnx.jit
def accuracy(model: nnx.Module, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
  return cross_entropy(model, x, y), jnp.mean(jnp.argmax(model(x), -1) == y)


def main(
    num_microbatches: int = 1000, microbatch_size: int = 16, seed: int = 0, log_every: int = 0
) -> dict[str, float]:
  images, labels = load_digits(return_X_y=True)  # 1797 8x8 digits; the last 397 are held out
  shuffle = np.random.default_rng(seed).permutation(len(images))
  images = (images[shuffle] / 16.0).astype(np.float32)
  labels = labels[shuffle]
  train_x, train_y, test_x, test_y = images[:1400], labels[:1400], images[1400:], labels[1400:]

  rngs = nnx.Rngs(seed)
  model = nnx.Sequential(nnx.Linear(64, 256, rngs=rngs), nnx.gelu, nnx.Linear(256, 10, rngs=rngs))
  # GNTS with a relative threshold: step once the mean gradient is at most
  # 0.6 times as long as a typical microbatch gradient, or after 8 microbatches.
  gate = optax_gqc.gates.norm_below(0.6, relative=True)
  tx = optax_gqc.accumulate(optax.adam(1e-2), gate, max_draws=8)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  initial_loss, initial_accuracy = accuracy(model, test_x, test_y)
  draw = np.random.default_rng(seed + 1)
  for i in range(num_microbatches):
    rows = draw.integers(0, len(train_x), microbatch_size)
    loss = fused_step(model, optimizer, train_x[rows], train_y[rows])
    if log_every and (i + 1) % log_every == 0:
      stats = optax_gqc.statistics(optimizer.opt_state)
      print(
          f'microbatch {i + 1:5d}  loss {float(loss):.3f}  '
          f'steps {int(stats["num_steps"]):4d}  draws at the last {int(stats["last_num_draws"])}  '
          f'threshold {float(stats["ratio"]):.2f} x |g_i|'
      )
      warn_if_stalled(stats)
  final_loss, final_accuracy = accuracy(model, test_x, test_y)
  return {
      'initial_loss': float(initial_loss),
      'initial_accuracy': float(initial_accuracy),
      'final_loss': float(final_loss),
      'final_accuracy': float(final_accuracy),
      'optimizer_step': int(optimizer.step[...]),  # calls of the fused update: microbatches
      'num_steps': int(optax_gqc.statistics(optimizer.opt_state)['num_steps']),
  }


if __name__ == '__main__':
  argparse.ArgumentParser(description=__doc__.split('\n\n')[0]).parse_args()  # --help; no flags
  result = main(log_every=100)
  print(
      f'held-out accuracy {result["initial_accuracy"]:.3f} -> {result["final_accuracy"]:.3f}; '
      f'{result["num_steps"]} Adam steps in {result["optimizer_step"]} microbatches, '
      'no zero update written on the others'
  )
