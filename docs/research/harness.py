"""The research harness: the demo's model and data, each arm run in lax.scan blocks.

It made the numbers of docs/research.md (see runs.py). It predates the
demo's own block runner and is kept as it ran.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import optax_gqc
from optax_gqc import gates
from optax_gqc.demo import data as demo_data
from optax_gqc.demo import model as demo_model


def setup(
    tokens=900_000, microbatch=8, context=64, corpus_bytes=3_000_000, seed=0, seeded_val=False
):
  """Training microbatches drawn with ``seed``, and the validation windows.

  The validation windows are the same for every seed (8 x 32 of them), as in
  rounds 4 and 5; rounds 1 to 3 drew 4 x 32 of them with ``seed + 1``
  (``seeded_val=True``).
  """
  text, _ = demo_data.stdlib_corpus(corpus_bytes)
  data = np.frombuffer(text, np.uint8).astype(np.int32)
  split = int(0.9 * len(data))
  count = tokens // (microbatch * context)
  train = demo_data.sample_batches(data[:split], count, microbatch, context, seed)
  val = jnp.asarray(
      demo_data.sample_batches(data[split:], 8, 32, context, 1)
  )  # the same windows for every seed
  return train, val, count


def lr_by_tokens(peak, count, warmup=0.05, end=0.1):
  w = max(int(warmup * count), 1)
  return optax.warmup_cosine_decay_schedule(0.0, peak, w, max(count, 2), end_value=end * peak)


def make_tx(gate, lr_sched, microbatch, max_draws=64, wd=0.01, scale=None):
  inner = optax.inject_hyperparams(optax.adamw)(learning_rate=lr_sched(0), weight_decay=wd)
  tx = optax_gqc.accumulate(
      inner, gate, max_draws=max_draws, microbatch_size=microbatch, scale_by_draws=scale
  )

  def sched(state):
    h = dict(state.inner_state.hyperparams)
    h['learning_rate'] = jnp.asarray(lr_sched(state.num_microbatches), jnp.float32)
    return state._replace(inner_state=state.inner_state._replace(hyperparams=h))

  return optax_gqc.AccumulationTransformation(
      tx.init,
      lambda g, s, p=None, **k: tx.update(g, sched(s), p, **k),
      lambda g, s, p, **k: tx.update_and_apply(g, sched(s), p, **k),
  )


def run(
    tx,
    train,
    val,
    dim=96,
    layers=3,
    heads=4,
    context=64,
    seed=0,
    evals=12,
    block=50,
    stats_keys=('noise_scale', 'target_batch_size', 'threshold'),
):
  model = demo_model.CharTransformer(dim, layers, heads, context, nnx.Rngs(seed))
  graphdef, params = nnx.split(model, nnx.Param)

  def loss_fn(params, batch):
    m = nnx.merge(graphdef, params)
    return demo_model.loss_fn(m, batch)

  state = tx.init(params)

  @jax.jit
  def block_fn(params, state, batches):
    def body(carry, batch):
      p, s = carry
      loss, g = jax.value_and_grad(loss_fn)(p, batch)
      p, s = optax_gqc.update_and_apply(tx, g, s, p)
      st = optax_gqc.statistics(s)
      return (p, s), (loss, st['num_steps'], st['last_num_draws'])

    return jax.lax.scan(body, (params, state), batches)

  @jax.jit
  def eval_fn(params):
    return jnp.mean(jax.vmap(lambda b: loss_fn(params, b))(val))

  count = len(train)
  eval_at = set(np.linspace(0, count, evals + 1).astype(int)[1:])
  curve, steps_trace = [], []
  t0 = time.perf_counter()
  i = 0
  while i < count:
    nxt = min(count, i + block)
    # stop blocks at eval points
    for e in sorted(eval_at):
      if i < e < nxt:
        nxt = e
        break
    (params, state), (loss, nsteps, draws) = block_fn(params, state, jnp.asarray(train[i:nxt]))
    steps_trace.append(np.asarray(nsteps))
    i = nxt
    if i in eval_at:
      st = {k: float(v) for k, v in optax_gqc.statistics(state).items()}
      pt = {
          'microbatches': int(i),
          'val_loss': float(eval_fn(params)),
          'steps': int(st['num_steps']),
      }
      pt.update({k: st[k] for k in stats_keys if k in st})
      curve.append(pt)
  steps_trace = np.concatenate(steps_trace)
  return {
      'curve': curve,
      'final': curve[-1],
      'seconds': time.perf_counter() - t0,
      'steps_trace': steps_trace.tolist(),
  }


if __name__ == '__main__':
  train, val, count = setup()
  t = time.perf_counter()
  tx = make_tx(gates.batch_size_at_least(8, 8), lr_by_tokens(3e-3, count), 8)
  r = run(tx, train, val)
  print(r['final'], r['seconds'])
