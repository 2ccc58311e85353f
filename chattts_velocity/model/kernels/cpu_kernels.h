// Shared by the cpu_*.cpp kernels (linked into one library): the ops' C++ entry points, so a fused op can call
// them without the dispatcher, and the AVX-512 helpers they have in common.
#pragma once

#include <ATen/ATen.h>

#include <immintrin.h>

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

// cpu_attention.cpp: one new query per sequence over the paged bf16 KV cache.
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

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

inline void store16(uint16_t* p, __m512 v) {  // rounded to nearest even, as torch's fp32 -> bf16 cast
  const __m256bh rounded = _mm512_cvtneps_pbh(v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<const __m256i&>(rounded));
}

}  // namespace chattts_velocity_cpu
