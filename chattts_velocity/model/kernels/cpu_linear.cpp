// Memory-bound linears for decode on x86 CPUs with AVX-512 BF16: y = x @ W.T for a few rows of x.
//
// A decode step reads every weight once per step, so its time is the weight bytes over the memory bandwidth.
// oneDNN's bf16 kernel reaches about 60 % of that bandwidth; these kernels read the weight as one sequential
// stream (the "tile" layout below) and reach 85-95 % at 1-4 rows; cpu_amx.cpp does the same for 5-64 rows.
//
// Tile layout of W [N, K]: [N / 4, K / C, 4, C] (C = 32 for bf16, 16 for int8), i.e. for every group of
// 4 output rows the C-wide column chunks of those rows follow each other in memory.
//
// Ops (schema in TORCH_LIBRARY below), x [M, K] -> y [M, N]:
//   linear_bf16(x, tiles, panels, onednn, tiles_below_rows): x and y bf16, products summed in fp32.
//     Rows are done 4 at a time, unless M >= tiles_below_rows > 0: then the whole batch goes to the AMX panel
//     kernel (`panels`, up to 64 rows) or else to oneDNN's prepacked kernel (`onednn`).
//   linear_int8(x, tiles, panels, scales, tiles_below_rows): weight-only int8 (per-output-row scales), x and y
//     float32; from tiles_below_rows > 0 rows on, the AMX panel kernel when `panels` is given.
// Each row of x has its own accumulators summed in a fixed order, so the tile and AMX kernels' results do not
// depend on the other rows in the batch (oneDNN's may).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "cpu_kernels.h"

namespace chattts_velocity_cpu {
namespace {

constexpr int64_t kRows = 4;    // output rows per tile
constexpr int64_t kPrefetch = 4096;  // bytes ahead of the stream

template <int M>
void bf16_tiles(const uint16_t* x, const uint16_t* w, at::BFloat16* y, int64_t K, int64_t N, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const uint16_t* wt = w + t * kRows * K;
    __m512 acc[M][kRows];
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < kRows; ++r) acc[m][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32, wt += 32 * kRows) {
      _mm_prefetch(reinterpret_cast<const char*>(wt) + kPrefetch, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wt) + kPrefetch + 64, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wt) + kPrefetch + 128, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wt) + kPrefetch + 192, _MM_HINT_T0);
      __m512i wv[kRows];
      for (int r = 0; r < kRows; ++r) wv[r] = _mm512_loadu_si512(wt + 32 * r);
      for (int m = 0; m < M; ++m) {
        __m512i xv = _mm512_loadu_si512(x + m * K + k);
        for (int r = 0; r < kRows; ++r)
          acc[m][r] = _mm512_dpbf16_ps(acc[m][r], reinterpret_cast<__m512bh>(xv), reinterpret_cast<__m512bh>(wv[r]));
      }
    }
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < kRows; ++r) y[m * N + t * kRows + r] = at::BFloat16(_mm512_reduce_add_ps(acc[m][r]));
  }
}

template <int M>
void int8_tiles(const float* x, const int8_t* w, const float* scales, float* y, int64_t K, int64_t N, int64_t t0,
                int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const int8_t* wt = w + t * kRows * K;
    __m512 acc[M][kRows];
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < kRows; ++r) acc[m][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16, wt += 16 * kRows) {
      _mm_prefetch(reinterpret_cast<const char*>(wt) + kPrefetch, _MM_HINT_T0);
      __m512 wv[kRows];
      for (int r = 0; r < kRows; ++r)
        wv[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wt + 16 * r))));
      for (int m = 0; m < M; ++m) {
        __m512 xv = _mm512_loadu_ps(x + m * K + k);
        for (int r = 0; r < kRows; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
      }
    }
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < kRows; ++r) {
        const int64_t n = t * kRows + r;
        y[m * N + n] = scales[n] * _mm512_reduce_add_ps(acc[m][r]);
      }
  }
}

// Runs kernel<rows>(first_row, tile_begin, tile_end) over all rows of x in groups of up to 4, the tiles split
// across threads. Each group reads the whole weight once.
template <typename Kernel>
void over_row_groups(int64_t M, int64_t tiles, Kernel kernel) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t rows = std::min<int64_t>(4, M - m0);
    at::parallel_for(0, tiles, 16, [&](int64_t t0, int64_t t1) { kernel(m0, rows, t0, t1); });
  }
}

