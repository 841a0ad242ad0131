"""Tests of the accumulation engine, its statistics and its argument checks."""

import copy
import functools
import math
from typing import NamedTuple

import chex
import hypothesis
import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import strategies as st

import optax_gqc
from optax_gqc import gates
from tests._helpers import PARAMS, grad_stream, run, selectable_conds


class Recording(NamedTuple):
  count: jax.Array  # int32: inner updates taken.


def identity_inner():
  """An inner optimizer that returns what it is given and counts its calls."""
  return optax.GradientTransformation(
      lambda params: Recording(jnp.zeros([], jnp.int32)),
      lambda updates, state, params=None: (updates, Recording(state.count + 1)),
  )


def test_gnts_with_infinite_threshold_is_the_inner_optimizer():
  grads = grad_stream(10)
  inner = optax.adamw(1e-2)
  ours = run(optax_gqc.gnts(inner, threshold=float('inf')), grads)
  plain = run(inner, grads)
  # Same arithmetic; the two programs may differ by XLA's choice of fusion
  # (fused multiply-adds), i.e. by float32 round-off.
  for (u, s, p), (u_ref, s_ref, p_ref) in zip(ours, plain, strict=True):
    chex.assert_trees_all_close(u, u_ref, rtol=1e-6, atol=1e-9)
    chex.assert_trees_all_close(p, p_ref, rtol=1e-6, atol=1e-9)
    chex.assert_trees_all_close(s.inner_state, s_ref, rtol=1e-6, atol=1e-9)
  assert int(ours[-1][1].num_steps) == 10


@pytest.mark.parametrize(
    'inner',
    [
        optax.adam(1e-2),
        optax.sgd(1e-2, momentum=0.9),
        optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2)),
    ],
    ids=['adam', 'sgd_momentum', 'clip_adamw'],
)
def test_sbc_with_constant_batch_matches_multisteps(inner):
  k, size = 4, 16
  grads = grad_stream(23, seed=1)
  ours = run(optax_gqc.sbc(inner, logical_batch_size=k * size, microbatch_size=size), grads)
  multi = optax.MultiSteps(inner, k)
  ref = run(optax.GradientTransformation(multi.init, multi.update), grads)
  for i, ((u, s, p), (u_ref, _, p_ref)) in enumerate(zip(ours, ref, strict=True)):
    chex.assert_trees_all_close(u, u_ref, atol=1e-6, rtol=1e-6)
    chex.assert_trees_all_close(p, p_ref, atol=1e-6, rtol=1e-6)
    assert int(s.num_steps) == (i + 1) // k


@jax.jit
def _gnts_identity_update(grads, state, threshold, max_draws):
  """``gnts(identity_inner()).update`` with its hyperparameters traced.

  The drawn threshold and max_draws are arguments, not constants folded into
  the program, so every hypothesis example reuses one compilation.
  """
  tx = optax_gqc.gnts(identity_inner(), threshold=threshold, max_draws=max_draws)
  return tx.update(grads, state)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    scales=hnp.arrays(
        np.float32,
        st.integers(1, 30),
        # float32 values, which NumPy 1.x compares exactly against the array's entries
        elements=st.sampled_from(np.float32([0.01, 0.1, 0.5, 1.0, 3.0, np.nan]).tolist()),
    ),
    threshold=st.floats(0.0, 2.0),
    max_draws=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_property_draws_bounded_inner_runs_only_on_steps_and_sees_the_mean(
    scales, threshold, max_draws, seed
):
  params = {'a': jnp.zeros(5), 'b': jnp.zeros((2, 3))}
  rng = np.random.default_rng(seed)  # on the host: jax.random compiles a split per length
  directions = [
      jax.tree.map(lambda p: rng.standard_normal(p.shape, np.float32), params) for _ in scales
  ]
  grads = [jax.tree.map(lambda d, s=s: s * d, g) for g, s in zip(directions, scales, strict=True)]
  state = optax_gqc.gnts(identity_inner(), threshold=threshold, max_draws=max_draws).init(params)
  pending = []  # accepted microbatches since the last step
  prev_count = 0
  for g in grads:
    updates, state = _gnts_identity_update(g, state, jnp.float32(threshold), jnp.int32(max_draws))
    finite = all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(g))
    if finite:
      pending.append(g)
    assert 0 <= int(state.num_draws) < max_draws
    count = int(state.inner_state.count)
    stepped = count == prev_count + 1
    assert count in (prev_count, prev_count + 1)  # inner state moves only on steps
    if stepped:
      mean = jax.tree.map(lambda *xs: np.mean(np.stack(xs), axis=0), *pending)
      chex.assert_trees_all_close(updates, mean, rtol=1e-5, atol=1e-6)
      assert int(state.last_num_draws) == len(pending) <= max_draws
      pending = []
    else:
      chex.assert_trees_all_equal(updates, optax.tree.zeros_like(g))
      assert int(state.num_draws) == len(pending)
    prev_count = count
  assert int(state.num_skipped) == int(np.sum(np.isnan(scales)))


def test_rejects_nonfinite_microbatch_and_keeps_everything():
  tx = optax_gqc.gnts(optax.sgd(1.0), threshold=0.0, max_draws=3)
  g0, g1 = grad_stream(2)
  bad = jax.tree.map(lambda x: x.at[0].set(jnp.nan), g1)
  (_, s0, _), (u1, s1, _) = run(tx, [g0, bad], apply=False)
  chex.assert_trees_all_equal(u1, optax.tree.zeros_like(g1))
  for field in ('num_draws', 'num_microbatches', 'num_steps', 'sum_sq_norms', 'acc_norm'):
    assert getattr(s1, field) == getattr(s0, field), field
  chex.assert_trees_all_equal(s1.accumulator, s0.accumulator)
  assert int(s1.num_skipped) == 1


