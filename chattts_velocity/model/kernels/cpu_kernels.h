// Shared by the cpu_*.cpp drivers (linked into one library per ISA): the ops' C++ entry points, so a fused op can
// call them without the dispatcher, and the ISA's micro-kernels (isa_<isa>.h, chosen by the compiler flags that
// __init__.py passes for that ISA, on top of isa_common.h; isa_contract.h checks that it defines every name the
// drivers use, with its signature).
//
// The ops live in the namespace CV_OPS (chattts_velocity_<isa>, from -DCV_OPS=...), so libraries of several ISAs
// can be loaded in one process (tests run the AVX2 kernels on an AVX-512 host).
#pragma once

#include <ATen/ATen.h>

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

#define CV_LIBRARY_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)  // expands CV_OPS before pasting
#define CV_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define CV_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

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

}  // namespace chattts_velocity_cpu
