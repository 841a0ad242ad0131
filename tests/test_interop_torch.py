"""The PyTorch bridge: conversions both ways, writing back, gradients."""

import importlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

try:
  import torch
except ImportError:
  torch = None

if torch is not None:
  from optax_gqc.interop import torch as tshim

needs_torch = pytest.mark.skipif(torch is None, reason='needs torch')


def test_import_without_torch_says_how_to_install(monkeypatch):
  import optax_gqc.interop

  monkeypatch.setitem(sys.modules, 'torch', None)  # what a missing torch looks like
  monkeypatch.delitem(sys.modules, 'optax_gqc.interop.torch', raising=False)
  importlib.reload(optax_gqc.interop)  # the package itself needs no torch
  with pytest.raises(ImportError, match=r'pip install "optax-gqc\[torch\]"'):
    importlib.import_module('optax_gqc.interop.torch')


def _model(dtype):
  torch.manual_seed(0)
  return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).to(
      dtype
  )


def _bits(x):
  """Raw bits, so bf16 values compare exactly."""
  a = np.asarray(x)
  return a.view({2: np.int16, 4: np.int32}[a.dtype.itemsize])


@needs_torch
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_module_round_trip_keeps_names_dtypes_and_values(dtype):
  model = _model(getattr(torch, dtype))
  tree = tshim.params_to_jax(model)
  assert list(tree) == [name for name, _ in model.named_parameters()]
  for name, p in model.named_parameters():
    assert tree[name].dtype == jnp.dtype(dtype) and tree[name].shape == tuple(p.shape)
    np.testing.assert_array_equal(_bits(tree[name]), _bits(tshim.to_jax(p)))
    np.testing.assert_array_equal(
        _bits(tree[name]), p.detach().view(torch.int16 if dtype == 'bfloat16' else torch.int32)
    )

  changed = {k: (2 * v + 1).astype(v.dtype) for k, v in tree.items()}
  tshim.load_into(model, changed)
  back = tshim.params_to_jax(model)
  for name in tree:
    assert back[name].dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(_bits(back[name]), _bits(changed[name]))


@needs_torch
def test_conversions_copy():
  t = torch.arange(6.0).reshape(2, 3)
  a = tshim.to_jax(t)
  t.add_(100.0)  # torch changes its tensor in place; the JAX array must not see it
  np.testing.assert_array_equal(np.asarray(a), np.arange(6.0).reshape(2, 3))
  back = tshim.to_torch(a)
  back.mul_(0.0)
  np.testing.assert_array_equal(np.asarray(a), np.arange(6.0).reshape(2, 3))
  # A transposed (non-contiguous) tensor keeps its logical layout.
  np.testing.assert_array_equal(np.asarray(tshim.to_jax(t.T)), t.numpy().T)
  tree = tshim.tree_to_torch({'a': jnp.ones(2, jnp.bfloat16), 'b': [jnp.zeros(3, jnp.int32)]})
  assert tree['a'].dtype == torch.bfloat16 and tree['b'][0].dtype == torch.int32


@needs_torch
def test_to_jax_puts_a_cpu_tensor_on_jaxs_default_device(monkeypatch):
  t = torch.arange(6.0).reshape(2, 3)
  assert tshim.to_jax(t).devices() == {jax.devices()[0]}  # on a GPU, the GPU
  bits = torch.tensor([1.0, -2.5, 3e38, float('nan')], dtype=torch.bfloat16)
  tensors = [t, t.T, bits, torch.arange(3, dtype=torch.int32)]
  by_dlpack = [tshim.to_jax(x) for x in tensors]
  # Where JAX computes elsewhere, the tensor goes through host memory, as a
  # NumPy array would: here the CPU stands in for that other device.
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  for tensor, expected in zip(tensors, by_dlpack, strict=True):
    a = tshim.to_jax(tensor)
    assert a.dtype == expected.dtype and a.shape == tuple(tensor.shape)
    assert not a.committed and a.devices() == {jax.devices()[0]}
    np.testing.assert_array_equal(_bits(a), _bits(expected))
  a = tshim.to_jax(t)
  t.add_(100.0)  # the copy is the array's own
  np.testing.assert_array_equal(np.asarray(a), np.arange(6.0).reshape(2, 3))


