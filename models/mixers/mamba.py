"""Mamba: the selective state-space mixer, a chunked scan with its own VJP.

Gu, Dao, "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces" (arXiv 2312.00752), section 3 and Algorithm 2. With I = expand * E
inner channels and N states per channel:
  [x, z] = in_proj(input)                    E -> 2 I (no bias)
  x = SiLU(causal depthwise conv1d(x))       width K = conv_width, bias
  [dt_t, B_t, C_t] = x_proj(x_t)             I -> R + 2 N (no bias)
  dt_t = softplus(dt_proj(dt_t) + dt_bias)   R -> I, per channel
  A = -exp(A_log)                            real diagonal [I, N]
  h_t = exp(dt_t A) (.) h_(t-1) + dt_t B_t x_t      h_t [I, N]
  y_t = C_t . h_t + D (.) x_t
  out = out_proj(y (.) SiLU(z))              I -> E (no bias)
Initialisation as the paper and the authors' code: A_n = -(n + 1) (S4D-
Real, the same for every channel), D = 1, dt_bias = softplus^-1(dt) with
dt = exp(U[log dt_min, log dt_max]) floored at 1e-4, dt_proj's kernel
U(+-R^-1/2), the linear and conv layers PyTorch's default U(+-fan_in^-1/2).

The scan, on a CPU (scan_kernel 'auto', the default): a C++ kernel
called from XLA (models/mixers/mamba_native.py, mamba_scan.cc, built on
first use), each batch row's [N, I] state kept in the cache, its loops over
I vectorised with exp, rows (and channel blocks) over threads, one state
kept per chunk_size positions for its hand-written backward (its speed
against the XLA form: docs/benchmark.md, "Mamba's scan in C++").
Elsewhere, where no compiler works (one logged line says why), or with
scan_kernel 'xla': the XLA scan. h_t is a linear recurrence, run one
position after the other on
an [X, N, I] state, X = G B (G the directions run together: both directions
are one scan over stacked inputs; a size-1 X is dropped), time-major, so no
[B, L, I, N] array exists. L is cut into chunks of C = chunk_size positions
(16 by default), a chunk into nb = ceil(C / 16) blocks of U <= 16 positions
(C rounded up to nb U; L padded with identity steps, dt = 0). A block's
steps are written out one by one (no loop per position): exp(dt_t A),
h_t and y_t = C_t . h_t (an einsum) are a few fused XLA ops on static
slices. Chunks, and the blocks of a chunk, run one after the other
(jax.lax.scan). The backward pass is written by hand (jax.custom_vjp,
formulas at _scan_chunks_bwd): the forward keeps the state entering each
chunk; the backward runs the chunks in reverse, recomputes the state
entering each of a chunk's blocks (chunks of one block: kept), then per
block its steps' states and exp(dt A) from that state, and runs the
block's steps in reverse with the adjoint of h_t, its reductions over I
and N as einsums. Time O(L I N) per example and direction; 2 L I N
exponentials for C <= 16 (the forward and the backward's recomputation),
3 L I N for longer chunks (and the blocks' entering states); memory
O(L I + (L / C) I N + (C / U + 2 U) I N) per example and direction, linear
in L at any chunk_size, one chunk of L included (tests/test_mixer_mamba.py:
XLA's compiled bytes); state per example (recurrent inference) I N +
I (K - 1) numbers. Scan, exponentials, conv and sums in float32; the
projections in the compute dtype. Forward-mode differentiation (jax.jvp)
is not defined through the custom VJP. Every per-position op of the mixer
works on 2-D [L B, F] rows: XLA's CPU reductions fused with a product
(its YNN fusions) are an order of magnitude slower on an operand with a
size-1 axis, as the [1, B, N, I] state of a causal scan or the parameter
gradients of a batch of one ([1, L, I]). Forms measured and not kept (an
associative scan over [B, C, I, N], chunked matrix forms with C times the
exponentials, per-chunk precomputation, doubling within a chunk, other
block sizes): docs/benchmark.md as of 2026-12-04, in git.

Non-causal masks (bidirectional): a second set of conv + x_proj + dt + A +
D parameters runs the same SSM over the reversed sequence; the two
directions share in_proj and out_proj and are summed before the gate,
out = out_proj((y_fwd + reverse(y_bwd)) (.) SiLU(z)), as the two gated
outputs of Vision Mamba's bidirectional block (Zhu et al., arXiv
2401.09417) summed, without its optional halving. Every instance holds
both directions (causality is the mask's, known at call time); a causal
model leaves the backward parameters untouched.

Padding (beyond the builder's zeroed inputs): dt is set to 0 at padded
steps, so exp(0 A) = 1 and dt B x = 0: a padded step is the identity on
the state wherever it is, in both directions (the reversal is a plain
flip: the padding then comes first and leaves the zero initial state
alone). The conv's input is zero at padded positions (no in_proj bias), so
the conv at a real token sees zeros there, as at the start of a sequence;
its output is zeroed at padded positions too, and the mixer's output is
multiplied by the real mask (an all-padded example gives zeros).

Deliberate differences from the authors' code (state-spaces/mamba): the
scan is the chunked, unrolled form above with its hand-written backward,
not the fused CUDA kernel (same recurrence, same float32 state); in_proj, x_proj
and out_proj use flax's dtype handling (kernels float32, matmuls in the
compute dtype); no residual rescaling of out_proj by the depth (the
block's business); no dropout (Mamba has none: dropout_rate is accepted
and ignored); the bidirectional variant above is not in the Mamba paper.

Shape names: I inner channels, N states, R dt rank, K conv width, C chunk,
G directions, X any leading dims.
"""

