"""The main job: the demo's quick run end to end, and its relative-threshold gate."""

import json
import math

import jax
import jax.numpy as jnp
import optax
import pytest

import optax_gqc
from optax_gqc import demo, gates

pytestmark = pytest.mark.slow


def test_demo_quick_run_writes_a_complete_table(tmp_path, capsys):
  payload = demo.main(['--quick', '--no-progress', '--out', str(tmp_path)])
  out = capsys.readouterr().out
  for name in ('curves.png', 'results.json', 'table.txt'):
    assert (tmp_path / name).stat().st_size > 0
  saved = json.loads((tmp_path / 'results.json').read_text())
  assert set(saved['arms']) == {'control', 'fixed', 'gnts'}
  table = (tmp_path / 'table.txt').read_text().splitlines()
  assert len(table) == 4 and table[0].split()[:3] == ['arm', 'val', 'loss']
  budget = {a['summary']['tokens'] for a in payload['arms'].values()}
  assert len(budget) == 1  # the same token budget for every arm
  for arm in payload['arms'].values():
    summary = arm['summary']
    assert math.isfinite(summary['val_loss']) and summary['val_loss'] < math.log(256)
    assert summary['steps'] >= 1 and summary['draws_per_step'] >= 1.0
  assert payload['arms']['control']['summary']['draws_per_step'] == 1.0
  for name in ('gnts', 'fixed'):  # the draws of every step add up to the microbatches used
    arm = payload['arms'][name]
    draws = [d for _, d in arm['draws_at_steps']]
    assert len(draws) == arm['summary']['steps']
    last_step_microbatch = arm['draws_at_steps'][-1][0]
    assert sum(draws) == last_step_microbatch
  assert (
      payload['arms']['gnts']['summary']['steps'] < payload['arms']['control']['summary']['steps']
  )
  assert 'val loss' in out and 'draws/step' in out


def test_demo_is_deterministic(tmp_path):
  runs = [
      demo.main(['--quick', '--no-progress', '--arms', 'gnts', '--out', str(tmp_path / k)])
      for k in 'ab'
  ]
  assert runs[0]['arms']['gnts']['curve'] == runs[1]['arms']['gnts']['curve']


def test_demo_trains_on_a_users_file(tmp_path):
  text = tmp_path / 'text.txt'
  text.write_text('the quick brown fox jumps over the lazy dog. ' * 2000)
  payload = demo.main(
      [
          '--quick',
          '--no-progress',
          '--arms',
          'control',
          '--data',
          str(text),
          '--out',
          str(tmp_path / 'out'),
      ]
  )
  assert payload['corpus_files'] == [str(text)]
  assert payload['arms']['control']['summary']['val_loss'] < 2.0  # easy, repetitive text


def test_demo_rejects_unknown_arms(tmp_path):
  with pytest.raises(SystemExit, match='unknown arms'):
    demo.main(['--quick', '--arms', 'control,sgd', '--out', str(tmp_path)])


def test_relative_threshold_follows_the_microbatch_norms():
  tx = optax_gqc.accumulate(
      optax.sgd(0.0), gates.norm_below(0.5, relative=True, decay=0.0), max_draws=50
  )
  params = {'w': jnp.zeros(40)}
  state = tx.init(params)
  update = jax.jit(tx.update)
  for scale in (1.0, 100.0):  # the unit follows the gradients' scale
    steps_before = int(state.num_steps)
    draws = 0
    while int(state.num_steps) == steps_before:
      g = {'w': scale * jax.random.normal(jax.random.key(draws + int(scale)), (40,))}
      _, state = update(g, state, params)
      draws += 1
    stats = optax_gqc.statistics(state)
    # Pure noise: |mean| ~ |g| / sqrt(n), so a ratio of 0.5 needs about 4 draws.
    assert 3 <= draws <= 8
    assert float(stats['threshold']) == pytest.approx(0.5 * float(stats['grad_norm_ema']), rel=1e-6)
    assert float(stats['grad_norm_ema']) == pytest.approx(
        float(jnp.linalg.norm(g['w'])), rel=1e-6
    )  # beta 0: the latest microbatch norm


def test_relative_threshold_in_the_signal_dominated_regime_needs_the_valve():
  signal = jnp.ones(40)
  grads = [{'w': signal + 0.01 * jax.random.normal(jax.random.key(i), (40,))} for i in range(6)]
  params = {'w': jnp.zeros(40)}

  def steps(gate):
    tx = optax_gqc.accumulate(optax.sgd(0.0), gate, max_draws=6)
    state = tx.init(params)
    for g in grads:
      _, state = jax.jit(tx.update)(g, state, params)
    return int(state.num_steps), int(state.last_num_draws)

  relative = gates.norm_below(0.5, relative=True)
  assert steps(relative) == (1, 6)  # the mean cannot get shorter than the signal: max_draws
  assert steps(gates.any_of(relative, gates.relative_error_below(0.8))) == (3, 2)  # steps promptly
