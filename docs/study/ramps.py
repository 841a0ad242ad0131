"""The default against batch ramps: docs/study.md, hypothesis 14.

Reads the ``<task>.json`` that ``benchmarks/suite.py --arms gnts,ramp4,...``
wrote, and gives the default's margin on each seed against three frontiers,
each read at the default's steps as the study reads the fixed one: the
fixed batches' (as ``suite.py`` reports it), the ramps' (each ``rampK`` at the
control's rate, as the default runs), and the lower of the two.

  python docs/study/ramps.py DIR/teacher.json DIR/digits.json ...

A task's second file adds its ramps to the first's (the same seeds and grid,
so the same frontier and default, to the bit).
"""

import json
import sys

from optax_gqc import study


def margins(result):
  """Per seed: the default's margins against the fixed, ramp and lower frontiers."""
  rows = []
  for seed in result['seeds']:
    frontier = result['frontier'][str(seed)]
    control_lr = frontier['1']['lr']
    at_control = [r for r in result['runs'] if r['seed'] == seed and r['lr'] == control_lr]
    gnts = next(r for r in at_control if r['arm'] == 'gnts')
    fixed = [(p['steps'], p['val_loss']) for p in frontier.values()]
    ramps = [
        (r['num_steps'], r['val_loss'])
        for r in at_control
        if r['arm'].startswith('ramp') and r['num_steps'] > 0
    ]
    at = {
        'fixed': study.frontier_loss_at(fixed, gnts['num_steps']),
        'ramps': study.frontier_loss_at(ramps, gnts['num_steps']),
    }
    known = [x for x in at.values() if x is not None]
    at['lower'] = min(known) if known else None
    rows.append({k: None if v is None else v - gnts['val_loss'] for k, v in at.items()})
  return rows


def _by_task(paths):
  """The studies by task; a task's later files add their ramps' runs to its first."""
  tasks = {}
  for path in paths:
    result = json.loads(open(path).read())
    first = tasks.setdefault(result['task'], result)
    if first is not result:
      first['runs'] = first['runs'] + [r for r in result['runs'] if r['arm'].startswith('ramp')]
  return tasks


def main(paths):
  print('task'.ljust(12) + ''.join(x.ljust(33) for x in ('fixed', 'ramps', 'the lower')).rstrip())
  for result in _by_task(paths).values():
    rows = margins(result)
    cells = []
    for name in ('fixed', 'ramps', 'lower'):
      m = study.paired_interval([r[name] for r in rows])
      if m['mean'] is None:  # the default's steps outside the frontier's
        cells.append('-'.ljust(33))
        continue
      low, high = m['low'], m['high']
      interval = '' if low is None else f' [{low:+.3f}, {high:+.3f}]'
      seeds = '' if m['n'] == len(rows) else f", {m['n']} of {len(rows)} seeds"
      cells.append(f"{m['mean']:+.3f}{interval} ({m['min']:+.3f}{seeds})".ljust(33))
    print(f"{result['task']:<12}" + ''.join(cells).rstrip())
  print('the default against each frontier: mean margin [paired 95% interval] (worst seed)')


if __name__ == '__main__':
  main(sys.argv[1:])
