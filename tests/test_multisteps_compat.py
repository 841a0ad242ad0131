# Copyright 2019 DeepMind Technologies Limited. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
"""Optax's tests of ``optax.MultiSteps``, run against ``sbc`` and ``accumulate``.

Adapted from Optax's ``optax/transforms/_accumulation_test.py`` (optax 0.2.8):
every test of ``MultiSteps`` runs on ``optax_gqc.sbc`` with a constant logical
batch of ``k`` microbatches, and on ``optax_gqc.accumulate`` with a gate that
opens at ``k`` draws, both with no ``max_draws``. Where Optax only checks that
the code runs, the adaptation also compares with ``MultiSteps`` itself.
MultiSteps' ``has_updated(state)`` is ``num_draws == 0 and num_steps > 0`` here,
and its ``mini_step`` is ``num_draws``.

Left out: ``test_ema`` and ``test_ema_debias`` (they test ``optax.ema``, which
optax_gqc does not replace) and ``test_skip_large_updates`` (optax_gqc has no
``skip_large_updates``: clip large gradients in the inner optimizer with
``optax.clip_by_global_norm``, or rely on the gates, which wait while the mean
is long).
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from optax_gqc import gates

MICROBATCH = 8


def sbc_k(inner, k, **kwargs):
  """``sbc`` stepping every ``k`` microbatches; ``k`` may be a schedule of the microbatch count."""
  batch = (lambda t: k(t) * MICROBATCH) if callable(k) else k * MICROBATCH
  return optax_gqc.sbc(inner, batch, MICROBATCH, **kwargs)


def accumulate_k(inner, k, **kwargs):
  """``accumulate`` with a gate that opens at ``k`` draws."""
  gate = gates.from_function(lambda s: s.num_draws >= (k(s.num_microbatches) if callable(k) else k))
  return optax_gqc.accumulate(inner, gate, max_draws=None, **kwargs)


MULTI_STEPS = pytest.mark.parametrize('make', [sbc_k, accumulate_k], ids=['sbc', 'accumulate'])


def has_updated(state):
  return bool((state.num_draws == 0) & (state.num_steps > 0))


def multi_steps(inner, k, **kwargs):
  ms = optax.MultiSteps(inner, k, **kwargs)
  return ms, optax.GradientTransformationExtraArgs(ms.init, ms.update)


class Loss(flax.linen.Module):

  @flax.linen.compact
  def __call__(self, x, dtype=jnp.float32, param_dtype=jnp.float32):
    return jnp.sum(flax.linen.Dense(10, dtype=dtype, param_dtype=param_dtype)(x) ** 2)


@pytest.mark.parametrize(
    'bad', [float('inf'), -float('inf'), float('nan')], ids=['pos_inf', 'neg_inf', 'nan']
)
def test_skip_not_finite(bad):
  # MultiSteps' skip_not_finite is the engine's skip_nonfinite, on by default.
  tx = sbc_k(optax.sgd(1.0), 2)
  params = [jnp.zeros([]), jnp.zeros([])]
  update = jax.jit(tx.update)
  _, state = update([jnp.array(bad), jnp.zeros([])], tx.init(params), params)
  assert int(state.num_skipped) == 1 and int(state.num_draws) == 0
  _, state = update([jnp.array(11.0), jnp.zeros([])], state, params)
  assert int(state.num_skipped) == 1 and int(state.num_draws) == 1


@MULTI_STEPS
def test_multi_steps(make):
  batch_size = 32
  x_size = 7
  # Parameters should be updated only every `k_steps` optimization steps.
  k_steps = 4
  data = jnp.ones([batch_size, x_size])
  loss = Loss()

  params = loss.init({'params': jax.random.key(0)}, data)['params']

  def loss_apply(params, data):
    return loss.apply({'params': params}, data)

  # A non-trivial inner optimizer: it has a state and needs the params.
  def inner():
    return optax.chain(optax.scale_by_adam(), optax.add_decayed_weights(1e-2), optax.scale(-1e-4))

  tx = make(inner(), k_steps)
  _, ms = multi_steps(inner(), k_steps)

  # The training in one function, to check that the update is jittable.
  @jax.jit
  def train_step(data, opt_state, ms_state, params):
    grad = jax.grad(loss_apply)(params, data)
    updates, opt_state = tx.update(grad, opt_state, params)
    ms_updates, ms_state = ms.update(grad, ms_state, params)
    return updates, opt_state, ms_updates, ms_state

  opt_state, ms_state = tx.init(params), ms.init(params)
  prev_loss = loss_apply(params, data)
  for idx in range(5 * k_steps):
    updates, opt_state, ms_updates, ms_state = train_step(data, opt_state, ms_state, params)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12), updates, ms_updates
    )
    new_params = optax.apply_updates(params, updates)
    new_loss = loss_apply(new_params, data)
    if idx % k_steps < k_steps - 1:
      # The parameters should not have changed and the loss should be constant.
      jax.tree.map(np.testing.assert_array_equal, new_params, params)
      np.testing.assert_equal(new_loss, prev_loss)
      assert not has_updated(opt_state)
    else:
      # A step: the parameters move and the loss goes down.
      np.testing.assert_array_less(new_loss, prev_loss)
      prev_loss = new_loss
      assert has_updated(opt_state)
    params = new_params


@MULTI_STEPS
def test_multi_steps_every_k_schedule(make):
  # MultiSteps' every_k_schedule is a function of the optimizer steps taken;
  # optax_gqc schedules the logical batch by microbatches seen (torch-gqc's
  # convention). Here both read "1 microbatch for the first 2, then 3".
  tx = make(optax.sgd(1e-4), lambda t: jnp.where(t < 2, 1, 3))
  ms_opt, ms = multi_steps(optax.sgd(1e-4), lambda grad_step: jnp.where(grad_step < 2, 1, 3))
  params = {'a': jnp.zeros([])}
  opt_state, ms_state = tx.init(params), ms.init(params)
  grad = {'a': jnp.zeros([])}
  assert not has_updated(opt_state)

  @jax.jit
  def update(opt_state, ms_state):
    return tx.update(grad, opt_state, params)[1], ms.update(grad, ms_state, params)[1]

  # First two steps have 1 mini-step per update.
  for _ in range(2):
    opt_state, ms_state = update(opt_state, ms_state)
    assert has_updated(opt_state) and ms_opt.has_updated(ms_state)
  # Subsequently, 3 mini-steps per update.
  for _ in range(5):
    for _ in range(2):
      opt_state, ms_state = update(opt_state, ms_state)
      assert not has_updated(opt_state) and not ms_opt.has_updated(ms_state)
    opt_state, ms_state = update(opt_state, ms_state)
    assert has_updated(opt_state) and ms_opt.has_updated(ms_state)


@MULTI_STEPS
def test_multi_steps_scan_dtype_stability(make):
  # The accumulator's dtype must stay the same under jax.lax.scan.
  tx = make(optax.sgd(1e-4), 2, accumulator_dtype=jnp.float32)
  params = {'a': jnp.zeros([], dtype=jnp.bfloat16)}

  # bfloat16 gradients must not promote the state to bfloat16.
  def train_step(state, _):
    grad = {'a': jnp.ones([], dtype=jnp.bfloat16)}
    updates, opt_state = tx.update(grad, state, params)
    return opt_state, updates

  final_state, updates = jax.lax.scan(train_step, tx.init(params), jnp.arange(4))
  assert final_state.accumulator['a'].dtype == jnp.float32
  assert int(final_state.num_steps) == 2
  assert updates['a'].dtype == jnp.bfloat16


@MULTI_STEPS
def test_multi_steps_zero_nans(make):
  # MultiSteps is compatible with zero_nans (github.com/google-deepmind/optax/issues/828).
  # Without skip_nonfinite, a NaN reaches the inner optimizer as MultiSteps lets it.
  def inner():
    return optax.chain(optax.zero_nans(), optax.sgd(1.0))

  tx = make(inner(), 2, skip_nonfinite=False)
  _, ms = multi_steps(inner(), 2)
  params = {'a': jnp.zeros([]), 'b': jnp.zeros([])}
  state, ms_state = tx.init(params), ms.init(params)
  grads = [{'a': jnp.ones([]), 'b': jnp.array(jnp.nan)}, {'a': jnp.ones([]), 'b': jnp.ones([])}]

  @jax.jit
  def update(grad, state, ms_state):
    return (*tx.update(grad, state, params), *ms.update(grad, ms_state, params))

  for grad in grads:
    updates, state, ms_updates, ms_state = update(grad, state, ms_state)
    assert jax.tree.map(float, updates) == jax.tree.map(float, ms_updates)
  assert jax.tree.map(float, updates) == {'a': -1.0, 'b': 0.0}


@MULTI_STEPS
def test_multi_steps_computes_mean(make):
  k_steps = 4
  tx = make(optax.scale(1.0), k_steps)
  params = {'a': jnp.zeros([])}
  opt_state = tx.init(params)
  grads = [{'a': jnp.ones([]) * i} for i in [1, 2, 3, 4]]
  assert not has_updated(opt_state)

  update = jax.jit(tx.update)

  # First 3 steps don't update.
  for grad in grads[:-1]:
    _, opt_state = update(grad, opt_state, params)
    assert not has_updated(opt_state)

  # Actual update.
  new_params, opt_state = update(grads[-1], opt_state, params)
  assert has_updated(opt_state)
  np.testing.assert_array_equal(new_params['a'], 2.5)


@MULTI_STEPS
def test_multi_steps_skip_not_finite(make):
  tx = make(optax.sgd(1.0), 2)
  opt_update = jax.jit(tx.update)
  params = {'a': jnp.zeros([])}
  opt_state = jax.jit(tx.init)(params)

  def two_good_updates(params, opt_state, expected):
    for draws in (1, 0):
      updates, opt_state = opt_update({'a': jnp.ones([])}, opt_state, params)
      assert int(opt_state.num_draws) == draws
      params = optax.apply_updates(params, updates)
    np.testing.assert_array_equal(params['a'], jnp.full([], expected))
    return params, opt_state

  params, opt_state = two_good_updates(params, opt_state, -1.0)
  # Inf and NaN updates: no increase in num_draws, no change to the params.
  for bad in (float('inf'), float('nan')):
    updates, opt_state = opt_update({'a': jnp.array(bad)}, opt_state, params)
    assert int(opt_state.num_draws) == 0
    params = optax.apply_updates(params, updates)
    np.testing.assert_array_equal(params['a'], jnp.negative(jnp.ones([])))
  _, opt_state = two_good_updates(params, opt_state, -2.0)
  assert int(opt_state.num_skipped) == 2


DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]


@pytest.mark.slow  # three programs to compile per case
@MULTI_STEPS
@pytest.mark.parametrize(
    'opt_kwargs',
    [{'learning_rate': 0.1}, {'learning_rate': 0.1, 'mu_dtype': jnp.float32}],
    ids=['adam', 'adam_mu_float32'],
)
@pytest.mark.parametrize('upd_dtype', DTYPES, ids=lambda d: d.__name__)
def test_multi_steps_mixed_precision(make, opt_kwargs, upd_dtype):
  batch_size = 32
  x_size = 7
  k_steps = 4
  loss = Loss()

  def loss_apply(params, data):
    return loss.apply({'params': params}, data)

  # Compare the optimizer's dtypes with and without the accumulation.
  opt = optax.adam(**opt_kwargs)
  ms_opt = make(optax.adam(**opt_kwargs), k_steps)

  @jax.jit
  def train_step(data, opt_state, ms_opt_state, params):
    grad = jax.grad(loss_apply)(params, data)
    grad = jax.tree.map(lambda x: x.astype(upd_dtype), grad)  # mimic varying dtype
    return (*opt.update(grad, opt_state, params), *ms_opt.update(grad, ms_opt_state, params))

  def get_dtypes(tree):
    return jax.tree.map(lambda x: x.dtype, tree)

  for param_dtype in DTYPES:
    data = jnp.ones([batch_size, x_size]).astype(param_dtype)
    params = loss.init({'params': jax.random.key(0)}, data, param_dtype=param_dtype)['params']
    opt_state = opt.init(params)
    ms_opt_state = ms_opt.init(params)
    for _ in range(k_steps + 1):
      updates, opt_state, ms_updates, ms_opt_state = train_step(
          data, opt_state, ms_opt_state, params
      )
      # The updates have the inner optimizer's dtypes; the params keep theirs.
      assert get_dtypes(updates) == get_dtypes(ms_updates), param_dtype
      new_params = optax.apply_updates(params, ms_updates)
      assert get_dtypes(params) == get_dtypes(new_params), param_dtype
      params = new_params
    assert int(ms_opt_state.num_steps) == 1
    assert get_dtypes(ms_opt_state.inner_state) == get_dtypes(ms_opt.init(params).inner_state)


# Beyond Optax's tests.


@pytest.mark.parametrize('k', [1, 3, 64, 65, 100])
def test_sbc_is_multisteps_for_every_k_with_no_max_draws(k):
  params = {'w': jnp.zeros(3)}
  grads = jax.random.normal(jax.random.key(k), (2 * k + 1, 3))
  tx = sbc_k(optax.sgd(1.0, momentum=0.5), k)
  _, ms = multi_steps(optax.sgd(1.0, momentum=0.5), k)

  def body(carry, g):
    state, ms_state = carry
    updates, state = tx.update({'w': g}, state, params)
    ms_updates, ms_state = ms.update({'w': g}, ms_state, params)
    return (state, ms_state), (updates['w'], ms_updates['w'])

  (state, _), (ours, theirs) = jax.jit(
      lambda gs: jax.lax.scan(body, (tx.init(params), ms.init(params)), gs)
  )(grads)
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
  stepped = np.flatnonzero(np.any(np.asarray(ours) != 0, axis=1))
  np.testing.assert_array_equal(stepped, np.arange(k - 1, 2 * k + 1, k))
  assert int(state.num_forced) == 0 and int(state.last_num_draws) == k


def test_sbc_with_max_draws_below_its_batch_raises():
  with pytest.raises(
      ValueError, match=r'max_draws \(64\) is below the 100 microbatches.*max_draws=None'
  ):
    optax_gqc.sbc(optax.sgd(1.0), 800, 8, max_draws=64)
  optax_gqc.sbc(optax.sgd(1.0), 800, 8, max_draws=100)  # enough: no error
