// CUDA kernels of the syncbn_ref ops (schemas in ../ops.cpp; the CPU twin,
// whose semantics these follow op by op, is ../cpu/syncbn_cpu.cpp). The design,
// its reasons and measurements: docs/reference-kernels.md.
//
// Design note
// -----------
// Semantics. Same checks, output dtypes (statistics in float for
// half/bfloat16/float input, double for double; welford_* always float64),
// output memory formats, and empty-input / zero-count results as the CPU
// kernels: an empty input gives mean 0 and invstd NaN (0/0), a gathered row
// with count <= 0 contributes nothing. Outputs live where the CPU code puts
// them. Big tensors (input, grad_out) must be CUDA tensors on one device;
// small per-channel tensors (mean, invstd, weight, bias, sums, counts, running
// statistics) are read and written by the kernels IN THEIR OWN DTYPE (In/Out
// below): no conversion launches. One from another device is copied first (a
// host sync: the harness never does that).
//
// One launch per op (plus a cudaMemsetAsync of a few counters where a channel
// is split over blocks), and no host sync: batch_norm_backward_elemt sums a
// CUDA count tensor inside the kernel (a CPU count is summed on the host, where
// the "count must be positive" check stays); with a CUDA count, a total <= 0
// gives non-finite gradients, as torch's own kernel does. Every op can be
// captured in a CUDA graph.
//
// Layout. Inputs are made contiguous in input.suggest_memory_format() and
// seen as [outer][C][inner], like the CPU file:
//   contiguous:         outer = N,          inner = prod(spatial)
//   channels_last(_3d): outer = N*spatial,  inner = 1
// inner >= 2 ("planes": channel c's data is `outer` contiguous runs of
// `inner`): reductions run a grid of (channel, split) blocks, each walking a
// fixed slice of the channel's runs with (run, position) indices advanced
// incrementally (no per-element division); elementwise ops run tiles of one
// plane chunk, or of several whole planes, whose per-channel coefficients are
// computed once per tile into shared memory. inner == 1 ("rows" of C columns:
// channels-last, 2-D input): a thread owns VEC adjacent columns and strides
// over rows; a block is (column threads) x (row threads), a grid (column
// tiles, row splits). Loads are 16 bytes (float: 4, double: 2) or 8 bytes
// (half, bfloat16: 4) where the pointer and the run length or C allow, scalar
// otherwise; indices are 32-bit below 2^30 elements (and C <= 2^22, so that no
// index plus step can overflow), 64-bit above.
//
// Statistics. Float64 throughout, with no division per element: a thread
// loads a chunk (U vectors, 8 to 16 elements; U rows of its columns) and
// accumulates shifted sums s1 = sum(d), s2 = sum(d^2), d = x - K, with K its
// running mean (the chunk's first value for the first chunk); then
//   n' = n + k,  mean' = K + s1/n',  M2' = M2 + s2 - s1^2/n'
// (exact algebra: the chunk merged into (n, mean, M2) by Chan's formula with
// one division per chunk). A large offset over a small spread costs nothing:
// d is small. A block's threads merge as sums too: each thread's (n, mean, M2)
// becomes (n, n*d, M2 + n*d^2) relative to its warp's lane-0 mean, warps add
// by shuffles, warp 0 re-centres the warps' sums on one centre and adds them
// (one division per block, not one per merge); the row kernels' column groups
// merge with Chan's formula in shared memory. A channel split over blocks has
// each block write its partial, and the last block to finish (a
// __threadfence + atomic ticket per channel or column tile) merges the
// partials in split order relative to split 0's mean, as sums (no division on
// that serial path, loads two splits ahead), and writes the outputs in their
// final dtype. Splits depend only on the shape: results are the same run to
// run (and on every GPU). Row reductions use 512-thread blocks and about one
// wave of them, so that the last block reads at most a few partials per thread.
//
// Elementwise. x - mean in float64 (mean can be a large offset over a tiny
// spread), then, like the CPU kernels, the rest in float for
// float/half/bfloat16 (double for double) with coefficients rounded to that
// type once per channel: y = (x - mean) * scale + shift, and
// dx = (dy - grad_mean - (x - mean) * proj) * gscale. Results are within a few
// roundings of the output dtype of the CPU kernel's, not bit-identical.
//
// Per-channel formulas that the CPU evaluates on the same inputs (gather,
// welford_merge, welford_finish) use the non-contracting __dadd_rn /
// __dmul_rn intrinsics: the CPU build does not fuse them either, so given
// equal inputs they match bit for bit.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
// For c10::cuda::getCurrentCUDAStream. Not ATen/cuda/CUDAContext.h: it pulls in
// cuSPARSE/cuBLAS/cuSOLVER headers, which a bare nvcc toolkit may lack.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include "../common.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace syncbn_ref {
namespace {

using at::Tensor;
using common::acc_type_of;
using common::check_channels;
using common::check_grad_shape;
using common::check_stat_dtypes;
using common::format_of;
using common::View;
using common::view_of;

constexpr int kThreads = 256;               // threads per block (at most) of the big kernels
constexpr int kRowThreads = 512;            // row reductions: more threads per column group for the last-block merge
constexpr int64_t kMax32 = int64_t{1} << 30;  // 32-bit indices below this many elements...
constexpr int64_t kMaxC32 = int64_t{1} << 22;  // ...and this many channels
constexpr int64_t kTargetBlocks = 1024;     // plane reductions: about 1.3 waves of 256-thread blocks on an H100
constexpr int64_t kTargetRowBlocks = 256;   // row reductions: one wave of 512-thread blocks; a split adds a
                                            // partial per column that the tile's last block reads
constexpr int kMaxPlanesPerTile = 256;
constexpr int kPerChannelThreads = 128;
constexpr unsigned kFullMask = 0xffffffffu;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int pow2_at_least(int64_t v, int lo, int hi) {
  int p = lo;
  while (p < hi && p < v) p *= 2;
  return p;
}

void check_cuda(const Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "syncbn_ref: ", name, " must be a CUDA tensor for the CUDA kernel, got device ",
              t.device());
}

void check_same_device(const Tensor& t, const char* name, const Tensor& input) {
  TORCH_CHECK(t.device() == input.device(), "syncbn_ref: ", name, " is on ", t.device(), " but input is on ",
              input.device());
}

unsigned int grid_dim(int64_t blocks, int64_t limit, const char* what) {
  TORCH_CHECK(blocks <= limit, "syncbn_ref: ", what, " needs ", common::text(blocks),
              " blocks, more than the CUDA limit ", common::text(limit));
  return static_cast<unsigned int>(blocks);
}

cudaStream_t stream() {
  return c10::cuda::getCurrentCUDAStream().stream();
}

// ---------------------------------------------------------------- per-channel values in their own dtype

enum Kind : int { kF64 = 0, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

int kind_of(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return kF64;
    case at::kFloat: return kF32;
    case at::kHalf: return kF16;
    case at::kBFloat16: return kBF16;
    case at::kLong: return kI64;
    case at::kInt: return kI32;
    case at::kShort: return kI16;
    case at::kChar: return kI8;
    case at::kByte: return kU8;
    case at::kBool: return kBool;
    default: return -1;
  }
}

bool writable_kind(int k) {
  return k >= kF64 && k <= kBF16;
}

// A per-channel input read as double (half/bfloat16 through float, exactly); p == nullptr reads `fallback`.
// raw() only loads the element's bits and decode() converts them: a kernel that needs several values
// loads them all first, so their latencies overlap (a conversion inside each load's branch would wait).
struct In {
  const void* p;
  int64_t stride;
  int kind;
  double fallback;
  __device__ __forceinline__ uint64_t raw(int64_t i) const {
    if (p == nullptr) return 0;
    const int64_t k = i * stride;
    switch (kind) {
      case kF64:
      case kI64: return static_cast<const uint64_t*>(p)[k];
      case kF32:
      case kI32: return static_cast<const uint32_t*>(p)[k];
      case kF16:
      case kBF16:
      case kI16: return static_cast<const uint16_t*>(p)[k];
      default: return static_cast<const uint8_t*>(p)[k];
    }
  }
  __device__ __forceinline__ double decode(uint64_t b) const {
    if (p == nullptr) return fallback;
    switch (kind) {
      case kF64: return __longlong_as_double(static_cast<long long>(b));
      case kF32: return static_cast<double>(__uint_as_float(static_cast<uint32_t>(b)));
      case kF16: return static_cast<double>(static_cast<float>(at::Half(static_cast<uint16_t>(b), at::Half::from_bits())));
      case kBF16: return static_cast<double>(__uint_as_float(static_cast<uint32_t>(b) << 16));
      case kI64: return static_cast<double>(static_cast<int64_t>(b));
      case kI32: return static_cast<double>(static_cast<int32_t>(static_cast<uint32_t>(b)));
      case kI16: return static_cast<double>(static_cast<int16_t>(static_cast<uint16_t>(b)));
      case kI8: return static_cast<double>(static_cast<int8_t>(static_cast<uint8_t>(b)));
      case kU8: return static_cast<double>(static_cast<uint8_t>(b));
      default: return b != 0 ? 1.0 : 0.0;
    }
  }
  __device__ __forceinline__ double operator[](int64_t i) const { return decode(raw(i)); }
};

