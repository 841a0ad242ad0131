"""PyTorch interop: parameters and gradients as JAX pytrees, and back.

A torch module's parameters become a flat ``dict`` from parameter name (as in
``module.named_parameters()``) to :class:`jax.Array`, and back. Conversions
copy through DLPack (or, between platforms, host memory), never through Python
lists, and keep the dtype (``bfloat16`` included; a 64-bit one as JAX's
``jax_enable_x64`` allows, see :func:`to_jax`). The copy matters: torch
updates parameters in place, and a JAX array must never change under its
holder.

The replay harness that runs a torch optimizer and an Optax transformation
side by side is :mod:`optax_gqc.interop.torch_replay`.

Needs PyTorch: ``pip install "optax-gqc[torch]"``.
"""

import math
from collections.abc import Iterable, Mapping
from typing import Any

try:
  import torch
except ImportError as e:
  raise ImportError(
      'optax_gqc.interop.torch needs PyTorch; install it with: pip install "optax-gqc[torch]"'
  ) from e

import jax
import jax.numpy as jnp
import numpy as np

from optax_gqc import _checks

__all__ = [
    'grads_to_jax',
    'load_into',
    'params_to_jax',
    'set_grads',
    'to_jax',
    'to_torch',
    'tree_to_torch',
]

# JAX's backend for a torch device type, where DLPack hands JAX the tensor's memory.
_JAX_PLATFORM = {'cpu': 'cpu', 'cuda': 'gpu'}

_TensorSource = torch.nn.Module | Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]

# The 32-bit integers that JAX makes of torch's 64-bit ones while jax_enable_x64 is off.
_NARROWED_INTS = {torch.int64: np.int32, torch.uint64: np.uint32}
# NumPy's 64-bit dtypes, which jnp.asarray would narrow on the way to torch while it is off.
_WIDE_NUMPY = frozenset(np.dtype(d) for d in ('float64', 'complex128', 'int64', 'uint64'))


def to_jax(tensor: torch.Tensor) -> jax.Array:
  """Copies a torch tensor into a new JAX array of the same shape and dtype.

  The tensor is detached and copied, so later in-place changes to the tensor
  do not reach the array. A tensor on the platform of JAX's default backend
  (the CPU, or a CUDA GPU) is handed to JAX by DLPack and stays on its device.
  Any other (a CPU tensor when JAX computes on a GPU, say) goes through host
  memory to JAX's default device, as :func:`jax.numpy.asarray` puts a NumPy
  array there.

  While ``jax_enable_x64`` is off (JAX's default), JAX makes a 64-bit dtype
  its 32-bit counterpart (``int64`` to ``int32``, ``float64`` to ``float32``);
  an integer tensor with values beyond that range raises, as they would wrap,
  and so does a floating one with finite values beyond float32's, which
  would become infinite (values below its smallest become 0 or subnormal).

  Args:
    tensor: any torch tensor, e.g. a parameter or its ``.grad``.

  Returns:
    A :class:`jax.Array` with the tensor's shape and dtype (narrowed as above).

  Raises:
    OverflowError: if a 64-bit tensor holds values beyond its 32-bit
      counterpart's range while ``jax_enable_x64`` is off.

  Example:
    >>> import torch
    >>> from optax_gqc.interop.torch import to_jax
    >>> to_jax(torch.ones(2, dtype=torch.bfloat16))
    Array([1, 1], dtype=bfloat16)
  """
  if not isinstance(tensor, torch.Tensor):
    raise TypeError(f'to_jax takes a torch.Tensor, got {type(tensor).__name__}')
  if tensor.layout != torch.strided:
    raise TypeError(
        f'to_jax takes a dense tensor, got one of layout {tensor.layout}: call .to_dense() '
        'first (an nn.Embedding(sparse=True) has sparse gradients)'
    )
  t = tensor.detach()
  _check_fits_32_bits(t)
  if _JAX_PLATFORM.get(t.device.type) == jax.default_backend():
    # JAX's own copy=True can alias a CPU buffer, so the copy is made here.
    return jax.dlpack.from_dlpack(t.clone(memory_format=torch.contiguous_format))
  host = t.to('cpu', memory_format=torch.contiguous_format, copy=True)
  if host.dtype == torch.bfloat16:  # NumPy has no bfloat16: read the bits
    return jnp.asarray(host.view(torch.int16).numpy().view(jnp.bfloat16))
  return jnp.asarray(host.numpy())


