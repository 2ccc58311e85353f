// AVX-512 VNNI: weight-only int8 tiles times x's Q16 rows (q8_rows.h) in exact int16 dot products (vpdpwssd), what
// cpu_linear.cpp's linear_int8 runs on this ISA (CV_INT8_Q16 in cpu_kernels.h). Against widening the int8 weights to
// bf16 for vdpbf16ps it issues about a third of the instructions per weight at one row (so one row streams its
// weights at the read bandwidth) and widens 32 weights for many rows with one instruction instead of five.
#pragma once

#include "isa_avx512.h"

namespace chattts_velocity_cpu {

constexpr int64_t kQ16MaxK = 8192;  // |sum| <= K / 16 x 32767 x 127 < 2^31 per int32 lane
constexpr int kQ16RowGroup = 8;     // rows per pass: 16 accumulators, the 4 widened weight vectors shared by 8 rows

// 32 int8 weights (two rows of a [4, 16] chunk) widened to int16, exact.
inline __m512i weights_int16(const int8_t* w) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
}

// The 4 rows' sums of a tile: lanes 0-7 and 8-15 of a (rows 0, 1) and of b (rows 2, 3), in exact integers.
inline __m128i row_sums(__m512i a, __m512i b) {
  __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));  // per 128 bits: a, b, a, b
  s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_BADC));        // [a, b, a, b] sums of each 128 bits
  s = _mm512_add_epi32(s, _mm512_shuffle_i32x4(s, s, _MM_SHUFFLE(2, 3, 0, 1)));  // 128-bit blocks 0 + 1, 2 + 3
  return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 1, 8, 0), s));
}

// Rows x[0, M) of Q16 rows times int8 tiles [tiles, K / 16, 4, 16] (tile_loop): per 32-wide step the 4 rows'
// weights widened to int16 once (for all M rows: a block widened to memory instead runs slower, from L2), then four
// vpdpwssd per row put in lane j of acc[m][p] the exact sum over columns 2j', 2j' + 1 (j' = j mod 8) and their
// 16 + of row 2p (lanes 0-7) or 2p + 1 (8-15). The int32 sums are exact (K <= kQ16MaxK), so any M and any order give
// the same integers; then y = row scale x (x's scale x float(sum)).
template <int M>
void tile_rows_q16(Q16Rows x, const int8_t* w, const float* row_scales, at::BFloat16* y, int64_t K, int64_t N,
                   int64_t tiles) {
  using Acc = __m512i[2];
  const auto step = [=](Acc (&acc)[M], const int8_t* wt, int64_t, int64_t s) {
    const __m512i lo01 = weights_int16(wt), lo23 = weights_int16(wt + 32);
    const __m512i hi01 = weights_int16(wt + 64), hi23 = weights_int16(wt + 96);
    for (int m = 0; m < M; ++m) {
      const int16_t* xm = x.q + m * K + 32 * s;  // columns 0-15 and 16-31, each for both rows of a weight vector
      const __m512i x_lo = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm)));
      const __m512i x_hi = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm + 16)));
      acc[m][0] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(acc[m][0], lo01, x_lo), hi01, x_hi);
      acc[m][1] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(acc[m][1], lo23, x_lo), hi23, x_hi);
    }
  };
  const auto finish = [=](const Acc& acc, int m, int64_t t, at::BFloat16* out) {
    const __m128 scales = _mm_loadu_ps(row_scales + t * kTileRows);
    const __m128 sums = _mm_cvtepi32_ps(row_sums(acc[0], acc[1]));
    alignas(16) float values[kTileRows];
    _mm_store_ps(values, _mm_mul_ps(scales, _mm_mul_ps(_mm_set1_ps(x.scales[m]), sums)));
    for (int r = 0; r < kTileRows; ++r) out[r] = at::BFloat16(values[r]);
  };
  tile_loop<M, Acc, 32 * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

}  // namespace chattts_velocity_cpu
