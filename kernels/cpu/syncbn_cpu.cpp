// CPU kernels of the syncbn_ref ops (schemas in ../ops.cpp).
//
// Memory: every op first makes its inputs contiguous in the input's suggested
// memory format (a no-op for contiguous, channels_last and channels_last_3d
// input) and then sees the data as [outer][C][inner]:
//   contiguous:              outer = N,          inner = prod(spatial)
//   channels_last(_3d):      outer = N*spatial,  inner = 1
// Large `inner` (NCHW with big images) is reduced per channel, parallel over
// channels. Small `inner` (channels-last, or 2-D/3-D input) is reduced in row
// blocks, parallel over blocks; block partials are merged in block order, so
// results do not depend on the number of threads. (at::parallel_for uses
// torch's OpenMP threads only if this file is built with -fopenmp: see
// kernels/extension.py.) A channel's segments lie far apart, where the
// hardware prefetcher does not follow: each reduction prefetches the chunk or
// block its thread reads next while it computes the current one, so memory
// reads overlap the arithmetic.
//
// Precision and speed:
// - Statistics (mean, M2, sum_dy, sum_dy_xmu) accumulate in float64, in
//   kLanes = 16 independent lanes held in native-width vectors (GCC/Clang
//   vector extensions). The compiler may not reassociate one serial sum,
//   which then stays scalar at one add latency per element; independent lanes
//   vectorize and run in parallel. Lanes are combined in a fixed order, so the
//   result is still fixed by the code, not by the thread count.
// - mean and M2 of a chunk (at most kBlockElems elements of one channel) use
//   the corrected two-pass algorithm (Chan, Golub and LeVeque): a rough centre
//   c (float sums over runs of at most kRoughRun = 256 elements, promoted to
//   float64), then s1 = sum(x - c) and s2 = sum((x - c)^2) in float64 lanes;
//   mean = c + s1/n, M2 = s2 - s1^2/n. With the exact mean for c this is the
//   plain two-pass; the s1 terms remove the error of the rough c, and since c
//   is off the mean only by float rounding of the data, s1^2/n is tiny next
//   to s2: nothing cancels, even for mean 1e4 and std 1e-2 in float32. The
//   rough pass costs a fraction of a float64 pass. s1 and s2 themselves stay
//   float64: float partial sums of squares would cost welford_stats its
//   ~1e-10 relative M2. Channels-last blocks do the same per channel (column).
//   Chunks and blocks are merged with Chan's formula in a fixed order.
// - half and bfloat16 are converted to and from float in registers (F16C
//   vcvtph2ps/vcvtps2ph when the build enables it, bit shifts for bfloat16),
//   rounding to nearest even like c10's conversions.
// - Elementwise ops compute in float for float/half/bfloat16 input (double
//   for double) with per-channel coefficients rounded to float once. The mean
//   is subtracted as a float hi/lo pair, (x - mean_hi) - mean_lo, so a large
//   offset does not cost the digits of x - mean. The result is within a few
//   float roundings: about one rounding of a half/bfloat16 output, a few ulp
//   of a float output.
// - Builds with FMA may fuse a multiply and an add (GCC's default
//   -ffp-contract=fast), so builds for different ISAs can differ in the last
//   bits; one build gives the same bits for any number of threads.
//
// Output dtypes follow the ATen contract: statistics in float for
// half/bfloat16/float input (double for double), outputs in the input dtype
// and memory format.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../common.h"

#if defined(__AVX__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace syncbn_ref {
namespace {

using at::Tensor;

// Elements per block of the row-block path and per chunk of the channel path:
// small enough that a chunk and the next one (being prefetched) stay in L1
// between the two passes.
constexpr int64_t kBlockElems = 4096;
// Below this many contiguous elements per (sample, channel) the row-block path wins.
constexpr int64_t kMinInnerForChannelPath = 16;

using common::acc_type_of;
using common::check_channels;
using common::check_grad_shape;
using common::check_stat_dtypes;
using common::format_of;
using common::View;
using common::view_of;

// Chan's parallel merge of (n, mean, m2) with (nb, meanb, m2b).
inline void chan_merge(double& n, double& mean, double& m2, double nb, double meanb, double m2b) {
  if (nb <= 0) return;
  if (n <= 0) {
    n = nb;
    mean = meanb;
    m2 = m2b;
    return;
  }
  const double nt = n + nb;
  const double delta = meanb - mean;
  mean += delta * (nb / nt);
  m2 += m2b + delta * delta * (n * (nb / nt));
  n = nt;
}

// ---------------------------------------------------------------- vectors

// Native vector width: wider generic vectors would be lowered through memory.
#if defined(__AVX512F__)
#define SYNCBN_VEC_BYTES 64
#elif defined(__AVX__)
#define SYNCBN_VEC_BYTES 32
#else
#define SYNCBN_VEC_BYTES 16
#endif
// Elements per vector step: as many as one native vector holds doubles, so
// that kW floats widen to exactly one float64 vector.
constexpr int kW = SYNCBN_VEC_BYTES / 8;
typedef double DVec __attribute__((vector_size(kW * sizeof(double))));
typedef float FVec __attribute__((vector_size(kW * sizeof(float))));
typedef uint16_t U16Vec __attribute__((vector_size(kW * sizeof(uint16_t))));
typedef uint32_t U32Vec __attribute__((vector_size(kW * sizeof(uint32_t))));

// Vec<T>: kW elements of T loaded as a vector of the compute type E (float
// for float/half/bfloat16, double for double) and stored back.
template <typename T>
struct Vec;

template <>
struct Vec<float> {
  using E = float;
  using V = FVec;
  static V load(const float* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(float* p, V v) {
    std::memcpy(p, &v, sizeof v);
  }
};

template <>
struct Vec<double> {
  using E = double;
  using V = DVec;
  static V load(const double* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(double* p, V v) {
    std::memcpy(p, &v, sizeof v);
  }
};

template <>
struct Vec<c10::Half> {
  using E = float;
  using V = FVec;
  static V load(const c10::Half* p) {
#if defined(__F16C__) && SYNCBN_VEC_BYTES == 64
    return (V)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(__F16C__) && SYNCBN_VEC_BYTES == 32
    return (V)_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else
    float f[kW];
    for (int j = 0; j < kW; ++j) f[j] = static_cast<float>(p[j]);
    V v;
    std::memcpy(&v, f, sizeof v);
    return v;
#endif
  }
  // Rounds to nearest even, as c10::Half(float).
  static void store(c10::Half* p, V v) {
#if defined(__F16C__) && SYNCBN_VEC_BYTES == 64
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__) && SYNCBN_VEC_BYTES == 32
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_cvtps_ph((__m128)v, _MM_FROUND_TO_NEAREST_INT));
#else
    float f[kW];
    std::memcpy(f, &v, sizeof f);
    for (int j = 0; j < kW; ++j) p[j] = static_cast<c10::Half>(f[j]);
#endif
  }
};

template <>
struct Vec<c10::BFloat16> {
  using E = float;
  using V = FVec;
  // A bfloat16 is the upper half of a float: the shift is exact.
  static V load(const c10::BFloat16* p) {
#if defined(__AVX2__) && SYNCBN_VEC_BYTES == 64
    // One vpmovzxwd; GCC widens the generic vector below in two halves.
    return (V)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
#elif defined(__AVX2__) && SYNCBN_VEC_BYTES == 32
    return (V)_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 16);
#else
    U16Vec h;
    std::memcpy(&h, p, sizeof h);
    const U32Vec bits = __builtin_convertvector(h, U32Vec) << 16;
    V v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
#endif
  }
  // As c10::BFloat16(float): round to nearest even, NaN to the quiet NaN 0x7FC0.
  static void store(c10::BFloat16* p, V v) {
    U32Vec bits;
    std::memcpy(&bits, &v, sizeof bits);
    const U32Vec rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const U32Vec nan = (U32Vec)(v != v);  // all ones where v is NaN
    const U16Vec h = __builtin_convertvector((rounded & ~nan) | (nan & 0x7FC0u), U16Vec);
    std::memcpy(p, &h, sizeof h);
  }
};

