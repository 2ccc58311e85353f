// aarch64 NEON micro-kernels (Apple M-series, Graviton, Ampere): the vector helpers, the tile linear's inner loop
// and the attention's row kernels behind the shared drivers (cpu_*.cpp). One V16 is four float32x4_t.
// Where the compiler targets the BF16 extension (__ARM_FEATURE_BF16_VECTOR_ARITHMETIC: Graviton 3, M2 on), q . k of
// bf16 rows uses BFDOT and fp32 -> bf16 uses BFCVT; elsewhere both are plain NEON. The int4 / int8 linears' integer
// dot products use SDOT where the compiler targets dotprod, else SMULL / SMLAL (exact sums); i8mm is not used.
#pragma once

#include <arm_neon.h>

#include "isa_common.h"

namespace chattts_velocity_cpu {

struct V16 {
  float32x4_t v[4];  // lanes 0-3, 4-7, 8-11, 12-15
};

template <typename F>
inline V16 map2(V16 a, V16 b, F f) {
  return {{f(a.v[0], b.v[0]), f(a.v[1], b.v[1]), f(a.v[2], b.v[2]), f(a.v[3], b.v[3])}};
}

inline V16 v_zero() { return {{vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)}}; }
inline V16 v_set1(float x) { return {{vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x)}}; }
inline V16 v_add(V16 a, V16 b) { return map2(a, b, [](float32x4_t x, float32x4_t y) { return vaddq_f32(x, y); }); }
inline V16 v_sub(V16 a, V16 b) { return map2(a, b, [](float32x4_t x, float32x4_t y) { return vsubq_f32(x, y); }); }
inline V16 v_mul(V16 a, V16 b) { return map2(a, b, [](float32x4_t x, float32x4_t y) { return vmulq_f32(x, y); }); }
inline V16 v_div(V16 a, V16 b) { return map2(a, b, [](float32x4_t x, float32x4_t y) { return vdivq_f32(x, y); }); }
inline V16 v_max(V16 a, V16 b) { return map2(a, b, [](float32x4_t x, float32x4_t y) { return vmaxq_f32(x, y); }); }
inline V16 v_fmadd(V16 a, V16 b, V16 c) {  // a * b + c
  for (int i = 0; i < 4; ++i) c.v[i] = vfmaq_f32(c.v[i], a.v[i], b.v[i]);
  return c;
}
inline V16 v_abs(V16 a) {
  for (auto& x : a.v) x = vabsq_f32(x);
  return a;
}
inline float reduce_add(V16 a) { return vaddvq_f32(vaddq_f32(vaddq_f32(a.v[0], a.v[1]), vaddq_f32(a.v[2], a.v[3]))); }
inline float reduce_max(V16 a) { return vmaxvq_f32(vmaxq_f32(vmaxq_f32(a.v[0], a.v[1]), vmaxq_f32(a.v[2], a.v[3]))); }

struct ExpOps {  // exp_cephes's operations on one float32x4_t
  using Vec = float32x4_t;
  static Vec set1(float a) { return vdupq_n_f32(a); }
  static Vec add(Vec a, Vec b) { return vaddq_f32(a, b); }
  static Vec mul(Vec a, Vec b) { return vmulq_f32(a, b); }
  static Vec min(Vec a, Vec b) { return vminq_f32(a, b); }
  static Vec max(Vec a, Vec b) { return vmaxq_f32(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return vfmaq_f32(c, a, b); }
  static Vec fnmadd(Vec a, Vec b, Vec c) { return vfmsq_f32(c, a, b); }
  static Vec round(Vec a) { return vrndnq_f32(a); }
  static Vec ldexp(Vec p, Vec n) {  // 2^n built in the exponent bits (n + 127 in 1..254: a normal float)
    return vmulq_f32(p, vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23)));
  }
};

inline float32x4_t exp4(float32x4_t x) { return exp_cephes<ExpOps>(x); }

inline V16 exp_ps(V16 x) {
  for (auto& v : x.v) v = exp4(v);
  return x;
}