@needs_torch
def test_to_torch_copies_into_torchs_own_memory():
  # Torch's allocator, not JAX's, owns the copies: a storage that torch did not
  # allocate (a DLPack or from_blob one) cannot be resized. On a GPU, memory
  # that JAX owned could be reused by JAX while torch's kernels still read it.
  arrays = {'a': jnp.arange(6.0).reshape(2, 3), 'b': jnp.ones(2, jnp.bfloat16)}
  for tensor in [tshim.to_torch(arrays['a']), *tshim.tree_to_torch(arrays).values()]:
    assert tensor.untyped_storage().resizable()
  assert tshim.to_torch(arrays['a'], 'cpu').untyped_storage().resizable()
  params = {'a': torch.nn.Parameter(torch.zeros(2, 3))}
  tshim.set_grads(params, {'a': arrays['a']})  # the copy itself becomes .grad
  assert params['a'].grad.untyped_storage().resizable()
  np.testing.assert_array_equal(tshim.to_torch(arrays['a']).cpu().numpy(), np.asarray(arrays['a']))


@needs_torch
def test_grads_to_jax_and_set_grads():
  model = _model(torch.float32)
  tree = tshim.params_to_jax(model)
  assert all(np.all(np.asarray(g) == 0) for g in tshim.grads_to_jax(model).values())  # no .grad

  model(torch.ones(2, 5)).sum().backward()
  grads = tshim.grads_to_jax(model)
  for name, p in model.named_parameters():
    np.testing.assert_array_equal(np.asarray(grads[name]), p.grad.numpy())

  new = {k: jnp.full(v.shape, 0.5, v.dtype) for k, v in tree.items()}
  tshim.set_grads(model, new)  # replaces
  assert all(torch.all(p.grad == 0.5) for p in model.parameters())

  seen = []
  model[0].weight.register_hook(lambda g: seen.append(float(g.norm())))
  tshim.set_grads(model, new, accumulate=True)  # adds through autograd, hooks run
  assert all(torch.all(p.grad == 1.0) for p in model.parameters())
  assert seen == [pytest.approx(0.5 * np.sqrt(20))]


@needs_torch
def test_a_frozen_parameter_keeps_no_grad_through_the_round_trip():
  # grads_to_jax gives it zeros; written back as a .grad, torch's AdamW would decay it.
  model = _model(torch.float32)
  model[0].bias.requires_grad_(False)
  model(torch.ones(2, 5)).sum().backward()
  grads = tshim.grads_to_jax(model)
  assert np.all(np.asarray(grads['0.bias']) == 0)
  for accumulate in (False, True):
    tshim.set_grads(model, grads, accumulate=accumulate)
    assert model[0].bias.grad is None and model[0].weight.grad is not None
  detached = torch.zeros(2)
  detached.grad = torch.zeros(2)
  with pytest.raises(ValueError, match='no tensor requires grad'):
    tshim.set_grads({'b': detached}, {'b': jnp.ones(2)})


@needs_torch
def test_parameters_without_names_and_sparse_gradients_raise_clearly():
  model = _model(torch.float32)
  for fn in (tshim.params_to_jax, tshim.grads_to_jax):
    with pytest.raises(TypeError, match=r'named_parameters\(\) in place of module.parameters'):
      fn(model.parameters())  # each item a tensor, not a (name, tensor) pair
  pairs = [[name, p] for name, p in model.named_parameters()]  # lists for tuples
  assert tshim.params_to_jax(pairs).keys() == tshim.params_to_jax(model).keys()
  embedding = torch.nn.Embedding(4, 2, sparse=True)
  embedding(torch.tensor([1, 2])).sum().backward()
  with pytest.raises(TypeError, match='to_dense'):
    tshim.grads_to_jax(embedding)


@needs_torch
def test_grads_of_a_state_dict_raise():
  # Its tensors are detached from the parameters: a .grad read there is none, one
  # written there reaches no parameter.
  model = _model(torch.float32)
  model(torch.ones(2, 5)).sum().backward()
  tree = tshim.params_to_jax(model)
  with pytest.raises(ValueError, match=r'state_dict\(\).*named_parameters'):
    tshim.grads_to_jax(model.state_dict())
  with pytest.raises(ValueError, match=r'state_dict\(\).*named_parameters'):
    tshim.set_grads(model.state_dict(), tree)
  named = dict(model.named_parameters())
  assert tshim.grads_to_jax(named).keys() == tree.keys()
  tshim.set_grads(named, tree)
  np.testing.assert_array_equal(model[0].weight.grad.numpy(), np.asarray(tree['0.weight']))


