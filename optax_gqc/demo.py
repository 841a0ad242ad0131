"""Adaptive accumulation on real text: ``python -m optax_gqc.demo``.

A small byte-level transformer (Flax NNX) learns Python source code: by
default the top-level modules of the running interpreter's standard library
(``<stdlib>/*.py``, sorted by name, the first ``--corpus-bytes``), so the data
is on every machine and nothing is downloaded; ``--data FILE`` trains on your
own text. The last 10% is held out for validation. Three arms see the same
microbatches in the same order, at the same token budget:

- ``control``: AdamW stepping on every microbatch, warmup then cosine decay;
- ``fixed``: AdamW on the mean of a fixed number of microbatches, the GNTS
  arm's mean draws per step (this separates "adaptive" from "bigger batch");
- ``gnts``: GNTS with AdamW inside, torch-gqc's recipe (constant learning rate
  after warmup, threshold by inverse warmup then cosine), with the threshold
  relative to an EMA of microbatch gradient norms and the norm test as a
  valve for the signal-dominated start.

It writes a table, ``curves.png`` and ``results.json`` into ``--out``.
"""

import argparse
import json
import math
import os
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import optax_gqc
from optax_gqc import gates, schedules

VOCAB = 256  # bytes


def stdlib_corpus(max_bytes: int) -> tuple[bytes, list[str]]:
  """The running interpreter's top-level stdlib modules, sorted by name, capped."""
  root = Path(sysconfig.get_paths()['stdlib'])
  chunks, names, size = [], [], 0
  for path in sorted(root.glob('*.py')):
    data = path.read_bytes()
    chunks.append(data)
    names.append(path.name)
    size += len(data)
    if size >= max_bytes:
      break
  return b''.join(chunks)[:max_bytes], names


class Block(nnx.Module):

  def __init__(self, dim: int, heads: int, rngs: nnx.Rngs):
    self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim, decode=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
    self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
    self.down = nnx.Linear(4 * dim, dim, rngs=rngs)

  def __call__(self, x, mask):
    x = x + self.attn(self.norm1(x), mask=mask)
    return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class CharTransformer(nnx.Module):
  """A decoder-only transformer over bytes."""

  def __init__(self, dim: int, layers: int, heads: int, context: int, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, dim, rngs=rngs)
    self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (context, dim)))
    self.blocks = nnx.List([Block(dim, heads, rngs) for _ in range(layers)])
    self.norm = nnx.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.position[: tokens.shape[-1]]
    mask = nnx.make_causal_mask(tokens)
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.norm(x))


