// Shared by the cpu_*.cpp kernels (linked into one library): the ops' C++ entry points, so a fused op can call
// them without the dispatcher, and the AVX-512 helpers they have in common.
#pragma once

#include <ATen/ATen.h>

#include <immintrin.h>

#include <cstring>
#include <optional>

namespace chattts_velocity_cpu {

// cpu_linear.cpp: y = x @ W.T with W in the tile layout or the AMX panel layout (see there).
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& weight);
at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales);

// cpu_amx.cpp: y = x @ W.T with W in the AMX panel layout (x and y bf16), up to kAmxMaxRows rows per pass.
constexpr int64_t kAmxMaxRows = 64;
bool amx_ready();
at::Tensor linear_bf16_amx(const at::Tensor& x, const at::Tensor& panels);
at::Tensor linear_int8_amx(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& scales);

// KV pools are bf16 [num_blocks, block_size, heads, head_dim], or int8 with one scale per (slot, head): each row is
// head_dim int8 values then the 4 bytes of its fp32 scale, value = int8 * scale, scale = absmax / 127 (symmetric;
// model/attention.py quantize_kv writes the same bytes).
constexpr int64_t kKvScaleBytes = 4;
constexpr int64_t kMaxHeadDim = 256;

inline int64_t kv_head_dim(const at::Tensor& cache) {  // the last dimension without the int8 rows' scale
  return cache.size(3) - (cache.scalar_type() == at::kChar ? kKvScaleBytes : 0);
}

// cpu_attention.cpp: one new query per sequence over the paged bf16 or int8 KV cache.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale);

// exp(x) for x in [-87, 88] (clamped outside): x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-7 polynomial
// (Cephes expf coefficients), times 2^n. Relative error ~2e-7.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load16(const uint16_t* p) {  // 16 bf16 -> 16 fp32 (exact)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

inline __m512 load16_int8(const uint8_t* p) {  // 16 int8 -> 16 fp32 (exact)
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline float kv_row_scale(const uint8_t* row, int64_t D) {  // the fp32 scale after an int8 row's D values
  float scale;
  std::memcpy(&scale, row + D, sizeof scale);
  return scale;
}

// x [D] -> an int8 row: q = round_half_even(x / scale) with scale = absmax / 127 in fp32 (1 as divisor for an
// all-zero row, whose stored scale is 0), then scale's bytes. torch: x / scale and round() give the same q.
template <typename T>
inline void quantize_row(const T* x, uint8_t* row, int64_t D) {
  __m512 top = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) top = _mm512_max_ps(top, _mm512_abs_ps(load16(x + d)));
  const float scale = _mm512_reduce_max_ps(top) / 127.0f;
  const __m512 divisor = _mm512_set1_ps(scale > 0.0f ? scale : 1.0f);
  for (int64_t d = 0; d < D; d += 16) {
    const __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(load16(x + d), divisor));  // MXCSR: round to nearest even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row + d), _mm512_cvtsepi32_epi8(q));
  }
  std::memcpy(row + D, &scale, sizeof scale);
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

inline void store16(uint16_t* p, __m512 v) {  // rounded to nearest even, as torch's fp32 -> bf16 cast
  const __m256bh rounded = _mm512_cvtneps_pbh(v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<const __m256i&>(rounded));
}

}  // namespace chattts_velocity_cpu