def test_skip_nonfinite_off_lets_nan_through():
  tx = optax_gqc.gnts(optax.sgd(1.0), threshold=0.0, max_draws=2, skip_nonfinite=False)
  g0, g1 = grad_stream(2)
  bad = jax.tree.map(lambda x: x.at[0].set(jnp.nan), g1)
  (_, _, _), (u1, s1, _) = run(tx, [g0, bad], apply=False)
  assert int(s1.num_steps) == 1 and int(s1.num_skipped) == 0
  assert np.isnan(np.asarray(u1['w'])).any()


def test_max_draws_forces_a_step_and_the_mean_is_of_all_draws():
  tx = optax_gqc.gnts(optax.sgd(1.0), threshold=0.0, max_draws=3)
  grads = grad_stream(6)
  out = run(tx, grads, apply=False)
  assert [int(s.num_steps) for _, s, _ in out] == [0, 0, 1, 1, 1, 2]
  mean = jax.tree.map(lambda *xs: -sum(xs) / 3, *grads[3:])
  chex.assert_trees_all_close(out[5][0], mean, rtol=1e-6, atol=1e-7)
  assert int(out[5][1].last_num_draws) == 3


def test_gate_sees_running_statistics():
  seen = []

  def rule(stats):
    jax.debug.callback(lambda *a: seen.append([np.asarray(x) for x in a]), *stats)
    return stats.num_draws >= 3

  tx = optax_gqc.accumulate(optax.sgd(1.0), gates.from_function(rule), max_draws=10)
  grads = grad_stream(4)
  run(tx, grads)
  jax.effects_barrier()
  norms = [float(optax.tree.norm(g)) for g in grads]
  n, t, grad_norm, acc_norm, sum_sq, sum_n, noise = zip(*seen, strict=True)
  assert [int(x) for x in n] == [1, 2, 3, 1]
  assert [int(x) for x in t] == [0, 1, 2, 3]
  np.testing.assert_allclose(grad_norm, norms, rtol=1e-6)
  np.testing.assert_allclose(sum_sq[2], sum(x**2 for x in norms[:3]), rtol=1e-6)
  np.testing.assert_allclose(sum_n[1], norms[0] + norms[1], rtol=1e-6)
  mean3 = optax.tree.norm(jax.tree.map(lambda *xs: sum(xs) / 3, *grads[:3]))
  np.testing.assert_allclose(acc_norm[2], mean3, rtol=1e-6)
  np.testing.assert_allclose(acc_norm[3], norms[3], rtol=1e-6)  # fresh accumulation
  # The noise scale, in microbatches, from the step before: none until one averaged 3.
  assert np.isnan(noise[:3]).all()
  g_small = sum(x**2 for x in norms[:3]) / 3
  grad_sq, trace = optax_gqc.noise_scale_estimates(1, g_small, 3, float(mean3) ** 2)
  # Zero-mean random gradients: the |G|^2 estimate is negative, all noise, so B is infinite.
  assert float(grad_sq) < 0 and np.isposinf(noise[3])


def test_state_structure_and_dtypes_fixed_from_init():
  tx = optax_gqc.gnts(optax.adamw(1e-3), threshold=0.5, max_draws=4)
  state0 = tx.init(PARAMS)
  _, state1 = jax.jit(tx.update)(grad_stream(1)[0], state0, PARAMS)
  assert jax.tree.structure(state0) == jax.tree.structure(state1)
  for a, b in zip(jax.tree.leaves(state0), jax.tree.leaves(state1), strict=True):
    assert (a.shape, a.dtype) == (b.shape, b.dtype)


def test_donated_state_and_params():
  tx = optax_gqc.gnts(optax.adamw(1e-3), threshold=0.5, max_draws=4)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  params = jax.tree.map(jnp.copy, PARAMS)
  state = tx.init(params)
  for g in grad_stream(6):
    params, state = step(params, state, g)
  assert int(state.num_microbatches) == 6


def test_bf16_params_with_float32_accumulator():
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), PARAMS)
  grads = grad_stream(8, params=params)
  tx = optax_gqc.gnts(optax.adam(1e-2), threshold=0.0, max_draws=4)
  out = run(tx, grads, params)
  state = out[-1][1]
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.accumulator))
  assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(out[3][0]))
  ref = run(
      optax.adam(1e-2),
      [
          jax.tree.map(
              lambda *xs: (sum(x.astype(jnp.float32) for x in xs) / 4).astype(jnp.bfloat16),
              *grads[i : i + 4],
          )
          for i in (0, 4)
      ],
      params,
  )
  chex.assert_trees_all_close(out[-1][2], ref[-1][2], rtol=1e-2)


def test_inside_chain_and_statistics():
  tx = optax.chain(
      optax.clip_by_global_norm(10.0),
      optax_gqc.gnts(optax.sgd(0.1), threshold=0.3, max_draws=5),
  )
  out = run(tx, grad_stream(7))
  stats = jax.jit(optax_gqc.statistics)(out[-1][1])
  assert set(stats) == {
      'num_draws',
      'num_microbatches',
      'num_batches',
      'num_steps',
      'num_skipped',
      'num_forced',
      'num_bad_hyperparams',
      'last_num_draws',
      'last_grad_norm',
      'acc_norm',
      'microbatch_size',
      'threshold',
      'noise_scale',
      'grad_sq_norm_est',
      'trace_cov_est',
  }
  assert int(stats['num_microbatches']) == int(stats['num_batches']) == 7
  assert float(stats['threshold']) == pytest.approx(0.3)
  engine = out[-1][1][1]
  assert float(stats['acc_norm']) == float(engine.acc_norm)


def test_statistics_reports_gate_hyperparameters_by_schedule():
  tx = optax_gqc.gnts(optax.sgd(0.1), threshold=lambda t: 1.0 / (t + 1), max_draws=5)
  out = run(tx, grad_stream(4))
  thresholds = [float(optax_gqc.statistics(s)['threshold']) for _, s, _ in out]
  np.testing.assert_allclose(thresholds, [1.0, 1 / 2, 1 / 3, 1 / 4], rtol=1e-6)


