"""Checkpointing with Orbax: a run saved mid-accumulation resumes bitwise.

orbax-checkpoint is an optional extra (``optax-gqc[checkpoint]``); optax_gqc
never imports it, and these tests skip without it. Every resumed run starts
from fresh objects, as a restarted program would: a new optimizer, a new
jitted step, a state restored into an abstract target.
"""

import importlib.util
import pathlib
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_gqc
from optax_gqc import gates
from tests import processes

ocp = pytest.importorskip('orbax.checkpoint')

NUM, SAVE_AT = 16, 6  # microbatches in all; saved after SAVE_AT of them


def regression(seed=0):
  """Params and microbatches of a noisy linear regression near its optimum."""
  k = jax.random.split(jax.random.key(seed), 5)
  w_star, b_star = jax.random.normal(k[0], (6, 2)), jax.random.normal(k[1], (2,))
  params = {'w': w_star + 0.1 * jax.random.normal(k[2], (6, 2)), 'b': b_star}
  xs = jax.random.normal(k[3], (NUM, 8, 6))
  ys = xs @ w_star + b_star + jax.random.normal(k[4], (NUM, 8, 2))
  return params, np.asarray(xs), np.asarray(ys)  # on the host: slicing compiles nothing


def loss_fn(params, x, y):
  return jnp.mean(jnp.sum((x @ params['w'] + params['b'] - y) ** 2, -1)) / 2


OPTIMIZERS = {
    'gnts': lambda: optax_gqc.gnts(optax.adamw(1e-2), 1.4, max_draws=4),
    'critical_batch': lambda: optax_gqc.accumulate(
        optax.sgd(0.05, momentum=0.9),
        gates.critical_batch(0.5, 8, bootstrap_steps=1),  # mid-accumulation at SAVE_AT
        max_draws=4,
    ),
    'mht': lambda: optax_gqc.mht(optax.adam(1e-2), 0.9, 0.2, max_draws=4),
    'gnts_with_cosine_schedule': lambda: optax_gqc.gnts_with_cosine_schedule(
        1e-2, NUM, 2, initial_threshold=1.4, final_threshold=1.0, max_draws=4
    ),
}


def make_step(tx):
  @jax.jit
  def step(params, state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return optax_gqc.update_and_apply(tx, grads, state, params, value=loss)

  return step


def train(step, params, state, xs, ys):
  """Runs the microbatches; returns params, state and num_steps after each."""
  steps = []
  for x, y in zip(xs, ys, strict=True):
    params, state = step(params, state, x, y)
    steps.append(int(optax_gqc.statistics(state)['num_steps']))
  return params, state, steps


def abstract_target(tx, params):
  """What a restarted program restores into: shapes and dtypes, no arrays."""
  return jax.eval_shape(lambda p: {'params': p, 'opt_state': tx.init(p)}, params)


def assert_bitwise_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize(
    'name',
    [n if n == 'gnts' else pytest.param(n, marks=pytest.mark.slow) for n in sorted(OPTIMIZERS)],
)
def test_resume_mid_accumulation_is_bitwise(name, tmp_path):
  params, xs, ys = regression()
  tx = OPTIMIZERS[name]()
  step = make_step(tx)
  ref_params, ref_state, ref_steps = train(step, params, tx.init(params), xs, ys)

  saved_params, saved_state, first = train(
      step, params, tx.init(params), xs[:SAVE_AT], ys[:SAVE_AT]
  )
  assert int(saved_state.num_draws) > 0  # mid-accumulation: a live accumulator
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'ckpt', {'params': saved_params, 'opt_state': saved_state})

  # A restarted program: a new optimizer and a new step.
  tx = OPTIMIZERS[name]()
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / 'ckpt', abstract_target(tx, params))
  assert_bitwise_equal(restored, {'params': saved_params, 'opt_state': saved_state})

  new_params, new_state, rest = train(
      make_step(tx), restored['params'], restored['opt_state'], xs[SAVE_AT:], ys[SAVE_AT:]
  )
  assert first + rest == ref_steps
  assert len(set(ref_steps)) > 2  # it stepped several times, after the save too
  assert_bitwise_equal((new_params, new_state), (ref_params, ref_state))