import functools
import logging
import math

from flax import nnx
import jax
import jax.numpy as jnp

from models.attention.base import bool_option, int_option
from models.attention.registry import register
from models.errors import UserError
from models.mixers import mamba_native
from models.mixers.base import (
  SequenceMixer,
  choice_option,
  inverse_softplus,
  real_BxL,
  step_range_option,
  zero_padded,
)

# PyTorch's default nn.Linear kernel: U(+-1/sqrt(fan_in)).
TORCH_LINEAR = nnx.initializers.variance_scaling(1 / 3, 'fan_in', 'uniform')
# The authors' floor on the initial dt.
DT_FLOOR = 1e-4


def symmetric(bound):
  """An initializer drawing U(-bound, bound)."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


# Positions per unrolled block: a chunk is cut into blocks of at most BLOCK
# positions, each written out step by step (no per-step loop).
BLOCK = 16


def _decay(dt_XxI, a_XxNxI):
  """exp(dt A) [X, N, I]."""
  return jnp.exp(dt_XxI[..., None, :] * a_XxNxI)


def _drive(dtu_XxI, b_XxN):
  """dt B u [X, N, I] from dt u."""
  return dtu_XxI[..., None, :] * b_XxN[..., None]


def _blocks(step, carry, xs, blocks, reverse=False):
  """step over a chunk's blocks: lax.scan over xs [nb, U, ...], or one
  block (xs [U, ...]) called directly."""
  if blocks:
    return jax.lax.scan(step, carry, xs, reverse=reverse)
  return step(carry, xs)


def _block_forward(a_XxNxI, h_XxNxI, xs):
  """One block's steps from h, unrolled: -> (h after, y [U, X, I])."""
  u_UxXxI, dt_UxXxI, b_UxXxN, c_UxXxN = xs
  dtu_UxXxI = dt_UxXxI * u_UxXxI
  y = []
  for j in range(u_UxXxI.shape[0]):
    h_XxNxI = _decay(dt_UxXxI[j], a_XxNxI) * h_XxNxI + _drive(
      dtu_UxXxI[j], b_UxXxN[j]
    )
    y.append(jnp.einsum('...ni,...n->...i', h_XxNxI, c_UxXxN[j]))
  return h_XxNxI, jnp.stack(y)