// A per-channel output written from double in its dtype (half/bfloat16 rounded through float, as
// the CPU's conversions do); p == nullptr writes nothing.
struct Out {
  void* p;
  int64_t stride;
  int kind;
  __device__ __forceinline__ void set(int64_t i, double v) const {
    if (p == nullptr) return;
    const int64_t k = i * stride;
    switch (kind) {
      case kF64: static_cast<double*>(p)[k] = v; break;
      case kF32: static_cast<float*>(p)[k] = static_cast<float>(v); break;
      case kF16: static_cast<at::Half*>(p)[k] = at::Half(static_cast<float>(v)); break;
      default: static_cast<at::BFloat16*>(p)[k] = at::BFloat16(static_cast<float>(v)); break;
    }
  }
};

constexpr In kNoIn{nullptr, 1, kF64, 0.0};
constexpr Out kNoOut{nullptr, 1, kF64};

// The one stride that walks every element of t, or -1 where there is none.
int64_t flat_stride(const Tensor& t) {
  if (t.numel() <= 1 || t.is_contiguous()) return 1;
  int64_t stride = -1, dims = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) != 1) {
      ++dims;
      stride = t.stride(d);
    }
  }
  return dims == 1 ? stride : -1;
}

// Tensors made here for a launch (moved, converted, made contiguous): alive until the launch is queued.
using Keep = std::vector<Tensor>;

In in_of(const Tensor& t, at::Device dev, Keep& keep, double fallback = 0.0) {
  Tensor u = t.detach();
  if (u.device() != dev) u = u.to(dev);
  if (kind_of(u.scalar_type()) < 0) u = u.to(at::kDouble);
  int64_t stride = flat_stride(u);
  if (stride < 0) {
    u = u.contiguous();
    stride = 1;
  }
  keep.push_back(u);
  return In{u.data_ptr(), stride, kind_of(u.scalar_type()), fallback};
}

In in_of(const c10::optional<Tensor>& t, at::Device dev, Keep& keep, double fallback) {
  if (!t.has_value() || !t->defined()) return In{nullptr, 1, kF64, fallback};
  return in_of(*t, dev, keep, fallback);
}

// A [C] result the kernel writes in its final dtype and place where it can; else into float64 on the
// compute device, converted after the launch (an output dtype with no writer, or another device).
struct Result {
  Tensor value;    // what the op returns
  Tensor staging;  // float64 on the compute device, where used
  Out out;
};

Result result_of(int64_t C, const at::TensorOptions& opts, at::Device dev) {
  Result r;
  const int kind = kind_of(c10::typeMetaToScalarType(opts.dtype()));
  if (opts.device() == dev && writable_kind(kind)) {
    r.value = at::empty({C}, opts);
    r.out = Out{r.value.data_ptr(), 1, kind};
  } else {
    r.staging = at::empty({C}, at::TensorOptions().device(dev).dtype(at::kDouble));
    r.out = Out{r.staging.data_ptr(), 1, kF64};
  }
  return r;
}

Tensor finish(Result& r, const at::TensorOptions& opts) {
  if (r.staging.defined()) r.value = r.staging.to(opts);
  return r.value;
}

// A tensor updated in place (running statistics): read and written in its dtype where it can be.
struct InPlace {
  Tensor target, staging;
  In in;
  Out out;
};

InPlace in_place_of(const Tensor& t, at::Device dev) {
  InPlace r;
  r.target = t;
  const int kind = kind_of(t.scalar_type());
  const int64_t stride = flat_stride(t);
  Tensor w = t;
  if (t.device() != dev || !writable_kind(kind) || stride < 0) {
    r.staging = t.detach().to(dev, at::kDouble).contiguous();
    w = r.staging;
  }
  const int k = kind_of(w.scalar_type());
  const int64_t s = r.staging.defined() ? 1 : stride;
  r.in = In{w.data_ptr(), s, k, 0.0};
  r.out = Out{w.data_ptr(), s, k};
  return r;
}

void commit(InPlace& r) {
  if (r.staging.defined()) r.target.copy_(r.staging.view(r.target.sizes()));
}

// ---------------------------------------------------------------- element access

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <int N, typename T, typename I>
__device__ __forceinline__ Pack<T, N> load_pack(const T* __restrict__ p, I i) {
  return reinterpret_cast<const Pack<T, N>*>(p)[i];
}

template <int N, typename T, typename I>
__device__ __forceinline__ void store_pack(T* __restrict__ p, I i, const Pack<T, N>& v) {
  reinterpret_cast<Pack<T, N>*>(p)[i] = v;
}

// Elements per vector access: 16 bytes of float, 8 of half/bfloat16 (a thread's state per column
// costs registers), 1 double (double input is for correctness, not speed).
template <typename T>
constexpr int kVecOf = std::is_same<T, double>::value ? 1 : 4;

// Accesses a thread keeps in flight per step: about 64 bytes over its `tensors` inputs, 2 to 8.
template <typename T, int VEC, int tensors>
constexpr int kUnrollOf = std::max(2, std::min(8, 64 / (VEC * static_cast<int>(sizeof(T)) * tensors)));

template <typename T>
using compute_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;

// half/bfloat16 widen through float, exactly.
template <typename T>
__device__ __forceinline__ double to_d(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
__device__ __forceinline__ double to_d<double>(double v) {
  return v;
}

template <typename T>
__device__ __forceinline__ compute_t<T> to_e(T v) {
  return static_cast<compute_t<T>>(v);
}

// Rounds to nearest even (c10's float -> half/bfloat16), as the CPU kernels' stores.
template <typename T>
__device__ __forceinline__ T from_e(compute_t<T> v) {
  return static_cast<T>(v);
}

// ---------------------------------------------------------------- merging

// (count, mean, M2), or (count, s1, s2) relative to a shared centre.
struct Mom {
  double n, a, b;
};

struct Two {
  double a, b;
};

// An M2 (or its increment), never below 0 by rounding (a NaN stays NaN).
__device__ __forceinline__ double nonneg(double v) {
  return v < 0.0 ? 0.0 : v;
}

__device__ __forceinline__ Mom shfl_down(const Mom& m, int off) {
  return {__shfl_down_sync(kFullMask, m.n, off), __shfl_down_sync(kFullMask, m.a, off),
          __shfl_down_sync(kFullMask, m.b, off)};
}

__device__ __forceinline__ Two shfl_down(const Two& m, int off) {
  return {__shfl_down_sync(kFullMask, m.a, off), __shfl_down_sync(kFullMask, m.b, off)};
}

struct Add {
  __device__ __forceinline__ void operator()(Mom& x, const Mom& y) const {
    x.n += y.n;
    x.a += y.a;
    x.b += y.b;
  }
  __device__ __forceinline__ void operator()(Two& x, const Two& y) const {
    x.a += y.a;
    x.b += y.b;
  }
};

// Lane 0 ends with the merge of the warp's 32 values, in a fixed tree order.
template <typename S, typename M>
__device__ __forceinline__ S warp_reduce(S v, M merge) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) merge(v, shfl_down(v, off));
  return v;
}

// Thread 0 ends with the merge of the (1-D, whole-warp) block's values, in a fixed order. Callers
// separate two uses of `smem` by a __syncthreads().
template <typename S, typename M>
__device__ __forceinline__ S block_reduce(S v, S* smem, M merge) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_reduce(v, merge);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? smem[lane] : S{};
    v = warp_reduce(v, merge);
  }
  return v;
}

// Thread 0 ends with the block's (count, mean, M2): each warp sums its threads' (n, n*d, M2 + n*d^2),
// d = mean - the mean of its lane 0 (lane 0 idle: the whole warp is), warp 0 re-centres the warps' sums
// on warp 0's centre and adds them; one division at the end instead of one per merge. `smem`: 4 doubles
// per warp; callers separate two uses by a __syncthreads().
__device__ __forceinline__ Mom block_moments(const Mom& st, double* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const double K = __shfl_sync(kFullMask, st.a, 0);
  const double d = st.a - K;
  Mom v{st.n, st.n * d, st.b + st.n * d * d};
  v = warp_reduce(v, Add{});
  if (lane == 0) {
    smem[4 * warp] = v.n;
    smem[4 * warp + 1] = v.a;
    smem[4 * warp + 2] = v.b;
    smem[4 * warp + 3] = K;
  }
  __syncthreads();
  Mom out{0.0, 0.0, 0.0};
  if (warp == 0) {
    const bool on = lane < warps;
    const double n = on ? smem[4 * lane] : 0.0, s1 = on ? smem[4 * lane + 1] : 0.0;
    const double s2 = on ? smem[4 * lane + 2] : 0.0, Kw = on ? smem[4 * lane + 3] : 0.0;
    const double K0 = __shfl_sync(kFullMask, Kw, 0);
    const double e = n > 0 ? Kw - K0 : 0.0;  // sum over x of (x - K0) = s1 + n e; of (x - K0)^2 = s2 + 2 e s1 + n e^2
    Mom w{n, s1 + n * e, s2 + e * (2.0 * s1 + n * e)};
    w = warp_reduce(w, Add{});
    const double q = w.a / w.n;
    out = Mom{w.n, K0 + q, nonneg(w.b - w.a * q)};
  }
  return out;
}

