"""GNTS, SBC and GNR against torch-gqc's wrappers, microbatch by microbatch."""

import pytest

torch = pytest.importorskip('torch')
gqc = pytest.importorskip('gradient_quality_control')
tsa = pytest.importorskip('torch_schedule_anything')

import parity_common as pc  # noqa: E402

import optax_gqc  # noqa: E402
from optax_gqc import schedules  # noqa: E402
from optax_gqc.interop.torch_replay import replay  # noqa: E402

pytestmark = pytest.mark.filterwarnings('ignore:Detected call of:UserWarning')

THRESHOLD, MAX_DRAWS = 1.5, 12
MICROBATCH = 16
BATCH = (32.0, 208.0, 20, pc.NUM_MICROBATCHES)  # warm up to 32 examples, then grow to 208
TARGET = 0.7
COMMON = {
    **{k: k for k in ('num_draws', 'num_steps', 'last_num_draws', 'last_grad_norm')},
    'num_batches': 'num_microbatches',
}

OPTAX_GNTS = {
    k: optax_gqc.gnts(o, THRESHOLD, max_draws=MAX_DRAWS) for k, (_, o) in pc.INNER.items()
}
OPTAX_SBC = {
    k: optax_gqc.sbc(o, schedules.polynomial_with_warmup(*BATCH), MICROBATCH, max_draws=MAX_DRAWS)
    for k, (_, o) in pc.INNER.items()
}
OPTAX_GNR = {k: optax_gqc.gnr(o, TARGET) for k, (_, o) in pc.INNER.items()}


def _set_group(wrapper, name, value):
  for group in wrapper.param_groups:
    group[name] = value
  return wrapper


def torch_gnts(make_inner):
  return lambda ps: _set_group(
      gqc.OptimizerWrapperGNTS(make_inner(ps), max_batch_draws=MAX_DRAWS),
      'gradient_norm_threshold',
      THRESHOLD,
  )


def torch_sbc(make_inner):
  def build(ps):
    wrapper = gqc.OptimizerWrapperSBC(make_inner(ps), MICROBATCH, max_batch_draws=MAX_DRAWS)
    schedule = tsa.polynomial_schedule_with_warmup(
        wrapper, *BATCH, polynomial_exponent=2.0, schedule_target='logical_batch_size'
    )
    return wrapper, schedule

  return build


def torch_gnr(make_inner):
  return lambda ps: _set_group(
      gqc.OptimizerWrapperGNR(make_inner(ps)), 'target_gradient_norm', TARGET
  )


@pytest.mark.parametrize('inner', ['adamw', 'sgd'])
def test_gnts_matches_torch_gqc(inner):
  records = replay(
      torch_gnts(pc.INNER[inner][0]), OPTAX_GNTS[inner], pc.initial_params(), pc.noisy_stream()
  )
  pc.assert_parity(records)
  pc.assert_reported(records, {**COMMON, 'gradient_norm_threshold': 'threshold'})
  draws = pc.draws_per_step(records)
  # The gate opens after a varying number of draws, and max_draws forces some steps.
  assert len(set(draws)) >= 4 and MAX_DRAWS in draws and min(draws) < MAX_DRAWS - 3
  last = records[-1]
  assert last.torch_stats['num_steps'] == last.optax_stats['num_steps'] == len(draws)
  assert last.optax_stats['threshold'] == THRESHOLD


@pytest.mark.parametrize('inner', ['adamw', 'sgd'])
def test_sbc_matches_torch_gqc(inner):
  records = replay(
      torch_sbc(pc.INNER[inner][0]), OPTAX_SBC[inner], pc.initial_params(), pc.noisy_stream()
  )
  pc.assert_parity(records)
  pc.assert_reported(records, {**COMMON, 'logical_batch_size': 'logical_batch_size'})
  draws = pc.draws_per_step(records)
  assert len(set(draws)) >= 5 and draws[0] == 1 and MAX_DRAWS in draws
  assert records[150].optax_stats['logical_batch_size'] == pytest.approx(
      records[150].torch_stats['logical_batch_size'], rel=pc.RTOL
  )


def _gnr_stats(state):
  scale = state[0]  # optax.chain(scale_to_norm(target), inner)
  return {
      'num_steps': int(scale.count),
      'target': float(scale.target),
      'grad_norm': float(scale.grad_norm),
  }


@pytest.mark.parametrize('inner', ['adamw', 'sgd'])
def test_gnr_matches_torch_gqc(inner):
  records = replay(
      torch_gnr(pc.INNER[inner][0]),
      OPTAX_GNR[inner],
      pc.initial_params(),
      pc.noisy_stream(),
      optax_stats=_gnr_stats,
  )
  # torch-gqc's last_grad_norm is the norm after rescaling, i.e. the target.
  names = {
      'num_steps': 'num_steps',
      'num_batches': 'num_steps',
      'target_gradient_norm': 'target',
      'last_grad_norm': 'target',
  }
  pc.assert_parity(records, stat_names=names)
  pc.assert_reported(records, names)
  assert all(r.torch_stepped and r.optax_stepped for r in records)
  assert records[-1].torch_stats['last_grad_norm'] == pytest.approx(TARGET, rel=1e-6)