def _block_end(a_XxNxI, h_XxNxI, xs):
  """One block's steps from h: -> (h after, h before)."""
  u_UxXxI, dt_UxXxI, b_UxXxN = xs
  dtu_UxXxI = dt_UxXxI * u_UxXxI
  h_start = h_XxNxI
  for j in range(u_UxXxI.shape[0]):
    h_XxNxI = _decay(dt_UxXxI[j], a_XxNxI) * h_XxNxI + _drive(
      dtu_UxXxI[j], b_UxXxN[j]
    )
  return h_XxNxI, h_start


def _block_backward(a_XxNxI, carry, xs):
  """One block's steps recomputed from the state h entering it, then run
  in reverse (see _scan_chunks_bwd): -> (carry, (du, d dt, dB, dC))."""
  gc_XxNxI, da_XxNxI = carry
  u_UxXxI, dt_UxXxI, b_UxXxN, c_UxXxN, dy_UxXxI, h_XxNxI = xs
  length = u_UxXxI.shape[0]
  dtu_UxXxI = dt_UxXxI * u_UxXxI
  decay, states = [], [h_XxNxI]  # states[j]: h_(j-1), before step j
  for j in range(length):
    decay.append(_decay(dt_UxXxI[j], a_XxNxI))
    states.append(decay[j] * states[j] + _drive(dtu_UxXxI[j], b_UxXxN[j]))
  grads = [None] * length
  for j in reversed(range(length)):
    dy_XxI = dy_UxXxI[j]
    g_XxNxI = gc_XxNxI + c_UxXxN[j][..., None] * dy_XxI[..., None, :]
    q_XxNxI = g_XxNxI * decay[j] * states[j]
    grads[j] = (
      jnp.einsum('...ni,...n->...i', g_XxNxI, b_UxXxN[j]),  # d(dt u)
      jnp.sum(q_XxNxI * a_XxNxI, axis=-2),  # d dt through exp(dt A)
      jnp.einsum('...ni,...i->...n', g_XxNxI, dtu_UxXxI[j]),  # dB
      jnp.einsum('...ni,...i->...n', states[j + 1], dy_XxI),  # dC
    )
    da_XxNxI = da_XxNxI + q_XxNxI * dt_UxXxI[j][..., None, :]
    gc_XxNxI = decay[j] * g_XxNxI
  ddtu, ddt, db, dc = map(jnp.stack, zip(*grads))
  return (gc_XxNxI, da_XxNxI), (ddtu * dt_UxXxI, ddt + ddtu * u_UxXxI, db, dc)


def _scan_forward(blocks, a_XxNxI, u, dt, b, c):
  """The chunks one after the other from h = 0: -> (y [n, (nb,) U, X, I],
  the state entering each chunk [n, X, N, I])."""

  def body(h_XxNxI, xs):
    h_end, y = _blocks(
      lambda h, xs: _block_forward(a_XxNxI, h, xs), h_XxNxI, xs, blocks
    )
    return h_end, (y, h_XxNxI)

  h_XxNxI = jnp.zeros(a_XxNxI.shape, jnp.float32)
  _, (y, h_nxXxNxI) = jax.lax.scan(body, h_XxNxI, (u, dt, b, c))
  return y, h_nxXxNxI


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scan_chunks(blocks, a_XxNxI, u, dt, b, c):
  """y_t = C_t . h_t, h_t = exp(dt_t A) h_(t-1) + dt_t B_t u_t, h_-1 = 0,
  on time-major chunks: u, dt [n, nb, U, X, I], B, C [n, nb, U, X, N]
  (blocks: True), or of one block, without the nb axis (blocks: False);
  float32 y, shaped as u."""
  return _scan_forward(blocks, a_XxNxI, u, dt, b, c)[0]


def _scan_chunks_fwd(blocks, a_XxNxI, u, dt, b, c):
  y, h_nxXxNxI = _scan_forward(blocks, a_XxNxI, u, dt, b, c)
  return y, (a_XxNxI, u, dt, b, c, h_nxXxNxI)


