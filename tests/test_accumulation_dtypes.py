"""The engine on mixed-precision, complex and float64 parameters."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from optax_gqc import gates

MIXED = {'w': jnp.linspace(-1.0, 1.0, 12).reshape(3, 4).astype(jnp.bfloat16), 'b': jnp.ones(4)}


def stream(num, params, seed=0, dtype=None):
  """Random gradients shaped like ``params``, in ``dtype`` or each param's own."""
  keys = jax.random.split(jax.random.key(seed), num)

  def one(key):
    leaves, treedef = jax.tree.flatten(params)
    subkeys = jax.random.split(key, 2 * len(leaves))
    out = []
    for i, p in enumerate(leaves):
      dt = dtype or p.dtype
      if jnp.issubdtype(dt, jnp.complexfloating):
        real = jax.random.normal(subkeys[2 * i], p.shape)
        imag = jax.random.normal(subkeys[2 * i + 1], p.shape)
        out.append((real + 1j * imag).astype(dt))
      else:
        out.append(jax.random.normal(subkeys[2 * i], p.shape).astype(dt))
    return treedef.unflatten(out)

  return [one(keys[i]) for i in range(num)]  # indexed: iterating compiles an unstack per length


def run(tx, grads, params):
  """Updates and params under jit, applying each update; returns the final state too."""
  update = jax.jit(tx.update)
  state = tx.init(params)
  out = []
  for g in grads:
    updates, state = update(g, state, params)
    params = optax.apply_updates(params, updates)
    out.append((updates, params))
  return out, state


def dtypes(tree):
  return jax.tree.map(lambda x: jnp.asarray(x).dtype, tree)


