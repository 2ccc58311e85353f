// The audio stage's linears where the CPU has no bf16 arithmetic (AVX2): weights stored in 16 bits (bf16), widened
// to fp32 in registers, times fp32 activations in fp32 FMAs (audio/cpu_decode.py's "panels" path).
//
//   audio_linear(x, panels, bias, n, gelu) -> y [M, n] float32 = x @ W.T + bias, then the exact GELU if gelu.
//     x [M, K] float32 (the frames of every row, concatenated), panels [ceil(n / 16), K, 16] bfloat16 (the weight
//     [n, K] in panels of 16 outputs, zero-padded: kernels.to_audio_panels), bias float32, zero-padded to the panels.
//   audio_linear_add_(residual, x, panels, bias, gamma) -> residual [M, n] float32 += gamma * (x @ W.T + bias), in
//     place (the ConvNeXt block's layer scale and residual); gamma zero-padded as bias.
//   dwconv_norm_rows(x, offsets, weight, bias, dilation, norm_weight, norm_bias, eps) -> y [M, C] float32
//     cpu_audio.cpp's dwconv_norm over each row [offsets[i], offsets[i + 1]) of x alone, float32 out.
//
// Batch invariance (the seed contract): every output is one lane of one accumulator that starts at the bias and adds
// x[m, k] * w[n, k] for k = 0 .. K-1 in order, in fp32 FMAs, whatever M, the row's place in its group of kRows, or
// the thread that runs it; the GELU and the epilogue are per element. So a row's frames get the same bits decoded
// alone or concatenated with other rows, and the rows need no padding (no redundant frames).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include "cpu_kernels.h"

namespace chattts_velocity_cpu {
namespace {

constexpr int64_t kPanel = 16;       // outputs per panel: one V16
constexpr int kRows = 6;             // rows per pass: 6 x 2 accumulators, 2 weight vectors, 1 broadcast: 15 of 16 ymm
constexpr int64_t kChunkRows = 48;   // rows of x per work item, a multiple of kRows (in L2 while 4 panels pass)
constexpr int64_t kChunkPanels = 4;  // panels per work item
static_assert(kChunkRows % kRows == 0, "a chunk is whole passes of kRows rows");

// 0.5 x (1 + erf(x / sqrt 2)) = 0.5 (x + |x|) - |x| q, q = 0.5 erfc(|x| / sqrt 2), erfc by Abramowitz and Stegun
// 7.1.26 (absolute error <= 1.5e-7): the tail is computed directly, so no cancellation for negative x.
inline V16 gelu(V16 x) {
  const V16 a = v_abs(x), z = v_mul(a, v_set1(0.70710678118654752f));
  const V16 t = v_div(v_set1(1.0f), v_fmadd(z, v_set1(0.3275911f), v_set1(1.0f)));
  V16 p = v_set1(1.061405429f);
  p = v_fmadd(p, t, v_set1(-1.453152027f));
  p = v_fmadd(p, t, v_set1(1.421413741f));
  p = v_fmadd(p, t, v_set1(-0.284496736f));
  p = v_fmadd(p, t, v_set1(0.254829592f));
  const V16 q = v_mul(v_mul(v_set1(0.5f), v_mul(p, t)), exp_ps(v_mul(v_set1(-1.0f), v_mul(z, z))));
  return v_sub(v_mul(v_set1(0.5f), v_add(x, a)), v_mul(a, q));
}

struct Epilogue {
  const float* bias;  // [panels * 16], zero-padded
  bool gelu;
  float* y;           // [M, n]: the output, or the residual updated in place
  const float* gamma;  // [panels * 16] or nullptr (then y is written, not updated)
  int64_t n;
};

// Rows [m0, m0 + R) of x [M, K] times panel p: acc[m] = bias + sum_k x[m, k] * w[k, :], then the epilogue.
template <int R>
void rows_times_panel(const float* x, int64_t K, const uint16_t* panel, int64_t m0, int64_t p, const Epilogue& e) {
  alignas(64) float sums[R][kPanel];
  {  // the accumulators only ever indexed by constants (unrolled), so they all stay in registers
    V16 acc[R];
    const V16 bias = load16(e.bias + p * kPanel);
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) acc[m] = bias;
    const float* xm = x + m0 * K;
    for (int64_t k = 0; k < K; ++k) {
      const V16 w = load16(panel + k * kPanel);
#pragma GCC unroll 8
      for (int m = 0; m < R; ++m) acc[m] = v_fmadd(v_set1(xm[m * K + k]), w, acc[m]);
    }
#pragma GCC unroll 8
    for (int m = 0; m < R; ++m) store16(sums[m], acc[m]);
  }
  const int64_t n0 = p * kPanel, width = std::min(kPanel, e.n - n0);
  for (int m = 0; m < R; ++m) {
    V16 v = e.gelu ? gelu(load16(sums[m])) : load16(sums[m]);
    float* row = e.y + (m0 + m) * e.n + n0;
    if (e.gamma) {
      alignas(64) float old[kPanel] = {};
      std::memcpy(old, row, width * sizeof(float));
      v = v_fmadd(load16(e.gamma + n0), v, load16(old));
    }
    store16(sums[m], v);
    std::memcpy(row, sums[m], width * sizeof(float));
  }
}

void check_f32(const at::Tensor& t, int64_t size, const char* what) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) >= size && t.scalar_type() == at::kFloat && t.is_contiguous(), what,
              " must be contiguous float32 of at least ", size, " values");
}

