"""The study's second size against a frontier swept at that size.

    python docs/research/frontier_64x2.py

Reads the study (docs/demo/results.json, run at --lr 4.2e-3) and the sweep of
the fixed arms at width 64 x 2 layers (sweep-64x2.json, beside this file),
takes each fixed arm at its best learning rate (mean over seeds 0 and 1), and
prints the adaptive arms' margins against that frontier, interpolated linearly
in log steps as the demo interpolates it.
"""

import json
import math
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
FIXED = ('control', 'fixed2', 'fixed3', 'fixed4', 'fixed8')
ADAPTIVE = ('critical', 'gnts', 'seesaw', 'warmup')


def main():
  study = json.loads((HERE.parent / 'demo' / 'results.json').read_text())
  arms = next(s for s in study['summary'] if s['size'] == '64x2')['arms']
  runs = json.loads((HERE / 'sweep-64x2.json').read_text())['runs']
  runs['4.2e-3'] = {arm: arms[arm] for arm in FIXED}
  best = {arm: min((run[arm]['val_loss'], lr) for lr, run in runs.items()) for arm in FIXED}
  for arm in FIXED:
    row = '  '.join(f"{lr} {runs[lr][arm]['val_loss']:.4f}" for lr in sorted(runs, key=float))
    print(f'{arm:8s} {row}   best at {best[arm][1]}')
  points = sorted((arms[arm]['steps'], best[arm][0]) for arm in FIXED)
  for arm in ADAPTIVE:
    steps, loss = arms[arm]['steps'], arms[arm]['val_loss']
    for (s0, l0), (s1, l1) in zip(points, points[1:], strict=False):
      if s0 <= steps <= s1:
        frontier = l0 + (l1 - l0) * math.log(steps / s0) / math.log(s1 / s0)
    print(
        f'{arm:8s} {loss:.4f} at {steps:.0f} steps, swept frontier {frontier:.4f}, '
        f'margin {frontier - loss:+.4f}, {loss - best["control"][0]:+.4f} vs the best control'
    )


if __name__ == '__main__':
  main()