def _check_fits_32_bits(t: torch.Tensor) -> None:
  """Raises if JAX would wrap or overflow a 64-bit tensor's values (``jax_enable_x64`` off)."""
  if jax.config.jax_enable_x64 or t.numel() == 0 or t.is_meta:
    return
  if t.dtype in (torch.float64, torch.complex128):
    parts = torch.view_as_real(t.resolve_conj().resolve_neg()) if t.is_complex() else t
    largest = float(torch.where(torch.isfinite(parts), parts.abs(), 0.0).max())
    limit = float(np.finfo(np.float32).max)
    with np.errstate(over='ignore'):  # what float32 rounds it to: just past the max is the max
      overflows = math.isinf(np.float32(largest))
    if overflows:
      raise OverflowError(
          f'to_jax: the {t.dtype} tensor holds finite values of magnitude up to {largest:.9g}, '
          f'beyond the largest float32 ({limit:.9g}) that JAX makes of it '
          'while jax_enable_x64 is off: they would become inf. Turn it on '
          "(jax.config.update('jax_enable_x64', True)), or scale the values first"
      )
    return
  narrow = _NARROWED_INTS.get(t.dtype)
  if narrow is None:
    return
  values = t if t.dtype == torch.int64 else t.to(torch.float64)  # no min or max of uint64
  low, high = (float(x) for x in torch.aminmax(values))
  info = np.iinfo(narrow)
  if low < info.min or high > info.max:
    raise OverflowError(
        f'to_jax: the {t.dtype} tensor holds values from {low:.0f} to {high:.0f}, beyond the '
        f'{np.dtype(narrow)} that JAX makes of it while jax_enable_x64 is off: they would wrap. '
        "Turn it on (jax.config.update('jax_enable_x64', True)), or convert the values first"
    )


def to_torch(array: Any, device: torch.device | str | None = None) -> torch.Tensor:
  """Copies a JAX (or NumPy) array into a new torch tensor of the same dtype.

  Torch makes the copy, in its own memory, from a DLPack view of the array,
  and it has finished when the call returns: on a GPU, where torch copies
  asynchronously, the call waits for it. JAX may then reuse the array's
  memory (donate it, or free it) at once, and torch frees the tensor's memory
  in the order of its own stream. (A copy that JAX made for torch would be
  JAX's memory, which JAX could reuse as soon as torch dropped the tensor,
  with torch's kernels that read it possibly not yet run.)

  A NumPy array or a torch tensor keeps its dtype, 64-bit ones included,
  which :func:`jax.numpy.asarray` would narrow while ``jax_enable_x64`` is
  off. A NumPy array in the other byte order arrives in torch's; a masked
  array (its mask would be lost) and an extended-precision one
  (``np.longdouble``, which torch lacks) raise a :class:`TypeError`.

  Args:
    array: a :class:`jax.Array`, a torch tensor, or anything
      :func:`jax.numpy.asarray` takes.
    device: where the tensor goes; by default, where DLPack puts it (the
      array's device).

  Returns:
    A :class:`torch.Tensor` with its own memory.

  Example:
    >>> import jax.numpy as jnp
    >>> from optax_gqc.interop.torch import to_torch
    >>> to_torch(jnp.arange(3.0))
    tensor([0., 1., 2.])
  """
  if isinstance(array, list | tuple):  # as jax.numpy.asarray takes it, and types it
    kind, given = type(array).__name__, np.asarray(array)
    with np.errstate(over='ignore'):  # said below, in words
      array = jnp.asarray(array)
    if given.dtype.kind in 'fc' and bool(np.any(np.isfinite(given) & ~np.isfinite(array))):
      raise OverflowError(
          f'to_torch: the {kind} holds finite values beyond the largest '
          f'{array.dtype} that JAX makes of it: they would become inf. Pass a NumPy array, '
          'which keeps its dtype'
      )
  (tensor,) = _copies_to_torch([array], device, 'to_torch', ['the array'])
  return tensor


