"""A small GNTS training run: ``python -m optax_gqc.demo``.

A Flax NNX MLP learns a random teacher's labels (with 20% of the training
labels flipped, so microbatch gradients are noisy) from microbatches of 8
examples. GNTS with AdamW inside accumulates until the mean gradient is short
enough; the control runs AdamW on every microbatch. Both see the same
microbatches; the run prints the engine's statistics as it goes and a table
at the end. The data is generated: nothing is downloaded.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import optax_gqc

DIM, CLASSES, HIDDEN, MICROBATCH = 16, 4, 64, 8


def make_data(key, num, flip=0.0):
  """Inputs ~ N(0, I) labelled by a fixed random teacher; a ``flip`` share relabelled."""
  teacher = jax.random.normal(jax.random.key(1234), (DIM, CLASSES))
  kx, kf, kr = jax.random.split(key, 3)
  x = jax.random.normal(kx, (num, DIM))
  y = jnp.argmax(x @ teacher, axis=-1)
  noisy = jax.random.bernoulli(kf, flip, (num,))
  return x, jnp.where(noisy, jax.random.randint(kr, (num,), 0, CLASSES), y)


class MLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(DIM, HIDDEN, rngs=rngs)
    self.out = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.gelu(self.hidden(x)))


def loss_fn(model, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@nnx.jit
def train_step(model, optimizer, x, y):
  loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
  optimizer.update(model, grads)
  return loss


@nnx.jit
def evaluate(model, x, y):
  return loss_fn(model, x, y), jnp.mean(jnp.argmax(model(x), -1) == y)


def train(name, tx, batches, val, log_every):
  model = MLP(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  start = time.perf_counter()
  for i, (x, y) in enumerate(batches):
    loss = train_step(model, optimizer, x, y)
    if name == 'gnts' and (i + 1) % log_every == 0:
      s = {k: float(v) for k, v in optax_gqc.statistics(optimizer.opt_state).items()}
      print(f'  microbatch {i + 1:5d}  loss {float(loss):.3f}  steps {s["num_steps"]:5.0f}  '
            f'draws at last step {s["last_num_draws"]:2.0f}  |mean g| at last step '
            f'{s["last_grad_norm"]:.3f}  threshold {s["threshold"]:.3f}')
  val_loss, val_acc = evaluate(model, *val)
  steps = len(batches)
  if name == 'gnts':
    steps = int(optax_gqc.statistics(optimizer.opt_state)['num_steps'])
  return {'arm': name, 'val_loss': float(val_loss), 'val_acc': float(val_acc),
          'steps': steps, 'draws_per_step': len(batches) / max(steps, 1),
          'seconds': time.perf_counter() - start}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--microbatches', type=int, default=3000)
  parser.add_argument('--lr', type=float, default=3e-3)
  args = parser.parse_args(argv)

  n = args.microbatches
  x, y = make_data(jax.random.key(0), n * MICROBATCH, flip=0.2)
  batches = list(zip(x.reshape(n, MICROBATCH, DIM), y.reshape(n, MICROBATCH), strict=True))
  val = make_data(jax.random.key(1), 4096)
  warmup = n // 20
  gnts = optax_gqc.gnts(
      optax.adamw(args.lr),
      threshold=optax_gqc.schedules.cosine_with_inverse_warmup(
          0.5, 0.25, warmup, n, warmup_multiplier=10.0),
      max_draws=32,
  )
  print(f'GNTS(AdamW) on {n} microbatches of {MICROBATCH} noisy-label examples')
  results = [train('gnts', gnts, batches, val, max(n // 10, 1))]
  results.append(train('adamw', optax.adamw(args.lr), batches, val, n))
  print(f"\n{'arm':6s} {'val loss':>9s} {'val acc':>8s} {'steps':>6s} {'draws/step':>11s}")
  for r in results:
    print(f"{r['arm']:6s} {r['val_loss']:9.4f} {r['val_acc']:8.3f} {r['steps']:6d} "
          f"{r['draws_per_step']:11.2f}")
  return results


if __name__ == '__main__':
  main()