template <typename T>
using compute_t = typename Vec<T>::E;

// One element as the compute type (exact).
template <typename T>
inline compute_t<T> scalar(T x) {
  return static_cast<compute_t<T>>(x);
}

inline DVec to_dvec(FVec v) {
  // One vcvtps2pd: GCC widens a generic float vector in two halves plus shuffles.
#if SYNCBN_VEC_BYTES == 64
  return (DVec)_mm512_cvtps_pd((__m256)v);
#elif SYNCBN_VEC_BYTES == 32
  return (DVec)_mm256_cvtps_pd((__m128)v);
#else
  return __builtin_convertvector(v, DVec);
#endif
}
inline DVec to_dvec(DVec v) {
  return v;
}

// The chunk a thread reads next: p[0, n), or nothing.
template <typename T>
struct Ahead {
  const T* p = nullptr;
  int64_t n = 0;
};

// Prefetches into L1 the cache lines of ahead.p[i, i + n). A thread's next
// chunk lies elsewhere in memory, where the hardware prefetcher does not
// follow; prefetching it a line at a time while the current chunk is being
// computed overlaps its memory reads with arithmetic. (A line may be asked for
// twice; that costs less than working out which lines are new.)
template <typename T>
inline void prefetch(const Ahead<T>& ahead, int64_t i, int64_t n) {
  constexpr int64_t kLine = 64 / sizeof(T);
  const int64_t end = std::min(i + n, ahead.n);
  for (int64_t j = i; j < end; j += kLine) __builtin_prefetch(ahead.p + j, 0, 3);
}

// ---------------------------------------------------------------- in-chunk sums

// Independent float64 accumulators per sum: two AVX-512, four AVX2 vectors.
constexpr int kLanes = 16;
constexpr int kLaneVecs = kLanes / kW;

// kLanes float64 accumulators. Element i of the whole groups of kLanes goes
// to lane i % kLanes; elements after the last whole group go to `tail`.
struct Lanes {
  DVec v[kLaneVecs] = {};
  double tail = 0;

  // The lanes combined in a fixed tree order, then the tail.
  double total() const {
    double acc[kLanes];
    std::memcpy(acc, v, sizeof acc);
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    return acc[0] + tail;
  }
};

// Sum of p[0, n) in float64.
template <typename T>
double sum_of(const T* p, int64_t n) {
  Lanes acc;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLaneVecs; ++k) acc.v[k] += to_dvec(Vec<T>::load(p + i + k * kW));
  for (; i < n; ++i) acc.tail += static_cast<double>(scalar(p[i]));
  return acc.total();
}

// The rough centre sums floats over runs of at most kRoughRun elements, in
// kRoughVecs vectors (enough to hide the add latency), and promotes each run's
// sum to float64.
constexpr int64_t kRoughRun = 256;
constexpr int kRoughVecs = 8;

// A rough mean of p[0, n): only the centre of chunk_moments' second pass,
// which removes its error. Float sums cost a fraction of widening every
// element to float64. (double input: the float64 mean.)
template <typename T>
double rough_mean(const T* p, int64_t n) {
  const double count = static_cast<double>(n);
  if constexpr (std::is_same_v<T, double>) {
    return sum_of(p, n) / count;
  } else {
    constexpr int kStep = kRoughVecs * kW;
    DVec runs = {};
    int64_t i = 0;
    while (i + kStep <= n) {
      FVec acc[kRoughVecs] = {};
      const int64_t run_end = std::min(n, i + kRoughRun);
      for (; i + kStep <= run_end; i += kStep)
        for (int k = 0; k < kRoughVecs; ++k) acc[k] += Vec<T>::load(p + i + k * kW);
      for (int w = kRoughVecs / 2; w > 0; w /= 2)
        for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
      runs += to_dvec(acc[0]);
    }
    double lanes[kW];
    std::memcpy(lanes, &runs, sizeof lanes);
    double total = 0;
    for (int j = 0; j < kW; ++j) total += lanes[j];
    for (; i < n; ++i) total += static_cast<double>(scalar(p[i]));
    const double mean = total / count;
    // A float partial sum can overflow where float64 does not (float or bfloat16 data near the float
    // range): then use the float64 sum, which is not finite only if the data are not.
    return std::isfinite(mean) ? mean : sum_of(p, n) / count;
  }
}