def _native(a: np.ndarray | np.generic) -> np.ndarray | np.generic:
  """The NumPy array in this machine's byte order; a masked or extended-precision one refused."""
  if np.ma.is_masked(a):
    raise TypeError(
        'to_torch: a masked array would lose its mask (torch has none): pass a.filled(value), '
        'or a.data for the values under the mask too'
    )
  a = np.ma.getdata(a)  # a masked array with nothing masked: its values
  if (a.dtype.kind, a.dtype.itemsize) in (('f', 16), ('f', 12), ('c', 32), ('c', 24)):
    wide = 'float64' if a.dtype.kind == 'f' else 'complex128'
    raise TypeError(
        f'to_torch: torch has no {a.dtype} (extended precision): cast it to {wide} first, '
        'which rounds it'
    )
  return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder('='))


def tree_to_torch(tree: Any, device: torch.device | str | None = None) -> Any:
  """Applies :func:`to_torch` to every leaf of a pytree (and waits once, on a GPU).

  Args:
    tree: a pytree of arrays, as :func:`to_torch` takes each.
    device: where every tensor goes; by default, where DLPack puts each leaf
      (its array's device).

  Returns:
    The pytree of :class:`torch.Tensor` copies, in the same structure.
  """
  paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
  names = [f'the leaf {jax.tree_util.keystr(path)}' for path, _ in paths]
  copies = _copies_to_torch([leaf for _, leaf in paths], device, 'tree_to_torch', names)
  return jax.tree.unflatten(treedef, copies)


def _check_convertible(where: str, name: str, a: Any) -> None:
  """Raises, naming the leaf, for what DLPack cannot carry, in place of its own words."""
  fix = None
  if a is None:
    fix = 'is None, not an array'
  elif isinstance(a, Mapping | list | tuple):
    fix = (
        f'is {type(a).__name__}, not an array: give a flat {{name: array}} dict '
        "(flatten a nested tree first, e.g. flax.traverse_util.flatten_dict(tree, sep='.'))"
    )
  elif isinstance(a, jax.core.Tracer):
    fix = 'is traced (inside jax.jit or a transformation): convert outside it, on its value'
  elif isinstance(a, jax.Array) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
    fix = 'is a PRNG key: convert its data, jax.random.key_data(key)'
  elif getattr(a, 'dtype', None) == jax.dtypes.float0:
    fix = 'is float0, the gradient of an integer leaf, which has no values: leave it out'
  if fix is not None:
    raise TypeError(f'{where}: {name} {fix}')


def _copies_to_torch(
    arrays: list[Any], device: torch.device | str | None, where: str, names: list[str]
) -> list[torch.Tensor]:
  """Torch's copies of ``arrays``, done on return, each read through a view.

  A torch tensor is its own view; a wide NumPy array is viewed by NumPy, so it keeps its dtype;
  anything else is viewed by DLPack, through JAX. ``where`` and ``names`` name them in errors.
  """
  for name, a in zip(names, arrays, strict=True):
    _check_convertible(where, name, a)
  arrays = [_native(a) if isinstance(a, np.ndarray | np.generic) else a for a in arrays]
  views = [
      a.detach()  # copied as it is: through JAX it would be narrowed, or refused (bfloat16)
      if isinstance(a, torch.Tensor)
      else torch.from_numpy(np.asarray(a, order='C'))  # a 0-d one stays 0-d
      if isinstance(a, np.ndarray | np.generic) and a.dtype in _WIDE_NUMPY
      else torch.from_dlpack(jnp.asarray(a))
      for a in arrays
  ]
  copies = [
      v.clone(memory_format=torch.contiguous_format) if device is None else v.to(device, copy=True)
      for v in views
  ]
  for cuda in {t.device for t in views + copies if t.is_cuda}:
    torch.cuda.synchronize(cuda)  # before the views, and JAX's hold on the arrays, go
  return copies


