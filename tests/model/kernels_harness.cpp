// The CPU kernels' micro-kernels and paged attention without torch, against reference values computed here in double:
// the vector helpers (exp, bf16 / int8 rounding), tile_rows for bf16 / int8 tiles and tile_rows_int4 for int4 tiles
// times Q8 activations (within bf16 rounding, and the same bits for a row at every row-group size M), the Q8
// quantisation, and attend_heads over bf16 and int8 pools. Built for the ISA
// the compiler targets (isa_<isa>.h via cpu_kernels.h's choice), e.g. aarch64 under qemu (test_kernels_harness.py).
// Prints one line per check and exits 1 on the first failure.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

namespace at {  // the one ATen type the micro-kernels name: a bf16 value from a float, rounded to nearest even
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits = static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  }
  operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
}  // namespace at

#if defined(__AVX512BF16__)
#include "isa_avx512.h"
#elif defined(__AVX2__)
#include "isa_avx2.h"
#elif defined(__aarch64__)
#include "isa_neon.h"
#endif
#include "isa_contract.h"
#include "attention_rows.h"

using namespace chattts_velocity_cpu;

namespace {

std::mt19937 rng(0);
int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
uint16_t bf16(float f) { return at::BFloat16(f).bits; }
float from_bf16(uint16_t b) {
  at::BFloat16 v;
  v.bits = b;
  return v;
}

void vector_helpers() {
  float x[16], e[16];
  for (int i = 0; i < 16; ++i) x[i] = uniform(-80.0f, 80.0f);
  store16(e, exp_ps(load16(x)));
  double worst = 0;
  for (int i = 0; i < 16; ++i) worst = std::max(worst, std::fabs(e[i] / std::exp(double(x[i])) - 1.0));
  check(worst < 1e-6, "exp_ps within 1e-6 relative");
  float y[16];
  uint16_t b[16];
  for (int i = 0; i < 16; ++i) y[i] = uniform(-3.0f, 3.0f);
  y[0] = 1.0f + 1.0f / 256;  // a tie: rounds to the even 1.0
  y[1] = 1.0f + 3.0f / 256;  // a tie: rounds to the even 1 + 4/256
  store16(b, load16(y));
  bool same = true;
  for (int i = 0; i < 16; ++i) same &= b[i] == bf16(y[i]);
  check(same && from_bf16(b[0]) == 1.0f && from_bf16(b[1]) == 1.0f + 4.0f / 256, "store16 bf16 rounds to nearest even");
  float q[16] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 126.6f, -127.4f, 300.0f, -300.0f, 3.49f, 0, 1, 2, 3, 4, 5};
  int8_t expect[16] = {0, 2, 2, 0, -2, 127, -127, 127, -128, 3, 0, 1, 2, 3, 4, 5};
  uint8_t got[16];
  store16_int8(got, load16(q));
  check(std::memcmp(got, expect, 16) == 0, "store16_int8 rounds half to even and saturates");
  float ones[16];
  for (float& o : ones) o = 1.0f;
  check(reduce_add(load16(ones)) == 16.0f && reduce_max(load16(q)) == 300.0f, "reduce_add, reduce_max");
}

// W [N, K] in each tile layout (kernels/__init__.py: to_tiles, to_int4_tiles) and its dequantised values.
struct Tiles {
  std::vector<uint16_t> bf16;   // [N/4, K/32, 4, 32]
  std::vector<int8_t> int8;     // [N/4, K/16, 4, 16]
  std::vector<float> row_scales;
  std::vector<uint8_t> int4;    // [N/4, K/32, 4, 16]
  std::vector<float> group_scales;  // [N/4, K/32, 4]
  std::vector<double> w_bf16, w_int8, w_int4;  // [N, K]
};

Tiles make_tiles(int64_t N, int64_t K) {
  Tiles t;
  std::vector<float> w(N * K);
  for (float& v : w) v = uniform(-0.1f, 0.1f);
  t.bf16.resize(N * K), t.int8.resize(N * K), t.int4.resize(N * K / 2);
  t.row_scales.resize(N), t.group_scales.resize(N * K / 32);
  t.w_bf16.resize(N * K), t.w_int8.resize(N * K), t.w_int4.resize(N * K);
  for (int64_t n = 0; n < N; ++n) {
    float top = 0;
    for (int64_t k = 0; k < K; ++k) top = std::max(top, std::fabs(w[n * K + k]));
    t.row_scales[n] = top / 127;
    for (int64_t k = 0; k < K; ++k) {
      const float v = w[n * K + k];
      t.bf16[((n / 4 * (K / 32) + k / 32) * 4 + n % 4) * 32 + k % 32] = bf16(v);
      t.w_bf16[n * K + k] = from_bf16(bf16(v));
      const int8_t q = static_cast<int8_t>(std::nearbyint(v / t.row_scales[n]));
      t.int8[((n / 4 * (K / 16) + k / 16) * 4 + n % 4) * 16 + k % 16] = q;
      t.w_int8[n * K + k] = double(q) * t.row_scales[n];
    }
    for (int64_t g = 0; g < K / 32; ++g) {
      float extreme = 0;  // the group's signed value of largest magnitude, at q = -8: every level in [-8, 7] in use
      for (int j = 0; j < 32; ++j)
        if (std::fabs(w[n * K + 32 * g + j]) > std::fabs(extreme)) extreme = w[n * K + 32 * g + j];
      const float scale = extreme / -8;  // signed, as kernels.quantize_int4's may be
      const int64_t base = (n / 4 * (K / 32) + g) * 4 + n % 4;
      t.group_scales[base] = scale;
      for (int j = 0; j < 32; ++j) {
        const int q = std::clamp(static_cast<int>(std::nearbyint(w[n * K + 32 * g + j] / scale)), -8, 7);
        t.w_int4[n * K + 32 * g + j] = double(q) * scale;
        uint8_t& byte = t.int4[base * 16 + j % 16];
        byte = static_cast<uint8_t>(j < 16 ? (byte & 0xF0) | (q + 8) : (byte & 0x0F) | ((q + 8) << 4));
      }
    }
  }
  return t;
}