// Mean and M2 of p[0, n) by the corrected two-pass algorithm (see the top of
// the file). The second pass, on data in L1, prefetches the chunk `next`.
template <typename T>
void chunk_moments(const T* p, int64_t n, const Ahead<T>& next, double& mean, double& m2) {
  const double c = rough_mean(p, n);
  Lanes a1, a2;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    prefetch(next, i, kLanes);
    for (int k = 0; k < kLaneVecs; ++k) {
      const DVec d = to_dvec(Vec<T>::load(p + i + k * kW)) - c;
      a1.v[k] += d;
      a2.v[k] += d * d;
    }
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(scalar(p[i])) - c;
    a1.tail += d;
    a2.tail += d * d;
  }
  const double s1 = a1.total(), s2 = a2.total();
  const double count = static_cast<double>(n);
  mean = c + s1 / count;
  // Never negative in exact arithmetic; rounding must not make a constant chunk's M2 negative.
  // (std::max keeps a NaN s2.)
  m2 = std::max(s2 - s1 * (s1 / count), 0.0);
}

// Lanes of sum_dy and sum_dy_xmu, kept across the segments of one channel.
struct BackwardLanes {
  Lanes s, sx;
};

// Adds dy and dy * (x - mean) over [0, n) to the lanes, prefetching next_x and next_dy.
template <typename T>
void add_backward_sums(const T* x, const T* dy, int64_t n, double mean, const Ahead<T>& next_x,
                       const Ahead<T>& next_dy, BackwardLanes& lanes) {
  Lanes s = lanes.s, sx = lanes.sx;  // locals, so that they stay in registers
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    prefetch(next_x, i, kLanes);
    prefetch(next_dy, i, kLanes);
    for (int k = 0; k < kLaneVecs; ++k) {
      const DVec d = to_dvec(Vec<T>::load(dy + i + k * kW));
      s.v[k] += d;
      sx.v[k] += d * (to_dvec(Vec<T>::load(x + i + k * kW)) - mean);
    }
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(scalar(dy[i]));
    s.tail += d;
    sx.tail += d * (static_cast<double>(scalar(x[i])) - mean);
  }
  lanes.s = s;
  lanes.sx = sx;
}

// ---------------------------------------------------------------- row blocks

// Per-channel mean and M2 of channels [c0, C) of a block of nr rows
// [nr][C][inner], into mean[c] and m2[c] (zeroed by the caller): plain
// two-pass with one float64 accumulator per channel, in memory.
template <typename T>
void block_moments(const T* q, int64_t nr, int64_t C, int64_t inner, int64_t c0, double* __restrict mean,
                   double* __restrict m2) {
  const int64_t row = C * inner;
  const double n = static_cast<double>(nr * inner);
  for (int64_t r = 0; r < nr; ++r) {
    const T* p = q + r * row;
    for (int64_t c = c0; c < C; ++c)
      for (int64_t i = 0; i < inner; ++i) mean[c] += static_cast<double>(scalar(p[c * inner + i]));
  }
  for (int64_t c = c0; c < C; ++c) mean[c] /= n;
  for (int64_t r = 0; r < nr; ++r) {
    const T* p = q + r * row;
    for (int64_t c = c0; c < C; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const double d = static_cast<double>(scalar(p[c * inner + i])) - mean[c];
        m2[c] += d * d;
      }
  }
}

// Per-channel sum_dy and sum_dy_xmu of channels [c0, C) of a block of nr rows, added to s[c] and sx[c].
template <typename T>
void block_backward_sums(const T* xq, const T* dq, int64_t nr, int64_t C, int64_t inner, int64_t c0,
                         const double* mean, double* __restrict s, double* __restrict sx) {
  const int64_t row = C * inner;
  for (int64_t r = 0; r < nr; ++r) {
    const T* x = xq + r * row;
    const T* dy = dq + r * row;
    for (int64_t c = c0; c < C; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const double d = static_cast<double>(scalar(dy[c * inner + i]));
        s[c] += d;
        sx[c] += d * (static_cast<double>(scalar(x[c * inner + i])) - mean[c]);
      }
  }
}

// Channels-last blocks (inner == 1): a channel is a column of the block.
// Columns are taken G vectors (G * kW channels) at a time, whose accumulators
// stay in registers while the block's rows stream from L1. Each channel's sums
// run over the rows in order, whatever G is; channels left over after the
// whole vectors use block_moments / block_backward_sums.
constexpr int kColumnGroup = SYNCBN_VEC_BYTES == 64 ? 8 : 4;