def _named_tensors(source: _TensorSource) -> dict[str, torch.Tensor]:
  """``{name: tensor}`` of a module's parameters, a mapping, or (name, tensor) pairs."""
  if isinstance(source, torch.nn.Module):
    named = dict(source.named_parameters())
  elif isinstance(source, Mapping):
    named = dict(source)
  else:  # (name, tensor) pairs; module.parameters() would give tensors alone
    pairs = list(source)
    for item in pairs:
      if not (isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str)):
        raise TypeError(
            f'expected a module, a mapping or (name, tensor) pairs, but an item is a '
            f'{type(item).__name__}: pass the module, or module.named_parameters() in place '
            'of module.parameters()'
        )
    named = dict(pairs)
  for name, value in named.items():
    if not isinstance(value, torch.Tensor):
      raise TypeError(f'{name!r} is a {type(value).__name__}, not a torch.Tensor')
  return named


def _check_named_once(where: str, named: Mapping[str, torch.Tensor]) -> None:
  """Raises if two names hold one tensor (tied weights): a write would land twice."""
  seen = {}
  for name, t in named.items():
    if t.numel() == 0:
      continue
    key = (t.device, t.data_ptr(), tuple(t.shape), t.stride())
    if key in seen:
      raise ValueError(
          f'{where}: {seen[key]!r} and {name!r} are one tensor (tied weights), so it would be '
          'written twice (a gradient added twice). Pass the module, or '
          'dict(module.named_parameters()), which name it once'
      )
    seen[key] = name


def _check_not_detached(
    where: str, source: _TensorSource, named: Mapping[str, torch.Tensor]
) -> None:
  """Raises if ``source`` holds only tensors cut off from autograd, as a ``state_dict()`` does.

  Their ``.grad`` is not the model's: reading it gives nothing, and writing it
  reaches no parameter.
  """
  if isinstance(source, torch.nn.Module) or not named:
    return
  if not any(t.requires_grad or t.grad is not None for t in named.values()):
    raise ValueError(
        f'{where}: none of these tensors requires grad or has a .grad; a state_dict() holds '
        "tensors detached from the model's parameters, whose .grad the model never sees. Pass "
        'the module, or dict(module.named_parameters())'
    )


def _check_same_names(where: str, have: Mapping[str, Any], given: Mapping[str, Any]) -> None:
  missing = sorted(set(have) - set(given))
  unexpected = sorted(set(given) - set(have))
  if missing or unexpected:
    raise KeyError(
        f'{where}: the names do not match the parameters; missing {missing}, '
        f'unexpected {unexpected}'
    )


def params_to_jax(source: _TensorSource) -> dict[str, jax.Array]:
  """A module's parameters as a JAX pytree: ``{name: jax.Array}``.

  Args:
    source: a :class:`torch.nn.Module` (its ``named_parameters()``), a mapping
      from names to tensors (e.g. a ``state_dict()``, buffers included), or an
      iterable of ``(name, tensor)`` pairs.

  Returns:
    A dict from each name to a copy of its tensor, dtype kept.

  Example:
    >>> import torch
    >>> from optax_gqc.interop.torch import params_to_jax
    >>> params = params_to_jax(torch.nn.Linear(3, 2))
    >>> {name: p.shape for name, p in params.items()}
    {'weight': (2, 3), 'bias': (2,)}
  """
  return {name: to_jax(t) for name, t in _named_tensors(source).items()}


