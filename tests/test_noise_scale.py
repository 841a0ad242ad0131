"""The gradient noise scale: golden numbers, known truth, and the data-parallel form."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import optax_gqc
from optax_gqc import _noise_scale, gates
from tests import processes
from tests._helpers import division_rtol


def test_golden_two_batch_estimates():
  grad_sq, trace = optax_gqc.noise_scale_estimates(8, 7.25, 64, 1.78125)
  np.testing.assert_allclose([grad_sq, trace], [1.0, 50.0], rtol=division_rtol(), atol=0)


@pytest.mark.parametrize(
    'small, big, why',
    [
        (8, 8, 'equal sizes'),
        (0, 8, 'not positive'),
        (-8, 64, 'not positive'),
        (8, float('nan'), 'not positive and finite'),
        (8, float('inf'), 'not positive and finite'),
    ],
)
def test_two_batch_estimates_need_two_positive_sizes(small, big, why):
  with pytest.raises(ValueError, match=f'positive, finite and differ.*{why}'):
    optax_gqc.noise_scale_estimates(small, 7.25, big, 1.78125)
  # Traced sizes pass unchecked (under jit they cannot be read): the formula as it is.
  out = jax.jit(optax_gqc.noise_scale_estimates)(small, 7.25, big, 1.78125)
  np.testing.assert_array_equal(out, _noise_scale.estimates(small, 7.25, big, 1.78125))


def regression_run(d, s, delta_norm, *, microbatch=4, draws=8, steps=4000, seed=0, gate=None):
  """Engine noise scale on linear regression, and the per-step estimates, from one stream.

  y = x . w* + N(0, s^2), x ~ N(0, I_d), per-example loss (x.w - y)^2 / 2, at
  w = w* + delta: B_simple = (d + 1) + d s^2 / |delta|^2.
  """
  kw, kd, ke = jax.random.split(jax.random.key(seed), 3)
  w_star = jax.random.normal(kw, (d,))
  delta = jax.random.normal(kd, (d,))
  w = w_star + delta * delta_norm / jnp.linalg.norm(delta)
  if gate is None:
    gate = gates.batch_size_at_least(draws * microbatch, microbatch)
  tx = optax_gqc.accumulate(
      optax.sgd(0.0), gate, max_draws=2 * draws, microbatch_size=microbatch, noise_decay=0.998
  )

  def body(state, key):
    kx, kn = jax.random.split(key)
    x = jax.random.normal(kx, (microbatch, d))
    y = x @ w_star + s * jax.random.normal(kn, (microbatch,))
    g = {'w': x.T @ (x @ w - y) / microbatch}
    _, state = tx.update(g, state, {'w': w})
    return state, g['w']

  keys = jax.random.split(ke, steps * draws)
  state, grads = jax.jit(lambda st: jax.lax.scan(body, st, keys))(tx.init({'w': w}))
  g = np.asarray(grads, np.float64).reshape(steps, draws, d)
  small_sq = np.mean(np.sum(g**2, -1), 1)
  big_sq = np.sum(g.mean(1) ** 2, -1)
  grad_sq, trace = optax_gqc.noise_scale_estimates(microbatch, small_sq, draws * microbatch, big_sq)
  truth = (d + 1) + d * s**2 / delta_norm**2
  return truth, optax_gqc.statistics(state), np.mean(np.asarray(trace) / np.asarray(grad_sq))


@pytest.mark.parametrize(
    'd, s, delta_norm', [(10, 1.0, 1.0), (50, 0.5, 2.0), (20, 2.0, 2.0), (5, 0.0, 1.0)]
)
def test_engine_noise_scale_matches_linear_regression_truth(d, s, delta_norm):
  truth, stats, _ = regression_run(d, s, delta_norm)
  assert float(stats['noise_scale']) == pytest.approx(truth, rel=0.05)
  assert float(stats['grad_sq_norm_est']) == pytest.approx(delta_norm**2, rel=0.1)
  assert float(stats['trace_cov_est']) == pytest.approx(truth * delta_norm**2, rel=0.1)


@pytest.mark.parametrize('d, s, delta_norm', [(10, 1.0, 1.0), (5, 0.0, 1.0)])
def test_ratio_of_averages_is_unbiased_where_average_of_ratios_is_not(d, s, delta_norm):
  truth, stats, mean_of_ratios = regression_run(d, s, delta_norm)
  assert abs(float(stats['noise_scale']) / truth - 1) < 0.05
  assert abs(mean_of_ratios / truth - 1) > 0.10  # per-step |G|^2 estimates near 0 blow up


@pytest.mark.parametrize(
    'gate, direction', [(gates.norm_below(1.2), 1), (gates.relative_error_below(0.5), -1)]
)
def test_gates_that_read_the_gradients_bias_the_estimate(gate, direction):
  # The documented limitation: stopping where the mean happens to be short (or
  # to pass the test) selects the big-batch norms the estimate is made of.
  truth, stats, _ = regression_run(10, 1.0, 1.0, steps=1500, gate=gate)
  assert direction * (float(stats['noise_scale']) / truth - 1) > 0.15


def test_noise_scale_units_and_nan_before_an_estimate():
  params = {'w': jnp.zeros(3)}
  grads = [{'w': jnp.array([1.0, 0.0, 2.0])}, {'w': jnp.array([0.0, 1.0, 1.0])}]

  def final_stats(microbatch_size):
    every_two = gates.from_function(lambda s: s.num_draws >= 2)
    tx = optax_gqc.accumulate(optax.sgd(0.0), every_two, microbatch_size=microbatch_size)
    state = tx.init(params)
    _, state = jax.jit(tx.update)(grads[0], state, params)
    first = optax_gqc.statistics(state)
    _, state = jax.jit(tx.update)(grads[1], state, params)
    return first, optax_gqc.statistics(state)

  first, in_microbatches = final_stats(None)
  assert np.isnan(float(first['noise_scale']))
  _, in_examples = final_stats(16)
  # Bias correction after one estimate: the estimates themselves.
  grad_sq, trace = optax_gqc.noise_scale_estimates(1, (5 + 2) / 2, 2, 0.25 + 0.25 + 2.25)
  assert float(in_microbatches['grad_sq_norm_est']) == pytest.approx(float(grad_sq), rel=1e-6)
  assert float(in_microbatches['trace_cov_est']) == pytest.approx(float(trace), rel=1e-6)
  assert float(in_examples['noise_scale']) == pytest.approx(
      16 * float(in_microbatches['noise_scale']), rel=1e-6
  )


def test_noise_scale_needs_no_param_sized_buffer():
  params = {'w': jnp.zeros((64, 64)), 'b': jnp.zeros(64)}
  plain = optax_gqc.accumulate(optax.sgd(0.1), gates.norm_below(0.1), noise_decay=0.9)
  state = plain.init(params)
  big = [x for x in jax.tree.leaves(state) if x.size > 1]
  assert len(big) == 2  # the accumulator's two leaves; sgd(0.1) keeps nothing


def test_standalone_noise_scale_with_an_injected_microbatch_size_under_jit():
  grads = {'w': jax.random.normal(jax.random.key(2), (4, 6))}

  def run(make):
    tx = make()
    state = tx.init({'w': jnp.zeros(6)})
    update = jax.vmap(tx.update, axis_name='data', in_axes=(0, None), out_axes=(0, None))
    return jax.jit(update)(grads, state)[1]

  injected = run(
      lambda: optax.inject_hyperparams(optax_gqc.noise_scale, static_args=('axis_name',))(
          decay=0.5, axis_name='data', microbatch_size=8
      )
  ).inner_state
  plain = run(lambda: optax_gqc.noise_scale(decay=0.5, axis_name='data', microbatch_size=8))
  np.testing.assert_allclose(injected.noise_scale, plain.noise_scale, rtol=1e-6)
  assert np.isfinite(plain.noise_scale)


def test_standalone_noise_scale_under_named_vmap():
  devices, d = 4, 6
  grads = {'w': jax.random.normal(jax.random.key(2), (devices, d))}
  tx = optax_gqc.noise_scale(decay=0.5, axis_name='data', microbatch_size=8)
  state = tx.init({'w': jnp.zeros(d)})

  @jax.jit
  def update(g, state):
    return jax.vmap(tx.update, axis_name='data', in_axes=(0, None), out_axes=(0, None))(g, state)

  out, state = update(grads, state)
  np.testing.assert_array_equal(out['w'], grads['w'])  # passed through
  g = np.asarray(grads['w'])
  grad_sq, trace = optax_gqc.noise_scale_estimates(
      8, np.mean(np.sum(g**2, 1)), 8 * devices, np.sum(g.mean(0) ** 2)
  )
  assert float(state.noise_scale) == pytest.approx(float(trace / grad_sq), rel=1e-5)
  assert float(state.weight) == 0.5


def test_a_gradient_that_is_not_finite_leaves_the_estimates_as_they_were():
  # One NaN held the EMAs at NaN for good, and the noise scale read +inf.
  tx = optax_gqc.noise_scale(decay=0.9, axis_name='d')
  update = jax.jit(jax.vmap(tx.update, axis_name='d', in_axes=(0, None), out_axes=(0, None)))
  clean = {'w': jnp.array([[1.0, 2.0], [3.0, 0.0]])}
  state = tx.init({'w': jnp.zeros(2)})
  _, state = update({'w': jnp.array([[1.0, 2.0], [jnp.nan, 0.0]])}, state)
  assert float(state.weight) == 0.0
  _, state = update(clean, state)
  _, expected = update(clean, tx.init({'w': jnp.zeros(2)}))
  assert float(state.noise_scale) == float(expected.noise_scale) == pytest.approx(4 / 3)
  # The engine, which lets an Inf microbatch through with skip_nonfinite=False.
  acc = optax_gqc.sbc(optax.sgd(0.1), 2, 1, skip_nonfinite=False)
  params = {'w': jnp.zeros(2)}
  acc_state = acc.init(params)
  for g in ([1.0, jnp.inf], [1.0, 2.0], [1.0, 2.0], [3.0, 0.0]):
    _, acc_state = jax.jit(acc.update)({'w': jnp.array(g)}, acc_state, params)
  assert float(acc_state.noise.weight) > 0 and np.isfinite(float(acc_state.noise.noise_scale))
  # Finite microbatches (none skipped) whose sums of squared norms overflow float32.
  acc = optax_gqc.sbc(optax.sgd(0.1), 2, 1)
  acc_state = acc.init(params)
  for g in ([1.2e19, 1e19], [1e19, 1.2e19], [1.0, 2.0], [3.0, 0.0]):
    _, acc_state = jax.jit(acc.update)({'w': jnp.array(g)}, acc_state, params)
  assert int(acc_state.num_skipped) == 0
  assert float(acc_state.noise.weight) > 0 and np.isfinite(float(acc_state.noise.noise_scale))


def test_a_traced_decay_outside_its_range_leaves_the_estimates_as_they_were():
  # Under inject_hyperparams one NaN decay held the EMAs at NaN for good.
  tx = optax.inject_hyperparams(optax_gqc.noise_scale, static_args=('axis_name',))(
      decay=0.5, axis_name='d'
  )
  update = jax.jit(jax.vmap(tx.update, axis_name='d', in_axes=(0, None), out_axes=(0, None)))
  clean = {'w': jnp.array([[1.0, 2.0], [3.0, 0.0]])}
  state = tx.init({'w': jnp.zeros(2)})
  _, good = update(clean, state)
  for bad in (jnp.nan, 1.0, -0.5):
    state.hyperparams['decay'] = jnp.asarray(bad)
    _, state = update(clean, state)
    assert float(state.inner_state.weight) == 0.0
  state.hyperparams['decay'] = jnp.asarray(0.5)
  _, state = update(clean, state)
  assert float(state.inner_state.noise_scale) == float(good.inner_state.noise_scale)


def test_standalone_noise_scale_takes_a_list_of_axes_as_a_tuple():
  grads = {'w': jnp.array([[1.0, 2.0], [0.0, 1.0]])}
  scales = []
  for axis_name in (['data'], ('data',)):
    tx = optax_gqc.noise_scale(0.9, axis_name=axis_name)
    update = jax.vmap(tx.update, axis_name='data', in_axes=(0, None), out_axes=(0, None))
    scales.append(float(update(grads, tx.init({'w': jnp.zeros(2)}))[1].noise_scale))
  assert scales[0] == scales[1] and np.isfinite(scales[0])


def test_standalone_noise_scale_needs_axis_name():
  with pytest.raises(TypeError, match='axis_name'):
    optax_gqc.noise_scale(0.99)  # pytype: disable=missing-parameter


def test_standalone_noise_scale_over_one_device_makes_no_estimate():
  # One device's batch is both the small and the big one: 0 / 0 read as an infinite scale.
  tx = optax_gqc.noise_scale(0.9, axis_name='data')
  state = tx.init({'w': jnp.zeros(2)})
  update = jax.vmap(tx.update, axis_name='data', in_axes=(0, None), out_axes=(0, None))
  grads = {'w': jnp.array([[1.0, 2.0]])}
  for _ in range(3):
    out, state = update(grads, state)
  np.testing.assert_array_equal(out['w'], grads['w'])
  assert float(state.weight) == 0.0 and np.isnan(float(state.noise_scale))
  assert np.isnan(float(optax_gqc.statistics(state)['noise_scale']))


SHARD_MAP_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax_gqc
    from jax.sharding import Mesh, PartitionSpec as P
    assert jax.device_count() == 8
    d, per_device, s = 8, 16, 1.0
    w_star = jax.random.normal(jax.random.key(0), (d,))
    w = w_star + 1.0 / np.sqrt(d)  # |delta| = 1
    truth = (d + 1) + d * s**2
    tx = optax_gqc.noise_scale(decay=0.995, axis_name='data', microbatch_size=per_device)
    mesh = Mesh(np.array(jax.devices()), ('data',))

    def local_grad(key):
        kx, kn = jax.random.split(key[0])
        x = jax.random.normal(kx, (per_device, d))
        y = x @ w_star + s * jax.random.normal(kn, (per_device,))
        return {'w': x.T @ (x @ w - y) / per_device}

    @jax.jit
    def step(state, keys):
        def body(keys, state):
            return tx.update(local_grad(keys), state)[1]
        return jax.shard_map(body, mesh=mesh, in_specs=(P('data'), P()), out_specs=P())(
            keys, state)

    state = tx.init({'w': jnp.zeros(d)})
    for i in range(3000):
        state = step(state, jax.random.split(jax.random.key(i + 1), 8))
    est = float(state.noise_scale)
    assert abs(est / truth - 1) < 0.05, (est, truth)
    print('ok', est, truth)
""")