// The corrected two-pass of chunk_moments, per channel (float, half, bfloat16).
// The second pass prefetches the same columns of the next block.
template <int G, typename T>
void column_moments(const T* q, int64_t nr, int64_t C, int64_t c0, const Ahead<T>& next, double* mean,
                    double* m2) {
  constexpr int kCols = G * kW;
  const double n = static_cast<double>(nr);
  DVec sum[G] = {};
  for (int64_t r0 = 0; r0 < nr; r0 += kRoughRun) {
    FVec acc[G] = {};
    const int64_t r1 = std::min(nr, r0 + kRoughRun);
    for (int64_t r = r0; r < r1; ++r)
      for (int g = 0; g < G; ++g) acc[g] += Vec<T>::load(q + r * C + c0 + g * kW);
    for (int g = 0; g < G; ++g) sum[g] += to_dvec(acc[g]);
  }
  double centre[kCols];
  std::memcpy(centre, sum, sizeof centre);
  for (int j = 0; j < kCols; ++j) {
    centre[j] /= n;
    if (!std::isfinite(centre[j])) {  // a float partial sum overflowed (or the data are not finite)
      double exact = 0;
      for (int64_t r = 0; r < nr; ++r) exact += static_cast<double>(scalar(q[r * C + c0 + j]));
      centre[j] = exact / n;
    }
  }
  DVec cen[G], s1[G] = {}, s2[G] = {};
  std::memcpy(cen, centre, sizeof cen);
  for (int64_t r = 0; r < nr; ++r) {
    prefetch(next, r * C + c0, kCols);
    for (int g = 0; g < G; ++g) {
      const DVec d = to_dvec(Vec<T>::load(q + r * C + c0 + g * kW)) - cen[g];
      s1[g] += d;
      s2[g] += d * d;
    }
  }
  double a1[kCols], a2[kCols];
  std::memcpy(a1, s1, sizeof a1);
  std::memcpy(a2, s2, sizeof a2);
  for (int j = 0; j < kCols; ++j) {
    mean[c0 + j] = centre[j] + a1[j] / n;
    m2[c0 + j] = std::max(a2[j] - a1[j] * (a1[j] / n), 0.0);
  }
}

// Per-channel mean and M2 of a channels-last block into mean[C], m2[C] (zeroed by the caller),
// prefetching the block `next`.
template <typename T>
void rows_moments(const T* q, int64_t nr, int64_t C, const Ahead<T>& next, double* mean, double* m2) {
  int64_t c = 0;
  if constexpr (!std::is_same_v<T, double>) {
    for (; c + kColumnGroup * kW <= C; c += kColumnGroup * kW)
      column_moments<kColumnGroup>(q, nr, C, c, next, mean, m2);
    for (; c + kW <= C; c += kW) column_moments<1>(q, nr, C, c, next, mean, m2);
  }
  block_moments(q, nr, C, 1, c, mean, m2);  // channels left over (all of them for double)
}

template <int G, typename T>
void column_backward_sums(const T* xq, const T* dq, int64_t nr, int64_t C, int64_t c0, const double* mean,
                          const Ahead<T>& next_x, const Ahead<T>& next_dy, double* s, double* sx) {
  DVec m[G], as[G] = {}, asx[G] = {};
  std::memcpy(m, mean + c0, sizeof m);
  for (int64_t r = 0; r < nr; ++r) {
    prefetch(next_x, r * C + c0, G * kW);
    prefetch(next_dy, r * C + c0, G * kW);
    for (int g = 0; g < G; ++g) {
      const int64_t k = r * C + c0 + g * kW;
      const DVec d = to_dvec(Vec<T>::load(dq + k));
      as[g] += d;
      asx[g] += d * (to_dvec(Vec<T>::load(xq + k)) - m[g]);
    }
  }
  std::memcpy(s + c0, as, sizeof as);
  std::memcpy(sx + c0, asx, sizeof asx);
}

// Per-channel sum_dy and sum_dy_xmu of a channels-last block into s[C], sx[C] (zeroed by the caller),
// prefetching the next block.
template <typename T>
void rows_backward_sums(const T* xq, const T* dq, int64_t nr, int64_t C, const double* mean,
                        const Ahead<T>& next_x, const Ahead<T>& next_dy, double* s, double* sx) {
  int64_t c = 0;
  for (; c + kColumnGroup * kW <= C; c += kColumnGroup * kW)
    column_backward_sums<kColumnGroup>(xq, dq, nr, C, c, mean, next_x, next_dy, s, sx);
  for (; c + kW <= C; c += kW) column_backward_sums<1>(xq, dq, nr, C, c, mean, next_x, next_dy, s, sx);
  block_backward_sums(xq, dq, nr, C, 1, c, mean, s, sx);  // channels left over
}

// ---------------------------------------------------------------- moments

// Per-channel count, mean and M2 (sum of squared deviations) in float64.
struct Moments {
  double count = 0;
  std::vector<double> mean, m2;
};

template <typename T>
Moments moments_cpu(const Tensor& x, const View& v) {
  Moments out;
  out.mean.assign(v.channels, 0.0);
  out.m2.assign(v.channels, 0.0);
  out.count = static_cast<double>(v.outer * v.inner);
  if (v.outer == 0 || v.inner == 0 || v.channels == 0) return out;
  const T* data = x.data_ptr<T>();
  const int64_t C = v.channels;
  const int64_t inner = v.inner;

  if (inner >= kMinInnerForChannelPath) {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      // The chunk this thread reads after chunk s of (sample o, channel c).
      auto next_chunk = [&](int64_t c, int64_t o, int64_t s) -> Ahead<T> {
        if (s + kBlockElems < inner)
          return {data + (o * C + c) * inner + s + kBlockElems, std::min(kBlockElems, inner - s - kBlockElems)};
        if (o + 1 < v.outer) return {data + ((o + 1) * C + c) * inner, std::min(kBlockElems, inner)};
        if (c + 1 < c1) return {data + (c + 1) * inner, std::min(kBlockElems, inner)};
        return {};
      };
      for (int64_t c = c0; c < c1; ++c) {
        double n = 0, mean = 0, m2 = 0;
        for (int64_t o = 0; o < v.outer; ++o) {
          const T* seg = data + (o * C + c) * inner;
          for (int64_t s = 0; s < inner; s += kBlockElems) {
            const int64_t len = std::min(kBlockElems, inner - s);
            double bm, bm2;
            chunk_moments(seg + s, len, next_chunk(c, o, s), bm, bm2);
            chan_merge(n, mean, m2, static_cast<double>(len), bm, bm2);
          }
        }
        out.mean[c] = mean;
        out.m2[c] = m2;
      }
    });
    return out;
  }

  // Row-block path: a row is one `outer` index, C*inner elements.
  const int64_t row = C * inner;
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockElems / row);
  const int64_t nblocks = (v.outer + rows_per_block - 1) / rows_per_block;
  std::vector<double> part_mean(nblocks * C, 0.0), part_m2(nblocks * C, 0.0);
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * rows_per_block;
      const int64_t nr = std::min(v.outer, r0 + rows_per_block) - r0;
      const T* q = data + r0 * row;
      double* bm = part_mean.data() + b * C;
      double* bm2 = part_m2.data() + b * C;
      if (inner == 1) {
        // Blocks follow each other in memory: prefetch the next one if this thread reads it.
        Ahead<T> next;
        if (b + 1 < b1) next = {q + nr * row, (std::min(v.outer, r0 + 2 * rows_per_block) - r0 - nr) * row};
        rows_moments(q, nr, C, next, bm, bm2);
      } else {
        block_moments(q, nr, C, inner, 0, bm, bm2);
      }
    }
  });
  // Chan's merge in block order. All channels of a block share its count, so the weights are computed
  // once per block (the same expressions as chan_merge) and the update vectorizes over channels.
  double* mean = out.mean.data();
  double* m2 = out.m2.data();
  double n = 0;
  for (int64_t b = 0; b < nblocks; ++b) {
    const double nb = static_cast<double>((std::min(v.outer, (b + 1) * rows_per_block) - b * rows_per_block) * inner);
    const double* bm = part_mean.data() + b * C;
    const double* bm2 = part_m2.data() + b * C;
    if (n <= 0) {
      std::copy(bm, bm + C, mean);
      std::copy(bm2, bm2 + C, m2);
    } else {
      const double wb = nb / (n + nb);
      const double wab = n * wb;
      for (int64_t c = 0; c < C; ++c) {
        const double delta = bm[c] - mean[c];
        mean[c] += delta * wb;
        m2[c] += bm2[c] + delta * delta * wab;
      }
    }
    n += nb;
  }
  return out;
}

