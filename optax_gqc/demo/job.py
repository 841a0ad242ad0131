"""The main job: every size, seed and arm, then the table, ``results.json`` and the figures."""

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from optax_gqc.demo.arms import ARMS, size_name
from optax_gqc.demo.cli import parse_args
from optax_gqc.demo.data import load_corpus, sample_batches
from optax_gqc.demo.model import CharTransformer
from optax_gqc.demo.plot import plot_curves, plot_study
from optax_gqc.demo.train import CTRL_C, plan, run_arm
from optax_gqc.demo.verdict import summarize, table

VAL_BATCHES, VAL_SEQUENCES = 8, 32  # the validation windows, the same for every seed
VAL_SEED = 12345


def run_all(args, data, run_plan, runs: list) -> None:
  """Every size, seed and arm, appending to ``runs`` as arms finish (so Ctrl-C keeps them)."""
  split = int(0.9 * len(data))
  val = sample_batches(data[split:], VAL_BATCHES * VAL_SEQUENCES, 1, args.context, VAL_SEED)
  val = jnp.asarray(val.reshape(VAL_BATCHES, VAL_SEQUENCES, -1), jnp.int32)
  for size in args.sizes:
    model = CharTransformer(size[0], size[1], args.heads, args.context, nnx.Rngs(0))
    parameters = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    for seed in args.seeds:
      train = sample_batches(data[:split], run_plan.count, args.microbatch, args.context, seed)
      print(f'model {size_name(size)} ({parameters / 1e6:.2f}M parameters), seed {seed}')
      run = {'size': size_name(size), 'parameters': parameters, 'seed': seed, 'arms': {}}
      runs.append(run)
      for name in args.arms:
        spec = dict(ARMS[name])
        if args.max_draws is not None and 'max_draws' in spec:
          spec['max_draws'] = args.max_draws
        run['arms'][name] = run_arm(name, spec, args, size, seed, train, val, run_plan)
      del train  # freed before the next seed's microbatches are sampled


def _write(path: Path, text: str) -> None:
  """Writes ``path`` whole or not at all (a full disk leaves the earlier file as it was)."""
  partial = path.with_name(path.name + '.partial')
  partial.write_text(text)
  partial.replace(path)


