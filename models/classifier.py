"""The LRA classifier and its builder: the one place a config becomes a model.

One document: tokens [B, L] -> Encoder -> pool -> ClassifierHead.
The encoder is the parallel Encoder, or the SegmentRecurrentEncoder
(models/recurrent.py) when the attention core is `recurrent`.
Two documents (retrieval): tokens [B, 2, L] -> the same Encoder on each
(shared weights, one batched call) -> pool -> DualClassifierHead.
Returns (logits [B, classes] float32, aux dict with 'aux_loss').
"""

import chex
from flax import nnx
import jax
import jax.numpy as jnp

from models.attention.registry import get_core_class
from models.attention.softmax import fused_kernel_for
from models.encoder import Encoder
from models.errors import UserError
from models.heads import POOLINGS, ClassifierHead, DualClassifierHead, pool_BxE
from models.layers import as_dtype
from models.lm import LanguageModel, check_causal
from models.recurrent import SegmentRecurrentEncoder


class Classifier(nnx.Module):
  def __init__(
    self,
    cfg,
    *,
    vocab_size,
    num_classes,
    max_length,
    pad_id,
    num_inputs,
    dtype,
    rngs,
  ):
    if cfg.pooling not in POOLINGS:
      raise UserError(
        f'Unknown pooling {cfg.pooling!r}; use one of {", ".join(POOLINGS)}.'
      )
    recurrent = get_core_class(cfg.attention['name']).recurrent
    encoder = SegmentRecurrentEncoder if recurrent else Encoder
    self.encoder = encoder(
      cfg,
      vocab_size=vocab_size,
      max_length=max_length,
      pad_id=pad_id,
      dtype=dtype,
      rngs=rngs,
    )
    self.num_inputs = num_inputs
    self.num_classes = num_classes
    self.pooling = cfg.pooling
    head = DualClassifierHead if num_inputs == 2 else ClassifierHead
    self.head = head(
      cfg.emb_dim, cfg.mlp_dim, num_classes, dtype=dtype, rngs=rngs
    )

  def __call__(self, tokens, *, key=None):
    """tokens int [B, L] (or [B, 2, L]); key: dropout PRNG key or None."""
    # A one-document batch given to the dual model (or the reverse) would
    # otherwise fail deep in the encoder, or not at all (tokens[:, 0]).
    chex.assert_rank(tokens, 3 if self.num_inputs == 2 else 2)
    b = tokens.shape[0]
    if self.num_inputs == 2:
      chex.assert_axis_dimension(tokens, 1, 2)
      both_2BxL = jnp.concatenate([tokens[:, 0], tokens[:, 1]], axis=0)
      x, padding, aux = self.encoder(both_2BxL, key=key)
      pooled_2BxE = pool_BxE(x, padding, self.pooling)
      logits = self.head(pooled_2BxE[:b], pooled_2BxE[b:])
    else:
      x, padding, aux = self.encoder(tokens, key=key)
      logits = self.head(pool_BxE(x, padding, self.pooling))
    chex.assert_shape(logits, (b, self.num_classes))
    return logits.astype(jnp.float32), aux


def check_prefix_padding(config):
  """cuDNN's fused attention reads key padding as lengths (a prefix of real
  keys; models/attention/softmax.py): black pixels as padding are not one."""
  attention = config.model.attention
  if attention.get('implementation') != 'fused':
    return
  kernel = fused_kernel_for(
    attention.get('fused_kernel', 'auto'),
    as_dtype(config.dtype),
    config.model.qkv_dim // config.model.num_heads,
  )
  if kernel == 'cudnn':
    raise UserError(
      'data.black_is_padding masks keys that are not a prefix, which '
      "cuDNN's fused attention cannot take; add "
      '--config.model.attention.fused_kernel=xla.'
    )


def build_model(config, task, seed=None):
  """Builds the model for `task` (an lra.data.Task) from the config: the
  classifier, or for an LM objective (config.objective, lra/train/objectives.py)
  the LanguageModel (models/lm.py), checked for a causal mask first; for
  objective per_position (a label per position: mqar) the LanguageModel
  over the data's vocabulary, causal when the task's form is."""
  seed = config.seed if seed is None else seed
  rngs = nnx.Rngs(params=jax.random.fold_in(jax.random.key(seed), 0))
  pad_id = task.pad_id
  if config.data.get('black_is_padding', False):
    pad_id = 0  # the LRA reference: black pixels masked as padding
    check_prefix_padding(config)
  objective = config.get('objective', 'classify')
  if objective in ('causal_lm', 'masked_lm', 'per_position'):
    vocab_size, causal = task.vocab_size, objective == 'causal_lm'
    if objective == 'per_position':  # the task's labels at every position
      options = config.data.to_dict()
      vocab_size = task.vocab_size_for(options)
      causal = task.causal_for(options)
    model = LanguageModel(
      config.model,
      vocab_size=vocab_size,
      max_length=config.max_length,
      pad_id=pad_id,
      causal=causal,
      dtype=as_dtype(config.dtype),
      rngs=rngs,
    )
    if model.causal:
      check_causal(model, config.max_length)
    return model
  return Classifier(
    config.model,
    vocab_size=task.vocab_size,
    num_classes=task.num_classes,
    max_length=config.max_length,
    pad_id=pad_id,
    num_inputs=task.num_inputs,
    dtype=as_dtype(config.dtype),
    rngs=rngs,
  )
