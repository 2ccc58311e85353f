// The paged decode attention of one sequence's heads, and the KV row format, on the ISA's micro-kernels
// (V16, Bf16Dot, dot_int16_int8, softmax_row from isa_<isa>.h). Needs no torch: cpu_attention.cpp wraps it as an op
// and tests/model/kernels_harness.cpp checks it under qemu for aarch64.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace chattts_velocity_cpu {

// KV pools are bf16 [num_blocks, block_size, heads, head_dim], or int8 with one scale per (slot, head): each row is
// head_dim int8 values then the 4 bytes of its fp32 scale, value = int8 * scale, scale = absmax / 127 (symmetric;
// model/attention.py quantize_kv writes the same bytes).
constexpr int64_t kKvScaleBytes = 4;
constexpr int64_t kMaxHeadDim = 256;

inline float kv_row_scale(const uint8_t* row, int64_t D) {  // the fp32 scale after an int8 row's D values
  float scale;
  std::memcpy(&scale, row + D, sizeof scale);
  return scale;
}

// x [D] -> an int8 row: q = round_half_even(x / scale) with scale = absmax / 127 in fp32 (1 as divisor for an
// all-zero row, whose stored scale is 0), then scale's bytes. torch: x / scale and round() give the same q.
template <typename T>
inline void quantize_row(const T* x, uint8_t* row, int64_t D) {
  V16 top = v_zero();
  for (int64_t d = 0; d < D; d += 16) top = v_max(top, v_abs(load16(x + d)));
  const float scale = reduce_max(top) / 127.0f;
  const V16 divisor = v_set1(scale > 0.0f ? scale : 1.0f);
  for (int64_t d = 0; d < D; d += 16) store16_int8(row + d, v_div(load16(x + d), divisor));
  std::memcpy(row + D, &scale, sizeof scale);
}

struct Paged {
  const uint8_t* k;
  const uint8_t* v;
  const int64_t* tables;
  int64_t width, block_size, heads, dim, row_bytes;  // row_bytes: one (position, head) row of the pool

  int64_t row(int64_t b, int64_t p, int64_t h) const {  // byte offset of position p, head h of sequence b
    const int64_t block = tables[b * width + p / block_size];
    return ((block * block_size + p % block_size) * heads + h) * row_bytes;
  }
};

// Heads h0 .. h0+G-1 of sequence b. Position p's rows of those heads are contiguous (G * D values; the whole block
// when G = H), so each pass streams memory instead of hopping one strided row at a time.
struct Scratch {
  std::vector<float> scores;       // [G, stride]
  std::vector<float> acc;          // [G, D]
  std::vector<float> top;          // [G], the row maxima
  std::vector<float> total;        // [G], the softmax denominators
  std::vector<int16_t> query;      // [G, D], q as int16 (int8 rows only)
  std::vector<float> query_scale;  // [G], q = int16 * query_scale
};

// bf16 pools: a row is D bf16 values; q . k in fp32 on q's bf16 values.
struct Bf16Rows {
  static constexpr int64_t kAhead = 8;  // positions prefetched ahead: one (position, head) row is a strided 2-line read
  static int64_t bytes(int64_t D) { return 2 * D; }
  static void prepare(const uint16_t*, int64_t, int64_t, Scratch&) {}
  static float dot(const uint16_t* q, const Scratch&, int64_t, const uint8_t* row, int64_t D) {
    return Bf16Dot::dot(q, row, D);
  }
  static void add_weighted(float weight, const uint8_t* row, float* acc, int64_t D) {  // acc += weight * v
    const uint16_t* v = reinterpret_cast<const uint16_t*>(row);
    const V16 w = v_set1(weight);
    for (int64_t d = 0; d < D; d += 16) store16(acc + d, v_fmadd(w, load16(v + d), load16(acc + d)));
  }
};

