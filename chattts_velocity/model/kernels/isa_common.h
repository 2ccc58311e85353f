// The pieces every ISA's micro-kernels share (included first by isa_<isa>.h): the tile layout's constants, the
// prefetch helpers, the scalar tail of the softmax and (x86) the fixed-order sum of 8 lanes. What each ISA header
// must add is isa_contract.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "q8_rows.h"

namespace chattts_velocity_cpu {

constexpr int64_t kTileRows = 4;  // output rows per weight tile (cpu_linear.cpp's tile layout)

template <typename W>
constexpr int64_t step_bytes() {  // weight bytes of one 32-wide step of one row: bf16 tiles 64, int8 tiles 32
  return std::is_same_v<W, uint16_t> ? 64 : 32;
}

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }  // prefetcht0 on x86, prfm pldl1keep on arm

inline void prefetch_row(const uint8_t* row, int64_t bytes) {
  for (int64_t d = 0; d < bytes; d += 64) prefetch(row + d);
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