@pytest.mark.slow
def test_standalone_noise_scale_under_shard_map_on_8_devices():
  out = processes.run_code(SHARD_MAP_SCRIPT, num_devices=8, timeout=600)
  assert out.startswith('ok')


def test_standalone_noise_scale_raises_on_gradients_already_summed_by_check_vma():
  # One device is enough for JAX to type the gradient of a replicated
  # parameter as invariant, i.e. already summed over the devices.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))
  tx = optax_gqc.noise_scale(axis_name='data')
  w = jnp.ones(3)

  def local(x):
    grads = {'w': jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)}
    return tx.update(grads, tx.init(grads))[1].noise_scale

  run = jax.shard_map(local, mesh=mesh, in_specs=P('data'), out_specs=P())
  with pytest.raises(ValueError, match=r"\['w'\].*pcast\(params, 'data'.*check_vma=False"):
    jax.jit(run)(jnp.ones((4, 3)))


def test_standalone_noise_scale_names_a_bare_array_gradient_already_summed():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))
  tx = optax_gqc.noise_scale(axis_name='data')
  w = jnp.ones(3)

  def local(x):
    grads = jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)
    return tx.update(grads, tx.init(grads))[1].noise_scale

  run = jax.shard_map(local, mesh=mesh, in_specs=P('data'), out_specs=P())
  with pytest.raises(ValueError, match=r'the gradient \(a bare array\) does not vary across'):
    jax.jit(run)(jnp.ones((4, 3)))


