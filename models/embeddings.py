"""Token embeddings and the position schemes.

`model.positions` picks one scheme for the whole model:
  absolute, added to the token embeddings here (after the CLS token is
  prepended, so the CLS has position 0, as in the LRA reference):
    'sinusoidal'  the fixed encoding of Vaswani et al.;
    'learned'     a trained table of max_length (+1 for the CLS) rows; a
                  run at a longer max_length that starts from it
                  (--config.init_from, lra/train/pretrained.py) extends it by
                  copying the trained rows repeatedly, as Longformer
                  (Beltagy et al. 2020, section 5) extended RoBERTa's 512
                  positions (extend_positions_LxE);
    'sinusoidal2d'  for images read row-major (side x side pixels): the
                  sinusoidal encoding of the pixel's row in the first half
                  of the features and of its column in the second half;
    'learned2d'   for images: a trained row table plus a trained column
                  table (2 x side rows instead of side**2), initialised
                  N(0, 0.5) each so that they start as large as the pixel
                  embeddings (N(0, 1)); a CLS gets its own trained row;
    'none'        no positions at all;
  applied inside attention, nothing added here (models/positions.py and the
  cores that own a relative scheme):
    'relative'    Transformer-XL's relative encoding (Dai et al. 2019);
    'pia'         position-infused attention (Shortformer, Press et al. 2021);
    'rotary'      rotary embeddings (RoFormer, Su et al. 2021).
"""

import math

from flax import nnx
import jax.numpy as jnp
import numpy as np

from models.errors import UserError

ABSOLUTE = ('sinusoidal', 'learned', 'sinusoidal2d', 'learned2d', 'none')
GRID = ('sinusoidal2d', 'learned2d')
IN_ATTENTION = ('relative', 'pia', 'rotary')
POSITIONS = ABSOLUTE + IN_ATTENTION


def check_positions(positions):
  """positions if it names a scheme, else one sentence."""
  if positions not in POSITIONS:
    raise UserError(
      f'Unknown positions {positions!r}; use one of {", ".join(POSITIONS)} '
      '(--config.model.positions).'
    )
  return positions


