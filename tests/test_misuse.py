"""A catalogue of misuses a new user would try, and what each gives.

At construction and at the first trace, a misuse raises an error that names
the argument and the fix. At run time under ``jax.jit``, where nothing can
raise, a bad value has a documented safe behaviour and is counted in
``statistics``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from optax_gqc import gates

PARAMS = {'w': jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), 'b': jnp.ones(3)}


def grads(num, seed=0):
  keys = jax.random.split(jax.random.key(seed), num)
  return [jax.tree.map(lambda p, k=k: jax.random.normal(k, p.shape), PARAMS) for k in keys]


def run_stats(tx, num=6, values=None, state_hook=None):
  """Runs ``tx`` under jit; returns statistics after each microbatch."""
  update = jax.jit(tx.update)
  state = tx.init(PARAMS)
  out = []
  for i, g in enumerate(grads(num)):
    if state_hook is not None:
      state = state_hook(i, state)
    extra = {} if values is None else {'value': values[i]}
    _, state = update(g, state, PARAMS, **extra)
    out.append(jax.tree.map(np.asarray, optax_gqc.statistics(state)))
  return out


# ---------------------------------------------------------------------------
# Run time: nothing can raise under jit. A hyperparameter out of its domain
# closes the gate that reads it (max_draws then forces the steps, counted in
# num_forced) and counts in num_bad_hyperparams.


def constant(v):
  """A schedule that returns ``v``: out of its domain, it reaches the gate at run time."""
  return lambda t: jnp.float32(v)


# gate(hyperparameter schedule), a value that opens it on every microbatch or two, bad values
BAD_AT_RUN_TIME = {
    'norm_below': (lambda v: gates.norm_below(v), 1e9, [np.nan, -1.0]),
    'norm_below_relative': (lambda v: gates.norm_below(v, relative=True), 1e9, [np.nan, -0.5]),
    'batch_size_at_least': (lambda v: gates.batch_size_at_least(v, 1), 1.0, [np.nan, -8.0]),
    'critical_batch': (
        lambda v: gates.critical_batch(v, 1, max_batch_size=2),
        1.0,
        [np.nan, 0.0, -1.0],
    ),
    'noise_ratio_below': (lambda v: gates.noise_ratio_below(v), 1e9, [np.nan, -1.0]),
    'relative_error_below': (lambda v: gates.relative_error_below(v), 1e9, [np.nan, -1.0]),
    'loss_confidence': (lambda v: gates.loss_interval(v, 1e9), 0.5, [np.nan, 1.0, 95.0, -0.1]),
    'loss_percent_error': (lambda v: gates.loss_interval(0.5, v), 1e9, [np.nan, -0.1]),
}


LOSSES = [1.0] * 6  # constant: the loss gate's interval is tight at once


@pytest.mark.parametrize('name', sorted(BAD_AT_RUN_TIME))
def test_a_good_value_opens_the_gate(name):
  make, good, _ = BAD_AT_RUN_TIME[name]
  tx = optax_gqc.accumulate(optax.sgd(0.1), make(constant(good)), max_draws=3)
  out = run_stats(tx, values=LOSSES)
  assert int(out[-1]['num_steps']) >= 3 and int(out[-1]['num_forced']) == 0
  assert int(out[-1]['num_bad_hyperparams']) == 0


@pytest.mark.parametrize(
    'name, bad',
    [(name, bad) for name, (_, _, bads) in sorted(BAD_AT_RUN_TIME.items()) for bad in bads],
)
def test_a_bad_value_at_run_time_closes_the_gate_and_is_counted(name, bad):
  make, _, _ = BAD_AT_RUN_TIME[name]
  tx = optax_gqc.accumulate(optax.sgd(0.1), make(constant(bad)), max_draws=3)
  out = run_stats(tx, values=LOSSES)
  assert [int(s['num_steps']) for s in out] == [0, 0, 1, 1, 1, 2]  # forced by max_draws
  assert int(out[-1]['num_forced']) == 2
  assert [int(s['num_bad_hyperparams']) for s in out] == [1, 2, 3, 4, 5, 6]


def test_a_schedule_that_turns_nan_mid_run_is_counted_while_it_lasts():
  threshold = lambda t: jnp.where((t >= 2) & (t < 5), jnp.nan, 1e9)  # noqa: E731
  out = run_stats(optax_gqc.gnts(optax.sgd(0.1), threshold, max_draws=2), num=7)
  assert [int(s['num_steps']) for s in out] == [1, 2, 2, 3, 3, 4, 5]
  assert [int(s['num_bad_hyperparams']) for s in out] == [0, 0, 1, 2, 3, 3, 3]
  assert int(out[-1]['num_forced']) == 1  # microbatch 3; 4 steps only when 5 reopens it


def test_an_injected_nan_threshold_is_counted_and_forced():
  tx = optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(0.1), threshold=1e9, max_draws=2)

  def poison(i, state):
    if i == 2:
      state.hyperparams['threshold'] = jnp.asarray(jnp.nan)
    return state

  out = run_stats(tx, num=6, state_hook=poison)
  assert [int(s['num_steps']) for s in out] == [1, 2, 2, 3, 3, 4]
  assert int(out[-1]['num_forced']) == 2
  assert int(out[-1]['num_bad_hyperparams']) == 4
  assert np.isnan(out[-1]['threshold'])


def test_an_injected_max_draws_below_one_steps_every_microbatch_and_is_counted():
  tx = optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(0.1), threshold=0.0, max_draws=4)

  def zero(i, state):
    state.hyperparams['max_draws'] = jnp.asarray(0 if i >= 2 else 4, jnp.int32)
    return state

  out = run_stats(tx, num=5, state_hook=zero)
  assert [int(s['num_steps']) for s in out] == [0, 0, 1, 2, 3]
  assert [int(s['num_bad_hyperparams']) for s in out] == [0, 0, 1, 2, 3]
  assert int(out[2]['last_num_draws']) == 3 and int(out[-1]['last_num_draws']) == 1


def test_an_injected_nan_noise_decay_keeps_the_estimates_and_is_counted():
  def make():
    return optax.inject_hyperparams(optax_gqc.accumulate)(
        optax.sgd(0.1), gates.batch_size_at_least(2, 1)
    )

  tx = make()

  def poison(i, state):
    if i == 4:
      state.hyperparams['noise_decay'] = jnp.asarray(jnp.nan)
    return state

  ref = run_stats(make(), num=6)
  out = run_stats(tx, num=6, state_hook=poison)
  assert float(out[3]['noise_scale']) == float(ref[3]['noise_scale'])
  # The step at microbatch 5 folds no estimate: the noise scale stays finite, as it was.
  assert float(out[-1]['noise_scale']) == float(out[3]['noise_scale'])
  assert float(ref[-1]['noise_scale']) != float(ref[3]['noise_scale'])
  assert int(out[-1]['num_bad_hyperparams']) == 2 and int(ref[-1]['num_bad_hyperparams']) == 0


def test_sbc_with_no_max_draws_waits_out_a_nan_batch_size():
  # With no max_draws nothing forces a step: the accumulation waits until the
  # schedule is valid again, and counts the wait.
  batch = lambda t: jnp.where(t < 3, jnp.nan, 1.0)  # noqa: E731
  out = run_stats(optax_gqc.sbc(optax.sgd(0.1), batch, 1), num=5)
  assert [int(s['num_steps']) for s in out] == [0, 0, 0, 1, 2]
  assert int(out[3]['last_num_draws']) == 4
  assert int(out[-1]['num_bad_hyperparams']) == 3


def test_a_nan_loss_with_finite_gradients_is_rejected_by_the_loss_gate():
  # Constant losses: the interval is tight at once, a step on every microbatch.
  # A NaN loss is left out: it neither blocks the gate until max_draws (as it
  # would if it entered the loss EMA) nor opens it.
  tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.1, max_draws=20)
  out = run_stats(tx, num=5, values=[1.0, jnp.nan, 1.0, jnp.inf, 1.0])
  assert [int(s['num_steps']) for s in out] == [1, 1, 2, 2, 3]
  assert [int(s['last_num_draws']) for s in out][-1] == 2
  assert int(out[-1]['num_skipped_losses']) == 2
  assert int(out[-1]['num_forced']) == 0 and int(out[-1]['num_skipped']) == 0
  assert float(out[-1]['loss_ema']) == 1.0


def test_only_nan_losses_keep_the_loss_gate_closed_until_max_draws():
  tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.1, max_draws=3)
  out = run_stats(tx, num=3, values=[jnp.nan] * 3)
  assert [int(s['num_steps']) for s in out] == [0, 0, 1]
  assert int(out[-1]['num_forced']) == 1 and int(out[-1]['num_skipped_losses']) == 3