Moments moments(const Tensor& input) {
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const View v = view_of(x, fmt);
  Moments m;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_moments", [&] {
    m = moments_cpu<scalar_t>(x, v);
  });
  return m;
}

// Reads a 1-D float tensor (any floating or integer dtype) as doubles.
std::vector<double> as_doubles(const Tensor& t) {
  const Tensor d = t.detach().to(at::kDouble).contiguous();
  const double* p = d.data_ptr<double>();
  return std::vector<double>(p, p + d.numel());
}

// Per-channel (scale, shift) such that y = (x - mean) * scale + shift.
struct Affine {
  std::vector<double> mean, scale, shift;
};

Affine affine_of(const Tensor& mean, const Tensor& invstd, const c10::optional<Tensor>& weight,
                 const c10::optional<Tensor>& bias, int64_t C) {
  check_channels(mean.numel(), C, "mean");
  check_channels(invstd.numel(), C, "invstd");
  Affine a;
  a.mean = as_doubles(mean);
  a.scale = as_doubles(invstd);
  a.shift.assign(C, 0.0);
  if (weight.has_value() && weight->defined()) {
    check_channels(weight->numel(), C, "weight");
    const auto w = as_doubles(*weight);
    for (int64_t c = 0; c < C; ++c) a.scale[c] *= w[c];
  }
  if (bias.has_value() && bias->defined()) {
    check_channels(bias->numel(), C, "bias");
    a.shift = as_doubles(*bias);
  }
  return a;
}

// ---------------------------------------------------------------- elementwise

// A float64 mean as hi + lo in E. For float, hi = float(mean) and lo = the
// rest, so (x - hi) - lo keeps the digits of x - mean that rounding the mean
// to float would lose (x - hi is exact when x is near hi). For double, lo = 0.
// A mean that is not finite in E gets lo = 0 (inf - inf would make it NaN).
template <typename E>
void split_mean(const std::vector<double>& mean, std::vector<E>& hi, std::vector<E>& lo) {
  hi.resize(mean.size());
  lo.resize(mean.size());
  for (size_t c = 0; c < mean.size(); ++c) {
    hi[c] = static_cast<E>(mean[c]);
    lo[c] = std::isfinite(hi[c]) ? static_cast<E>(mean[c] - static_cast<double>(hi[c])) : E(0);
  }
}

template <typename E>
std::vector<E> rounded(const std::vector<double>& v) {
  return std::vector<E>(v.begin(), v.end());
}

// Applies op over the [outer][C][inner] view:
//   op.run(c, x, dy, y, n)        n contiguous elements of channel c;
//   op.run_rows(x, dy, y, nr, C)  nr whole rows of a channels-last view (inner == 1), where the channel
//                                 varies fastest, so the per-channel coefficients are loaded as vectors.
// dy may be null (then op ignores it).
template <typename T, typename Op>
void map_elements(const View& v, const T* x, const T* dy, T* out, const Op& op) {
  const int64_t C = v.channels, inner = v.inner;
  const int64_t row = C * inner;
  if (inner >= kMinInnerForChannelPath) {
    at::parallel_for(0, v.outer * C, 1, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t k = s * inner;
        op.run(s % C, x + k, dy ? dy + k : nullptr, out + k, inner);
      }
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(row, 1));
  at::parallel_for(0, v.outer, grain, [&](int64_t r0, int64_t r1) {
    const int64_t k = r0 * row;
    if (inner == 1) {
      op.run_rows(x + k, dy ? dy + k : nullptr, out + k, r1 - r0, C);
      return;
    }
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t off = r * row + c * inner;
        op.run(c, x + off, dy ? dy + off : nullptr, out + off, inner);
      }
  });
}

// y = ((x - mean_hi) - mean_lo) * scale + shift, per channel, in compute_t<T>.
template <typename T>
struct ElemtOp {
  using E = compute_t<T>;
  using VT = Vec<T>;
  using VE = Vec<E>;  // coefficient vectors
  std::vector<E> mean_hi, mean_lo, scale, shift;