# Both modes on 8 devices, a few steps: the estimate is the one of the
# per-device gradients, and their pmean is the global mean gradient.
CHECK_VMA_SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np, optax_gqc
    from jax.sharding import Mesh, PartitionSpec as P
    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()), ('data',))
    w = {'w': jnp.linspace(-1.0, 1.0, 6), 'b': jnp.ones([])}
    x = jax.random.normal(jax.random.key(0), (3, 8 * 4, 6))
    y = jax.random.normal(jax.random.key(1), (3, 8 * 4))
    tx = optax_gqc.noise_scale(decay=0.5, axis_name='data', microbatch_size=4)

    def loss(w, x, y):  # the mean over this device's batch
        return jnp.mean((x @ w['w'] + w['b'] - y) ** 2)

    def run(check_vma, pcast, estimate=True):
        def local(w, x, y):
            state = tx.init(w)
            for i in range(3):
                params = jax.lax.pcast(w, 'data', to='varying') if pcast else w
                grads = jax.grad(loss)(params, x[i], y[i])
                if estimate:
                    grads, state = tx.update(grads, state)
                mean = jax.lax.pmean(grads, 'data')
            return state.noise_scale, mean

        f = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, 'data'), P(None, 'data')),
                          out_specs=(P(), P()), check_vma=check_vma)
        try:
            ns, mean = jax.jit(f)(w, x, y)
        except ValueError as e:
            return {'error': str(e)}
        return {'noise_scale': float(ns), 'mean': np.asarray(mean['w']).tolist()}

    # The reference, from each device's gradient computed apart.
    small, big, mean = [], [], None
    for i in range(3):
        per_device = [jax.grad(loss)(w, x[i, 4 * d:4 * d + 4], y[i, 4 * d:4 * d + 4])
                      for d in range(8)]
        flat = np.stack([np.concatenate([g['w'], g['b'][None]]) for g in per_device])
        small.append(np.mean(np.sum(flat**2, 1)))
        big.append(np.sum(flat.mean(0) ** 2))
        mean = flat.mean(0)[:6]
    ema = lambda v: sum(0.5 * 0.5 ** (2 - i) * v[i] for i in range(3))
    g, t = optax_gqc.noise_scale_estimates(4, ema(small), 32, ema(big))
    print(json.dumps({
        'reference': {'noise_scale': float(t / g), 'mean': mean.tolist()},
        'check_vma_pcast': run(True, True),
        'check_vma_replicated': run(True, False),
        'no_check_vma': run(False, False),
        'check_vma_replicated_no_estimate': run(True, False, estimate=False),
    }))
