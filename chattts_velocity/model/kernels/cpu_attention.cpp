// Decode attention over the paged bf16 or int8 KV cache on x86 CPUs with AVX-512 BF16: one new query per sequence.
//
//   paged_decode_attention(q [B, H, D], k_cache, v_cache [num_blocks, block_size, H, D], block_tables [B, n],
//                          context_lens [B], scale) -> [B, H, D]; q and output bf16, tables int64, caches bf16
//                          or int8 [num_blocks, block_size, H, D + kKvScaleBytes] (row layout: cpu_kernels.h).
//
// int8 rows (Int8Rows) are never dequantised in memory: q . k = scale_q * scale_k * (q_int16 . k_int8), an integer
// dot product, and V's scale is folded into its softmax weight. Half the bytes of bf16 rows, so at long contexts
// (32 x 300 positions: attention reads ~ as much as the weights) the step is shorter. The bf16 path (Bf16Rows) is
// the one before the template, instruction for instruction.
// Per (sequence, head): scores q.k in fp32 (bf16 products are exact in fp32), softmax in fp32 with a vectorised
// exp, then the weighted sum of V in fp32, rounded to bf16 once. The blocks are read in place, K once and V once.
// A task takes several heads of one sequence (all of them when there are enough sequences), so each position's
// rows are one contiguous run and a block (block_size x heads x head_dim) streams from memory; rows are also
// prefetched ahead. Against torch.compile's fused gather + reductions (same arithmetic): 2.7-3.2x faster at
// 32 sequences x 100-300 positions and at one sequence, ~9.5 GB/s on a host that streams 14.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu_kernels.h"

#include <limits>
#include <vector>

namespace chattts_velocity_cpu {
namespace {

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

inline void prefetch_row(const uint8_t* row, int64_t bytes) {
  for (int64_t d = 0; d < bytes; d += 64) _mm_prefetch(reinterpret_cast<const char*>(row + d), _MM_HINT_T0);
}

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

// bf16 pools: a row is D bf16 values; q . k by dpbf16 on q's bf16 values.
struct Bf16Rows {
  static constexpr int64_t kAhead = 8;  // positions prefetched ahead: one (position, head) row is a strided 2-line read
  static int64_t bytes(int64_t D) { return 2 * D; }
  static void prepare(const uint16_t*, int64_t, int64_t, Scratch&) {}
  static float dot(const uint16_t* q, const Scratch&, int64_t, const uint8_t* row, int64_t D) {
    const uint16_t* k = reinterpret_cast<const uint16_t*>(row);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 32)
      acc = _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(_mm512_loadu_si512(q + d)),
                             reinterpret_cast<__m512bh>(_mm512_loadu_si512(k + d)));
    return _mm512_reduce_add_ps(acc);
  }
  static void add_weighted(float weight, const uint8_t* row, float* acc, int64_t D) {  // acc += weight * v
    const uint16_t* v = reinterpret_cast<const uint16_t*>(row);
    const __m512 w = _mm512_set1_ps(weight);
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(w, load16(v + d), _mm512_loadu_ps(acc + d)));
  }
};

// int8 pools: a row is D int8 values and their fp32 scale. q . k is an exact integer dot product (madd of int16 q
// with the widened int8 k; |sum| <= 256 * 32767 * 127 < 2^31) times both scales. q is quantised to int16 once per
// task: error <= 2^-16 of its absmax, far below its own bf16 rounding.
struct Int8Rows {
  static constexpr int64_t kAhead = 16;  // about as many bytes ahead as bf16's 8 positions (measured 1.15x over 8)
  static int64_t bytes(int64_t D) { return D + kKvScaleBytes; }
  static void prepare(const uint16_t* q, int64_t G, int64_t D, Scratch& s) {
    s.query.resize(static_cast<size_t>(G * D));
    s.query_scale.resize(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      __m512 top = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 16) top = _mm512_max_ps(top, _mm512_abs_ps(load16(q + g * D + d)));
      const float scale = _mm512_reduce_max_ps(top) / 32767.0f;
      const __m512 divisor = _mm512_set1_ps(scale > 0.0f ? scale : 1.0f);
      for (int64_t d = 0; d < D; d += 16) {
        const __m512i qi = _mm512_cvtps_epi32(_mm512_div_ps(load16(q + g * D + d), divisor));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.query.data() + g * D + d), _mm512_cvtsepi32_epi16(qi));
      }
      s.query_scale[g] = scale;
    }
  }
  static float dot(const uint16_t*, const Scratch& s, int64_t g, const uint8_t* row, int64_t D) {
    const int16_t* q = s.query.data() + g * D;
    __m512i acc = _mm512_setzero_si512();
    for (int64_t d = 0; d < D; d += 32) {
      const __m512i k = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d)));
      acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_loadu_si512(q + d), k));
    }
    return static_cast<float>(_mm512_reduce_add_epi32(acc)) * (s.query_scale[g] * kv_row_scale(row, D));
  }
  static void add_weighted(float weight, const uint8_t* row, float* acc, int64_t D) {  // acc += weight * scale * v
    const __m512 w = _mm512_set1_ps(weight * kv_row_scale(row, D));
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(acc + d, _mm512_fmadd_ps(w, load16_int8(row + d), _mm512_loadu_ps(acc + d)));
  }
};

float softmax_row(float* scores, int64_t len, float top) {  // in place: exp(s - top); returns their sum
  __m512 total = _mm512_setzero_ps();
  for (int64_t p = 0; p < len; p += 16) {
    const __mmask16 live = len - p >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (len - p)) - 1);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, scores + p), _mm512_set1_ps(top)));
    _mm512_mask_storeu_ps(scores + p, live, e);
    total = _mm512_mask_add_ps(total, live, total, e);
  }
  return _mm512_reduce_add_ps(total);
}

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
    const __m512 inv = _mm512_set1_ps(1.0f / s.total[g]);
    for (int64_t d = g * D; d < (g + 1) * D; d += 16) {
      store16(out + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), inv));
    }
  }
}

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

TORCH_LIBRARY_FRAGMENT(chattts_velocity_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(chattts_velocity_cpu, CPU, m) {
  m.impl("paged_decode_attention", &chattts_velocity_cpu::paged_decode_attention);
}