@needs_torch
def test_64_bit_values_are_kept_or_refused_never_wrapped():
  # JAX's default (jax_enable_x64 off) makes int64 int32: values beyond it would wrap.
  small = tshim.to_jax(torch.tensor([-3, 2**31 - 1]))
  assert small.dtype == jnp.int32 and small.tolist() == [-3, 2**31 - 1]
  for big in (torch.tensor([3_000_000_000]), torch.tensor([2**40], dtype=torch.uint64)):
    with pytest.raises(OverflowError, match='jax_enable_x64'):
      tshim.to_jax(big)
  # NumPy's 64-bit arrays reach torch as they are, not through JAX's 32 bits.
  for a in (
      np.array([3_000_000_000]),
      np.array([1 + 1e-12]),
      np.array([2**40], np.uint64),
      np.float64(1 + 1e-12),  # a NumPy scalar, not an array
  ):
    t = tshim.to_torch(a)
    assert str(t.dtype) == f'torch.{a.dtype}' and t.tolist() == a.tolist() and t.ndim == a.ndim


@needs_torch
def test_float64_values_beyond_float32_are_refused_not_made_inf():
  for big in (
      torch.tensor([1.0, 1e300], dtype=torch.float64),
      torch.tensor([1e39 + 0j], dtype=torch.complex128),
  ):
    with pytest.raises(OverflowError, match='would become inf'):
      tshim.to_jax(big)
  # Just past float32's largest, float32 rounds to it: kept, as JAX would make it.
  edge = tshim.to_jax(torch.tensor([3.4028235e38 * (1 + 1e-10)], dtype=torch.float64))
  assert edge[0] == np.finfo(np.float32).max
  kept = tshim.to_jax(torch.tensor([np.inf, -np.inf, np.nan, 1e-300, 3e38], dtype=torch.float64))
  assert kept.dtype == jnp.float32 and np.array_equal(
      kept, np.float32([np.inf, -np.inf, np.nan, 0.0, 3e38]), equal_nan=True
  )


@needs_torch
def test_numpy_arrays_in_another_byte_order_reach_torch_and_masked_ones_are_refused():
  for dtype in ('>f8', '>f4', '>i8', '>i4', '>f2', '>c16'):
    a = np.arange(-2, 3).astype(dtype)
    t = tshim.to_torch(a)
    assert str(t.dtype) == f'torch.{a.dtype.newbyteorder("=")}' and t.tolist() == a.tolist()
  assert tshim.to_torch(np.array(1.5, '>f8')[()]).item() == 1.5  # a scalar
  with pytest.raises(TypeError, match=r'mask.*a\.filled'):
    tshim.to_torch(np.ma.masked_array([1.0, 2.0], mask=[False, True]))
  model = torch.nn.Linear(2, 1).double()
  masked = np.ma.masked_array([[1.0, 2.0]], mask=[[False, True]])
  with pytest.raises(TypeError, match='mask'):
    tshim.load_into(model, {'weight': masked, 'bias': np.zeros(1)})
  tshim.load_into(model, {'weight': np.ma.zeros((1, 2)), 'bias': np.zeros(1)})  # none masked
  assert model.weight.tolist() == [[0.0, 0.0]]
  if np.dtype(np.longdouble).itemsize > 8:  # extended precision on this machine
    with pytest.raises(TypeError, match='cast it to float64'):
      tshim.to_torch(np.ones(2, np.longdouble))


@needs_torch
def test_torch_tensors_given_as_values_keep_their_dtype():
  # Through jnp.asarray a float64 tensor lost its last bits, and a bfloat16 one raised.
  model = torch.nn.Linear(2, 1).double()
  values = {n: p.detach() + 1e-12 for n, p in model.named_parameters()}
  tshim.load_into(model, values)
  assert all(torch.equal(p, values[n]) for n, p in model.named_parameters())
  t = tshim.to_torch(torch.tensor([1 + 1e-12], dtype=torch.float64))
  assert t.dtype == torch.float64 and t.item() == 1 + 1e-12
  half = torch.nn.Linear(2, 1).bfloat16()
  tshim.set_grads(half, {n: torch.ones_like(p) for n, p in half.named_parameters()})
  assert all(
      p.grad.dtype == torch.bfloat16 and bool((p.grad == 1).all()) for p in half.parameters()
  )


