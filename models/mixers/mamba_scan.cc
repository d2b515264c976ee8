// Mamba's selective scan on the CPU, forward and backward, as XLA FFI
// custom calls (models/mixers/mamba_native.py builds and registers them).
//
//   h_t = exp(dt_t A) (.) h_(t-1) + dt_t B_t u_t,  y_t = C_t . h_t,  h_-1 = 0
//
// Time-major float32 buffers, row-major: u, dt [L, X, I]; A [X, N, I];
// B, C [L, X, N]. Each of the X rows (batch x directions) is an
// independent recurrence on an [N, I] state that stays in the cache; the
// inner loops run over I (contiguous) so the compiler vectorises them,
// exp included. Rows are split over threads.
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

// Rows [x0, x1) of the forward.
void ForwardRows(const Shape& s, const float* u, const float* dt,
                 const float* a, const float* b, const float* c, float* y,
                 float* hc, int64_t x0, int64_t x1) {
  const int64_t L = s.L, X = s.X, I = s.I, N = s.N, T = s.T;
  std::vector<float> h(N * I), dtu(I);
  for (int64_t x = x0; x < x1; ++x) {
    std::fill(h.begin(), h.end(), 0.0f);
    const float* ax = a + x * N * I;
    for (int64_t t = 0; t < L; ++t) {
      if (t % T == 0) {
        std::copy(h.begin(), h.end(), hc + ((t / T) * X + x) * N * I);
      }
      const int64_t row = t * X + x;
      const float* ut = u + row * I;
      const float* dtt = dt + row * I;
      const float* bt = b + row * N;
      const float* ct = c + row * N;
      float* yt = y + row * I;
      for (int64_t i = 0; i < I; ++i) {
        dtu[i] = dtt[i] * ut[i];
        yt[i] = 0.0f;
      }
      for (int64_t n = 0; n < N; ++n) {
        float* hn = h.data() + n * I;
        const float* an = ax + n * I;
        const float bn = bt[n], cn = ct[n];
        for (int64_t i = 0; i < I; ++i) {
          const float v = expf(dtt[i] * an[i]) * hn[i] + dtu[i] * bn;
          hn[i] = v;
          yt[i] += cn * v;
        }
      }
    }
  }
}

