"""The gradient noise scale: golden numbers, known truth, and the data-parallel form."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from optax_gqc import gates


def test_golden_two_batch_estimates():
  grad_sq, trace = optax_gqc.noise_scale_estimates(8, 7.25, 64, 1.78125)
  assert float(grad_sq) == 1.0 and float(trace) == 50.0


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
    tx = optax_gqc.accumulate(
        optax.sgd(0.0), gates.batch_size_at_least(2, 1), microbatch_size=microbatch_size
    )
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
  assert float(state.noise_weight) == 0.5


def test_standalone_noise_scale_needs_axis_name():
  with pytest.raises(TypeError, match='axis_name'):
    optax_gqc.noise_scale(0.99)  # pytype: disable=missing-parameter


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
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  out = subprocess.run(
      [sys.executable, '-c', SHARD_MAP_SCRIPT], env=env, capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.startswith('ok')