// int8 pools: a row is D int8 values and their fp32 scale. q . k is an exact integer dot product (int16 q with the
// widened int8 k; |sum| <= 256 * 32767 * 127 < 2^31) times both scales. q is quantised to int16 once per task:
// error <= 2^-16 of its absmax, far below its own bf16 rounding. int8 rows are never dequantised in memory.
struct Int8Rows {
  static constexpr int64_t kAhead = 16;  // about as many bytes ahead as bf16's 8 positions (measured 1.15x over 8)
  static int64_t bytes(int64_t D) { return D + kKvScaleBytes; }
  static void prepare(const uint16_t* q, int64_t G, int64_t D, Scratch& s) {
    s.query.resize(static_cast<size_t>(G * D));
    s.query_scale.resize(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      V16 top = v_zero();
      for (int64_t d = 0; d < D; d += 16) top = v_max(top, v_abs(load16(q + g * D + d)));
      const float scale = reduce_max(top) / 32767.0f;
      const V16 divisor = v_set1(scale > 0.0f ? scale : 1.0f);
      for (int64_t d = 0; d < D; d += 16)
        store16_int16(s.query.data() + g * D + d, v_div(load16(q + g * D + d), divisor));
      s.query_scale[g] = scale;
    }
  }
  static float dot(const uint16_t*, const Scratch& s, int64_t g, const uint8_t* row, int64_t D) {
    const int32_t sum = dot_int16_int8(s.query.data() + g * D, row, D);
    return static_cast<float>(sum) * (s.query_scale[g] * kv_row_scale(row, D));
  }
  static void add_weighted(float weight, const uint8_t* row, float* acc, int64_t D) {  // acc += weight * scale * v
    const V16 w = v_set1(weight * kv_row_scale(row, D));
    for (int64_t d = 0; d < D; d += 16) store16(acc + d, v_fmadd(w, load16_int8(row + d), load16(acc + d)));
  }
};

// Per (sequence, head): scores q.k in fp32, softmax in fp32 with a vectorised exp, then the weighted sum of V in fp32,
// rounded to bf16 once into out [G, D]. The blocks are read in place, K once and V once, prefetched ahead.
template <typename Rows>
void attend_heads(const Paged& c, const uint16_t* q, uint16_t* out, int64_t b, int64_t h0, int64_t G, int64_t len,
                  float scale, Scratch& s) {
  const int64_t D = c.dim, R = c.row_bytes, stride = (len + 15) / 16 * 16, span = G * D;
  Rows::prepare(q, G, D, s);
  s.scores.resize(static_cast<size_t>(G * stride));
  s.top.assign(static_cast<size_t>(G), -std::numeric_limits<float>::infinity());
  for (int64_t p = 0; p < len; ++p) {
    if (p + Rows::kAhead < len) prefetch_row(c.k + c.row(b, p + Rows::kAhead, h0), G * R);
    const uint8_t* k = c.k + c.row(b, p, h0);
    for (int64_t g = 0; g < G; ++g) {
      const float score = Rows::dot(q + g * D, s, g, k + g * R, D) * scale;
      s.scores[g * stride + p] = score;
      s.top[g] = std::max(s.top[g], score);
    }
  }
  s.total.resize(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) s.total[g] = softmax_row(s.scores.data() + g * stride, len, s.top[g]);
  s.acc.assign(static_cast<size_t>(span), 0.0f);
  float* acc = s.acc.data();
  for (int64_t p = 0; p < len; ++p) {
    if (p + Rows::kAhead < len) prefetch_row(c.v + c.row(b, p + Rows::kAhead, h0), G * R);
    const uint8_t* v = c.v + c.row(b, p, h0);
    for (int64_t g = 0; g < G; ++g) Rows::add_weighted(s.scores[g * stride + p], v + g * R, acc + g * D, D);
  }
  for (int64_t g = 0; g < G; ++g) {
    const V16 inv = v_set1(1.0f / s.total[g]);
    for (int64_t d = g * D; d < (g + 1) * D; d += 16) store16(out + d, v_mul(load16(acc + d), inv));
  }
}

}  // namespace chattts_velocity_cpu
