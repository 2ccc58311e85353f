// The sampler's processor chain and draw as one op: the same bits as engine/worker/sampling's torch formulation
// (logits_processors.process, then Sampler.sample) without its ~70 small torch calls and their parallel regions.
//
//   sample_rows(logits [R, V] float32, temperatures [R], penalties [R] or empty, history [R, W] int64 (-1 = padding),
//               top_p [R] or empty, top_k [R] int64 or empty, mask_eos [R] bool, eos_ids [R] int64, seeds [S] int64
//               (uint64 bits), rows_per_seq) -> tokens [R] int64
//
// Everything elementwise is done here in the torch formulation's float32 operations and order; what torch computes
// with its own vectorised kernels (pow, softmax, cumsum, the exponential noise of a seeded generator, argmax) is
// called through ATen, so those bits are torch's. From 64 rows on, row loops (and torch's kernels) run in parallel
// over rows, each row's arithmetic its own; fewer rows open one parallel region (the noise beside the softmax).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/softmax.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <c10/core/InferenceMode.h>

#include "cpu_kernels.h"

namespace chattts_velocity_cpu {
namespace {

constexpr int64_t kMinKeep = 3;      // apply_top_p / apply_top_k's min_keep
constexpr int64_t kParallelRows = 64;  // fewer rows run on the calling thread (no parallel region)

template <typename F>
void for_rows(int64_t R, F&& f) {
  if (R < kParallelRows) {  // no parallel region
    for (int64_t r = 0; r < R; ++r) f(r);
    return;
  }
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) f(r);
  });
}

// at::softmax(x, -1) of x [R, V]: under kParallelRows rows one row at a time, which torch runs on this thread
// (its kernel treats each row alone: the same bits as one call)
at::Tensor softmax_rows(const at::Tensor& x) {
  if (x.size(0) >= kParallelRows) return at::softmax(x, -1);
  auto out = at::empty_like(x);
  for (int64_t r = 0; r < x.size(0); ++r) out.narrow(0, r, 1).copy_(at::softmax(x.narrow(0, r, 1), -1));
  return out;
}

// apply_repetition_penalty's ids (padding replaced by the row's largest id, 0 when none) and counts (how often each
// column's id occurs among the real ones), float as torch.pow takes them.
void penalty_ids(const int64_t* h, int64_t W, int64_t* ids, float* counts) {
  int64_t fill = std::numeric_limits<int64_t>::min();
  for (int64_t w = 0; w < W; ++w) fill = std::max(fill, h[w]);
  fill = std::max<int64_t>(fill, 0);
  for (int64_t w = 0; w < W; ++w) ids[w] = h[w] >= 0 ? h[w] : fill;
  for (int64_t w = 0; w < W; ++w) {
    int64_t n = 0;
    for (int64_t u = 0; u < W; ++u) n += h[u] >= 0 && ids[w] == h[u];
    counts[w] = static_cast<float>(n);
  }
}

void apply_penalty(float* x, const int64_t* ids, const float* alpha, int64_t W) {
  constexpr float big = std::numeric_limits<float>::max();
  std::vector<float> scores(W);
  for (int64_t w = 0; w < W; ++w) scores[w] = x[ids[w]];  // every score before any write: ids may repeat
  for (int64_t w = 0; w < W; ++w) {
    const float s = scores[w], v = s < 0 ? s * alpha[w] : s / alpha[w];
    x[ids[w]] = std::isnan(v) ? 0.0f : std::isinf(v) ? (v > 0 ? big : -big) : v;
  }
}

// sort_ascending's order: ascending by the float's order (-0.0 == +0.0), ties by index, i.e. the stable sort's. A
// stable LSD radix sort of the order-preserving 32-bit keys, four 8-bit passes (one skipped where every key shares
// its byte), from the index order.
void sort_row(const float* x, int64_t V, int64_t* order, float* sorted) {
  std::vector<uint32_t> keys(V), keys_next(V);
  std::vector<int32_t> index(V), index_next(V);
  std::array<std::array<int32_t, 256>, 4> counts{};
  for (int64_t v = 0; v < V; ++v) {
    const float f = x[v] + 0.0f;  // -0.0 -> +0.0
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    keys[v] = bits & 0x80000000u ? ~bits : bits | 0x80000000u;  // unsigned order = the floats' order
    index[v] = static_cast<int32_t>(v);
    for (int pass = 0; pass < 4; ++pass) ++counts[pass][(keys[v] >> (8 * pass)) & 0xFF];
  }
  for (int pass = 0; pass < 4; ++pass) {
    auto& count = counts[pass];
    if (count[(keys[0] >> (8 * pass)) & 0xFF] == V) continue;  // one bucket: this byte orders nothing
    int32_t start = 0;
    for (auto& c : count) start += std::exchange(c, start);
    for (int64_t i = 0; i < V; ++i) {
      const int32_t at = count[(keys[i] >> (8 * pass)) & 0xFF]++;
      keys_next[at] = keys[i];
      index_next[at] = index[i];
    }
    keys.swap(keys_next);
    index.swap(index_next);
  }
  for (int64_t i = 0; i < V; ++i) {
    order[i] = index[i];
    sorted[i] = x[index[i]];
  }
}

void drop_top_p(float* x, const int64_t* order, const float* cumulative, int64_t V, float top_p) {
  const float threshold = 1.0f - top_p;
  for (int64_t i = 0; i < V - kMinKeep; ++i)
    if (cumulative[i] <= threshold) x[order[i]] = -std::numeric_limits<float>::infinity();
}

