// AVX-512 BF16 micro-kernels (x86 servers: Sapphire Rapids, Zen 4): the vector helpers, the tile linear's inner
// loop and the attention's row kernels that the shared drivers (cpu_*.cpp) call. One V16 is one __m512.
#pragma once

#include <immintrin.h>

#include "isa_common.h"

namespace chattts_velocity_cpu {

using V16 = __m512;  // 16 fp32 lanes

inline V16 v_zero() { return _mm512_setzero_ps(); }
inline V16 v_set1(float x) { return _mm512_set1_ps(x); }
inline V16 v_add(V16 a, V16 b) { return _mm512_add_ps(a, b); }
inline V16 v_sub(V16 a, V16 b) { return _mm512_sub_ps(a, b); }
inline V16 v_mul(V16 a, V16 b) { return _mm512_mul_ps(a, b); }
inline V16 v_div(V16 a, V16 b) { return _mm512_div_ps(a, b); }
inline V16 v_fmadd(V16 a, V16 b, V16 c) { return _mm512_fmadd_ps(a, b, c); }  // a * b + c
inline V16 v_max(V16 a, V16 b) { return _mm512_max_ps(a, b); }
inline V16 v_abs(V16 a) { return _mm512_abs_ps(a); }
inline float reduce_add(V16 a) { return _mm512_reduce_add_ps(a); }
inline float reduce_max(V16 a) { return _mm512_reduce_max_ps(a); }

struct ExpOps {  // exp_cephes's operations on one __m512
  using Vec = __m512;
  static Vec set1(float a) { return _mm512_set1_ps(a); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }
  static Vec round(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Vec ldexp(Vec p, Vec n) { return _mm512_scalef_ps(p, n); }
};

inline V16 exp_ps(V16 x) { return exp_cephes<ExpOps>(x); }

inline V16 load16(const float* p) { return _mm512_loadu_ps(p); }

inline V16 load16(const uint16_t* p) {  // 16 bf16 -> 16 fp32 (exact)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

inline V16 load16_int8(const uint8_t* p) {  // 16 int8 -> 16 fp32 (exact)
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline void store16(float* p, V16 v) { _mm512_storeu_ps(p, v); }

inline void store16(uint16_t* p, V16 v) {  // rounded to nearest even, as torch's fp32 -> bf16 cast
  const __m256bh rounded = _mm512_cvtneps_pbh(v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<const __m256i&>(rounded));
}

inline void store16_int8(uint8_t* p, V16 v) {  // round half even (MXCSR), saturated to int8
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
}

// ---- tile linear (cpu_linear.cpp): rows of x times weight tiles [tiles, K / C, 4, C] ----

constexpr int64_t kRowGroup = 4;    // rows of x per pass of the micro-kernel
constexpr int64_t kQ8RowGroup = 16;  // tile_rows_int4's / tile_rows_int8's rows per pass: 16 accumulators
constexpr int64_t kPrefetch = 4096;  // bytes ahead of the stream

using Activations = const uint16_t*;  // x [M, K] bf16 as it comes
inline Activations prepare_activations(const uint16_t* x, int64_t, int64_t, std::vector<float>&, bool) { return x; }

// 32 weights of row r at the 32-wide step wt as bf16: loaded (bf16 tiles), or widened exactly from the two 16-wide
// int8 chunks of that step (int8 tiles, [.., 4, 16] per chunk), so both layouts feed the same products.
inline __m512i weights32(const uint16_t* wt, int r) { return _mm512_loadu_si512(wt + 32 * r); }

inline __m512i weights32(const int8_t* wt, int r) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wt + 16 * r))));
  const __m512 hi = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wt + 16 * kTileRows + 16 * r))));
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// Rows x[0, M) times `tiles` consecutive weight tiles from w (tile_loop): y[m * N + 4 t + r] = (row_scales[4 t + r] *)
// the sum, vdpbf16ps into one accumulator per (row, output).
template <int M, typename W>
void tile_rows(Activations x, const W* w, const float* row_scales, at::BFloat16* y, int64_t K, int64_t N,
               int64_t tiles) {
  using Acc = __m512[kTileRows];
  const auto step = [=](Acc (&acc)[M], const W* wt, int64_t, int64_t s) {
    __m512i wv[kTileRows];
    for (int r = 0; r < kTileRows; ++r) wv[r] = weights32(wt, r);
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + m * K + 32 * s));
      for (int r = 0; r < kTileRows; ++r)
        acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, reinterpret_cast<__m512bh>(wv[r]));
    }
  };
  const auto finish = [=](const Acc& acc, int, int64_t t, at::BFloat16* out) {
    for (int r = 0; r < kTileRows; ++r) out[r] = scaled_output(_mm512_reduce_add_ps(acc[r]), row_scales, t, r);
  };
  tile_loop<M, Acc, step_bytes<W>() * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