// tile_rows (bf16 / int8 tiles, bf16 activations), tile_rows_int8 (int8 tiles, Q8 rows) or tile_rows_int4 (int4
// tiles, Q8 rows) for rows [m0, m0 + rows) of x into y. q8 holds the rows as the driver passes them (offset for
// tile_rows_int8 where kQ8Int8Unsigned, tile_rows_int4 where kQ8Int4Unsigned).
template <int Rows, typename W>
void run_rows(const W* w, const float* rs, const float* gs, Activations staged, const Q8Rows& q8, bool integer,
              at::BFloat16* y, int64_t m0, int64_t K, int64_t N) {
  const Q8Rows rows{q8.q + m0 * K, q8.scales + m0 * (K / kQ8Group)};
  if constexpr (std::is_same_v<W, uint8_t>) {
    tile_rows_int4<Rows>(rows, w, gs, y + m0 * N, K, N, N / kTileRows);
  } else if constexpr (std::is_same_v<W, int8_t>) {
    if (integer) tile_rows_int8<Rows>(rows, w, rs, y + m0 * N, K, N, N / kTileRows);
    else tile_rows<Rows, W>(staged + m0 * K, w, rs, y + m0 * N, K, N, N / kTileRows);
  } else {
    tile_rows<Rows, W>(staged + m0 * K, w, rs, y + m0 * N, K, N, N / kTileRows);
  }
}

// The kernel against the double product of its inputs: x's bf16 values (bf16 tiles, int8 tiles with bf16
// activations) or its Q8 rows (`integer`: int8 tiles on integer dot products, int4 tiles).
template <typename W>
void linear_case(const char* name, const W* w, const float* rs, const float* gs, const std::vector<double>& ref_w,
                 const std::vector<uint16_t>& x, int64_t M, int64_t K, int64_t N, bool integer) {
  std::vector<float> buffer;
  const Activations staged = prepare_activations(x.data(), M, K, buffer, std::is_same_v<W, uint16_t>);
  std::vector<int8_t> q(M * K);
  std::vector<float> q_scales(M * K / kQ8Group);
  quantize_q8_rows(x.data(), M, K, q.data(), q_scales.data());
  std::vector<int8_t> passed = q;
  if (std::is_same_v<W, int8_t> ? kQ8Int8Unsigned : std::is_same_v<W, uint8_t> && kQ8Int4Unsigned)
    offset_q8(passed.data(), M * K);
  const Q8Rows q8{passed.data(), q_scales.data()};
  const int64_t group_size = integer ? kQ8RowGroup : kRowGroup;
  std::vector<at::BFloat16> one(M * N), group(M * N);
  for (int64_t m = 0; m < M; ++m) run_rows<1, W>(w, rs, gs, staged, q8, integer, one.data(), m, K, N);
  for (int64_t m0 = 0; m0 + group_size <= M; m0 += group_size) {
    if (integer) run_rows<kQ8RowGroup, W>(w, rs, gs, staged, q8, integer, group.data(), m0, K, N);
    else run_rows<kRowGroup, W>(w, rs, gs, staged, q8, integer, group.data(), m0, K, N);
  }
  bool close = true, invariant = true;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double exact = 0, bound = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double xv = integer ? double(q[m * K + k]) * q_scales[(m * K + k) / kQ8Group]
                                  : double(from_bf16(x[m * K + k]));
        exact += xv * ref_w[n * K + k];
        bound += std::fabs(xv * ref_w[n * K + k]);
      }
      close &= std::fabs(float(one[m * N + n]) - exact) <= 3 * std::ldexp(1.0, -8) * bound + 1e-6;
      if (m < M / group_size * group_size) invariant &= one[m * N + n].bits == group[m * N + n].bits;
    }
  char what[160];
  std::snprintf(what, sizeof what, "%s: within bf16 rounding of the double product", name);
  check(close, what);
  std::snprintf(what, sizeof what, "%s: a row's bits at M = 1 and M = %d are equal", name, int(group_size));
  check(invariant, what);
}