void drop_top_k(float* x, int64_t V, int64_t top_k) {
  const int64_t k = std::min(std::max(top_k, kMinKeep), V);
  std::vector<float> values(x, x + V);
  auto larger = [](float a, float b) { return (std::isnan(a) && !std::isnan(b)) || a > b; };  // topk: NaN largest
  std::nth_element(values.begin(), values.begin() + (k - 1), values.end(), larger);
  const float kth = values[k - 1];
  for (int64_t v = 0; v < V; ++v)
    if (x[v] < kth) x[v] = -std::numeric_limits<float>::infinity();
}

}  // namespace

at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& temperatures, const at::Tensor& penalties,
                       const at::Tensor& history, const at::Tensor& top_p, const at::Tensor& top_k,
                       const at::Tensor& mask_eos, const at::Tensor& eos_ids, const at::Tensor& seeds,
                       int64_t rows_per_seq) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.size(1) >= 1,
              "logits must be float32 [R, V]");
  const int64_t R = logits.size(0), V = logits.size(1), W = history.dim() == 2 ? history.size(1) : 0;
  TORCH_CHECK(rows_per_seq >= 1 && seeds.numel() * rows_per_seq == R && seeds.scalar_type() == at::kLong,
              "seeds must be int64 [R / rows_per_seq]");
  TORCH_CHECK(temperatures.numel() == R && eos_ids.numel() == R && mask_eos.numel() == R, "per-row tensors are [R]");
  const bool penalise = penalties.numel() == R && W > 0, nucleus = top_p.numel() == R, k_best = top_k.numel() == R;
  auto x = logits.clone(at::MemoryFormat::Contiguous);
  float* xp = x.data_ptr<float>();
  auto temps = temperatures.to(at::kFloat).contiguous();
  const float* tp = temps.data_ptr<float>();
  for_rows(R, [&](int64_t r) {
    for (int64_t v = 0; v < V; ++v) xp[r * V + v] /= tp[r];
  });
  if (penalise) {
    auto h = history.to(at::kLong).contiguous();
    auto ids = at::empty({R, W}, h.options());
    auto counts = at::empty({R, W}, x.options());
    for_rows(R, [&](int64_t r) {
      penalty_ids(h.data_ptr<int64_t>() + r * W, W, ids.data_ptr<int64_t>() + r * W, counts.data_ptr<float>() + r * W);
    });
    auto alpha = at::pow(penalties.to(at::kFloat).unsqueeze(1), counts).contiguous();  // torch.pow's bits
    for_rows(R, [&](int64_t r) {
      apply_penalty(xp + r * V, ids.data_ptr<int64_t>() + r * W, alpha.data_ptr<float>() + r * W, W);
    });
  }
  if (nucleus) {
    auto p = top_p.to(at::kFloat).contiguous();
    auto order = at::empty({R, V}, at::kLong);
    auto sorted = at::empty({R, V}, x.options());
    for_rows(R, [&](int64_t r) {
      sort_row(xp + r * V, V, order.data_ptr<int64_t>() + r * V, sorted.data_ptr<float>() + r * V);
    });
    auto cumulative = softmax_rows(sorted).cumsum(-1);  // apply_top_p's, in torch's kernels
    for_rows(R, [&](int64_t r) {
      if (p.data_ptr<float>()[r] < 1)
        drop_top_p(xp + r * V, order.data_ptr<int64_t>() + r * V, cumulative.data_ptr<float>() + r * V, V,
                   p.data_ptr<float>()[r]);
    });
  }
  auto mask = mask_eos.to(at::kBool).contiguous();
  auto eos = eos_ids.to(at::kLong).contiguous();
  auto k = k_best ? top_k.to(at::kLong).contiguous() : top_k;
  for_rows(R, [&](int64_t r) {
    if (k_best && k.data_ptr<int64_t>()[r] > 0) drop_top_k(xp + r * V, V, k.data_ptr<int64_t>()[r]);
    if (mask.data_ptr<bool>()[r]) xp[r * V + eos.data_ptr<int64_t>()[r]] = -std::numeric_limits<float>::infinity();
  });
  auto noise = at::empty({R, V}, x.options());
  auto seed_bits = seeds.contiguous();
  const int64_t* sp = seed_bits.data_ptr<int64_t>();
  auto fill_noise = [&](int64_t s0, int64_t s1) {  // Sampler._noise: each sequence's rows from its own seed
    c10::InferenceMode inference;  // the caller's mode (a worker thread does not inherit it)
    auto gen = at::make_generator<at::CPUGeneratorImpl>();
    for (int64_t s = s0; s < s1; ++s) {
      gen.set_current_seed(static_cast<uint64_t>(sp[s]));
      noise.slice(0, s * rows_per_seq, (s + 1) * rows_per_seq).exponential_(1.0, gen);
    }
  };
  at::Tensor probs;
  if (R >= kParallelRows) {  // sequences split over threads, each exponential_ inside the region: inline
    at::parallel_for(0, seeds.numel(), 1, fill_noise);
    probs = at::softmax(x, -1);
  } else {  // one region: the noise (inline there, exponential_ splits it otherwise) beside the softmax
    at::parallel_for(0, 2, 1, [&](int64_t t0, int64_t t1) {
      c10::InferenceMode inference;
      for (int64_t task = t0; task < t1; ++task) {
        if (task == 0) fill_noise(0, seeds.numel());
        else probs = softmax_rows(x);
      }
    });
  }
  return probs.div_(noise).argmax(-1);  // argmax(p / E), E ~ Exp(1): torch.multinomial's draw
}

}  // namespace chattts_velocity_cpu
