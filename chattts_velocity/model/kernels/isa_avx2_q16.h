// AVX2: weight-only int8 tiles times x's Q16 rows (q8_rows.h) in exact int16 dot products (vpmaddwd), what
// cpu_linear.cpp's linear_int8 runs on this ISA (CV_INT8_Q16 in cpu_kernels.h): 16 products per instruction plus one
// add, against 8 per fp32 FMA after widening each weight to fp32 (two instructions per 8 weights).
#pragma once

#include "isa_avx2.h"

namespace chattts_velocity_cpu {

constexpr int64_t kQ16MaxK = 4096;  // |sum| <= K / 8 x 32767 x 127 < 2^31 per int32 lane
constexpr int kQ16RowGroup = 2;     // rows per pass: 8 accumulators of 16 registers

// 16 int8 weights (one row's 16 columns of a [4, 16] chunk) widened to int16, exact.
inline __m256i weights_int16(const int8_t* w) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}

// Rows x[0, M) of Q16 rows times int8 tiles [tiles, K / 16, 4, 16] (tile_loop): per 32-wide step and weight row
// two vpmaddwd per row of x put in each of 8 int32 lanes of acc[m][r] the exact sum of four products; the lanes of
// a tile's 4 rows are folded by vphaddd. Exact integers (K <= kQ16MaxK) at any M; then y = row scale x (x's scale x
// float(sum)).
template <int M>
void tile_rows_q16(Q16Rows x, const int8_t* w, const float* row_scales, at::BFloat16* y, int64_t K, int64_t N,
                   int64_t tiles) {
  using Acc = __m256i[kTileRows];
  const auto step = [=](Acc (&acc)[M], const int8_t* wt, int64_t, int64_t s) {
    for (int r = 0; r < kTileRows; ++r) {
      const __m256i lo = weights_int16(wt + 16 * r), hi = weights_int16(wt + 16 * kTileRows + 16 * r);
      for (int m = 0; m < M; ++m) {
        const int16_t* xm = x.q + m * K + 32 * s;
        const __m256i products = _mm256_add_epi32(
            _mm256_madd_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm))),
            _mm256_madd_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm + 16))));
        acc[m][r] = _mm256_add_epi32(acc[m][r], products);
      }
    }
  };
  const auto finish = [=](const Acc& acc, int m, int64_t t, at::BFloat16* out) {
    const __m128 scales = _mm_loadu_ps(row_scales + t * kTileRows);
    const __m256i folded = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
    const __m128i sums = _mm_add_epi32(_mm256_castsi256_si128(folded), _mm256_extracti128_si256(folded, 1));
    alignas(16) float values[kTileRows];
    _mm_store_ps(values, _mm_mul_ps(scales, _mm_mul_ps(_mm_set1_ps(x.scales[m]), _mm_cvtepi32_ps(sums))));
    for (int r = 0; r < kTileRows; ++r) out[r] = at::BFloat16(values[r]);
  };
  tile_loop<M, Acc, 32 * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

}  // namespace chattts_velocity_cpu