def _scan_chunks_bwd(blocks, res, dy):
  """Chunks in reverse, from the state kept at each chunk's start: the
  states entering the chunk's blocks again (a chunk of one block: that
  state), then the blocks in reverse, each recomputing its steps' states
  and running them in reverse with the adjoint
  g_t = C_t dy_t + exp(dt_(t+1) A) g_(t+1) of h_t (carried as
  gc = exp(dt_t A) g_t): du_t = dt_t sum_n g_t B_t, dB_t = sum_i g_t dt_t u_t,
  dC_t = sum_i h_t dy_t, d dt_t = u_t sum_n g_t B_t + sum_n A q_t and
  dA = sum_t dt_t q_t, with q_t = g_t exp(dt_t A) h_(t-1)."""
  a_XxNxI, u, dt, b, c, h_nxXxNxI = res

  def body(carry, xs):
    u_, dt_, b_, c_, h_XxNxI, dy_ = xs
    if blocks:  # the state entering each block [nb, X, N, I]
      _, h_XxNxI = jax.lax.scan(
        lambda h, xs: _block_end(a_XxNxI, h, xs), h_XxNxI, (u_, dt_, b_)
      )
    return _blocks(
      lambda carry, xs: _block_backward(a_XxNxI, carry, xs),
      carry,
      (u_, dt_, b_, c_, dy_, h_XxNxI),
      blocks,
      reverse=True,
    )

  zeros = jnp.zeros(a_XxNxI.shape, jnp.float32)
  (_, da_XxNxI), (du, ddt, db, dc) = jax.lax.scan(
    body, (zeros, zeros), (u, dt, b, c, h_nxXxNxI, dy), reverse=True
  )
  return da_XxNxI, du, ddt, db, dc


_scan_chunks.defvjp(_scan_chunks_fwd, _scan_chunks_bwd)