inline V16 load16(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }

inline void bf16x8(const uint16_t* p, float32x4_t* out) {  // 8 bf16 -> 8 fp32 (exact)
  const uint16x8_t v = vld1q_u16(p);
  out[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16));
  out[1] = vreinterpretq_f32_u32(vshll_high_n_u16(v, 16));
}

inline V16 load16(const uint16_t* p) {
  V16 out;
  bf16x8(p, out.v);
  bf16x8(p + 8, out.v + 2);
  return out;
}

inline void int8x16(int8x16_t q, float32x4_t* out) {  // 16 int8 -> 16 fp32 (exact)
  const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
  out[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
  out[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
  out[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
  out[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

inline V16 load16_int8(const uint8_t* p) {
  V16 out;
  int8x16(vld1q_s8(reinterpret_cast<const int8_t*>(p)), out.v);
  return out;
}

inline void store16(float* p, V16 v) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, v.v[i]);
}

inline uint16x4_t bf16x4(float32x4_t v) {  // fp32 -> bf16, round to nearest even (finite values)
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
  return vreinterpret_u16_bf16(vcvt_bf16_f32(v));
#else
  const uint32x4_t bits = vreinterpretq_u32_f32(v);
  const uint32x4_t odd = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
  return vshrn_n_u32(vaddq_u32(bits, vaddq_u32(odd, vdupq_n_u32(0x7FFF))), 16);
#endif
}

inline void store16(uint16_t* p, V16 v) {  // rounded to nearest even, as torch's fp32 -> bf16 cast
  for (int i = 0; i < 4; ++i) vst1_u16(p + 4 * i, bf16x4(v.v[i]));
}

inline int16x8_t int16x8(float32x4_t a, float32x4_t b) {  // round half even, saturated to int16
  return vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(a)), vqmovn_s32(vcvtnq_s32_f32(b)));
}

inline void store16_int8(uint8_t* p, V16 v) {  // round half even, saturated to int8
  const int8x16_t q = vcombine_s8(vqmovn_s16(int16x8(v.v[0], v.v[1])), vqmovn_s16(int16x8(v.v[2], v.v[3])));
  vst1q_s8(reinterpret_cast<int8_t*>(p), q);
}

inline void store16_int16(int16_t* p, V16 v) {
  vst1q_s16(p, int16x8(v.v[0], v.v[1]));
  vst1q_s16(p + 8, int16x8(v.v[2], v.v[3]));
}

// ---- tile linear (cpu_linear.cpp): rows of x times weight tiles [tiles, K / C, 4, C] ----

constexpr int64_t kRowGroup = 4;     // rows of x per pass: 16 accumulators + 8 weight vectors of 32 registers
constexpr int64_t kQ8RowGroup = 4;   // tile_rows_int4's rows per pass
constexpr int64_t kPrefetch = 2048;  // bytes ahead of the stream

using Activations = const float*;  // x [M, K] as fp32, natural order

inline Activations prepare_activations(const uint16_t* x, int64_t M, int64_t K, std::vector<float>& buffer, bool) {
  buffer.resize(static_cast<size_t>(M * K));
  for (int64_t i = 0; i < M * K; i += 16) store16(buffer.data() + i, load16(x + i));
  return buffer.data();
}

// The 32 weights of row r at a step as 8 x 4 fp32, natural order.
inline void weights32(const uint16_t* wt, int r, float32x4_t w[8]) {
  for (int i = 0; i < 4; ++i) bf16x8(wt + 32 * r + 8 * i, w + 2 * i);
}

inline void weights32(const int8_t* wt, int r, float32x4_t w[8]) {  // int8 tiles: two [4, 16] chunks per step
  int8x16(vld1q_s8(wt + 16 * r), w);
  int8x16(vld1q_s8(wt + 16 * kTileRows + 16 * r), w + 4);
}

// Rows x[0, M) times `tiles` consecutive weight tiles (tile_loop): y[m * N + 4 t + r] = (row_scales[4 t + r] *) the
// sum, fp32 FMAs into one accumulator per (row, output).
template <int M, typename W>
void tile_rows(Activations x, const W* w, const float* row_scales, at::BFloat16* y, int64_t K, int64_t N,
               int64_t tiles) {
  using Acc = float32x4_t[kTileRows];
  const auto step = [=](Acc (&acc)[M], const W* wt, int64_t, int64_t s) {
    for (int r = 0; r < kTileRows; ++r) {
      float32x4_t wv[8];
      weights32(wt, r, wv);
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * K + 32 * s;
        for (int j = 0; j < 8; ++j) acc[m][r] = vfmaq_f32(acc[m][r], wv[j], vld1q_f32(xm + 4 * j));
      }
    }
  };
  const auto finish = [=](const Acc& acc, int, int64_t t, at::BFloat16* out) {
    for (int r = 0; r < kTileRows; ++r) out[r] = scaled_output(vaddvq_f32(acc[r]), row_scales, t, r);
  };
  tile_loop<M, Acc, step_bytes<W>() * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

// sum(q x) of 32 int8 / int4 weights (two int8x16: columns 0-15, 16-31) and 32 int8 activations in 4 int32 lanes,
// exact: SDOT, else SMULL / SMLAL (2 products <= 128 x 127 per int16 lane) and pairwise widening adds.
inline int32x4_t group_dot(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, x0), w1, x1);
#else
  const int16x8_t lo = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0);
  const int16x8_t hi = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1);
  return vpadalq_s16(vpaddlq_s16(lo), hi);
