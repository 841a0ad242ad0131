"""Sharded training: every device takes the decision one device would.

The 8-device runs force 8 CPU devices in a subprocess (XLA_FLAGS must be set
before jax is imported), run every layout once, and print the results as JSON;
the tests below compare them with the same run on one device.
"""

import pathlib
import re
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import optax_gqc
from tests import processes

# Linear regression near its optimum, where the microbatch gradients are mostly
# noise: GNTS then averages 3 to 5 microbatches per step, and the norms keep
# 0.04 away from the threshold, so that a different summation order cannot
# flip a decision. 'w' is sharded across the devices (FSDP); 'b' is
# replicated, or sharded too where JAX cannot tell the two apart.
SHARDED_RUNS = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np, optax, optax_gqc
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from tests.processes import regression

    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()), ('fsdp',))
    NUM, BATCH, THRESHOLD = 32, 32, 1.25
    params, xs, ys = regression(NUM, BATCH)

    def loss(p, x, y):  # a sum over the examples given, over the global batch size
        return jnp.sum((x @ p['w'] + p['b'] - y) ** 2) / (2 * BATCH)

    def make(axis_name=None):
        return optax_gqc.accumulate(
            optax.adam(3e-2), optax_gqc.gates.norm_below(THRESHOLD), max_draws=8,
            microbatch_size=BATCH, axis_name=axis_name)

    def train(tx, grad_fn, p, xs, ys):
        def body(carry, xy):
            p, s = carry
            p, s = optax_gqc.update_and_apply(tx, grad_fn(p, *xy), s, p)
            return (p, s), (s.num_steps, s.acc_norm)
        (p, s), (steps, norms) = jax.lax.scan(body, (p, tx.init(p)), (xs, ys))
        return p, optax_gqc.statistics(s), steps, norms

    def as_lists(tree):
        return jax.tree.map(lambda x: np.asarray(x).tolist(), tree)

    out = {}
    p, stats, steps, norms = jax.jit(lambda p: train(make(), jax.grad(loss), p, xs, ys))(params)
    out['one_device'] = as_lists({'params': p, 'stats': stats, 'steps': steps})
    out['margin'] = float(jnp.min(jnp.abs(norms - THRESHOLD)))

    def fsdp_in_shard_map(check_vma, axis_name):
        specs = {'w': P('fsdp'), 'b': P() if check_vma else P('fsdp')}

        def local(p, xs, ys):
            def grad_fn(p, x, y):
                def gathered_loss(p):
                    full = {n: v if specs[n] == P() else jax.lax.all_gather(
                        v, 'fsdp', tiled=True) for n, v in p.items()}
                    return loss(full, x, y)
                return jax.grad(gathered_loss)(p)
            p, stats, steps, _ = train(make(axis_name), grad_fn, p, xs, ys)
            return p, jax.tree.map(lambda x: x[None], (stats, steps))  # per device

        run = jax.shard_map(
            local, mesh=mesh, in_specs=(specs, P(None, 'fsdp'), P(None, 'fsdp')),
            out_specs=(specs, P('fsdp')), check_vma=check_vma)
        p, (stats, steps) = jax.jit(run)(params, xs, ys)
        return as_lists({'params': p, 'stats': stats, 'steps': steps})

    out['shard_map'] = {
        'check_vma': fsdp_in_shard_map(True, 'fsdp'),
        'no_check_vma': fsdp_in_shard_map(False, 'fsdp'),
        'no_check_vma_local_norms': fsdp_in_shard_map(False, None),
    }
    try:
        fsdp_in_shard_map(True, None)
        out['shard_map']['check_vma_local_norms_error'] = None
    except ValueError as e:
        out['shard_map']['check_vma_local_norms_error'] = str(e)

    # jax.jit over sharded arrays: XLA inserts the collectives, the norms are global.
    def jit_spmd(param_specs):
        p = {n: jax.device_put(v, NamedSharding(mesh, param_specs[n])) for n, v in params.items()}
        batch = NamedSharding(mesh, P(None, 'fsdp'))
        tx = make()
        train_fn = jax.jit(lambda p, xs, ys: train(tx, jax.grad(loss), p, xs, ys))
        p, stats, steps, _ = train_fn(p, jax.device_put(xs, batch), jax.device_put(ys, batch))
        state = tx.init(p)
        step = jax.jit(lambda g, s, p: optax_gqc.update_and_apply(tx, g, s, p))
        hlo = step.lower(p, state, p).compile().as_text()
        new_p, state = step(p, state, p)
        like_params = {
            'params': new_p['w'].sharding,
            'accumulator': state.accumulator['w'].sharding,
            'adam_mu': state.inner_state[0].mu['w'].sharding,
        }
        return {
            **as_lists({'params': p, 'stats': stats, 'steps': steps}),
            'like_params': {n: s.is_equivalent_to(p['w'].sharding, 2)
                            for n, s in like_params.items()},
            'params_sharded': not p['w'].sharding.is_fully_replicated,
            'all_gathers': hlo.count('all-gather'),
        }

    out['jit'] = {
        'data_parallel': jit_spmd({'w': P(), 'b': P()}),
        'fsdp': jit_spmd({'w': P('fsdp'), 'b': P()}),
    }
    print(json.dumps(out))
