"""The margins against each seed's frontier as measured, and against its lower envelope.

    python docs/study/envelope.py docs/study/teacher.json docs/study/digits.json ...

A frontier as measured can rise where fewer steps (a larger fixed batch) did
better than more: its loss at ``s`` steps is then not the best a fixed batch
with at most ``s`` steps reached. The envelope is that best: each point's loss
the lowest of the points with as many steps or fewer. Prints, for each arm of
each study, the paired margin and its 95% interval both ways.
"""

import json
import sys

import numpy as np

from optax_gqc import study


def margins(result, arm, envelope):
  """The arm's margin on each seed, against the frontier or its envelope."""
  out = []
  for p in result['arms'][arm]['per_seed']:
    frontier = result['frontier'][str(p['seed'])].values()
    steps, losses = zip(*sorted((v['steps'], v['val_loss']) for v in frontier), strict=True)
    if envelope:
      losses = np.minimum.accumulate(losses)
    at = None
    if p['steps'] is not None:
      at = study.frontier_loss_at(list(zip(steps, losses, strict=True)), p['steps'])
    out.append(None if at is None or p['val_loss'] is None else at - p['val_loss'])
  return out


def main(paths):
  print(f"{'task':9s} {'arm':16s} {'as measured':>24s} {'against the envelope':>24s}")
  for path in paths:
    result = json.load(open(path))
    for arm in result['arms']:
      cells = []
      for envelope in (False, True):
        m = study.paired_interval(margins(result, arm, envelope))
        low = '-' if m['low'] is None else f"{m['low']:+.3f}, {m['high']:+.3f}"
        cells.append(f"{m['mean']:+.3f} [{low}]" if m['mean'] is not None else '-')
      print(f"{result.get('task', path):9s} {arm:16s} {cells[0]:>24s} {cells[1]:>24s}")


if __name__ == '__main__':
  main(sys.argv[1:])