def scan_time_major(u_LxXxI, dt_LxXxI, a_XxNxI, b_LxXxN, c_LxXxN, chunk):
  """y_t = C_t . h_t, h_t = exp(dt_t A) h_(t-1) + dt_t B_t u_t, h_-1 = 0,
  time-major: u, dt [L, X, I], A [X, N, I], B, C [L, X, N], X one flat
  batch axis; float32 [L, X, I]. Chunks of C = min(chunk, L) positions
  (rounded up to nb blocks of U <= BLOCK positions), L padded with
  identity steps (dt = 0)."""
  length, x, inner = u_LxXxI.shape
  nb = -(-min(chunk, length) // BLOCK)
  u_len = -(-min(chunk, length) // nb)
  n = -(-length // (nb * u_len))
  # A size-1 X is dropped: XLA's CPU reductions are slow on a size-1 axis.
  xs = (x,) if x > 1 else ()

  # [L, X, F] -> [n, (nb,) U, X, F]; zeros: identity steps.
  def chunks(t):
    t = t.astype(jnp.float32)
    t = jnp.pad(t, ((0, n * nb * u_len - length), (0, 0), (0, 0)))
    return t.reshape((n, *(nb,) * (nb > 1), u_len, *xs, t.shape[-1]))

  a_XxNxI = a_XxNxI.astype(jnp.float32).reshape((*xs, *a_XxNxI.shape[-2:]))
  y = _scan_chunks(
    nb > 1, a_XxNxI, *map(chunks, (u_LxXxI, dt_LxXxI, b_LxXxN, c_LxXxN))
  )
  return y.reshape(n * nb * u_len, x, inner)[:length]


SCAN_KERNELS = ('auto', 'native', 'xla')
_LOG = logging.getLogger(__name__)


@functools.cache
def _native_or_why():
  """'' when the C++ scan runs here (CPU backend, built), else why not."""
  if jax.default_backend() != 'cpu':
    return f'the backend is {jax.default_backend()}, not cpu'
  return mamba_native.available()


@functools.cache
def _say_fallback(why):
  """The one line that says scan_kernel 'auto' runs the XLA scan (once a
  process; scan_kernel 'native' raises instead, without this line)."""
  _LOG.warning('mamba: the XLA scan is used (%s).', why)


def scan_for(kernel):
  """The scan_time_major function a mixer with scan_kernel `kernel` runs:
  'xla' this module's XLA form; 'native' the C++ kernel (mamba_native.py;
  one sentence if it cannot run here); 'auto' the C++ kernel on a CPU
  where it builds, else the XLA form."""
  if kernel == 'xla':
    return scan_time_major
  why = _native_or_why()
  if not why:
    return mamba_native.scan_time_major
  if kernel == 'native':
    raise UserError(
      f'mamba scan_kernel=native cannot run: {why}; set '
      '--config.model.attention.scan_kernel=auto (or xla).'
    )
  if jax.default_backend() == 'cpu':  # elsewhere the XLA scan is the rule
    _say_fallback(why)
  return scan_time_major


def selective_scan(
  u_XxLxI, dt_XxLxI, a_XxIxN, b_XxLxN, c_XxLxN, chunk, kernel='xla'
):
  """y_t = C_t . h_t, h_t = exp(dt_t A) h_(t-1) + dt_t B_t u_t, h_-1 = 0.

  float32 [X, L, I] for any leading dims X (a batch, or directions x batch;
  A's leading dims broadcast against them): scan_for(kernel) on the
  leading dims flattened, in chunks of min(chunk, L) positions.
  """
  *batch, length, inner = u_XxLxI.shape
  states = b_XxLxN.shape[-1]
  x = math.prod(batch)
  a_XxNxI = jnp.swapaxes(
    jnp.broadcast_to(a_XxIxN, (*batch, inner, states)), -1, -2
  ).reshape(x, states, inner)

  def time_major(t):  # [X..., L, F] -> [L, X, F]
    return jnp.swapaxes(t.reshape(x, length, t.shape[-1]), 0, 1)

  y_LxXxI = scan_for(kernel)(
    *map(time_major, (u_XxLxI, dt_XxLxI)),
    a_XxNxI,
    *map(time_major, (b_XxLxN, c_XxLxN)),
    chunk,
  )
  return jnp.swapaxes(y_LxXxI, 0, 1).reshape(*batch, length, inner)


def causal_conv(x_LxBxI, w_KxI, bias_I):
  """Depthwise causal conv along L: y_t = bias + sum_j w_j x_(t - K + 1 + j),
  the inputs before the start taken as zero (PyTorch's Conv1d, padding
  K - 1, truncated to L). Time-major x [L, B, I]; float32 rows [L B, I]."""
  length, b, inner = x_LxBxI.shape
  k = w_KxI.shape[0]
  x_LxBxI = jnp.pad(x_LxBxI.astype(jnp.float32), ((k - 1, 0), (0, 0), (0, 0)))
  y_RxI = bias_I.astype(jnp.float32)
  for j in range(k):
    x_RxI = x_LxBxI[j : j + length].reshape(length * b, inner)
    y_RxI = y_RxI + w_KxI[j].astype(jnp.float32) * x_RxI
  return y_RxI


class MambaDirection(nnx.Module):
  """The conv and selective-SSM parameters of one scan direction."""

  # The Mamba authors' _no_weight_decay parameters (state-spaces/mamba,
  # mamba_ssm/modules/mamba_simple.py): A_log and D.
  ssm_params = ('a_log_IxN', 'd_I')

  def __init__(
    self, inner, state, rank, width, dt_min, dt_max, dtype, rngs,
    selective=True,
  ):  # fmt: skip
    bound = width**-0.5
    self.conv_KxI = nnx.Param(symmetric(bound)(rngs.params(), (width, inner)))
    self.conv_bias_I = nnx.Param(symmetric(bound)(rngs.params(), (inner,)))
    self.selective = selective
    if selective:
      self.x_proj = nnx.Linear(
        inner,
        rank + 2 * state,
        use_bias=False,
        kernel_init=TORCH_LINEAR,
        dtype=dtype,
        rngs=rngs,
      )
      self.dt_proj = nnx.Linear(
        rank,
        inner,
        use_bias=False,
        kernel_init=symmetric(rank**-0.5),
        dtype=dtype,
        rngs=rngs,
      )
    else:
      # The ablation: B and C learned constants shared by the channels
      # (S4D-Real's B = 1, C standard normal), dt = softplus(dt_bias).
      self.b_N = nnx.Param(jnp.ones((state,), jnp.float32))
      self.c_N = nnx.Param(jax.random.normal(rngs.params(), (state,)))
    log_dt_I = jax.random.uniform(
      rngs.params(),
      (inner,),
      jnp.float32,
      math.log(dt_min),
      math.log(dt_max),
    )
    dt_I = jnp.maximum(jnp.exp(log_dt_I), DT_FLOOR)
    # Added in float32 after the matmul (as the authors' delta_bias).
    self.dt_bias_I = nnx.Param(inverse_softplus(dt_I))
    a_N = jnp.arange(1, state + 1, dtype=jnp.float32)
    self.a_log_IxN = nnx.Param(jnp.log(jnp.broadcast_to(a_N, (inner, state))))
    self.d_I = nnx.Param(jnp.ones((inner,), jnp.float32))
    self.rank, self.state = rank, state
    self.dtype = dtype

  def scan_inputs(self, x_LxBxI, keep_Rx1):
    """x float32 time-major, zero at padded positions; keep_Rx1 the real
    mask as rows -> the scan's inputs, float32 rows (R = L B, time-major):
    (u [R, I], dt [R, I], A [I, N], B [R, N], C [R, N])."""
    u_RxI = jax.nn.silu(causal_conv(x_LxBxI, self.conv_KxI, self.conv_bias_I))
    u_RxI = jnp.where(keep_Rx1, u_RxI, 0.0)
    rows, n = u_RxI.shape[0], self.state
    if self.selective:
      dbl_RxF = self.x_proj(u_RxI.astype(self.dtype)).astype(jnp.float32)
      r = self.rank
      dt_RxR = dbl_RxF[:, :r]
      b_RxN, c_RxN = dbl_RxF[:, r : r + n], dbl_RxF[:, r + n :]
      dt_RxI = self.dt_proj(dt_RxR.astype(self.dtype)).astype(jnp.float32)
      dt_RxI = jax.nn.softplus(dt_RxI + self.dt_bias_I[...])
    else:
      b_RxN = jnp.broadcast_to(self.b_N[...], (rows, n))
      c_RxN = jnp.broadcast_to(self.c_N[...], (rows, n))
      dt_RxI = jnp.broadcast_to(
        jax.nn.softplus(self.dt_bias_I[...]), u_RxI.shape
      )
    # A padded step is the identity: exp(0 A) = 1, 0 B x = 0.
    dt_RxI = jnp.where(keep_Rx1, dt_RxI, 0.0)
    a_IxN = -jnp.exp(self.a_log_IxN[...])
    return u_RxI, dt_RxI, a_IxN, b_RxN, c_RxN


@register('mamba')
class Mamba(SequenceMixer):
  """Mamba's selective-SSM mixer (causal, or bidirectional by two scans)."""

  def __init__(
    self,
    *,
    emb_dim,
    num_heads,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    expand=2,
    state_size=16,
    conv_width=4,
    dt_rank=0,
    dt_min=0.001,
    dt_max=0.1,
    chunk_size=16,
    selective=True,
    scan_kernel='auto',
  ):
    """Args (own options):
    expand: inner channels I = expand * emb_dim.
    state_size: N, states per channel.
    conv_width: K, the causal depthwise conv's width.
    dt_rank: R, the rank of the dt projection; 0: ceil(emb_dim / 16).
    dt_min, dt_max: range of the initial dt (log-uniform).
    chunk_size: C, positions per scan chunk: the backward keeps one state
      per chunk (>= L: one chunk; past 16, cut into blocks of <= 16).
    selective: dt, B and C functions of the input (Mamba's S6); false is
      the Mamba paper's ablation of selection (its Table 7: none of the
      three selective): dt per channel and B, C learned constants, a
      time-invariant diagonal SSM in the same block (an MQAR experiment:
      does recall need the input-dependent state update?).
    scan_kernel: 'auto' (the C++ scan of mamba_native.py on a CPU where it
      builds, else the XLA one), 'native' (the C++ scan or one sentence
      why not), 'xla' (the XLA scan everywhere). Same recurrence and
      float32 state; outputs equal to float32 rounding.
    """
    del num_heads, max_length, dropout_rate, layer_index
    expand = int_option('mamba', 'expand', expand, 1, 2)
    state = int_option('mamba', 'state_size', state_size, 1, 16)
    width = int_option('mamba', 'conv_width', conv_width, 1, 4)
    rank = int_option('mamba', 'dt_rank', dt_rank, 0, 0) or math.ceil(
      emb_dim / 16
    )
    self.chunk_size = int_option('mamba', 'chunk_size', chunk_size, 1, 16)
    self.scan_kernel = choice_option(
      'mamba', 'scan_kernel', scan_kernel, SCAN_KERNELS
    )
    dt_min, dt_max = step_range_option('mamba', dt_min, dt_max)
    inner = expand * emb_dim
    self.inner, self.num_states, self.conv_width = inner, state, width
    self.dtype = dtype
    linear = lambda i, o: nnx.Linear(  # noqa: E731
      i, o, use_bias=False, kernel_init=TORCH_LINEAR, dtype=dtype, rngs=rngs
    )
    self.in_proj = linear(emb_dim, 2 * inner)
    selective = bool_option('mamba', 'selective', selective)
    direction = lambda: MambaDirection(  # noqa: E731
      inner, state, rank, width, dt_min, dt_max, dtype, rngs, selective
    )
    self.fwd = direction()
    self.bwd = direction()
    self.out_proj = linear(inner, emb_dim)

  def state_size(self):
    """I N SSM states + I (K - 1) conv inputs per example (one direction,
    as for causal recurrent inference)."""
    return self.inner * (self.num_states + self.conv_width - 1)

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    del rngs
    b, length, emb = x_BxLxE.shape
    rows, inner = length * b, self.inner
    # Time-major rows [L B, F] throughout: the scan's layout, and 2-D
    # arrays for every per-position op (XLA's CPU reductions, as the
    # gradients of per-channel parameters, are slow on a size-1 axis).
    tm = lambda t: jnp.swapaxes(t, 0, 1)  # noqa: E731
    keep_Rx1 = tm(real_BxL(mask, b, length)).reshape(rows, 1)
    x_RxE = tm(zero_padded(x_BxLxE, mask).astype(self.dtype)).reshape(rows, emb)
    xz_Rx2I = self.in_proj(x_RxE).astype(jnp.float32)
    x_RxI = jnp.where(keep_Rx1, xz_Rx2I[:, :inner], 0.0)
    x_LxBxI = x_RxI.reshape(length, b, inner)
    z_RxI = xz_Rx2I[:, inner:]
    flip = lambda t: t.reshape(length, b, -1)[::-1].reshape(rows, -1)  # noqa: E731
    directions = [(self.fwd, x_LxBxI, keep_Rx1)]
    if not mask.causal:
      directions.append((self.bwd, x_LxBxI[::-1], flip(keep_Rx1)))
    # Both directions in one scan: X = G B, direction-major.
    u, dt, a, bm, cm = zip(*(d.scan_inputs(x, k) for d, x, k in directions))

    def stack(ts):  # G [L B, F] -> [L, G B, F]
      return jnp.concatenate([t.reshape(length, b, -1) for t in ts], 1)

    a_XxNxI = jnp.repeat(jnp.swapaxes(jnp.stack(a), 1, 2), b, axis=0)
    y_LxXxI = scan_for(self.scan_kernel)(
      stack(u), stack(dt), a_XxNxI, stack(bm), stack(cm), self.chunk_size
    )
    y_RxI = None
    for i, (d, _, _) in enumerate(directions):
      y_i = y_LxXxI[:, i * b : (i + 1) * b].reshape(rows, inner)
      y_i = y_i + d.d_I[...] * u[i]
      y_RxI = y_i if i == 0 else y_RxI + flip(y_i)
    y_RxI = y_RxI * jax.nn.silu(z_RxI)
    out_RxE = self.out_proj(y_RxI.astype(self.dtype))
    out_RxE = jnp.where(keep_Rx1, out_RxE, 0)
    return tm(out_RxE.reshape(length, b, emb)).astype(x_BxLxE.dtype), {}
