"""The task suite: adaptive accumulation against each seed's own fixed-batch frontier.

Runs :func:`optax_gqc.study.frontier_study` on tasks in different regimes:

- ``lm``: the demo's task, a byte-level transformer on the standard library's
  sources, microbatches of 8 sequences, a sizeable fraction of the noise scale;
- ``lm-small``: the same model family on a different corpus (the interpreter's
  own documentation, ``pydoc_data``), microbatches of 2 sequences, far below
  the noise scale for most of training;
- ``lm-long``: ``lm`` trained four times as long (held out: docs/study.md,
  hypothesis 9);
- ``lm-wide``: ``lm`` with a model twice as wide, 64 (held out: docs/study.md,
  hypothesis 10);
- ``lm-big``: ``lm`` with a model twice as wide and twice as deep, trained
  twice as long (held out: docs/study.md, hypothesis 11);
- ``teacher``: not a language model: a student MLP regresses a random teacher
  MLP's outputs plus label noise, microbatches of 4 examples;
- ``digits``: an MLP classifier on scikit-learn's handwritten digits,
  microbatches of 4 images (needs scikit-learn).

Every arm sees the same microbatches at the same tokens; the frontier is k in
``--ks`` at its best learning rate from the task's grid on each seed; adaptive
arms run at the control's best rate. Prints one table per task and writes
``<task>.json`` into ``--out``. ``--report`` reads them back, writes the
suite's table and figure, and exits non-zero if the default adaptive arm
misses a target of docs/study.md; a seed without a margin (diverged, or
outside its frontier's steps) misses.

  python benchmarks/suite.py --tasks teacher,digits,lm,lm-small --out docs/study
"""

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _report import positive_int

import optax_gqc
from optax_gqc import gates, study


class Task(NamedTuple):
  loss_fn: Any
  params: Any  # seed -> params
  microbatches: Any  # seed -> stacked microbatches
  eval_batches: Any
  learning_rates: tuple[float, ...]
  note: str


# Tasks.


def _mlp_init(key, sizes, scale=1.0):
  params = []
  for k, (a, b) in zip(
      jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:], strict=True), strict=True
  ):
    params.append({'w': jax.random.normal(k, (a, b)) * scale / np.sqrt(a), 'b': jnp.zeros(b)})
  return params


def _mlp(params, x):
  for layer in params[:-1]:
    x = jnp.tanh(x @ layer['w'] + layer['b'])
  return x @ params[-1]['w'] + params[-1]['b']


def teacher_task(microbatches: int, size: int = 4) -> Task:
  dim, noise = 16, 0.5
  teacher = _mlp_init(jax.random.key(1234), (dim, 32, 1), scale=2.0)

  def batch(key, shape):
    kx, kn = jax.random.split(key)
    x = jax.random.normal(kx, (*shape, dim))
    return x, _mlp(teacher, x)[..., 0] + noise * jax.random.normal(kn, shape)

  def loss_fn(params, b):
    x, y = b
    return jnp.mean(jnp.square(_mlp(params, x)[..., 0] - y))

  return Task(
      loss_fn,
      lambda seed: _mlp_init(jax.random.key(seed), (dim, 64, 64, 1)),
      lambda seed: batch(jax.random.key(10_000 + seed), (microbatches, size)),
      batch(jax.random.key(99), (8, 256)),
      (4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2),
      f'student MLP 16-64-64-1 regresses a teacher 16-32-1 plus noise 0.5, {size} examples '
      'per microbatch, mean squared error',
  )