  template <typename X, typename K>
  static X f(X x, K mh, K ml, K a, K b) {
    return ((x - mh) - ml) * a + b;
  }
  void run(int64_t c, const T* x, const T*, T* y, int64_t n) const {
    const E mh = mean_hi[c], ml = mean_lo[c], a = scale[c], b = shift[c];
    int64_t i = 0;
    for (; i + kW <= n; i += kW) VT::store(y + i, f(VT::load(x + i), mh, ml, a, b));
    for (; i < n; ++i) y[i] = static_cast<T>(f(scalar(x[i]), mh, ml, a, b));
  }
  void run_rows(const T* x, const T*, T* y, int64_t nr, int64_t C) const {
    for (int64_t r = 0; r < nr; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      int64_t c = 0;
      for (; c + kW <= C; c += kW)
        VT::store(yr + c, f(VT::load(xr + c), VE::load(&mean_hi[c]), VE::load(&mean_lo[c]), VE::load(&scale[c]),
                            VE::load(&shift[c])));
      for (; c < C; ++c) yr[c] = static_cast<T>(f(scalar(xr[c]), mean_hi[c], mean_lo[c], scale[c], shift[c]));
    }
  }
};

// dx = ((dy - grad_mean) - ((x - mean_hi) - mean_lo) * proj) * gscale, per channel, in compute_t<T>.
template <typename T>
struct BackwardElemtOp {
  using E = compute_t<T>;
  using VT = Vec<T>;
  using VE = Vec<E>;
  std::vector<E> mean_hi, mean_lo, grad_mean, proj, gscale;

  template <typename X, typename K>
  static X f(X x, X dy, K mh, K ml, K gm, K p, K g) {
    return ((dy - gm) - ((x - mh) - ml) * p) * g;
  }
  void run(int64_t c, const T* x, const T* dy, T* y, int64_t n) const {
    const E mh = mean_hi[c], ml = mean_lo[c], gm = grad_mean[c], p = proj[c], g = gscale[c];
    int64_t i = 0;
    for (; i + kW <= n; i += kW) VT::store(y + i, f(VT::load(x + i), VT::load(dy + i), mh, ml, gm, p, g));
    for (; i < n; ++i) y[i] = static_cast<T>(f(scalar(x[i]), scalar(dy[i]), mh, ml, gm, p, g));
  }
  void run_rows(const T* x, const T* dy, T* y, int64_t nr, int64_t C) const {
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t k = r * C;
      int64_t c = 0;
      for (; c + kW <= C; c += kW)
        VT::store(y + k + c, f(VT::load(x + k + c), VT::load(dy + k + c), VE::load(&mean_hi[c]),
                               VE::load(&mean_lo[c]), VE::load(&grad_mean[c]), VE::load(&proj[c]),
                               VE::load(&gscale[c])));
      for (; c < C; ++c)
        y[k + c] = static_cast<T>(
            f(scalar(x[k + c]), scalar(dy[k + c]), mean_hi[c], mean_lo[c], grad_mean[c], proj[c], gscale[c]));
    }
  }
};

// ---------------------------------------------------------------- ATen-contract ops

std::tuple<Tensor, Tensor> batch_norm_stats(const Tensor& input, double eps) {
  const Moments m = moments(input);
  const int64_t C = input.size(1);
  auto opts = input.options().dtype(acc_type_of(input.scalar_type()));
  Tensor mean = at::empty({C}, opts.dtype(at::kDouble));
  Tensor invstd = at::empty({C}, opts.dtype(at::kDouble));
  double* pm = mean.data_ptr<double>();
  double* pi = invstd.data_ptr<double>();
  for (int64_t c = 0; c < C; ++c) {
    pm[c] = m.mean[c];
    // An empty input has no variance: 0/0 gives NaN, as the CUDA kernel does.
    pi[c] = 1.0 / std::sqrt(m.m2[c] / m.count + eps);
  }
  return {mean.to(opts.dtype()), invstd.to(opts.dtype())};
}

std::tuple<Tensor, Tensor> batch_norm_gather_stats_with_counts(const Tensor& input, const Tensor& mean,
                                                               const Tensor& invstd,
                                                               const c10::optional<Tensor>& running_mean,
                                                               const c10::optional<Tensor>& running_var,
                                                               double momentum, double eps, const Tensor& counts) {
  const int64_t W = common::check_gathered(mean, invstd, counts), C = mean.size(1);
  const auto vm = as_doubles(mean);
  const auto vi = as_doubles(invstd);
  const auto vc = as_doubles(counts);
  std::vector<double> out_mean(C), out_var_n(C), out_n(C);
  for (int64_t c = 0; c < C; ++c) {
    double n = 0, avg = 0, var_n = 0;
    for (int64_t j = 0; j < W; ++j) {
      const double cnt = vc[j];
      if (cnt <= 0) continue;  // an empty rank contributes nothing
      const double inv = vi[j * C + c];
      const double var = 1.0 / (inv * inv) - eps;
      chan_merge(n, avg, var_n, cnt, vm[j * C + c], var * cnt);
    }
    out_mean[c] = avg;
    out_var_n[c] = var_n;
    out_n[c] = n;
  }
  const auto out_dtype = acc_type_of(mean.scalar_type());
  Tensor r_mean = at::empty({C}, mean.options().dtype(at::kDouble));
  Tensor r_invstd = at::empty({C}, mean.options().dtype(at::kDouble));
  for (int64_t c = 0; c < C; ++c) {
    r_mean.data_ptr<double>()[c] = out_mean[c];
    r_invstd.data_ptr<double>()[c] = 1.0 / std::sqrt(out_var_n[c] / out_n[c] + eps);
  }
  if (running_mean.has_value() && running_mean->defined()) {
    Tensor rm = *running_mean;
    check_channels(rm.numel(), C, "running_mean");
    Tensor upd = rm.to(at::kDouble) * (1.0 - momentum) + r_mean * momentum;
    rm.copy_(upd.view(rm.sizes()));
  }
  if (running_var.has_value() && running_var->defined()) {
    Tensor rv = *running_var;
    check_channels(rv.numel(), C, "running_var");
    Tensor unbiased = at::empty({C}, mean.options().dtype(at::kDouble));
    for (int64_t c = 0; c < C; ++c) unbiased.data_ptr<double>()[c] = out_var_n[c] / (out_n[c] - 1.0);
    Tensor upd = rv.to(at::kDouble) * (1.0 - momentum) + unbiased * momentum;
    rv.copy_(upd.view(rv.sizes()));
  }
  (void)input;
  return {r_mean.to(out_dtype), r_invstd.to(out_dtype)};
}