@pytest.mark.parametrize(
    'make_inner',
    [
        lambda: optax.adam(1e-2),
        lambda: optax.sgd(1e-2, momentum=0.9),
        lambda: optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=0.1),
    ],
    ids=['adam', 'sgd_momentum', 'inject_adamw'],
)
def test_bf16_params_with_float32_grads_match_multisteps(make_inner):
  # adam's mu and sgd's trace follow the gradients' dtype (float32), while init
  # made them bf16: the step branch must cast them back, as MultiSteps does.
  k = 3
  grads = stream(2 * k + 1, MIXED, dtype=jnp.float32)
  tx = optax_gqc.sbc(make_inner(), logical_batch_size=k, microbatch_size=1)
  ours, state = run(tx, grads, MIXED)
  multi = optax.MultiSteps(make_inner(), k)
  ref, ref_state = run(optax.GradientTransformation(multi.init, multi.update), grads, MIXED)
  for (u, p), (u_ref, p_ref) in zip(ours, ref, strict=True):
    assert dtypes(u) == dtypes(u_ref)
    chex.assert_trees_all_close(u, u_ref, rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_equal(p, p_ref)
  init = make_inner().init(MIXED)
  assert dtypes(state.inner_state) == dtypes(init) == dtypes(ref_state.inner_opt_state)
  assert int(state.num_steps) == 2


def test_an_inner_state_whose_structure_follows_the_dtypes_matches_multisteps():
  # The state check builds the inner state from the params, not from the
  # float32 accumulator, whose labels here would all be 'train'.
  def labels(params):
    return jax.tree.map(lambda x: 'train' if x.dtype == jnp.float32 else 'frozen', params)

  def make_inner():
    return optax.partition({'train': optax.adam(0.1), 'frozen': optax.set_to_zero()}, labels)

  grads = stream(4, MIXED)
  ours, _ = run(optax_gqc.sbc(make_inner(), logical_batch_size=2, microbatch_size=1), grads, MIXED)
  multi = optax.MultiSteps(make_inner(), 2)
  ref, _ = run(optax.GradientTransformation(multi.init, multi.update), grads, MIXED)
  for (u, _), (u_ref, _) in zip(ours, ref, strict=True):
    chex.assert_trees_all_close(u, u_ref, rtol=1e-6)
  assert np.any(np.asarray(ours[-1][0]['b']) != 0)  # the float32 leaf trains


def test_complex_parameters_keep_their_imaginary_part():
  params = {'w': jnp.array([1 + 1j, 2 - 1j], jnp.complex64)}
  g = {'w': jnp.array([0.5 - 0.25j, 1 + 2j], jnp.complex64)}
  tx = optax_gqc.gnts(optax.sgd(1.0), threshold=float('inf'))
  state = tx.init(params)
  assert state.accumulator['w'].dtype == jnp.complex64
  updates, _ = jax.jit(tx.update)(g, state, params)
  np.testing.assert_array_equal(updates['w'], np.array([-0.5 + 0.25j, -1 - 2j], np.complex64))


@pytest.mark.parametrize('make_inner', [lambda: optax.sgd(0.1), lambda: optax.adam(0.1)])
def test_gnts_with_infinite_threshold_is_the_inner_optimizer_on_complex64(make_inner):
  params = {'w': jnp.array([1 + 1j, 2 - 1j, -0.5j], jnp.complex64), 'b': jnp.ones(2)}
  grads = stream(6, params, seed=1)
  ours, _ = run(optax_gqc.gnts(make_inner(), threshold=float('inf')), grads, params)
  plain, _ = run(make_inner(), grads, params)
  for (u, p), (u_ref, p_ref) in zip(ours, plain, strict=True):
    assert dtypes(u) == dtypes(u_ref)
    chex.assert_trees_all_close(u, u_ref, rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_close(p, p_ref, rtol=1e-6, atol=1e-7)


def test_complex_gradient_norm_counts_the_imaginary_part():
  # |3 + 4i| = 5: a threshold of 4 must not open (the real part alone, 3, would).
  params = {'w': jnp.zeros(1, jnp.complex64)}
  tx = optax_gqc.gnts(optax.sgd(1.0), threshold=4.0, max_draws=8)
  g = {'w': jnp.array([3 + 4j], jnp.complex64)}
  _, state = jax.jit(tx.update)(g, tx.init(params), params)
  stats = optax_gqc.statistics(state)
  assert float(stats['acc_norm']) == pytest.approx(5.0)
  assert int(stats['num_steps']) == 0


def test_injected_hyperparameters_on_complex_params_say_how_to_keep_them_real():
  # inject_hyperparams casts a threshold to complex params' dtype: the error was "float()
  # argument must be ... a real number, not 'complex'". hyperparam_dtype keeps it real.
  params = {'w': jnp.zeros(2, jnp.complex64)}
  g = {'w': jnp.array([3 + 4j, 0], jnp.complex64)}
  with pytest.raises(TypeError, match='threshold must be real.*hyperparam_dtype=jnp.float32'):
    optax.inject_hyperparams(optax_gqc.gnts)(optax.sgd(1.0), threshold=4.0).init(params)
  tx = optax.inject_hyperparams(optax_gqc.gnts, hyperparam_dtype=jnp.float32)(
      optax.sgd(1.0), threshold=6.0
  )
  updates, _ = jax.jit(tx.update)(g, tx.init(params), params)
  np.testing.assert_array_equal(updates['w'], -np.asarray(g['w']))  # |g| = 5 < 6: a step


def test_complex_sbc_matches_multisteps():
  params = {'w': jnp.array([1 + 1j, 2 - 1j], jnp.complex64)}
  grads = stream(8, params, seed=2)
  ours, _ = run(optax_gqc.sbc(optax.adam(0.1), 4, 1), grads, params)
  multi = optax.MultiSteps(optax.adam(0.1), 4, accumulator_dtype=jnp.complex64)
  ref, _ = run(optax.GradientTransformation(multi.init, multi.update), grads, params)
  for (u, p), (u_ref, p_ref) in zip(ours, ref, strict=True):
    chex.assert_trees_all_close(u, u_ref, rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_close(p, p_ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('dtype, expected', [(float, jnp.float32), (complex, jnp.complex64)])
def test_python_float_as_accumulator_dtype_is_jaxs_default(dtype, expected):
  # jnp.zeros(2, float) is float32 without x64: float means the default, not float64.
  tx = optax_gqc.sbc(optax.sgd(0.1), 2, 1, accumulator_dtype=dtype)
  params = {'w': jnp.zeros(2)}
  assert tx.init(params).accumulator['w'].dtype == expected


def test_float64_under_x64_is_the_inner_optimizer():
  with jax.enable_x64(True):
    params = {'w': jnp.array([1.0, 2.0, -3.0], jnp.float64)}
    # Differences at 1e-12 relative: a float32 accumulator would erase them.
    grads = [{'w': jnp.array([1 / 3, 0.1, 2.0], jnp.float64) + 1e-12 * i} for i in range(5)]
    tx = optax_gqc.gnts(optax.adam(1e-2), threshold=float('inf'))
    assert tx.init(params).accumulator['w'].dtype == jnp.float64
    ours, _ = run(tx, grads, params)
    plain, _ = run(optax.adam(1e-2), grads, params)
    for (u, p), (u_ref, p_ref) in zip(ours, plain, strict=True):
      assert u['w'].dtype == p['w'].dtype == jnp.float64
      chex.assert_trees_all_close(u, u_ref, rtol=1e-15, atol=0)
      chex.assert_trees_all_close(p, p_ref, rtol=1e-15, atol=0)


def test_float64_mean_of_many_microbatches_under_x64():
  with jax.enable_x64(True):
    params = {'w': jnp.zeros(2, jnp.float64)}
    grads = [{'w': jnp.array([1.0 + 1e-10 * i, -1.0], jnp.float64)} for i in range(8)]
    tx = optax_gqc.sbc(optax.sgd(1.0), 8, 1)
    ours, _ = run(tx, grads, params)
    expected = -np.mean([np.asarray(g['w']) for g in grads], axis=0)
    np.testing.assert_allclose(ours[-1][0]['w'], expected, rtol=1e-15)


@pytest.mark.parametrize(
    'make',
    [
        lambda: optax_gqc.accumulate(
            optax.sgd(0.1), gates.norm_below(0.5), max_draws=4, noise_decay=np.float64(0.9)
        ),
        lambda: optax_gqc.accumulate(
            optax.sgd(0.1),
            gates.norm_below(0.5, relative=True, decay=np.float64(0.99)),
            max_draws=4,
        ),
        lambda: optax_gqc.mht(optax.sgd(0.1), 0.9, 0.05, decay=np.float64(0.99), max_draws=4),
    ],
    ids=['noise_decay', 'norm_below_decay', 'mht_decay'],
)
def test_float64_hyperparameters_under_x64_keep_the_state_float32(make):
  # decay * old promoted the float32 EMAs to float64: a state that changes
  # type retraces jit and breaks lax.scan (and the gates raised).
  with jax.enable_x64(True):
    tx = make()
    params = {'w': jnp.array([1.0, 2.0, -3.0], jnp.float32)}
    grads = jnp.stack([jnp.array([1.0, -0.5, 0.2]) * (i + 1) for i in range(6)])

    def body(state, g):
      updates, state = tx.update({'w': g}, state, params, value=jnp.sum(g))
      return state, updates['w']

    state0 = tx.init(params)
    state, _ = jax.lax.scan(body, state0, grads)
    assert dtypes(state) == dtypes(state0)
    assert int(optax_gqc.statistics(state)['num_steps']) >= 1


def test_a_long_bfloat16_sum_rounds_new_microbatches_away():
  # What docs/robustness.md says of accumulator_dtype=jnp.bfloat16: 8
  # significant bits. From a sum of 128, whose last bit is 1, a microbatch of
  # 1/3 rounds to nothing, so 1024 of them sum to 128: a mean of 1/8.
  params = {'w': jnp.zeros([], jnp.float32)}

  def mean_of(k, dtype):
    tx = optax_gqc.sbc(optax.sgd(-1.0), k, 1, accumulator_dtype=dtype)

    def body(state, _):
      updates, state = tx.update({'w': jnp.float32(1 / 3)}, state, params)
      return state, updates['w']

    return float(jax.lax.scan(body, tx.init(params), length=k)[1][-1])

  for k in (16, 64, 256, 1024):
    assert mean_of(k, None) == pytest.approx(1 / 3, rel=1e-5)
  assert mean_of(16, jnp.bfloat16) == pytest.approx(1 / 3, rel=0.01)
  assert mean_of(256, jnp.bfloat16) == pytest.approx(1 / 3, rel=0.05)
  assert mean_of(1024, jnp.bfloat16) == 0.125


def test_a_bfloat16_sum_of_float16_gradients_keeps_the_mean_in_float16s_range():
  # bfloat16 rounds 65504, float16's largest, to 65536, which float16 makes inf.
  params = {'w': jnp.zeros(2, jnp.float16)}
  tx = optax_gqc.sbc(optax.sgd(-1.0), 2, 1, accumulator_dtype=jnp.bfloat16)
  g = {'w': jnp.array([65504.0, 1.0], jnp.float16)}
  for path in ('optax', 'fused'):
    p, state = params, tx.init(params)
    for _ in range(2):
      if path == 'fused':
        p, state = jax.jit(functools.partial(optax_gqc.update_and_apply, tx))(g, state, p)
      else:
        updates, state = jax.jit(tx.update)(g, state, p)
        p = optax.apply_updates(p, updates)
    assert p['w'].tolist() == [65504.0, 1.0] and int(state.num_skipped) == 0
  inf = {'w': jnp.array([jnp.inf, 1.0], jnp.float16)}  # an infinite mean stays infinite
  tx = optax_gqc.sbc(optax.sgd(-1.0), 1, 1, accumulator_dtype=jnp.bfloat16, skip_nonfinite=False)
  assert jax.jit(tx.update)(inf, tx.init(params), params)[0]['w'].tolist() == [np.inf, 1.0]


@pytest.mark.parametrize(
    'param_dtype, requested, expected',
    [
        (jnp.bfloat16, None, jnp.float32),
        (jnp.float16, None, jnp.float32),
        (jnp.float32, None, jnp.float32),
        (jnp.complex64, None, jnp.complex64),
        (jnp.bfloat16, jnp.bfloat16, jnp.bfloat16),
        (jnp.complex64, jnp.float32, jnp.complex64),
    ],
)
def test_accumulator_dtype(param_dtype, requested, expected):
  tx = optax_gqc.gnts(optax.sgd(1.0), 0.5, accumulator_dtype=requested)
  state = tx.init({'w': jnp.zeros(2, param_dtype)})
  assert state.accumulator['w'].dtype == expected
