// The pieces every ISA's micro-kernels share (included first by isa_<isa>.h): the tile layout's constants, the
// prefetch helpers, the tile kernels' loop, exp over an ISA's register operations, the scalar tail of the softmax and
// (x86) the fixed-order sum of 8 lanes. What each ISA header must add is isa_contract.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "q8_rows.h"

#define CV_INLINE inline __attribute__((always_inline))  // shared helpers that must compile into each kernel

namespace chattts_velocity_cpu {

constexpr int64_t kTileRows = 4;  // output rows per weight tile (cpu_linear.cpp's tile layout)

template <typename W>
constexpr int64_t step_bytes() {  // weight bytes of one 32-wide step of one row: bf16 tiles 64, int8 tiles 32
  return std::is_same_v<W, uint16_t> ? 64 : 32;
}

// prefetcht0 on x86, prfm pldl1keep on arm; always inlined: GCC deems a wrapper of __builtin_prefetch free of side
// effects and drops the calls it does not inline
CV_INLINE void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

inline void prefetch_row(const uint8_t* row, int64_t bytes) {
  for (int64_t d = 0; d < bytes; d += 64) prefetch(row + d);
}

template <typename T>
CV_INLINE void zero_fill(T& a) {  // a vector register, or an array of them, set to zero
  if constexpr (std::is_array_v<T>) {
    for (auto& e : a) zero_fill(e);
  } else {
    a = T{};
  }
}

// The loop of every tile kernel (tile_rows, tile_rows_int8, tile_rows_int4, tile_rows_q16): rows x[0, M) times
// `tiles` consecutive weight tiles of K / 32 steps, a step being kStepBytes of weights (the tile's kTileRows rows over
// 32 columns, read once for all M rows). Per tile the rows' accumulators (one Acc each) start at zero; each step
// prefetches kAhead bytes ahead of the stream, then step(acc, weights, tile, step) updates all M of them; then
// finish(acc[m], m, tile, y + m * N + tile * kTileRows) writes row m's kTileRows outputs. The kernels keep each row's
// arithmetic apart and in the same order at every M (the batch-invariance contract). For GCC to compile this as it
// does a hand-written loop (row loop unrolled, accumulators in registers), the accumulators are zeroed one register
// at a time, step takes them as an array reference (Acc (&)[M]) and the kernels' lambdas capture by value.
template <int M, typename Acc, int64_t kStepBytes, int64_t kAhead, typename W, typename Step, typename Finish>
CV_INLINE void tile_loop(const W* w, at::BFloat16* y, int64_t K, int64_t N, int64_t tiles, const Step& step,
                         const Finish& finish) {
  constexpr int64_t kStep = kStepBytes / sizeof(W);  // W elements per step
  const int64_t steps = K / 32;
  for (int64_t t = 0; t < tiles; ++t) {
    Acc acc[M];
    for (auto& a : acc) zero_fill(a);
    const W* wt = w + t * steps * kStep;
    for (int64_t s = 0; s < steps; ++s, wt += kStep) {
      for (int64_t line = 0; line < kStepBytes; line += 64) prefetch(reinterpret_cast<const char*>(wt) + kAhead + line);
      step(acc, wt, t, s);
    }
    for (int m = 0; m < M; ++m) finish(acc[m], m, t, y + m * N + t * kTileRows);
  }
}

// tile_rows' outputs: the sum, times the row's scale where the weights have one (int8 tiles).
inline at::BFloat16 scaled_output(float sum, const float* row_scales, int64_t t, int r) {
  return at::BFloat16(row_scales ? row_scales[t * kTileRows + r] * sum : sum);
}

// exp(x) for x in [-87, 88] (clamped outside) on one register of fp32 lanes; Ops is the ISA's operations on it
// (set1, add, mul, min, max, fmadd: a * b + c, fnmadd: c - a * b, round: to nearest integer, ldexp: p * 2^n for
// integral n in -126..127). x = n ln2 + r, |r| <= ln2 / 2 (ln2 in two parts: n * the first is exact), e^r by a
// degree-7 polynomial (Cephes expf coefficients), times 2^n. Relative error ~2e-7.
template <typename Ops>
CV_INLINE typename Ops::Vec exp_cephes(typename Ops::Vec x) {
  using V = typename Ops::Vec;
  x = Ops::min(Ops::max(x, Ops::set1(-87.0f)), Ops::set1(88.0f));
  const V n = Ops::round(Ops::mul(x, Ops::set1(1.44269504088896341f)));
  V r = Ops::fnmadd(n, Ops::set1(0.693359375f), x);
  r = Ops::fnmadd(n, Ops::set1(-2.12194440e-4f), r);
  V p = Ops::set1(1.9875691500e-4f);  // e^r = 1 + r + r^2 p(r), p by Horner's rule
  p = Ops::fmadd(p, r, Ops::set1(1.3981999507e-3f));
  p = Ops::fmadd(p, r, Ops::set1(8.3334519073e-3f));
  p = Ops::fmadd(p, r, Ops::set1(4.1665795894e-2f));
  p = Ops::fmadd(p, r, Ops::set1(1.6666665459e-1f));
  p = Ops::fmadd(p, r, Ops::set1(5.0000001201e-1f));
  p = Ops::fmadd(p, Ops::mul(r, r), Ops::add(r, Ops::set1(1.0f)));
  return Ops::ldexp(p, n);
}

#if defined(__AVX2__)
inline float hsum8(__m256 v) {  // fixed order: (lo4 + hi4), then pairs
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// softmax_row's last len - p (< Lanes) scores through a zero-padded buffer: exp_lanes(buffer) applies exp(s - top)
// to all Lanes values in place; the padding lanes are left out of the sum, which adds the live ones to `sum` in order.
template <int Lanes, typename ExpLanes>
inline float softmax_tail(float* scores, int64_t p, int64_t len, float sum, ExpLanes&& exp_lanes) {
  if (p >= len) return sum;
  alignas(64) float tail[Lanes] = {};
  std::memcpy(tail, scores + p, (len - p) * sizeof(float));
  exp_lanes(tail);
  for (int64_t i = 0; i < len - p; ++i) sum += tail[i];
  std::memcpy(scores + p, tail, (len - p) * sizeof(float));
  return sum;
}

}  // namespace chattts_velocity_cpu