def sinusoidal_LxE(length, dim, offset=0):
  """The fixed encoding of Vaswani et al.: sin on even, cos on odd features,
  for positions offset .. offset + length - 1."""
  pos = np.arange(offset, offset + length)[:, None]
  inv = np.exp(-np.log(10000.0) * np.arange(0, dim, 2) / dim)
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2] = np.sin(pos * inv)
  table[:, 1::2] = np.cos(pos * inv)[:, : dim // 2]
  return table


def grid_layout(total):
  """(side, lead) of a row-major side x side image after `lead` (0, or 1
  for the CLS) leading tokens, from the embedder's total length."""
  for lead in (0, 1):
    side = math.isqrt(max(total - lead, 0))
    if side > 0 and side * side == total - lead:
      return side, lead
  raise UserError(
    f'2D positions need square images read row-major: {total} tokens is no '
    'side x side (+ CLS) image; use --config.model.positions=learned or '
    'sinusoidal for this task.'
  )


def grid_rows_cols(offset, length, side, lead):
  """Row and column of positions offset .. offset + length - 1 (the
  leading tokens get -1)."""
  q = np.arange(offset, offset + length) - lead
  return np.where(q < 0, -1, q // side), np.where(q < 0, -1, q % side)


def sinusoidal2d_LxE(offset, length, dim, side, lead):
  """Row encoding in features [0, dim/2), column in [dim/2, dim); zeros
  for the leading tokens."""
  half = dim // 2
  rows, cols = grid_rows_cols(offset, length, side, lead)
  by_row = sinusoidal_LxE(side, half)
  by_col = sinusoidal_LxE(side, dim - half)
  table = np.concatenate([by_row[rows], by_col[cols]], axis=1)
  table[rows < 0] = 0.0
  return table


def embed_std_option(cfg):
  """model.embed_std (absent in configs made before it: 1.0), checked."""
  std = cfg.get('embed_std', 1.0)
  if isinstance(std, bool) or not isinstance(std, (int, float)) or std <= 0:
    raise UserError(
      f'--config.model.embed_std={std!r} is out of range: it must be a '
      'number > 0, e.g. --config.model.embed_std=0.02.'
    )
  return float(std)


class Embedder(nnx.Module):
  """Token ids -> vectors (`embed`), then absolute positions (`add_positions`).

  The two steps are apart so that the encoder can prepend its CLS token in
  between: the CLS gets position 0 and the table has a row for it.
  """

  @classmethod
  def of(cls, cfg, vocab_size, max_length, *, dtype, rngs):
    """The encoders' Embedder: width, positions and model.embed_std from
    the model config `cfg`."""
    return cls(
      vocab_size,
      cfg.emb_dim,
      max_length,
      cfg.positions,
      dtype=dtype,
      rngs=rngs,
      embed_std=embed_std_option(cfg),
    )

  def __init__(
    self,
    vocab_size,
    emb_dim,
    max_length,
    positions,
    *,
    dtype,
    rngs,
    embed_std=1.0,
  ):
    """max_length: rows of the learned table (the CLS included); embed_std:
    the token table's normal init (model.embed_std)."""
    self.tokens = nnx.Embed(
      vocab_size,
      emb_dim,
      dtype=dtype,
      rngs=rngs,
      embedding_init=nnx.initializers.normal(embed_std),
    )
    self.positions = check_positions(positions)
    self.max_length = max_length
    if positions == 'learned':
      self.pos_LxE = nnx.Param(
        nnx.initializers.normal(0.02)(rngs.params(), (max_length, emb_dim))
      )
    if positions in GRID:
      self.side, self.lead = grid_layout(max_length)
    if positions == 'learned2d':
      init = nnx.initializers.normal(0.5)
      # Rows 0 .. side-1 are the image rows; row `side` is the CLS's.
      self.row_SxE = nnx.Param(init(rngs.params(), (self.side + 1, emb_dim)))
      self.col_SxE = nnx.Param(init(rngs.params(), (self.side + 1, emb_dim)))
    self.dtype = dtype

  def embed(self, tokens_BxL):
    return self.tokens(tokens_BxL)

  def add_positions(self, x_BxLxE, offset=0):
    """x plus the absolute positions offset .. offset + L - 1 (identity for
    'none' and the schemes applied inside attention)."""
    if self.positions not in ('sinusoidal', 'learned') + GRID:
      return x_BxLxE
    length = x_BxLxE.shape[1]
    if offset + length > self.max_length:
      raise ValueError(
        f'length {offset + length} > max_length {self.max_length}'
      )
    if self.positions == 'learned':
      pos_LxE = self.pos_LxE[...][offset : offset + length]
    elif self.positions == 'sinusoidal2d':
      pos_LxE = jnp.asarray(
        sinusoidal2d_LxE(
          offset, length, x_BxLxE.shape[-1], self.side, self.lead
        )
      )
    elif self.positions == 'learned2d':
      rows, cols = grid_rows_cols(offset, length, self.side, self.lead)
      # -1 (a leading token) picks the last row: the CLS's own.
      pos_LxE = self.row_SxE[...][rows] + self.col_SxE[...][cols]
    else:  # A trace-time constant: derivable, so never checkpointed.
      pos_LxE = jnp.asarray(sinusoidal_LxE(length, x_BxLxE.shape[-1], offset))
    return x_BxLxE + pos_LxE.astype(self.dtype)

  def __call__(self, tokens_BxL):
    return self.add_positions(self.embed(tokens_BxL))


def extend_positions_LxE(table_LxE, rows, keep=0):
  """A learned position table of `rows` rows from a trained one: its first
  `keep` rows (the CLS position) stay, the other trained rows are copied
  again and again after them (Longformer's initialisation of the longer
  table: position keep + i gets trained row keep + i mod (trained - keep)),
  or cut when `rows` is smaller. The first rows equal the trained table."""
  table_LxE = np.asarray(table_LxE)
  trained = table_LxE.shape[0]
  if rows <= trained:
    return table_LxE[:rows]
  period = trained - keep
  if period < 1:
    raise ValueError(f'a table of {trained} rows has none after {keep}')
  tokens = keep + np.arange(rows - keep) % period
  return np.concatenate([table_LxE[:keep], table_LxE[tokens]], axis=0)


def fit_for_fine_tune(path, array, shape, keep=0):
  """For lra.train.pretrained.load_encoder: a pretrained encoder parameter of
  another shape fitted to the fine-tune's `shape`, or None (it must match):
    embed.pos_LxE           the learned position table, extended by
                            copying (extend_positions_LxE) or cut;
    embed.tokens.embedding  the token table of a language model
                            (models/lm.py) has extra rows after the task's
                            vocabulary (the mask id): they are dropped."""
  if array.shape[1:] != tuple(shape[1:]):
    return None
  if path[-2:] == ('embed', 'pos_LxE'):
    return extend_positions_LxE(array, shape[0], keep)
  if path[-3:] == ('embed', 'tokens', 'embedding') and (
    array.shape[0] > shape[0]
  ):
    return array[: shape[0]]
  return None
