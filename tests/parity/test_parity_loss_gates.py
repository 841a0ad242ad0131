"""GNS (per-microbatch norms) and MHT (the loss) against torch-gqc, with their factories."""

import pytest

torch = pytest.importorskip('torch')
gqc = pytest.importorskip('gradient_quality_control')
mht_ref = pytest.importorskip('gradient_quality_control.implementations.metric_hypothesis_test')

import numpy as np  # noqa: E402
import parity_common as pc  # noqa: E402

import optax_gqc  # noqa: E402
from optax_gqc.interop.torch_replay import replay  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    'ignore:Detected call of:UserWarning', 'ignore:var\\(\\):UserWarning'
)

MAX_DRAWS = 12
M, L = pc.NUM_MICROBATCHES, 30
GNS_NAMES = {
    **{k: k for k in ('num_draws', 'num_steps', 'last_num_draws', 'last_grad_norm')},
    'num_batches': 'num_microbatches',
    'noise_tolerance': 'tolerance',
}
MHT_NAMES = {
    **{k: k for k in ('num_draws', 'num_steps', 'last_num_draws', 'last_grad_norm')},
    'num_batches': 'num_microbatches',
    'running_mean': 'loss_ema',
    'confidence_level': 'confidence',
    'percent_error_threshold': 'percent_error',
}
OPT = {'weight_decay': pc.WEIGHT_DECAY, **pc.ADAMW_KWARGS}


def _uneven_stream():
  """The noisy stream with each microbatch scaled by a log-normal factor.

  GNS judges the spread of the microbatch norms; these spread enough for it to
  accumulate a varying number of microbatches.
  """
  rng = np.random.default_rng(7)
  return [
      {k: v * np.float32(np.exp(0.4 * rng.normal())) for k, v in g.items()}
      for g in pc.noisy_stream()
  ]


def _losses():
  rng = np.random.default_rng(5)
  return list(2.0 + 0.3 * rng.normal(size=pc.NUM_MICROBATCHES))


def _with_group(wrapper, **values):
  for group in wrapper.param_groups:
    group.update(values)
  return wrapper


def test_gns_matches_torch_gqc():
  # torch-gqc reads each microbatch's norm from a tensor hook during backward:
  # replay adds the gradients through autograd, so the hook runs.
  tolerance = 0.02
  records = replay(
      lambda ps: _with_group(
          gqc.OptimizerWrapperGNS(pc.torch_adamw(ps), MAX_DRAWS), noise_tolerance=tolerance
      ),
      optax_gqc.gns(pc.OPTAX_ADAMW, tolerance, max_draws=MAX_DRAWS),
      pc.initial_params(),
      _uneven_stream(),
  )
  pc.assert_parity(records, stat_names=GNS_NAMES)
  pc.assert_reported(records, GNS_NAMES)
  draws = pc.draws_per_step(records)
  assert min(draws) == 2 and len(set(draws)) >= 5  # never at one draw: no spread yet


def test_mht_matches_torch_gqc():
  confidence, percent_error = 0.9, 0.1
  records = replay(
      lambda ps: _with_group(
          mht_ref.OptimizerWrapperMHT(pc.torch_adamw(ps), MAX_DRAWS),
          confidence_level=confidence,
          percent_error_threshold=percent_error,
      ),
      optax_gqc.mht(pc.OPTAX_ADAMW, confidence, percent_error, max_draws=MAX_DRAWS),
      pc.initial_params(),
      pc.noisy_stream(),
      _losses(),
  )
  pc.assert_parity(records, stat_names=MHT_NAMES)
  pc.assert_reported(records, MHT_NAMES)
  assert len(set(pc.draws_per_step(records))) >= 8


RECIPES = {
    'gns_with_cosine_schedule': (
        lambda ps: gqc.make_gns_with_cosine_annealing_schedule(
            pc.torch_adamw(ps), 0.02, 0.01, M, L, 10, MAX_DRAWS
        ),
        optax_gqc.gns_with_cosine_schedule(pc.LR, 0.02, 0.01, M, L, 10, MAX_DRAWS, **OPT),
        None,
    ),
    'gns_default': (
        lambda ps: gqc.make_gns_default(pc.torch_adamw(ps), 0.02, M, L, MAX_DRAWS),
        optax_gqc.gns_default(pc.LR, 0.02, M, L, MAX_DRAWS, **OPT),
        None,
    ),
    'mht_with_warmup_schedule': (
        lambda ps: mht_ref.make_mht_with_warmup_schedule(
            pc.torch_adamw(ps), 0.9, 0.1, M, L, MAX_DRAWS
        ),
        optax_gqc.mht_with_warmup_schedule(pc.LR, 0.9, 0.1, M, L, MAX_DRAWS, **OPT),
        _losses(),
    ),
}


@pytest.mark.parametrize('name', list(RECIPES))
def test_loss_and_noise_recipes_match_torch_gqc_factories(name):
  torch_side, optax_side, losses = RECIPES[name]
  stream = _uneven_stream() if losses is None else pc.noisy_stream()
  records = replay(torch_side, optax_side, pc.initial_params(), stream, losses)
  names = GNS_NAMES if losses is None else MHT_NAMES
  pc.assert_parity(records, stat_names=names)
  pc.assert_reported(records, names)
  lr = [r.torch_hyperparams['lr'] for r in records]
  assert lr[0] == 0.0 and lr[L] == pytest.approx(pc.LR) and lr[-1] < 0.01 * pc.LR
  assert len(set(pc.draws_per_step(records))) >= 4