@needs_torch
def test_a_tied_weight_under_two_names_is_refused_where_it_would_be_written_twice():
  emb, out = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)
  out.weight = emb.weight
  model = torch.nn.ModuleDict({'emb': emb, 'out': out})
  named = model.state_dict(keep_vars=True)  # both names, one Parameter
  assert named['emb.weight'] is named['out.weight']
  grads = {n: jnp.ones(t.shape) for n, t in named.items()}
  for write in (
      lambda: tshim.set_grads(named, grads, accumulate=True),  # gave twice the gradient
      lambda: tshim.set_grads(named, grads),
      lambda: tshim.load_into(named, grads),  # the last name won
  ):
    with pytest.raises(ValueError, match='tied weights'):
      write()
  tshim.set_grads(model, {'emb.weight': jnp.ones((5, 3))}, accumulate=True)  # named once
  assert bool((emb.weight.grad == 1).all())
  assert set(tshim.params_to_jax(named)) == {'emb.weight', 'out.weight'}  # reading is fine


@needs_torch
def test_set_grads_casts_to_the_parameter_dtype():
  model = _model(torch.bfloat16)
  grads = {k: jnp.ones(v.shape, jnp.float32) for k, v in tshim.params_to_jax(model).items()}
  tshim.set_grads(model, grads)
  assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())


@needs_torch
def test_load_into_refuses_a_cast_that_loses_more_than_rounding():
  model = torch.nn.Linear(2, 1).to(torch.float16)
  before = model.weight.detach().clone()
  with pytest.raises(OverflowError, match=r"'bias' holds finite values beyond the largest"):
    tshim.load_into(model, {'weight': jnp.ones((1, 2)), 'bias': jnp.full(1, 1e6)})
  assert torch.equal(model.weight.detach(), before)  # nothing written before the refusal
  with pytest.raises(TypeError, match=r"'bias' is complex .* \(jnp.real\)"):
    tshim.load_into(model, {'weight': jnp.ones((1, 2)), 'bias': jnp.zeros(1, jnp.complex64)})
  tshim.load_into(model, {'weight': jnp.asarray([[jnp.inf, 0.1]]), 'bias': jnp.zeros(1)})
  assert model.weight[0, 0] == float('inf')  # an inf given is an inf loaded
  assert model.weight[0, 1] == torch.tensor(0.1, dtype=torch.float16)  # rounded, as cast


@needs_torch
def test_integer_and_complex_values_too_large_or_fractional_are_refused():
  # Only float-to-float casts were checked: these became inf, or a truncated count.
  half = torch.nn.Linear(2, 1).half()
  for who in (tshim.load_into, tshim.set_grads):
    with pytest.raises(OverflowError, match="'bias' holds finite values beyond"):
      who(half, {'weight': jnp.ones((1, 2)), 'bias': np.array([1_000_000], np.int32)})
  z = {'z': torch.nn.Parameter(torch.zeros(1, dtype=torch.complex64))}
  with pytest.raises(OverflowError, match="'z' holds finite values beyond"):
    tshim.load_into(z, {'z': np.array([1e39 + 0j])})
  counts = {'n': torch.zeros((), dtype=torch.int32)}  # a count, as BatchNorm keeps one
  tshim.load_into(counts, {'n': np.array(7.0)})  # a whole number in range: loaded
  assert counts['n'].item() == 7 and counts['n'].dtype == torch.int32
  for bad in (np.array(2.5), np.array(2**40)):  # cut to 2, wrapped to 0
    with pytest.raises(ValueError, match=r"'n' holds values .* beyond \[-2147483648"):
      tshim.load_into(counts, {'n': bad})
  assert counts['n'].item() == 7
  # int64's largest is 2**63 in float64: 2**63 itself passed, and wrapped to int64's least.
  wide = {'n': torch.zeros((), dtype=torch.int64)}
  with pytest.raises(ValueError, match="'n' holds values"):
    tshim.load_into(wide, {'n': np.float32(2.0**63)})


