// Linears for the CPU engine on x86 CPUs with AVX-512 BF16: y = x @ W.T, x and y bf16, products summed in fp32.
//
// Batch invariance (the seed contract): a row's result never depends on how many rows come with it. Each row has
// its own accumulators summed in one fixed order at every M, and the kernel is chosen by the weight's layout only
// (never by M): the AMX panel kernel (cpu_amx.cpp) where the CPU has AMX, else the tile kernel here. Prefill,
// decode and recompute after preemption therefore give a row the same bits.
//
// Tile layout of W [N, K]: [N / 4, K / C, 4, C] (C = 32 for bf16, 16 for int8), i.e. for every group of
// 4 output rows the C-wide column chunks of those rows follow each other in memory. Threads take blocks of
// kBlockTiles tiles and pass all rows of x over a block while it is in cache, so W streams from memory once per
// call at any M (one row: 85-95 % of the memory bandwidth, where oneDNN reaches about 60 %).
//
// Ops (schema in TORCH_LIBRARY below), x [M, K] bf16 -> y [M, N] bf16:
//   linear_bf16(x, weight): weight in the tile layout, or in the AMX panel layout (kernels.to_panels) on AMX CPUs.
//   linear_int8(x, weight, scales): weight-only int8 with per-output-row scales, either layout. The int8 values
//     become bf16 exactly, so the arithmetic is linear_bf16's, then the fp32 sum is scaled and rounded once.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu_kernels.h"

namespace chattts_velocity_cpu {
namespace {

constexpr int64_t kRows = 4;    // output rows per tile
constexpr int64_t kPrefetch = 4096;  // bytes ahead of the stream
constexpr int64_t kBlockTiles = 8;  // tiles per cache-resident weight block (32 outputs, 48-192 KB of bf16)

// Rows x[0, M) times `tiles` consecutive weight tiles from w: y[m * N + 4 t + r] = (scales[4 t + r] *) the sum.
// Every row has its own accumulators and the same summation order whatever M is (the batch-invariance contract).
// 32 weights of row r at the 32-wide step wt as bf16: loaded (bf16 tiles), or widened exactly from the two 16-wide
// int8 chunks of that step (int8 tiles, [.., 4, 16] per chunk), so both layouts feed the same products.
inline __m512i weights32(const uint16_t* wt, int r) { return _mm512_loadu_si512(wt + 32 * r); }

inline __m512i weights32(const int8_t* wt, int r) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wt + 16 * r))));
  const __m512 hi = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wt + 16 * kRows + 16 * r))));
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

template <int M, typename W>
void bf16_tiles(const uint16_t* x, const W* w, const float* scales, at::BFloat16* y, int64_t K, int64_t N,
                int64_t tiles) {
  for (int64_t t = 0; t < tiles; ++t) {
    const W* wt = w + t * kRows * K;
    __m512 acc[M][kRows];
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < kRows; ++r) acc[m][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32, wt += 32 * kRows) {
      _mm_prefetch(reinterpret_cast<const char*>(wt) + kPrefetch, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wt) + kPrefetch + 64, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wt) + kPrefetch + 128, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wt) + kPrefetch + 192, _MM_HINT_T0);
      __m512i wv[kRows];
      for (int r = 0; r < kRows; ++r) wv[r] = weights32(wt, r);
      for (int m = 0; m < M; ++m) {
        __m512i xv = _mm512_loadu_si512(x + m * K + k);
        for (int r = 0; r < kRows; ++r)
          acc[m][r] = _mm512_dpbf16_ps(acc[m][r], reinterpret_cast<__m512bh>(xv), reinterpret_cast<__m512bh>(wv[r]));
      }
    }
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < kRows; ++r) {
        const float sum = _mm512_reduce_add_ps(acc[m][r]);
        y[m * N + t * kRows + r] = at::BFloat16(scales ? scales[t * kRows + r] * sum : sum);
      }
  }
}

// One tile block of int8 weights [tiles, K/16, 4, 16] as bf16 in the bf16 tile layout [tiles, K/32, 4, 32] (exact:
// |q| <= 127), so int8 weights go through bf16_tiles and share its arithmetic.
void int8_block_to_bf16(const int8_t* w, uint16_t* out, int64_t K, int64_t tiles) {
  for (int64_t t = 0; t < tiles; ++t, w += kRows * K, out += kRows * K)
    for (int64_t k = 0; k < K; k += 32) {
      for (int r = 0; r < kRows; ++r) _mm512_storeu_si512(out + k * kRows + 32 * r, weights32(w + k * kRows, r));
    }
}