def loss_fn(model, batch):
  logits = model(batch[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


@nnx.jit
def train_step(model, optimizer, batch):
  loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
  optimizer.update(model, grads)
  return loss


@nnx.jit
def eval_loss(model, batches):
  return jnp.mean(jax.vmap(lambda b: loss_fn(model, b))(batches))


def sample_batches(tokens: np.ndarray, count: int, size: int, context: int, seed: int):
  """``count`` microbatches of ``size`` windows of ``context + 1`` bytes."""
  rng = np.random.default_rng(seed)
  starts = rng.integers(0, len(tokens) - context - 1, size=(count, size))
  return tokens[starts[..., None] + np.arange(context + 1)]


def run_arm(name: str, tx, args, train: np.ndarray, val: np.ndarray, log: Callable[[str], None]):
  """Trains one arm; returns its curve and summary."""
  from tqdm.auto import tqdm

  model = CharTransformer(args.dim, args.layers, args.heads, args.context, nnx.Rngs(args.seed))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  tokens_per_micro = args.microbatch * args.context
  count = args.tokens // tokens_per_micro
  eval_every = max(count // args.evals, 1)
  curve, step_counts = [], []
  start = time.perf_counter()
  bar = tqdm(
      range(count),
      desc=f'{name:8s}',
      unit='mb',
      leave=True,
      mininterval=1.0,
      disable=args.no_progress,
  )
  for i in bar:
    batch = jnp.asarray(train[i], jnp.int32)
    loss = train_step(model, optimizer, batch)
    # A snapshot of the array ([...]; the Variable itself changes in place), kept
    # on device: reading it back every microbatch would stall the pipeline.
    num_steps = getattr(optimizer.opt_state, 'num_steps', None)
    step_counts.append(i + 1 if num_steps is None else num_steps[...])
    if (i + 1) % 50 == 0 or i + 1 == count:
      stats = {k: float(v) for k, v in _statistics(optimizer).items()}
      post = {'loss': f'{float(loss):.3f}', 'steps': int(stats.get('num_steps', i + 1))}
      if 'last_num_draws' in stats:
        post['draws'] = int(stats['last_num_draws'])
      if 'threshold' in stats:
        post['thr'] = f"{stats['threshold']:.3g}"
      if math.isfinite(stats.get('noise_scale', math.nan)):
        post['B_simple'] = f"{stats['noise_scale']:.0f}"
      bar.set_postfix(post, refresh=False)
    if (i + 1) % eval_every == 0 or i + 1 == count:
      stats = {k: float(v) for k, v in _statistics(optimizer).items()}
      point = {
          'tokens': (i + 1) * tokens_per_micro,
          'val_loss': float(eval_loss(model, val)),
          'steps': int(stats.get('num_steps', i + 1)),
      }
      point.update(
          {k: stats[k] for k in ('threshold', 'threshold_ratio', 'noise_scale') if k in stats}
      )
      curve.append(point)
  counts = np.asarray(jax.device_get(step_counts), np.int64)
  stepped = np.flatnonzero(np.diff(counts, prepend=0) > 0)  # microbatches that stepped
  draws_at_steps = [
      (int(i + 1), int(d)) for i, d in zip(stepped, np.diff(stepped, prepend=-1), strict=True)
  ]
  seconds = time.perf_counter() - start
  final = curve[-1]
  noise = _statistics(optimizer).get('noise_scale')
  summary = {
      'arm': name,
      'val_loss': final['val_loss'],
      'tokens': count * tokens_per_micro,
      'tokens_per_microbatch': tokens_per_micro,
      'steps': final['steps'],
      'draws_per_step': count / max(final['steps'], 1),
      'seconds': seconds,
      'noise_scale': None if noise is None or not math.isfinite(float(noise)) else float(noise),
  }
  log(
      f"{name}: val loss {summary['val_loss']:.4f}, {summary['steps']} steps, "
      f"{summary['draws_per_step']:.2f} microbatches per step, {seconds:.0f} s"
  )
  return {'summary': summary, 'curve': curve, 'draws_at_steps': draws_at_steps}


def _statistics(optimizer) -> dict[str, Any]:
  try:
    return optax_gqc.statistics(optimizer.opt_state)
  except ValueError:  # the control has no accumulation
    return {}


def make_arms(args, count: int, fixed_draws: int) -> dict[str, Any]:
  """The optimizers of the three arms; ``count`` microbatches in the run."""
  warmup = max(int(args.warmup * count), 1)
  lr, wd = args.lr, args.weight_decay

  def cosine(steps):
    return optax.warmup_cosine_decay_schedule(
        0.0, lr, max(int(args.warmup * steps), 1), max(steps, 2), end_value=0.1 * lr
    )

  # GNTS, torch-gqc's recipe: lr warms up over the first microbatches (each is a
  # step early on) and stays; the threshold ratio falls from warmup_multiplier
  # times its initial value (so early microbatches step at once), then anneals.
  ratio = schedules.cosine_with_inverse_warmup(
      args.initial_ratio, args.final_ratio, warmup, count, args.warmup_multiplier
  )
  gnts_gate = gates.any_of(
      gates.norm_below(ratio, relative=True), gates.relative_error_below(args.eta)
  )
  # The GNTS arm's learning rate is a schedule of microbatches (tokens), not of
  # its steps: torch-gqc's constant after warmup, or the control's own curve.
  if args.gnts_lr == 'constant':  # make_gnts_with_cosine_annealing_schedule
    gnts_lr = schedules.constant_with_warmup(lr, warmup)
  else:  # ..._conventional_lr, with the control's decay
    gnts_lr = cosine(count)
  return {
      'control': lambda: optax.adamw(cosine(count), weight_decay=wd),
      'fixed': lambda: optax_gqc.sbc(
          optax.adamw(cosine(count // fixed_draws), weight_decay=wd),
          logical_batch_size=fixed_draws * args.microbatch,
          microbatch_size=args.microbatch,
          max_draws=fixed_draws,
      ),
      'gnts': lambda: optax_gqc.scheduled_accumulation(
          optax.adamw,
          gnts_gate,
          {'learning_rate': gnts_lr},
          max_draws=args.max_draws,
          microbatch_size=args.microbatch,
          weight_decay=wd,
      ),
  }


def plot(results: dict[str, Any], path: Path) -> None:
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  for name, r in results.items():
    c = r['curve']
    axes[0].plot([p['tokens'] for p in c], [p['val_loss'] for p in c], marker='.', label=name)
  axes[0].set(xlabel='tokens', ylabel='validation loss (nats/byte)', title='validation loss')
  axes[0].legend()
  if 'gnts' in results:
    g = results['gnts']
    tokens_per_micro = g['summary']['tokens_per_microbatch']
    steps = np.asarray(g['draws_at_steps'], np.float64)
    if len(steps):
      axes[1].plot(steps[:, 0] * tokens_per_micro, steps[:, 1], '.', ms=2, alpha=0.4)
      window = max(len(steps) // 30, 1)
      smooth = np.convolve(steps[:, 1], np.ones(window) / window, mode='valid')
      axes[1].plot(steps[window - 1 :, 0] * tokens_per_micro, smooth, lw=2)
    axes[1].set(xlabel='tokens', ylabel='microbatches per step', title='GNTS: draws per step')
    c = [p for p in g['curve'] if 'threshold' in p]
    axes[2].plot([p['tokens'] for p in c], [p['threshold'] for p in c], label='absolute norm')
    axes[2].set(xlabel='tokens', ylabel='threshold (gradient norm)', title='GNTS: threshold')
    twin = axes[2].twinx()
    twin.plot(
        [p['tokens'] for p in c],
        [p['threshold_ratio'] for p in c],
        'C1--',
        label='ratio to EMA of microbatch norms',
    )
    twin.set_ylabel('relative threshold')
    axes[2].legend(loc='upper right', fontsize=8)
    twin.legend(loc='center right', fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description='Adaptive accumulation (GNTS) on real text.')
  p.add_argument('--arms', default='control,fixed,gnts', help='comma-separated, any of these')
  p.add_argument('--tokens', type=int, default=900_000, help='token budget per arm')
  p.add_argument('--data', type=str, default=None, help='train on this text file instead')
  p.add_argument('--corpus-bytes', type=int, default=3_000_000)
  p.add_argument('--microbatch', type=int, default=8, help='sequences per microbatch')
  p.add_argument('--context', type=int, default=64)
  p.add_argument('--dim', type=int, default=96)
  p.add_argument('--layers', type=int, default=3)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--lr', type=float, default=3e-3)
  p.add_argument('--weight-decay', type=float, default=0.01)
  p.add_argument('--warmup', type=float, default=0.05, help='share of the run')
  p.add_argument('--initial-ratio', type=float, default=0.6)
  p.add_argument('--final-ratio', type=float, default=0.35)
  p.add_argument('--warmup-multiplier', type=float, default=2.0)
  p.add_argument('--eta', type=float, default=0.8, help='norm-test valve')
  p.add_argument(
      '--gnts-lr',
      choices=('constant', 'cosine'),
      default='constant',
      help="GNTS arm's lr after warmup: torch-gqc's constant, or cosine decay",
  )
  p.add_argument('--max-draws', type=int, default=32)
  p.add_argument('--fixed-draws', type=int, default=0, help="0: the GNTS arm's mean")
  p.add_argument('--evals', type=int, default=12)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out', type=str, default='./gqc-demo-out')
  p.add_argument('--quick', action='store_true', help='a tiny run, for tests')
  p.add_argument('--no-progress', action='store_true')
  args = p.parse_args(argv)
  if args.quick:
    args.tokens, args.dim, args.layers, args.context = 40_000, 32, 1, 32
    args.corpus_bytes, args.evals = 400_000, 4
  return args


def main(argv=None) -> dict[str, Any]:
  args = parse_args(argv)
  arms = [a.strip() for a in args.arms.split(',') if a.strip()]
  unknown = set(arms) - {'control', 'fixed', 'gnts'}
  if unknown:
    raise SystemExit(f'unknown arms: {sorted(unknown)}')
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  if args.data:
    text, source = Path(args.data).read_bytes(), [args.data]
  else:
    text, source = stdlib_corpus(args.corpus_bytes)
  data = np.frombuffer(text, np.uint8).astype(np.int32)
  split = int(0.9 * len(data))
  count = args.tokens // (args.microbatch * args.context)
  train = sample_batches(data[:split], count, args.microbatch, args.context, args.seed)
  val = jnp.asarray(sample_batches(data[split:], 4, 32, args.context, args.seed + 1))
  model_params = sum(
      x.size
      for x in jax.tree.leaves(
          nnx.state(
              CharTransformer(args.dim, args.layers, args.heads, args.context, nnx.Rngs(0)),
              nnx.Param,
          )
      )
  )
  print(
      f'{len(text) / 1e6:.2f} MB of text ({len(source)} files), {model_params / 1e6:.2f}M '
      f'parameters, microbatch {args.microbatch} x {args.context} bytes, '
      f'{count} microbatches per arm'
  )

  results, log_lines = {}, []
  log = lambda line: (log_lines.append(line), print(line))  # noqa: E731
  order = [a for a in ('gnts', 'control', 'fixed') if a in arms]  # gnts first: fixed needs it
  fixed_draws = args.fixed_draws or 4
  for name in order:
    if name == 'fixed' and not args.fixed_draws and 'gnts' in results:
      fixed_draws = max(round(results['gnts']['summary']['draws_per_step']), 1)
    tx = make_arms(args, count, fixed_draws)[name]()
    results[name] = run_arm(name, tx, args, train, val, log)

  # The fixed arm's noise scale: its decision does not read the gradients, so
  # the estimate is unbiased (GNTS's stopping rule biases its own upwards).
  noise_arm = next((a for a in ('fixed', 'gnts') if a in results), None)
  noise = results[noise_arm]['summary']['noise_scale'] if noise_arm else None
  header = (
      f"{'arm':8s} {'val loss':>9s} {'tokens':>10s} {'opt steps':>10s} "
      f"{'draws/step':>11s} {'wall s':>7s}"
  )
  table = [header] + [
      f"{r['summary']['arm']:8s} {r['summary']['val_loss']:9.4f} {r['summary']['tokens']:10d} "
      f"{r['summary']['steps']:10d} {r['summary']['draws_per_step']:11.2f} "
      f"{r['summary']['seconds']:7.0f}"
      for r in (results[a] for a in arms if a in results)
  ]
  print('\n' + '\n'.join(table))
  if noise is not None:
    print(
        f'noise scale B_simple (from the {noise_arm} arm): {noise:.0f} sequences of '
        f'{args.context} bytes; microbatch: {args.microbatch} sequences; fixed arm: '
        f'{fixed_draws} microbatches per step'
    )
  plot(results, out / 'curves.png')
  payload = {
      'config': vars(args),
      'corpus_files': source,
      'parameters': model_params,
      'fixed_draws': fixed_draws,
      'noise_scale_sequences': noise,
      'noise_scale_arm': noise_arm,
      'table': table,
      'arms': results,
      'device': jax.devices()[0].platform,
  }
  (out / 'results.json').write_text(json.dumps(payload, indent=1))
  (out / 'table.txt').write_text('\n'.join(table) + '\n')
  print(f'wrote {out / "curves.png"}, {out / "results.json"}')
  return payload


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  main()
