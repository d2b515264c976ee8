"""Reversible residual blocks (Reformer's memory trick), for any attention.

Kitaev et al., "Reformer: The Efficient Transformer" (arXiv 2001.04451), after
Gomez et al., "The Reversible Residual Network" (arXiv 1707.04585).

Each block maps a pair of streams (X1, X2) to (Y1, Y2):
  Y1 = X1 + F(X2),  F(x) = dropout(Attn(LN_attn(x)))
  Y2 = X2 + G(Y1),  G(x) = FFN(LN_mlp(x))
and the inputs follow from the outputs: X2 = Y2 - G(Y1), X1 = Y1 - F(X2).
The forward pass keeps only the last block's (Y1, Y2); the backward pass
(a `jax.custom_vjp`) rebuilds each block's inputs from its outputs and
back-propagates through F and G recomputed with `jax.vjp`. Activation memory
is therefore that of one block, whatever the depth, for about one extra
forward pass of compute. Dropout keys are explicit per block, so the
recomputation draws the same masks as the forward pass.

Streams: the input is duplicated, X1 = X2 = x (as the paper does), so both
streams keep the full width emb_dim and the TransformerBlock's sub-modules
(attention, MLP, LayerNorms) are reused unchanged; the encoder's output is
the mean (Y1 + Y2) / 2, followed by the usual final LayerNorm (as the
authors' trax Reformer encoder does; their ReformerLM concatenates the two
streams into a 2 x emb_dim output instead). With one block
this is x + (F(x) + G(x + F(x))) / 2, so reversible and standard models are
different functions (same parameter count).

Attention auxiliary losses (aux['loss']) are supported: their sum is an
output of the reversible sequence and its cotangent is fed to each F's vjp.
Other aux entries (e.g. recurrent memory) are dropped, as in the standard
encoder. F and G must be pure functions of (parameters, input, key): a
module that mutates its state during the call is not supported.

Rebuilding inputs by subtraction is exact in exact arithmetic only: in
float32 the rebuilt inputs differ from the originals by rounding (about 1e-6
relative per block), in bfloat16 by more; gradients inherit that error.
"""

from flax import nnx
import jax
import jax.numpy as jnp

from models.attention import Mask
from models.layers import split_key


def reversible_sequence(fs, gs, params, x1, x2, consts):
  """Runs reversible blocks; memory of one block in the backward pass.

  Args:
    fs: per block i, a pure f_i(params_i, x, const_i) -> (h, aux_loss scalar
      float32); h has x's shape and dtype.
    gs: per block i, a pure g_i(params_i, x, const_i) -> h.
    params: per block i, a pytree of arrays (differentiated).
    x1, x2: the two input streams, same shape and dtype.
    consts: per block i, a pytree of non-differentiated arrays (masks, PRNG
      keys) given to f_i and g_i. What f_i or g_i derive from consts alone
      may be hoisted or shared by XLA and so kept alive for every block:
      make it depend on x (see `_tie`).

  Returns:
    (y1, y2, aux_loss): the last block's streams and the summed aux losses.
  """
  n = len(fs)
  if not (len(gs) == len(params) == len(consts) == n):
    raise ValueError('fs, gs, params and consts need one entry per block')

  def forward(params, x1, x2, consts):
    aux = jnp.zeros((), jnp.float32)
    for i in range(n):
      h, a = fs[i](params[i], x2, consts[i])
      x1 = x1 + h
      x2 = x2 + gs[i](params[i], x1, consts[i])
      aux = aux + a
    return x1, x2, aux

  @jax.custom_vjp
  def run(params, x1, x2, consts):
    return forward(params, x1, x2, consts)

  def run_fwd(params, x1, x2, consts):
    y1, y2, aux = forward(params, x1, x2, consts)
    # Residuals: parameters and constants (alive anyway) and the outputs;
    # no per-block activation.
    return (y1, y2, aux), (params, y1, y2, consts)

  def run_bwd(res, cotangents):
    params, y1, y2, consts = res
    dy1, dy2, daux = cotangents
    dparams = [None] * n
    for i in reversed(range(n)):
      x1, x2, g_vjp, f_vjp = _invert(fs[i], gs[i], params[i], y1, y2, consts[i])
      dp_g, dy1_g = g_vjp(dy2)
      dy1 = dy1 + dy1_g  # dL/dY1, through Y1 itself and through G(Y1)
      dp_f, dx2_f = f_vjp((dy1, daux))
      dparams[i] = jax.tree.map(_add_cotangents, dp_f, dp_g)
      y1, y2, dy1, dy2 = x1, x2, dy1, dy2 + dx2_f
    return dparams, dy1, dy2, None

  run.defvjp(run_fwd, run_bwd)
  return run(list(params), x1, x2, list(consts))


