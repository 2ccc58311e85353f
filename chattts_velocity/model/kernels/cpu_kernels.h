// Shared by the cpu_*.cpp drivers (linked into one library per ISA): the ops' C++ entry points, so a fused op can
// call them without the dispatcher, and the ISA's micro-kernels (isa_<isa>.h, chosen by the compiler flags that
// __init__.py passes for that ISA, on top of isa_common.h; isa_contract.h checks that it defines every name the
// drivers use, with its signature).
//
// The ops live in the namespace CV_OPS (chattts_velocity_<isa>, from -DCV_OPS=...), so libraries of several ISAs
// can be loaded in one process (tests run the AVX2 kernels on an AVX-512 host).
#pragma once

// The light ATen headers (tensor methods, the ops the drivers call): ATen/ATen.h and torch/library.h cost seconds of
// parsing per driver, so only cpu_register.cpp includes torch/library.h.
#include <ATen/Parallel.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <cstring>
#include <optional>

#if defined(__AVX512BF16__)
#include "isa_avx512.h"
#include "isa_avx512_q16.h"
#define CV_HAS_AMX 1
#define CV_INT8_Q16 1  // linear_int8's tiles times x's Q16 rows (isa_avx512_q16.h)
#elif defined(__AVX2__) && defined(__FMA__)
#include "isa_avx2.h"
#include "isa_avx2_q16.h"
#define CV_HAS_AMX 0
#define CV_INT8_Q16 1
#elif defined(__aarch64__)
#include "isa_neon.h"
#define CV_HAS_AMX 0
#define CV_INT8_Q16 0
#else
#error "no micro-kernels for this ISA: build with AVX-512 BF16, AVX2 + FMA or for aarch64"
#endif

#include "isa_contract.h"
#include "attention_rows.h"

namespace chattts_velocity_cpu {

// cpu_linear.cpp: y = x @ W.T with W in the tile layout or the AMX panel layout (see there).
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& weight);
at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales);
at::Tensor linear_int8_q8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales);
at::Tensor linear_int4(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales);

// cpu_amx.cpp (AVX-512 library only): y = x @ W.T with W in the AMX panel layout, up to kAmxMaxRows rows per pass.
constexpr int64_t kAmxMaxRows = 64;
bool amx_ready();
at::Tensor linear_bf16_amx(const at::Tensor& x, const at::Tensor& panels);
at::Tensor linear_int8_amx(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& scales);

inline int64_t kv_head_dim(const at::Tensor& cache) {  // the last dimension without the int8 rows' scale
  return cache.size(3) - (cache.scalar_type() == at::kChar ? kKvScaleBytes : 0);
}

// cpu_attention.cpp: one new query per sequence over the paged bf16 or int8 KV cache.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale);

// cpu_decode_layer.cpp: one fused decode layer (norm, q|k|v + RoPE + KV store, attention, o, norm, gate|up, down).
at::Tensor decode_layer(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& norms, at::TensorList weights,
                        const c10::List<std::optional<at::Tensor>>& scales,
                        at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping,
                        const at::Tensor& block_tables, const at::Tensor& context_lens, double eps, bool int8_q8);

// cpu_heads.cpp: the code and text heads' GEMM.
at::Tensor head_linear(const at::Tensor& x, const at::Tensor& weight);

// cpu_audio.cpp: the Vocos block's depthwise conv + LayerNorm, and x += gamma * y in place.
at::Tensor dwconv_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t dilation,
                       const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps);
at::Tensor scale_add_(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma);
void dwconv_norm_frames(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t dilation,
                        const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps, const int64_t* offsets,
                        int64_t rows, float* y);

// cpu_audio_linear.cpp: the audio linears on 16-bit weights in fp32 arithmetic, and dwconv_norm per row, float32 out.
at::Tensor audio_linear(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& bias, int64_t n, bool gelu);
at::Tensor audio_linear_add_(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& panels,
                             const at::Tensor& bias, const at::Tensor& gamma);
at::Tensor dwconv_norm_rows(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& weight,
                            const at::Tensor& bias, int64_t dilation, const at::Tensor& norm_weight,
                            const at::Tensor& norm_bias, double eps);

// cpu_sampling.cpp: penalties, temperature, top-p / top-k and the seeded draw, one row per sequence and code.
at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& temperatures, const at::Tensor& penalties,
                       const at::Tensor& history, const at::Tensor& top_p, const at::Tensor& top_k,
                       const at::Tensor& mask_eos, const at::Tensor& eos_ids, const at::Tensor& seeds,
                       int64_t rows_per_seq);

}  // namespace chattts_velocity_cpu
