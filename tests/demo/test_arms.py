"""The arms: their learning rates and their gates."""

import argparse
import math

import jax
import jax.numpy as jnp
import optax
import pytest

import optax_gqc
from optax_gqc import gates
from optax_gqc.demo import arms

pytestmark = pytest.mark.slow


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


def test_frontier_lr_follows_the_sweep_scaled_by_lr_and_the_sqrt_rule_beyond_it(monkeypatch):
  args = argparse.Namespace(lr=8.4e-3)  # twice the swept k = 1 peak
  assert arms.frontier_lr(1, args) == pytest.approx(8.4e-3)
  assert arms.frontier_lr(8, args) == pytest.approx(2 * arms.FRONTIER_LR['96x3'][8])
  assert arms.frontier_lr(4, args, '64x2') == pytest.approx(2 * arms.FRONTIER_LR['64x2'][4])
  assert arms.frontier_lr(4, args, '32x1') == arms.frontier_lr(4, args)  # not swept: 96x3's
  assert arms.frontier_lr(16, args) == pytest.approx(8.4e-3 * 4)  # not swept: sqrt(16)
  monkeypatch.delitem(arms.FRONTIER_LR['96x3'], 4)
  assert arms.arm_knobs(arms.ARMS['fixed4'], args) == {'lr': pytest.approx(8.4e-3 * 2), 'k': 4}
  assert arms.arm_knobs(arms.ARMS['critical'], args) == {'lr': 8.4e-3}


def test_seesaw_batch_grows_as_the_learning_rate_decays():
  setup = arms.Setup(microbatch=8, count=1000, warmup=0.05, weight_decay=0.01)
  spec = arms.ARMS['seesaw']
  tx = arms.make_optimizer(spec, arms.arm_knobs(spec, argparse.Namespace(lr=4.2e-3)), setup)
  state = tx.init({'w': jnp.zeros(2)})
  update = jax.jit(tx.update)
  draws = []
  for _ in range(1000):
    _, state = update({'w': jnp.ones(2)}, state, {'w': jnp.zeros(2)})
    if int(state.num_draws) == 0:
      draws.append(int(state.last_num_draws))
  shape = arms.lr_schedule(1.0, setup)
  # Where the schedule is at a fraction c of its peak, a step takes ceil(1/c) draws.
  assert draws[:50] == [1] * 50  # warmup, then the top of the cosine
  assert max(draws) == spec['max_draws'] or max(draws) == math.ceil(1 / float(shape(999)))
  assert draws == sorted(draws)  # the batch only grows
  assert len(draws) < 0.5 * 1000  # about 0.4x the steps of one microbatch a step