#endif
}

// int4 tiles [tiles, K / 32, 4, 16] (byte j of a row's group: q + 8 of column j in its low nibble, of column j + 16
// in its high one) times Q8 rows: per group the exact integer sum(q x) (group_dot), times the weight's group scale
// and the row's, into 4 fp32 lanes per (row, output) in a fixed order at every M.
template <int M>
void tile_rows_int4(Q8Rows x, const uint8_t* w, const float* group_scales, at::BFloat16* y, int64_t K, int64_t N,
                    int64_t tiles) {
  const int64_t groups = K / kQ8Group;
  const int8x16_t eight = vdupq_n_s8(8);
  using Acc = float32x4_t[kTileRows];
  const auto step = [=](Acc (&acc)[M], const uint8_t* wt, int64_t t, int64_t g) {
    for (int r = 0; r < kTileRows; ++r) {
      const uint8x16_t packed = vld1q_u8(wt + 16 * r);
      const int8x16_t low = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(packed, vdupq_n_u8(0x0F))), eight);
      const int8x16_t high = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(packed, 4)), eight);
      const float ws = group_scales[(t * groups + g) * kTileRows + r];
      for (int m = 0; m < M; ++m) {
        const int8_t* xq = x.q + m * K + g * kQ8Group;
        const int32x4_t sums = group_dot(low, high, vld1q_s8(xq), vld1q_s8(xq + 16));
        acc[m][r] = vfmaq_n_f32(acc[m][r], vcvtq_f32_s32(sums), ws * x.scales[m * groups + g]);
      }
    }
  };
  const auto finish = [](const Acc& acc, int, int64_t, at::BFloat16* out) {
    for (int r = 0; r < kTileRows; ++r) out[r] = at::BFloat16(vaddvq_f32(acc[r]));
  };
  tile_loop<M, Acc, 16 * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

// int8 tiles [tiles, K / 16, 4, 16] (per 32-wide step columns 0-15 of the 4 rows, then 16-31) times Q8 rows: per
// group group_dot times the row's group scale into 4 fp32 lanes per (row, output), fixed order at every M; at the
// end the lanes' sum times the output's row scale.
constexpr bool kQ8Int8Unsigned = false;
constexpr bool kQ8Int4Unsigned = false;  // tile_rows_int4 takes x's Q8 rows as they are