// The last block of a group of `blocks` to call this (every thread calls it, after its block's
// partial is in memory) gets true. The counter is zero before the group starts (a memset) and is
// left zero again.
__device__ __forceinline__ bool last_of(unsigned int* counter, unsigned int blocks, bool* flag, int tid) {
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned int ticket = atomicAdd(counter, 1u);
    *flag = ticket == blocks - 1;
    if (*flag) *counter = 0;
  }
  __syncthreads();
  if (*flag) __threadfence();
  return *flag;
}

// ---------------------------------------------------------------- reduction outputs

// Moments of a channel: a welford_stats row [count, mean[C], M2[C]], or batch_norm_stats's mean and invstd.
struct MomentsOut {
  double* row;  // welford_stats; null for batch_norm_stats
  Out mean, invstd;
  int64_t C;
  double eps;
  __device__ __forceinline__ void write(int64_t c, double n, double mean_v, double m2) const {
    if (row != nullptr) {
      row[1 + c] = mean_v;
      row[1 + C + c] = m2;
      if (c == 0) row[0] = n;
    } else {
      mean.set(c, mean_v);
      invstd.set(c, 1.0 / ::sqrt(m2 / n + eps));  // an empty input: 0/0, NaN, as on the CPU
    }
  }
};

// batch_norm_backward_reduce's four outputs (each optional).
struct GradOut {
  Out sum_dy, sum_dy_xmu, grad_weight, grad_bias;
  In invstd;
  __device__ __forceinline__ void write(int64_t c, double s, double sx) const { write(c, s, sx, invstd[c]); }
  // With invstd[c] read already (a writer of several columns loads them all first).
  __device__ __forceinline__ void write(int64_t c, double s, double sx, double vi) const {
    sum_dy.set(c, s);
    sum_dy_xmu.set(c, sx);
    if (grad_weight.p != nullptr) grad_weight.set(c, sx * vi);
    grad_bias.set(c, s);
  }
};


// ---------------------------------------------------------------- plane reductions (inner >= 2)

// The per-thread work of a plane reduction: `chunk` folds U vectors (offsets in vectors; slots with
// ok false repeat a valid offset and are ignored) into the thread's state.
template <typename T, int VEC, typename I>
struct PlaneMoments {
  static constexpr int kU = kUnrollOf<T, VEC, 1>;
  using State = Mom;  // merged by block_moments
  const T* __restrict__ x;
  MomentsOut out;

  __device__ __forceinline__ double begin(int64_t) const { return 0.0; }
  __device__ __forceinline__ void chunk(Mom& st, double, const I (&off)[kU], const bool (&ok)[kU]) const {
    Pack<T, VEC> v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) v[u] = load_pack<VEC>(x, off[u]);
    int k = 0;
#pragma unroll
    for (int u = 0; u < kU; ++u) k += ok[u] ? VEC : 0;
    if (st.n == 0) st.a = to_d(v[0].v[0]);  // slot 0 is always valid
    const double K = st.a;
    double s1 = 0, s2 = 0;
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const double d = ok[u] ? to_d(v[u].v[j]) - K : 0.0;
        s1 += d;
        s2 = fma(d, d, s2);
      }
    const double n = st.n + static_cast<double>(k);
    const double q = s1 / n;
    st.a = K + q;
    st.b += nonneg(s2 - s1 * q);
    st.n = n;
  }
  __device__ __forceinline__ void write(int64_t c, const Mom& m) const { out.write(c, m.n, m.a, m.b); }
  // Split partials as (n, s1, s2) relative to split 0's mean K: sums, no division on the serial path.
  __device__ __forceinline__ Mom split_sums(const Mom* parts, int splits, int tid, int nthreads) const {
    const double K = __ldcg(&parts[0].a);
    Mom acc{0.0, 0.0, 0.0};
#pragma unroll 2
    for (int s = tid; s < splits; s += nthreads) {
      const double n = __ldcg(&parts[s].n), d = __ldcg(&parts[s].a) - K;
      acc.n += n;
      acc.a = fma(n, d, acc.a);
      acc.b += __ldcg(&parts[s].b) + n * d * d;
    }
    return acc;
  }
  __device__ __forceinline__ void write_sums(int64_t c, const Mom& s, const Mom* parts) const {
    const double K = __ldcg(&parts[0].a), q = s.a / s.n;
    out.write(c, s.n, K + q, nonneg(s.b - s.a * q));
  }
};

template <typename T, int VEC, typename I>
struct PlaneGrads {
  static constexpr int kU = kUnrollOf<T, VEC, 2>;
  using State = Two;
  using Merge = Add;
  const T* __restrict__ x;
  const T* __restrict__ dy;
  In mean;
  GradOut out;

  __device__ __forceinline__ double begin(int64_t c) const { return mean[c]; }
  __device__ __forceinline__ void chunk(Two& st, double m, const I (&off)[kU], const bool (&ok)[kU]) const {
    Pack<T, VEC> xv[kU], gv[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      xv[u] = load_pack<VEC>(x, off[u]);
      gv[u] = load_pack<VEC>(dy, off[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const double g = ok[u] ? to_d(gv[u].v[j]) : 0.0;
        const double xm = ok[u] ? to_d(xv[u].v[j]) - m : 0.0;
        st.a += g;
        st.b = fma(g, xm, st.b);
      }
  }
  __device__ __forceinline__ void write(int64_t c, const Two& t) const { out.write(c, t.a, t.b); }
  __device__ __forceinline__ Two split_sums(const Two* parts, int splits, int tid, int nthreads) const {
    Two acc{0.0, 0.0};
#pragma unroll 2
    for (int s = tid; s < splits; s += nthreads) {
      acc.a += __ldcg(&parts[s].a);
      acc.b += __ldcg(&parts[s].b);
    }
    return acc;
  }
  __device__ __forceinline__ void write_sums(int64_t c, const Two& t, const Two*) const { out.write(c, t.a, t.b); }
};

// Grid (C, splits). Block (c, s) folds vectors [s*split_v, (s+1)*split_v) of channel c's
// outer*inner_v vectors (vector e is position e % inner_v of run e / inner_v, at
// (run*C + c)*inner_v + position); its threads take every blockDim-th vector, U at a time.
template <typename P, typename I>
__global__ void __launch_bounds__(kThreads) plane_reduce_kernel(P p, I C, I inner_v, I len_v, I split_v,
                                                                typename P::State* partials,
                                                                unsigned int* counters) {
  using S = typename P::State;
  constexpr int U = P::kU;
  __shared__ S warp_states[kThreads / 32];
  __shared__ double centre_sums[4 * (kThreads / 32)];
  __shared__ bool is_last;
  const I c = static_cast<I>(blockIdx.x);
  const I bd = static_cast<I>(blockDim.x);
  const double m = p.begin(c);
  S st{};
  const I start = static_cast<I>(blockIdx.y) * split_v;
  const I end = start + split_v < len_v ? start + split_v : len_v;
  I e = start + static_cast<I>(threadIdx.x);
  if (e < end) {
    I run = e / inner_v;
    I pos = e - run * inner_v;
    I off = (run * C + c) * inner_v + pos;
    const I step_run = bd / inner_v, step_pos = bd - step_run * inner_v;
    const I jump = step_run * C * inner_v + step_pos;  // to the same position blockDim vectors on
    const I wrap = (C - 1) * inner_v;                   // and across one more run's boundary
    while (true) {
      I offs[U];
      bool ok[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        ok[u] = e < end;
        offs[u] = off;  // past the end: the last valid offset again
        e += bd;
        if (e < end) {
          off += jump;
          pos += step_pos;
          if (pos >= inner_v) {
            pos -= inner_v;
            off += wrap;
          }
        }
      }
      p.chunk(st, m, offs, ok);
      if (e >= end) break;
    }
  }
  if constexpr (std::is_same<S, Mom>::value) {
    st = block_moments(st, centre_sums);
  } else {
    st = block_reduce(st, warp_states, typename P::Merge{});
  }
  if (gridDim.y == 1) {
    if (threadIdx.x == 0) p.write(c, st);
    return;
  }
  S* parts = partials + static_cast<int64_t>(c) * gridDim.y;
  if (threadIdx.x == 0) parts[blockIdx.y] = st;
  if (!last_of(counters + c, gridDim.y, &is_last, threadIdx.x)) return;
  S acc = p.split_sums(parts, gridDim.y, threadIdx.x, blockDim.x);
  acc = block_reduce(acc, warp_states, Add{});
  if (threadIdx.x == 0) p.write_sums(c, acc, parts);
}

// ---------------------------------------------------------------- row reductions (inner == 1)

// A thread's state over VEC columns lives in `words` doubles in shared memory between the phases;
// `chunk` folds U rows (offsets in vectors of VEC columns) into registers.
template <typename T, int VEC, typename I>
struct RowMoments {
  // At most 4 rows: the loaded rows stay live over the VEC columns' updates (registers).
  static constexpr int kVec = VEC, kU = std::min(4, kUnrollOf<T, VEC, 1>), kWords = 1 + 2 * VEC, kPartWords = 2;
  static constexpr int kMinBlocks = 2;  // two 512-thread blocks per SM: at most 64 registers
  struct State {
    double n;
    double mean[VEC], m2[VEC];
  };
  const T* __restrict__ x;
  MomentsOut out;

  __device__ __forceinline__ void begin(State& st, int64_t) const {
    st.n = 0;
#pragma unroll
    for (int j = 0; j < VEC; ++j) st.mean[j] = st.m2[j] = 0;
  }
  __device__ __forceinline__ void chunk(State& st, const I (&off)[kU], const bool (&ok)[kU]) const {
    Pack<T, VEC> v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) v[u] = load_pack<VEC>(x, off[u]);
    int k = 0;
#pragma unroll
    for (int u = 0; u < kU; ++u) k += ok[u] ? 1 : 0;
    const bool first = st.n == 0;
    const double n = st.n + static_cast<double>(k);
    const double inv = 1.0 / n;  // one division for the VEC columns
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const double K = first ? to_d(v[0].v[j]) : st.mean[j];
      double s1 = 0, s2 = 0;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const double d = ok[u] ? to_d(v[u].v[j]) - K : 0.0;
        s1 += d;
        s2 = fma(d, d, s2);
      }
      const double q = s1 * inv;
      st.mean[j] = K + q;
      st.m2[j] += nonneg(s2 - s1 * q);
    }
    st.n = n;
  }
  __device__ __forceinline__ void save(const State& st, double* w) const {
    w[0] = st.n;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      w[1 + j] = st.mean[j];
      w[1 + VEC + j] = st.m2[j];
    }
  }
  // w <- w merged with w2 (Chan's formula; the columns share their count).
  __device__ __forceinline__ void merge(double* w, const double* w2) const {
    const double na = w[0], nb = w2[0];
    if (nb <= 0) return;
    if (na <= 0) {
      for (int i = 0; i < kWords; ++i) w[i] = w2[i];
      return;
    }
    const double n = na + nb, frac = nb / n, cross = na * frac;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const double delta = w2[1 + j] - w[1 + j];
      w[1 + j] += delta * frac;
      w[1 + VEC + j] += w2[1 + VEC + j] + delta * delta * cross;
    }
    w[0] = n;
  }
  __device__ __forceinline__ void write(int64_t col0, const double* w) const {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.write(col0 + j, w[0], w[1 + j], w[1 + VEC + j]);
  }
  // Partials: (mean, M2) per column and split; a split's count is its number of rows.
  __device__ __forceinline__ void save_part(double* part, const double* w) const {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      part[2 * j] = w[1 + j];
      part[2 * j + 1] = w[1 + VEC + j];
    }
  }
  // w <- (n, s1[VEC], s2[VEC]) of splits first, first + step, ... relative to split 0's means.
  __device__ __forceinline__ void split_sums(double* w, const double* parts, int64_t split_words, int first,
                                             int step, int splits, int64_t rows, int64_t rows_per_split) const {
    double n = 0, s1[VEC], s2[VEC], K[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      s1[j] = s2[j] = 0;
      K[j] = __ldcg(parts + 2 * j);
    }
#pragma unroll 2
    for (int s = first; s < splits; s += step) {
      const int64_t r0 = s * rows_per_split;
      const double ns = static_cast<double>(std::min(rows, r0 + rows_per_split) - r0);
      const double* part = parts + s * split_words;
      n += ns;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const double d = __ldcg(part + 2 * j) - K[j];
        s1[j] = fma(ns, d, s1[j]);
        s2[j] += __ldcg(part + 2 * j + 1) + ns * d * d;
      }
    }
    w[0] = n;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      w[1 + j] = s1[j];
      w[1 + VEC + j] = s2[j];
    }
  }
  __device__ __forceinline__ void write_sums(int64_t col0, const double* w, const double* parts) const {
    const double n = w[0];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const double s1 = w[1 + j], q = s1 / n;
      out.write(col0 + j, n, __ldcg(parts + 2 * j) + q, nonneg(w[1 + VEC + j] - s1 * q));
    }
  }
};