Tensor batch_norm_elemt(const Tensor& input, const c10::optional<Tensor>& weight, const c10::optional<Tensor>& bias,
                        const Tensor& mean, const Tensor& invstd, double eps) {
  (void)eps;  // invstd already includes eps, as in the ATen op
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const View v = view_of(x, fmt);
  const Affine a = affine_of(mean, invstd, weight, bias, v.channels);
  Tensor out = at::empty_like(x, x.options(), fmt);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_elemt", [&] {
    using E = compute_t<scalar_t>;
    ElemtOp<scalar_t> op;
    split_mean(a.mean, op.mean_hi, op.mean_lo);
    op.scale = rounded<E>(a.scale);
    op.shift = rounded<E>(a.shift);
    map_elements<scalar_t>(v, x.data_ptr<scalar_t>(), nullptr, out.data_ptr<scalar_t>(), op);
  });
  return out;
}

template <typename T>
void backward_sums(const Tensor& x, const Tensor& dy, const View& v, const std::vector<double>& mean,
                   std::vector<double>& sum_dy, std::vector<double>& sum_dy_xmu) {
  const int64_t C = v.channels, inner = v.inner;
  sum_dy.assign(C, 0.0);
  sum_dy_xmu.assign(C, 0.0);
  if (v.outer == 0 || inner == 0 || C == 0) return;
  const T* px = x.data_ptr<T>();
  const T* pd = dy.data_ptr<T>();
  if (inner >= kMinInnerForChannelPath) {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        BackwardLanes lanes;
        for (int64_t o = 0; o < v.outer; ++o) {
          const int64_t off = (o * C + c) * inner;
          // The segment this thread reads next.
          const int64_t next = o + 1 < v.outer ? off + C * inner : (c + 1 < c1 ? (c + 1) * inner : -1);
          Ahead<T> next_x, next_dy;
          if (next >= 0) {
            next_x = {px + next, inner};
            next_dy = {pd + next, inner};
          }
          add_backward_sums(px + off, pd + off, inner, mean[c], next_x, next_dy, lanes);
        }
        sum_dy[c] = lanes.s.total();
        sum_dy_xmu[c] = lanes.sx.total();
      }
    });
    return;
  }
  const int64_t row = C * inner;
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockElems / row);
  const int64_t nblocks = (v.outer + rows_per_block - 1) / rows_per_block;
  std::vector<double> ps(nblocks * C, 0.0), psx(nblocks * C, 0.0);
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * rows_per_block;
      const int64_t nr = std::min(v.outer, r0 + rows_per_block) - r0;
      const int64_t k = r0 * row;
      if (inner == 1) {
        // Blocks follow each other in memory: prefetch the next one if this thread reads it.
        Ahead<T> next_x, next_dy;
        if (b + 1 < b1) {
          const int64_t next_len = (std::min(v.outer, r0 + 2 * rows_per_block) - r0 - nr) * row;
          next_x = {px + k + nr * row, next_len};
          next_dy = {pd + k + nr * row, next_len};
        }
        rows_backward_sums(px + k, pd + k, nr, C, mean.data(), next_x, next_dy, ps.data() + b * C,
                           psx.data() + b * C);
      } else {
        block_backward_sums(px + k, pd + k, nr, C, inner, 0, mean.data(), ps.data() + b * C, psx.data() + b * C);
      }
    }
  });
  for (int64_t b = 0; b < nblocks; ++b)
    for (int64_t c = 0; c < C; ++c) {
      sum_dy[c] += ps[b * C + c];
      sum_dy_xmu[c] += psx[b * C + c];
    }
}

Tensor doubles_to(const std::vector<double>& v, const at::TensorOptions& opts) {
  Tensor t = at::empty({static_cast<int64_t>(v.size())}, opts.dtype(at::kDouble));
  std::copy(v.begin(), v.end(), t.data_ptr<double>());
  return t.to(opts.dtype());
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_backward_reduce(const Tensor& grad_out, const Tensor& input,
                                                                      const Tensor& mean, const Tensor& invstd,
                                                                      const c10::optional<Tensor>& weight,
                                                                      bool input_g, bool weight_g, bool bias_g) {
  check_grad_shape(grad_out, input);
  check_stat_dtypes(mean, invstd);
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const Tensor dy = grad_out.to(x.scalar_type()).contiguous(fmt);
  const View v = view_of(x, fmt);
  const auto vmean = as_doubles(mean);
  const auto vinv = as_doubles(invstd);
  check_channels(static_cast<int64_t>(vmean.size()), v.channels, "mean");
  check_channels(static_cast<int64_t>(vinv.size()), v.channels, "invstd");
  std::vector<double> s, sx;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_backward_reduce",
                                  [&] { backward_sums<scalar_t>(x, dy, v, vmean, s, sx); });
  const bool has_w = weight.has_value() && weight->defined();
  const auto wopts = has_w ? weight->options() : input.options();
  Tensor sum_dy, sum_dy_xmu, grad_weight, grad_bias;
  if (input_g) {
    sum_dy = doubles_to(s, mean.options());
    sum_dy_xmu = doubles_to(sx, mean.options());
  }
  if (weight_g) {
    std::vector<double> gw(v.channels);
    for (int64_t c = 0; c < v.channels; ++c) gw[c] = sx[c] * vinv[c];
    grad_weight = doubles_to(gw, wopts);
  }
  if (bias_g) grad_bias = doubles_to(s, wopts);
  return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
}