def grads_to_jax(source: _TensorSource) -> dict[str, jax.Array]:
  """The ``.grad`` of every parameter as a JAX pytree shaped like the params.

  A parameter without a gradient (``.grad is None``) gets zeros, so the tree
  always matches :func:`params_to_jax` of the same source. An Optax optimizer
  given those zeros still moves a frozen parameter (AdamW's weight decay
  does): freeze it in the Optax chain too, with ``optax.partition`` (see
  docs/optax.md). :func:`set_grads` leaves it as it is.

  Args:
    source: as in :func:`params_to_jax`, except a ``state_dict()``, whose
      tensors are detached from the parameters.

  Returns:
    A dict from each name to a copy of its gradient, in the parameter's dtype.

  Raises:
    ValueError: if no tensor of a mapping or pairs requires grad or has a
      ``.grad`` (a ``state_dict()``'s).

  Example:
    >>> import torch
    >>> from optax_gqc.interop.torch import grads_to_jax
    >>> layer = torch.nn.Linear(3, 1)
    >>> layer(torch.ones(1, 3)).sum().backward()
    >>> grads_to_jax(layer)['weight']
    Array([[1., 1., 1.]], dtype=float32)
  """
  named = _named_tensors(source)
  _check_not_detached('grads_to_jax', source, named)
  return {
      name: to_jax(t.grad if t.grad is not None else torch.zeros_like(t))
      for name, t in named.items()
  }


def load_into(module: _TensorSource, tree: Mapping[str, Any]) -> None:
  """Writes a ``{name: array}`` pytree into a module's parameters, in place.

  Every parameter must be named once, with its shape; values are cast to the
  parameter's dtype and device. Autograd does not record the write.

  Args:
    module: as in :func:`params_to_jax`; its tensors are overwritten.
    tree: a dict from parameter names to arrays, e.g. from
      :func:`params_to_jax` after some Optax steps.

  Raises:
    KeyError: if the names differ from the module's.
    ValueError: if a shape differs, or two names hold one tensor (tied
      weights in a ``state_dict(keep_vars=True)``).
    TypeError: if a complex array is given for a real parameter.
    OverflowError: if finite values would become inf in the parameter's
      dtype (float32 or int32 values beyond float16's 65504).
    ValueError: if an integer parameter cannot hold the values (fractions,
      or values beyond its range).

  Example:
    >>> import jax.numpy as jnp, torch
    >>> from optax_gqc.interop.torch import load_into
    >>> layer = torch.nn.Linear(2, 1)
    >>> load_into(layer, {'weight': jnp.ones((1, 2)), 'bias': jnp.zeros(1)})
    >>> layer.weight
    Parameter containing:
    tensor([[1., 1.]], requires_grad=True)
  """
  params = _named_tensors(module)
  _check_same_names('load_into', params, tree)
  _check_named_once('load_into', params)
  # One wait on a GPU for all the copies, not one a leaf.
  sources = _copies_to_torch(list(tree.values()), None, 'load_into', list(map(repr, tree)))
  for name, source in zip(tree, sources, strict=True):  # every check before any write
    if tuple(source.shape) != tuple(params[name].shape):
      raise ValueError(
          f'load_into: {name!r} has shape {tuple(source.shape)}, the parameter '
          f'{tuple(params[name].shape)}'
      )
  sources = [
      _narrowed('load_into', name, s, params[name].dtype)
      for name, s in zip(tree, sources, strict=True)
  ]
  with torch.no_grad():
    for name, source in zip(tree, sources, strict=True):
      params[name].copy_(source)


def _narrowed(who: str, name: str, source: Any, dtype: Any) -> Any:
  """``source`` cast to ``dtype``, raising where the cast would lose what is not rounding."""
  if source.is_complex() and not dtype.is_complex:
    raise TypeError(
        f'{who}: {name!r} is complex and the parameter {dtype}: the imaginary part would be '
        'dropped. Pass the real part (jnp.real) if that is meant'
    )
  into = "the parameter's .grad" if who == 'set_grads' else 'the parameter'
  if dtype.is_floating_point or dtype.is_complex:
    if source.dtype == dtype or (
        source.is_floating_point()
        and dtype.is_floating_point
        and torch.finfo(dtype).max >= torch.finfo(source.dtype).max
    ):
      return source
    cast = source.to(dtype)  # an integer or complex source too: 1e6 is inf in float16
    if bool((torch.isfinite(source) & ~torch.isfinite(cast)).any()):
      top = torch.finfo(dtype).max
      raise OverflowError(
          f'{who}: {name!r} holds finite values beyond the largest {dtype} ({top:.5g}): they '
          f'would become inf in {into}. Scale them first, or use a parameter of a wider dtype'
      )
    return cast
  if dtype == torch.bool or source.dtype == dtype:
    return source
  # An integer tensor (a count, as BatchNorm's num_batches_tracked): copy_ would cut a
  # fraction off, and wrap a value out of its range.
  info = torch.iinfo(dtype)
  values = source.to(torch.float64)
  if not bool(
      (values == values.trunc()).all()
      & (values >= info.min).all()
      & (values < float(info.max + 1)).all()
  ):
    raise ValueError(
        f'{who}: {name!r} holds values that {into}, {dtype}, cannot hold (fractions, or beyond '
        f'[{info.min}, {info.max}]): round them first, if a count is meant'
    )
  return source