template <typename T, int VEC, typename I>
struct RowGrads {
  static constexpr int kVec = VEC, kU = kUnrollOf<T, VEC, 2>, kWords = 2 * VEC, kPartWords = 2;
  static constexpr int kMinBlocks = 2;  // two 512-thread blocks per SM: at most 64 registers
  struct State {
    double s[VEC], sx[VEC], mean[VEC];
  };
  const T* __restrict__ x;
  const T* __restrict__ dy;
  In mean;
  GradOut out;

  __device__ __forceinline__ void begin(State& st, int64_t col0) const {
    uint64_t bits[VEC];  // all loads first: their latencies overlap
#pragma unroll
    for (int j = 0; j < VEC; ++j) bits[j] = mean.raw(col0 + j);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      st.s[j] = st.sx[j] = 0;
      st.mean[j] = mean.decode(bits[j]);
    }
  }
  __device__ __forceinline__ void chunk(State& st, const I (&off)[kU], const bool (&ok)[kU]) const {
    Pack<T, VEC> xv[kU], gv[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      xv[u] = load_pack<VEC>(x, off[u]);
      gv[u] = load_pack<VEC>(dy, off[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const double g = ok[u] ? to_d(gv[u].v[j]) : 0.0;
        const double xm = ok[u] ? to_d(xv[u].v[j]) - st.mean[j] : 0.0;
        st.s[j] += g;
        st.sx[j] = fma(g, xm, st.sx[j]);
      }
  }
  __device__ __forceinline__ void save(const State& st, double* w) const {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      w[j] = st.s[j];
      w[VEC + j] = st.sx[j];
    }
  }
  __device__ __forceinline__ void merge(double* w, const double* w2) const {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] += w2[i];
  }
  __device__ __forceinline__ void write(int64_t col0, const double* w) const {
    uint64_t bits[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) bits[j] = out.invstd.raw(col0 + j);  // null (no grad_weight): reads nothing
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.write(col0 + j, w[j], w[VEC + j], out.invstd.decode(bits[j]));
  }
  __device__ __forceinline__ void save_part(double* part, const double* w) const {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      part[2 * j] = w[j];
      part[2 * j + 1] = w[VEC + j];
    }
  }
  __device__ __forceinline__ void split_sums(double* w, const double* parts, int64_t split_words, int first,
                                             int step, int splits, int64_t, int64_t) const {
    double a[VEC], b[VEC];  // in registers: w is shared memory, which the compiler would re-read each step
#pragma unroll
    for (int j = 0; j < VEC; ++j) a[j] = b[j] = 0;
#pragma unroll 2
    for (int s = first; s < splits; s += step) {
      const double* part = parts + s * split_words;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        a[j] += __ldcg(part + 2 * j);
        b[j] += __ldcg(part + 2 * j + 1);
      }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      w[j] = a[j];
      w[VEC + j] = b[j];
    }
  }
  __device__ __forceinline__ void write_sums(int64_t col0, const double* w, const double*) const { write(col0, w); }
};

// Grid (column tiles, row splits), block (bx, by) with by a power of two. Thread (tx, ty) owns
// columns [col0, col0 + VEC) and folds rows r0 + ty, r0 + ty + by, ... of its split, U at a time.
// Phases meet in shared memory: the by states of each column group merge in a fixed tree; one
// split writes its outputs, several write partials [split][C][2] that the tile's last block merges.
template <typename P, typename I>
__global__ void __launch_bounds__(kRowThreads, P::kMinBlocks) row_reduce_kernel(P p, I rows, I C, I rows_per_split,
                                                              double* partials, unsigned int* counters) {
  constexpr int VEC = P::kVec, U = P::kU, W = P::kWords;
  extern __shared__ double words[];
  __shared__ bool is_last;
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int tid = ty * bx + tx;
  const I col0 = (static_cast<I>(blockIdx.x) * bx + tx) * VEC;
  const bool active = col0 < C;
  const I cv = col0 / VEC, Cv = C / VEC;
  double* w = words + tid * W;
  {
    typename P::State st;
    p.begin(st, active ? col0 : 0);
    const I r0 = static_cast<I>(blockIdx.y) * rows_per_split;
    const I r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
    if (active) {
      for (I r = r0 + ty; r < r1; r += U * by) {
        I offs[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const I rr = r + u * by;
          ok[u] = rr < r1;
          offs[u] = (ok[u] ? rr : r) * Cv + cv;
        }
        p.chunk(st, offs, ok);
      }
    }
    p.save(st, w);
  }
  __syncthreads();
  for (int h = by >> 1; h > 0; h >>= 1) {
    if (ty < h) p.merge(w, words + (tid + h * bx) * W);
    __syncthreads();
  }
  if (gridDim.y == 1) {
    if (ty == 0 && active) p.write(col0, w);
    return;
  }
  const int64_t split_words = static_cast<int64_t>(C) * P::kPartWords;
  if (ty == 0 && active) p.save_part(partials + blockIdx.y * split_words + static_cast<int64_t>(col0) * 2, w);
  if (!last_of(counters + blockIdx.x, gridDim.y, &is_last, tid)) return;
  const double* parts = partials + static_cast<int64_t>(col0) * 2;
  if (active) p.split_sums(w, parts, split_words, ty, by, gridDim.y, rows, rows_per_split);
  __syncthreads();
  for (int h = by >> 1; h > 0; h >>= 1) {
    if (ty < h && active) {
      const double* w2 = words + (tid + h * bx) * W;
      for (int i = 0; i < W; ++i) w[i] += w2[i];
    }
    __syncthreads();
  }
  if (ty == 0 && active) p.write_sums(col0, w, parts);
}

