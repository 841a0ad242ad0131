"""The recipe ports against torch-gqc's six factories, schedules included."""

import pytest

torch = pytest.importorskip('torch')
gqc = pytest.importorskip('gradient_quality_control')
pytest.importorskip('torch_schedule_anything')

import optax  # noqa: E402
import parity_common as pc  # noqa: E402

import optax_gqc  # noqa: E402
from optax_gqc.interop.torch_replay import replay  # noqa: E402

pytestmark = pytest.mark.filterwarnings('ignore:Detected call of:UserWarning')

M, L = pc.NUM_MICROBATCHES, 30  # schedules end with the stream, after 30 microbatches of warmup
THRESHOLDS = (1.8, 1.2, 10.0)  # initial, final, warmup multiplier
NORMS = (2.0, 0.5)  # GNR's initial and final target
SBC = (16, 64, 256)  # microbatch, initial and final logical batch
MAX_DRAWS = 12
OPT = {'weight_decay': pc.WEIGHT_DECAY, **pc.ADAMW_KWARGS}

# name: (torch-gqc factory on an AdamW, our port) with the same arguments. Mind
# torch-gqc's order: GNR takes (initial_norm, final_norm, num_training_steps,
# num_warmup_steps); GNTS and SBC the training steps before the warmup too.
RECIPES = {
    'gnts': (
        lambda ps: gqc.make_gnts_with_cosine_annealing_schedule(
            pc.torch_adamw(ps), M, L, *THRESHOLDS, MAX_DRAWS
        ),
        optax_gqc.gnts_with_cosine_schedule(pc.LR, M, L, *THRESHOLDS, MAX_DRAWS, **OPT),
    ),
    'gnts_conventional_lr': (
        lambda ps: gqc.make_gnts_with_cosine_annealing_schedule_conventional_lr(
            pc.torch_adamw(ps), M, L, *THRESHOLDS, MAX_DRAWS
        ),
        optax_gqc.gnts_with_cosine_schedule_conventional_lr(
            pc.LR, M, L, *THRESHOLDS, MAX_DRAWS, **OPT
        ),
    ),
    'gnr': (
        lambda ps: gqc.make_gnr_with_cosine_annealing_schedule(pc.torch_adamw(ps), *NORMS, M, L),
        optax_gqc.gnr_with_cosine_schedule(pc.LR, *NORMS, M, L, **OPT),
    ),
    'gnr_conventional_lr': (
        lambda ps: gqc.make_gnr_with_cosine_annealing_schedule_conventional_lr(
            pc.torch_adamw(ps), *NORMS, M, L
        ),
        optax_gqc.gnr_with_cosine_schedule_conventional_lr(pc.LR, *NORMS, M, L, **OPT),
    ),
    'sbc': (
        lambda ps: gqc.make_sbc_with_polynomial_schedule(
            pc.torch_adamw(ps), *SBC, M, L, 2.0, MAX_DRAWS
        ),
        optax_gqc.sbc_with_polynomial_schedule(pc.LR, *SBC, M, L, 2.0, MAX_DRAWS, **OPT),
    ),
    'sbc_conventional_lr': (
        lambda ps: gqc.make_sbc_with_polynomial_schedule_conventional_lr(
            pc.torch_adamw(ps), *SBC, M, L, 2.0, MAX_DRAWS
        ),
        optax_gqc.sbc_with_polynomial_schedule_conventional_lr(
            pc.LR, *SBC, M, L, 2.0, MAX_DRAWS, **OPT
        ),
    ),
}

GNR_STAT_NAMES = {
    'num_batches': 'num_steps',
    'num_steps': 'num_steps',
    'target_gradient_norm': 'target',
    'last_grad_norm': 'target',
}


def _gnr_stats(state):
  scale = state[0]
  return {'num_steps': int(scale.count), 'target': float(scale.target)}


