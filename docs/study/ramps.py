"""The default against batch ramps: docs/study.md, hypothesis 14.

Reads the ``<task>.json`` that ``benchmarks/suite.py --arms gnts,ramp4,...``
wrote, and gives the default's margin on each seed against three frontiers,
each read at the default's steps as the study reads the fixed one: the
fixed batches' (as ``suite.py`` reports it), the ramps' (each ``rampK`` at the
control's rate, as the default runs), and the lower of the two.

  python docs/study/ramps.py DIR/teacher.json DIR/digits.json ...
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


def main(paths):
  print('task'.ljust(12) + ''.join(x.ljust(33) for x in ('fixed', 'ramps', 'the lower')).rstrip())
  for path in paths:
    result = json.loads(open(path).read())
    rows = margins(result)
    cells = []
    for name in ('fixed', 'ramps', 'lower'):
      m = study.paired_interval([r[name] for r in rows])
      low, high = m['low'], m['high']
      interval = '' if low is None else f' [{low:+.3f}, {high:+.3f}]'
      cells.append(f"{m['mean']:+.3f}{interval} ({m['min']:+.3f})".ljust(33))
    print(f"{result['task']:<12}" + ''.join(cells).rstrip())
  print('the default against each frontier: mean margin [paired 95% interval] (worst seed)')


if __name__ == '__main__':
  main(sys.argv[1:])