// int4 tiles [tiles, K / 32, 4, 16] (byte j of a row's group: q + 8 of column j in its low nibble, of column j + 16
// in its high one) times Q8 rows stored unsigned (x + 128: kQ8Int4Unsigned). A group's 64 bytes put row r's 16 bytes
// in 128-bit lane r, so the low nibbles less 8 are the 4 rows' signed weights of columns 0-15 and the high ones of
// 16-31, unpacked once per tile and group for all M rows (no permutes). Two vpdpbusd per row (x's columns 0-15 and
// 16-31 broadcast to every 128-bit lane) put in lane 4r + i the exact sum over columns 4i..4i+3 and 16+4i..16+4i+3
// of (x + 128) w for output row r, starting from -128 x the same sums of w (shared by the rows), so the lanes hold
// sum(x w); then times the 4 rows' group scales and x's into fp32 lanes, in a fixed order at every M. At the end
// each output's 4 lanes are summed in a fixed order.
constexpr bool kQ8Int4Unsigned = true;

template <int M>
void tile_rows_int4(Q8Rows x, const uint8_t* w, const float* group_scales, at::BFloat16* y, int64_t K, int64_t N,
                    int64_t tiles) {
  const int64_t groups = K / kQ8Group;
  const __m512i nibbles = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80)), zero = _mm512_setzero_si512();
  const __m512i scale_lanes = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);  // row r: 4r..4r+3
  const auto step = [=](__m512 (&acc)[M], const uint8_t* wt, int64_t t, int64_t g) {
    const __m512i packed = _mm512_loadu_si512(wt);
    const __m512i lo = _mm512_sub_epi8(_mm512_and_si512(packed, nibbles), eight);
    const __m512i hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(packed, 4), nibbles), eight);
    const __m512i start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, offset, lo), offset, hi));
    const __m128 scales = _mm_loadu_ps(group_scales + (t * groups + g) * kTileRows);
    const __m512 ws = _mm512_permutexvar_ps(scale_lanes, _mm512_castps128_ps512(scales));
    for (int m = 0; m < M; ++m) {
      const int8_t* xq = x.q + m * K + g * kQ8Group;
      const __m512i x_lo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq)));
      const __m512i x_hi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)));
      const __m512i sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, x_lo, lo), x_hi, hi);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(ws, _mm512_set1_ps(x.scales[m * groups + g])),
                               acc[m]);
    }
  };
  const auto finish = [](__m512 acc, int, int64_t, at::BFloat16* out) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    for (int r = 0; r < kTileRows; ++r) {
      const float* l = lanes + 4 * r;
      out[r] = at::BFloat16((l[0] + l[1]) + (l[2] + l[3]));
    }
  };
  tile_loop<M, __m512, 16 * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

// int8 tiles [tiles, K / 16, 4, 16] (a 32-wide step: columns 0-15 of the 4 rows, then their columns 16-31) times
// Q8 rows stored unsigned (q + 128: kQ8Int8Unsigned). Per group two vpdpbusd put in lane 4r + i the exact integer
// sum over columns 4i..4i+3 and 16+4i..16+4i+3 of (q + 128) w for output row r, starting from -128 x the same sums
// of w (two more vpdpbusd per tile and group, shared by the rows), so the lanes hold sum(q w); then times the row's
// group scale into fp32 lanes. At the end each output's 4 lanes are summed in a fixed order, times its row scale.
constexpr bool kQ8Int8Unsigned = true;