// An empty input (no element per channel): each channel's outputs from an empty state (mean 0 and
// M2 0, so invstd 0/0 = NaN; sums 0, so grad_weight 0 * invstd), as on the CPU.
__device__ __forceinline__ void write_empty(const MomentsOut& out, int64_t c) {
  out.write(c, 0.0, 0.0, 0.0);
}
__device__ __forceinline__ void write_empty(const GradOut& out, int64_t c) {
  out.write(c, 0.0, 0.0);
}

template <typename O>
__global__ void empty_reduce_kernel(O out, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < C) write_empty(out, c);
}

// ---------------------------------------------------------------- reduction launches

// Calls f(std::integral_constant<int, VEC>, I{}) with the widest access `vec_ok` allows and the
// index type the size allows.
template <typename T, typename F>
void with_access(bool vec_ok, int64_t numel, int64_t C, F&& f) {
  if (numel <= kMax32 && C <= kMaxC32) {
    if constexpr (kVecOf<T> > 1) {
      if (vec_ok) return f(std::integral_constant<int, kVecOf<T>>{}, int32_t{});
    }
    return f(std::integral_constant<int, 1>{}, int32_t{});
  }
  f(std::integral_constant<int, 1>{}, int64_t{});
}

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Scratch for a channel or column group split over blocks: `words` doubles of partials and `counters`
// zeroed counters (one memset), from the caching allocator (stream-ordered, capturable).
struct Scratch {
  Tensor t;
  double* partials = nullptr;
  unsigned int* counters = nullptr;
};

Scratch scratch_of(int64_t words, int64_t counters, at::Device dev) {
  Scratch s;
  const int64_t bytes = words * 8 + counters * 4;
  s.t = at::empty({bytes}, at::TensorOptions().device(dev).dtype(at::kByte));
  s.partials = reinterpret_cast<double*>(s.t.data_ptr());
  s.counters = reinterpret_cast<unsigned int*>(s.partials + words);
  C10_CUDA_CHECK(cudaMemsetAsync(s.counters, 0, counters * 4, stream()));
  return s;
}