def rebuild_inputs(fs, gs, params, y1, y2, consts):
  """The first block's inputs (x1, x2) rebuilt from the last block's outputs,
  as the backward pass of `reversible_sequence` does (same arguments)."""
  for i in reversed(range(len(fs))):
    y1, y2, _, _ = _invert(fs[i], gs[i], params[i], y1, y2, consts[i])
  return y1, y2


def _invert(f, g, p, y1, y2, const):
  """One block's inputs from its outputs, and the vjps of G at Y1, F at X2."""
  g_out, g_vjp = jax.vjp(lambda p, y: g(p, y, const), p, y1)
  x2 = y2 - g_out
  (f_out, _), f_vjp = jax.vjp(lambda p, x: f(p, x, const), p, x2)
  return y1 - f_out, x2, g_vjp, f_vjp


def _add_cotangents(a, b):
  # Integer leaves have float0 cotangents, which do not add.
  if a.dtype == jax.dtypes.float0:
    return a
  return a + b


def reversible_blocks(blocks, x_BxLxE, mask, keys):
  """TransformerBlocks as a reversible sequence on the duplicated input.

  Args:
    blocks: the encoder's TransformerBlocks (their attention_branch is F,
      their mlp_branch is G).
    x_BxLxE: the input of the first block.
    mask: the Mask (key padding passed through to every block unchanged).
    keys: one PRNG key (or None) per block, split as TransformerBlock does.

  Returns:
    ((Y1 + Y2) / 2 of the last block, summed aux losses).
  """
  fs, gs, params, consts = block_functions(blocks, mask, keys)
  y1_BxLxE, y2_BxLxE, aux_loss = reversible_sequence(
    fs, gs, params, x_BxLxE, x_BxLxE, consts
  )
  return (y1_BxLxE + y2_BxLxE) / 2, aux_loss


def block_functions(blocks, mask, keys):
  """(fs, gs, params, consts) of `reversible_sequence` for TransformerBlocks.

  F_i = block i's attention_branch (with its core's aux loss), G_i = its
  mlp_branch, params_i = its nnx state; consts_i = (key padding, block i's
  keys split as TransformerBlock.__call__ splits them).
  """
  causal = mask.causal
  fs, gs, params, consts = [], [], [], []
  for block, key in zip(blocks, keys):
    graphdef, state = nnx.split(block)

    def f(state, x_BxLxE, const, graphdef=graphdef):
      padding_BxL, (k_attn, k_drop, _) = const
      k_attn, k_drop = _tie(k_attn, x_BxLxE), _tie(k_drop, x_BxLxE)
      h_BxLxE, aux = nnx.merge(graphdef, state).attention_branch(
        x_BxLxE, Mask(padding_BxL, causal), key=k_attn, dropout_key=k_drop
      )
      return h_BxLxE, jnp.asarray(aux.get('loss', 0.0), jnp.float32)

    def g(state, x_BxLxE, const, graphdef=graphdef):
      _, (_, _, k_mlp) = const
      k_mlp = _tie(k_mlp, x_BxLxE)
      return nnx.merge(graphdef, state).mlp_branch(x_BxLxE, key=k_mlp)

    fs.append(f)
    gs.append(g)
    params.append(state)
    consts.append((mask.key_padding_BxM, tuple(split_key(key, 3))))
  return fs, gs, params, consts


def _tie(key, x):
  """key, made data-dependent on x (unchanged unless x's first entry is NaN).

  What derives from a key alone (dropout bits) does not depend on the
  block's input, so XLA may compute it for every block up front and keep it
  all alive (the CPU scheduler hoists the threefry loops: activation memory
  then grows with depth again), or share it between the forward pass and
  the backward recomputation (same effect). Tying the key to the block's
  input (forward) or rebuilt input (backward) keeps one block's bits alive
  at a time. A NaN input shifts the key, but the output is NaN then anyway.
  """
  if key is None:
    return None
  data = jax.random.key_data(key)
  bump = jnp.isnan(x.reshape(-1)[0]).astype(data.dtype)
  return jax.random.wrap_key_data(data + bump, impl=jax.random.key_impl(key))