def test_statistics_of_a_plain_optax_state_reports_its_step_count():
  state = optax.adam(1e-3).init(PARAMS)
  assert optax_gqc.statistics(state) == {'num_steps': state[0].count}


def test_threshold_injected_by_inject_hyperparams():
  tx = optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(1.0), threshold=0.0, max_draws=50)
  update = jax.jit(tx.update)
  state = tx.init(PARAMS)
  g = grad_stream(1)[0]
  _, state = update(g, state, PARAMS)
  assert int(optax_gqc.statistics(state)['num_steps']) == 0
  state.hyperparams['threshold'] = jnp.asarray(1e6)
  _, state = update(g, state, PARAMS)
  stats = optax_gqc.statistics(state)
  assert int(stats['num_steps']) == 1 and int(stats['last_num_draws']) == 2
  assert float(stats['threshold']) == 1e6


def test_an_injected_threshold_set_by_name_to_a_python_number():
  # optax.tree.set writes the number into the injected hyperparameter and into
  # the gate's entry of the same name alike.
  tx = optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(1.0), threshold=0.0, max_draws=50)
  state = optax.tree.set(tx.init(PARAMS), threshold=1e6)
  for update in (tx.update, jax.jit(tx.update)):
    _, new_state = update(grad_stream(1)[0], state, PARAMS)
    stats = optax_gqc.statistics(new_state)
    assert int(stats['num_steps']) == 1 and stats['threshold'].dtype == jnp.float32


def test_a_gates_entry_reports_its_argument_and_writing_it_changes_nothing():
  # As the Gate docstring and docs/checkpointing.md say: inject it to change it.
  tx = optax_gqc.gnts(optax.sgd(1.0), threshold=0.0, max_draws=50)
  state = optax.tree.set(tx.init(PARAMS), threshold=jnp.asarray(1e6))
  _, state = jax.jit(tx.update)(grad_stream(1)[0], state, PARAMS)
  stats = optax_gqc.statistics(state)
  assert int(stats['num_steps']) == 0 and float(stats['threshold']) == 0.0


def test_max_draws_injected_and_changed_mid_run():
  tx = optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(1.0), threshold=0.0, max_draws=4)
  update = jax.jit(tx.update)
  state = tx.init(PARAMS)
  assert state.hyperparams['max_draws'].dtype == jnp.int32
  g = grad_stream(1)[0]
  _, state = update(g, state, PARAMS)
  state.hyperparams['max_draws'] = jnp.asarray(2, jnp.int32)
  _, state = update(g, state, PARAMS)
  assert int(optax_gqc.statistics(state)['last_num_draws']) == 2


@pytest.mark.parametrize(
    'make',
    [
        lambda: optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(1.0), 0.5, microbatch_size=4),
        lambda: optax.inject_hyperparams(optax_gqc.sbc)(optax.sgd(1.0), 8, 4),
    ],
    ids=['gnts', 'sbc'],
)
def test_microbatch_size_injected_under_jitted_init(make):
  tx = make()
  state = jax.jit(tx.init)(PARAMS)
  update = jax.jit(tx.update)
  _, state = update(grad_stream(1)[0], state, PARAMS)
  assert int(optax_gqc.statistics(state)['microbatch_size']) == 4
  # Changed mid-run, it is the size statistics reports (and converts the noise scale by):
  # the state kept init's.
  state.hyperparams['microbatch_size'] = jnp.asarray(16, jnp.int32)
  _, state = update(grad_stream(1)[0], state, PARAMS)
  assert int(optax_gqc.statistics(state)['microbatch_size']) == 16


def test_an_injected_microbatch_size_changed_mid_run_keeps_the_noise_scale_in_examples():
  # The estimates so far were of microbatches of 4 examples: reported in
  # examples, they must not double when the microbatches become 8 examples.
  tx = optax.inject_hyperparams(optax_gqc.sbc)(
      optax.sgd(0.0), logical_batch_size=16, microbatch_size=4
  )
  update = jax.jit(tx.update)
  state = tx.init(PARAMS)
  for g in grad_stream(40):  # ten steps of four microbatches
    _, state = update(g, state, PARAMS)
  before = optax_gqc.statistics(state)
  state.hyperparams['microbatch_size'] = jnp.asarray(8, jnp.int32)
  _, state = update(grad_stream(1)[0], state, PARAMS)  # accumulates: no new estimate
  after = optax_gqc.statistics(state)
  assert int(after['num_draws']) == 1 and int(after['microbatch_size']) == 8
  for name in ('noise_scale', 'trace_cov_est', 'grad_sq_norm_est'):
    np.testing.assert_allclose(after[name], before[name], rtol=1e-6, err_msg=name)


def test_flax_nnx_optimizer_under_nnx_jit():
  from flax import nnx

  model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(
      model, optax_gqc.gnts(optax.adam(1e-2), threshold=0.0, max_draws=3), wrt=nnx.Param
  )
  kernel0 = np.asarray(model.kernel[...])

  @nnx.jit
  def train_step(model, optimizer, x):
    grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
    optimizer.update(model, grads)

  for i in range(2):
    train_step(model, optimizer, jnp.ones((4, 3)) * (i + 1))
  np.testing.assert_array_equal(model.kernel[...], kernel0)  # still accumulating
  train_step(model, optimizer, jnp.ones((4, 3)))
  assert not np.allclose(model.kernel[...], kernel0)
  stats = optax_gqc.statistics(optimizer.opt_state)
  assert int(stats['num_steps']) == 1 and int(stats['last_num_draws']) == 3
  assert int(optimizer.step[...]) == 3  # nnx.Optimizer counts microbatches


