// The audio stage's ConvNeXt front half on the CPU, channels-last: a depthwise convolution over time followed by a
// LayerNorm over channels, one fused pass per frame (audio/cpu_decode.py runs the rest of a block on oneDNN).
//
//   dwconv_norm(x, weight, bias, dilation, norm_weight, norm_bias, eps) -> y
//     x [T, C] float32 (the residual stream), weight [k, C] float32 (the Conv1d's [C, 1, k] transposed), bias,
//     norm_weight, norm_bias [C] float32 -> y [T, C] bfloat16 (rounded to nearest even once, after the norm).
//     Zero padding of dilation * (k / 2) frames each side, as nn.Conv1d(padding=dilation * (k // 2)).
//   scale_add_(x, y, gamma) -> x: x [T, C] float32 += gamma [C] float32 * y [T, C] bfloat16, in place (the
//     block's layer scale and residual, one pass).
//
// Every output frame is computed from its own input window alone, in one fixed order (taps in kernel order, then
// the norm's sums in 16 fixed lanes), so a frame's bits do not depend on T, on threads or on other rows: the same
// row decoded alone or with others gets the same bits. Plain loops the compiler vectorises (any ISA, no intrinsics).
// dwconv_norm_frames: the same per row of a concatenation, float32 out (cpu_audio_linear.cpp's dwconv_norm_rows).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_kernels.h"

namespace chattts_velocity_cpu {
namespace {

constexpr int64_t kLanes = 16;  // partial sums of the norm's reductions (then added in lane order)

inline uint16_t to_bf16(float value) {  // round to nearest even (inputs here are finite)
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float lane_sum(const float* lanes) {
  float total = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
  return total;
}

// One frame t: acc = bias + sum_j weight[j] * x[t + (j - k/2) * dilation] (taps outside [0, T) are zeros).
void conv_frame(const float* x, const float* weight, const float* bias, int64_t t, int64_t T, int64_t C, int64_t k,
                int64_t dilation, float* acc) {
  std::memcpy(acc, bias, C * sizeof(float));
  for (int64_t j = 0; j < k; ++j) {
    const int64_t s = t + (j - k / 2) * dilation;
    if (s < 0 || s >= T) continue;
    const float* xs = x + s * C;
    const float* wj = weight + j * C;
    for (int64_t c = 0; c < C; ++c) acc[c] += wj[c] * xs[c];
  }
}

inline void store(float value, uint16_t* out) { *out = to_bf16(value); }
inline void store(float value, float* out) { *out = value; }

// LayerNorm of acc [C] into out [C] (bf16 or float32): mean and variance summed in kLanes fixed lanes (channel c in
// lane c % 16).
template <typename Out>
void norm_frame(const float* acc, const float* gamma, const float* beta, int64_t C, double eps, Out* out) {
  const int64_t full = C - C % kLanes;
  float lanes[kLanes] = {};
  for (int64_t c0 = 0; c0 < full; c0 += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += acc[c0 + l];
  for (int64_t c = full; c < C; ++c) lanes[c - full] += acc[c];
  const float mean = lane_sum(lanes) / static_cast<float>(C);
  float squares[kLanes] = {};
  for (int64_t c0 = 0; c0 < full; c0 += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) {
      const float d = acc[c0 + l] - mean;
      squares[l] += d * d;
    }
  for (int64_t c = full; c < C; ++c) squares[c - full] += (acc[c] - mean) * (acc[c] - mean);
  const float rstd = 1.f / std::sqrt(lane_sum(squares) / static_cast<float>(C) + static_cast<float>(eps));
  for (int64_t c = 0; c < C; ++c) store((acc[c] - mean) * rstd * gamma[c] + beta[c], out + c);
}

// Every frame of x [M, C], each row [offsets[r], offsets[r + 1]) convolved alone (zero padding at its own ends).
template <typename Out>
void frames(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t dilation,
            const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps, const int64_t* offsets,
            int64_t rows, Out* yp) {
  const int64_t M = x.size(0), C = x.size(1);
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == C && weight.scalar_type() == at::kFloat &&
                  weight.is_contiguous() && weight.size(0) % 2 == 1, "weight must be contiguous float32 [k odd, C]");
  TORCH_CHECK(dilation >= 1, "dilation must be >= 1");
  for (const at::Tensor* v : {&bias, &norm_weight, &norm_bias})
    TORCH_CHECK(v->dim() == 1 && v->size(0) == C && v->scalar_type() == at::kFloat && v->is_contiguous(),
                "bias, norm_weight and norm_bias must be contiguous float32 [C]");
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float *bp = bias.data_ptr<float>(), *gp = norm_weight.data_ptr<float>(), *np = norm_bias.data_ptr<float>();
  const int64_t k = weight.size(0);
  at::parallel_for(0, M, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(static_cast<size_t>(C));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = std::upper_bound(offsets, offsets + rows + 1, t) - offsets - 1;  // the row of frame t
      const int64_t a = offsets[r];
      conv_frame(xp + a * C, wp, bp, t - a, offsets[r + 1] - a, C, k, dilation, acc.data());
      norm_frame(acc.data(), gp, np, C, eps, yp + t * C);
    }
  });
}

}  // namespace

at::Tensor dwconv_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t dilation,
                       const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 [T, C]");
  auto y = at::empty({x.size(0), x.size(1)}, x.options().dtype(at::kBFloat16));
  const int64_t whole[2] = {0, x.size(0)};
  frames(x, weight, bias, dilation, norm_weight, norm_bias, eps, whole, 1, reinterpret_cast<uint16_t*>(y.data_ptr()));
  return y;
}

void dwconv_norm_frames(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, int64_t dilation,
                        const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps, const int64_t* offsets,
                        int64_t rows, float* y) {
  frames(x, weight, bias, dilation, norm_weight, norm_bias, eps, offsets, rows, y);
}

at::Tensor scale_add_(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gamma) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous float32 [T, C]");
  const int64_t T = x.size(0), C = x.size(1);
  TORCH_CHECK(y.dim() == 2 && y.size(0) == T && y.size(1) == C && y.scalar_type() == at::kBFloat16 &&
                  y.is_contiguous(), "y must be contiguous bfloat16 [T, C]");
  TORCH_CHECK(gamma.dim() == 1 && gamma.size(0) == C && gamma.scalar_type() == at::kFloat && gamma.is_contiguous(),
              "gamma must be contiguous float32 [C]");
  float* xp = x.data_ptr<float>();
  const auto* yp = reinterpret_cast<const uint16_t*>(y.data_ptr());
  const float* gp = gamma.data_ptr<float>();
  at::parallel_for(0, T, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const uint32_t bits = static_cast<uint32_t>(yp[t * C + c]) << 16;
        float value;
        std::memcpy(&value, &bits, sizeof(value));
        xp[t * C + c] += gp[c] * value;
      }
  });
  return x;
}

}  // namespace chattts_velocity_cpu