// Runs the reduction of `Plane`/`Row` policy over x's [outer][C][inner] view (dy: a second input of
// the same layout, or null). make_plane(VEC, I) and make_row(VEC, I) build the policies.
template <typename T, typename O, typename MakePlane, typename MakeRow>
void reduce(const View& v, const T* x, const T* dy, at::Device dev, const O& empty_out, MakePlane make_plane,
            MakeRow make_row) {
  const int64_t C = v.channels, outer = v.outer, inner = v.inner;
  if (C == 0) return;
  if (outer == 0 || inner == 0) {
    const unsigned int blocks = grid_dim(ceil_div(C, kPerChannelThreads), std::numeric_limits<int32_t>::max(),
                                         "the per-channel grid");
    empty_reduce_kernel<O><<<blocks, kPerChannelThreads, 0, stream()>>>(empty_out, C);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const int64_t numel = outer * C * inner;
  const int64_t vec_bytes = kVecOf<T> * static_cast<int64_t>(sizeof(T));
  const bool ptrs_ok = aligned(x, vec_bytes) && (dy == nullptr || aligned(dy, vec_bytes));
  if (inner >= 2) {
    with_access<T>(ptrs_ok && inner % kVecOf<T> == 0, numel, C, [&](auto vec, auto idx) {
      constexpr int VEC = decltype(vec)::value;
      using I = decltype(idx);
      auto p = make_plane(vec, idx);
      using P = decltype(p);
      using S = typename P::State;
      const int64_t inner_v = inner / VEC, len_v = outer * inner_v;
      const int threads = pow2_at_least(ceil_div(len_v, P::kU), 32, kThreads);
      // At least two chunks per thread: a block's merge and ticket cost as much as a chunk.
      int64_t splits = std::min(ceil_div(kTargetBlocks, C), std::max<int64_t>(1, len_v / (2 * threads * P::kU)));
      splits = std::min<int64_t>(splits, 65535);
      const int64_t split_v = ceil_div(len_v, splits);
      splits = ceil_div(len_v, split_v);
      Scratch s;
      if (splits > 1) s = scratch_of(C * splits * (sizeof(S) / 8), C, dev);
      const dim3 grid(grid_dim(C, std::numeric_limits<int32_t>::max(), "the channel grid"),
                      static_cast<unsigned int>(splits));
      plane_reduce_kernel<P, I><<<grid, threads, 0, stream()>>>(
          p, static_cast<I>(C), static_cast<I>(inner_v), static_cast<I>(len_v), static_cast<I>(split_v),
          reinterpret_cast<S*>(s.partials), s.counters);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return;
  }
  with_access<T>(ptrs_ok && C % kVecOf<T> == 0, numel, C, [&](auto vec, auto idx) {
    constexpr int VEC = decltype(vec)::value;
    using I = decltype(idx);
    auto p = make_row(vec, idx);
    using P = decltype(p);
    const int64_t Cv = C / VEC, rows = outer;
    const int bx = pow2_at_least(Cv, 1, 32), by = kRowThreads / bx;
    const int64_t tiles = ceil_div(Cv, bx);
    int64_t splits = std::min(ceil_div(kTargetRowBlocks, tiles), std::max<int64_t>(1, rows / (by * P::kU)));
    splits = std::min<int64_t>(splits, 65535);
    const int64_t rows_per_split = ceil_div(rows, splits);
    splits = ceil_div(rows, rows_per_split);
    Scratch s;
    if (splits > 1) s = scratch_of(splits * C * P::kPartWords, tiles, dev);
    const dim3 grid(grid_dim(tiles, std::numeric_limits<int32_t>::max(), "the column grid"),
                    static_cast<unsigned int>(splits));
    const size_t smem = sizeof(double) * P::kWords * kRowThreads;
    row_reduce_kernel<P, I><<<grid, dim3(bx, by), smem, stream()>>>(
        p, static_cast<I>(rows), static_cast<I>(C), static_cast<I>(rows_per_split), s.partials, s.counters);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// Per-channel moments of x (contiguous in the format `v` was built for) into `out`.
void moments(const Tensor& x, const View& v, const MomentsOut& out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_moments_cuda", [&] {
    using T = scalar_t;
    const T* px = x.data_ptr<T>();
    reduce<T>(
        v, px, static_cast<const T*>(nullptr), x.device(), out,
        [&](auto vec, auto idx) { return PlaneMoments<T, decltype(vec)::value, decltype(idx)>{px, out}; },
        [&](auto vec, auto idx) { return RowMoments<T, decltype(vec)::value, decltype(idx)>{px, out}; });
  });
}

// ---------------------------------------------------------------- elementwise

// Coefficients of y = (x - mean) * scale + shift.
template <typename E>
struct AffineCoef {
  double mean;
  E scale, shift;
};

template <typename T>
struct AffineMap {
  using E = compute_t<T>;
  using Coef = AffineCoef<E>;
  static constexpr bool kDy = false;
  In mean, invstd, weight, bias;
  In counts;  // unused
  double host_total;
  __device__ __forceinline__ Coef coef(int64_t c, double) const {
    const uint64_t m = mean.raw(c), i = invstd.raw(c), w = weight.raw(c), b = bias.raw(c);
    return {mean.decode(m), static_cast<E>(invstd.decode(i) * weight.decode(w)), static_cast<E>(bias.decode(b))};
  }
  __device__ __forceinline__ static T apply(T x, T, const Coef& k) {
    const E d = static_cast<E>(to_d(x) - k.mean);
    return from_e<T>(d * k.scale + k.shift);
  }
};

// Coefficients of dx = (dy - grad_mean - (x - mean) * proj) * gscale.
template <typename E>
struct BackwardCoef {
  double mean;
  E grad_mean, proj, gscale;
};

template <typename T>
struct BackwardMap {
  using E = compute_t<T>;
  using Coef = BackwardCoef<E>;
  static constexpr bool kDy = true;
  In mean, invstd, weight, sum_dy, sum_dy_xmu;
  In counts;          // a CUDA count tensor, summed per block; p == nullptr: host_total
  int64_t n_counts;
  double host_total;
  __device__ __forceinline__ Coef coef(int64_t c, double inv_total) const {
    const uint64_t m = mean.raw(c), i = invstd.raw(c), w = weight.raw(c), s = sum_dy.raw(c), sx = sum_dy_xmu.raw(c);
    const double vi = invstd.decode(i);
    return {mean.decode(m), static_cast<E>(sum_dy.decode(s) * inv_total),
            static_cast<E>(sum_dy_xmu.decode(sx) * inv_total * vi * vi), static_cast<E>(vi * weight.decode(w))};
  }
  __device__ __forceinline__ static T apply(T x, T dy, const Coef& k) {
    const E d = static_cast<E>(to_d(x) - k.mean);
    return from_e<T>(((to_e(dy) - k.grad_mean) - d * k.proj) * k.gscale);
  }
};

// 1 / the total count: the host's, or the CUDA count tensor's entries summed by the whole block (every
// thread calls this; integers, so the order does not matter).
template <typename P>
__device__ __forceinline__ double inv_total_of(const P& p, double* red) {
  if constexpr (P::kDy) {
    if (p.counts.p == nullptr) return 1.0 / p.host_total;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    double s = 0;
    for (int64_t j = tid; j < p.n_counts; j += nt) s += p.counts[j];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(kFullMask, s, off);
    if ((tid & 31) == 0) red[tid >> 5] = s;
    __syncthreads();
    if (tid == 0) {
      double t = 0;
      for (int i = 0; i < (nt + 31) / 32; ++i) t += red[i];
      red[32] = 1.0 / t;  // a total <= 0 gives non-finite gradients (as torch's kernel); CPU counts are checked
    }
    __syncthreads();
    return red[32];
  } else {
    return 0.0;
  }
}

// 32-bit division of small numbers (n, d < 2^11) by a multiply: q = (n * m) >> 22, m = 2^22 / d + 1.
__device__ __forceinline__ uint32_t small_div(uint32_t n, uint32_t m) {
  return static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 22);
}

// Elementwise over planes (inner >= 2). Block b is a tile: with G == 1 the vectors
// [v0, v0 + chunk_v) of plane b / tiles_per_plane, else the G whole planes b*G, ... (at most
// blockDim * U vectors either way). The tile's coefficients go to shared memory once.
template <typename P, typename T, int VEC, int U, typename I>
__global__ void __launch_bounds__(kThreads) plane_map_kernel(P p, const T* __restrict__ x,
                                                             const T* __restrict__ dy, T* __restrict__ y, I C,
                                                             I inner_v, I planes, I G, I tiles_per_plane, I chunk_v,
                                                             uint32_t inner_magic) {
  using Coef = typename P::Coef;
  __shared__ double red[33];
  __shared__ Coef coefs[kMaxPlanesPerTile];
  const double inv_total = inv_total_of(p, red);
  const I b = static_cast<I>(blockIdx.x), bd = static_cast<I>(blockDim.x);
  I p0, base, len, count;
  if (G == 1) {
    p0 = b / tiles_per_plane;
    const I v0 = (b - p0 * tiles_per_plane) * chunk_v;
    len = inner_v - v0 < chunk_v ? inner_v - v0 : chunk_v;
    base = p0 * inner_v + v0;
    count = 1;
  } else {
    p0 = b * G;
    count = planes - p0 < G ? planes - p0 : G;
    base = p0 * inner_v;
    len = count * inner_v;
  }
  if (static_cast<I>(threadIdx.x) < count) coefs[threadIdx.x] = p.coef((p0 + static_cast<I>(threadIdx.x)) % C, inv_total);
  __syncthreads();
  const Coef one = coefs[0];
  for (I e = static_cast<I>(threadIdx.x); e < len; e += U * bd) {
    Pack<T, VEC> xv[U], gv[U];
    I offs[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I eu = e + u * bd;
      ok[u] = eu < len;
      offs[u] = base + (ok[u] ? eu : e);
      xv[u] = load_pack<VEC>(x, offs[u]);
      if constexpr (P::kDy) gv[u] = load_pack<VEC>(dy, offs[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const Coef k = G == 1 ? one : coefs[small_div(static_cast<uint32_t>(e + u * bd), inner_magic)];
      Pack<T, VEC> out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) out.v[j] = P::apply(xv[u].v[j], P::kDy ? gv[u].v[j] : xv[u].v[j], k);
      store_pack<VEC>(y, offs[u], out);
    }
  }
}

// Elementwise over rows (inner == 1): thread (tx, ty) of block (bx, by) owns columns
// [col0, col0 + VEC) and strides over rows. The tile's bx * VEC columns get their coefficients
// once per block (a thread per column, into shared memory), then each thread holds its own in
// registers.
template <typename P, typename T, int VEC, int U, typename I>
__global__ void __launch_bounds__(kThreads) row_map_kernel(P p, const T* __restrict__ x, const T* __restrict__ dy,
                                                           T* __restrict__ y, I rows, I C) {
  using Coef = typename P::Coef;
  __shared__ double red[33];
  __shared__ Coef coefs[kThreads];
  const double inv_total = inv_total_of(p, red);
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const I tile0 = static_cast<I>(blockIdx.x) * blockDim.x * VEC;  // first column of the tile
  if (tid < static_cast<int>(blockDim.x) * VEC && tile0 + tid < C) coefs[tid] = p.coef(tile0 + tid, inv_total);
  __syncthreads();
  const I col0 = tile0 + static_cast<I>(threadIdx.x) * VEC;
  if (col0 >= C) return;
  Coef k[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) k[j] = coefs[threadIdx.x * VEC + j];
  const I Cv = C / VEC, cv = col0 / VEC;
  const I stride = static_cast<I>(blockDim.y) * gridDim.y;
  for (I r = static_cast<I>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += U * stride) {
    Pack<T, VEC> xv[U], gv[U];
    I offs[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const I rr = r + u * stride;
      ok[u] = rr < rows;
      offs[u] = (ok[u] ? rr : r) * Cv + cv;
      xv[u] = load_pack<VEC>(x, offs[u]);
      if constexpr (P::kDy) gv[u] = load_pack<VEC>(dy, offs[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      Pack<T, VEC> out;
#pragma unroll
      for (int j = 0; j < VEC; ++j) out.v[j] = P::apply(xv[u].v[j], P::kDy ? gv[u].v[j] : xv[u].v[j], k[j]);
      store_pack<VEC>(y, offs[u], out);
    }
  }
}

// Multiprocessors of the current device (elementwise grids only: their results do not depend on the grid).
int multiprocessors() {
  static int cached[64] = {0};
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return 132;
  if (cached[dev] == 0) {
    int n = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cached[dev] = n > 0 ? n : 132;
  }
  return cached[dev];
}

// Runs map policy p over x's [outer][C][inner] view into y (dy: null for AffineMap).
template <typename T, typename P>
void map(const View& v, const T* x, const T* dy, T* y, const P& p) {
  const int64_t C = v.channels, outer = v.outer, inner = v.inner;
  const int64_t numel = outer * C * inner;
  if (numel == 0) return;
  const int64_t vec_bytes = kVecOf<T> * static_cast<int64_t>(sizeof(T));
  const bool ptrs_ok = aligned(x, vec_bytes) && aligned(y, vec_bytes) && (dy == nullptr || aligned(dy, vec_bytes));
  if (inner >= 2) {
    with_access<T>(ptrs_ok && inner % kVecOf<T> == 0, numel, C, [&](auto vec, auto idx) {
      constexpr int VEC = decltype(vec)::value;
      constexpr int U = kUnrollOf<T, VEC, P::kDy ? 2 : 1>;  // tile = kThreads * U <= 2048 vectors
      using I = decltype(idx);
      const int64_t inner_v = inner / VEC, planes = outer * C, tile = int64_t{kThreads} * U;
      int64_t G = 1, tiles_per_plane = 1, chunk_v = inner_v, blocks;
      if (inner_v > tile / 2) {
        tiles_per_plane = ceil_div(inner_v, tile);
        chunk_v = ceil_div(inner_v, tiles_per_plane);
        blocks = planes * tiles_per_plane;
      } else {
        G = std::min<int64_t>(kMaxPlanesPerTile, tile / inner_v);
        blocks = ceil_div(planes, G);
      }
      // tile <= 2048 and inner_v <= tile / 2 where G > 1: small_div is exact (n, d < 2^11).
      const uint32_t magic = static_cast<uint32_t>((uint64_t{1} << 22) / static_cast<uint64_t>(inner_v) + 1);
      const unsigned int grid = grid_dim(blocks, std::numeric_limits<int32_t>::max(), "the plane grid");
      plane_map_kernel<P, T, VEC, U, I><<<grid, kThreads, 0, stream()>>>(
          p, x, dy, y, static_cast<I>(C), static_cast<I>(inner_v), static_cast<I>(planes), static_cast<I>(G),
          static_cast<I>(tiles_per_plane), static_cast<I>(chunk_v), magic);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return;
  }
  with_access<T>(ptrs_ok && C % kVecOf<T> == 0, numel, C, [&](auto vec, auto idx) {
    constexpr int VEC = decltype(vec)::value;
    constexpr int U = std::min(P::kDy ? 2 : 4, kUnrollOf<T, VEC, P::kDy ? 2 : 1>);  // coefficients take registers too
    using I = decltype(idx);
    const int64_t Cv = C / VEC, rows = outer;
    const int bx = pow2_at_least(Cv, 1, 32), by = kThreads / bx;
    const int64_t tiles = ceil_div(Cv, bx);
    // 4 to 16 rows per thread: more amortize the coefficients, fewer fill the GPU (4 blocks per SM).
    const int64_t per_thread = std::max<int64_t>(4, std::min<int64_t>(16, rows * tiles / (int64_t{by} * 4 * multiprocessors())));
    const int64_t ysplits = std::max<int64_t>(1, std::min<int64_t>(65535, ceil_div(rows, int64_t{by} * per_thread)));
    const dim3 grid(grid_dim(tiles, std::numeric_limits<int32_t>::max(), "the column grid"),
                    static_cast<unsigned int>(ysplits));
    row_map_kernel<P, T, VEC, U, I><<<grid, dim3(bx, by), 0, stream()>>>(p, x, dy, y, static_cast<I>(rows),
                                                                         static_cast<I>(C));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// ---------------------------------------------------------------- per-channel kernels

template <typename F>
__global__ void per_channel_kernel(int64_t C, F f) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < C) f(c);
}

template <typename F>
void launch_per_channel(int64_t C, const F& f) {
  if (C == 0) return;
  const unsigned int blocks =
      grid_dim(ceil_div(C, kPerChannelThreads), std::numeric_limits<int32_t>::max(), "a per-channel grid");
  per_channel_kernel<F><<<blocks, kPerChannelThreads, 0, stream()>>>(C, f);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Chan's merge with the CPU's operations and rounding (no FMA contraction).
__device__ __forceinline__ void chan_merge_rn(double& n, double& mean, double& m2, double nb, double meanb,
                                              double m2b) {
  if (nb <= 0) return;
  if (n <= 0) {
    n = nb;
    mean = meanb;
    m2 = m2b;
    return;
  }
  const double nt = __dadd_rn(n, nb);
  const double delta = __dsub_rn(meanb, mean);
  const double frac = nb / nt;
  mean = __dadd_rn(mean, __dmul_rn(delta, frac));
  m2 = __dadd_rn(m2, __dadd_rn(m2b, __dmul_rn(__dmul_rn(delta, delta), __dmul_rn(n, frac))));
  n = nt;
}

// (1 - momentum) * old + momentum * new, as the CPU's two products and a sum.
__device__ __forceinline__ double blend(double old, double now, double momentum) {
  return __dadd_rn(__dmul_rn(old, 1.0 - momentum), __dmul_rn(now, momentum));
}

// batch_norm_gather_stats_with_counts: Chan's merge of W (count, mean, invstd) rows; rows with count <= 0
// are skipped. Writes mean/invstd in the output dtype and updates the running statistics in place.
struct GatherFn {
  In mean, invstd, counts;  // [W, C], [W, C], [W]
  int64_t W, C;
  double eps, momentum;
  Out out_mean, out_invstd;
  In rm_in, rv_in;
  Out rm_out, rv_out;
  __device__ void operator()(int64_t c) const {
    const uint64_t rm_bits = rm_in.raw(c), rv_bits = rv_in.raw(c);  // loaded now, used last
    double n = 0, avg = 0, var_n = 0;
    for (int64_t j = 0; j < W; ++j) {
      const uint64_t cb = counts.raw(j), mb = mean.raw(j * C + c), ib = invstd.raw(j * C + c);
      const double cnt = counts.decode(cb);
      if (cnt <= 0) continue;
      const double inv = invstd.decode(ib);
      const double var = __dsub_rn(1.0 / __dmul_rn(inv, inv), eps);
      chan_merge_rn(n, avg, var_n, cnt, mean.decode(mb), __dmul_rn(var, cnt));
    }
    out_mean.set(c, avg);
    out_invstd.set(c, 1.0 / ::sqrt(__dadd_rn(var_n / n, eps)));
    if (rm_out.p != nullptr) rm_out.set(c, blend(rm_in.decode(rm_bits), avg, momentum));
    if (rv_out.p != nullptr) rv_out.set(c, blend(rv_in.decode(rv_bits), var_n / __dsub_rn(n, 1.0), momentum));
  }
};

// Merge of gathered welford_stats rows [W, 2C+1] into out [2C+1].
struct WelfordMergeFn {
  const double* g;
  int64_t W;
  int64_t C;
  double* out;
  __device__ void operator()(int64_t c) const {
    double n = 0, mean = 0, m2 = 0;
    for (int64_t j = 0; j < W; ++j) {
      const double* row = g + j * (2 * C + 1);
      chan_merge_rn(n, mean, m2, row[0], row[1 + c], row[1 + C + c]);
    }
    out[1 + c] = mean;
    out[1 + C + c] = m2;
    if (c == 0) out[0] = n;  // the same for every channel; one writer
  }
};

// C == 0: the CPU sums max(0, count) over rows (std::max(0, NaN) is 0).
struct CountOnlyFn {
  const double* g;  // [W, 1]
  int64_t W;
  double* out;
  __device__ void operator()(int64_t) const {
    double total = 0;
    for (int64_t j = 0; j < W; ++j) total = __dadd_rn(total, 0.0 < g[j] ? g[j] : 0.0);
    out[0] = total;
  }
};

// welford_finish: mean and invstd from a merged row [count, mean[C], M2[C]], the running statistics
// updated in place (unbiased variance). count < 1 (every rank empty): mean 0, invstd 1, statistics
// kept; count 1 (which the module refuses on the host where it can): NaN, statistics kept.
struct FinishFn {
  const double* row;
  int64_t C;
  double eps, momentum;
  double* out_mean;
  double* out_invstd;
  In rm_in, rv_in;
  Out rm_out, rv_out;
  __device__ void operator()(int64_t c) const {
    const uint64_t rm_bits = rm_in.raw(c), rv_bits = rv_in.raw(c);
    const double n = row[0], mean = row[1 + c], m2 = row[1 + C + c];
    if (!(n >= 2)) {
      const double nan = __longlong_as_double(0x7ff8000000000000LL);
      out_mean[c] = n < 1 ? 0.0 : nan;
      out_invstd[c] = n < 1 ? 1.0 : nan;
      return;
    }
    out_mean[c] = mean;
    out_invstd[c] = 1.0 / ::sqrt(__dadd_rn(m2 / n, eps));
    if (rm_out.p != nullptr) rm_out.set(c, blend(rm_in.decode(rm_bits), mean, momentum));
    if (rv_out.p != nullptr) rv_out.set(c, blend(rv_in.decode(rv_bits), m2 / __dsub_rn(n, 1.0), momentum));
  }
};

// ---------------------------------------------------------------- ATen-contract ops

std::tuple<Tensor, Tensor> batch_norm_stats(const Tensor& input, double eps) {
  check_cuda(input, "input");
  c10::cuda::CUDAGuard device_guard(input.device());
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const View v = view_of(x, fmt);
  const int64_t C = v.channels;
  const auto opts = x.options().dtype(acc_type_of(input.scalar_type()));
  Tensor mean = at::empty({C}, opts);
  Tensor invstd = at::empty({C}, opts);
  const int kind = kind_of(opts.dtype().toScalarType());
  moments(x, v, MomentsOut{nullptr, Out{mean.data_ptr(), 1, kind}, Out{invstd.data_ptr(), 1, kind}, C, eps});
  return {mean, invstd};
}

std::tuple<Tensor, Tensor> batch_norm_gather_stats_with_counts(const Tensor& input, const Tensor& mean,
                                                               const Tensor& invstd,
                                                               const c10::optional<Tensor>& running_mean,
                                                               const c10::optional<Tensor>& running_var,
                                                               double momentum, double eps, const Tensor& counts) {
  (void)input;  // as in the CPU kernel: only the gathered statistics matter
  const int64_t W = common::check_gathered(mean, invstd, counts), C = mean.size(1);
  // The CPU kernel puts its results on mean's device; so does this one.
  check_cuda(mean, "mean");
  const at::Device dev = mean.device();
  c10::cuda::CUDAGuard device_guard(dev);
  Keep keep;
  const Tensor vm = mean.contiguous(), vi = invstd.to(dev).contiguous();
  keep.push_back(vm);
  keep.push_back(vi);
  GatherFn f{in_of(vm, dev, keep), in_of(vi, dev, keep), in_of(counts.reshape({-1}), dev, keep), W, C, eps,
             momentum, kNoOut, kNoOut, kNoIn, kNoIn, kNoOut, kNoOut};
  const auto opts = mean.options().dtype(acc_type_of(mean.scalar_type()));
  Tensor r_mean = at::empty({C}, opts), r_invstd = at::empty({C}, opts);
  const int kind = kind_of(opts.dtype().toScalarType());
  f.out_mean = Out{r_mean.data_ptr(), 1, kind};
  f.out_invstd = Out{r_invstd.data_ptr(), 1, kind};
  InPlace rm, rv;
  if (running_mean.has_value() && running_mean->defined()) {
    check_channels(running_mean->numel(), C, "running_mean");
    TORCH_CHECK(running_mean->device() == dev, "syncbn_ref: running_mean is on ", running_mean->device(),
                " but mean is on ", dev);
    rm = in_place_of(*running_mean, dev);
    f.rm_in = rm.in;
    f.rm_out = rm.out;
  }
  if (running_var.has_value() && running_var->defined()) {
    check_channels(running_var->numel(), C, "running_var");
    TORCH_CHECK(running_var->device() == dev, "syncbn_ref: running_var is on ", running_var->device(),
                " but mean is on ", dev);
    rv = in_place_of(*running_var, dev);
    f.rv_in = rv.in;
    f.rv_out = rv.out;
  }
  launch_per_channel(C, f);
  if (rm.target.defined()) commit(rm);
  if (rv.target.defined()) commit(rv);
  return {r_mean, r_invstd};
}

Tensor batch_norm_elemt(const Tensor& input, const c10::optional<Tensor>& weight, const c10::optional<Tensor>& bias,
                        const Tensor& mean, const Tensor& invstd, double eps) {
  (void)eps;  // invstd already includes eps, as in the ATen op
  check_cuda(input, "input");
  c10::cuda::CUDAGuard device_guard(input.device());
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const View v = view_of(x, fmt);
  const int64_t C = v.channels;
  const at::Device dev = x.device();
  check_channels(mean.numel(), C, "mean");
  check_channels(invstd.numel(), C, "invstd");
  if (weight.has_value() && weight->defined()) check_channels(weight->numel(), C, "weight");
  if (bias.has_value() && bias->defined()) check_channels(bias->numel(), C, "bias");
  Tensor out = at::empty_like(x, x.options(), fmt);
  if (x.numel() == 0) return out;
  Keep keep;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_elemt_cuda", [&] {
    const AffineMap<scalar_t> p{in_of(mean, dev, keep), in_of(invstd, dev, keep), in_of(weight, dev, keep, 1.0),
                                in_of(bias, dev, keep, 0.0), kNoIn, 0.0};
    map<scalar_t>(v, x.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr), out.data_ptr<scalar_t>(), p);
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> batch_norm_backward_reduce(const Tensor& grad_out, const Tensor& input,
                                                                      const Tensor& mean, const Tensor& invstd,
                                                                      const c10::optional<Tensor>& weight,
                                                                      bool input_g, bool weight_g, bool bias_g) {
  check_grad_shape(grad_out, input);
  check_stat_dtypes(mean, invstd);
  check_cuda(input, "input");
  check_same_device(grad_out, "grad_out", input);
  c10::cuda::CUDAGuard device_guard(input.device());
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const Tensor dy = grad_out.to(x.scalar_type()).contiguous(fmt);
  const View v = view_of(x, fmt);
  const int64_t C = v.channels;
  const at::Device dev = x.device();
  check_channels(mean.numel(), C, "mean");
  if (weight_g) check_channels(invstd.numel(), C, "invstd");
  const bool has_w = weight.has_value() && weight->defined();
  const auto wopts = has_w ? weight->options() : input.options();
  Keep keep;
  GradOut go{kNoOut, kNoOut, kNoOut, kNoOut, kNoIn};
  Result s, sx, gw, gb;
  if (input_g) {
    s = result_of(C, mean.options(), dev);
    sx = result_of(C, mean.options(), dev);
    go.sum_dy = s.out;
    go.sum_dy_xmu = sx.out;
  }
  if (weight_g) {
    gw = result_of(C, wopts, dev);
    go.grad_weight = gw.out;
    go.invstd = in_of(invstd, dev, keep);
  }
  if (bias_g) {
    gb = result_of(C, wopts, dev);
    go.grad_bias = gb.out;
  }
  if (C > 0 && (input_g || weight_g || bias_g)) {
    const In vm = in_of(mean, dev, keep);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_backward_reduce_cuda",
                                    [&] {
      using T = scalar_t;
      const T* px = x.data_ptr<T>();
      const T* pd = dy.data_ptr<T>();
      reduce<T>(
          v, px, pd, dev, go,
          [&](auto vec, auto idx) { return PlaneGrads<T, decltype(vec)::value, decltype(idx)>{px, pd, vm, go}; },
          [&](auto vec, auto idx) { return RowGrads<T, decltype(vec)::value, decltype(idx)>{px, pd, vm, go}; });
    });
  }
  Tensor sum_dy, sum_dy_xmu, grad_weight, grad_bias;
  if (input_g) {
    sum_dy = finish(s, mean.options());
    sum_dy_xmu = finish(sx, mean.options());
  }
  if (weight_g) grad_weight = finish(gw, wopts);
  if (bias_g) grad_bias = finish(gb, wopts);
  return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
}

Tensor batch_norm_backward_elemt(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                 const Tensor& invstd, const c10::optional<Tensor>& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xmu, const Tensor& count) {
  check_grad_shape(grad_out, input);
  check_cuda(input, "input");
  check_same_device(grad_out, "grad_out", input);
  c10::cuda::CUDAGuard device_guard(input.device());
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const Tensor dy = grad_out.to(x.scalar_type()).contiguous(fmt);
  const View v = view_of(x, fmt);
  const int64_t C = v.channels;
  const at::Device dev = x.device();
  // A count on the host is summed here and checked as on the CPU (no device sync); a CUDA count is
  // summed inside the kernel, with no check (a total <= 0 gives non-finite gradients).
  double host_total = 0;
  const bool host_count = !count.is_cuda();
  if (host_count) {
    const Tensor c64 = count.detach().to(at::kDouble).contiguous();
    const double* pc = c64.data_ptr<double>();
    for (int64_t j = 0; j < c64.numel(); ++j) host_total += pc[j];
    common::check_total(host_total);
  }
  check_channels(mean.numel(), C, "mean");
  check_channels(sum_dy.numel(), C, "sum_dy");
  check_channels(sum_dy_xmu.numel(), C, "sum_dy_xmu");
  check_channels(invstd.numel(), C, "invstd");
  if (weight.has_value() && weight->defined()) check_channels(weight->numel(), C, "weight");
  Tensor out = at::empty_like(x, x.options(), fmt);
  if (x.numel() == 0) return out;
  Keep keep;
  const In counts = host_count ? kNoIn : in_of(count.reshape({-1}), dev, keep);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_backward_elemt_cuda", [&] {
    const BackwardMap<scalar_t> p{in_of(mean, dev, keep),   in_of(invstd, dev, keep),
                                  in_of(weight, dev, keep, 1.0), in_of(sum_dy, dev, keep),
                                  in_of(sum_dy_xmu, dev, keep), counts,
                                  host_count ? 0 : count.numel(), host_total};
    map<scalar_t>(v, x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), p);
  });
  return out;
}

// ---------------------------------------------------------------- reference ops

Tensor welford_stats(const Tensor& input) {
  check_cuda(input, "input");
  c10::cuda::CUDAGuard device_guard(input.device());
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const View v = view_of(x, fmt);
  const int64_t C = v.channels;
  Tensor out = at::empty({2 * C + 1}, input.options().dtype(at::kDouble));
  if (C == 0) return out.zero_();  // the count of a tensor with no channel: 0, as on the CPU
  moments(x, v, MomentsOut{out.data_ptr<double>(), kNoOut, kNoOut, C, 0.0});
  return out;
}

Tensor welford_merge(const Tensor& gathered) {
  common::check_welford_rows(gathered);
  check_cuda(gathered, "gathered");
  c10::cuda::CUDAGuard device_guard(gathered.device());
  const Tensor g = gathered.contiguous();
  const int64_t W = g.size(0), C = (g.size(1) - 1) / 2;
  Tensor out = at::empty({2 * C + 1}, g.options());
  if (C > 0) {
    launch_per_channel(C, WelfordMergeFn{g.data_ptr<double>(), W, C, out.data_ptr<double>()});
  } else {
    launch_per_channel(1, CountOnlyFn{g.data_ptr<double>(), W, out.data_ptr<double>()});
  }
  return out;
}

std::tuple<Tensor, Tensor> welford_finish(const Tensor& merged, const c10::optional<Tensor>& running_mean,
                                          const c10::optional<Tensor>& running_var, double momentum, double eps) {
  const int64_t C = common::check_welford_row(merged);
  check_cuda(merged, "merged");
  const at::Device dev = merged.device();
  c10::cuda::CUDAGuard device_guard(dev);
  const Tensor row = merged.contiguous();
  Tensor mean = at::empty({C}, row.options()), invstd = at::empty({C}, row.options());
  FinishFn f{row.data_ptr<double>(), C, eps, momentum, mean.data_ptr<double>(), invstd.data_ptr<double>(),
             kNoIn, kNoIn, kNoOut, kNoOut};
  InPlace rm, rv;
  if (running_mean.has_value() && running_mean->defined()) {
    check_channels(running_mean->numel(), C, "running_mean");
    rm = in_place_of(*running_mean, dev);
    f.rm_in = rm.in;
    f.rm_out = rm.out;
  }
  if (running_var.has_value() && running_var->defined()) {
    check_channels(running_var->numel(), C, "running_var");
    rv = in_place_of(*running_var, dev);
    f.rv_in = rv.in;
    f.rv_out = rv.out;
  }
  launch_per_channel(C, f);
  if (rm.target.defined()) commit(rm);
  if (rv.target.defined()) commit(rv);
  return {mean, invstd};
}

}  // namespace

TORCH_LIBRARY_IMPL(syncbn_ref, CUDA, m) {
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