@pytest.mark.parametrize(
    'make, error, match',
    [
        (lambda: optax_gqc.gnts(optax.sgd(1.0), 0.1, max_draws=0), ValueError, 'max_draws'),
        (lambda: optax_gqc.gnts(optax.sgd(1.0), 0.1, max_draws=2.5), TypeError, 'max_draws'),
        (
            lambda: optax_gqc.gnts(optax.sgd(1.0), 0.1, max_draws=jnp.asarray(0)),
            ValueError,
            'max_draws',
        ),
        (lambda: optax_gqc.gnts(optax.sgd(1.0), -0.1), ValueError, 'threshold'),
        (lambda: optax_gqc.gnts(optax.sgd(1.0), float('nan')), ValueError, 'threshold'),
        (lambda: optax_gqc.gnts(optax.sgd(1.0), 'high'), TypeError, 'threshold'),
        (
            lambda: optax_gqc.gnts(optax.sgd(1.0), 0.1, microbatch_size=0),
            ValueError,
            'microbatch_size',
        ),
        (lambda: optax_gqc.sbc(optax.sgd(1.0), -8, 4), ValueError, 'logical_batch_size'),
        (lambda: optax_gqc.sbc(optax.sgd(1.0), 8, 0), ValueError, 'microbatch_size'),
        (lambda: optax_gqc.scale_to_norm(float('nan')), ValueError, 'target'),
        (lambda: optax_gqc.gnr(optax.sgd(1.0), -1.0), ValueError, 'target'),
        (lambda: optax_gqc.accumulate(optax.sgd(1.0), 'norm'), TypeError, 'gate'),
        (lambda: optax_gqc.accumulate(optax.sgd(1.0), lambda s: True), TypeError, 'from_function'),
        (lambda: gates.any_of(), ValueError, 'at least one'),
        (lambda: gates.all_of(gates.norm_below(1.0), 3), TypeError, 'Gates'),
        (lambda: gates.from_function(3), TypeError, 'callable'),
    ],
)
def test_bad_arguments_raise_at_construction(make, error, match):
  with pytest.raises(error, match=match):
    make()


def test_gradients_unlike_params_raise_at_first_trace():
  tx = optax_gqc.gnts(optax.sgd(1.0), 0.1)
  state = tx.init(PARAMS)
  with pytest.raises(ValueError, match='does not match the params'):
    jax.jit(tx.update)({'w': PARAMS['w']}, state)
  with pytest.raises(ValueError, match=r"\['b'\] has shape \(5,\)"):
    jax.jit(tx.update)({'w': PARAMS['w'], 'b': jnp.ones(5)}, state)


FUSED_CASES = {
    'gnts': lambda: optax_gqc.gnts(optax.adamw(0.05), threshold=1.2, max_draws=4),
    'sbc': lambda: optax_gqc.sbc(optax.sgd(0.1, momentum=0.9), 3, 1),
    'noise_ratio': lambda: optax_gqc.noise_ratio_accumulation(optax.adam(0.05), 0.2, max_draws=5),
    'relative_error': lambda: optax_gqc.norm_test_accumulation(optax.adam(0.05), 1.0, max_draws=5),
    'mht': lambda: optax_gqc.mht(optax.adamw(0.05), 0.9, 0.02, max_draws=4),
    'critical_batch': lambda: optax_gqc.accumulate(
        optax.adamw(0.05), gates.critical_batch(0.5, 4), microbatch_size=4, max_draws=6
    ),
    'scaled_by_draws': lambda: optax_gqc.accumulate(
        optax.adam(0.05), gates.norm_below(1.2), max_draws=4, scale_by_draws=jnp.sqrt
    ),
    # The nine ports of torch-gqc's recipes, over 30 microbatches with 5 of warmup.
    'gnts_recipe': lambda: optax_gqc.gnts_with_cosine_schedule(
        0.05, total_steps=30, warmup_steps=5, max_draws=4
    ),
    'gnts_recipe_conventional_lr': lambda: optax_gqc.gnts_with_cosine_schedule_conventional_lr(
        0.05, total_steps=30, warmup_steps=5, max_draws=4
    ),
    'gnr_recipe': lambda: optax_gqc.gnr_with_cosine_schedule(0.05, 1.0, 0.5, 30, 5),
    'gnr_recipe_conventional_lr': lambda: optax_gqc.gnr_with_cosine_schedule_conventional_lr(
        0.05, 1.0, 0.5, 30, 5
    ),
    'sbc_recipe': lambda: optax_gqc.sbc_with_polynomial_schedule(
        0.05, 1, 2.0, 5.0, total_steps=30, warmup_steps=5
    ),
    'sbc_recipe_conventional_lr': lambda: optax_gqc.sbc_with_polynomial_schedule_conventional_lr(
        0.05, 1, 2.0, 5.0, total_steps=30, warmup_steps=5
    ),
    'gns_recipe': lambda: optax_gqc.gns_with_cosine_schedule(0.05, 0.5, 0.2, 30, 5, max_draws=4),
    'gns_default': lambda: optax_gqc.gns_default(0.05, 0.3, 30, 5, max_draws=4),
    'mht_recipe': lambda: optax_gqc.mht_with_warmup_schedule(0.05, 0.9, 0.02, 30, 5, max_draws=4),
    'not_an_accumulation': lambda: optax.adamw(0.05),
}
# GNR rescales every microbatch and steps on each: an optax.chain, not an accumulation.
NOT_ACCUMULATIONS = {'gnr_recipe', 'gnr_recipe_conventional_lr', 'not_an_accumulation'}


def microbatch_loss(grads):
  """A loss for the gates that read one (MHT): a scalar that varies with the microbatch."""
  return 1.0 + 0.1 * jnp.sum(grads['b'])


