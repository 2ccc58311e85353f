// AVX2 + FMA micro-kernels (x86 without AVX-512: Zen 2/3, Intel client CPUs, Haswell on): the vector helpers, the
// tile linear's inner loop and the attention's row kernels behind the shared drivers (cpu_*.cpp). One V16 is two
// __m256. bf16 values become fp32 by a shift (exact), products are fp32 FMAs.
#pragma once

#include <immintrin.h>

#include "isa_common.h"

namespace chattts_velocity_cpu {

struct V16 {
  __m256 lo, hi;  // lanes 0-7, 8-15
};

inline V16 v_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 v_set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V16 v_add(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 v_sub(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V16 v_mul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 v_div(V16 a, V16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V16 v_fmadd(V16 a, V16 b, V16 c) {  // a * b + c
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline V16 v_max(V16 a, V16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V16 v_abs(V16 a) {
  const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, mask), _mm256_and_ps(a.hi, mask)};
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float reduce_add(V16 a) { return hsum8(_mm256_add_ps(a.lo, a.hi)); }
inline float reduce_max(V16 a) { return hmax8(_mm256_max_ps(a.lo, a.hi)); }

struct ExpOps {  // exp_cephes's operations on one __m256
  using Vec = __m256;
  static Vec set1(float a) { return _mm256_set1_ps(a); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
  static Vec round(Vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Vec ldexp(Vec p, Vec n) {  // 2^n built in the exponent bits (n + 127 in 1..254: a normal float)
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
  }
};

inline __m256 exp8(__m256 x) { return exp_cephes<ExpOps>(x); }
inline V16 exp_ps(V16 x) { return {exp8(x.lo), exp8(x.hi)}; }

inline __m256 bf16x8(const uint16_t* p) {  // 8 bf16 -> 8 fp32 (exact)
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

inline __m256 int8x8(const void* p) {  // 8 int8 -> 8 fp32 (exact)
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
}

inline V16 load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline V16 load16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
inline V16 load16_int8(const uint8_t* p) { return {int8x8(p), int8x8(p + 8)}; }

inline void store16(float* p, V16 v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}

inline __m256i bf16_bits(__m256 v) {  // fp32 -> bf16 in the low 16 bits, round to nearest even (finite values)
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
}

inline void store16(uint16_t* p, V16 v) {  // rounded to nearest even, as torch's fp32 -> bf16 cast
  const __m256i packed = _mm256_packus_epi32(bf16_bits(v.lo), bf16_bits(v.hi));  // per 128-bit lane
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xD8));
}

inline __m128i int16x16(V16 v, __m256i* out) {  // round half even (MXCSR), saturated to int16
  const __m256i packed = _mm256_packs_epi32(_mm256_cvtps_epi32(v.lo), _mm256_cvtps_epi32(v.hi));
  *out = _mm256_permute4x64_epi64(packed, 0xD8);
  return _mm_packs_epi16(_mm256_castsi256_si128(*out), _mm256_extracti128_si256(*out, 1));
}

inline void store16_int8(uint8_t* p, V16 v) {  // round half even (MXCSR), saturated to int8
  __m256i words;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), int16x16(v, &words));
}

inline void store16_int16(int16_t* p, V16 v) {
  __m256i words;
  int16x16(v, &words);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), words);
}

// ---- tile linear (cpu_linear.cpp): rows of x times weight tiles [tiles, K / C, 4, C] ----

constexpr int64_t kRowGroup = 2;     // rows of x per pass: 4 x 2 accumulators + 4 weight vectors in 16 registers
constexpr int64_t kQ8RowGroup = 4;   // tile_rows_int4's rows per pass
constexpr int64_t kPrefetch = 2048;  // bytes ahead of the stream

// x [M, K] as fp32, in the order the weights unpack: for bf16 weights each 16-wide chunk is its 8 even then its
// 8 odd columns (a bf16 pair in a 32-bit lane splits by a shift and a mask), else the natural order.
using Activations = const float*;

inline Activations prepare_activations(const uint16_t* x, int64_t M, int64_t K, std::vector<float>& buffer,
                                       bool paired) {
  buffer.resize(static_cast<size_t>(M * K));
  for (int64_t i = 0; i < M * K; i += 16)
    for (int j = 0; j < 16; ++j) {
      uint32_t bits = static_cast<uint32_t>(x[i + j]) << 16;
      std::memcpy(&buffer[i + (paired ? j / 2 + 8 * (j % 2) : j)], &bits, 4);
    }
  return buffer.data();
}

// The 32 weights of row r at a step as 4 x 8 fp32, in the activations' order.
inline void weights32(const uint16_t* wt, int r, __m256 w[4]) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int half = 0; half < 2; ++half) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + 32 * r + 16 * half));
    w[2 * half] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    w[2 * half + 1] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
  }
}