void check_inputs(const at::Tensor& x, const at::Tensor& tiles, int64_t chunk, at::ScalarType dtype) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == dtype, "x must be ", dtype, " [M, K]");
  TORCH_CHECK(tiles.dim() == 4 && tiles.size(2) == kRows && tiles.size(3) == chunk && tiles.is_contiguous(),
              "tiles must be a contiguous [N/4, K/", chunk, ", 4, ", chunk, "] weight");
  TORCH_CHECK(tiles.size(1) * chunk == x.size(1), "x has ", x.size(1), " features, the weight ", tiles.size(1) * chunk);
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view, c10::List<std::optional<at::Scalar>>,
                                         std::optional<c10::string_view>)>();
  return op.call(x, packed, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), c10::string_view(""));
}

}  // namespace

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& tiles, const std::optional<at::Tensor>& panels,
                       const std::optional<at::Tensor>& onednn, int64_t tiles_below_rows) {
  check_inputs(x, tiles, 32, at::kBFloat16);
  TORCH_CHECK(tiles.scalar_type() == at::kBFloat16, "tiles must be bfloat16");
  const int64_t M = x.size(0), K = x.size(1), N = tiles.size(0) * kRows;
  auto xb = x.contiguous();
  if (tiles_below_rows > 0 && M >= tiles_below_rows) {
    if (panels.has_value() && (M <= kAmxMaxRows || !onednn.has_value())) return linear_bf16_amx(xb, *panels);
    if (onednn.has_value()) return onednn_linear(xb, *onednn);
  }
  auto y = at::empty({M, N}, x.options());
  auto xp = reinterpret_cast<const uint16_t*>(xb.data_ptr());
  auto wp = reinterpret_cast<const uint16_t*>(tiles.data_ptr());
  auto yp = y.data_ptr<at::BFloat16>();
  over_row_groups(M, tiles.size(0), [&](int64_t m0, int64_t rows, int64_t t0, int64_t t1) {
    const uint16_t* xm = xp + m0 * K;
    at::BFloat16* ym = yp + m0 * N;
    switch (rows) {
      case 1: bf16_tiles<1>(xm, wp, ym, K, N, t0, t1); break;
      case 2: bf16_tiles<2>(xm, wp, ym, K, N, t0, t1); break;
      case 3: bf16_tiles<3>(xm, wp, ym, K, N, t0, t1); break;
      default: bf16_tiles<4>(xm, wp, ym, K, N, t0, t1); break;
    }
  });
  return y;
}

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& tiles, const std::optional<at::Tensor>& panels,
                       const at::Tensor& scales, int64_t tiles_below_rows) {
  check_inputs(x, tiles, 16, at::kFloat);
  TORCH_CHECK(tiles.scalar_type() == at::kChar, "tiles must be int8");
  const int64_t M = x.size(0), K = x.size(1), N = tiles.size(0) * kRows;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == N && scales.is_contiguous(),
              "scales must be float32 [N]");
  auto xc = x.contiguous();
  if (panels.has_value() && tiles_below_rows > 0 && M >= tiles_below_rows) return linear_int8_amx(xc, *panels, scales);
  auto y = at::empty({M, N}, x.options());
  auto xp = xc.data_ptr<float>();
  auto wp = tiles.data_ptr<int8_t>();
  auto sp = scales.data_ptr<float>();
  auto yp = y.data_ptr<float>();
  over_row_groups(M, tiles.size(0), [&](int64_t m0, int64_t rows, int64_t t0, int64_t t1) {
    const float* xm = xp + m0 * K;
    float* ym = yp + m0 * N;
    switch (rows) {
      case 1: int8_tiles<1>(xm, wp, sp, ym, K, N, t0, t1); break;
      case 2: int8_tiles<2>(xm, wp, sp, ym, K, N, t0, t1); break;
      case 3: int8_tiles<3>(xm, wp, sp, ym, K, N, t0, t1); break;
      default: int8_tiles<4>(xm, wp, sp, ym, K, N, t0, t1); break;
    }
  });
  return y;
}

}  // namespace chattts_velocity_cpu

TORCH_LIBRARY(chattts_velocity_cpu, m) {
  m.def("linear_bf16(Tensor x, Tensor tiles, Tensor? panels, Tensor? onednn, int tiles_below_rows) -> Tensor");
  m.def("linear_int8(Tensor x, Tensor tiles, Tensor? panels, Tensor scales, int tiles_below_rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(chattts_velocity_cpu, CPU, m) {
  m.impl("linear_bf16", &chattts_velocity_cpu::linear_bf16);
  m.impl("linear_int8", &chattts_velocity_cpu::linear_int8);
}

// oneDNN's prepacked weight is an MkldnnCPU tensor, which puts calls that carry it under that dispatch key.
TORCH_LIBRARY_IMPL(chattts_velocity_cpu, MkldnnCPU, m) {
  m.impl("linear_bf16", &chattts_velocity_cpu::linear_bf16);
}