@pytest.mark.parametrize(
    'name',
    [
        # The t quantile of the loss gate takes a while to compile.
        pytest.param(name, marks=pytest.mark.slow) if 'mht' in name else name
        for name in sorted(FUSED_CASES)
    ],
)
def test_update_and_apply_equals_the_optax_path_bitwise(name):
  tx = FUSED_CASES[name]()
  extra_args = (lambda g: {'value': microbatch_loss(g)}) if 'mht' in name else (lambda g: {})

  @jax.jit
  def optax_path(grads, state, params):
    updates, state = tx.update(grads, state, params, **extra_args(grads))
    return optax.apply_updates(params, updates), state

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def fused(params, state, grads):
    return optax_gqc.update_and_apply(tx, grads, state, params, **extra_args(grads))

  params, state = jax.tree.map(jnp.copy, PARAMS), tx.init(PARAMS)
  ref_params, ref_state = PARAMS, tx.init(PARAMS)
  grads = grad_stream(24, seed=3)
  for g in grads:
    ref_params, ref_state = optax_path(g, ref_state, ref_params)
    params, state = fused(params, state, g)
    chex.assert_trees_all_equal(params, ref_params)
    chex.assert_trees_all_equal(state, ref_state)
  assert hasattr(tx, 'update_and_apply') == (name not in NOT_ACCUMULATIONS)
  if name not in NOT_ACCUMULATIONS:
    steps = int(optax_gqc.statistics(state)['num_steps'])
    assert 0 < steps < len(grads)  # both branches ran
  else:
    assert not np.array_equal(params['w'], PARAMS['w'])


def test_a_negative_zero_param_keeps_its_sign_on_the_fused_path_only():
  # docs/fused.md: the one difference in bits, which compares equal.
  tx = optax_gqc.gnts(optax.sgd(0.1), threshold=0.0, max_draws=4)
  params, grads = {'w': jnp.array([-0.0, 1.0])}, {'w': jnp.ones(2)}
  state = tx.init(params)
  fused, _ = jax.jit(functools.partial(optax_gqc.update_and_apply, tx))(grads, state, params)
  updates, _ = jax.jit(tx.update)(grads, state, params)
  optax_path = optax.apply_updates(params, updates)
  np.testing.assert_array_equal(fused['w'], optax_path['w'])
  assert np.signbit(fused['w'][0]) and not np.signbit(optax_path['w'][0])


def test_the_loss_reaches_an_optax_multisteps_inside_and_through_update_and_apply():
  """optax.with_extra_args_support would drop ``value=`` on its way to a MultiSteps."""

  def polyak():  # needs value=loss; MultiSteps is no GradientTransformationExtraArgs
    return optax.MultiSteps(optax.polyak_sgd(max_learning_rate=1.0), 2)

  params, g, loss = {'w': jnp.ones(3)}, {'w': jnp.array([1.0, -1.0, 2.0])}, jnp.asarray(1.0)
  ref = polyak()
  ref_params, ref_state = params, ref.init(params)
  for _ in range(2):
    updates, ref_state = ref.update(g, ref_state, ref_params, value=loss)
    ref_params = optax.apply_updates(ref_params, updates)
  assert not np.array_equal(ref_params['w'], params['w'])
  for tx in (polyak(), optax_gqc.sbc(polyak(), 1, 1)):
    p, state = params, tx.init(params)
    for _ in range(2):
      p, state = jax.jit(functools.partial(optax_gqc.update_and_apply, tx))(g, state, p, value=loss)
    chex.assert_trees_all_close(p, ref_params)


def test_a_plain_transformation_that_forwards_extra_args_gets_none():
  # As Optax does: only a GradientTransformationExtraArgs (or a MultiSteps) gets them.
  def halved(inner):
    def update_fn(updates, state, params=None, **extra_args):
      updates, state = inner.update(updates, state, params, **extra_args)
      return jax.tree.map(lambda u: 0.5 * u, updates), state

    return optax.GradientTransformation(inner.init, update_fn)

  params = {'w': jnp.ones(3)}
  out = []
  for inner in (halved(optax.scale_by_adam()), optax.scale_by_adam()):
    tx = optax_gqc.mht(inner, 0.9, 0.05, max_draws=2)
    state = tx.init(params)
    for i in range(3):
      updates, state = tx.update({'w': jnp.full(3, 1.0 + i)}, state, params, value=1.0 + i)
    out.append(updates['w'])
  np.testing.assert_allclose(out[0], 0.5 * out[1])
  assert np.all(out[1] != 0)


def test_a_gate_may_return_a_python_number_for_an_entry():
  gate = gates.Gate(
      lambda: {'threshold': jnp.asarray(0.5, jnp.float32)},
      lambda stats, state, **_: (stats.acc_norm < 0.5, {'threshold': 0.5}),
  )
  tx = optax_gqc.accumulate(optax.sgd(0.1), gate, max_draws=4)
  _, state = jax.jit(tx.update)({'w': jnp.ones(3)}, tx.init({'w': jnp.ones(3)}), {'w': jnp.ones(3)})
  assert state.gate_state['threshold'].dtype == jnp.float32


def test_a_gate_may_init_an_entry_as_a_python_number():
  gate = gates.Gate(
      lambda: {'ema': 0.0, 'count': 0},
      lambda stats, state, **_: (
          stats.num_draws >= 2,
          {'ema': 0.5 * state['ema'] + stats.grad_norm, 'count': state['count'] + 1},
      ),
  )
  tx = optax_gqc.accumulate(optax.sgd(0.1), gate, max_draws=4)
  state = tx.init({'w': jnp.ones(3)})
  dtypes = {'ema': jnp.float32, 'count': jnp.int32}
  assert jax.tree.map(lambda x: (x.dtype, x.weak_type), state.gate_state) == {
      k: (d, False) for k, d in dtypes.items()
  }
  for update in (tx.update, jax.jit(tx.update)):
    _, new_state = update({'w': jnp.ones(3)}, state)
    assert jax.tree.map(lambda x: x.dtype, new_state.gate_state) == dtypes
    assert int(new_state.gate_state['count']) == 1


