"""Classification heads: pooling + MLP, and the dual head for two documents."""

from flax import nnx
import jax.numpy as jnp

from lra.errors import UserError

POOLINGS = ('cls', 'mean', 'max')


def pool_BxE(x_BxLxE, padding_BxL, pooling):
  """Pools over real tokens only (padding never enters a mean or a max)."""
  if pooling == 'cls':
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


class DualClassifierHead(ClassifierHead):
  """Two pooled documents u, v -> features [u, v, u*v, u-v] -> MLP."""

  def __init__(self, emb_dim, mlp_dim, num_classes, *, dtype, rngs):
    super().__init__(4 * emb_dim, mlp_dim, num_classes, dtype=dtype, rngs=rngs)

  def __call__(self, u_BxE, v_BxE):
    features = jnp.concatenate([u_BxE, v_BxE, u_BxE * v_BxE, u_BxE - v_BxE], -1)
    return super().__call__(features)
