// Decode attention over the paged bf16 or int8 KV cache: one new query per sequence (the op around attention_rows.h).
//
//   paged_decode_attention(q [B, H, D], k_cache, v_cache [num_blocks, block_size, H, D], block_tables [B, n],
//                          context_lens [B], scale) -> [B, H, D]; q and output bf16, tables int64, caches bf16
//                          or int8 [num_blocks, block_size, H, D + kKvScaleBytes] (row layout: attention_rows.h).
//
// int8 rows are never dequantised in memory: q . k = scale_q * scale_k * (q_int16 . k_int8), an integer dot product,
// and V's scale is folded into its softmax weight. Half the bytes of bf16 rows, so at long contexts (32 x 300
// positions: attention reads ~ as much as the weights) the step is shorter.
// A task takes several heads of one sequence (all of them when there are enough sequences), so each position's
// rows are one contiguous run and a block (block_size x heads x head_dim) streams from memory. Every head sums in
// the same order whichever task takes it. On AVX-512, against torch.compile's fused gather + reductions (same
// arithmetic): 2.7-3.2x faster at 32 sequences x 100-300 positions and at one sequence, ~9.5 GB/s on a host that
// streams 14.
#include <ATen/Parallel.h>

#include "cpu_kernels.h"

namespace chattts_velocity_cpu {
namespace {

// Heads per task: all of them once there are enough sequences to keep every thread busy, else fewer.
int64_t heads_per_task(int64_t B, int64_t H) {
  const int64_t wanted_tasks = 2 * at::get_num_threads();
  int64_t groups = 1;
  while (B * groups < wanted_tasks && groups < H) {
    ++groups;
    while (H % groups) ++groups;
  }
  return H / groups;
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kBFloat16, "q must be bfloat16 [B, heads, head_dim]");
  const bool int8 = k_cache.scalar_type() == at::kChar;
  TORCH_CHECK(k_cache.dim() == 4 && (int8 || k_cache.scalar_type() == at::kBFloat16) && k_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == k_cache.scalar_type() &&
                  v_cache.is_contiguous(),
              "k_cache and v_cache must be contiguous bfloat16 [num_blocks, block_size, heads, head_dim] "
              "(or int8 [..., head_dim + 4]) of one shape");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  TORCH_CHECK(k_cache.size(2) == H && kv_head_dim(k_cache) == D, "q and the caches disagree on heads / head_dim");
  TORCH_CHECK(D % 32 == 0 && D <= kMaxHeadDim, "head_dim must be a multiple of 32 up to ", kMaxHeadDim);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == B && block_tables.scalar_type() == at::kLong,
              "block_tables must be int64 [B, n]");
  TORCH_CHECK(context_lens.numel() == B && context_lens.scalar_type() == at::kLong, "context_lens must be int64 [B]");
  auto qc = q.contiguous();
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = at::empty_like(qc);
  const Paged cache{reinterpret_cast<const uint8_t*>(k_cache.data_ptr()),
                    reinterpret_cast<const uint8_t*>(v_cache.data_ptr()), tables.data_ptr<int64_t>(),
                    tables.size(1), k_cache.size(1), H, D, int8 ? Int8Rows::bytes(D) : Bf16Rows::bytes(D)};
  const int64_t* len_of = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(len_of[b] >= 1 && len_of[b] <= cache.width * cache.block_size,
                "context_lens[", b, "] = ", len_of[b], " is outside 1..", cache.width * cache.block_size);
  auto qp = reinterpret_cast<const uint16_t*>(qc.data_ptr());
  auto op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t G = heads_per_task(B, H), groups = H / G;
  at::parallel_for(0, B * groups, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / groups, h0 = task % groups * G, offset = (b * H + h0) * D;
      const float s = static_cast<float>(scale);
      if (int8) attend_heads<Int8Rows>(cache, qp + offset, op + offset, b, h0, G, len_of[b], s, scratch);
      else attend_heads<Bf16Rows>(cache, qp + offset, op + offset, b, h0, G, len_of[b], s, scratch);
    }
  });
  return out;
}

}  // namespace chattts_velocity_cpu