// All M rows of x times tiles [0, n) of a weight block, 4 rows at a time (the block stays in cache meanwhile).
template <typename W>
void rows_times_block(const uint16_t* x, int64_t M, const W* w, const float* scales, at::BFloat16* y, int64_t K,
                      int64_t N, int64_t n) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const uint16_t* xm = x + m0 * K;
    at::BFloat16* ym = y + m0 * N;
    switch (std::min<int64_t>(4, M - m0)) {
      case 1: bf16_tiles<1, W>(xm, w, scales, ym, K, N, n); break;
      case 2: bf16_tiles<2, W>(xm, w, scales, ym, K, N, n); break;
      case 3: bf16_tiles<3, W>(xm, w, scales, ym, K, N, n); break;
      default: bf16_tiles<4, W>(xm, w, scales, ym, K, N, n); break;
    }
  }
}

// y [M, N] bf16 = x [M, K] bf16 @ W.T, W in bf16 or int8 tiles (then times scales). The weight streams from memory
// once per call: threads take blocks of kBlockTiles tiles and pass every row of x over a block before the next.
at::Tensor tiles_linear(const at::Tensor& x, const at::Tensor& tiles, const float* scales) {
  const int64_t M = x.size(0), K = x.size(1), num_tiles = tiles.size(0), N = num_tiles * kRows;
  const bool int8 = tiles.scalar_type() == at::kChar;
  auto xb = x.contiguous();
  auto y = at::empty({M, N}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(xb.data_ptr());
  auto* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, num_tiles, kBlockTiles, [&](int64_t t0, int64_t t1) {
    // int8: widened in registers for a single row group, else once per block into a bf16 buffer (the same values)
    const bool widen_once = int8 && M > 4;
    std::vector<uint16_t> buffer(widen_once ? kBlockTiles * kRows * K : 0);
    for (int64_t b0 = t0; b0 < t1; b0 += kBlockTiles) {
      const int64_t n = std::min(kBlockTiles, t1 - b0), offset = b0 * kRows * K;
      const float* block_scales = scales ? scales + b0 * kRows : nullptr;
      if (int8 && !widen_once) {
        rows_times_block(xp, M, tiles.data_ptr<int8_t>() + offset, block_scales, yp + b0 * kRows, K, N, n);
        continue;
      }
      const uint16_t* w = reinterpret_cast<const uint16_t*>(tiles.data_ptr()) + offset;
      if (widen_once) {
        int8_block_to_bf16(tiles.data_ptr<int8_t>() + offset, buffer.data(), K, n);
        w = buffer.data();
      }
      rows_times_block(xp, M, w, block_scales, yp + b0 * kRows, K, N, n);
    }
  });
  return y;
}

bool is_panels(const at::Tensor& weight) {  // the AMX layout [N/16, K/2, 16, 2], else the tiles [N/4, K/C, 4, C]
  return weight.dim() == 4 && weight.size(2) == 16 && weight.size(3) == 2;
}

void check_inputs(const at::Tensor& x, const at::Tensor& tiles, int64_t chunk) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x must be bf16 [M, K]");
  TORCH_CHECK(tiles.dim() == 4 && tiles.size(2) == kRows && tiles.size(3) == chunk && tiles.is_contiguous(),
              "tiles must be a contiguous [N/4, K/", chunk, ", 4, ", chunk, "] weight");
  TORCH_CHECK(tiles.size(1) * chunk == x.size(1), "x has ", x.size(1), " features, the weight ", tiles.size(1) * chunk);
}

}  // namespace

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16, "weight must be bfloat16");
  if (is_panels(weight)) return linear_bf16_amx(x.contiguous(), weight);
  check_inputs(x, weight, 32);
  return tiles_linear(x, weight, nullptr);
}

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales) {
  TORCH_CHECK(weight.scalar_type() == at::kChar, "weight must be int8");
  const int64_t N = is_panels(weight) ? weight.size(0) * 16 : weight.size(0) * kRows;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == N && scales.is_contiguous(),
              "scales must be float32 [N]");
  if (is_panels(weight)) return linear_int8_amx(x.contiguous(), weight, scales);
  check_inputs(x, weight, 16);
  return tiles_linear(x, weight, scales.data_ptr<float>());
}

}  // namespace chattts_velocity_cpu

TORCH_LIBRARY(chattts_velocity_cpu, m) {
  m.def("linear_bf16(Tensor x, Tensor weight) -> Tensor");
  m.def("linear_int8(Tensor x, Tensor weight, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(chattts_velocity_cpu, CPU, m) {
  m.impl("linear_bf16", &chattts_velocity_cpu::linear_bf16);
  m.impl("linear_int8", &chattts_velocity_cpu::linear_int8);
}

