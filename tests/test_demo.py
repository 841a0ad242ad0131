"""The main job runs end to end and GNTS accumulates in it."""

import math

from optax_gqc import demo


def test_demo_runs_and_gnts_accumulates(capsys):
  results = demo.main(['--microbatches', '200'])
  out = capsys.readouterr().out
  assert 'threshold' in out and 'draws/step' in out
  gnts, adamw = results
  assert adamw['steps'] == 200 and adamw['draws_per_step'] == 1.0
  assert 0 < gnts['steps'] < 200 and gnts['draws_per_step'] > 1.0
  for r in results:
    assert math.isfinite(r['val_loss']) and 0.0 <= r['val_acc'] <= 1.0
