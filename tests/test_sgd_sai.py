"""Tests of SGD-SaI: golden trajectories, the PyTorch reference, and its fixed bugs."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from optax_gqc._sgd_sai import scale_by_gsnr, sgd_sai

SHAPES = {'a': (5,), 'b': (3, 4), 'c': (2, 3, 8)}


def random_tree(rng, shapes, scale=1.0, shift=0.0):
  return {k: (scale * rng.standard_normal(s) + shift).astype(np.float32) for k, s in shapes.items()}


def np_gsnr(g, eps=1e-8):
  """g-SNR from the formula, in float64."""
  g = np.asarray(g, np.float64)
  return np.linalg.norm(g) / (np.std(g, ddof=1) + eps)


def golden(params, grads, lr, momentum, weight_decay, eps=1e-8):
  """SGD-SaI from the formula, in float64 numpy: the params after each step.

  ``lr`` is a function of the step index; ``weight_decay`` a float or a dict
  of floats per leaf. Every leaf's first gradient is non-zero.
  """
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  s, m, out = {}, {}, []
  for t, g in enumerate(grads):
    for k in p:
      gk = np.asarray(g[k], np.float64)
      wd = weight_decay[k] if isinstance(weight_decay, dict) else weight_decay
      if k not in s:
        s[k] = np_gsnr(gk, eps)
        m[k] = gk
      else:
        m[k] = momentum * m[k] + (1 - momentum) * gk
      p[k] = (1 - lr(t) * wd) * p[k] - lr(t) * s[k] * m[k]
    out.append({k: v.copy() for k, v in p.items()})
  return out


def make_step(tx):
  @jax.jit
  def step(params, state, g):
    updates, state = tx.update(g, state, params)
    return optax.apply_updates(params, updates), state

  return step


def run(tx, params, grads, step=None, states=False):
  """Runs ``tx`` under jit; returns the params after each step and the last state.

  With ``states``, the state after each step instead of the last. Pass the
  ``step`` of :func:`make_step` to run one optimizer more than once without
  compiling it again.
  """
  step = step or make_step(tx)
  params = jax.tree.map(jnp.asarray, params)
  state = tx.init(params)
  out, out_states = [], []
  for g in grads:
    params, state = step(params, state, g)
    out.append(params)
    out_states.append(state)
  return out, (out_states if states else state)


def run_scan(tx, params, grads):
  """Runs ``tx`` over ``grads`` in one jitted ``lax.scan``; returns the last params and state."""
  stacked = jax.tree.map(lambda *g: np.stack(g), *grads)

  @jax.jit
  def loop(params, stacked):
    def step(carry, g):
      params, state = carry
      updates, state = tx.update(g, state, params)
      return (optax.apply_updates(params, updates), state), None

    return jax.lax.scan(step, (params, tx.init(params)), stacked)[0]

  return loop(jax.tree.map(jnp.asarray, params), stacked)


def reference():
  torch = pytest.importorskip('torch')
  sgd_sai_ref = pytest.importorskip('sgd_sai')
  return torch, sgd_sai_ref.SGD_sai


def run_reference(params, grads, lr_fn=None, **kwargs):
  """Runs the PyTorch reference on the same gradients; returns params, optimizer, tensors."""
  torch, sgd_sai_ref = reference()
  tensors = {k: torch.nn.Parameter(torch.tensor(np.array(v))) for k, v in params.items()}
  opt = sgd_sai_ref(list(tensors.values()), **kwargs)
  step_reference(opt, tensors, grads, lr_fn)
  return {k: t.detach().numpy().copy() for k, t in tensors.items()}, opt, tensors


def step_reference(opt, tensors, grads, lr_fn=None, start=0):
  torch, _ = reference()
  for t, g in enumerate(grads, start):
    if lr_fn is not None:
      opt.param_groups[0]['lr'] = lr_fn(t)
    for k, x in tensors.items():
      x.grad = torch.tensor(np.array(g[k]))
    opt.step()


def ref_gsnr(opt, tensors):
  return {k: float(opt.state[x]['gsnr']) for k, x in tensors.items()}


def as_np(tree):
  return jax.tree.map(np.asarray, tree)


# Golden trajectories from the formula.


@pytest.mark.parametrize(
    'momentum, weight_decay, schedule',
    [(0.9, 1e-2, False), (0.5, 0.1, True), (0.0, 0.0, False), (0.9, 0.0, True)],
)
def test_three_steps_match_the_formula(momentum, weight_decay, schedule):
  rng = np.random.default_rng(0)
  params = random_tree(rng, SHAPES)
  grads = [random_tree(rng, SHAPES, scale=0.5 * (t + 1), shift=0.1) for t in range(3)]
  if schedule:
    lr, lr_fn = (lambda count: 0.1 / (1.0 + count)), (lambda t: 0.1 / (1.0 + t))
  else:
    lr, lr_fn = 0.1, (lambda t: 0.1)
  ours, state = run(sgd_sai(lr, momentum, weight_decay=weight_decay), params, grads)
  want = golden(params, grads, lr_fn, momentum, weight_decay)
  for got_t, want_t in zip(ours, want, strict=True):
    for k in SHAPES:
      np.testing.assert_allclose(got_t[k], want_t[k], rtol=1e-6, atol=1e-6)
  gsnr = optax.tree.get(state, 'gsnr')
  for k in SHAPES:
    assert gsnr[k].shape == () and gsnr[k].dtype == jnp.float32
    np.testing.assert_allclose(gsnr[k], np_gsnr(grads[0][k]), rtol=1e-6)


# The PyTorch reference, same process, same gradients.


@pytest.mark.parametrize('momentum, weight_decay, schedule', [(0.9, 1e-2, False), (0.5, 0.1, True)])
def test_matches_reference_over_200_steps(momentum, weight_decay, schedule):
  shapes = {'a': (7,), 'b': (16, 8), 'c': (4, 3, 5), 'd': (2,), 'e': (64, 32)}
  rng = np.random.default_rng(1)
  params = random_tree(rng, shapes)
  grads = [random_tree(rng, shapes, scale=0.1, shift=0.05) for _ in range(200)]
  lr_fn = (lambda t: 1e-2 * (1 - t / 400)) if schedule else None
  lr = (lambda count: 1e-2 * (1 - count / 400)) if schedule else 1e-2
  want, opt, tensors = run_reference(
      params, grads, lr_fn, lr=1e-2, momentum=momentum, weight_decay=weight_decay
  )
  ours, state = run_scan(sgd_sai(lr, momentum, weight_decay=weight_decay), params, grads)
  # The reference multiplies by float32(1 - lr * wd) each step, a ~3e-8
  # relative rounding that builds up to a few 1e-6 over 200 steps.
  for k in shapes:
    err = np.linalg.norm(np.asarray(ours[k]) - want[k]) / np.linalg.norm(want[k])
    assert err < 1e-5, (k, err)
  gsnr = optax.tree.get(state, 'gsnr')
  for k, v in ref_gsnr(opt, tensors).items():
    np.testing.assert_allclose(gsnr[k], v, rtol=1e-6)


# The g-SNR is taken once and lives in the state.


def test_gsnr_is_taken_once():
  rng = np.random.default_rng(2)
  params = random_tree(rng, SHAPES)
  first = [random_tree(rng, SHAPES)]
  later = [random_tree(rng, SHAPES, scale=100.0, shift=300.0) for _ in range(3)]
  _, states = run(sgd_sai(1e-3), params, first + later, states=True)
  gsnr, gsnr_later = optax.tree.get(states[0], 'gsnr'), optax.tree.get(states[-1], 'gsnr')
  for k in SHAPES:
    # The later gradients would give a much larger g-SNR, yet it is kept.
    assert np_gsnr(later[0][k]) > 2 * float(gsnr[k])
    assert float(gsnr_later[k]) == float(gsnr[k])


def test_gsnr_survives_save_and_restore_unlike_the_reference():
  rng = np.random.default_rng(3)
  params = random_tree(rng, SHAPES)
  before = [random_tree(rng, SHAPES) for _ in range(3)]
  after = [random_tree(rng, SHAPES, scale=10.0, shift=30.0) for _ in range(3)]
  tx = sgd_sai(1e-2)
  step = make_step(tx)

  p, s = jax.tree.map(jnp.asarray, params), tx.init(params)
  for g in before:
    p, s = step(p, s, g)
  saved_p, saved_s = as_np(p), as_np(s)  # e.g. written to disk and read back
  for g in after:
    p, s = step(p, s, g)
  p2, s2 = saved_p, saved_s
  for g in after:
    p2, s2 = step(p2, s2, g)
  for a, b in zip(jax.tree.leaves((p, s)), jax.tree.leaves((p2, s2)), strict=True):
    np.testing.assert_array_equal(a, b)

  # The reference: an uninterrupted run agrees with ours; a run resumed with
  # load_state_dict into a fresh optimizer recomputes the g-SNR from the
  # first gradient after the restart.
  torch, sgd_sai_ref = reference()
  _, opt, tensors = run_reference(params, before, lr=1e-2)
  resumed_tensors = {k: torch.nn.Parameter(x.detach().clone()) for k, x in tensors.items()}
  resumed = sgd_sai_ref(list(resumed_tensors.values()), lr=1e-2)
  resumed.load_state_dict(opt.state_dict())
  step_reference(opt, tensors, after)
  step_reference(resumed, resumed_tensors, after)
  ours_gsnr = optax.tree.get(s, 'gsnr')
  for k in SHAPES:
    np.testing.assert_allclose(ref_gsnr(opt, tensors)[k], ours_gsnr[k], rtol=1e-6)
    np.testing.assert_allclose(
        ref_gsnr(resumed, resumed_tensors)[k], np_gsnr(after[0][k]), rtol=1e-5
    )
    assert ref_gsnr(resumed, resumed_tensors)[k] > 2 * float(ours_gsnr[k])
    got = tensors[k].detach().numpy()
    np.testing.assert_allclose(p[k], got, rtol=1e-5, atol=1e-6)
    assert not np.allclose(resumed_tensors[k].detach().numpy(), got, rtol=1e-3)


# The reference's bugs, fixed.


@pytest.mark.filterwarnings('ignore:std:UserWarning')  # the reference's std of one entry
def test_one_element_leaf_gets_gsnr_one():
  params = {'s': np.array([1.0], np.float32), 'w': np.arange(6, dtype=np.float32)}
  grads = [{'s': np.array([0.5], np.float32), 'w': np.linspace(-1, 2, 6, dtype=np.float32)}]
  want, opt, tensors = run_reference(params, grads, lr=1e-2, weight_decay=0.0)
  assert ref_gsnr(opt, tensors)['s'] == pytest.approx(0.5 / 1e-8)  # |g| / eps
  assert abs(want['s'][0]) > 1e5  # 1 - 1e-2 * 5e7 * 0.5: the parameter explodes

  ours, state = run(sgd_sai(1e-2, weight_decay=0.0), params, grads)
  assert float(optax.tree.get(state, 'gsnr')['s']) == 1.0
  np.testing.assert_allclose(ours[0]['s'], [1.0 - 1e-2 * 0.5], rtol=1e-6)
  np.testing.assert_allclose(ours[0]['w'], want['w'], rtol=1e-6)  # the rest agrees


def test_constant_first_gradient_gets_gsnr_one():
  cases = {'a': (0.1, (1000,)), 'b': (0.25, (4, 3)), 'c': (-3.0, (2,))}
  params = {k: np.ones(shape, np.float32) for k, (_, shape) in cases.items()}
  rng = np.random.default_rng(4)
  grads = [
      {k: np.full(shape, v, np.float32) for k, (v, shape) in cases.items()},
      random_tree(rng, {k: shape for k, (_, shape) in cases.items()}),
  ]
  want, opt, tensors = run_reference(params, grads[:1], lr=1e-2, weight_decay=0.0)
  for k in cases:
    # The reference's float32 std is 0 or rounding noise: ||g|| / eps or more.
    assert ref_gsnr(opt, tensors)[k] > 1e7
    assert np.max(np.abs(want[k])) > 1e4

  ours, state = run(sgd_sai(1e-2, weight_decay=0.0), params, grads)
  for k, (v, _) in cases.items():
    assert float(optax.tree.get(state, 'gsnr')[k]) == 1.0  # kept after the second step
    np.testing.assert_allclose(ours[0][k], 1.0 - 1e-2 * v, rtol=1e-6)
    assert np.all(np.isfinite(ours[1][k]))


def test_complex_params_match_the_reference():
  # The g-SNR of a complex leaf takes moduli about its complex mean, as torch.std does;
  # the real part alone would give a purely imaginary gradient a g-SNR of 0.
  rng = np.random.default_rng(9)

  def complex_tree(shift):
    return {
        k: (rng.normal(size=s) + 1j * rng.normal(size=s) + shift).astype(np.complex64)
        for k, s in SHAPES.items()
    }

  params = complex_tree(0.0)
  grads = [complex_tree(0.3j) for _ in range(4)]
  want, opt, tensors = run_reference(params, grads, lr=1e-2, weight_decay=1e-2)
  ours, state = run(sgd_sai(1e-2, weight_decay=1e-2), params, grads)
  gsnr = optax.tree.get(state, 'gsnr')
  for k in SHAPES:
    assert float(gsnr[k]) == pytest.approx(ref_gsnr(opt, tensors)[k], rel=1e-5)
    np.testing.assert_allclose(ours[-1][k], want[k], rtol=1e-5, atol=1e-6)


def test_momentum_zero_is_plain_scaled_sgd():
  rng = np.random.default_rng(5)
  params = random_tree(rng, SHAPES)
  grads = [random_tree(rng, SHAPES) for _ in range(3)]
  reference()
  with pytest.raises(NameError):  # UnboundLocalError: its buffer is never made
    run_reference(params, grads, lr=1e-2, momentum=0.0)

  ours, _ = run(sgd_sai(1e-2, momentum=0.0, weight_decay=1e-2), params, grads)
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  for t, g in enumerate(grads):
    for k in SHAPES:
      p[k] = (1 - 1e-4) * p[k] - 1e-2 * np_gsnr(grads[0][k]) * g[k]
      np.testing.assert_allclose(ours[t][k], p[k], rtol=1e-6, atol=1e-6)


def test_zero_first_gradient_takes_gsnr_from_first_nonzero():
  rng = np.random.default_rng(6)
  shapes = {'v': (8,), 'w': (4, 3)}
  params = random_tree(rng, shapes)
  grads = [random_tree(rng, shapes) for _ in range(4)]
  grads[0]['w'] = np.zeros((4, 3), np.float32)
  want, opt, tensors = run_reference(params, grads, lr=1e-2, momentum=0.9, weight_decay=0.0)
  assert ref_gsnr(opt, tensors)['w'] == 0.0
  np.testing.assert_array_equal(want['w'], params['w'])  # frozen for good

  tx = sgd_sai(1e-2, momentum=0.9, weight_decay=0.0)
  ours, states = run(tx, params, grads, states=True)
  state1, state = states[0], states[-1]
  assert not bool(state1[0].computed['w']) and float(state1[0].gsnr['w']) == 0.0
  np.testing.assert_array_equal(ours[0]['w'], params['w'])
  assert bool(state[0].computed['w'])
  s = np_gsnr(grads[1]['w'])
  np.testing.assert_allclose(optax.tree.get(state, 'gsnr')['w'], s, rtol=1e-6)
  # Its momentum started at step 1 (at zero), so it rises as (1 - mu) g.
  p, m = params['w'].astype(np.float64), 0.0
  for t in range(1, 4):
    m = 0.9 * m + 0.1 * grads[t]['w']
    p = p - 1e-2 * s * m
    np.testing.assert_allclose(ours[t]['w'], p, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(ours[-1]['v'], want['v'], rtol=1e-6)  # the other leaf agrees


def test_gsnr_of_a_gradient_out_of_float32_squares_range_or_not_finite():
  # 1e20 (whose float32 squares overflow) and 1e-25 (whose squares flush to 0)
  # give the formula's g-SNR (at 1e-25, eps dominates the spread). A first
  # gradient that is not finite waits, as a zero one does.
  base = np.array([0.5, 1.0, 2.0, -1.5], np.float32)
  tx = optax_gqc.scale_by_gsnr()
  update = jax.jit(tx.update)
  for first in (base * 1e20, base * 1e-25, base * np.inf):
    _, state = update({'w': jnp.asarray(first)}, tx.init({'w': jnp.zeros(4)}))
    assert bool(state.computed['w']) == bool(np.all(np.isfinite(first)))
    if np.all(np.isfinite(first)):
      assert float(state.gsnr['w']) == pytest.approx(np_gsnr(first), rel=1e-6)
  _, state = update({'w': jnp.asarray(base)}, state)  # after the Inf
  assert float(state.gsnr['w']) == pytest.approx(np_gsnr(base), rel=1e-6)


def test_a_leaf_of_no_elements_waits_for_nothing():
  # It never gets a non-zero gradient: pending for good would keep the
  # per-leaf reductions running on every update.
  params = {'w': jnp.ones(3), 'empty': jnp.zeros((0, 4))}
  tx = sgd_sai(0.1)
  state = tx.init(params)
  assert bool(state[0].computed['empty'])
  grads = {'w': jnp.array([1.0, 2.0, 3.0]), 'empty': jnp.zeros((0, 4))}
  assert np.isnan(float(optax_gqc.statistics(state)['gsnr_min']))  # none measured yet
  updates, state = jax.jit(tx.update)(grads, state, params)
  stats = optax_gqc.statistics(state)
  assert int(stats['num_pending_gsnr']) == 0
  assert float(stats['gsnr_min']) == float(stats['gsnr_max']) == float(state[0].gsnr['w']) > 0
  assert np.all(np.isfinite(updates['w'])) and updates['empty'].shape == (0, 4)
  assert bool(sgd_sai(0.1).init({'w': 1.0, 'empty': jnp.zeros(0)})[0].computed['empty'])


# Options.


def test_normalize_makes_the_largest_gsnr_one():
  rng = np.random.default_rng(7)
  params = random_tree(rng, SHAPES)
  grads = [random_tree(rng, SHAPES, shift=0.2) for _ in range(3)]
  ours, state = run(sgd_sai(0.1, normalize=True), params, grads)
  gsnr = optax.tree.get(state, 'gsnr')
  raw = {k: np_gsnr(grads[0][k]) for k in SHAPES}
  largest = max(raw.values())
  assert max(gsnr.values()) == 1.0  # set as 1, on every backend
  np.testing.assert_allclose(state[0].normalizer, largest, rtol=1e-6)
  for k in SHAPES:
    np.testing.assert_allclose(gsnr[k], raw[k] / largest, rtol=1e-6)
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {}
  for t, g in enumerate(grads):
    for k in SHAPES:
      m[k] = g[k] if t == 0 else 0.9 * m[k] + 0.1 * g[k]
      p[k] = (1 - 1e-3) * p[k] - 0.1 * raw[k] / largest * m[k]
      np.testing.assert_allclose(ours[t][k], p[k], rtol=1e-6, atol=1e-6)


def test_a_real_mu_dtype_keeps_a_complex_leafs_imaginary_part():
  params = {'c': jnp.zeros(4, jnp.complex64), 'h': jnp.zeros(4, jnp.bfloat16)}
  grads = {
      'c': jnp.array([1j, 2j, -1j, 0.5j], jnp.complex64),
      'h': jnp.array([1.0, 2.0, 3.0, 4.0], jnp.bfloat16),
  }
  wide = sgd_sai(0.1, weight_decay=0.0, mu_dtype=jnp.float32)
  plain = sgd_sai(0.1, weight_decay=0.0)
  state = wide.init(params)
  mu = optax.tree.get(state, 'mu')
  assert mu['c'].dtype == jnp.complex64 and mu['h'].dtype == jnp.float32
  updates, _ = jax.jit(wide.update)(grads, state, params)
  expected, _ = jax.jit(plain.update)(grads, plain.init(params), params)
  np.testing.assert_allclose(updates['c'], expected['c'], rtol=1e-6)
  assert np.all(np.abs(np.imag(updates['c'])) > 0)


def test_a_constant_complex_gradient_has_gsnr_one():
  # Its spread is taken about a reference of the largest real and imaginary
  # parts, so equal entries give a spread of exactly 0.
  for n in (1000, 4097):
    g = {'c': jnp.full((n,), 0.1 + 0.3j, jnp.complex64)}
    tx = scale_by_gsnr()
    _, state = tx.update(g, tx.init(g))
    assert float(state.gsnr['c']) == 1.0


def test_a_python_float_gradient_is_taken_as_optax_sgd_takes_it():
  tx = sgd_sai(0.1, weight_decay=0.0)
  params = {'w': 2.0}
  updates, _ = tx.update({'w': 1.0}, tx.init(params), params)
  np.testing.assert_allclose(updates['w'], -0.1)


def test_normalize_keeps_the_normalizer_for_late_leaves():
  tx = scale_by_gsnr(normalize=True)
  u1 = {'a': jnp.array([1.0, 2.0, 4.0]), 'b': jnp.zeros(5)}
  u2 = {'a': jnp.array([3.0, 0.0, 1.0]), 'b': jnp.arange(5.0) + 10.0}
  update = jax.jit(tx.update)
  state = tx.init(u1)
  _, state = update(u1, state)
  _, state = update(u2, state)
  np.testing.assert_allclose(state.normalizer, np_gsnr(u1['a']), rtol=1e-6)
  assert float(state.gsnr['a']) == 1.0
  np.testing.assert_allclose(state.gsnr['b'], np_gsnr(u2['b']) / np_gsnr(u1['a']), rtol=1e-6)
  assert float(state.gsnr['b']) > 1.0


def test_scale_by_gsnr_bf16_is_computed_in_float32():
  rng = np.random.default_rng(8)
  u = {k: jnp.asarray(v, jnp.bfloat16) for k, v in random_tree(rng, SHAPES, shift=0.3).items()}
  tx = scale_by_gsnr()
  out, state = jax.jit(tx.update)(u, tx.init(u))
  for k in SHAPES:
    x = np.asarray(u[k], np.float32)
    assert out[k].dtype == jnp.bfloat16 and state.gsnr[k].dtype == jnp.float32
    np.testing.assert_allclose(state.gsnr[k], np_gsnr(x), rtol=1e-6)
    want = np.asarray(jnp.asarray(np.float32(state.gsnr[k]) * x, jnp.bfloat16), np.float32)
    np.testing.assert_array_equal(np.asarray(out[k], np.float32), want)


@pytest.mark.parametrize('mu_dtype', [None, jnp.float32])
def test_bf16_params(mu_dtype):
  rng = np.random.default_rng(9)
  params = {k: jnp.asarray(v, jnp.bfloat16) for k, v in random_tree(rng, SHAPES).items()}
  grads = [
      {k: jnp.asarray(v, jnp.bfloat16) for k, v in random_tree(rng, SHAPES).items()}
      for _ in range(3)
  ]
  ours, state = run(sgd_sai(1e-2, mu_dtype=mu_dtype), params, grads)
  mu = optax.tree.get(state, 'mu')
  want = golden(
      as_np(jax.tree.map(lambda x: x.astype(jnp.float32), params)),
      [as_np(jax.tree.map(lambda x: x.astype(jnp.float32), g)) for g in grads],
      lambda t: 1e-2,
      0.9,
      1e-2,
  )
  for k in SHAPES:
    assert ours[-1][k].dtype == jnp.bfloat16
    assert mu[k].dtype == (jnp.bfloat16 if mu_dtype is None else jnp.float32)
    np.testing.assert_allclose(
        optax.tree.get(state, 'gsnr')[k], np_gsnr(np.asarray(grads[0][k], np.float32)), rtol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(ours[-1][k], np.float32), want[-1][k], rtol=2e-2, atol=2e-2
    )


def test_fp16_params_with_a_float32_buffer_keep_the_scaled_gradient_in_float32():
  # A g-SNR of about 1.5e3 times gradients of about 100 is past float16's
  # largest finite value (65504); the reference applies the g-SNR to the step.
  rng = np.random.default_rng(10)
  params = {k: jnp.asarray(v, jnp.float16) for k, v in random_tree(rng, {'w': (256,)}).items()}
  grads = [
      {
          k: jnp.asarray(v, jnp.float16)
          for k, v in random_tree(rng, {'w': (256,)}, shift=100).items()
      }
      for _ in range(2)
  ]
  ours, state = run(sgd_sai(1e-4, weight_decay=0.0, mu_dtype=jnp.float32), params, grads)
  want = golden(as_np(params), [as_np(g) for g in grads], lambda t: 1e-4, 0.9, 0.0)
  assert float(optax.tree.get(state, 'gsnr')['w']) * 100 > float(np.finfo(np.float16).max)
  np.testing.assert_allclose(np.asarray(ours[-1]['w'], np.float32), want[-1]['w'], rtol=5e-3)
  with warnings.catch_warnings():  # float64 without x64 is float32, as the buffer takes it
    warnings.simplefilter('error')
    run(sgd_sai(1e-4, mu_dtype=jnp.float64), params, grads)


def test_mask_excludes_biases_from_weight_decay():
  rng = np.random.default_rng(10)
  shapes = {'w1': (6, 4), 'b1': (4,), 'w2': (4, 3), 'b2': (3,)}
  params = random_tree(rng, shapes)
  mask = lambda p: jax.tree.map(lambda x: x.ndim > 1, p)  # noqa: E731
  tx = sgd_sai(0.1, weight_decay=0.1, mask=mask)

  # Zero gradients: only the decay acts, and only on the matrices.
  step = make_step(tx)
  zeros = [jax.tree.map(np.zeros_like, params)] * 3
  ours, _ = run(tx, params, zeros, step)
  for k in shapes:
    factor = 0.99**3 if k.startswith('w') else 1.0
    np.testing.assert_allclose(ours[-1][k], params[k] * factor, rtol=1e-6)

  grads = [random_tree(rng, shapes) for _ in range(3)]
  ours, _ = run(tx, params, grads, step)
  decay = {k: 0.1 if k.startswith('w') else 0.0 for k in shapes}
  want = golden(params, grads, lambda t: 0.1, 0.9, decay)
  for k in shapes:
    np.testing.assert_allclose(ours[-1][k], want[-1][k], rtol=1e-6, atol=1e-6)


def test_a_leaf_waiting_for_a_finite_gradient_moves_nothing_and_keeps_no_nan():
  # Its g-SNR of 0 times the NaN was NaN: in the momentum, and on the parameter, for good.
  tx = sgd_sai(0.1, weight_decay=0.0)
  params = {'w': jnp.array([1.0, 2.0, 3.0, 4.0])}
  state = tx.init(params)
  step = jax.jit(tx.update)
  for g in ([jnp.nan, 1.0, 2.0, 3.0], [0.5, -1.0, 2.0, 1.0], [0.5, -1.0, 2.0, 1.0]):
    updates, state = step({'w': jnp.array(g)}, state, params)
    assert bool(jnp.all(jnp.isfinite(updates['w']))), updates
    params = optax.apply_updates(params, updates)
  assert bool(jnp.all(jnp.isfinite(state[1].mu['w']))) and bool(state[0].computed['w'])
  alone, _ = scale_by_gsnr().update({'w': jnp.array([jnp.inf, 1.0])}, scale_by_gsnr().init(params))
  assert alone['w'].tolist() == [0.0, 0.0]  # waits, and gives zeros


@pytest.mark.parametrize(
    'mask',
    ['bias', '', 1, 0, 0.0, True, np.float32(1.0), np.True_, jnp.array([0.0]), np.array([True])],
)
def test_a_mask_that_is_a_string_a_number_or_an_array_raises(mask):
  # Each was a one-leaf mask for the whole tree: every leaf decayed, or none did.
  with pytest.raises(TypeError, match='mask must be a tree of bools'):
    sgd_sai(0.1, weight_decay=0.5, mask=mask)


def test_an_integer_leafs_float0_gradient_raises_naming_the_leaf():
  params = {'w': jnp.ones(3), 'n': jnp.asarray(3, jnp.int32)}
  grads = jax.grad(lambda p: jnp.sum(p['w'] * p['n']), allow_int=True)(params)
  tx = sgd_sai(0.1)
  with pytest.raises(TypeError, match=r"the gradient \['n'\] is float0.*split them off"):
    tx.update(grads, tx.init(params), params)


def test_a_mask_function_under_inject_hyperparams_says_to_list_it_as_static():
  # inject_hyperparams called the function with the step count: a 0-d False that masked out
  # every leaf, so nothing decayed.
  mask = lambda p: jax.tree.map(lambda x: x.ndim > 1, p)  # noqa: E731
  params = {'w': jnp.ones((2, 2)), 'b': jnp.ones(2)}
  with pytest.raises(TypeError, match="static_args=\\('mask',\\)"):
    optax.inject_hyperparams(sgd_sai)(learning_rate=0.1, weight_decay=0.5, mask=mask).init(params)
  tx = optax.inject_hyperparams(sgd_sai, static_args=('mask',))(0.1, weight_decay=0.5, mask=mask)
  state = tx.init(params)
  updates, _ = tx.update({'w': jnp.ones((2, 2)), 'b': jnp.ones(2)}, state, params)
  assert float(updates['w'][0, 0]) < float(updates['b'][0])  # 'w' decays, 'b' does not


def test_inject_hyperparams():
  rng = np.random.default_rng(11)
  params = random_tree(rng, SHAPES)
  grads = [random_tree(rng, SHAPES) for _ in range(4)]
  tx = optax.inject_hyperparams(sgd_sai)(
      learning_rate=0.1, momentum=0.9, weight_decay=1e-2, eps=1e-8, normalize=False
  )
  step = make_step(tx)
  ours, state = run(tx, params, grads[:3], step)
  want = golden(params, grads[:3], lambda t: 0.1, 0.9, 1e-2)
  for k in SHAPES:
    np.testing.assert_allclose(ours[-1][k], want[-1][k], rtol=1e-6, atol=1e-6)

  # The injected values are live: learning rate 0 stops every move.
  state.hyperparams['learning_rate'] = jnp.zeros([], jnp.float32)
  stopped, _ = step(ours[-1], state, grads[3])
  for k in SHAPES:
    np.testing.assert_array_equal(stopped[k], ours[-1][k])

  # A schedule and a traced momentum also go through.
  tx = optax.inject_hyperparams(sgd_sai)(
      learning_rate=lambda count: 0.1 / (1.0 + count), momentum=0.5, weight_decay=0.1
  )
  ours, _ = run(tx, params, grads[:3])
  want = golden(params, grads[:3], lambda t: 0.1 / (1.0 + t), 0.5, 0.1)
  for k in SHAPES:
    np.testing.assert_allclose(ours[-1][k], want[-1][k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    'dtype, kwargs',
    [
        (jnp.float32, {}),
        (jnp.bfloat16, {'mu_dtype': jnp.float32}),
        (
            jnp.float32,
            {
                'normalize': True,
                'weight_decay': lambda count: 1e-2,
                'mask': {'a': False, 'b': True, 'c': True},
            },
        ),
        (jnp.float32, {'learning_rate': lambda count: 0.1 / (1.0 + count), 'momentum': 0.0}),
    ],
)
def test_state_structure_and_dtypes_are_stable(dtype, kwargs):
  kwargs = {'learning_rate': 0.1, **kwargs}
  tx = sgd_sai(**kwargs)
  params = {k: jnp.ones(s, dtype) for k, s in SHAPES.items()}
  grads = {k: jnp.arange(np.prod(s), dtype=dtype).reshape(s) for k, s in SHAPES.items()}
  state0 = tx.init(params)
  update = jax.jit(tx.update)
  _, state1 = update(grads, state0, params)
  _, state2 = update(grads, state1, params)
  for state in (state1, state2):
    assert jax.tree.structure(state) == jax.tree.structure(state0)
    for a, b in zip(jax.tree.leaves(state0), jax.tree.leaves(state), strict=True):
      assert (a.shape, a.dtype) == (b.shape, b.dtype)
  assert state0[1].count.dtype == jnp.int32
  assert all(v.dtype == jnp.float32 for v in optax.tree.get(state2, 'gsnr').values())


# Arguments.


@pytest.mark.parametrize(
    'kwargs, name',
    [
        ({'learning_rate': -1e-3}, 'learning_rate'),
        ({'momentum': 1.0}, 'momentum'),
        ({'momentum': -0.1}, 'momentum'),
        ({'momentum': float('nan')}, 'momentum'),
        ({'weight_decay': -1e-2}, 'weight_decay'),
        ({'eps': 0.0}, 'eps'),
        ({'eps': -1e-8}, 'eps'),
    ],
)
def test_bad_arguments_raise(kwargs, name):
  kwargs = {'learning_rate': 1e-3, **kwargs}
  with pytest.raises(ValueError, match=name):
    sgd_sai(**kwargs)
  if name == 'eps':
    with pytest.raises(ValueError, match='eps'):
      scale_by_gsnr(eps=kwargs['eps'])
  with pytest.raises(ValueError, match=name):  # concrete injected values are checked too
    optax.inject_hyperparams(sgd_sai)(**kwargs).init({'w': jnp.ones(3)})


@pytest.mark.parametrize(
    'kwargs',
    [
        {'learning_rate': 0.0, 'momentum': 0.0, 'weight_decay': 0.0},
        {
            'learning_rate': optax.cosine_decay_schedule(1e-2, 100),
            'momentum': 0.99,
            'weight_decay': optax.constant_schedule(1e-2),
        },
    ],
)
def test_edge_arguments_give_finite_updates(kwargs):
  tx = sgd_sai(**kwargs)
  params = {'w': jnp.arange(6.0).reshape(2, 3)}
  updates, _ = jax.jit(tx.update)({'w': jnp.ones((2, 3)) * 0.1}, tx.init(params), params)
  assert np.isfinite(np.asarray(updates['w'])).all()


def test_eps_and_weight_decay_are_keywords():
  # torch's SGD_sai(params, lr, momentum, eps, weight_decay) takes eps third: by position the
  # port's weight_decay would take torch's eps, silently.
  with pytest.raises(TypeError, match='positional'):
    sgd_sai(0.05, 0.9, 1e-8, 0.1)
  with pytest.raises(TypeError, match='positional'):
    sgd_sai(0.05, 0.9, 1e-2)
