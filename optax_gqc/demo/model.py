"""The demo's model: a small byte-level transformer (Flax NNX), its loss and its evaluation."""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

VOCAB = 256  # bytes


class Block(nnx.Module):

  def __init__(self, dim: int, heads: int, rngs: nnx.Rngs):
    self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim, decode=False, rngs=rngs)
    self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
    self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
    self.down = nnx.Linear(4 * dim, dim, rngs=rngs)

  def __call__(self, x, mask):
    x = x + self.attn(self.norm1(x), mask=mask)
    return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class CharTransformer(nnx.Module):
  """A decoder-only transformer over bytes."""

  def __init__(self, dim: int, layers: int, heads: int, context: int, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, dim, rngs=rngs)
    self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (context, dim)))
    self.blocks = nnx.List([Block(dim, heads, rngs) for _ in range(layers)])
    self.norm = nnx.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.position[: tokens.shape[-1]]
    mask = nnx.make_causal_mask(tokens)
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.norm(x))


def loss_fn(model, batch):
  """Mean next-byte cross entropy (nats) over windows of ``context + 1`` bytes."""
  logits = model(batch[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


def param_loss(params, graphdef, batch):
  """:func:`loss_fn` as a pure function of the parameters split out of the model."""
  return loss_fn(nnx.merge(graphdef, params), batch)


@functools.partial(jax.jit, static_argnums=1)
def eval_loss(params, graphdef, batches):
  return jnp.mean(jax.vmap(lambda b: param_loss(params, graphdef, b))(batches))
