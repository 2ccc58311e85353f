// Activations of the int4 linear (cpu_linear.cpp linear_int4; kernels.quantize_q8_rows is the same in torch): each
// row of x cut into 32-column groups, each group as int8 values and one fp32 scale, so a group of int4 weights times
// a group of x is an exact integer dot product (vpmaddubsw, vpdpbusd, NEON smull / sdot), scaled once.
//
//   scale = max |x| / 127 over the group (fp32), q = x / scale rounded half to even (0 for an all-zero group).
//
// Every row is quantised on its own, so a row's values never depend on the rows beside it (the seed contract).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace chattts_velocity_cpu {

constexpr int64_t kQ8Group = 32;  // columns per activation scale (= the int4 weights' group)

struct Q8Rows {  // x [M, K] as int8 q [M, K] and scales [M, K / 32]; a view of row m0 on: q + m0 K, scales + m0 K / 32
  const int8_t* q;
  const float* scales;
};

inline float bf16_value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

// Written for the compiler's vectoriser: the largest |x| from the magnitude bits (integer max), which order as |x|
// does for every bf16 but a NaN (NaNs are left out); rounding half to even as v + 1.5 x 2^23 - 1.5 x 2^23 (exact for
// |v| < 2^22; the compiler keeps both operations without -ffast-math), the same as std::nearbyint.
inline void quantize_q8_rows(const uint16_t* x, int64_t M, int64_t K, int8_t* q, float* scales) {
  constexpr float kRound = 12582912.0f;  // 1.5 x 2^23: its ulp is 1
  for (int64_t g = 0; g < M * K / kQ8Group; ++g, x += kQ8Group, q += kQ8Group) {
    int32_t top = 0;
#pragma omp simd reduction(max : top)
    for (int64_t j = 0; j < kQ8Group; ++j) {
      const int32_t magnitude = x[j] & 0x7FFF;
      top = std::max(top, magnitude > 0x7F80 ? 0 : magnitude);
    }
    const float scale = bf16_value(static_cast<uint16_t>(top)) / 127.0f;
    scales[g] = scale;
    if (!(scale > 0.0f)) {
      std::memset(q, 0, kQ8Group);
      continue;
    }
    for (int64_t j = 0; j < kQ8Group; ++j)
      q[j] = static_cast<int8_t>(static_cast<int32_t>((bf16_value(x[j]) / scale + kRound) - kRound));
  }
}

// The activations of weight-only int8 tiles on ISAs with exact int16 dot products (CV_INT8_Q16 in cpu_kernels.h):
// each row of x as int16 q [M, K] with one fp32 scale per row, scale = max |x| / 32767 and q = x * (32767 / max |x|)
// rounded half to even, so |q x scale - x| <= max |x| / 65534 per value, below the bf16 rounding x already carries
// for every value above 1/128 of the row's largest.
struct Q16Rows {  // a view of row m0 on: q + m0 K, scales + m0
  const int16_t* q;
  const float* scales;
};

// q + 128 as unsigned bytes (flipping the sign bit), in place: the unsigned operand of vpdpbusd (kQ8Int8Unsigned,
// kQ8Int4Unsigned).
inline void offset_q8(int8_t* q, int64_t count) {
  for (int64_t i = 0; i < count; ++i) q[i] = static_cast<int8_t>(static_cast<uint8_t>(q[i]) ^ 0x80u);
}

}  // namespace chattts_velocity_cpu