template <int M>
void tile_rows_int8(Q8Rows x, const int8_t* w, const float* row_scales, at::BFloat16* y, int64_t K, int64_t N,
                    int64_t tiles) {
  const int64_t groups = K / kQ8Group;
  using Acc = float32x4_t[kTileRows];
  const auto step = [=](Acc (&acc)[M], const int8_t* wt, int64_t, int64_t g) {
    for (int r = 0; r < kTileRows; ++r) {
      const int8x16_t w0 = vld1q_s8(wt + 16 * r), w1 = vld1q_s8(wt + 16 * kTileRows + 16 * r);
      for (int m = 0; m < M; ++m) {
        const int8_t* xq = x.q + m * K + g * kQ8Group;
        const int32x4_t sums = group_dot(w0, w1, vld1q_s8(xq), vld1q_s8(xq + 16));
        acc[m][r] = vfmaq_n_f32(acc[m][r], vcvtq_f32_s32(sums), x.scales[m * groups + g]);
      }
    }
  };
  const auto finish = [=](const Acc& acc, int, int64_t t, at::BFloat16* out) {
    for (int r = 0; r < kTileRows; ++r) out[r] = at::BFloat16(row_scales[t * kTileRows + r] * vaddvq_f32(acc[r]));
  };
  tile_loop<M, Acc, kQ8Group * kTileRows, kPrefetch>(w, y, K, N, tiles, step, finish);
}

constexpr bool kWidenInt8Blocks = false;  // int8 tiles widen in registers at every M here (no block buffer)
using WideWeight = int8_t;
inline void widen_int8_block(const int8_t*, int8_t*, int64_t, int64_t) {}

// ---- paged attention rows (cpu_attention.cpp) ----

struct Bf16Dot {  // q . k of bf16 rows in fp32 (products exact; BFDOT where the BF16 extension is targeted)
  static float dot(const uint16_t* q, const uint8_t* row, int64_t D) {
    const uint16_t* k = reinterpret_cast<const uint16_t*>(row);
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t d = 0; d < D; d += 8)
      acc = vbfdotq_f32(acc, vreinterpretq_bf16_u16(vld1q_u16(q + d)), vreinterpretq_bf16_u16(vld1q_u16(k + d)));
    return vaddvq_f32(acc);
#else
    V16 acc = v_zero();
    for (int64_t d = 0; d < D; d += 16) acc = v_fmadd(load16(q + d), load16(k + d), acc);
    return reduce_add(acc);
#endif
  }
};

inline int32_t dot_int16_int8(const int16_t* q, const uint8_t* row, int64_t D) {  // exact (|sum| < 2^31)
  int32x4_t acc = vdupq_n_s32(0);
  for (int64_t d = 0; d < D; d += 16) {
    const int8x16_t k = vld1q_s8(reinterpret_cast<const int8_t*>(row + d));
    const int16x8_t k0 = vmovl_s8(vget_low_s8(k)), k1 = vmovl_high_s8(k);
    const int16x8_t q0 = vld1q_s16(q + d), q1 = vld1q_s16(q + d + 8);
    acc = vmlal_s16(acc, vget_low_s16(q0), vget_low_s16(k0));
    acc = vmlal_high_s16(acc, q0, k0);
    acc = vmlal_s16(acc, vget_low_s16(q1), vget_low_s16(k1));
    acc = vmlal_high_s16(acc, q1, k1);
  }
  return vaddvq_s32(acc);
}

inline float softmax_row(float* scores, int64_t len, float top) {  // in place: exp(s - top); returns their sum
  float32x4_t total = vdupq_n_f32(0);
  const float32x4_t shift = vdupq_n_f32(top);
  int64_t p = 0;
  for (; p + 4 <= len; p += 4) {
    const float32x4_t e = exp4(vsubq_f32(vld1q_f32(scores + p), shift));
    vst1q_f32(scores + p, e);
    total = vaddq_f32(total, e);
  }
  return softmax_tail<4>(scores, p, len, vaddvq_f32(total),
                         [&](float* tail) { vst1q_f32(tail, exp4(vsubq_f32(vld1q_f32(tail), shift))); });
}

}  // namespace chattts_velocity_cpu