template <int M>
void tile_rows_int8(Q8Rows x, const int8_t* w, const float* row_scales, at::BFloat16* y, int64_t K, int64_t N,
                    int64_t tiles) {
  const int64_t groups = K / kQ8Group;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80)), zero = _mm512_setzero_si512();
  const auto step = [=](__m512 (&acc)[M], const int8_t* wt, int64_t, int64_t g) {
    const __m512i lo = _mm512_loadu_si512(wt), hi = _mm512_loadu_si512(wt + 16 * kTileRows);
    const __m512i start = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, offset, lo), offset, hi));
    for (int m = 0; m < M; ++m) {
      const int8_t* xq = x.q + m * K + g * kQ8Group;
      const __m512i x_lo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq)));
      const __m512i x_hi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16)));
      const __m512i sums = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, x_lo, lo), x_hi, hi);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(x.scales[m * groups + g]), acc[m]);
    }
  };
  const auto finish = [=](__m512 acc, int, int64_t t, at::BFloat16* out) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    for (int r = 0; r < kTileRows; ++r) {
      const float* l = lanes + 4 * r;
      out[r] = at::BFloat16(row_scales[t * kTileRows + r] * ((l[0] + l[1]) + (l[2] + l[3])));
    }
  };
  tile_loop<M, __m512, kQ8Group * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

// Widening int8 tiles once per block (for many rows): [tiles, K/16, 4, 16] int8 -> [tiles, K/32, 4, 32] bf16, exact
// (|q| <= 127), so they run tile_rows<uint16_t>'s arithmetic, the same as widening them in registers.
constexpr bool kWidenInt8Blocks = true;
using WideWeight = uint16_t;

inline void widen_int8_block(const int8_t* w, uint16_t* out, int64_t K, int64_t tiles) {
  for (int64_t t = 0; t < tiles; ++t, w += kTileRows * K, out += kTileRows * K)
    for (int64_t k = 0; k < K; k += 32)
      for (int r = 0; r < kTileRows; ++r)
        _mm512_storeu_si512(out + k * kTileRows + 32 * r, weights32(w + k * kTileRows, r));
}

// ---- paged attention rows (cpu_attention.cpp) ----

// bf16 pools: a row is D bf16 values; q . k by dpbf16 on q's bf16 values.
struct Bf16Dot {
  static float dot(const uint16_t* q, const uint8_t* row, int64_t D) {
    const uint16_t* k = reinterpret_cast<const uint16_t*>(row);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 32)
      acc = _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(_mm512_loadu_si512(q + d)),
                             reinterpret_cast<__m512bh>(_mm512_loadu_si512(k + d)));
    return _mm512_reduce_add_ps(acc);
  }
};

// int8 pools: the exact integer dot product of q as int16 with a row's int8 values (madd; |sum| < 2^31).
inline int32_t dot_int16_int8(const int16_t* q, const uint8_t* row, int64_t D) {
  __m512i acc = _mm512_setzero_si512();
  for (int64_t d = 0; d < D; d += 32) {
    const __m512i k = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d)));
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_loadu_si512(q + d), k));
  }
  return _mm512_reduce_add_epi32(acc);
}

inline void store16_int16(int16_t* p, V16 v) {  // round half even, saturated to int16
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(v)));
}

inline float softmax_row(float* scores, int64_t len, float top) {  // in place: exp(s - top); returns their sum
  __m512 total = _mm512_setzero_ps();
  for (int64_t p = 0; p < len; p += 16) {
    const __mmask16 live = len - p >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (len - p)) - 1);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, scores + p), _mm512_set1_ps(top)));
    _mm512_mask_storeu_ps(scores + p, live, e);
    total = _mm512_mask_add_ps(total, live, total, e);
  }
  return _mm512_reduce_add_ps(total);
}

}  // namespace chattts_velocity_cpu