@needs_torch
def test_to_torch_refuses_a_list_jax_would_make_inf():
  with pytest.raises(OverflowError, match='the list holds finite values beyond the largest'):
    tshim.to_torch([1e300])  # JAX's float32 of it is inf


@needs_torch
def test_to_torch_takes_a_list_as_jax_numpy_asarray_does():
  t = tshim.to_torch([1.0, 2.0])  # told to give a {name: array} dict
  assert t.dtype == torch.float32 and t.tolist() == [1.0, 2.0]


@needs_torch
@pytest.mark.parametrize('accumulate', [False, True])
def test_set_grads_refuses_a_cast_that_loses_more_than_rounding(accumulate):
  model = torch.nn.Linear(2, 1).to(torch.float16)
  with pytest.raises(OverflowError, match=r"set_grads: 'bias' holds finite .* parameter's .grad"):
    tshim.set_grads(
        model, {'weight': jnp.ones((1, 2)), 'bias': jnp.full(1, 1e6)}, accumulate=accumulate
    )
  assert model.weight.grad is None  # nothing set before the refusal
  with pytest.raises(TypeError, match=r"set_grads: 'bias' is complex .* \(jnp.real\)"):
    zero = jnp.zeros(1, jnp.complex64)
    tshim.set_grads(model, {'weight': jnp.ones((1, 2)), 'bias': zero}, accumulate=accumulate)
  assert model.weight.grad is None
  model.bias.requires_grad_(False)  # a frozen parameter's gradient is dropped, not checked
  tshim.set_grads(
      model, {'weight': jnp.ones((1, 2)), 'bias': jnp.full(1, 1e6)}, accumulate=accumulate
  )
  assert model.bias.grad is None and model.weight.grad.dtype == torch.float16


@needs_torch
def test_set_grads_takes_accumulate_as_a_bool_alone():
  p = {'w': torch.nn.Parameter(torch.ones(2))}
  tshim.set_grads(p, {'w': jnp.ones(2)})
  with pytest.raises(TypeError, match="accumulate must be True or False, got str 'False'"):
    tshim.set_grads(p, {'w': jnp.ones(2)}, accumulate='False')  # truthy: it added
  assert torch.equal(p['w'].grad, torch.ones(2))


@needs_torch
def test_load_into_and_set_grads_check_names_and_shapes():
  model = _model(torch.float32)
  tree = tshim.params_to_jax(model)
  missing = dict(tree)
  missing.pop('0.bias')
  with pytest.raises(KeyError, match='0.bias'):
    tshim.load_into(model, missing)
  with pytest.raises(KeyError, match='extra'):
    tshim.set_grads(model, {**tree, 'extra': jnp.ones(1)})
  with pytest.raises(ValueError, match='shape'):
    tshim.load_into(model, {**tree, '2.bias': jnp.ones(4)})


@needs_torch
@pytest.mark.parametrize(
    'convert, match',
    [
        (
            lambda: tshim.load_into(
                torch.nn.Linear(2, 1), {'weight': {'v': jnp.ones((1, 2))}, 'bias': jnp.ones(1)}
            ),
            r"load_into: 'weight' is dict, not an array: .*flatten_dict",
        ),
        (
            lambda: tshim.load_into(torch.nn.Linear(2, 1), {'weight': None, 'bias': jnp.ones(1)}),
            r"load_into: 'weight' is None, not an array",
        ),
        (
            lambda: tshim.tree_to_torch({'w': jnp.ones(2), 'rng': jax.random.key(0)}),
            r"tree_to_torch: the leaf \['rng'\] is a PRNG key: .*key_data",
        ),
        (
            lambda: tshim.tree_to_torch(
                jax.grad(lambda p: p['w'].sum(), allow_int=True)(
                    {'w': jnp.ones(2), 'n': jnp.ones((), int)}
                )
            ),
            r"tree_to_torch: the leaf \['n'\] is float0",
        ),
        (
            lambda: jax.jit(tshim.to_torch)(jnp.ones(2)),
            r'to_torch: the array is traced .* convert outside it',
        ),
    ],
    ids=['nested', 'none', 'prng_key', 'float0', 'under_jit'],
)
def test_what_dlpack_cannot_carry_is_named_with_its_leaf(convert, match):
  with pytest.raises(TypeError, match=match):
    convert()
