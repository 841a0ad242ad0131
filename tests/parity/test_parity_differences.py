"""Deliberate differences from the references: what each does, side by side."""

import math

import pytest

torch = pytest.importorskip('torch')
gqc = pytest.importorskip('gradient_quality_control')
tsa = pytest.importorskip('torch_schedule_anything')

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import parity_common as pc  # noqa: E402
from parity_common import tsa_values  # noqa: E402

import optax_gqc  # noqa: E402
from optax_gqc import schedules  # noqa: E402
from optax_gqc.interop.torch_replay import replay  # noqa: E402

pytestmark = pytest.mark.filterwarnings('ignore:Detected call of:UserWarning')

L, M = 10, 100


def test_schedules_hold_their_final_value_past_the_end():
  steps = 3 * M
  ts = jnp.arange(steps)

  # Cosine to 0 (torch-gqc's weight decay and conventional lr): past M the
  # reference's quarter cosine goes on into negative values, down to -1 at
  # t = 2M - L; ours stays at 0.
  theirs = np.array(
      tsa_values(lambda o: tsa.cosine_annealing_with_warmup(o, 1.0, 0.0, L, M), steps)
  )
  ours = np.asarray(schedules.cosine_with_warmup(1.0, 0.0, L, M)(ts))
  assert theirs[M + 50] < -0.5 and theirs[2 * M - L] == pytest.approx(-1.0)
  assert np.all(ours[M:] == 0.0)

  # Polynomial (SBC's logical batch): with power 2 the reference turns back
  # and climbs to the warmup value again at t = 2M - L.
  theirs = np.array(
      tsa_values(lambda o: tsa.polynomial_schedule_with_warmup(o, 1.0, 0.1, L, M, 2.0), steps)
  )
  ours = np.asarray(schedules.polynomial_with_warmup(1.0, 0.1, L, M, 2.0)(ts))
  assert theirs[2 * M - L] == pytest.approx(1.0) and theirs[2 * M - L] > theirs[M]
  assert np.all(ours[M:] == np.float32(0.1))

  # With a fractional power, a negative base: the reference's value turns complex.
  theirs = tsa_values(lambda o: tsa.polynomial_schedule_with_warmup(o, 1.0, 0.1, L, M, 0.5), steps)
  assert all(isinstance(v, float) for v in theirs[: M + 1])
  assert all(isinstance(v, complex) and v.imag > 0 for v in theirs[M + 1 :])
  ours = np.asarray(schedules.polynomial_with_warmup(1.0, 0.1, L, M, 0.5)(ts))
  assert np.all(ours[M:] == np.float32(0.1))


def _nan_stream():
  stream = [dict(g) for g in pc.noisy_stream()[:40]]
  stream[5] = {k: v.at[(0,) * v.ndim].set(jnp.nan) for k, v in stream[5].items()}
  return stream


def test_nan_microbatch_poisons_torch_gqc_and_is_rejected_here():
  threshold, max_draws = 1.5, 12
  stream = _nan_stream()

  def torch_side(ps):
    wrapper = gqc.OptimizerWrapperGNTS(pc.torch_adamw(ps), max_batch_draws=max_draws)
    for group in wrapper.param_groups:
      group['gradient_norm_threshold'] = threshold
    return wrapper

  records = replay(
      torch_side,
      optax_gqc.gnts(pc.OPTAX_ADAMW, threshold, max_draws=max_draws),
      pc.initial_params(),
      stream,
  )
  before = records[4]
  nan_step = next(i for i, r in enumerate(records[5:], 5) if r.torch_stepped)

  # torch-gqc: the NaN goes into .grad; NaN <= threshold is False, so the gate
  # cannot open and the wrapper waits for max_draws, then steps AdamW on a NaN
  # mean: the poisoned entries stay NaN for good, last_grad_norm is NaN.
  assert nan_step == 5 - before.torch_stats['num_draws'] + max_draws - 1
  assert math.isnan(records[nan_step].torch_stats['last_grad_norm'])
  assert records[nan_step].torch_stats['last_num_draws'] == max_draws
  last = records[-1]
  for v in last.torch_params.values():
    assert np.isnan(v.flat[0]) and np.isfinite(v.flat[1:]).all()

  # Ours: the microbatch is rejected; counters, accumulator and schedule clock
  # stand still for it, and training goes on with finite parameters.
  assert records[5].optax_stats['num_skipped'] == 1
  assert records[5].optax_stats['num_draws'] == before.optax_stats['num_draws']
  assert records[5].optax_stats['num_microbatches'] == before.optax_stats['num_microbatches'] == 5
  assert records[5].torch_stats['num_batches'] == 6
  assert all(np.isfinite(v).all() for v in last.optax_params.values())
  assert last.optax_stats['num_microbatches'] == last.torch_stats['num_batches'] - 1