def test_counters_stop_at_the_int32_limit_rather_than_wrap():
  # A wrapped num_microbatches would give schedule_by_microbatch a negative count.
  top = jnp.iinfo(jnp.int32).max
  tx = optax_gqc.gnts(optax.sgd(0.1), ratio=0.5, max_draws=1)
  state = tx.init(PARAMS)
  counts = ('num_microbatches', 'num_steps', 'num_forced', 'num_skipped')
  state = state._replace(**{name: jnp.asarray(top, jnp.int32) for name in counts})
  grads = grad_stream(2, seed=1)
  bad = jax.tree.map(lambda g: g * jnp.nan, grads[1])
  for g in (grads[0], bad):
    _, state = jax.jit(tx.update)(g, state, PARAMS)
  assert all(int(getattr(state, name)) == top for name in counts)


def test_the_draw_count_and_the_bad_hyperparameter_counts_stop_at_the_int32_limit():
  # A wrapped num_draws would divide the mean by a negative count; at the limit
  # max_draws=None (int32's largest) forces a step.
  top = jnp.iinfo(jnp.int32).max
  gate = gates.norm_below(lambda count: jnp.nan)  # bad at every microbatch: no step
  tx = optax.chain(
      optax_gqc.accumulate(optax.sgd(0.1), gate, max_draws=None),
      optax_gqc.scale_to_norm(lambda count: jnp.nan),
  )
  acc, norm = tx.init(PARAMS)
  acc = acc._replace(
      num_draws=jnp.asarray(top, jnp.int32),
      gate_state={**acc.gate_state, 'num_bad_hyperparams': jnp.asarray(top, jnp.int32)},
  )
  norm = norm._replace(num_bad_hyperparams=jnp.asarray(top, jnp.int32))
  _, (acc, norm) = jax.jit(tx.update)(grad_stream(1, seed=1)[0], (acc, norm), PARAMS)
  assert (int(acc.num_forced), int(acc.num_draws), int(acc.last_num_draws)) == (1, 0, top)
  assert float(acc.last_grad_norm) > 0
  assert int(acc.gate_state['num_bad_hyperparams']) == top
  assert int(norm.num_bad_hyperparams) == top


def test_update_and_apply_differentiates_as_the_optax_path():
  """Derivatives through the fused step (a learning rate's, the params') are the Optax path's."""
  grads = grad_stream(6, seed=7)

  def final_loss(lr, params, fused):
    tx = optax_gqc.sbc(optax.adamw(lr, weight_decay=0.1), logical_batch_size=2, microbatch_size=1)
    state = tx.init(params)
    for g in grads:
      if fused:
        params, state = optax_gqc.update_and_apply(tx, g, state, params)
      else:
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
    return sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(params))

  grad = jax.jit(jax.grad(final_loss, argnums=(0, 1)), static_argnums=2)
  d_lr, d_params = grad(0.1, PARAMS, True)
  ref_lr, ref_params = grad(0.1, PARAMS, False)
  assert float(ref_lr) != 0.0
  np.testing.assert_allclose(d_lr, ref_lr, rtol=1e-5)
  chex.assert_trees_all_close(d_params, ref_params, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('cond_order', ['as_jax_traces_it', 'zero_branch_first'])
def test_optax_path_traces_the_inner_optimizer_once(cond_order, monkeypatch):
  """The zero updates take their shapes from the step branch's trace.

  Should ``lax.cond`` trace the branch that only accumulates first, the engine
  falls back to ``jax.eval_shape`` (a second trace), with the same result.
  """
  _, ref_state, ref_params = run(
      optax_gqc.gnts(optax.adam(1e-2), threshold=0.5, max_draws=3), grad_stream(8, seed=5)
  )[-1]
  if cond_order == 'zero_branch_first':
    cond = jax.lax.cond  # traces true_fun first; swapped, the zero branch is first
    monkeypatch.setattr(
        jax.lax, 'cond', lambda pred, t, f, *ops: cond(jnp.logical_not(pred), f, t, *ops)
    )
  traces = []
  inner = optax.adam(1e-2)

  def update(updates, state, params=None):
    traces.append(1)
    return inner.update(updates, state, params)

  tx = optax_gqc.gnts(optax.GradientTransformation(inner.init, update), threshold=0.5, max_draws=3)
  step = jax.jit(tx.update)
  params, state = PARAMS, tx.init(PARAMS)
  for g in grad_stream(8, seed=5):
    updates, state = step(g, state, params)
    params = optax.apply_updates(params, updates)
  assert len(traces) == (1 if cond_order == 'as_jax_traces_it' else 2)
  chex.assert_trees_all_equal(params, ref_params)
  assert 0 < int(state.num_steps) == int(ref_state.num_steps) < 8  # both branches ran


@pytest.mark.parametrize('clone', [copy.copy, copy.deepcopy])
def test_a_copied_accumulation_keeps_its_fused_path(clone):
  tx = optax_gqc.sbc(optax.sgd(0.05), 2, 1)
  twin = clone(tx)
  assert type(twin) is optax_gqc.AccumulationTransformation
  params, state = PARAMS, twin.init(PARAMS)
  ref_params, ref_state = PARAMS, tx.init(PARAMS)
  for g in grad_stream(6, seed=4):
    params, state = jax.jit(twin.update_and_apply)(g, state, params)
    ref_params, ref_state = jax.jit(tx.update_and_apply)(g, ref_state, ref_params)
    chex.assert_trees_all_equal((params, state), (ref_params, ref_state))
  assert int(state.num_steps) == 3


def test_update_and_apply_updates_donated_params_and_state_in_place():
  tx = FUSED_CASES['gnts']()

  # Taken in the order they are returned: jax gives each output the first
  # donated buffer of its shape and dtype, in argument order.
  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, state, grads):
    return optax_gqc.update_and_apply(tx, grads, state, params)

  params = jax.tree.map(jnp.copy, PARAMS)
  state = tx.init(params)
  memory = train_step.lower(params, state, PARAMS).compile().memory_analysis()
  assert memory.alias_size_in_bytes == sum(x.nbytes for x in jax.tree.leaves((params, state)))
  for g in grad_stream(8, seed=5):
    donated = jax.tree.leaves((params, state))
    buffers = [x.unsafe_buffer_pointer() for x in donated]
    params, state = train_step(params, state, g)
    assert all(x.is_deleted() for x in donated)
    # Every output, parameters included, lives in its own input's buffer.
    assert [x.unsafe_buffer_pointer() for x in jax.tree.leaves((params, state))] == buffers
  assert 0 < int(state.num_steps) < 8