def digits_task(microbatches: int, size: int = 4) -> Task:
  from sklearn.datasets import load_digits  # noqa: PLC0415

  x, y = load_digits(return_X_y=True)
  x = (x / 16.0).astype(np.float32)
  y = y.astype(np.int32)
  perm = np.random.default_rng(0).permutation(len(x))
  x, y = x[perm], y[perm]
  x_val, y_val, x_train, y_train = x[:400], y[:400], x[400:], y[400:]

  def loss_fn(params, b):
    xb, yb = b
    return optax.softmax_cross_entropy_with_integer_labels(_mlp(params, xb), yb).mean()

  def data(seed):
    idx = np.random.default_rng(seed).integers(0, len(x_train), (microbatches, size))
    return jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx])

  return Task(
      loss_fn,
      lambda seed: _mlp_init(jax.random.key(seed), (64, 64, 10)),
      data,
      (jnp.asarray(x_val.reshape(4, 100, 64)), jnp.asarray(y_val.reshape(4, 100))),
      (8e-3, 1.6e-2, 3.2e-2, 6.4e-2, 1.28e-1),
      f'MLP 64-64-10 on scikit-learn digits (1397 train, 400 validation), {size} images '
      'per microbatch, cross entropy',
  )


def _pydoc_corpus(max_bytes: int) -> bytes:
  from pydoc_data import topics  # noqa: PLC0415

  text = '\n'.join(topics.topics[k] for k in sorted(topics.topics))
  return text.encode()[:max_bytes]


def lm_task(
    microbatches: int, size: int, corpus: str, dim: int, layers: int, context: int, learning_rates
) -> Task:
  from flax import nnx  # noqa: PLC0415

  from optax_gqc.demo import data, model  # noqa: PLC0415

  if corpus == 'stdlib':
    text, _ = data.stdlib_corpus(2_000_000)
  else:
    text = _pydoc_corpus(2_000_000)
  tokens = np.frombuffer(text, np.uint8)
  split = int(0.9 * len(tokens))
  train, val = tokens[:split], tokens[split:]
  heads = 4
  graphdef = nnx.split(model.CharTransformer(dim, layers, heads, context, nnx.Rngs(0)), nnx.Param)[
      0
  ]

  def params(seed):
    return nnx.split(model.CharTransformer(dim, layers, heads, context, nnx.Rngs(seed)), nnx.Param)[
        1
    ]

  def loss_fn(p, batch):
    return model.param_loss(p, graphdef, batch)

  return Task(
      loss_fn,
      params,
      lambda seed: jnp.asarray(
          data.sample_batches(train, microbatches, size, context, 10_000 + seed), jnp.int32
      ),
      jnp.asarray(data.sample_batches(val, 8, 32, context, 12345), jnp.int32),
      learning_rates,
      f'byte transformer {dim}x{layers} (context {context}) on {corpus}, {size} sequences per '
      'microbatch, cross entropy in nats',
  )


TASKS = {
    'teacher': lambda: teacher_task(2000),
    'digits': lambda: digits_task(2000),
    'lm': lambda: lm_task(1600, 8, 'stdlib', 32, 2, 32, (4e-3, 8e-3, 1.6e-2, 3.2e-2)),
    'lm-long': lambda: lm_task(6400, 8, 'stdlib', 32, 2, 32, (4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2)),
    'lm-wide': lambda: lm_task(1600, 8, 'stdlib', 64, 2, 32, (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)),
    'lm-big': lambda: lm_task(3200, 8, 'stdlib', 64, 4, 32, (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)),
    'lm-small': lambda: lm_task(3200, 2, 'pydoc', 32, 2, 32, (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2)),
}


# The arms.


RAMPS = (3, 4, 8, 16, 32, 64)  # the largest batch of each ramp, in microbatches


def _ramp(k: int, microbatches: int) -> study.Arm:
  """A batch that grows linearly from 2 microbatches to ``k`` over the run, stepped by sqrt(n)."""
  batch = optax.linear_schedule(2.0, float(k), microbatches)
  return lambda inner: optax_gqc.sbc(inner, batch, 1, scale_by_draws=jnp.sqrt)