// Rows [x0, x1) of the backward.
void BackwardRows(const Shape& s, const float* u, const float* dt,
                  const float* a, const float* b, const float* c,
                  const float* hc, const float* dy, float* du, float* ddt,
                  float* da, float* db, float* dc, int64_t x0, int64_t x1) {
  const int64_t L = s.L, X = s.X, I = s.I, N = s.N, T = s.T;
  const int64_t NI = N * I;
  // states[j]: h before the chunk's step j (j = 0 .. T); decay[j]: its
  // exp(dt A).
  std::vector<float> states((T + 1) * NI), decay(T * NI), gc(NI);
  std::vector<float> dtu(I), gb(I), qa(I);
  const int64_t chunks = (L + T - 1) / T;
  for (int64_t x = x0; x < x1; ++x) {
    std::fill(gc.begin(), gc.end(), 0.0f);
    const float* ax = a + x * NI;
    float* dax = da + x * NI;
    std::fill(dax, dax + NI, 0.0f);
    for (int64_t k = chunks - 1; k >= 0; --k) {
      const int64_t t0 = k * T, len = std::min(T, L - t0);
      std::copy(hc + (k * X + x) * NI, hc + (k * X + x + 1) * NI,
                states.begin());
      for (int64_t j = 0; j < len; ++j) {
        const int64_t row = (t0 + j) * X + x;
        const float* ut = u + row * I;
        const float* dtt = dt + row * I;
        const float* bt = b + row * N;
        for (int64_t n = 0; n < N; ++n) {
          const float* an = ax + n * I;
          const float* hp = states.data() + j * NI + n * I;
          float* hn = states.data() + (j + 1) * NI + n * I;
          float* en = decay.data() + j * NI + n * I;
          const float bn = bt[n];
          for (int64_t i = 0; i < I; ++i) {
            const float e = expf(dtt[i] * an[i]);
            en[i] = e;
            hn[i] = e * hp[i] + dtt[i] * ut[i] * bn;
          }
        }
      }
      for (int64_t j = len - 1; j >= 0; --j) {
        const int64_t row = (t0 + j) * X + x;
        const float* ut = u + row * I;
        const float* dtt = dt + row * I;
        const float* bt = b + row * N;
        const float* ct = c + row * N;
        const float* dyt = dy + row * I;
        for (int64_t i = 0; i < I; ++i) {
          dtu[i] = dtt[i] * ut[i];
          gb[i] = 0.0f;
          qa[i] = 0.0f;
        }
        for (int64_t n = 0; n < N; ++n) {
          const float* an = ax + n * I;
          const float* hp = states.data() + j * NI + n * I;
          const float* hn = states.data() + (j + 1) * NI + n * I;
          const float* en = decay.data() + j * NI + n * I;
          float* gn = gc.data() + n * I;
          float* dan = dax + n * I;
          const float bn = bt[n], cn = ct[n];
          float dbn = 0.0f, dcn = 0.0f;
          for (int64_t i = 0; i < I; ++i) {
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
        float* dut = du + row * I;
        float* ddtt = ddt + row * I;
        for (int64_t i = 0; i < I; ++i) {
          dut[i] = dtt[i] * gb[i];
          ddtt[i] = ut[i] * gb[i] + qa[i];
        }
      }
    }
  }
}

// fn(x0, x1) over the X rows, on up to min(X, hardware threads) threads.
template <typename F>
void OverRows(int64_t rows, int64_t threads, F fn) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t k = std::max<int64_t>(1, std::min({rows, hw, threads}));
  if (k == 1) {
    fn(0, rows);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < k; ++w) {
    pool.emplace_back(fn, rows * w / k, rows * (w + 1) / k);
  }
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
  OverRows(s.X, threads, [&](int64_t x0, int64_t x1) {
    ForwardRows(s, u.typed_data(), dt.typed_data(), a.typed_data(),
                b.typed_data(), c.typed_data(), y->typed_data(),
                hc->typed_data(), x0, x1);
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
  OverRows(s.X, threads, [&](int64_t x0, int64_t x1) {
    BackwardRows(s, u.typed_data(), dt.typed_data(), a.typed_data(),
                 b.typed_data(), c.typed_data(), hc.typed_data(),
                 dy.typed_data(), du->typed_data(), ddt->typed_data(),
                 da->typed_data(), db->typed_data(), dc->typed_data(), x0, x1);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LraMambaScanForward, ScanForward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // u
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dt
                                  .Arg<ffi::Buffer<ffi::F32>>()  // A
                                  .Arg<ffi::Buffer<ffi::F32>>()  // B
                                  .Arg<ffi::Buffer<ffi::F32>>()  // C
                                  .Attr<int64_t>("chunk")
                                  .Attr<int64_t>("threads")
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y
                                  .Ret<ffi::Buffer<ffi::F32>>());  // hc

XLA_FFI_DEFINE_HANDLER_SYMBOL(LraMambaScanBackward, ScanBackward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // u
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dt
                                  .Arg<ffi::Buffer<ffi::F32>>()  // A
                                  .Arg<ffi::Buffer<ffi::F32>>()  // B
                                  .Arg<ffi::Buffer<ffi::F32>>()  // C
                                  .Arg<ffi::Buffer<ffi::F32>>()  // hc
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dy
                                  .Attr<int64_t>("chunk")
                                  .Attr<int64_t>("threads")
                                  .Ret<ffi::Buffer<ffi::F32>>()  // du
                                  .Ret<ffi::Buffer<ffi::F32>>()  // ddt
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dA
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dB
                                  .Ret<ffi::Buffer<ffi::F32>>());  // dC