@pytest.mark.parametrize('name', list(RECIPES))
def test_recipe_matches_torch_gqc_factory(name):
  torch_side, optax_side = RECIPES[name]
  gnr = name.startswith('gnr')
  records = replay(
      torch_side,
      optax_side,
      pc.initial_params(),
      pc.noisy_stream(),
      optax_stats=_gnr_stats if gnr else None,
  )
  # Decisions, params, and per microbatch: lr, weight decay, threshold /
  # logical batch / target norm.
  pc.assert_parity(records, stat_names=GNR_STAT_NAMES if gnr else None)
  gate = {
      'gnts': {'gradient_norm_threshold': 'threshold'},
      'sbc': {'logical_batch_size': 'logical_batch_size'},
  }
  pc.assert_reported(
      records,
      GNR_STAT_NAMES
      if gnr
      else {
          'num_draws': 'num_draws',
          'num_steps': 'num_steps',
          'last_grad_norm': 'last_grad_norm',
          **gate[name.split('_')[0]],
      },
  )

  for r in records:  # the hyperparameters were there to compare
    assert {'learning_rate', 'weight_decay'} <= set(r.optax_hyperparams)
    assert {'lr', 'weight_decay'} <= set(r.torch_hyperparams)
  lr = [r.torch_hyperparams['lr'] for r in records]
  assert lr[0] == 0.0 and lr[L] == pytest.approx(pc.LR)  # linear warmup from 0
  wd = [r.torch_hyperparams['weight_decay'] for r in records]
  if name.endswith('conventional_lr'):
    assert lr[-1] < 0.01 * pc.LR and set(wd) == {pc.WEIGHT_DECAY}
  else:
    assert lr[-1] == pytest.approx(pc.LR) and wd[0] == 0.0 and wd[-1] < 0.01 * pc.WEIGHT_DECAY

  if gnr:
    target = [r.torch_stats['target_gradient_norm'] for r in records]
    assert target[0] == 0.0 and target[L] == pytest.approx(NORMS[0])
  else:
    draws = pc.draws_per_step(records)
    assert draws[:5] == [1] * 5 and len(set(draws)) >= 5  # steps every microbatch early on


@pytest.mark.cpu_only(
    "XLA:CPU's correctly rounded division: on a GPU the batch of 24 comes out 24.000002, 4 draws"
)
def test_sbc_schedule_landing_on_a_multiple_of_the_microbatch():
  mb, initial, final, total, warmup = 8, 32, 256, 1000, 500
  records = replay(
      lambda ps: gqc.make_sbc_with_polynomial_schedule(
          torch.optim.SGD(ps, lr=0.01), mb, initial, final, total, warmup, 2.0, 64
      ),
      optax_gqc.sbc_with_polynomial_schedule(
          0.01, mb, initial, final, total, warmup, 2.0, 64, optimizer=optax.sgd, weight_decay=None
      ),
      {'w': pc.initial_params()['b']},
      [{'w': g['b']} for g in pc.noisy_stream(380)],
  )
  r = records[375]
  assert r.torch_stats['logical_batch_size'] == 24.0 and r.torch_stats['last_num_draws'] == 3
  pc.assert_parity(records)


def sgd_l2(learning_rate, weight_decay, momentum=None):
  """torch's SGD with weight_decay, as docs/migration.md ports it: L2 added to the gradient."""
  return optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(learning_rate, momentum))


def test_torch_sgd_weight_decay_ports_as_the_migration_guide_says():
  records = replay(
      lambda ps: gqc.make_gnts_with_cosine_annealing_schedule(
          torch.optim.SGD(ps, lr=pc.SGD_LR, momentum=pc.MOMENTUM, weight_decay=pc.WEIGHT_DECAY),
          M,
          L,
          *THRESHOLDS,
          MAX_DRAWS,
      ),
      optax_gqc.gnts_with_cosine_schedule(
          pc.SGD_LR,
          M,
          L,
          *THRESHOLDS,
          MAX_DRAWS,
          optimizer=sgd_l2,
          weight_decay=pc.WEIGHT_DECAY,
          momentum=pc.MOMENTUM,
      ),
      pc.initial_params(),
      pc.noisy_stream(),
  )
  pc.assert_parity(records)
  wd = [r.torch_hyperparams['weight_decay'] for r in records]
  assert max(wd) == pytest.approx(pc.WEIGHT_DECAY)  # a decay to port, scheduled