def arms(microbatches: int = 1) -> dict[str, study.Arm]:
  """The adaptive arms: each a function of the inner optimizer, as a user writes it.

  ``microbatches`` is the run's length, over which the ramps grow.
  """
  g = gates
  sqrt = jnp.sqrt
  return {
      # The default: gnts(inner), noise-following, steps scaled by sqrt(n).
      'gnts': optax_gqc.gnts,
      # The scale-free default of 0.1.0: a fixed batch of ~1/ratio^2 where noise dominates.
      'relative': functools.partial(optax_gqc.gnts, ratio=0.5),
      'relative-sqrt': functools.partial(optax_gqc.gnts, ratio=0.5, scale_by_draws=sqrt),
      # Variants of the default, for the record of how it was chosen.
      'critical-min1': lambda inner: optax_gqc.accumulate(
          inner, g.critical_batch(0.5, 1), max_draws=64, scale_by_draws=sqrt
      ),
      'gnts-f0.25': functools.partial(optax_gqc.gnts, fraction=0.25),
      'gnts-f1': functools.partial(optax_gqc.gnts, fraction=1.0),
      'gnts-f2': functools.partial(optax_gqc.gnts, fraction=2.0),
      'gnts-unscaled': functools.partial(optax_gqc.gnts, scale_by_draws=None),
      # The default with a bootstrap of 20 steps in place of 5 (docs/noise_scale.md).
      'gnts-boot20': lambda inner: optax_gqc.accumulate(
          inner,
          g.critical_batch(0.5, 1, min_batch_size=2, bootstrap_steps=20),
          max_draws=64,
          scale_by_draws=sqrt,
      ),
      # McCandlish's 1 / (1 + B / n) under a square root, sqrt((1 + B) / (1 + B / n)) over one
      # microbatch's rate, with the gate's n = B / 2: sqrt((1 + 2 n) / 3), 0.82 sqrt(n) at large n.
      'gnts-mccandlish': functools.partial(
          optax_gqc.gnts, scale_by_draws=lambda n: sqrt((1.0 + 2.0 * n) / 3.0)
      ),
      # Its mirror: sqrt(1.5 n), 1.22 sqrt(n).
      'gnts-sqrt1.5n': functools.partial(optax_gqc.gnts, scale_by_draws=lambda n: sqrt(1.5 * n)),
      'normtest-sqrt': lambda inner: optax_gqc.norm_test_accumulation(
          inner, 0.8, scale_by_draws=sqrt
      ),
      # Hypothesis 14: batch ramps, schedules that measure nothing, stepped as the default.
      **{f'ramp{k}': _ramp(k, microbatches) for k in RAMPS},
  }


# The targets for the default arm ('gnts'), per task: see docs/study.md.
MIN_MEAN_MARGIN = 0.0  # mean margin over seeds, on every task
MIN_SEED_MARGIN = -0.01  # no seed below, on every task
MIN_TASKS_BELOW = 2  # tasks whose paired 95% interval lies above 0
MIN_SEEDS = 5  # seeds per task, each with a margin
MAX_STEP_RATIO = 0.5  # optimizer steps over the control's, on every task
REPORT_ARMS = ('gnts', 'relative', 'relative-sqrt')


def _cell(a):
  m = a['margin']
  if m['mean'] is None:
    return '-'
  interval = '' if m['low'] is None else f" [{m['low']:+.3f}, {m['high']:+.3f}]"
  return f"{m['mean']:+.3f}{interval}"


def _number(x, spec, unit=''):
  return '-' if x is None else format(x, spec) + unit


def _complete(margin: dict[str, Any], seeds: int) -> bool:
  """Whether a task's margins cover the protocol: every seed has one, and there are enough."""
  return margin['n'] == seeds >= MIN_SEEDS


def _targets(task: str, arm: dict[str, Any] | None, seeds: int) -> dict[str, bool]:
  """The default arm's targets on one task; a seed with no margin misses them."""
  if arm is None:
    return {f'{task}: gnts was run': False}
  m, ratio = arm['margin'], arm['step_ratio']
  every = _complete(m, seeds)
  return {
      f'{task}: {MIN_SEEDS} seeds or more': seeds >= MIN_SEEDS,
      f'{task}: mean margin >= {MIN_MEAN_MARGIN}': every and m['mean'] >= MIN_MEAN_MARGIN,
      f'{task}: every seed >= {MIN_SEED_MARGIN}': every and m['min'] >= MIN_SEED_MARGIN,
      f'{task}: steps <= {MAX_STEP_RATIO}x the control': (
          every and ratio is not None and ratio <= MAX_STEP_RATIO
      ),
  }


