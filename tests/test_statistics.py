"""Tests of statistics(): every state the library creates, and what it leaves out."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from optax_gqc import gates
from tests._helpers import grad_stream

PARAMS = {'w': jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), 'b': jnp.ones(3)}
# The engine's own entries, pinned in test_accumulation.py: here, those of a gate that reports none.
ENGINE = set(
    optax_gqc.statistics(
        optax_gqc.accumulate(optax.sgd(1.0), gates.from_function(lambda s: True)).init(PARAMS)
    )
)


def grads(num, seed=0):
  return grad_stream(num, seed, params=PARAMS)


def last_state(tx, num=5, **extra_args):
  update = jax.jit(optax.with_extra_args_support(tx).update)
  state = tx.init(PARAMS)
  for g in grads(num):
    _, state = update(g, state, PARAMS, **extra_args)
  return state


# gate: (the gate, the entries it reports, the running sums it keeps to itself)
GATES = {
    'norm_below': (lambda: gates.norm_below(0.5), {'threshold'}, set()),
    'norm_below_relative': (
        lambda: gates.norm_below(0.5, relative=True),
        {'threshold', 'ratio', 'grad_norm_ema'},
        {'_norm_ema', '_norm_weight'},
    ),
    'batch_size_at_least': (lambda: gates.batch_size_at_least(4, 1), {'logical_batch_size'}, set()),
    'critical_batch': (
        lambda: gates.critical_batch(0.5, 1),
        {'fraction', 'target_batch_size'},
        {'_steps_since_probe', '_estimates', '_last_draws'},
    ),
    'noise_ratio_below': (
        lambda: gates.noise_ratio_below(0.1),
        {'tolerance'},
        {'_norm_mean', '_norm_m2'},
    ),
    'loss_interval': (
        lambda: gates.loss_interval(0.9, 0.1),
        {'confidence', 'percent_error', 'loss_ema', 'num_skipped_losses'},
        {'_num_losses', '_loss_mean', '_loss_m2'},
    ),
    'relative_error_below': (lambda: gates.relative_error_below(0.5), {'eta'}, set()),
    'from_function': (lambda: gates.from_function(lambda s: s.num_draws >= 2), set(), set()),
}


@pytest.mark.parametrize('name', sorted(GATES))
def test_statistics_reports_a_gates_entries_but_not_its_running_sums(name):
  make, reported, own = GATES[name]
  state = last_state(optax_gqc.accumulate(optax.sgd(0.1), make(), max_draws=4), value=1.5)
  stats = optax_gqc.statistics(state)
  assert set(stats) == ENGINE | reported
  # The gate keeps its running sums in the state, where optax.tree.get finds them;
  # its num_bad_hyperparams adds to the engine's.
  assert set(state.gate_state) - {'num_bad_hyperparams'} == reported | own
  for key in own:
    assert optax.tree.get(state, key) is not None
  for key in reported:
    assert stats[key].dtype == state.gate_state[key].dtype
    np.testing.assert_array_equal(stats[key], state.gate_state[key])


def test_statistics_kept_from_a_step_outlive_the_next_donated_step():
  # A log kept without a host sync per step: the state's own arrays are deleted
  # by the next step that donates the state, the statistics' copies are not.
  tx = optax_gqc.gnts(optax.sgd(0.1), threshold=0.5, max_draws=4)
  step = jax.jit(lambda p, s, g: optax_gqc.update_and_apply(tx, g, s, p), donate_argnums=(0, 1))
  params = jax.tree.map(jnp.copy, PARAMS)  # donated: not the module's own
  state = tx.init(params)
  log = []
  for g in grads(3):
    params, state = step(params, state, g)
    log.append(optax_gqc.statistics(state))
  assert [int(s['num_microbatches']) for s in log] == [1, 2, 3]


def test_every_gate_in_gates_follows_the_naming_convention():
  # A gate module that grows a gate must list it above.
  public = {name for name in gates.__all__ if name[0].islower()} - {'any_of', 'all_of'}
  assert public == set(GATES) - {'norm_below_relative'}


def test_combined_gates_report_each_gates_entries():
  gate = gates.any_of(gates.noise_ratio_below(0.1), gates.loss_interval(0.9, 0.1))
  stats = optax_gqc.statistics(last_state(optax_gqc.accumulate(optax.sgd(0.1), gate), value=1.0))
  assert set(stats) == ENGINE | {
      'tolerance',
      'confidence',
      'percent_error',
      'loss_ema',
      'num_skipped_losses',
  }


def test_a_gate_entry_with_a_taken_name_gets_a_suffix_the_alias_num_batches_too():
  def update(stats, gate_state):
    del stats
    return jnp.asarray(False), {k: v + 7 for k, v in gate_state.items()}

  zero = jnp.zeros([], jnp.int32)
  gate = optax_gqc.Gate(lambda: {'num_batches': zero, 'num_steps': zero}, update)
  stats = optax_gqc.statistics(last_state(optax_gqc.accumulate(optax.sgd(1.0), gate), num=2))
  assert stats['num_batches'] == stats['num_microbatches'] == 2
  assert stats['num_batches_1'] == stats['num_steps_1'] == 14


def test_num_bad_hyperparams_adds_up_the_engine_and_every_gate():
  gate = gates.any_of(gates.norm_below(lambda t: -1.0), gates.noise_ratio_below(lambda t: jnp.nan))
  tx = optax.inject_hyperparams(optax_gqc.accumulate)(optax.sgd(0.1), gate, max_draws=2)
  state = tx.init(PARAMS)
  state.hyperparams['max_draws'] = jnp.asarray(0, jnp.int32)
  for g in grads(3):
    _, state = jax.jit(tx.update)(g, state, PARAMS)
  assert int(optax_gqc.statistics(state)['num_bad_hyperparams']) == 3 * 3


def dim_batch(tx, g):
  """Updates a data-parallel ``tx`` once over a named axis of two devices."""
  stacked = jax.tree.map(lambda x: jnp.stack([x, 2 * x]), g)
  state = tx.init(PARAMS)
  _, new = jax.vmap(tx.update, in_axes=(0, None), out_axes=(0, None), axis_name='data')(
      stacked, state
  )
  return new


# Every transformation of the library with a state, as a user would build it.
FACTORIES = {
    'gnts': lambda: optax_gqc.gnts(optax.adam(0.1), 0.5, microbatch_size=4),
    'sbc': lambda: optax_gqc.sbc(optax.adam(0.1), 8, 4),
    'mht': lambda: optax_gqc.mht(optax.adam(0.1), 0.9, 0.1),
    'gns': lambda: optax_gqc.gns(optax.adam(0.1), 0.1),
    'norm_test': lambda: optax_gqc.norm_test_accumulation(optax.adam(0.1), 0.5),
    'critical_batch': lambda: optax_gqc.accumulate(
        optax.adam(0.1), gates.critical_batch(0.5, 4), microbatch_size=4
    ),
    'inject_gnts': lambda: optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(0.1), 0.5),
    'gnts_recipe': lambda: optax_gqc.gnts_with_cosine_schedule(1e-2, 20, 4),
    'gnts_recipe_conventional': lambda: optax_gqc.gnts_with_cosine_schedule_conventional_lr(
        1e-2, 20, 4
    ),
    'sbc_recipe': lambda: optax_gqc.sbc_with_polynomial_schedule(1e-2, 4, 8, 16, 20, 4),
    'sbc_recipe_conventional': lambda: optax_gqc.sbc_with_polynomial_schedule_conventional_lr(
        1e-2, 4, 8, 16, 20, 4
    ),
    'gns_recipe': lambda: optax_gqc.gns_with_cosine_schedule(1e-2, 0.1, 0.05, 20, 4),
    'gns_default': lambda: optax_gqc.gns_default(1e-2, 0.1, 20, 4),
    'mht_recipe': lambda: optax_gqc.mht_with_warmup_schedule(1e-2, 0.9, 0.1, 20, 4),
    'scheduled_accumulation': lambda: optax_gqc.scheduled_accumulation(
        optax.sgd, gates.norm_below(0.5), {'learning_rate': lambda t: 0.1}
    ),
    'gnr': lambda: optax_gqc.gnr(optax.adam(0.1), 1.0),
    'gnr_recipe': lambda: optax_gqc.gnr_with_cosine_schedule(1e-2, 2.0, 1.0, 20, 4),
    'gnr_recipe_conventional': lambda: optax_gqc.gnr_with_cosine_schedule_conventional_lr(
        1e-2, 2.0, 1.0, 20, 4
    ),
    'scale_to_norm': lambda: optax_gqc.scale_to_norm(1.0),
    'sgd_sai': lambda: optax_gqc.sgd_sai(0.1),
    'scale_by_gsnr': lambda: optax_gqc.scale_by_gsnr(),
    'gnts_of_sgd_sai': lambda: optax_gqc.gnts(optax_gqc.sgd_sai(0.1), 0.5),
}


@pytest.mark.parametrize('name', sorted(FACTORIES))
def test_statistics_works_on_every_state_the_library_creates(name):
  tx = FACTORIES[name]()
  for state in (tx.init(PARAMS), last_state(tx, num=3, value=1.0)):
    stats = jax.jit(optax_gqc.statistics)(state)
    assert stats and all(jnp.shape(v) == () for v in stats.values())
    assert not any(k.startswith('_') for k in stats)


def test_statistics_of_the_noise_scale_transformation():
  tx = optax_gqc.noise_scale(axis_name='data')
  assert np.isnan(float(optax_gqc.statistics(tx.init(PARAMS))['noise_scale']))
  state = dim_batch(tx, grads(1)[0])
  stats = optax_gqc.statistics(state)
  assert set(stats) == {'noise_scale', 'grad_sq_norm_est', 'trace_cov_est'}
  assert float(stats['noise_scale']) == pytest.approx(float(state.noise_scale), rel=1e-6)
  assert float(stats['grad_sq_norm_est']) == pytest.approx(
      float(state.grad_sq_norm_ema / state.weight), rel=1e-6
  )


def test_statistics_of_gnr():
  tx = optax_gqc.gnr(optax.sgd(0.1), target=lambda t: 1.0 + t)
  g = {'w': jnp.full((2, 3), 2.0), 'b': jnp.zeros(3)}
  state = tx.init(PARAMS)
  for _ in range(2):
    _, state = tx.update(g, state, PARAMS)
  stats = optax_gqc.statistics(state)
  # It steps on every microbatch: as many microbatches as steps.
  assert set(stats) == {
      'num_microbatches',
      'num_batches',
      'num_steps',
      'target',
      'grad_norm',
      'num_bad_hyperparams',
  }
  assert int(stats['num_microbatches']) == int(stats['num_steps']) == 2
  assert int(stats['num_bad_hyperparams']) == 0
  assert float(stats['target']) == 2.0
  assert float(stats['grad_norm']) == pytest.approx(np.sqrt(6 * 4.0))


def test_statistics_of_sgd_sai():
  tx = optax_gqc.sgd_sai(0.1)
  state = tx.init(PARAMS)
  stats = optax_gqc.statistics(state)
  assert int(stats['num_pending_gsnr']) == 2 and np.isnan(float(stats['gsnr_max']))
  g = {'w': jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), 'b': jnp.zeros(3)}
  _, state = tx.update(g, state, PARAMS)
  stats = optax_gqc.statistics(state)
  gsnr = optax.tree.get(state, 'gsnr')
  # 'b' got a zero gradient: it waits for a non-zero one.
  assert int(stats['num_pending_gsnr']) == 1 and int(stats['num_steps']) == 1
  assert int(stats['num_microbatches']) == 1
  assert float(stats['gsnr_min']) == float(stats['gsnr_max']) == float(gsnr['w'])


def test_an_accumulations_entries_come_first_and_a_part_reads_the_other():
  tx = optax.chain(optax_gqc.noise_scale(axis_name='data'), optax_gqc.gnts(optax.sgd(0.1), 0.5))
  state = tx.init(PARAMS)
  estimates = optax_gqc.NoiseScaleState(*(jnp.float32(x) for x in (1.0, 7.0, 1.0)))
  state = (estimates, state[1])
  assert np.isnan(float(optax_gqc.statistics(state)['noise_scale']))  # the accumulation's
  assert float(optax_gqc.statistics(state[0])['noise_scale']) == 7.0


def test_statistics_reads_the_inner_state_of_an_accumulation():
  stats = optax_gqc.statistics(last_state(optax_gqc.gnts(optax_gqc.sgd_sai(0.1), 1e6), num=2))
  assert ENGINE < set(stats) and int(stats['num_pending_gsnr']) == 0
  assert int(stats['num_steps']) == 2


@pytest.mark.parametrize(
    'state',
    [optax.sgd(0.1).init(PARAMS), PARAMS, None, optax.EmptyState()],
    ids=['sgd', 'params', 'none', 'empty'],
)
def test_statistics_of_a_state_with_nothing_to_report_is_empty(state):
  assert optax_gqc.statistics(state) == {}


@pytest.mark.parametrize(
    'make',
    [
        lambda: optax.adamw(1e-3),
        lambda: optax.sgd(optax.linear_schedule(0.1, 0.0, 10)),
        lambda: optax.inject_hyperparams(optax.adam)(1e-3),
        lambda: optax.lion(1e-3),
    ],
    ids=['adamw', 'sgd_schedule', 'inject_adam', 'lion'],
)
def test_statistics_of_a_plain_optax_optimizer_counts_its_steps(make):
  # A baseline run of a plain optimizer logs num_steps as an accumulation does.
  stats = jax.jit(optax_gqc.statistics)(last_state(make(), num=3))
  assert set(stats) == {'num_steps'} and int(stats['num_steps']) == 3


def test_statistics_of_optax_multisteps():
  stats = optax_gqc.statistics(last_state(optax.MultiSteps(optax.adam(0.1), 4), num=6))
  assert set(stats) == {'num_draws', 'num_steps'}
  assert int(stats['num_steps']) == 1 and int(stats['num_draws']) == 2


def test_statistics_reads_inside_optax_multisteps():
  # MultiSteps of 2 around an accumulation of 2: 8 microbatches, 4 means, 2 steps.
  stats = optax_gqc.statistics(
      last_state(optax.MultiSteps(optax_gqc.sbc(optax.sgd(1.0), 2, 1), 2), num=8)
  )
  assert int(stats['num_steps']) == 2 and int(stats['logical_batch_size']) == 2
  assert 'num_microbatches' not in stats  # the accumulation's 4 are MultiSteps' steps


def test_statistics_counts_the_steps_of_optax_multisteps_not_of_its_inner_optimizer():
  # 8 microbatches, a step every 4: the inner counts (2) are steps, the outer
  # scale_to_norm's (8) microbatches.
  for inner in (optax_gqc.sgd_sai(0.1), optax_gqc.gnr(optax.sgd(0.1), 1.0)):
    stats = optax_gqc.statistics(last_state(optax.MultiSteps(inner, 4), num=8))
    assert int(stats['num_steps']) == 2 and 'num_microbatches' not in stats
  multi = optax.MultiSteps(optax.adam(0.1), 4).gradient_transformation()
  stats = optax_gqc.statistics(last_state(optax.chain(optax_gqc.scale_to_norm(1.0), multi), num=8))
  assert int(stats['num_steps']) == 2 and int(stats['num_microbatches']) == 8


def _as_dicts(tree):
  """NamedTuples as dicts of their fields, as a checkpoint restored without a target has them."""
  if hasattr(tree, '_fields'):
    return {k: _as_dicts(v) for k, v in tree._asdict().items()}
  if isinstance(tree, tuple | list):
    return type(tree)(_as_dicts(x) for x in tree)
  if isinstance(tree, dict):
    return {k: _as_dicts(v) for k, v in tree.items()}
  return tree


@pytest.mark.parametrize(
    'make',
    [
        lambda: optax_gqc.gnts(optax.sgd(0.1), 0.5),
        lambda: optax_gqc.gnr(optax.sgd(0.1), 1.0),
        lambda: optax_gqc.sgd_sai(0.1),
        lambda: optax.MultiSteps(optax.adam(0.1), 2),
        lambda: optax.adamw(0.1),  # num_steps from its count; it read as {}
    ],
    ids=['gnts', 'gnr', 'sgd_sai', 'multisteps', 'adamw'],
)
def test_a_state_kept_as_a_mapping_of_its_fields_raises_rather_than_misreads(make):
  # As nnx.state(optimizer) or a checkpoint restored without a target keep it:
  # it read as {} (or as its noise-scale part alone, in the wrong units).
  state = last_state(make(), num=4)
  assert optax_gqc.statistics(state)
  with pytest.raises(TypeError, match=r'optimizer.opt_state.*jax.eval_shape\(tx.init'):
    optax_gqc.statistics(_as_dicts(state))


def test_a_mapping_of_ones_own_with_a_count_is_not_taken_for_an_optax_state():
  assert optax_gqc.statistics((optax.EmptyState(), {'count': jnp.int32(0), 'x': 1.0})) == {}


def test_the_transformation_in_place_of_its_state_raises():
  for tx in (optax_gqc.gnts(optax.sgd(0.1)), optax.adam(0.1)):
    with pytest.raises(TypeError, match=r'an optimizer state .* not the transformation'):
      optax_gqc.statistics(tx)


def test_a_count_of_calls_is_not_read_as_steps():
  # reduce_on_plateau's count runs over its accumulation of losses.
  tx = optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau(accumulation_size=3))
  assert optax_gqc.statistics(last_state(tx, num=4, value=1.0)) == {}


def test_an_accumulations_count_comes_before_its_inner_optimizers():
  # inject_hyperparams counts microbatches, adam's count the steps: the
  # accumulation reports both under its own names.
  tx = optax.inject_hyperparams(optax_gqc.sbc)(optax.adam(0.1), 2, 1)
  stats = optax_gqc.statistics(last_state(tx, num=5))
  assert int(stats['num_steps']) == 2 and int(stats['num_microbatches']) == 5
