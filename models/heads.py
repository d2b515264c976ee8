"""Classification heads: pooling + MLP, and the dual head for two documents.

Both follow the LRA reference's heads (lra_benchmarks/models/layers/
common_layers.py): classifier_head is Dense(mlp) -> ReLU -> Dense(classes);
classifier_head_dual is Dense(mlp) -> ReLU -> Dense(mlp / 2) -> ReLU ->
Dense(classes) on [u, v, u * v, u - v] (its 'NLI' interaction, the paper's
Retrieval model).
"""

from flax import nnx
import jax.numpy as jnp

from models.errors import UserError

# 'cls' pools the CLS token the encoder prepends; 'first' pools the first
# input token with no CLS prepended (the reference's dual encoder, which
# pooled a document's first byte).
POOLINGS = ('cls', 'mean', 'max', 'first')


def pool_BxE(x_BxLxE, padding_BxL, pooling):
  """Pools over real tokens only (padding never enters a mean or a max)."""
  if pooling in ('cls', 'first'):
    return x_BxLxE[:, 0]
  if padding_BxL is None:
    padding_BxL = jnp.ones(x_BxLxE.shape[:2], bool)
  real_BxLx1 = padding_BxL[:, :, None]
  if pooling == 'mean':
    count = jnp.maximum(real_BxLx1.sum(axis=1), 1)
    return jnp.where(real_BxLx1, x_BxLxE, 0).sum(axis=1) / count
  if pooling == 'max':
    neg = jnp.finfo(x_BxLxE.dtype).min
    pooled = jnp.where(real_BxLx1, x_BxLxE, neg).max(axis=1)
    return jnp.where(real_BxLx1.any(axis=1), pooled, 0)
  raise UserError(
    f'Unknown pooling {pooling!r}; use one of {", ".join(POOLINGS)}.'
  )


class ClassifierHead(nnx.Module):
  """Dense(mlp) -> ReLU -> Dense(classes), as in the LRA reference."""

  def __init__(self, in_dim, mlp_dim, num_classes, *, dtype, rngs):
    self.hidden = nnx.Linear(in_dim, mlp_dim, dtype=dtype, rngs=rngs)
    self.logits = nnx.Linear(mlp_dim, num_classes, dtype=dtype, rngs=rngs)

  def __call__(self, pooled_BxE):
    return self.logits(nnx.relu(self.hidden(pooled_BxE)))


class DualClassifierHead(nnx.Module):
  """Two pooled documents u, v -> [u, v, u*v, u-v] -> Dense(mlp) -> ReLU ->
  Dense(mlp // 2) -> ReLU -> Dense(classes), as the reference's
  classifier_head_dual."""

  def __init__(self, emb_dim, mlp_dim, num_classes, *, dtype, rngs):
    linear = lambda i, o: nnx.Linear(i, o, dtype=dtype, rngs=rngs)  # noqa: E731
    self.hidden = linear(4 * emb_dim, mlp_dim)
    self.hidden2 = linear(mlp_dim, mlp_dim // 2)
    self.logits = linear(mlp_dim // 2, num_classes)

  def __call__(self, u_BxE, v_BxE):
    features = jnp.concatenate([u_BxE, v_BxE, u_BxE * v_BxE, u_BxE - v_BxE], -1)
    h = nnx.relu(self.hidden2(nnx.relu(self.hidden(features))))
    return self.logits(h)