def test_bf16_gradients_are_summed_in_float32():
  k, dim = 16, 256
  rng = np.random.default_rng(0)
  stream = [{'w': jnp.asarray(rng.normal(size=dim) + 3.0, jnp.bfloat16)} for _ in range(k)]
  exact = np.mean([np.asarray(g['w'], np.float64) for g in stream], axis=0)

  def torch_side(ps):  # steps once, on the mean of all k microbatches
    wrapper = gqc.OptimizerWrapperSBC(torch.optim.SGD(ps, lr=1.0), 1, max_batch_draws=k)
    for group in wrapper.param_groups:
      group['logical_batch_size'] = k
    return wrapper

  records = replay(
      torch_side, optax_gqc.sbc(optax.sgd(1.0), k, 1), {'w': jnp.zeros(dim, jnp.bfloat16)}, stream
  )
  last = records[-1]
  assert last.torch_stepped and last.optax_stepped
  theirs = -np.asarray(last.torch_params['w'], np.float64)  # params start at 0, lr 1
  ours = -np.asarray(last.optax_params['w'], np.float64)
  rounded = np.asarray(jnp.asarray(exact, jnp.bfloat16), np.float64)
  # torch-gqc accumulates in .grad, in bf16: the mean is off by a few bf16 ulps.
  # Ours sums in float32 and rounds the mean once: every entry is the bf16
  # nearest the exact mean.
  assert np.all(ours == rounded)
  assert np.mean(theirs == rounded) < 0.75
  assert np.max(np.abs(theirs - exact)) > 2 * np.max(np.abs(ours - exact))
  norm = np.linalg.norm(exact)
  assert last.optax_stats['last_grad_norm'] == pytest.approx(norm, rel=1e-6)
  assert last.torch_stats['last_grad_norm'] != pytest.approx(norm, rel=1e-3)


def test_statistics_before_the_first_step():
  def torch_side(ps):
    wrapper = gqc.OptimizerWrapperGNTS(pc.torch_sgd(ps))
    for group in wrapper.param_groups:
      group['gradient_norm_threshold'] = 1e-3  # too low to open in three microbatches
    return wrapper

  records = replay(
      torch_side, optax_gqc.gnts(pc.OPTAX_SGD, 1e-3), pc.initial_params(), pc.noisy_stream()[:3]
  )
  r = records[-1]
  assert not r.torch_stepped and not r.optax_stepped
  # torch-gqc keeps None, and statistics() leaves such entries out; ours are 0.
  assert 'last_grad_norm' not in r.torch_stats and 'last_num_draws' not in r.torch_stats
  assert r.optax_stats['last_grad_norm'] == 0.0 and r.optax_stats['last_num_draws'] == 0


def test_gnr_on_a_gradient_whose_squares_flush_to_zero():
  g = np.array([1.0, -2.0, 2.0], np.float32) * np.float32(1e-25)  # norm 3e-25
  p = torch.nn.Parameter(torch.zeros(3))
  wrapper = gqc.OptimizerWrapperGNR(torch.optim.SGD([p], lr=1.0))  # target 1.0
  p.grad = torch.tensor(g)
  wrapper.step()
  assert not p.detach().any()  # torch-gqc: a norm of 0, a multiplier of 0
  tx = optax_gqc.gnr(optax.sgd(1.0), target=1.0)
  updates, _ = tx.update({'p': jnp.asarray(g)}, tx.init({'p': jnp.zeros(3)}))
  np.testing.assert_allclose(updates['p'], -g / np.linalg.norm(g.astype(np.float64)), rtol=1e-6)


def test_a_bare_gnts_has_a_threshold_of_one_and_gnts_with_none_follows_the_noise():
  wrapper = gqc.OptimizerWrapperGNTS(pc.torch_sgd([torch.nn.Parameter(torch.zeros(3))]))
  assert wrapper.statistics()['gradient_norm_threshold'] == 1.0
  stats = optax_gqc.statistics(optax_gqc.gnts(pc.OPTAX_SGD).init({'w': jnp.zeros(3)}))
  assert 'threshold' not in stats and 'target_batch_size' in stats  # the noise-following gate
  stats = optax_gqc.statistics(optax_gqc.gnts(pc.OPTAX_SGD, 1.0).init({'w': jnp.zeros(3)}))
  assert float(stats['threshold']) == 1.0  # torch-gqc's bare wrapper, as a port writes it
