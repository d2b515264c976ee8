// Mamba's selective scan on the CPU, forward and backward, as XLA FFI
// custom calls (models/mixers/mamba_native.py builds and registers them).
//
//   h_t = exp(dt_t A) (.) h_(t-1) + dt_t B_t u_t,  y_t = C_t . h_t,  h_-1 = 0
//
// Time-major float32 buffers, row-major: u, dt [L, X, I]; A [X, N, I];
// B, C [L, X, N]. Each of the X rows (batch x directions) is an
// independent recurrence on an [N, I] state that stays in the cache; the
// inner loops run over I (contiguous) so the compiler vectorises them,
// exp included. Rows are split over threads, and a row's channels too
// when there are fewer rows than threads (the channels are independent
// but for the sums over I of dB and dC, summed from per-block partials).
//
// Forward:  -> y [L, X, I] and the state entering every chunk of T
//              positions, hc [ceil(L / T), X, N, I] (the backward's
//              checkpoints: memory linear in L).
// Backward: chunks in reverse; a chunk's states and exp(dt A) are
//   recomputed from its checkpoint into a scratch of (2 T + 1) N I floats,
//   then its steps run in reverse with the adjoint g_t of h_t, carried as
//   gc = exp(dt_t A) g_t:
//     g_t = C_t dy_t + gc_(t+1),  q_t = g_t exp(dt_t A) h_(t-1)
//     du_t = dt_t sum_n g_t B_t,  d dt_t = u_t sum_n g_t B_t + sum_n A q_t
//     dB_t = sum_i g_t dt_t u_t,  dC_t = sum_i h_t dy_t,  dA = sum_t dt_t q_t
//   (the same formulas as mamba.py's _scan_chunks_bwd).

#include <algorithm>
#include <math.h>
#include <cstdint>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Shape {
  int64_t L, X, I, N, T;
};

// One work item: row x, channels [i0, i1). Channels are independent
// except through the reductions over I (dB, dC), which an item writes as
// its partial sums when the channels are split (db, dc then point at the
// item's block of partials).
struct Item {
  int64_t x, i0, i1;
};

void ForwardItem(const Shape& s, const float* u, const float* dt,
                 const float* a, const float* b, const float* c, float* y,
                 float* hc, Item it) {
  const int64_t L = s.L, X = s.X, I = s.I, N = s.N, T = s.T;
  const int64_t x = it.x, i0 = it.i0, w = it.i1 - it.i0;
  std::vector<float> h(N * w, 0.0f), dtu(w);
  const float* ax = a + x * N * I + i0;
  for (int64_t t = 0; t < L; ++t) {
    if (t % T == 0) {
      float* kept = hc + ((t / T) * X + x) * N * I + i0;
      for (int64_t n = 0; n < N; ++n) {
        std::copy(h.begin() + n * w, h.begin() + (n + 1) * w, kept + n * I);
      }
    }
    const int64_t row = t * X + x;
    const float* ut = u + row * I + i0;
    const float* dtt = dt + row * I + i0;
    const float* bt = b + row * N;
    const float* ct = c + row * N;
    float* yt = y + row * I + i0;
    for (int64_t i = 0; i < w; ++i) {
      dtu[i] = dtt[i] * ut[i];
      yt[i] = 0.0f;
    }
    for (int64_t n = 0; n < N; ++n) {
      float* hn = h.data() + n * w;
      const float* an = ax + n * I;
      const float bn = bt[n], cn = ct[n];
      for (int64_t i = 0; i < w; ++i) {
        const float v = expf(dtt[i] * an[i]) * hn[i] + dtu[i] * bn;
        hn[i] = v;
        yt[i] += cn * v;
      }
    }
  }
}