def test_update_and_apply_inside_scan_equals_a_python_loop():
  tx = FUSED_CASES['gnts']()
  grads = grad_stream(12, seed=4)
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *grads)

  def body(carry, g):
    return optax_gqc.update_and_apply(tx, g, carry[1], carry[0]), None

  (params, state), _ = jax.jit(lambda c, gs: jax.lax.scan(body, c, gs))(
      (PARAMS, tx.init(PARAMS)), stacked
  )
  ref_params, ref_state = PARAMS, tx.init(PARAMS)
  for g in grads:
    ref_params, ref_state = jax.jit(optax_gqc.update_and_apply, static_argnums=0)(
        tx, g, ref_state, ref_params
    )
  chex.assert_trees_all_equal((params, state), (ref_params, ref_state))


def test_update_and_apply_writes_no_param_sized_temporary():
  params = {'w': jnp.zeros((512, 512))}
  tx = optax_gqc.gnts(optax.adamw(1e-3), threshold=0.0, max_draws=8)
  state = tx.init(params)

  def temp_bytes(fn):
    compiled = jax.jit(fn, donate_argnums=(0, 1)).lower(params, state, params).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  def optax_path(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  param_bytes = 512 * 512 * 4
  assert temp_bytes(optax_path) >= param_bytes  # the zero update
  assert temp_bytes(lambda p, s, g: optax_gqc.update_and_apply(tx, g, s, p)) < param_bytes
  # What the docstring warns of: donated in another order than returned, the
  # parameters get the moments' buffers, and XLA copies.
  swapped = jax.jit(optax_gqc.update_and_apply, static_argnums=0, donate_argnums=(2, 3))
  memory = swapped.lower(tx, params, state, params).compile().memory_analysis()
  assert memory.temp_size_in_bytes >= param_bytes


@pytest.mark.parametrize('name', ['gnts', 'sbc'])
@pytest.mark.parametrize('fused', [False, True], ids=['optax_path', 'fused'])
def test_the_step_stays_a_cond_that_xla_cannot_make_a_select(name, fused):
  # XLA:GPU replaces a cond whose branches are all elementwise with a select
  # between both branches: the inner optimizer would run on every microbatch.
  adamw = optax.adamw(1e-3)

  def do_step(params, state, grads):
    updates, state = adamw.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  def bare(step, params, state, grads):  # the check can tell
    return jax.lax.cond(step, do_step, lambda p, s, g: (p, s), params, state, grads)

  assert selectable_conds(bare, True, PARAMS, adamw.init(PARAMS), PARAMS) == [True]
  tx = {'gnts': optax_gqc.gnts(adamw), 'sbc': optax_gqc.sbc(adamw, 8, 1)}[name]
  if fused:
    step = functools.partial(optax_gqc.update_and_apply, tx)
  else:
    step = tx.update
  assert selectable_conds(step, PARAMS, tx.init(PARAMS), PARAMS) == [False]


def test_microbatch_size_is_given_once_to_the_gate_or_to_both_alike():
  params = {'w': jnp.zeros(2)}

  def size(tx):
    return int(tx.init(params).microbatch_size)

  gate = optax_gqc.gates.batch_size_at_least(64, 8)
  assert size(optax_gqc.accumulate(optax.sgd(0.1), gate)) == 8
  assert size(optax_gqc.accumulate(optax.sgd(0.1), gate, microbatch_size=8)) == 8
  assert size(optax_gqc.accumulate(optax.sgd(0.1), optax_gqc.gates.norm_below(1.0))) == 0
  with pytest.raises(ValueError, match='microbatch_size=4, but the gate counts microbatches of 8'):
    optax_gqc.accumulate(optax.sgd(0.1), gate, microbatch_size=4)


def test_a_python_number_among_the_params_accumulates_as_multisteps_does():
  params = {'w': jnp.zeros(3), 'temperature': 1.0}  # a leaf that is a Python float
  loss = lambda p, x: jnp.sum((p['w'] - x) ** 2) + (p['temperature'] * x[0]) ** 2  # noqa: E731
  ours, theirs = optax_gqc.sbc(optax.sgd(0.1), 2, 1), optax.MultiSteps(optax.sgd(0.1), 2)
  state, ms_state = ours.init(params), theirs.init(params)
  assert state.accumulator['temperature'].dtype == jnp.float32
  for x in jnp.arange(12.0).reshape(4, 3):
    g = jax.grad(loss)(params, x)
    updates, state = jax.jit(ours.update)(g, state, params)
    ms_updates, ms_state = theirs.update(g, ms_state, params)
    np.testing.assert_allclose(updates['temperature'], ms_updates['temperature'], rtol=1e-6)
    np.testing.assert_allclose(updates['w'], ms_updates['w'], rtol=1e-6)
  assert int(state.num_steps) == 2 and float(updates['temperature']) != 0.0


def test_params_unlike_those_of_init_are_named_not_the_state():
  params = {'w': jnp.zeros(4), 'b': jnp.zeros(())}
  grads = jax.tree.map(jnp.ones_like, params)
  tx = optax_gqc.sbc(optax.adam(0.1), 1, 1)
  state = tx.init(params)
  for update in (tx.update, lambda g, s, p: optax_gqc.update_and_apply(tx, g, s, p)):
    with pytest.raises(ValueError, match=r"param \['w'\] has shape \(5,\), but the params given"):
      update(grads, state, {**params, 'w': jnp.zeros(5)})
    with pytest.raises(ValueError, match='the params do not match those given to init'):
      update(grads, state, {'w': params['w']})  # was: "the state does not belong"
  with pytest.raises(TypeError, match='update_and_apply returns the new params'):
    optax_gqc.update_and_apply(tx, grads, state, None)  # the step was lost


def test_fused_params_unlike_init_are_named_when_the_state_ignores_them():
  # sgd's state holds nothing of the params: apply_updates was the first to see them.
  params = {'w': jnp.zeros(4), 'b': jnp.zeros(())}
  grads = jax.tree.map(jnp.ones_like, params)
  tx = optax_gqc.sbc(optax.sgd(0.1), 1, 1)
  state = tx.init(params)
  fused = jax.jit(functools.partial(optax_gqc.update_and_apply, tx))
  with pytest.raises(ValueError, match=r"do not match the inner update; missing \['b'\]"):
    fused(grads, state, {'w': params['w']})
  with pytest.raises(ValueError, match=r"not updated \['c'\]"):
    fused(grads, state, {**params, 'c': jnp.zeros(2)})
  new_params, _ = fused(grads, state, params)
  np.testing.assert_allclose(new_params['w'], -0.1)


def test_lookahead_params_given_to_init_are_told_how_to_wrap_lookahead():
  # optax.lookahead's own docs init it with LookaheadParams; its gradients are the fast params'.
  fast = {'w': jnp.ones(3)}
  tx = optax_gqc.sbc(optax.lookahead(optax.sgd(0.1), 2, 0.5), 1, 1)
  params = optax.LookaheadParams(fast, fast)
  state = tx.init(params)
  with pytest.raises(ValueError, match=r'init the accumulation with the fast params'):
    tx.update({'w': jnp.ones(3)}, state, params)


def test_an_inner_optimizer_with_params_of_its_own_keeps_working():
  # optax.lookahead's update takes its fast and slow params, not those of init.
  fast = {'w': jnp.ones(3)}
  tx = optax_gqc.sbc(optax.lookahead(optax.sgd(0.1), 2, 0.5), 1, 1)
  state = tx.init(fast)
  params = optax.LookaheadParams(fast, fast)
  updates, state = jax.jit(tx.update)({'w': jnp.ones(3)}, state, params)
  np.testing.assert_allclose(updates.fast['w'], -0.1)


@pytest.mark.parametrize('apply', [False, True], ids=['optax_path', 'fused'])
def test_a_bad_scale_by_draws_gives_a_zero_update_and_is_counted(apply):
  # inf at n = 1, NaN at n = 2, negative at n = 3: each would corrupt the
  # params or reverse the step.
  def rule(n):
    return jnp.select([n == 1, n == 2, n == 3], [jnp.inf, jnp.nan, -1.0], 1.0)

  tx = optax_gqc.accumulate(optax.sgd(0.1), gates.norm_below(1.5), max_draws=3, scale_by_draws=rule)
  params = {'w': jnp.ones(3)}
  state = tx.init(params)

  def optax_path(grads, state, params):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(functools.partial(optax_gqc.update_and_apply, tx) if apply else optax_path)
  draws = []
  for g in [0.5, 2.0, -1.5, 2.0, 2.0, 2.0]:  # steps after 1, 2 and 3 (forced) microbatches
    params, state = step({'w': jnp.full(3, g)}, state, params)
    draws.append(int(state.last_num_draws))
  assert draws == [1, 1, 2, 2, 2, 3]
  np.testing.assert_array_equal(params['w'], 1.0)
  assert int(state.num_bad_hyperparams) == 3


def test_a_good_scale_by_draws_is_not_counted():
  tx = optax_gqc.sbc(optax.sgd(0.1), 2, 1, scale_by_draws=jnp.sqrt)
  params = {'w': jnp.ones(3)}
  state = tx.init(params)
  for _ in range(4):
    updates, state = jax.jit(tx.update)({'w': jnp.ones(3)}, state, params)
  np.testing.assert_allclose(updates['w'], -0.1 * np.sqrt(2), rtol=1e-6)
  assert int(state.num_bad_hyperparams) == 0


@pytest.mark.parametrize('rule', [np.sqrt, math.sqrt], ids=['numpy', 'math'])
def test_a_scale_by_draws_jax_cannot_trace_names_the_argument(rule):
  tx = optax_gqc.sbc(optax.sgd(0.1), 2, 1, scale_by_draws=rule)
  params = {'w': jnp.ones(3)}
  with pytest.raises(TypeError, match='scale_by_draws must be a function that JAX can trace'):
    jax.jit(tx.update)({'w': jnp.ones(3)}, tx.init(params), params)


def test_scale_by_draws_may_read_the_mapped_axis():
  # It is traced in the step, under the axis: at construction no axis is bound.
  tx = optax_gqc.sbc(
      optax.sgd(1.0),
      2,
      1,
      axis_name='d',
      scale_by_draws=lambda n: jnp.sqrt(n * jax.lax.psum(1, 'd')),
  )
  params = {'w': jnp.zeros((2, 3))}
  state = jax.vmap(tx.init)(params)
  update = jax.jit(jax.vmap(tx.update, axis_name='d'))
  for _ in range(2):
    updates, state = update({'w': jnp.ones((2, 3))}, state, params)
  np.testing.assert_array_equal(updates['w'], -2.0)  # the mean, 1, times sqrt(2 * 2)