inline void weights32(const int8_t* wt, int r, __m256 w[4]) {  // int8 tiles: two [4, 16] chunks per step
  const int8_t* lo = wt + 16 * r;
  const int8_t* hi = wt + 16 * kTileRows + 16 * r;
  w[0] = int8x8(lo), w[1] = int8x8(lo + 8), w[2] = int8x8(hi), w[3] = int8x8(hi + 8);
}

// Rows x[0, M) times `tiles` consecutive weight tiles (tile_loop): y[m * N + 4 t + r] = (row_scales[4 t + r] *) the
// sum, fp32 FMAs into one accumulator per (row, output).
template <int M, typename W>
void tile_rows(Activations x, const W* w, const float* row_scales, at::BFloat16* y, int64_t K, int64_t N,
               int64_t tiles) {
  using Acc = __m256[kTileRows];
  const auto step = [=](Acc (&acc)[M], const W* wt, int64_t, int64_t s) {
    for (int r = 0; r < kTileRows; ++r) {
      __m256 wv[4];
      weights32(wt, r, wv);
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * K + 32 * s;
        for (int j = 0; j < 4; ++j) acc[m][r] = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(xm + 8 * j), acc[m][r]);
      }
    }
  };
  const auto finish = [=](const Acc& acc, int, int64_t t, at::BFloat16* out) {
    for (int r = 0; r < kTileRows; ++r) out[r] = scaled_output(hsum8(acc[r]), row_scales, t, r);
  };
  tile_loop<M, Acc, step_bytes<W>() * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

// int4 tiles [tiles, K / 32, 4, 16] (byte j of a row's group: q + 8 of column j in its low nibble, of column j + 16
// in its high one) times Q8 rows. Per group, in exact integers: vpmaddubsw multiplies the biased weights q + 8
// (0..15, unsigned) by x (pairs of at most 2 x 15 x 127), vpmaddwd sums them to 8 int32 lanes, minus 8 x the lanes'
// sums of x: sum(q x) per lane. Then times the weight's group scale and the row's (4 products per (row, group), one
// lane each taken by a permute), into 8 fp32 lanes per (row, output) in a fixed order at every M.
template <int M>
void tile_rows_int4(Q8Rows x, const uint8_t* w, const float* group_scales, at::BFloat16* y, int64_t K, int64_t N,
                    int64_t tiles) {
  const int64_t groups = K / kQ8Group;
  const __m256i nibbles = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
  using Acc = __m256[kTileRows];
  const auto step = [=](Acc (&acc)[M], const uint8_t* wt, int64_t t, int64_t g) {
    __m256i biased[kTileRows];
    for (int r = 0; r < kTileRows; ++r) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wt + 16 * r));
      biased[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), nibbles);  // cols 16-31 | 0-15
    }
    const __m128 weight_scales = _mm_loadu_ps(group_scales + (t * groups + g) * kTileRows);  // the 4 rows' scales
    for (int m = 0; m < M; ++m) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + m * K + g * kQ8Group));
      const __m256i bias = _mm256_madd_epi16(_mm256_maddubs_epi16(eight, xq), ones);
      const __m256 scales = _mm256_castps128_ps256(_mm_mul_ps(weight_scales, _mm_set1_ps(x.scales[m * groups + g])));
      for (int r = 0; r < kTileRows; ++r) {
        const __m256i sums = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(biased[r], xq), ones), bias);
        const __m256 scale = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(r));
        acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[m][r]);
      }
    }
  };
  const auto finish = [](const Acc& acc, int, int64_t, at::BFloat16* out) {
    for (int r = 0; r < kTileRows; ++r) out[r] = at::BFloat16(hsum8(acc[r]));
  };
  tile_loop<M, Acc, 16 * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