def test_a_restored_state_keeps_its_constants_and_follows_new_schedules(tmp_path):
  # docs/checkpointing.md: an injected constant is the checkpoint's; a
  # schedule (a recipe's weight decay, even a constant one) and a gate's
  # argument are the transformation's built again.
  params, zero = {'w': jnp.ones(2)}, {'w': jnp.zeros(2)}

  def injected(wd):
    adamw = optax.inject_hyperparams(optax.adamw)(learning_rate=0.1, weight_decay=wd)
    return optax_gqc.sbc(adamw, 1, 1)

  def recipe(wd):
    return optax_gqc.gnts_with_cosine_schedule_conventional_lr(
        0.1, 100, 0, max_draws=1, weight_decay=wd, initial_threshold=0.0, final_threshold=0.0
    )

  for i, (make, decay) in enumerate(((injected, 0.0), (recipe, 0.5))):
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(tmp_path / str(i), make(0.0).init(params))
      tx = make(0.5)
      state = checkpointer.restore(tmp_path / str(i), jax.eval_shape(tx.init, params))
    updates, _ = tx.update(zero, state, params)
    np.testing.assert_allclose(updates['w'], -0.1 * decay * params['w'], rtol=1e-3)


def test_checkpoint_manager_keeps_the_latest_steps_and_resumes(tmp_path):
  params, xs, ys = regression()
  tx = OPTIMIZERS['gnts']()
  step = make_step(tx)
  ref_params, ref_state, _ = train(step, params, tx.init(params), xs, ys)
  options = ocp.CheckpointManagerOptions(max_to_keep=2)
  with ocp.CheckpointManager(tmp_path, options=options) as manager:
    state = tx.init(params)
    for i in range(SAVE_AT):
      params, state = step(params, state, xs[i], ys[i])
      manager.save(i, args=ocp.args.StandardSave({'params': params, 'opt_state': state}))
    manager.wait_until_finished()
    assert manager.all_steps() == [SAVE_AT - 2, SAVE_AT - 1]
    restored = manager.restore(
        manager.latest_step(), args=ocp.args.StandardRestore(abstract_target(tx, params))
    )
  new_params, new_state, _ = train(
      step, restored['params'], restored['opt_state'], xs[SAVE_AT:], ys[SAVE_AT:]
  )
  assert_bitwise_equal((new_params, new_state), (ref_params, ref_state))


@pytest.mark.slow
def test_nnx_optimizer_resumes_bitwise(tmp_path):
  nnx = pytest.importorskip('flax.nnx')
  _, xs, ys = regression()

  def make():
    model = nnx.Sequential(
        nnx.Linear(6, 16, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(16, 2, rngs=nnx.Rngs(1))
    )
    return model, nnx.Optimizer(model, OPTIMIZERS['gnts'](), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, x, y):
    grads = nnx.grad(lambda m: jnp.mean(jnp.sum((m(x) - y) ** 2, -1)) / 2)(model)
    optimizer.update(model, grads)

  def train_nnx(model, optimizer, xs, ys):
    steps = []
    for x, y in zip(xs, ys, strict=True):
      step(model, optimizer, x, y)
      steps.append(int(optax_gqc.statistics(optimizer.opt_state)['num_steps']))
    return steps

  ref_model, ref_optimizer = make()
  ref_steps = train_nnx(ref_model, ref_optimizer, xs, ys)

  model, optimizer = make()
  first = train_nnx(model, optimizer, xs[:SAVE_AT], ys[:SAVE_AT])
  assert int(optax_gqc.statistics(optimizer.opt_state)['num_draws']) > 0
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / 'model', nnx.state(model))
    checkpointer.save(tmp_path / 'optimizer', nnx.state(optimizer))

  model, optimizer = make()  # a restarted program; nnx.state gives the target
  with ocp.StandardCheckpointer() as checkpointer:
    nnx.update(model, checkpointer.restore(tmp_path / 'model', nnx.state(model)))
    nnx.update(optimizer, checkpointer.restore(tmp_path / 'optimizer', nnx.state(optimizer)))
  rest = train_nnx(model, optimizer, xs[SAVE_AT:], ys[SAVE_AT:])
  assert first + rest == ref_steps and len(set(ref_steps)) > 2
  assert_bitwise_equal(
      (nnx.state(model), nnx.state(optimizer)), (nnx.state(ref_model), nnx.state(ref_optimizer))
  )