void BackwardItem(const Shape& s, const float* u, const float* dt,
                  const float* a, const float* b, const float* c,
                  const float* hc, const float* dy, float* du, float* ddt,
                  float* da, float* db, float* dc, Item it) {
  const int64_t L = s.L, X = s.X, I = s.I, N = s.N, T = s.T;
  const int64_t x = it.x, i0 = it.i0, w = it.i1 - it.i0, NW = N * w;
  // states[j]: h before the chunk's step j (j = 0 .. T); decay[j]: its
  // exp(dt A); [N, w] each.
  std::vector<float> states((T + 1) * NW), decay(T * NW), gc(NW, 0.0f);
  std::vector<float> dtu(w), gb(w), qa(w);
  const float* ax = a + x * N * I + i0;
  float* dax = da + x * N * I + i0;
  for (int64_t n = 0; n < N; ++n) std::fill(dax + n * I, dax + n * I + w, 0.0f);
  const int64_t chunks = (L + T - 1) / T;
  for (int64_t k = chunks - 1; k >= 0; --k) {
    const int64_t t0 = k * T, len = std::min(T, L - t0);
    const float* kept = hc + (k * X + x) * N * I + i0;
    for (int64_t n = 0; n < N; ++n) {
      std::copy(kept + n * I, kept + n * I + w, states.begin() + n * w);
    }
    for (int64_t j = 0; j < len; ++j) {
      const int64_t row = (t0 + j) * X + x;
      const float* ut = u + row * I + i0;
      const float* dtt = dt + row * I + i0;
      const float* bt = b + row * N;
      for (int64_t n = 0; n < N; ++n) {
        const float* an = ax + n * I;
        const float* hp = states.data() + j * NW + n * w;
        float* hn = states.data() + (j + 1) * NW + n * w;
        float* en = decay.data() + j * NW + n * w;
        const float bn = bt[n];
        for (int64_t i = 0; i < w; ++i) {
          const float e = expf(dtt[i] * an[i]);
          en[i] = e;
          hn[i] = e * hp[i] + dtt[i] * ut[i] * bn;
        }
      }
    }
    for (int64_t j = len - 1; j >= 0; --j) {
      const int64_t row = (t0 + j) * X + x;
      const float* ut = u + row * I + i0;
      const float* dtt = dt + row * I + i0;
      const float* bt = b + row * N;
      const float* ct = c + row * N;
      const float* dyt = dy + row * I + i0;
      for (int64_t i = 0; i < w; ++i) {
        dtu[i] = dtt[i] * ut[i];
        gb[i] = 0.0f;
        qa[i] = 0.0f;
      }
      for (int64_t n = 0; n < N; ++n) {
        const float* an = ax + n * I;
        const float* hp = states.data() + j * NW + n * w;
        const float* hn = states.data() + (j + 1) * NW + n * w;
        const float* en = decay.data() + j * NW + n * w;
        float* gn = gc.data() + n * w;
        float* dan = dax + n * I;
        const float bn = bt[n], cn = ct[n];
        float dbn = 0.0f, dcn = 0.0f;
        for (int64_t i = 0; i < w; ++i) {
          const float g = gn[i] + cn * dyt[i];
          const float q = g * en[i] * hp[i];
          gb[i] += g * bn;
          qa[i] += q * an[i];
          dbn += g * dtu[i];
          dcn += hn[i] * dyt[i];
          dan[i] += q * dtt[i];
          gn[i] = en[i] * g;
        }
        db[row * N + n] = dbn;
        dc[row * N + n] = dcn;
      }
      float* dut = du + row * I + i0;
      float* ddtt = ddt + row * I + i0;
      for (int64_t i = 0; i < w; ++i) {
        dut[i] = dtt[i] * gb[i];
        ddtt[i] = ut[i] * gb[i] + qa[i];
      }
    }
  }
}

// The work split: rows, each cut into `blocks` channel blocks (multiples
// of 16 channels) when there are fewer rows than threads.
struct Split {
  int64_t threads, blocks;
  Item item(const Shape& s, int64_t k) const {
    const int64_t x = k / blocks, blk = k % blocks;
    const int64_t step = ((s.I + blocks - 1) / blocks + 15) / 16 * 16;
    return Item{x, std::min(s.I, blk * step), std::min(s.I, (blk + 1) * step)};
  }
};

Split Plan(const Shape& s, int64_t threads) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t k = std::max<int64_t>(1, std::min(hw, threads));
  int64_t blocks = 1;
  if (s.X < k) blocks = std::min((k + s.X - 1) / s.X, (s.I + 15) / 16);
  return Split{k, std::max<int64_t>(1, blocks)};
}

// fn(k) for every work item k < items, on `threads` threads.
template <typename F>
void Run(int64_t items, int64_t threads, F fn) {
  const int64_t k = std::max<int64_t>(1, std::min(items, threads));
  auto range = [&](int64_t w) {
    for (int64_t i = items * w / k; i < items * (w + 1) / k; ++i) fn(i);
  };
  if (k == 1) {
    range(0);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < k; ++w) pool.emplace_back(range, w);
  range(0);
  for (auto& th : pool) th.join();
}

ffi::Error CheckShapes(ffi::Buffer<ffi::F32>& u, ffi::Buffer<ffi::F32>& a,
                       ffi::Buffer<ffi::F32>& b, int64_t chunk, Shape* s) {
  auto du = u.dimensions();
  auto da = a.dimensions();
  auto db = b.dimensions();
  if (du.size() != 3 || da.size() != 3 || db.size() != 3 || chunk < 1) {
    return ffi::Error::InvalidArgument(
        "mamba scan: u [L, X, I], A [X, N, I], B [L, X, N], chunk >= 1");
  }
  *s = Shape{du[0], du[1], du[2], da[1], chunk};
  if (da[0] != s->X || da[2] != s->I || db[0] != s->L || db[1] != s->X ||
      db[2] != s->N) {
    return ffi::Error::InvalidArgument("mamba scan: inconsistent shapes");
  }
  return ffi::Error::Success();
}

