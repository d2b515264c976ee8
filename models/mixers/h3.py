"""H3: a shift SSM and a diagonal SSM between q, k, v projections.

Fu, Dao, Saab, Thomas, Rudra, Re, "Hungry Hungry Hippos: Towards Language
Modeling with State Space Models" (arXiv 2212.14052), section 3.1. With
E channels split into H = E / d heads of head_dim d:
  q, k, v = Linear_E->E(u)  (three, with biases)
  K = SSM_shift(k):  K_t = sum_{j<N} C_j k_(t-j) + D_k k_t   per channel
  per head h:  S_t = SSM_diag(K_t V_t^T)        the d x d outer products
  y_t = Q_t^T S_t  (y[j] = sum_i q[i] S[i, j]),  out = Linear_E->E(y)
With d = 1 every product is elementwise: y = q (.) SSM_diag(K (.) v).

The shift SSM is the state space model x_t = S x_(t-1) + e_1 k_t, y_t =
C x_t with S the shift matrix: x_t = (k_t, k_(t-1), ..., k_(t-N+1)), so
it is a learned causal FIR of N = state_size taps (lags 0 .. N-1), one per
channel, plus the skip D_k. The diagonal SSM is S4D's (models/mixers/
s4d.py) with the authors' H3 default, the bilinear discretisation:
  dA = (1 + dt A/2) / (1 - dt A/2),  dB = dt B / (1 - dt A/2)
  x_t = dA x_(t-1) + dB u_t,  y_t = 2 Re(C x_t) + D u_t
one SSM per head (its d^2 outer-product channels share it), i.e. the causal
convolution with K_l = 2 Re(sum_n C_n dB_n dA_n^l) (s4d's Vandermonde
product, `vandermonde_kernel`, with exp(l log dA)).
Non-causal (mask.causal False, bidirectional True): as s4d, a second C
gives a backward kernel K' over the same A, B, dt, and
  S = K * u + reverse(K' * reverse(u)) + D u
(both kernels include lag 0); the shift SSM stays causal (it writes a
token's predecessors into its key; the backward kernel then lets q_t read
the pairs of later tokens). Every convolution is s4d's `fft_conv`: one
real FFT of length 2L, so nothing wraps around.

Initialisation as the authors (safari src/models/sequence/h3.py, ssm/
ss_kernel.py, ss_kernel_diag.py, ss_kernel_shift.py, dplr.py): q, k, v and
the output linear PyTorch's default (kernel and bias U(+-E^-1/2)); shift
taps C U(+-N^-1/2) (kaiming_uniform(a=sqrt 5) of their [H, 1, N] C) and
D_k standard normal; the diagonal SSM S4D-Lin A_n = -1/2 + i pi n (n < N/2,
measure diag-lin), B = 1, C complex standard normal (parts of variance
1/2), log dt ~ U[log dt_min, log dt_max] per head, D standard normal per
head. Re A is stored as log(-Re A) (their real_type 'exp').

Cost: O(B L E (d + 1) log L) time and O(B L E d) memory (the outer products
[B, L, H, d, d] and their FFTs), plus s4d's kernel, O(G H N L) time and
O(G H (N sqrt(L) + L)) memory; G = 1 causal, 2 bidirectional. No [L, L]
array. The recurrent state per example is E (N - 1) + E d N numbers: the
shift register's last N - 1 keys per channel and H d^2 diagonal SSMs of N/2
complex modes (Zoology's h3 reports E N, its d = 1 diagonal part alone).

Exact limit / reference: tests/test_mixer_h3.py runs the shift SSM as its
shift register and the diagonal SSM as its recurrence step by step in
float64, and the whole layer against them (causal and bidirectional, with
padding). Convolutions, kernels, outer products and sums are float32 /
complex64 whatever the compute dtype; the projections run in `dtype`.

Padding: q, k, v are zeroed at padded positions (after the projections'
biases), so a padded position adds nothing to any convolution: padded
content reaches no output, and left-packed examples ([a b c _ _]) give the
real outputs of the unpadded example (the causal kernels never look ahead;
the backward kernel reads zeros there). The output is zeroed at padded
positions: an all-padded example gives zeros.

Options (`model.attention.<option>`): state_size (N, even, default 64 as
the paper), head_dim (d, divides E, default 1 as the paper's recall and
LRA runs), dt_min, dt_max (0.001, 0.1), bidirectional (default True: used
when the mask is not causal; a causal mask runs the forward kernel alone).

Deliberate differences from the authors' code (HazyResearch/safari, the
same in HazyResearch/zoology zoology/mixers/h3/):
  - The shift SSM's B is fixed at e_1: the authors also train B, whose
    kernel (B cross-correlated with C, truncated to N taps) spans the same
    N-tap FIRs as C alone.
  - The authors train A, B and dt with lr min(0.001, lr) and no weight
    decay; here they are ordinary parameters of the harness's optimiser.
  - Output channels are head-major (h, j); the authors' head_dim > 1 path
    emits (j, h), a permutation the output linear absorbs.
  - No dropout (the authors' H3 has none): dropout_rate is accepted and
    ignored. The bidirectional variant is this module's (as s4d's), not in
    the paper.
"""