""")


@pytest.fixture(scope='module')
def check_vma_runs():
  return processes.run_script(CHECK_VMA_SCRIPT)


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['check_vma_pcast', 'no_check_vma'])
def test_standalone_noise_scale_reads_per_device_gradients_in_both_modes(check_vma_runs, mode):
  reference, run = check_vma_runs['reference'], check_vma_runs[mode]
  assert run['noise_scale'] == pytest.approx(reference['noise_scale'], rel=1e-4)
  np.testing.assert_allclose(run['mean'], reference['mean'], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_standalone_noise_scale_never_reads_summed_gradients_silently(check_vma_runs):
  assert 'check_vma=False' in check_vma_runs['check_vma_replicated']['error']


@pytest.mark.slow
def test_pmean_of_gradients_summed_by_check_vma_is_their_sum(check_vma_runs):
  # The pitfall docs/scale.md warns of: pmean of an invariant value is that
  # value, so the "mean" gradient is 8 times too long.
  reference = np.asarray(check_vma_runs['reference']['mean'])
  np.testing.assert_allclose(
      check_vma_runs['check_vma_replicated_no_estimate']['mean'], 8 * reference, rtol=1e-5
  )


@pytest.mark.parametrize(
    'grad_sq_ema, trace_ema, weight, expected',
    [
        (0.0, 0.0, 0.0, np.nan),  # no estimate yet
        (2.0, 6.0, 0.5, 3.0),  # the bias correction cancels
        (0.0, 6.0, 0.5, np.inf),  # |G|^2 not positive: noise swamps the signal
        (-1.0, 6.0, 0.5, np.inf),
        (2.0, -6.0, 0.5, 0.0),  # a negative trace counts as 0
    ],
)
def test_one_edge_rule_for_the_noise_scale_everywhere(grad_sq_ema, trace_ema, weight, expected):
  noise = optax_gqc.NoiseScaleState(*(jnp.float32(x) for x in (grad_sq_ema, trace_ema, weight)))
  np.testing.assert_equal(float(noise.noise_scale), expected)
  # The engine's gate and its statistics read the same rule, in microbatches and examples.
  tx = optax_gqc.accumulate(
      optax.sgd(0.1), optax_gqc.gates.batch_size_at_least(4, 2), microbatch_size=2
  )
  state = tx.init({'w': jnp.zeros(2)})._replace(noise=noise)
  np.testing.assert_equal(float(optax_gqc.statistics(state)['noise_scale']), 2 * expected)
  seen = []
  gate = optax_gqc.gates.from_function(lambda stats: seen.append(stats.noise_scale) or True)
  tx = optax_gqc.accumulate(optax.sgd(0.1), gate)
  tx.update({'w': jnp.ones(2)}, tx.init({'w': jnp.zeros(2)})._replace(noise=noise))
  np.testing.assert_equal(float(seen[0]), expected)
