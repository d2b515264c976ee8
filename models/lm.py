"""The language model of the LM objectives (lra/train/objectives.py): the
classifier's encoder with a token head in place of the classifier head.

  tokens [N, L] -> Encoder (causal for causal_lm) -> x at the L token
  positions (the CLS output, when there is one, is not used) -> logits
  [N, L, V] float32, V the task's vocabulary.

The encoder is built exactly as the Classifier's (models/classifier.py:
same config, CLS and position table) except for one more embedding row, the
mask id V of masked_lm (lra.train.objectives.mask_id; causal_lm has the row too,
unused, so both objectives give the same checkpoint layout). A fine-tune
from such a checkpoint takes the `encoder` subtree and drops that last row.

The head (model.tie_lm_head):
  tied (default)  logits = x E[:V]^T / sqrt(emb_dim) + b: the token
                  embedding read backwards (Press and Wolf 2017, "Using the
                  Output Embedding to Improve Language Models"); the scale
                  keeps the initial logits O(1) with the N(0, 1) embedding.
                  Tied is the default because the fine-tune keeps the
                  encoder and its embedding only: what the output side
                  learns then lands in the part that is transferred.
  untied          a Linear(emb_dim, V) of its own.

Objective per_position (lra/train/objectives.py: a label per position from the
data, mqar) uses this model too, over the data's vocabulary, causal when
the task's form is; mqar's bidirectional form puts the mask id V in its
answer slots.

causal_lm needs every core to admit a causal mask: the builder traces the
model once with it, so a core that cannot be causal (Linformer, Sinkhorn,
Longformer with global tokens) stops the run with its own sentence
(models/attention/base.py refuse_causal) before anything is trained.
"""

import chex
from flax import nnx
import jax
import jax.numpy as jnp

from models.attention.registry import get_core_class
from models.encoder import Encoder
from models.errors import UserError
from models.recurrent import SegmentRecurrentEncoder


class LanguageModel(nnx.Module):
  def __init__(
    self, cfg, *, vocab_size, max_length, pad_id, causal, dtype, rngs
  ):
    recurrent = get_core_class(cfg.attention['name']).recurrent
    encoder = SegmentRecurrentEncoder if recurrent else Encoder
    self.encoder = encoder(
      cfg,
      vocab_size=vocab_size + 1,  # + the mask id
      max_length=max_length,
      pad_id=pad_id,
      dtype=dtype,
      rngs=rngs,
      causal=causal,
    )
    self.vocab_size = vocab_size
    self.causal = causal
    self.tied = cfg.get('tie_lm_head', True)
    if not isinstance(self.tied, bool):
      raise UserError(
        f'model.tie_lm_head must be True or False, got {self.tied!r}.'
      )
    self.scale = cfg.emb_dim**-0.5
    if self.tied:
      self.bias_V = nnx.Param(jnp.zeros((vocab_size,), jnp.float32))
    else:
      self.lm_head = nnx.Linear(cfg.emb_dim, vocab_size, dtype=dtype, rngs=rngs)
    self.dtype = dtype

  def __call__(self, tokens_NxL, *, key=None):
    """tokens int [N, L] -> (logits [N, L, V] float32, aux)."""
    chex.assert_rank(tokens_NxL, 2)
    x_NxTxE, _, aux = self.encoder(tokens_NxL, key=key)
    if self.encoder.use_cls:
      x_NxTxE = x_NxTxE[:, 1:]
    if self.tied:
      table_VxE = self.encoder.embed.tokens.embedding[...][: self.vocab_size]
      logits_NxLxV = jnp.einsum(
        'nle,ve->nlv',
        x_NxTxE,
        table_VxE.astype(self.dtype),
        preferred_element_type=jnp.float32,
      )
      logits_NxLxV = logits_NxLxV * self.scale + self.bias_V[...]
    else:
      logits_NxLxV = self.lm_head(x_NxTxE)
    chex.assert_shape(logits_NxLxV, (*tokens_NxL.shape, self.vocab_size))
    return logits_NxLxV.astype(jnp.float32), aux


def check_causal(model, length):
  """Traces `model` on one causal input of `length` tokens (shapes only):
  a core that cannot be causal raises its one sentence here, before any
  training."""
  graphdef, state = nnx.split(model)

  def forward(state, tokens):
    return nnx.merge(graphdef, state)(tokens)[0]

  jax.eval_shape(forward, state, jax.ShapeDtypeStruct((1, length), jnp.int32))