import math

from flax import nnx
import jax.numpy as jnp
import numpy as np

from models.attention.base import bool_option, int_option
from models.attention.registry import register
from models.errors import UserError
from models.mixers.base import (
  SequenceMixer,
  f32_param,
  numpy_rng,
  real_BxL,
  step_range_option,
  zero_padded,
)
from models.mixers.mamba import TORCH_LINEAR, symmetric
from models.mixers.s4d import fft_conv, s4d_init_imag, vandermonde_kernel

# Local legend: H heads, D head_dim, N complex modes (state_size / 2),
# T shift taps (state_size), G directions (1 or 2).
_F32 = jnp.float32


def torch_linear(fan_in, fan_out, dtype, rngs):
  """nnx.Linear with PyTorch's default init (kernel, bias U(+-fan_in^-1/2))."""
  return nnx.Linear(
    fan_in,
    fan_out,
    kernel_init=TORCH_LINEAR,
    bias_init=symmetric(fan_in**-0.5),
    dtype=dtype,
    rngs=rngs,
  )


@register('h3')
class H3(SequenceMixer):
  """H3 sequence mixer (see the module docstring)."""

  # Its diagonal SSM's A, B and dt, as S4D's (the shift SSM's kernel is an
  # ordinary weight).
  ssm_params = (
    'a_log_neg_re_HxN',
    'a_im_HxN',
    'b_re_HxN',
    'b_im_HxN',
    'log_dt_H',
  )

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
    state_size=64,
    head_dim=1,
    dt_min=0.001,
    dt_max=0.1,
    bidirectional=True,
  ):
    del num_heads, max_length, dropout_rate, layer_index
    name = 'h3'
    n_full = int_option(name, 'state_size', state_size, 2, 64)
    if n_full % 2:
      raise UserError(
        f'h3 state_size must be even (N/2 complex conjugate pairs), got '
        f'{n_full}; set e.g. --config.model.attention.state_size=64.'
      )
    d = int_option(name, 'head_dim', head_dim, 1, 1)
    if emb_dim % d:
      raise UserError(
        f'h3 head_dim must divide the width {emb_dim}, got {d}; set e.g. '
        '--config.model.attention.head_dim=1.'
      )
    self.dt_min, self.dt_max = step_range_option(name, dt_min, dt_max)
    self.bidirectional = bool_option(name, 'bidirectional', bidirectional)
    self.n_full, self.head_dim, self.emb_dim = n_full, d, emb_dim
    self.num_ssm_heads = h = emb_dim // d
    self.dtype = dtype
    e, n = emb_dim, n_full // 2
    g = 2 if self.bidirectional else 1
    rng = numpy_rng(rngs)

    self.qkv = torch_linear(e, 3 * e, dtype, rngs)
    bound = n_full**-0.5
    self.shift_c_ExT = f32_param(rng.uniform(-bound, bound, (e, n_full)))
    self.shift_d_E = f32_param(rng.standard_normal((e,)))
    self.a_log_neg_re_HxN = f32_param(np.full((h, n), np.log(0.5)))
    imag_N = s4d_init_imag(n_full, 'lin')
    self.a_im_HxN = f32_param(np.broadcast_to(imag_N, (h, n)))
    self.b_re_HxN = f32_param(np.ones((h, n)))
    self.b_im_HxN = f32_param(np.zeros((h, n)))
    self.c_re_GxHxN = f32_param(np.sqrt(0.5) * rng.standard_normal((g, h, n)))
    self.c_im_GxHxN = f32_param(np.sqrt(0.5) * rng.standard_normal((g, h, n)))
    self.log_dt_H = f32_param(
      rng.uniform(math.log(self.dt_min), math.log(self.dt_max), (h,))
    )
    self.d_H = f32_param(rng.standard_normal((h,)))
    self.out = torch_linear(e, e, dtype, rngs)

  def state_size(self):
    """E (N - 1) + E d N: the shift registers' last N - 1 keys per channel
    and the H d^2 diagonal SSMs' N/2 complex modes (causal recurrence)."""
    e, n, d = self.emb_dim, self.n_full, self.head_dim
    return e * (n - 1) + e * d * n

  def discretized(self):
    """Bilinear (log dA, dB, C): complex64 [H, N], [H, N], [G, H, N]."""
    a = -jnp.exp(self.a_log_neg_re_HxN[...]) + 1j * self.a_im_HxN[...]
    dt_H = jnp.exp(self.log_dt_H[...])
    half_dta_HxN = 0.5 * dt_H[:, None] * a
    b = self.b_re_HxN[...] + 1j * self.b_im_HxN[...]
    log_da_HxN = jnp.log((1.0 + half_dta_HxN) / (1.0 - half_dta_HxN))
    db_HxN = dt_H[:, None] * b / (1.0 - half_dta_HxN)
    c_GxHxN = self.c_re_GxHxN[...] + 1j * self.c_im_GxHxN[...]
    return log_da_HxN, db_HxN, c_GxHxN

  def kernels(self, length):
    """float32 [G, H, L]: the diagonal SSM's forward (and backward) kernel."""
    log_da_HxN, db_HxN, c_GxHxN = self.discretized()
    return vandermonde_kernel(c_GxHxN * db_HxN[None], log_da_HxN, length)

  def shift_ssm(self, k_BxLxE):
    """K = sum_{j<N} C_j k_(t-j) + D_k k_t per channel, float32."""
    length = k_BxLxE.shape[1]
    taps = min(self.n_full, length)
    c_ExL = jnp.pad(self.shift_c_ExT[:, :taps], ((0, 0), (0, length - taps)))
    k_BxLxE = k_BxLxE.astype(_F32)
    return fft_conv(k_BxLxE, c_ExL) + self.shift_d_E[...] * k_BxLxE

  def diag_ssm(self, u_BxLxC, causal):
    """The diagonal SSM on C = H d^2 channels (head-major, head h's d^2
    channels share its SSM), float32: K * u (+ reversed K' pass) + D u."""
    length = u_BxLxC.shape[1]
    per_head = u_BxLxC.shape[2] // self.num_ssm_heads
    k_GxHxL = self.kernels(length)
    tile = lambda k_HxL: jnp.repeat(k_HxL, per_head, axis=0)  # noqa: E731
    two_way = self.bidirectional and not causal
    u_BxLxC = u_BxLxC.astype(_F32)
    y = fft_conv(
      u_BxLxC, tile(k_GxHxL[0]), tile(k_GxHxL[1]) if two_way else None
    )
    return y + jnp.repeat(self.d_H[...], per_head) * u_BxLxC

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    del rngs  # no dropout (H3 has none)
    b, length, e = x_BxLxE.shape
    h, d = self.num_ssm_heads, self.head_dim
    real = real_BxL(mask, b, length)
    qkv = self.qkv(zero_padded(x_BxLxE, mask).astype(self.dtype))
    qkv = jnp.where(real[:, :, None], qkv.astype(_F32), 0.0)
    q_BxLxE, k_BxLxE, v_BxLxE = jnp.split(qkv, 3, axis=-1)
    k_BxLxE = self.shift_ssm(k_BxLxE)
    kv_BxLxHxDxD = k_BxLxE.reshape(b, length, h, d, 1) * v_BxLxE.reshape(
      b, length, h, 1, d
    )
    s = self.diag_ssm(kv_BxLxHxDxD.reshape(b, length, e * d), mask.causal)
    s_BxLxHxDxD = s.reshape(b, length, h, d, d)
    y_BxLxHxD = jnp.sum(
      q_BxLxE.reshape(b, length, h, d, 1) * s_BxLxHxDxD, axis=-2
    )
    out_BxLxE = self.out(y_BxLxHxD.reshape(b, length, e).astype(self.dtype))
    out_BxLxE = jnp.where(real[:, :, None], out_BxLxE, 0)
    return out_BxLxE.astype(x_BxLxE.dtype), {}