ffi::Error ScanForward(ffi::Buffer<ffi::F32> u, ffi::Buffer<ffi::F32> dt,
                       ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                       ffi::Buffer<ffi::F32> c, int64_t chunk, int64_t threads,
                       ffi::ResultBuffer<ffi::F32> y,
                       ffi::ResultBuffer<ffi::F32> hc) {
  Shape s;
  ffi::Error err = CheckShapes(u, a, b, chunk, &s);
  if (err.failure()) return err;
  const Split split = Plan(s, threads);
  Run(s.X * split.blocks, split.threads, [&](int64_t k) {
    ForwardItem(s, u.typed_data(), dt.typed_data(), a.typed_data(),
                b.typed_data(), c.typed_data(), y->typed_data(),
                hc->typed_data(), split.item(s, k));
  });
  return ffi::Error::Success();
}

ffi::Error ScanBackward(
    ffi::Buffer<ffi::F32> u, ffi::Buffer<ffi::F32> dt, ffi::Buffer<ffi::F32> a,
    ffi::Buffer<ffi::F32> b, ffi::Buffer<ffi::F32> c, ffi::Buffer<ffi::F32> hc,
    ffi::Buffer<ffi::F32> dy, int64_t chunk, int64_t threads,
    ffi::ResultBuffer<ffi::F32> du, ffi::ResultBuffer<ffi::F32> ddt,
    ffi::ResultBuffer<ffi::F32> da, ffi::ResultBuffer<ffi::F32> db,
    ffi::ResultBuffer<ffi::F32> dc) {
  Shape s;
  ffi::Error err = CheckShapes(u, a, b, chunk, &s);
  if (err.failure()) return err;
  const Split split = Plan(s, threads);
  float* dbp = db->typed_data();
  float* dcp = dc->typed_data();
  const int64_t per = s.L * s.X * s.N;
  std::vector<float> partial;  // [blocks, 2, L, X, N] when split
  if (split.blocks > 1) partial.resize(split.blocks * 2 * per);
  Run(s.X * split.blocks, split.threads, [&](int64_t k) {
    const int64_t blk = k % split.blocks;
    float* dbk = split.blocks > 1 ? partial.data() + blk * 2 * per : dbp;
    float* dck = split.blocks > 1 ? partial.data() + (blk * 2 + 1) * per : dcp;
    BackwardItem(s, u.typed_data(), dt.typed_data(), a.typed_data(),
                 b.typed_data(), c.typed_data(), hc.typed_data(),
                 dy.typed_data(), du->typed_data(), ddt->typed_data(),
                 da->typed_data(), dbk, dck, split.item(s, k));
  });
  if (split.blocks > 1) {
    // Each item wrote its row's entries only: sum the blocks' partials
    // per entry (rows interleave in [L, X, N], so sum by row).
    for (int64_t r = 0; r < s.L * s.X; ++r) {
      for (int64_t n = 0; n < s.N; ++n) {
        float sb = 0.0f, sc = 0.0f;
        for (int64_t blk = 0; blk < split.blocks; ++blk) {
          sb += partial[blk * 2 * per + r * s.N + n];
          sc += partial[(blk * 2 + 1) * per + r * s.N + n];
        }
        dbp[r * s.N + n] = sb;
        dcp[r * s.N + n] = sc;
      }
    }
  }
  return ffi::Error::Success();
}

// The five inputs both calls start with: u, dt, A, B, C.
auto ScanInputs() {
  using F32 = ffi::Buffer<ffi::F32>;
  return ffi::Ffi::Bind().Arg<F32>().Arg<F32>().Arg<F32>().Arg<F32>().Arg<
      F32>();
}

}  // namespace

using F32 = ffi::Buffer<ffi::F32>;

XLA_FFI_DEFINE_HANDLER_SYMBOL(LraMambaScanForward, ScanForward,
                              ScanInputs()
                                  .Attr<int64_t>("chunk")
                                  .Attr<int64_t>("threads")
                                  .Ret<F32>()    // y
                                  .Ret<F32>());  // hc

XLA_FFI_DEFINE_HANDLER_SYMBOL(LraMambaScanBackward, ScanBackward,
                              ScanInputs()
                                  .Arg<F32>()  // hc
                                  .Arg<F32>()  // dy
                                  .Attr<int64_t>("chunk")
                                  .Attr<int64_t>("threads")
                                  .Ret<F32>()    // du
                                  .Ret<F32>()    // ddt
                                  .Ret<F32>()    // dA
                                  .Ret<F32>()    // dB
                                  .Ret<F32>());  // dC