def report(out: Path, tasks) -> int:
  """The suite's table (suite.md), figure (suite.png) and targets, from the saved studies."""
  results = {t: json.loads(Path(out, f'{t}.json').read_text()) for t in tasks}
  lines = [
      '| task | seeds | `gnts` margin [95% interval] | worst seed | steps vs control '
      '| `gnts(ratio=0.5)` (0.1.0) | `gnts(ratio=0.5, scale_by_draws=sqrt)` |',
      '| --- | --- | --- | --- | --- | --- | --- |',
  ]
  checks = {}
  below = 0
  for t, r in results.items():
    a, seeds = r['arms'].get('gnts'), len(r['seeds'])
    checks.update(_targets(t, a, seeds))
    if a is None:
      lines.append(f'| `{t}` | {seeds} | - | - | - | - | - |')
      continue
    m = a['margin']
    count = str(seeds) if m['n'] == seeds else f"{m['n']} of {seeds}"  # the rest: no margin
    lines.append(
        f"| `{t}` | {count} | {_cell(a)} | {_number(m['min'], '+.3f')} | "
        f"{_number(a['step_ratio'], '.2f', 'x')} | "
        + ' | '.join(_cell(r['arms'][x]) if x in r['arms'] else '-' for x in REPORT_ARMS[1:])
        + ' |'
    )
    below += _complete(m, seeds) and m['low'] is not None and m['low'] > 0
  checks[f'>= {MIN_TASKS_BELOW} tasks below the frontier (interval above 0)'] = (
      below >= MIN_TASKS_BELOW
  )
  Path(out, 'suite.md').write_text('\n'.join(lines) + '\n')
  print('\n'.join(lines))
  for name, ok in checks.items():
    print(f"{'PASS' if ok else 'MISS'}  {name}")
  try:
    import matplotlib  # noqa: PLC0415

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # noqa: PLC0415
  except ImportError:
    print('matplotlib is not installed: no figure')
  else:
    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6))
    for ax, (t, r) in zip(np.atleast_1d(axes), results.items(), strict=True):
      study.plot(r, ax, t, arms=[x for x in REPORT_ARMS if x in r['arms']])
    fig.tight_layout()
    fig.savefig(Path(out, 'suite.png'), dpi=90)
  return 0 if all(checks.values()) else 1


def _check_names(parser, what: str, names, known) -> None:
  unknown = [n for n in names if n not in known]
  if unknown:
    parser.error(f"unknown {what} {', '.join(unknown)}: choose from {', '.join(known)}")