""")


@pytest.fixture(scope='module')
def runs():
  return processes.run_script(SHARDED_RUNS)


def assert_same_run(run, reference):
  """The same decisions after every microbatch, the same parameters and statistics."""
  steps = np.asarray(run['steps'])
  for device_steps in steps.reshape(-1, steps.shape[-1]):
    np.testing.assert_array_equal(device_steps, reference['steps'])
  for name, value in reference['params'].items():
    np.testing.assert_allclose(run['params'][name], value, rtol=1e-5, atol=1e-6)
  for name, value in reference['stats'].items():
    # Every device's: a scalar under jit, one per device from shard_map.
    np.testing.assert_allclose(
        np.asarray(run['stats'][name]).reshape(-1), value, rtol=1e-4, err_msg=name
    )


def draws_per_step(steps):
  """The microbatches averaged at each step, from num_steps after every microbatch."""
  return np.diff(np.flatnonzero(np.diff(np.asarray(steps), prepend=0)), prepend=-1)


@pytest.mark.slow
def test_reference_run_steps_on_the_gate_away_from_its_threshold(runs):
  steps = np.asarray(runs['one_device']['steps'])
  assert steps[-1] >= 6 and draws_per_step(steps).max() < 8  # the gate decides, not max_draws
  assert runs['margin'] > 0.01
  assert np.isfinite(runs['one_device']['stats']['noise_scale'])


@pytest.mark.slow
@pytest.mark.parametrize(
    'how, layout',
    [
        # FSDP in shard_map with axis_name; with check_vma (the default), 'b'
        # is replicated and counts once in the norm.
        ('shard_map', 'check_vma'),
        ('shard_map', 'no_check_vma'),
        # jax.jit over sharded arrays, no axis_name: XLA makes the norms global.
        ('jit', 'data_parallel'),
        ('jit', 'fsdp'),
    ],
)
def test_sharded_run_decides_as_one_device(runs, how, layout):
  # The decisions, the parameters and the statistics (the noise scale
  # included) are those of one device.
  assert_same_run(runs[how][layout], runs['one_device'])


@pytest.mark.slow
def test_fsdp_in_shard_map_without_axis_name_reads_local_norms(runs):
  # The negative control: each device's gate reads its shard's norm, so the
  # devices step at other microbatches than one device, and apart.
  local = np.asarray(runs['shard_map']['no_check_vma_local_norms']['steps'])
  reference = np.asarray(runs['one_device']['steps'])
  assert all((device != reference).any() for device in local)
  assert len({device[-1] for device in local}) > 1


@pytest.mark.slow
def test_fsdp_in_shard_map_without_axis_name_raises_under_check_vma(runs):
  error = runs['shard_map']['check_vma_local_norms_error']
  assert error is not None and "axis_name='fsdp'" in error


@pytest.mark.slow
def test_jit_fsdp_keeps_the_state_in_the_params_sharding_with_no_all_gather(runs):
  fsdp = runs['jit']['fsdp']
  assert fsdp['params_sharded']
  assert fsdp['like_params'] == {'params': True, 'accumulator': True, 'adam_mu': True}
  assert fsdp['all_gathers'] == 0


def test_sgd_sai_on_an_explicit_fsdp_mesh_is_the_one_device_run():
  # jax.make_mesh gives Explicit axes, where the g-SNR's first entry, x[0],
  # was a slice of a sharded leaf that JAX refuses.
  out = processes.run_script(textwrap.dedent("""
      import json
      import jax, jax.numpy as jnp, numpy as np, optax_gqc
      from jax.sharding import NamedSharding, PartitionSpec as P
      mesh = jax.make_mesh((8,), ('fsdp',))
      tx = optax_gqc.sgd_sai(1e-2, momentum=0.9)
      p = {'w': jnp.linspace(-1.0, 1.0, 128).reshape(16, 8)}
      g = {'w': jnp.cos(jnp.arange(128.0)).reshape(16, 8)}
      one = jax.jit(tx.update)(g, tx.init(p), p)[0]
      with jax.set_mesh(mesh):
        put = lambda t: jax.device_put(t, NamedSharding(mesh, P('fsdp')))
        sharded = jax.jit(tx.update)(put(g), tx.init(put(p)), put(p))[0]
      print(json.dumps(np.abs(np.asarray(sharded['w']) - np.asarray(one['w'])).max().tolist()))
      """))
  assert out < 1e-7


def test_local_norm_under_check_vma_raises_and_names_axis_name():
  # One device is enough: shard_map types the sharded gradient as varying.
  mesh = Mesh(np.array(jax.devices()[:1]), ('fsdp',))
  tx = optax_gqc.gnts(optax.sgd(0.1), 1.0)

  def local(w):
    state = tx.init({'w': w})
    return optax_gqc.update_and_apply(tx, {'w': w}, state, {'w': w})[0]['w']

  run = jax.shard_map(local, mesh=mesh, in_specs=P('fsdp'), out_specs=P('fsdp'))
  with pytest.raises(ValueError, match="pass axis_name='fsdp'"):
    jax.jit(run)(jnp.ones(4))


def test_a_partial_axis_name_is_told_every_axis_and_a_list_is_a_tuple():
  # Params sharded over both axes; axis_name names one: the error names both, not the other alone.
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('data', 'fsdp'))

  def run(axis_name):
    tx = optax_gqc.gnts(optax.sgd(0.1), 1.0, axis_name=axis_name)

    def local(w):
      state = tx.init({'w': w})
      return optax_gqc.update_and_apply(tx, {'w': w}, state, {'w': w})[0]['w']

    spec = P(('data', 'fsdp'))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec))(jnp.ones(4))

  with pytest.raises(ValueError, match=r"pass axis_name=\('fsdp', 'data'\)"):
    run('fsdp')
  np.testing.assert_array_equal(run(['data', 'fsdp']), run(('data', 'fsdp')))


def test_axis_name_outside_shard_map_says_to_leave_it_none():
  tx = optax_gqc.gnts(optax.sgd(0.1), 1.0, axis_name='fsdp')
  params = {'w': jnp.ones(4)}
  with pytest.raises(
      NameError, match=r"axis_name 'fsdp' is not a mapped axis.*leave axis_name None"
  ):
    jax.jit(tx.update)(params, tx.init(params), params)


def test_varying_loss_under_check_vma_raises_and_says_pmean():
  mesh = Mesh(np.array(jax.devices()[:1]), ('data',))
  tx = optax_gqc.mht(optax.sgd(0.1), confidence=0.9, percent_error=0.05)
  params = {'w': jnp.ones(3)}

  def local(x):  # whole gradients, the same on every device; the loss is local
    state = tx.init(params)
    return tx.update(params, state, params, value=jnp.sum(x))[1].num_steps

  run = jax.shard_map(local, mesh=mesh, in_specs=P('data'), out_specs=P())
  with pytest.raises(ValueError, match=r'value=loss.*pmean'):
    jax.jit(run)(jnp.ones(4))


# A named vmap over shards of the parameters stands in for FSDP devices: the
# engine's psum then runs across the shards, in-process and fast.
NUM_SHARDS, NUM_MICROBATCHES = 4, 40
SIGNAL = {'w': jnp.full((8, 3), 0.2), 'b': jnp.full((4,), -0.2)}


def stream(seed=0):
  """Microbatch gradients (a signal plus unit noise) and losses, stacked."""
  keys = jax.random.split(jax.random.key(seed), len(SIGNAL) + 1)
  grads = {
      name: s + jax.random.normal(k, (NUM_MICROBATCHES, *s.shape))
      for k, (name, s) in zip(keys, SIGNAL.items(), strict=False)
  }
  return grads, 1.0 + 0.1 * jax.random.normal(keys[-1], (NUM_MICROBATCHES,))


def train(tx, params, grads, losses, *, shards=None):
  """The num_steps after every microbatch, and the final params.

  With ``shards``, every leaf is split into that many shards along its first
  axis and each shard trains in its own lane of a vmap named 'shards'.
  """

  def run(params, grads):
    def body(carry, xs):
      params, state = carry
      g, loss = xs
      params, state = optax_gqc.update_and_apply(tx, g, state, params, value=loss)
      return (params, state), state.num_steps

    (params, _), steps = jax.lax.scan(body, (params, tx.init(params)), (grads, losses))
    return params, steps

  if shards is None:
    return jax.jit(run)(params, grads)
  split = lambda x, axis: jnp.stack(jnp.split(x, shards, axis))  # noqa: E731
  params, steps = jax.jit(jax.vmap(run, axis_name='shards'))(
      jax.tree.map(lambda x: split(x, 0), params), jax.tree.map(lambda x: split(x, 1), grads)
  )
  return jax.tree.map(lambda x: jnp.concatenate(list(x)), params), steps


READY_MADE = {
    'gnts': lambda a: optax_gqc.gnts(optax.adam(0.05), 2.6, max_draws=8, axis_name=a),
    'sbc': lambda a: optax_gqc.sbc(
        optax.adam(0.05), lambda t: 32 + 32 * (t // 10), microbatch_size=16, axis_name=a
    ),
    'noise_ratio_accumulation': lambda a: optax_gqc.noise_ratio_accumulation(
        optax.adam(0.05), 0.05, max_draws=8, axis_name=a
    ),
    'mht': lambda a: optax_gqc.mht(optax.adam(0.05), 0.9, 0.1, max_draws=8, axis_name=a),
    'norm_test_accumulation': lambda a: optax_gqc.norm_test_accumulation(
        optax.adam(0.05), 0.9, max_draws=8, axis_name=a
    ),
    'critical_batch': lambda a: optax_gqc.accumulate(
        optax.adam(0.05), optax_gqc.gates.critical_batch(0.5, 16), max_draws=8, axis_name=a
    ),
    'scheduled_accumulation': lambda a: optax_gqc.scheduled_accumulation(
        optax.adamw,
        optax_gqc.gates.norm_below(2.6),
        {'learning_rate': optax.linear_schedule(0.05, 0.01, NUM_MICROBATCHES)},
        max_draws=8,
        axis_name=a,
    ),
    'gnts_with_cosine_schedule': lambda a: optax_gqc.gnts_with_cosine_schedule(
        0.05, NUM_MICROBATCHES, 4, initial_threshold=2.8, final_threshold=2.4, axis_name=a
    ),
}


# The ready-made optimizers whose gate reads no gradient norm: a shard decides as the whole.
READS_NO_NORM = {'sbc', 'mht'}


@pytest.mark.parametrize(
    'name',
    [n if n == 'gnts' else pytest.param(n, marks=pytest.mark.slow) for n in sorted(READY_MADE)],
)
def test_ready_made_with_axis_name_decides_on_the_global_norm(name):
  params = jax.tree.map(jnp.zeros_like, SIGNAL)
  grads, losses = stream()
  ref_params, ref_steps = train(READY_MADE[name](None), params, grads, losses)
  assert len(set(draws_per_step(ref_steps))) > 1  # the gate decides, not a fixed cadence
  new_params, steps = train(READY_MADE[name]('shards'), params, grads, losses, shards=NUM_SHARDS)
  for shard_steps in np.asarray(steps):
    np.testing.assert_array_equal(shard_steps, ref_steps)
  chex.assert_trees_all_close(new_params, ref_params, rtol=1e-5, atol=1e-6)
  # The control: without axis_name each shard's gate reads its own norm.
  _, local = train(READY_MADE[name](None), params, grads, losses, shards=NUM_SHARDS)
  differs = [(shard_steps != ref_steps).any() for shard_steps in np.asarray(local)]
  assert any(differs) == (name not in READS_NO_NORM)


@pytest.mark.slow
def test_the_fsdp_example_of_docs_scale_runs_as_written_and_as_one_device():
  # docs/scale.md's shard_map block, with its imports, on 8 devices, against
  # the same gnts on one device with the whole arrays.
  blocks = re.findall(
      r'```python\n(.*?)```', pathlib.Path(processes.ROOT, 'docs', 'scale.md').read_text(), re.S
  )
  imports = blocks[0].split('\nmesh =')[0]
  example = next(b for b in blocks if 'jax.shard_map(' in b)
  script = (
      textwrap.dedent("""
      import json
      import numpy as np
      from tests.processes import regression
      params, xs, ys = regression(8, 64)
      # A quarter of the scale, where the mean's norm falls below the example's 0.5.
      params = {k: 0.25 * np.asarray(v) for k, v in params.items()}
      batches = list(zip(np.asarray(xs), 0.25 * np.asarray(ys)))
      reference_params = params
  """)
      + imports
      + '\n'
      + example
      + textwrap.dedent("""
      one = optax_gqc.gnts(optax.adamw(1e-3), threshold=0.5)
      p, s = reference_params, one.init(reference_params)
      for x, y in batches:
        g = jax.grad(lambda q: jnp.mean(per_example_loss(q, x, y)))(p)
        p, s = optax_gqc.update_and_apply(one, g, s, p)
      print(json.dumps({
          'steps': [int(opt_state.num_steps), int(s.num_steps)],
          'draws': [int(opt_state.num_microbatches), int(s.num_microbatches)],
          'spec': str(params['w'].sharding.spec),
          'diff': max(float(jnp.max(jnp.abs(params[k] - p[k]))) for k in p),
      }))
  """)
  )
  out = processes.run_script(script)
  assert out['draws'] == [8, 8] and out['steps'][0] == out['steps'][1] >= 2
  assert out['spec'] == str(P('fsdp', None)) and out['diff'] < 1e-6