# Saved from 8 devices (FSDP: 'w' sharded by rows, the batch by examples),
# restored onto 4 and onto 1 with the target's shardings, and continued there.
RESHARD_SCRIPT = textwrap.dedent("""
    import json, tempfile
    import jax, jax.numpy as jnp, numpy as np, optax, optax_gqc
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from tests.processes import regression

    assert jax.device_count() == 8
    NUM, SAVE_AT, BATCH = 24, 10, 32
    params, xs, ys = regression(NUM, BATCH)
    specs = {'w': P('x'), 'b': P()}
    tx = optax_gqc.gnts(optax.adam(3e-2), 1.0, max_draws=8)

    def loss_fn(p, x, y):
        return jnp.mean(jnp.sum((x @ p['w'] + p['b'] - y) ** 2, -1)) / 2

    @jax.jit
    def step(p, s, x, y):
        return optax_gqc.update_and_apply(tx, jax.grad(loss_fn)(p, x, y), s, p)

    def on(mesh, tree, specs):
        return jax.tree.map(lambda v, s: jax.device_put(v, NamedSharding(mesh, s)), tree, specs)

    def train(p, s, mesh, lo, hi):
        steps = []
        for i in range(lo, hi):
            batch = on(mesh, (xs[i], ys[i]), (P('x'), P('x')))
            p, s = step(p, s, *batch)
            steps.append(int(s.num_steps))
        return p, s, steps

    def mesh_of(n):
        return Mesh(np.array(jax.devices()[:n]), ('x',))

    def bitwise(a, b):
        return all(np.array_equal(np.asarray(x), np.asarray(y)) and
                   np.asarray(x).dtype == np.asarray(y).dtype
                   for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))

    p8 = on(mesh_of(8), params, specs)
    ref_p, ref_s, ref_steps = train(p8, tx.init(p8), mesh_of(8), 0, NUM)
    p, s, first = train(p8, tx.init(p8), mesh_of(8), 0, SAVE_AT)
    path = tempfile.mkdtemp() + '/ckpt'
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, {'params': p, 'opt_state': s})

    out = {'num_draws_at_save': int(s.num_draws)}
    for n in (4, 1):
        mesh = mesh_of(n)
        # The target: the params' shardings on the new mesh, the state's
        # params-like leaves (accumulator, moments) like the params, the
        # counters replicated.
        abstract_params = jax.tree.map(
            lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, s)),
            params, specs)
        replicated = NamedSharding(mesh, P())
        abstract_state = optax.tree_map_params(
            tx, lambda x, p: x.update(sharding=p.sharding if x.ndim == p.ndim else replicated),
            jax.eval_shape(tx.init, params), abstract_params,
            transform_non_params=lambda x: x.update(sharding=replicated))
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(
                path, {'params': abstract_params, 'opt_state': abstract_state})
        rp, rs = restored['params'], restored['opt_state']
        new_p, new_s, rest = train(rp, rs, mesh, SAVE_AT, NUM)
        # The same continuation from the live state, resharded in memory.
        live_p, live_s, _ = train(
            *jax.device_put((p, s), jax.tree.map(lambda x: x.sharding, (rp, rs))),
            mesh, SAVE_AT, NUM)
        out[n] = {
            'restored_bitwise': bitwise((rp, rs), (p, s)),
            'meshes': sorted({len(x.sharding.device_set) for x in jax.tree.leaves((rp, rs))}),
            'accumulator_like_params': rs.accumulator['w'].sharding.is_equivalent_to(
                rp['w'].sharding, 2) and not (n > 1 and rp['w'].sharding.is_fully_replicated),
            'steps_as_uninterrupted': first + rest == ref_steps,
            'steps': ref_steps,
            'continued_as_live_state_bitwise': bitwise((new_p, new_s), (live_p, live_s)),
            'params_max_abs_diff_to_8_devices': max(
                float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree.leaves(new_p), jax.tree.leaves(ref_p))),
        }
    print(json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.parametrize('num_devices', ['4', '1'])
def test_restore_from_8_devices_onto_fewer(num_devices, reshard_run):
  run = reshard_run[num_devices]
  assert reshard_run['num_draws_at_save'] > 0
  assert run['restored_bitwise']
  assert run['meshes'] == [int(num_devices)]  # every leaf on the new mesh
  assert run['accumulator_like_params']
  assert run['steps_as_uninterrupted'] and len(set(run['steps'])) > 2
  assert run['continued_as_live_state_bitwise']
  # Fewer devices sum the gradient in another order: equal to rounding.
  assert run['params_max_abs_diff_to_8_devices'] < 1e-5


@pytest.fixture(scope='module')
def reshard_run():
  return processes.run_script(RESHARD_SCRIPT)


def _checkpointing_example():
  spec = importlib.util.spec_from_file_location(
      'examples_checkpointing', f'{processes.ROOT}/examples/checkpointing.py'
  )
  example = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(example)
  return example


@pytest.mark.slow
def test_example_resumes_bitwise(capsys):
  result = _checkpointing_example().main()
  assert result['num_draws_at_save'] > 0
  assert result['resumed_equals_uninterrupted']
  assert 'bitwise: True' in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize('same, status', [(True, 0), (False, 1)])
def test_example_run_as_a_script_exits_on_its_verdict(monkeypatch, same, status):
  example = _checkpointing_example()
  monkeypatch.setattr(example, 'main', lambda: {'resumed_equals_uninterrupted': same})
  monkeypatch.setattr('sys.argv', ['checkpointing.py'])
  source = pathlib.Path(example.__file__).read_text()
  script = source[source.index("if __name__ == '__main__':") :]
  with pytest.raises(SystemExit) as info:
    exec(script, {**vars(example), '__name__': '__main__'})
  assert info.value.code == status


@pytest.mark.slow
def test_optax_gqc_does_not_import_orbax():
  # orbax-checkpoint is an optional extra: the library must not need it.
  code = 'import sys, optax_gqc; print("orbax" in " ".join(sys.modules))'
  assert processes.run_code(code, num_devices=1, timeout=120).strip() == 'False'


def test_a_state_restored_as_a_plain_pytree_with_a_narrower_accumulator_is_refused():
  # flax.serialization.from_bytes (or np.savez) keeps the saved dtypes: a
  # bfloat16 accumulator in a float32 accumulation would round every sum.
  params = {'w': jnp.zeros(3)}
  grads = {'w': jnp.full(3, 1 / 3)}
  bf16 = optax_gqc.sbc(optax.sgd(1.0), 4, 1, accumulator_dtype=jnp.bfloat16)
  f32 = optax_gqc.sbc(optax.sgd(1.0), 4, 1)
  state = jax.tree.map(np.asarray, bf16.init(params))  # as plain arrays from disk
  refused = r"accumulator \['w'\] is bfloat16, narrower than the float32 of this accumulation"
  for update in (
      jax.jit(f32.update),
      lambda g, s, p: jax.jit(f32.update)(g, s),  # no params: sgd needs none
      lambda g, s, p: optax_gqc.update_and_apply(f32, g, s, p),
  ):
    with pytest.raises(ValueError, match=refused):
      update(grads, state, params)
  # The cast the error gives makes it the state of this accumulation.
  cast = jax.tree.map(lambda x, t: jnp.asarray(x, t.dtype), state, jax.eval_shape(f32.init, params))
  for _ in range(4):
    updates, cast = jax.jit(f32.update)(grads, cast, params)
  np.testing.assert_allclose(updates['w'], -1 / 3, rtol=1e-6)
  # A wider accumulator than asked for is kept: it only costs memory.
  wider = jax.tree.map(np.asarray, f32.init(params))
  updates, wider = jax.jit(bf16.update)(grads, wider, params)
  assert wider.accumulator['w'].dtype == jnp.float32


def test_a_float64_accumulator_takes_float32_params_at_update():
  with jax.enable_x64(True):
    tx = optax_gqc.sbc(optax.sgd(1.0), 2, 1)
    state = tx.init({'w': np.zeros(3)})  # float64 params: a float64 accumulator
    params = {'w': jnp.zeros(3, jnp.float32)}
    for _ in range(2):
      updates, state = tx.update({'w': jnp.ones(3, jnp.float32)}, state, params)
    np.testing.assert_array_equal(updates['w'], -1.0)