// int8 tiles [tiles, K / 16, 4, 16] (per 32-wide step columns 0-15 of the 4 rows, then 16-31) times Q8 rows, exact
// per group: vpmaddubsw multiplies |w| by x with w's sign (pairs <= 2 x 128 x 127: no saturation), vpmaddwd sums to
// int32, three vphaddd fold the 4 rows into one register (lane r: row r's columns 0-15, lane 4 + r: 16-31), times
// the row's group scale into fp32 lanes; at the end an output's two lanes added, times its row scale.
constexpr bool kQ8Int8Unsigned = false;
constexpr bool kQ8Int4Unsigned = false;  // tile_rows_int4 takes x's Q8 rows as they are

template <int M>
void tile_rows_int8(Q8Rows x, const int8_t* w, const float* row_scales, at::BFloat16* y, int64_t K, int64_t N,
                    int64_t tiles) {
  const int64_t groups = K / kQ8Group;
  const __m256i ones = _mm256_set1_epi16(1);
  const auto step = [=](__m256 (&acc)[M], const int8_t* wt, int64_t, int64_t g) {
    __m256i signs[kTileRows], magnitudes[kTileRows];
    for (int r = 0; r < kTileRows; ++r) {
      signs[r] = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wt + 16 * kTileRows + 16 * r)),
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(wt + 16 * r)));
      magnitudes[r] = _mm256_abs_epi8(signs[r]);
    }
    for (int m = 0; m < M; ++m) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + m * K + g * kQ8Group));
      __m256i sums[kTileRows];
      for (int r = 0; r < kTileRows; ++r)
        sums[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes[r], _mm256_sign_epi8(xq, signs[r])), ones);
      const __m256i rows = _mm256_hadd_epi32(_mm256_hadd_epi32(sums[0], sums[1]), _mm256_hadd_epi32(sums[2], sums[3]));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows), _mm256_set1_ps(x.scales[m * groups + g]), acc[m]);
    }
  };
  const auto finish = [=](__m256 acc, int, int64_t t, at::BFloat16* out) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    for (int r = 0; r < kTileRows; ++r)
      out[r] = at::BFloat16(row_scales[t * kTileRows + r] * (lanes[r] + lanes[4 + r]));
  };
  tile_loop<M, __m256, kQ8Group * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

constexpr bool kWidenInt8Blocks = false;  // int8 tiles widen in registers at every M here (no block buffer)
using WideWeight = int8_t;
inline void widen_int8_block(const int8_t*, int8_t*, int64_t, int64_t) {}

// ---- paged attention rows (cpu_attention.cpp) ----

struct Bf16Dot {  // q . k of bf16 rows in fp32 (products exact)
  static float dot(const uint16_t* q, const uint8_t* row, int64_t D) {
    const uint16_t* k = reinterpret_cast<const uint16_t*>(row);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      acc0 = _mm256_fmadd_ps(bf16x8(q + d), bf16x8(k + d), acc0);
      acc1 = _mm256_fmadd_ps(bf16x8(q + d + 8), bf16x8(k + d + 8), acc1);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
  }
};

inline int32_t dot_int16_int8(const int16_t* q, const uint8_t* row, int64_t D) {  // exact (|sum| < 2^31)
  __m256i acc = _mm256_setzero_si256();
  for (int64_t d = 0; d < D; d += 16) {
    const __m256i k = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + d)), k));
  }
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline float softmax_row(float* scores, int64_t len, float top) {  // in place: exp(s - top); returns their sum
  __m256 total = _mm256_setzero_ps();
  const __m256 shift = _mm256_set1_ps(top);
  int64_t p = 0;
  for (; p + 8 <= len; p += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + p), shift));
    _mm256_storeu_ps(scores + p, e);
    total = _mm256_add_ps(total, e);
  }
  return softmax_tail<8>(scores, p, len, hsum8(total),
                         [&](float* tail) { _mm256_store_ps(tail, exp8(_mm256_sub_ps(_mm256_load_ps(tail), shift))); });
}

}  // namespace chattts_velocity_cpu