def _check_mergeable(parser, path: Path, seeds, ks, arm_names) -> None:
  if not path.exists():
    parser.error(f'--merge: no {path} to add these seeds to')
  old = json.loads(path.read_text())
  if list(old['ks']) != list(ks) or list(old['arm_names']) != arm_names:
    parser.error(
        f"--merge: {path} has ks {old['ks']} and arms {old['arm_names']}; pass the same "
        f'(--ks {",".join(map(str, old["ks"]))} --arms {",".join(old["arm_names"])})'
    )
  if set(old['seeds']) & set(seeds):
    parser.error(f"--merge: {path} already has seeds {old['seeds']}: add other seeds")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )
  parser.add_argument(
      '--tasks',
      default='lm,lm-small,teacher,digits',
      help=f"comma-separated, of {', '.join(TASKS)}",
  )
  parser.add_argument('--seeds', default='0,1,2', help='comma-separated seeds, all different')
  parser.add_argument(
      '--ks',
      default='1,2,3,4,6,8,12,16,24,32',
      help='the frontier: microbatches per step, 1 among them',
  )
  parser.add_argument('--arms', default=None, help='comma-separated subset of the arms')
  parser.add_argument(
      '--evals', type=positive_int, default=4, help='validation losses per run, evenly spaced'
  )
  parser.add_argument('--out', default=None, help='folder for <task>.json')
  parser.add_argument(
      '--merge',
      action='store_true',
      help='add these seeds to the <task>.json already in --out (same arms and grid)',
  )
  parser.add_argument(
      '--report',
      action='store_true',
      help='no training: the table, figure and targets from the <task>.json in --out',
  )
  args = parser.parse_args(argv)
  tasks = args.tasks.split(',')
  _check_names(parser, 'task', tasks, TASKS)
  if args.report:
    return report(Path(args.out or '.'), tasks)
  try:
    seeds = tuple(int(s) for s in args.seeds.split(','))
    ks = tuple(int(k) for k in args.ks.split(','))
  except ValueError as e:
    parser.error(f'--seeds and --ks are comma-separated integers: {e}')
  known = arms()
  names = list(known) if args.arms is None else args.arms.split(',')
  _check_names(parser, 'arm', names, known)
  if args.merge:  # before training: what --merge would refuse after it
    if args.out is None:
      parser.error('--merge adds seeds to the <task>.json in --out: give --out')
    for name in tasks:
      _check_mergeable(parser, Path(args.out, f'{name}.json'), seeds, ks, names)
  if args.out:  # before training: a folder that cannot be made fails here, not at the end
    try:
      Path(args.out).mkdir(parents=True, exist_ok=True)
    except OSError as e:
      parser.error(f'--out {args.out}: {e.strerror}')
  if min(ks) < 1 or 1 not in ks or len(set(seeds)) < len(seeds):
    parser.error('--ks are integers >= 1 with 1 among them, and --seeds differ')
  # Every task's count before any trains: a later task's too few microbatches fail here.
  built_tasks = {name: TASKS[name]() for name in tasks}
  microbatches, counts = {}, {}
  for name, task in built_tasks.items():
    microbatches[name] = functools.cache(task.microbatches)  # drawn once, kept
    count = jax.tree.leaves(microbatches[name](seeds[0]))[0].shape[0]
    if count < args.evals * max(ks):
      parser.error(
          f'{name} has {count} microbatches, too few for --evals {args.evals} and k up to '
          f'{max(ks)}: lower either'
      )
    counts[name] = count - count % args.evals  # what the study trains on
  for name in tasks if args.merge else ():  # what merge compares that --evals decides
    old = json.loads(Path(args.out, f'{name}.json').read_text()).get('microbatches')
    if old is not None and old != counts[name]:
      parser.error(
          f'--merge: {name}.json trained on {old} microbatches and --evals {args.evals} gives '
          f'{counts[name]}: pass the --evals it was run with'
      )
  for name, task in built_tasks.items():
    built = arms(counts[name])  # the ramps grow over the run's length
    chosen = {a: built[a] for a in names}
    start = time.perf_counter()

    def progress(arm, seed, rec, name=name, start=start):
      what = '' if arm == 'frontier' else f" margin {rec['margin']}"
      print(f'[{time.perf_counter() - start:6.0f} s] {name} seed {seed} {arm}{what}', flush=True)

    result = study.frontier_study(
        task.loss_fn,
        task.params,
        microbatches[name],
        eval_batches=task.eval_batches,
        arms=chosen,
        learning_rates=task.learning_rates,
        ks=ks,
        seeds=seeds,
        optimizer=optax.adamw,
        optimizer_kwargs={'weight_decay': 0.01},
        evals=args.evals,
        on_result=progress,
    )
    command = 'python benchmarks/suite.py ' + ' '.join(sys.argv[1:] if argv is None else argv)
    result.update(task=name, note=task.note, commands=[command])
    result['seconds'] = time.perf_counter() - start
    path = Path(args.out or '.', f'{name}.json')
    if args.merge:
      old = json.loads(path.read_text())
      result = {
          **study.merge(old, result),
          'task': name,
          'note': task.note,
          'commands': old.get('commands', [old.get('command')]) + [command],
          'seconds': old['seconds'] + result['seconds'],
      }
    print('\n'.join(study.table(result, f'{name}: {task.note}')), flush=True)
    if args.out:
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(result, indent=1, default=str))
  return 0


if __name__ == '__main__':
  sys.exit(main())
