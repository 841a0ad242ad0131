"""The gates of optax_gqc.gates against references of their rules, alone and combined."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

import optax_gqc
from optax_gqc import gates, schedules
from tests._helpers import grad_stream, run

PARAMS = {'w': jnp.zeros(6)}


def scaled_stream(scales, seed=0):
  """Gradients of chosen norms, in random directions (host arrays: slicing them costs nothing)."""
  keys = jax.random.split(jax.random.key(seed), len(scales))
  v = np.asarray(jax.vmap(lambda k: jax.random.normal(k, (6,)))(keys))
  v = np.asarray(scales, np.float32)[:, None] * v / np.linalg.norm(v, axis=1, keepdims=True)
  return [{'w': w} for w in v]


def decisions(tx, grads, losses=None):
  """Whether each microbatch stepped, and the last state: one jitted scan over the stream."""

  def body(state, x):
    g, loss = x
    kwargs = {} if losses is None else {'value': loss}
    _, new_state = tx.update(g, state, PARAMS, **kwargs)
    now, before = (optax_gqc.statistics(s)['num_steps'] for s in (new_state, state))
    return new_state, now > before

  stream = (
      jax.tree.map(lambda *xs: np.stack(xs), *grads),
      jnp.zeros(len(grads)) if losses is None else jnp.asarray(losses),
  )
  state, steps = jax.jit(lambda s, xs: jax.lax.scan(body, s, xs))(tx.init(PARAMS), stream)
  return [bool(x) for x in steps], state


def reference(rule, values, max_draws):
  """Replays a stepping rule over a list of per-microbatch values (the reference loop)."""
  out, history = [], []
  for t, v in enumerate(values):
    history.append(v)
    step = rule(history, t) or len(history) >= max_draws
    out.append(step)
    if step:
      history = []
  return out


def test_noise_ratio_gate_matches_torch_gqc_rule():
  rng = np.random.default_rng(0)
  norms = rng.uniform(0.5, 1.5, 300).astype(np.float32)
  grads = scaled_stream(norms)
  tol = lambda t: 0.02 + 0.001 * (t % 7)  # noqa: E731

  def rule(h, t):
    h = np.asarray(h, np.float64)
    if len(h) < 2:
      return False  # torch.var of one value is NaN
    return np.var(h, ddof=1) / (np.mean(h**2) + 1e-8) <= len(h) * tol(t)

  ours, _ = decisions(optax_gqc.gns(optax.sgd(0.1), tolerance=tol, max_draws=16), grads)
  ref = reference(rule, [float(np.linalg.norm(np.asarray(g['w']))) for g in grads], 16)
  assert ours == ref
  assert 0 < sum(ours) < len(ours)


def test_noise_ratio_and_norm_test_never_step_on_one_microbatch():
  grads = scaled_stream([1.0] * 5)
  for tx in (
      optax_gqc.gns(optax.sgd(0.1), tolerance=1e9),
      optax_gqc.norm_test_accumulation(optax.sgd(0.1), eta=1e9),
  ):
    assert decisions(tx, grads)[0] == [False, True, False, True, False]


def test_the_relative_gates_wait_on_zero_gradients_until_forced():
  # docs/robustness.md: the norm test read 0 <= eta^2 * 0 and stepped gnts(ratio=...) every two.
  zeros = scaled_stream([0.0] * 12)
  for tx in (
      optax_gqc.norm_test_accumulation(optax.sgd(0.1), eta=0.5, max_draws=4),
      optax_gqc.gnts(optax.sgd(0.1), ratio=0.5, max_draws=4),
  ):
    assert decisions(tx, zeros)[0] == [False, False, False, True] * 3
  ones = [{'w': jnp.ones(6)}] * 4  # the same gradient: no error, a non-zero mean
  tx = optax_gqc.norm_test_accumulation(optax.sgd(0.1), eta=0.5, max_draws=4)
  assert decisions(tx, ones)[0] == [False, True] * 2


@pytest.mark.parametrize('scheduled', [True, False], ids=['scheduled', 'constant'])
def test_loss_interval_gate_matches_torch_gqc_rule(scheduled):
  # A scheduled confidence takes the t tail on device; a constant one, a table of quantiles.
  rng = np.random.default_rng(1)
  losses = (2.0 + 0.3 * rng.standard_normal(300)).astype(np.float32)
  if scheduled:
    conf = schedules.cosine_with_warmup(0.9, 0.9, 20, 300)
    error = schedules.cosine_with_warmup(0.08, 0.08, 20, 300)
  else:
    conf, error = 0.9, 0.08
  value = lambda h, t: float(h(t)) if callable(h) else h  # noqa: E731
  grads = scaled_stream(np.ones(300))
  running = []

  def rule(history, t):
    loss = float(history[-1])
    running.append(loss if not running else running[-1] * 0.99 + loss * 0.01)
    judged = np.asarray([running[-1]] + history, np.float64)
    mean = judged.mean()
    c, p = value(conf, t), value(error, t)
    low, high = stats.t.interval(c, len(judged) - 1, loc=mean, scale=stats.sem(judged) + 1e-12)
    return not (low < mean * (1 - p) or high > mean * (1 + p))

  tx = optax_gqc.mht(optax.sgd(0.1), confidence=conf, percent_error=error, max_draws=32)
  ours, state = decisions(tx, grads, losses)
  ref = reference(rule, [float(x) for x in losses], 32)
  assert ours == ref
  # Scheduled, the confidence warms up from 0 and steps every time; then it accumulates.
  assert (20 if scheduled else 5) < sum(ours) < 290
  stats_now = optax_gqc.statistics(state)
  assert float(stats_now['loss_ema']) == pytest.approx(running[-1], rel=1e-5)
  assert float(stats_now['confidence']) == pytest.approx(0.9)


def test_loss_interval_decides_alike_with_its_confidence_traced():
  # inject_hyperparams traces the confidence: the t tail on device, against the table.
  rng = np.random.default_rng(1)
  losses = (2.0 + 0.3 * rng.standard_normal(300)).astype(np.float32)
  grads = scaled_stream(np.ones(300))
  kwargs = {'confidence': 0.9, 'percent_error': 0.08, 'max_draws': 32}
  table, _ = decisions(optax_gqc.mht(optax.sgd(0.1), **kwargs), grads, losses)
  injected = optax.inject_hyperparams(optax_gqc.mht, static_args=('max_draws',))
  tail, _ = decisions(injected(optax.sgd(0.1), **kwargs), grads, losses)
  assert table == tail and 5 < sum(table) < 290


def test_loss_interval_needs_the_loss():
  tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.1)
  with pytest.raises(ValueError, match='value=loss'):
    jax.jit(tx.update)({'w': jnp.ones(6)}, tx.init(PARAMS), PARAMS)


def test_norm_test_gate_matches_its_formula():
  rng = np.random.default_rng(2)
  signal = np.full(6, 0.3, np.float32)
  grads = [{'w': signal + rng.standard_normal(6).astype(np.float32)} for _ in range(300)]

  def rule(history, t):
    g = np.asarray(history, np.float64)
    n = len(g)
    if n < 2:
      return False
    mean = g.mean(0)
    trace = np.sum((g - mean) ** 2) / (n - 1)
    return trace / n <= 0.8**2 * np.sum(mean**2)

  ours, _ = decisions(
      optax_gqc.norm_test_accumulation(optax.sgd(0.1), eta=0.8, max_draws=40), grads
  )
  assert ours == reference(rule, [np.asarray(g['w']) for g in grads], 40)
  assert 5 < sum(ours) < 150


@pytest.mark.slow
def test_gns_and_mht_recipes_schedule_their_gates():
  grads = scaled_stream(np.ones(12))
  tx = optax_gqc.gns_with_cosine_schedule(1e-2, 0.1, 0.01, total_steps=12, warmup_steps=4)
  _, state = decisions(tx, grads)
  assert float(optax_gqc.statistics(state)['tolerance']) == pytest.approx(
      float(schedules.cosine_with_inverse_warmup(0.1, 0.01, 4, 12, 10.0)(11))
  )
  tx = optax_gqc.gns_default(1e-2, 0.05, total_steps=12, warmup_steps=4)
  _, state = decisions(tx, grads[:2])
  assert float(optax_gqc.statistics(state)['tolerance']) == pytest.approx(0.05 * (20 - 19 / 4))
  tx = optax_gqc.mht_with_warmup_schedule(1e-2, 0.95, 0.1, total_steps=12, warmup_steps=4)
  _, state = decisions(tx, grads[:3], losses=[1.0, 1.1, 0.9])
  stats_now = optax_gqc.statistics(state)
  assert float(stats_now['confidence']) == pytest.approx(0.95 * 2 / 4)
  assert float(stats_now['percent_error']) == pytest.approx(0.1 * 2 / 4)
  lr = float(optax.tree.get(state, 'hyperparams')['learning_rate'])
  assert lr == pytest.approx(float(schedules.cosine_with_warmup(1e-2, 0.0, 4, 12)(2)))


@pytest.mark.parametrize(
    'make, match',
    [
        (lambda: gates.noise_ratio_below(-1.0), 'tolerance'),
        (lambda: gates.loss_interval(0.9, -0.1), 'percent_error'),
        (lambda: gates.loss_interval(0.9, 0.1, decay=1.5), 'decay'),
        (lambda: gates.relative_error_below(float('nan')), 'eta'),
        (lambda: optax_gqc.noise_scale(decay=-0.1, axis_name='d'), 'decay'),
        (
            lambda: optax_gqc.accumulate(optax.sgd(1.0), gates.norm_below(1.0), noise_decay=1.0),
            'noise_decay',
        ),
    ],
)
def test_bad_arguments(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_any_of_and_all_of():
  many = gates.batch_size_at_least(3, 1)
  short = gates.norm_below(0.5)
  g = grad_stream(3)
  any_tx = optax_gqc.accumulate(optax.sgd(1.0), gates.any_of(many, short), max_draws=10)
  all_tx = optax_gqc.accumulate(optax.sgd(1.0), gates.all_of(many, short), max_draws=10)
  assert [int(s.num_steps) for _, s, _ in run(any_tx, g)] == [0, 0, 1]
  assert [int(s.num_steps) for _, s, _ in run(all_tx, g)] == [0, 0, 0]
  small = [jax.tree.map(lambda x: 1e-3 * x, x) for x in g]
  assert [int(s.num_steps) for _, s, _ in run(any_tx, small)] == [1, 2, 3]
  assert [int(s.num_steps) for _, s, _ in run(all_tx, small)] == [0, 0, 1]
  stats = optax_gqc.statistics(run(any_tx, g)[-1][1])
  assert float(stats['logical_batch_size']) == 3.0 and float(stats['threshold']) == 0.5


def test_same_gate_twice_gets_suffixed_statistics():
  tx = optax_gqc.accumulate(
      optax.sgd(1.0), gates.any_of(gates.norm_below(0.1), gates.norm_below(0.2))
  )
  stats = optax_gqc.statistics(tx.init(PARAMS))
  assert float(stats['threshold']) == pytest.approx(0.1)
  assert float(stats['threshold_1']) == pytest.approx(0.2)


def test_critical_batch_follows_fraction_of_the_linear_regression_noise_scale():
  """The logical batch tracks fraction * B_simple as the noise scale moves.

  Linear regression at a fixed w = w* + delta (SGD with learning rate 0), with
  |delta| changed halfway: B_simple = (d + 1) + d s^2 / |delta|^2 goes from 251
  to 101 examples.
  """
  d, s, microbatch, fraction = 50, 2.0, 4, 0.5
  kw, kd, ke = jax.random.split(jax.random.key(0), 3)
  w_star = jax.random.normal(kw, (d,))
  direction = jax.random.normal(kd, (d,))
  direction = direction / jnp.linalg.norm(direction)
  tx = optax_gqc.accumulate(
      optax.sgd(0.0),
      gates.critical_batch(fraction, microbatch),
      microbatch_size=microbatch,
  )

  def body(state, inputs):
    key, delta_norm = inputs
    kx, kn = jax.random.split(key)
    w = w_star + delta_norm * direction
    x = jax.random.normal(kx, (microbatch, d))
    y = x @ w_star + s * jax.random.normal(kn, (microbatch,))
    _, state = tx.update({'w': x.T @ (x @ w - y) / microbatch}, state, {'w': w})
    stats = optax_gqc.statistics(state)
    return state, (stats['num_draws'], stats['last_num_draws'], stats['target_batch_size'])

  phase = 12_000
  norms = jnp.concatenate([jnp.full(phase, 1.0), jnp.full(phase, 2.0)])
  keys = jax.random.split(ke, 2 * phase)
  _, (draws, last, target) = jax.jit(lambda st: jax.lax.scan(body, st, (keys, norms)))(
      tx.init({'w': w_star})
  )
  draws, last, target = (np.asarray(x) for x in (draws, last, target))
  for end, delta_norm in ((phase, 1.0), (2 * phase, 2.0)):
    truth = (d + 1) + d * s**2 / delta_norm**2
    window = slice(end - phase // 3, end)  # the last third of the phase, after the EMA settled
    stepped = draws[window] == 0
    logical = last[window][stepped] * microbatch  # the batch of every step taken there
    assert np.mean(target[window]) == pytest.approx(fraction * truth, rel=0.1)
    assert np.mean(logical) == pytest.approx(fraction * truth, rel=0.1)


CRITICAL_CHUNK = 40  # microbatches per call of the scan: every stream reuses one program


@functools.cache
def critical_batch_scan():
  """``critical_batch(0.5, 8)``'s first state, and one jitted scan of its microbatches.

  The scan returns the statistics after each microbatch.
  """
  tx = optax_gqc.accumulate(
      optax.sgd(1.0), gates.critical_batch(0.5, 8), microbatch_size=8, max_draws=64
  )
  params = {'w': jnp.zeros(5)}

  def body(state, g):
    _, state = tx.update(g, state, params)
    return state, optax_gqc.statistics(state)

  return tx.init(params), jax.jit(lambda state, grads: jax.lax.scan(body, state, grads))


def critical_batch_statistics(seed, num):
  """Statistics after each of ``num`` microbatches with |G|^2 = 5 and tr(Sigma) = 5."""
  keys = jax.random.split(jax.random.key(seed), num)
  # Drawn key by key and stacked on the host, the keys indexed: iterating over
  # them compiles an unstack per length, slower than the scan.
  grads = np.stack([np.asarray(jax.random.normal(keys[i], (5,)) + 1.0) for i in range(num)])
  state, scan = critical_batch_scan()
  chunks = []
  for start in range(0, num, CRITICAL_CHUNK):
    state, stats = scan(state, {'w': grads[start : start + CRITICAL_CHUNK]})
    chunks.append(stats)
  return {name: np.concatenate([np.asarray(c[name]) for c in chunks]) for name in chunks[0]}


def test_critical_batch_bootstrap_survives_a_negative_first_estimate():
  # Gradients with |G|^2 = 5 and tr(Sigma) = 5 per microbatch: B is one
  # microbatch, but the first two-draw estimate of |G|^2 comes out negative.
  stats = critical_batch_statistics(seed=0, num=40)
  first = int(np.argmax(stats['num_steps'] == 1))  # the first step
  assert stats['num_steps'][first] == 1
  assert float(stats['grad_sq_norm_est'][first]) < 0  # the estimate that read as an infinite B
  assert int(stats['num_forced'][-1]) == 0
  assert int(stats['num_steps'][-1]) >= 15  # bootstrap steps of 2, then about one draw a step


def test_critical_batch_reports_its_target_not_its_probes():
  # B_simple is about one microbatch: the target stays under two microbatches,
  # and every fourth step probes with two, which the reported target leaves out.
  stats = critical_batch_statistics(seed=1, num=80)
  stepped = (stats['num_steps'] > 5) & (stats['num_draws'] == 0)  # a step, past the bootstrap
  probes = int(np.sum(stats['last_num_draws'][stepped] == 2))
  targets = stats['target_batch_size'][stepped]
  assert probes >= 3
  assert max(targets) < 16


def test_critical_batch_keeps_its_bootstrap_within_min_batch_size():
  # The bootstrap's two microbatches (16 examples) are below the smallest batch.
  tx = optax_gqc.accumulate(
      optax.sgd(1.0), gates.critical_batch(0.5, 8, min_batch_size=48), max_draws=64
  )
  params = {'w': jnp.zeros(5)}
  state = tx.init(params)
  assert float(state.gate_state['target_batch_size']) == 48

  def body(state, g):
    _, state = tx.update(g, state, params)
    return state, (state.num_draws, state.last_num_draws)

  grads = jax.random.normal(jax.random.key(0), (40, 5)) + 1.0
  _, (draws, last) = jax.jit(lambda s, g: jax.lax.scan(body, s, g))(state, {'w': grads})
  sizes = 8 * np.asarray(last)[np.asarray(draws) == 0]  # each step's logical batch
  assert len(sizes) >= 5 and min(sizes) >= 48


def test_a_gate_that_counts_examples_carries_its_microbatch_size():
  assert gates.batch_size_at_least(64, 8).microbatch_size == 8
  assert gates.critical_batch(0.5, 8).microbatch_size == 8
  assert gates.norm_below(1.0).microbatch_size is None
  combined = gates.any_of(gates.norm_below(1.0), gates.batch_size_at_least(64, 8))
  assert combined.microbatch_size == 8
  with pytest.raises(ValueError, match=r'different microbatch sizes \[4, 8\]'):
    gates.all_of(gates.batch_size_at_least(64, 8), gates.critical_batch(0.5, 4))


def test_gates_given_the_microbatch_size_as_an_array_combine():
  # A JAX array is unhashable: the sizes are compared as ints.
  size = jnp.array(4)
  combined = gates.any_of(gates.batch_size_at_least(8, size), gates.critical_batch(0.5, size))
  assert int(combined.microbatch_size) == 4
  with pytest.raises(ValueError, match=r'different microbatch sizes \[4, 8\]'):
    gates.all_of(gates.batch_size_at_least(64, jnp.array(8)), gates.critical_batch(0.5, size))
  tx = optax_gqc.accumulate(
      optax.sgd(0.1), gates.any_of(gates.batch_size_at_least(8, size), gates.norm_below(0.0))
  )
  state = tx.init({'w': jnp.zeros(2)})
  for _ in range(4):
    _, state = jax.jit(tx.update)({'w': jnp.ones(2)}, state)
  assert int(state.num_steps) == 2  # every 8 / 4 microbatches


def test_a_gate_reads_the_microbatch_count_under_its_former_name_too():
  seen = []
  gate = gates.from_function(lambda s: seen.append((s.num_batches, s.num_microbatches)) or True)
  tx = optax_gqc.accumulate(optax.sgd(0.1), gate)
  state = tx.init({'w': jnp.zeros(2)})
  for _ in range(2):
    _, state = tx.update({'w': jnp.ones(2)}, state)
  assert [(int(a), int(b)) for a, b in seen] == [(0, 0), (1, 1)]


def test_batches_of_more_examples_than_an_int32_holds_are_reached():
  params = {'w': jnp.zeros(2)}

  def steps(tx, num):
    def body(state, _):
      return tx.update({'w': jnp.ones(2)}, state, params)[1], None

    state, _ = jax.jit(lambda s: jax.lax.scan(body, s, None, length=num))(tx.init(params))
    return int(state.num_steps), int(state.num_draws)

  # 2**31 + 2**20 tokens in microbatches of 2**20: a step every 2049 microbatches (the
  # examples counted wrapped past 2**31, and it never stepped).
  sbc = optax_gqc.sbc(optax.sgd(0.1), 2.0**31 + 2**20, 2**20, max_draws=None)
  assert steps(sbc, 4200) == (2, 4200 - 2 * 2049)
  assert steps(optax_gqc.sbc(optax.sgd(0.1), 2.0**31, 2**30, max_draws=None), 6) == (3, 0)
  # Its bootstrap batch is 2**31 examples: an overflow at the first trace before.
  critical = optax_gqc.accumulate(optax.sgd(0.1), gates.critical_batch(0.5, 2**30), max_draws=8)
  assert steps(critical, 4) == (2, 0)
