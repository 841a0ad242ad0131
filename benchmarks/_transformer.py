"""One decoder-only transformer, written twice: in JAX and in PyTorch.

The same architecture on both sides (pre-norm blocks, causal multi-head
attention, a GELU MLP of 4x the width, learned positions, an untied head),
the same shapes and the same float32 weights: :func:`torch_model` copies the
JAX parameters into the torch module, and :func:`check_same_model` checks
that both give the same loss on a batch. Each side uses its own fused
attention (``jax.nn.dot_product_attention``,
``torch.nn.functional.scaled_dot_product_attention``).

Import this module only after the thread settings: it imports jax and torch.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from torch.nn import functional as F


@dataclasses.dataclass(frozen=True)
class Config:
  vocab: int = 256
  context: int = 128
  width: int = 256
  layers: int = 8
  heads: int = 4
  microbatch: int = 8

  def num_params(self) -> int:
    d = self.width
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return self.vocab * d + self.context * d + self.layers * block + 2 * d + d * self.vocab


def tokens(cfg: Config, num: int, seed: int = 0) -> np.ndarray:
  """``num`` microbatches of random tokens, ``(num, microbatch, context + 1)`` int32."""
  rng = np.random.default_rng(seed)
  return rng.integers(0, cfg.vocab, (num, cfg.microbatch, cfg.context + 1), dtype=np.int32)


# JAX.


@functools.partial(jax.jit, static_argnums=(0, 1))  # one compile, not one per shape
def init_params(cfg: Config, seed: int = 0) -> dict[str, Any]:
  d = cfg.width
  keys = iter(jax.random.split(jax.random.key(seed), 4 + 4 * cfg.layers))

  def normal(shape, scale=0.02):
    return scale * jax.random.normal(next(keys), shape, jnp.float32)

  def dense(n_in, n_out):
    return {'w': normal((n_in, n_out)), 'b': jnp.zeros((n_out,), jnp.float32)}

  def norm():
    return {'scale': jnp.ones((d,), jnp.float32), 'bias': jnp.zeros((d,), jnp.float32)}

  return {
      'embed': normal((cfg.vocab, d)),
      'pos': normal((cfg.context, d), 0.01),
      'layers': [
          {
              'ln1': norm(),
              'qkv': dense(d, 3 * d),
              'out': dense(d, d),
              'ln2': norm(),
              'fc': dense(d, 4 * d),
              'proj': dense(4 * d, d),
          }
          for _ in range(cfg.layers)
      ],
      'ln_f': norm(),
      'head': normal((d, cfg.vocab)),
  }


def _layer_norm(x, p, eps=1e-5):
  mean = jnp.mean(x, -1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps) * p['scale'] + p['bias']


def _dense(x, p):
  return x @ p['w'] + p['b']


def loss_fn(params: dict[str, Any], batch: jax.Array, heads: int) -> jax.Array:
  """Mean next-token cross-entropy of a ``(microbatch, context + 1)`` token batch."""
  inputs, targets = batch[:, :-1], batch[:, 1:]
  b, t = inputs.shape
  x = params['embed'][inputs] + params['pos'][:t]
  for p in params['layers']:
    qkv = _dense(_layer_norm(x, p['ln1']), p['qkv'])
    q, k, v = (y.reshape(b, t, heads, -1) for y in jnp.split(qkv, 3, axis=-1))
    attn = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, -1)
    x = x + _dense(attn, p['out'])
    x = x + _dense(jax.nn.gelu(_dense(_layer_norm(x, p['ln2']), p['fc'])), p['proj'])
  logits = _layer_norm(x, params['ln_f']) @ params['head']
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


# PyTorch.


class Block(torch.nn.Module):

  def __init__(self, width: int, heads: int):
    super().__init__()
    self.heads = heads
    self.ln1 = torch.nn.LayerNorm(width)
    self.qkv = torch.nn.Linear(width, 3 * width)
    self.out = torch.nn.Linear(width, width)
    self.ln2 = torch.nn.LayerNorm(width)
    self.fc = torch.nn.Linear(width, 4 * width)
    self.proj = torch.nn.Linear(4 * width, width)

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    b, t, d = x.shape
    q, k, v = (
        y.view(b, t, self.heads, -1).transpose(1, 2) for y in self.qkv(self.ln1(x)).split(d, dim=-1)
    )
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
    return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate='tanh'))


class Transformer(torch.nn.Module):

  def __init__(self, cfg: Config):
    super().__init__()
    self.embed = torch.nn.Embedding(cfg.vocab, cfg.width)
    self.pos = torch.nn.Parameter(torch.zeros(cfg.context, cfg.width))
    self.layers = torch.nn.ModuleList(Block(cfg.width, cfg.heads) for _ in range(cfg.layers))
    self.ln_f = torch.nn.LayerNorm(cfg.width)
    self.head = torch.nn.Linear(cfg.width, cfg.vocab, bias=False)

  def forward(self, batch: torch.Tensor) -> torch.Tensor:
    inputs, targets = batch[:, :-1], batch[:, 1:]
    x = self.embed(inputs) + self.pos[: inputs.shape[1]]
    for layer in self.layers:
      x = layer(x)
    logits = self.head(self.ln_f(x))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def torch_model(cfg: Config, params: dict[str, Any]) -> Transformer:
  """The torch transformer holding a copy of the JAX ``params``."""
  model = Transformer(cfg)

  def put(dst: torch.Tensor, src: Any, transpose: bool = False) -> None:
    value = torch.from_numpy(np.array(src, np.float32))
    dst.data.copy_(value.T if transpose else value)

  def put_dense(dst: torch.nn.Linear, src: dict[str, Any]) -> None:
    put(dst.weight, src['w'], transpose=True)  # torch keeps (out, in)
    put(dst.bias, src['b'])

  def put_norm(dst: torch.nn.LayerNorm, src: dict[str, Any]) -> None:
    put(dst.weight, src['scale'])
    put(dst.bias, src['bias'])

  put(model.embed.weight, params['embed'])
  put(model.pos, params['pos'])
  for block, p in zip(model.layers, params['layers'], strict=True):
    put_norm(block.ln1, p['ln1'])
    put_dense(block.qkv, p['qkv'])
    put_dense(block.out, p['out'])
    put_norm(block.ln2, p['ln2'])
    put_dense(block.fc, p['fc'])
    put_dense(block.proj, p['proj'])
  put_norm(model.ln_f, params['ln_f'])
  put(model.head.weight, params['head'], transpose=True)
  return model


def check_same_model(cfg: Config, params: dict[str, Any], model: Transformer, batch) -> float:
  """Raises unless both sides have the same parameter count and loss; returns the loss."""
  n_jax = sum(x.size for x in jax.tree.leaves(params))
  n_torch = sum(p.numel() for p in model.parameters())
  if not n_jax == n_torch == cfg.num_params():
    raise AssertionError(f'parameter counts differ: jax {n_jax}, torch {n_torch}')
  jax_loss = float(jax.jit(loss_fn, static_argnums=2)(params, jnp.asarray(batch), cfg.heads))
  with torch.no_grad():
    torch_loss = float(model(torch.from_numpy(batch.astype(np.int64))))
  if not np.isclose(jax_loss, torch_loss, rtol=1e-4):
    raise AssertionError(f'the two models differ: loss {jax_loss} (jax), {torch_loss} (torch)')
  return jax_loss
