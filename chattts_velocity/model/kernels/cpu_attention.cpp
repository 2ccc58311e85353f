// Decode attention over the paged bf16 KV cache on x86 CPUs with AVX-512 BF16: one new query per sequence.
//
//   paged_decode_attention(q [B, H, D], k_cache, v_cache [num_blocks, block_size, H, D], block_tables [B, n],
//                          context_lens [B], scale) -> [B, H, D]; q, caches and output bf16, tables int64.
//
// Per (sequence, head): scores q.k in fp32 (bf16 products are exact in fp32), softmax in fp32 with a vectorised
// exp, then the weighted sum of V in fp32, rounded to bf16 once. The blocks are read in place, K once and V once,
// with rows prefetched ahead (each (position, head) row is a strided 128-byte read, so without it the loop waits
// on memory latency). Measured against torch.compile's fused gather + reductions, which do the same arithmetic:
// 1.6-1.8x faster at 32 sequences x 100-300 positions, 2.5-5x at one sequence; still ~5 GB/s, latency-bound.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <limits>
#include <vector>

namespace {

constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kAhead = 8;  // positions prefetched ahead: one (position, head) row is a strided 2-line read

// exp(x) for x <= 0 (softmax after subtracting the max): x = n ln2 + r, |r| <= ln2 / 2, e^r by a degree-7
// polynomial (Cephes expf coefficients), times 2^n. Relative error ~2e-7.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
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

inline __m512 load_bf16(const uint16_t* p) {  // 16 bf16 -> 16 fp32 (exact)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

struct Paged {
  const uint16_t* k;
  const uint16_t* v;
  const int64_t* tables;
  int64_t width, block_size, heads, dim;

  int64_t row(int64_t b, int64_t p, int64_t h) const {  // element offset of position p, head h of sequence b
    const int64_t block = tables[b * width + p / block_size];
    return ((block * block_size + p % block_size) * heads + h) * dim;
  }
};

inline void prefetch_row(const uint16_t* row, int64_t dim) {
  for (int64_t d = 0; d < dim; d += 32) _mm_prefetch(reinterpret_cast<const char*>(row + d), _MM_HINT_T0);
}

// One (sequence, head): scores into `scores`, then out = softmax(scores) @ V.
void attend(const Paged& c, const uint16_t* q, uint16_t* out, int64_t b, int64_t h, int64_t len, float scale,
            std::vector<float>& scores) {
  scores.resize(static_cast<size_t>((len + 15) / 16 * 16));
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < len; ++p) {
    if (p + kAhead < len) prefetch_row(c.k + c.row(b, p + kAhead, h), c.dim);
    const uint16_t* k = c.k + c.row(b, p, h);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < c.dim; d += 32)
      acc = _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(_mm512_loadu_si512(q + d)),
                             reinterpret_cast<__m512bh>(_mm512_loadu_si512(k + d)));
    scores[p] = _mm512_reduce_add_ps(acc) * scale;
    top = std::max(top, scores[p]);
  }
  __m512 total = _mm512_setzero_ps();
  for (int64_t p = 0; p < len; p += 16) {
    const __mmask16 live = len - p >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (len - p)) - 1);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, scores.data() + p), _mm512_set1_ps(top)));
    _mm512_mask_storeu_ps(scores.data() + p, live, e);
    total = _mm512_mask_add_ps(total, live, total, e);
  }
  __m512 acc[kMaxHeadDim / 16];
  const int64_t vectors = c.dim / 16;
  for (int64_t j = 0; j < vectors; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < len; ++p) {
    if (p + kAhead < len) prefetch_row(c.v + c.row(b, p + kAhead, h), c.dim);
    const uint16_t* v = c.v + c.row(b, p, h);
    const __m512 w = _mm512_set1_ps(scores[p]);
    for (int64_t j = 0; j < vectors; ++j) acc[j] = _mm512_fmadd_ps(w, load_bf16(v + 16 * j), acc[j]);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
  for (int64_t j = 0; j < vectors; ++j) {
    const __m256bh rounded = _mm512_cvtneps_pbh(_mm512_mul_ps(acc[j], inv));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * j), reinterpret_cast<const __m256i&>(rounded));
  }
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kBFloat16, "q must be bfloat16 [B, heads, head_dim]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.scalar_type() == at::kBFloat16 && k_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == at::kBFloat16 &&
                  v_cache.is_contiguous(),
              "k_cache and v_cache must be contiguous bfloat16 [num_blocks, block_size, heads, head_dim]");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  TORCH_CHECK(k_cache.size(2) == H && k_cache.size(3) == D, "q and the caches disagree on heads / head_dim");
  TORCH_CHECK(D % 32 == 0 && D <= kMaxHeadDim, "head_dim must be a multiple of 32 up to ", kMaxHeadDim);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == B && block_tables.scalar_type() == at::kLong,
              "block_tables must be int64 [B, n]");
  TORCH_CHECK(context_lens.numel() == B && context_lens.scalar_type() == at::kLong, "context_lens must be int64 [B]");
  auto qc = q.contiguous();
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  auto out = at::empty_like(qc);
  const Paged cache{reinterpret_cast<const uint16_t*>(k_cache.data_ptr()),
                    reinterpret_cast<const uint16_t*>(v_cache.data_ptr()), tables.data_ptr<int64_t>(),
                    tables.size(1), k_cache.size(1), H, D};
  const int64_t* len_of = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(len_of[b] >= 1 && len_of[b] <= cache.width * cache.block_size,
                "context_lens[", b, "] = ", len_of[b], " is outside 1..", cache.width * cache.block_size);
  auto qp = reinterpret_cast<const uint16_t*>(qc.data_ptr());
  auto op = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / H, h = task % H;
      attend(cache, qp + task * D, op + task * D, b, h, len_of[b], static_cast<float>(scale), scores);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(chattts_velocity_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(chattts_velocity_cpu, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
}
