"""GNTS with Flax linen and a ``TrainState``: ``python examples/flax_linen.py``.

Needs Flax and scikit-learn (``pip install -e ".[examples]"``).

``state.apply_gradients`` runs once per microbatch. GNTS, here in its absolute
mode (torch-gqc's rule: ``gnts(inner, threshold)``), adds each microbatch
gradient to its accumulator and steps AdamW on the mean only when the mean's
norm is below the threshold (or after ``max_draws`` microbatches); until then
the updates are zeros. A threshold must suit the model's gradients;
``gnts(inner)`` with none, the library's default, follows the gradient noise
scale instead (``examples/flax_nnx.py``). So ``state.step`` counts
microbatches, not optimizer steps: those are
``optax_gqc.statistics(state.opt_state)['num_steps']``.
"""

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
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


def loss_fn(
    params: optax.Params, state: TrainState, x: jax.Array, y: jax.Array
) -> tuple[jax.Array, jax.Array]:
  logits = state.apply_fn({'params': params}, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits


@jax.jit
def train_step(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[TrainState, jax.Array]:
  (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, state, x, y)
  return state.apply_gradients(grads=grads), loss  # a zero update while GNTS accumulates


@jax.jit
def evaluate(state: TrainState, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
  loss, logits = loss_fn(state.params, state, x, y)
  return loss, jnp.mean(jnp.argmax(logits, -1) == y)


def main(
    num_microbatches: int = 1000, microbatch_size: int = 16, seed: int = 0, log_every: int = 0
) -> dict[str, float]:
  x, y = load_digits(return_X_y=True)  # 1797 8x8 images: 1400 to train on, the rest to test
  order = np.random.default_rng(seed).permutation(len(x))
  x, y = (x[order] / 16.0).astype(np.float32), y[order]
  model = nn.Sequential([nn.Dense(128), nn.relu, nn.Dense(10)])
  params = model.init(jax.random.key(seed), x[:1])['params']
  # The threshold starts 10x high, so early training steps on every
  # microbatch, then anneals from 0.6 to 0.3: more accumulation as the mean
  # gradient shrinks towards the noise.
  threshold = optax_gqc.schedules.cosine_with_inverse_warmup(
      0.6, 0.3, num_microbatches // 10, num_microbatches, warmup_multiplier=10.0
  )
  tx = optax_gqc.gnts(optax.adamw(3e-3), threshold, max_draws=16)
  state = TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  initial_loss, initial_accuracy = evaluate(state, x[1400:], y[1400:])
  rng = np.random.default_rng(seed)
  for i in range(num_microbatches):
    batch = rng.integers(0, 1400, microbatch_size)
    state, loss = train_step(state, x[batch], y[batch])
    if log_every and (i + 1) % log_every == 0:
      stats = {k: float(v) for k, v in optax_gqc.statistics(state.opt_state).items()}
      print(
          f'microbatch {i + 1:5d}  loss {float(loss):.3f}  optimizer steps '
          f'{stats["num_steps"]:4.0f}  last step: draws {stats["last_num_draws"]:2.0f}, '
          f'|mean g| {stats["last_grad_norm"]:.3f}  threshold {stats["threshold"]:.3f}'
      )
      warn_if_stalled(stats)
  final_loss, final_accuracy = evaluate(state, x[1400:], y[1400:])
  return {
      'initial_loss': float(initial_loss),
      'initial_accuracy': float(initial_accuracy),
      'final_loss': float(final_loss),
      'final_accuracy': float(final_accuracy),
      'train_state_step': int(state.step),  # microbatches, i.e. calls of apply_gradients
      'num_steps': int(optax_gqc.statistics(state.opt_state)['num_steps']),
  }


if __name__ == '__main__':
  argparse.ArgumentParser(description=__doc__.split('\n\n')[0]).parse_args()  # --help; no flags
  result = main(log_every=100)
  print(
      f'test accuracy {result["initial_accuracy"]:.3f} -> {result["final_accuracy"]:.3f}, '
      f'{result["num_steps"]} optimizer steps in {result["train_state_step"]} microbatches'
  )