Tensor batch_norm_backward_elemt(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                 const Tensor& invstd, const c10::optional<Tensor>& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xmu, const Tensor& count) {
  check_grad_shape(grad_out, input);
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const Tensor dy = grad_out.to(x.scalar_type()).contiguous(fmt);
  const View v = view_of(x, fmt);
  const int64_t C = v.channels;
  double total = 0;
  for (double n : as_doubles(count)) total += n;
  common::check_total(total);
  const auto vm = as_doubles(mean), vi = as_doubles(invstd), s = as_doubles(sum_dy), sx = as_doubles(sum_dy_xmu);
  check_channels(static_cast<int64_t>(vm.size()), C, "mean");
  check_channels(static_cast<int64_t>(s.size()), C, "sum_dy");
  check_channels(static_cast<int64_t>(sx.size()), C, "sum_dy_xmu");
  check_channels(static_cast<int64_t>(vi.size()), C, "invstd");
  std::vector<double> w(C, 1.0);
  if (weight.has_value() && weight->defined()) {
    w = as_doubles(*weight);
    check_channels(static_cast<int64_t>(w.size()), C, "weight");
  }
  std::vector<double> grad_mean(C), proj(C), gscale(C);
  for (int64_t c = 0; c < C; ++c) {
    grad_mean[c] = s[c] / total;
    proj[c] = sx[c] / total * vi[c] * vi[c];
    gscale[c] = vi[c] * w[c];
  }
  Tensor out = at::empty_like(x, x.options(), fmt);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_backward_elemt", [&] {
    using E = compute_t<scalar_t>;
    BackwardElemtOp<scalar_t> op;
    split_mean(vm, op.mean_hi, op.mean_lo);
    op.grad_mean = rounded<E>(grad_mean);
    op.proj = rounded<E>(proj);
    op.gscale = rounded<E>(gscale);
    map_elements<scalar_t>(v, x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                           op);
  });
  return out;
}

// ---------------------------------------------------------------- reference ops

Tensor welford_stats(const Tensor& input) {
  const Moments m = moments(input);
  const int64_t C = input.size(1);
  Tensor out = at::empty({2 * C + 1}, input.options().dtype(at::kDouble));
  double* p = out.data_ptr<double>();
  p[0] = m.count;
  std::copy(m.mean.begin(), m.mean.end(), p + 1);
  std::copy(m.m2.begin(), m.m2.end(), p + 1 + C);
  return out;
}

Tensor welford_merge(const Tensor& gathered) {
  common::check_welford_rows(gathered);
  const Tensor g = gathered.contiguous();
  const int64_t W = g.size(0), C = (g.size(1) - 1) / 2;
  const double* p = g.data_ptr<double>();
  Tensor out = at::zeros({2 * C + 1}, g.options());
  double* o = out.data_ptr<double>();
  for (int64_t c = 0; c < C; ++c) {
    double n = 0, mean = 0, m2 = 0;
    for (int64_t j = 0; j < W; ++j) {
      const double* row = p + j * (2 * C + 1);
      chan_merge(n, mean, m2, row[0], row[1 + c], row[1 + C + c]);
    }
    o[0] = n;
    o[1 + c] = mean;
    o[1 + C + c] = m2;
  }
  if (C == 0) {
    for (int64_t j = 0; j < W; ++j) o[0] += std::max(0.0, p[j]);
  }
  return out;
}

// Mean and invstd from a merged row [count, mean[C], M2[C]], and the running statistics updated in
// place with the unbiased variance. The same ATen operations, in the same order, as the reference
// module's forward used before this op existed, so its CPU results are unchanged bit for bit.
// count < 1 (every rank empty): mean 0, invstd 1, running statistics kept. count 1 (the module
// refuses it before calling this; the CUDA kernel cannot raise under graph capture): NaN, kept.
std::tuple<Tensor, Tensor> welford_finish(const Tensor& merged, const c10::optional<Tensor>& running_mean,
                                          const c10::optional<Tensor>& running_var, double momentum, double eps) {
  const int64_t C = common::check_welford_row(merged);
  const double n = merged.select(0, 0).item<double>();  // a CPU tensor: no device sync
  const Tensor mean = merged.narrow(0, 1, C);
  const Tensor m2 = merged.narrow(0, 1 + C, C);
  if (!(n >= 2)) {
    if (n < 1) return {at::zeros_like(mean), at::ones_like(m2)};
    return {at::full_like(mean, std::numeric_limits<double>::quiet_NaN()),
            at::full_like(m2, std::numeric_limits<double>::quiet_NaN())};
  }
  Tensor invstd = at::rsqrt(m2 / n + eps);
  if (running_mean.has_value() && running_mean->defined()) {
    Tensor rm = *running_mean;
    check_channels(rm.numel(), C, "running_mean");
    rm.copy_((rm.to(at::kDouble) * (1 - momentum) + mean * momentum).view(rm.sizes()));
  }
  if (running_var.has_value() && running_var->defined()) {
    Tensor rv = *running_var;
    check_channels(rv.numel(), C, "running_var");
    const Tensor unbiased = m2 / (n - 1);
    rv.copy_((rv.to(at::kDouble) * (1 - momentum) + unbiased * momentum).view(rv.sizes()));
  }
  return {mean.clone(), invstd};
}

}  // namespace

TORCH_LIBRARY_IMPL(syncbn_ref, CPU, m) {
  m.impl("batch_norm_stats", &batch_norm_stats);
  m.impl("batch_norm_gather_stats_with_counts", &batch_norm_gather_stats_with_counts);
  m.impl("batch_norm_elemt", &batch_norm_elemt);
  m.impl("batch_norm_backward_reduce", &batch_norm_backward_reduce);
  m.impl("batch_norm_backward_elemt", &batch_norm_backward_elemt);
  m.impl("welford_stats", &welford_stats);
  m.impl("welford_merge", &welford_merge);
  m.impl("welford_finish", &welford_finish);
}

}  // namespace syncbn_ref