def set_grads(module: _TensorSource, grads: Mapping[str, Any], *, accumulate: bool = False) -> None:
  """Sets (or adds to) the ``.grad`` of a module's parameters from a pytree.

  With ``accumulate=False`` every ``.grad`` is replaced by a copy of the given
  gradient. With ``accumulate=True`` the gradients go through autograd, as if
  ``loss.backward()`` had produced them: they are added to ``.grad``, and the
  tensor hooks registered on the parameters run (torch-gqc's GNS wrapper
  reads per-microbatch norms from such a hook). A parameter that does not
  require grad (a frozen one) is left as it is, its ``.grad`` unchanged, as
  ``loss.backward()`` leaves it: a zero from :func:`grads_to_jax` does not
  become a ``.grad`` that a torch optimizer would decay.

  Args:
    module: as in :func:`params_to_jax`, except a ``state_dict()``, whose
      tensors are detached from the parameters.
    grads: a dict from every parameter name to an array of its shape; cast
      to the parameter's dtype and device.
    accumulate: add through autograd instead of replacing.

  Raises:
    KeyError: if the names differ from the module's.
    ValueError: if a shape differs, if two names hold one tensor (tied
      weights), or if no tensor requires grad (a ``state_dict()``'s, say).
    TypeError: if a complex array is given for a real parameter, or
      ``accumulate`` is not a bool.
    OverflowError: if finite values would become inf in the parameter's
      dtype (float32 or int32 values beyond float16's 65504).

  Example:
    >>> import jax.numpy as jnp, torch
    >>> from optax_gqc.interop.torch import set_grads
    >>> p = {'w': torch.nn.Parameter(torch.zeros(2))}
    >>> set_grads(p, {'w': jnp.ones(2)}, accumulate=True)
    >>> set_grads(p, {'w': jnp.ones(2)}, accumulate=True)
    >>> p['w'].grad
    tensor([2., 2.])
  """
  _checks.check_bool('accumulate', accumulate)  # 'False' would add
  params = _named_tensors(module)
  _check_same_names('set_grads', params, grads)
  _check_named_once('set_grads', params)
  _check_not_detached('set_grads', module, params)
  if params and not any(t.requires_grad for t in params.values()):
    raise ValueError('set_grads: no tensor requires grad, so none takes a gradient')
  tensors, values = [], []
  # One wait on a GPU for all the copies, not one a leaf.
  for name, g in zip(
      grads,
      _copies_to_torch(list(grads.values()), None, 'set_grads', list(map(repr, grads))),
      strict=True,
  ):
    target = params[name]
    if tuple(g.shape) != tuple(target.shape):
      raise ValueError(
          f'set_grads: {name!r} has shape {tuple(g.shape)}, the parameter {tuple(target.shape)}'
      )
    if target.requires_grad:  # a frozen one's gradient is dropped: nothing to check
      tensors.append(target)
      g = _narrowed('set_grads', name, g, target.dtype)
      values.append(g.to(device=target.device, dtype=target.dtype))
  if accumulate:
    torch.autograd.backward(tensors, grad_tensors=values)
  else:
    for target, g in zip(tensors, values, strict=True):
      target.grad = g