void q8_rows() {  // the activations' quantisation: scale = max |x| / 127 per group, values rounded half to even
  const int64_t K = 64;
  std::vector<uint16_t> x(K);
  for (int64_t k = 0; k < K; ++k) x[k] = bf16(k < 32 ? 0.0f : (k - 40) * 0.5f);  // group 0 all zero
  std::vector<int8_t> q(K);
  float scales[2];
  quantize_q8_rows(x.data(), 1, K, q.data(), scales);
  bool ok = scales[0] == 0.0f && scales[1] == 11.5f / 127.0f;
  for (int64_t k = 0; k < K; ++k)
    ok &= q[k] == (k < 32 ? 0 : static_cast<int8_t>(std::nearbyint(from_bf16(x[k]) / scales[1])));
  ok &= q[63] == 127 && q[32] == -44;  // 11.5 / (11.5 / 127) and -4 / (11.5 / 127) = -44.17..
  check(ok, "quantize_q8_rows: zero group, scale max/127, values rounded");
}

void linears() {
  const int64_t M = 16, K = 96, N = 12;  // M: several row groups of 2 or 4, one of 16
  const Tiles t = make_tiles(N, K);
  std::vector<uint16_t> x(M * K);
  for (auto& v : x) v = bf16(uniform(-1.0f, 1.0f));
  linear_case("tile_rows bf16", t.bf16.data(), nullptr, nullptr, t.w_bf16, x, M, K, N, false);
  linear_case("tile_rows int8", t.int8.data(), t.row_scales.data(), nullptr, t.w_int8, x, M, K, N, false);
  linear_case("tile_rows_int8 (Q8 rows)", t.int8.data(), t.row_scales.data(), nullptr, t.w_int8, x, M, K, N, true);
  linear_case("tile_rows_int4 (Q8 rows)", t.int4.data(), nullptr, t.group_scales.data(), t.w_int4, x, M, K, N, true);
  q8_rows();
}

// One sequence of `len` positions over pools of `heads` heads, blocks in a shuffled order.
template <typename Rows>
void attention_case(const char* name, int64_t D, int64_t len) {
  const int64_t heads = 3, block = 16, blocks = (len + block - 1) / block + 2, R = Rows::bytes(D);
  std::vector<uint8_t> k(blocks * block * heads * R), v(k.size());
  std::vector<double> kref(blocks * block * heads * D), vref(kref.size());
  for (int64_t row = 0; row < blocks * block * heads; ++row)
    for (auto [pool, ref] : {std::pair{&k, &kref}, std::pair{&v, &vref}}) {
      float values[kMaxHeadDim];
      for (int64_t d = 0; d < D; ++d) values[d] = uniform(-2.0f, 2.0f);
      uint8_t* dst = pool->data() + row * R;
      if constexpr (std::is_same_v<Rows, Int8Rows>) {
        quantize_row(values, dst, D);
        for (int64_t d = 0; d < D; ++d) (*ref)[row * D + d] = double(int8_t(dst[d])) * kv_row_scale(dst, D);
      } else {
        for (int64_t d = 0; d < D; ++d) {
          const uint16_t b = bf16(values[d]);
          std::memcpy(dst + 2 * d, &b, 2);
          (*ref)[row * D + d] = from_bf16(b);
        }
      }
    }
  std::vector<int64_t> table;
  for (int64_t b = blocks - 1; b >= 1; --b) table.push_back(b);  // reversed: a block's rows are not in order
  std::vector<uint16_t> q(heads * D), out(heads * D);
  for (auto& e : q) e = bf16(uniform(-1.0f, 1.0f));
  const Paged cache{k.data(), v.data(), table.data(), int64_t(table.size()), block, heads, D, R};
  Scratch scratch;
  const float scale = 1.0f / std::sqrt(float(D));
  attend_heads<Rows>(cache, q.data(), out.data(), 0, 0, heads, len, scale, scratch);
  bool close = true;
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> p(len);
    double top = -1e300, total = 0;
    auto row_of = [&](int64_t pos) { return (table[pos / block] * block + pos % block) * heads + h; };
    for (int64_t pos = 0; pos < len; ++pos) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += double(from_bf16(q[h * D + d])) * kref[row_of(pos) * D + d];
      p[pos] = s * scale, top = std::max(top, p[pos]);
    }
    for (double& e : p) total += (e = std::exp(e - top));
    for (int64_t d = 0; d < D; ++d) {
      double o = 0;
      for (int64_t pos = 0; pos < len; ++pos) o += p[pos] / total * vref[row_of(pos) * D + d];
      close &= std::fabs(from_bf16(out[h * D + d]) - o) <= std::ldexp(1.0, -7) * std::fabs(o) + 5e-4;
    }
  }
  char what[160];
  std::snprintf(what, sizeof what, "attend_heads %s pools, head_dim %d, %d positions: within bf16 rounding", name,
                int(D), int(len));
  check(close, what);
}

}  // namespace

int main() {
  vector_helpers();
  linears();
  for (int64_t D : {32, 64})
    for (int64_t len : {1, 17, 45}) {
      attention_case<Bf16Rows>("bf16", D, len);
      attention_case<Int8Rows>("int8", D, len);
    }
  std::printf("%s\n", failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