@contextlib.contextmanager
def ctrl_c_kept() -> Iterator[None]:
  """Ctrl-C raises KeyboardInterrupt, and is kept for the train loop's next check.

  Python drops a KeyboardInterrupt raised inside a garbage-collector callback
  (JAX runs one often while it traces), and the run went on as if no Ctrl-C
  had come: :func:`optax_gqc.demo.train.check_ctrl_c` raises it again.
  """
  # Signals reach the main thread alone; an ignored SIGINT (a background job's) or a
  # caller's own handler is left as it is.
  main_thread = threading.current_thread() is threading.main_thread()
  if not main_thread or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    yield
    return

  def on_ctrl_c(signum, frame):
    CTRL_C.set()
    raise KeyboardInterrupt

  CTRL_C.clear()
  previous = signal.signal(signal.SIGINT, on_ctrl_c)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
    CTRL_C.clear()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Runs the demo; returns what it writes to ``results.json``.

  On Ctrl-C it keeps the arms that finished and raises ``SystemExit(130)``.
  XLA may then still be compiling in a thread of its own, and a process
  that exits normally under it can crash: ``python -m optax_gqc.demo``
  leaves with ``os._exit(130)``, and a script that calls this may do the same.
  """
  with ctrl_c_kept():
    return _main(argv)


def _main(argv: Sequence[str] | None) -> dict[str, Any]:
  start = time.perf_counter()
  args = parse_args(argv)
  out = Path(args.out)
  runs: list[dict[str, Any]] = []
  interrupted, source, run_plan = False, [], None
  try:
    data, source = load_corpus(args.data, args.corpus_bytes)
    tokens_per_micro = args.microbatch * args.context
    run_plan = plan(args.tokens, tokens_per_micro, args.evals, args.block)
    files = f"{len(source)} file{'' if len(source) == 1 else 's'}"
    print(
        f'{len(data) / 1e6:.2f} MB of text ({files}); {len(args.arms)} arms x '
        f'{len(args.seeds)} seeds x {len(args.sizes)} sizes; {run_plan.count} microbatches of '
        f'{args.microbatch} x {args.context} bytes per arm ({run_plan.count * tokens_per_micro} '
        f'tokens), in blocks of {run_plan.block}'
    )
    run_all(args, data, run_plan, runs)
  except KeyboardInterrupt:  # the arm cut short was never added
    interrupted = True
    runs = [r for r in runs if r['arms']]
  cut_short = interrupted  # an arm, not a figure
  if not runs:
    print('interrupted: no arm finished, nothing written', file=sys.stderr)
    raise SystemExit(130)

  summaries = summarize(runs, args.arms)
  lines = []
  for s in summaries:
    lines += [*table(s), s['verdict_line'], '']
  finished = sum(len(r['arms']) for r in runs)
  if interrupted:
    asked = len(args.arms) * len(args.seeds) * len(args.sizes)
    lines += [
        f'interrupted: {finished} of {asked} arm runs finished; the table leaves out the others '
        'and any seed they leave incomplete',
        '',
    ]
  first = runs[0]
  payload = {
      'config': {**vars(args), 'count': run_plan.count, 'block': run_plan.block},
      'corpus_files': source,
      'interrupted': interrupted,
      'arms': first['arms'],  # the first run's: arms_of says which; runs has them all
      'arms_of': {'size': first['size'], 'seed': first['seed']},
      'frontier': summaries[0]['frontier'],
      'verdict': {s['size']: s['verdict'] for s in summaries},
      'verdict_lines': [s['verdict_line'] for s in summaries],
      'summary': summaries,
      'runs': runs,
      'device': jax.devices()[0].platform,
  }
  arm_summaries = [a['summary'] for r in runs for a in r['arms'].values()]
  train_s = sum(a['seconds'] for a in arm_summaries)
  compile_s = sum(a['compile_seconds'] for a in arm_summaries)
  # The results first: a figure that fails must not take them with it.
  _write(out / 'table.txt', '\n'.join(lines))
  _write(out / 'results.json', json.dumps(payload, indent=1))
  print('\n' + '\n'.join(lines[:-1]))
  figures = {'curves.png': lambda path: plot_curves(first, path)}
  if args.study:
    figures['study.png'] = lambda path: plot_study(runs, summaries, path)
  written = ['table.txt', 'results.json']
  for name in ('curves.png', 'study.png'):  # an earlier run's would read as this run's
    (out / name).unlink(missing_ok=True)
  for name, draw in figures.items():
    try:
      draw(out / name)
      written.append(name)
    except KeyboardInterrupt:  # the results are written; say they end here
      interrupted = payload['interrupted'] = True
      print(f'interrupted: {out / name} not drawn', file=sys.stderr)
      break
    except Exception as e:  # noqa: BLE001 -- no matplotlib, a full disk: the results stand
      print(f'could not draw {out / name}: {type(e).__name__}: {e}', file=sys.stderr)
  # Since main began: the arms, and the rest (the text, each model's first build, the plots).
  total_s = time.perf_counter() - start
  payload['seconds'] = {'training': train_s, 'compiling': compile_s, 'total': total_s}
  _write(out / 'results.json', json.dumps(payload, indent=1))  # again, with the time
  print(
      f'time: {train_s:.0f} s training, {compile_s:.0f} s compiling (and the first evaluation): '
      f'{compile_s / max(train_s + compile_s, 1e-9):.0%} compiling; {total_s:.0f} s in all '
      '(the rest: reading the text, building the models, plotting'
      f"{', the arm cut short' if cut_short else ''})"
  )
  print(f"wrote {', '.join(str(out / w) for w in written)}")
  if interrupted:
    print(f'interrupted: kept the arms that finished ({finished})', file=sys.stderr)
    raise SystemExit(130)
  return payload