// y [M, n] = x @ W.T + bias (then GELU), or with gamma: y += gamma * (x @ W.T + bias).
void run(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& bias, int64_t n, bool gelu,
         const at::Tensor& y, const at::Tensor* gamma) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), num_panels = panels.dim() == 3 ? panels.size(0) : 0;
  TORCH_CHECK(panels.dim() == 3 && panels.size(1) == K && panels.size(2) == kPanel &&
                  panels.scalar_type() == at::kBFloat16 && panels.is_contiguous() && n >= 1 &&
                  num_panels * kPanel >= n && (num_panels - 1) * kPanel < n,
              "panels must be contiguous bfloat16 [ceil(n / 16), K, 16]");
  check_f32(bias, num_panels * kPanel, "bias (zero-padded to the panels)");
  TORCH_CHECK(y.dim() == 2 && y.size(0) == M && y.size(1) == n && y.scalar_type() == at::kFloat && y.is_contiguous(),
              "residual must be contiguous float32 [M, n]");
  const Epilogue e{bias.data_ptr<float>(), gelu, y.data_ptr<float>(), gamma ? gamma->data_ptr<float>() : nullptr, n};
  const float* xp = x.data_ptr<float>();
  const auto* wp = reinterpret_cast<const uint16_t*>(panels.data_ptr());
  const int64_t chunks = (M + kChunkRows - 1) / kChunkRows;
  const int64_t groups = (num_panels + kChunkPanels - 1) / kChunkPanels;
  at::parallel_for(0, chunks * groups, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r0 = (i / groups) * kChunkRows, r1 = std::min(M, r0 + kChunkRows);
      const int64_t p0 = (i % groups) * kChunkPanels, p1 = std::min(num_panels, p0 + kChunkPanels);
      for (int64_t p = p0; p < p1; ++p) {
        const uint16_t* panel = wp + p * K * kPanel;
        int64_t m = r0;
        for (; m + kRows <= r1; m += kRows) rows_times_panel<kRows>(xp, K, panel, m, p, e);
        switch (r1 - m) {  // the last rows in one pass too (a row's chain of FMAs is the same at any R)
          case 5: rows_times_panel<5>(xp, K, panel, m, p, e); break;
          case 4: rows_times_panel<4>(xp, K, panel, m, p, e); break;
          case 3: rows_times_panel<3>(xp, K, panel, m, p, e); break;
          case 2: rows_times_panel<2>(xp, K, panel, m, p, e); break;
          case 1: rows_times_panel<1>(xp, K, panel, m, p, e); break;
          default: break;
        }
      }
    }
  });
}

}  // namespace

at::Tensor audio_linear(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& bias, int64_t n, bool gelu) {
  auto y = at::empty({x.dim() == 2 ? x.size(0) : 0, n}, x.options());
  run(x, panels, bias, n, gelu, y, nullptr);
  return y;
}

at::Tensor audio_linear_add_(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& panels,
                             const at::Tensor& bias, const at::Tensor& gamma) {
  const int64_t n = residual.dim() == 2 ? residual.size(1) : 0;
  check_f32(gamma, panels.size(0) * kPanel, "gamma (zero-padded to the panels)");
  run(x, panels, bias, n, false, residual, &gamma);
  return residual;
}

at::Tensor dwconv_norm_rows(const at::Tensor& x, const at::Tensor& offsets, const at::Tensor& weight,
                            const at::Tensor& bias, int64_t dilation, const at::Tensor& norm_weight,
                            const at::Tensor& norm_bias, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 [M, C]");
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) >= 1 && offsets.scalar_type() == at::kLong &&
                  offsets.is_contiguous(), "offsets must be contiguous int64 [rows + 1]");
  const int64_t* op = offsets.data_ptr<int64_t>();
  const int64_t rows = offsets.size(0) - 1, M = x.size(0), C = x.size(1);
  TORCH_CHECK(op[0] == 0 && op[rows] == M, "offsets must start at 0 and end at x's ", M, " frames");
  for (int64_t r = 0; r < rows; ++r) TORCH_CHECK(op[r] <= op[r + 1], "offsets must not decrease");
  auto y = at::empty({M, C}, x.options());
  dwconv_norm_frames(x, weight, bias, dilation, norm_weight, norm_bias, eps, op, rows, y.data_ptr<float>());
  return y;
}

}  // namespace chattts_velocity_cpu
