// The output heads on the CPU: y = x @ W.T in float32, x [M, K], W [N, K] row-major as Embed keeps it, y [M, N].
//
//   head_linear(x, weight) -> y: every output y[m, n] is one 16-lane accumulator over K in 16-column steps, in
//   order (fused multiply-adds), then the ISA's fixed-order lane sum (reduce_add). Nothing else enters it, so a
//   row's logits are the same bits at any M and in any row group (the seed contract), on every thread count.
//
// Threads take blocks of kHeadBlock outputs (~48 KB of weights at K = 768) and pass every row of x over a block, a
// group of rows times a group of outputs at a time, while the block is in cache: W streams from memory once per call
// (one row: memory speed), and from 4 rows on each loaded vector feeds several fused multiply-adds.
#include <ATen/Parallel.h>

#include "cpu_kernels.h"

namespace chattts_velocity_cpu {
namespace {

constexpr int64_t kHeadBlock = 16;  // outputs per cache-resident block of W
#if defined(__AVX512F__) || defined(__aarch64__)
constexpr int64_t kHeadRows = 4, kHeadCols = 4;  // 16 accumulators: 16 of 32 vector registers
#else
constexpr int64_t kHeadRows = 2, kHeadCols = 2;  // AVX2: a V16 is two of its 16 registers
#endif

// y[r, j] for rows x[0..R) and outputs w[0..J), each row of x and of w K floats apart, y's rows N apart.
template <int R, int J>
inline void dot_group(const float* x, const float* w, float* y, int64_t K, int64_t N) {
  V16 acc[R][J];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) acc[r][j] = v_zero();
  for (int64_t k = 0; k < K; k += 16) {
    V16 wv[J];
    for (int j = 0; j < J; ++j) wv[j] = load16(w + j * K + k);
    for (int r = 0; r < R; ++r) {
      const V16 xv = load16(x + r * K + k);
      for (int j = 0; j < J; ++j) acc[r][j] = v_fmadd(xv, wv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) y[r * N + j] = reduce_add(acc[r][j]);
}

// Rows x[0..R) times outputs [n0, n1) of W, kHeadCols outputs at a time (the last group narrower).
template <int R>
void rows_times_block(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + kHeadCols <= n1; n += kHeadCols) dot_group<R, kHeadCols>(x, w + n * K, y + n, K, N);
  for (; n < n1; ++n) dot_group<R, 1>(x, w + n * K, y + n, K, N);
}

void block_all_rows(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0,
                    int64_t n1) {
  for (int64_t m = 0; m < M; m += kHeadRows) {
    const float* xm = x + m * K;
    float* ym = y + m * N;
    switch (std::min(kHeadRows, M - m)) {  // the last group narrower: each row's arithmetic stays the same
      case 1: rows_times_block<1>(xm, w, ym, K, N, n0, n1); break;
      case 2: rows_times_block<2>(xm, w, ym, K, N, n0, n1); break;
      case 3: if constexpr (kHeadRows > 3) rows_times_block<3>(xm, w, ym, K, N, n0, n1); break;
      default: rows_times_block<kHeadRows>(xm, w, ym, K, N, n0, n1); break;
    }
  }
}

}  // namespace

at::Tensor head_linear(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be float32 [M, K]");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "weight must be a contiguous float32 [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(weight.size(1) == K && K % 16 == 0, "x has ", K, " features, the weight ", weight.size(1),
              " (both a multiple of 16)");
  auto xc = x.contiguous();
  auto y = at::empty({M, N}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t blocks = (N + kHeadBlock - 1) / kHeadBlock;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      block_all_rows(xp, wp, yp, M, K, N, b * kHeadBlock, std::min(N, (b + 1) * kHeadBlock));
  });
  return y;
}

}  // namespace chattts_velocity_cpu
