// CUDA kernels of the syncbn_ref ops (schemas in ../ops.cpp; the CPU twin,
// whose semantics these follow op by op, is ../cpu/syncbn_cpu.cpp).
//
// Design note
// -----------
// Semantics. Same checks, output dtypes (statistics in float for
// half/bfloat16/float input, double for double; welford_* always float64),
// output memory formats, and empty-input / zero-count results as the CPU
// kernels: an empty input gives mean 0 and invstd NaN (0/0), a gathered row
// with count <= 0 contributes nothing. Outputs live where the CPU code puts
// them (input's device, or mean's/weight's options where the CPU code uses
// those). Small per-channel tensors may come from any device and are copied
// as float64 to the compute device; big tensors (input, grad_out) must be CUDA
// tensors on one device.
//
// Layout. Every op makes its inputs contiguous in input.suggest_memory_format()
// and sees them as [outer][C][inner], like the CPU file:
//   contiguous:         outer = N,          inner = prod(spatial)
//   channels_last(_3d): outer = N*spatial,  inner = 1
// Reductions use one of two kernels, chosen by `inner` with the CPU file's
// threshold:
//   * channel kernel (inner >= 16, i.e. NCHW-like): a 2-D grid of
//     (channel, split); each block walks a contiguous slice of one channel's
//     outer*inner elements, so neighbouring threads read neighbouring memory.
//   * row kernel (channels-last, and contiguous input with small inner such as
//     2-D [N, C]): rows of width C*inner; a 2-D grid of (column tile, row
//     split), a warp covers 32 adjacent columns of one row (coalesced), the 8
//     warps of a block stride over rows, and each thread accumulates one column.
// Both write per-block partials, [split][C][sub-column], which a third kernel
// (one thread per channel) merges in a fixed order. Split counts depend only on
// the shape, so results are run-to-run reproducible and the same on every GPU.
//
// Precision. Everything accumulates and computes in float64, as on the CPU.
// The moments use Welford updates per thread and Chan's formula to merge
// thread, block and split partials, so a large mean offset does not cancel the
// variance (the CPU uses chunked two-pass sums merged by Chan's formula: same
// stability, different rounding order). Elementwise ops compute in float64 and
// round once to the output dtype (through float for half/bfloat16, as the CPU
// does). FP64 is fast on the sm_80/sm_90 data-centre parts this targets; on
// consumer GPUs these kernels are slow, which a reference harness accepts.
//
// Bit-exactness. Formulas that the CPU file evaluates on the same per-channel
// inputs (elementwise ops, invstd, gather, merges) use the non-contracting
// __dadd_rn/__dsub_rn/__dmul_rn intrinsics: nvcc would otherwise fuse a*b+c
// into an FMA, which the CPU build (x86-64 without FMA) does not, so given
// identical statistics the elementwise outputs match the CPU bit for bit.
// Reductions cannot match bitwise (different summation order).
//
// Host syncs. Exactly one: batch_norm_backward_elemt reads the total count to
// the host to raise the CPU file's "count must be positive" error.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
// For at::cuda::getCurrentCUDAStream (at::cuda re-exports c10::cuda). Not
// ATen/cuda/CUDAContext.h: it pulls in cuSPARSE/cuBLAS/cuSOLVER headers, which
// a bare nvcc toolkit may lack and which nothing here uses.
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../common.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace syncbn_ref {
namespace {

using at::Tensor;

// Same threshold as the CPU file: below it one channel's contiguous runs are
// too short for the channel kernel's reads to coalesce.
constexpr int64_t kMinInnerForChannelPath = 16;
// Power of two: the channel kernel's block merge is a halving tree.
constexpr int kChannelThreads = 256;
constexpr int kRowThreadsX = 32;  // one warp across adjacent columns
constexpr int kRowThreadsY = 8;   // warps striding over rows
// Splits aim at this many blocks per reduction (enough to fill an A100/H100)
// but never below the minimum work per block, so small inputs use few blocks.
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kMinElemsPerSplit = 4096;  // channel kernel: >= 16 elements per thread
constexpr int64_t kMinRowsPerSplit = 128;    // row kernel: >= 16 rows per thread
constexpr int kMapThreads = 256;
constexpr int64_t kMaxMapBlocks = 65535;  // grid-stride loop covers the rest
constexpr int kPerChannelThreads = 128;

using common::acc_type_of;
using common::check_channels;
using common::check_grad_shape;
using common::check_stat_dtypes;
using common::format_of;
using common::View;
using common::view_of;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void check_cuda(const Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "syncbn_ref: ", name, " must be a CUDA tensor for the CUDA kernel, got device ",
              t.device());
}

void check_same_device(const Tensor& t, const char* name, const Tensor& input) {
  TORCH_CHECK(t.device() == input.device(), "syncbn_ref: ", name, " is on ", t.device(), " but input is on ",
              input.device());
}

// A grid dimension is an unsigned int; x may reach 2^31-1, y at most 65535.
unsigned int grid_dim(int64_t blocks, int64_t limit, const char* what) {
  TORCH_CHECK(blocks <= limit, "syncbn_ref: ", what, " needs ", common::text(blocks),
              " blocks, more than the CUDA limit ", common::text(limit));
  return static_cast<unsigned int>(blocks);
}

// A small per-channel tensor (any dtype, any device) as a flat float64 tensor on `dev`.
Tensor as_doubles(const Tensor& t, at::Device dev) {
  return t.detach().to(dev, at::kDouble).contiguous().reshape({-1});
}

// ---------------------------------------------------------------- device numerics

// half/bfloat16 widen through float, exactly as the CPU file's to_d.
template <typename T>
__device__ __forceinline__ double to_d(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
__device__ __forceinline__ double to_d<double>(double v) {
  return v;
}

// Rounds through float for half/bfloat16, as the CPU's static_cast<T>(double) does.
template <typename T>
__device__ __forceinline__ T from_d(double v) {
  return static_cast<T>(static_cast<float>(v));
}
template <>
__device__ __forceinline__ double from_d<double>(double v) {
  return v;
}

// Chan's parallel merge of (n, mean, m2) with (nb, meanb, m2b); the CPU
// formula term by term, without FMA contraction.
__device__ __forceinline__ void chan_merge(double& n, double& mean, double& m2, double nb, double meanb,
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

// ---------------------------------------------------------------- reductions
//
// A reduction op supplies State (plain doubles, so it can live in shared
// memory and in a float64 scratch tensor), identity(), add() of one element,
// merge() of two states, and write() of a channel's final state.

struct MomentState {
  double n;
  double mean;
  double m2;
};

template <typename T>
struct MomentsOp {
  using State = MomentState;
  const T* x;
  double* mean_out;
  double* m2_out;

  __device__ static State identity() { return {0.0, 0.0, 0.0}; }
  // Welford: stable against a large mean offset, one pass over memory.
  __device__ void add(State& s, int64_t /*channel*/, int64_t idx) const {
    const double v = to_d(x[idx]);
    s.n += 1.0;
    const double d = v - s.mean;
    s.mean += d / s.n;
    s.m2 += d * (v - s.mean);
  }
  __device__ static void merge(State& a, const State& b) { chan_merge(a.n, a.mean, a.m2, b.n, b.mean, b.m2); }
  __device__ void write(const State& s, int64_t c) const {
    mean_out[c] = s.mean;
    m2_out[c] = s.m2;
  }
};

struct GradSumState {
  double s;
  double sx;
};

template <typename T>
struct GradSumsOp {
  using State = GradSumState;
  const T* x;
  const T* dy;
  const double* mean;
  double* sum_dy_out;
  double* sum_dy_xmu_out;

  __device__ static State identity() { return {0.0, 0.0}; }
  __device__ void add(State& st, int64_t c, int64_t idx) const {
    const double d = to_d(dy[idx]);
    st.s += d;
    st.sx += d * (to_d(x[idx]) - mean[c]);
  }
  __device__ static void merge(State& a, const State& b) {
    a.s += b.s;
    a.sx += b.sx;
  }
  __device__ void write(const State& st, int64_t c) const {
    sum_dy_out[c] = st.s;
    sum_dy_xmu_out[c] = st.sx;
  }
};

// Grid (C, splits). Block (c, s) reduces elements [s*split_len, (s+1)*split_len)
// of channel c's outer*inner elements, numbered o*inner + i.
template <typename Op>
__global__ void channel_partials_kernel(Op op, int64_t C, int64_t inner, int64_t len, int64_t split_len,
                                        typename Op::State* partials) {
  using State = typename Op::State;
  __shared__ State buf[kChannelThreads];
  const int64_t c = blockIdx.x;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * split_len;
  const int64_t k1 = k0 + split_len < len ? k0 + split_len : len;
  State st = Op::identity();
  for (int64_t k = k0 + threadIdx.x; k < k1; k += kChannelThreads) {
    const int64_t o = k / inner;
    const int64_t i = k - o * inner;
    op.add(st, c, (o * C + c) * inner + i);
  }
  buf[threadIdx.x] = st;
  __syncthreads();
  for (int stride = kChannelThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) Op::merge(buf[threadIdx.x], buf[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[static_cast<int64_t>(blockIdx.y) * C + c] = buf[0];
}

// Grid (column tiles, row splits) over rows of `width` = C*inner columns.
// Column col belongs to channel col / inner; partials are [split][width].
template <typename Op>
__global__ void row_partials_kernel(Op op, int64_t rows, int64_t width, int64_t inner, int64_t split_rows,
                                    typename Op::State* partials) {
  using State = typename Op::State;
  __shared__ State buf[kRowThreadsY][kRowThreadsX];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kRowThreadsX + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * split_rows;
  const int64_t r1 = r0 + split_rows < rows ? r0 + split_rows : rows;
  State st = Op::identity();
  if (col < width) {
    const int64_t c = col / inner;
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreadsY) op.add(st, c, r * width + col);
  }
  buf[threadIdx.y][threadIdx.x] = st;
  __syncthreads();  // reached by every thread: no early return above
  if (threadIdx.y == 0 && col < width) {
    State acc = buf[0][threadIdx.x];
    for (int y = 1; y < kRowThreadsY; ++y) Op::merge(acc, buf[y][threadIdx.x]);
    partials[static_cast<int64_t>(blockIdx.y) * width + col] = acc;
  }
}

// One thread per channel merges partials [split][C][sub] in (split, sub) order.
// With no partials (empty input) it writes the identity: mean 0, M2 0, sums 0.
template <typename Op>
__global__ void merge_partials_kernel(Op op, const typename Op::State* partials, int64_t splits, int64_t C,
                                      int64_t sub) {
  using State = typename Op::State;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  State acc = Op::identity();
  for (int64_t s = 0; s < splits; ++s)
    for (int64_t i = 0; i < sub; ++i) Op::merge(acc, partials[(s * C + c) * sub + i]);
  op.write(acc, c);
}

// Runs `op` over the [outer][C][inner] view and writes one state per channel.
// Must be called with the right device current (the ops hold a CUDAGuard).
template <typename Op>
void reduce_per_channel(const View& v, const Op& op, const at::TensorOptions& device_opts) {
  using State = typename Op::State;
  static_assert(sizeof(State) % sizeof(double) == 0, "State must be made of doubles");
  constexpr int64_t kWords = sizeof(State) / sizeof(double);
  const int64_t C = v.channels;
  if (C == 0) return;
  const int64_t len = v.outer * v.inner;  // elements per channel
  auto stream = at::cuda::getCurrentCUDAStream();
  int64_t splits = 0;
  int64_t sub = 1;
  // Freed at the end of this function while kernels may still be queued: safe,
  // the caching allocator only reuses the block in this stream's order.
  Tensor scratch;
  State* partials = nullptr;
  if (len > 0) {
    if (v.inner >= kMinInnerForChannelPath) {
      splits = std::min(ceil_div(kTargetBlocks, C), ceil_div(len, kMinElemsPerSplit));
      sub = 1;
      scratch = at::empty({splits * C * kWords}, device_opts.dtype(at::kDouble));
      partials = reinterpret_cast<State*>(scratch.data_ptr<double>());
      const dim3 grid(grid_dim(C, std::numeric_limits<int32_t>::max(), "the channel grid"),
                      grid_dim(splits, 65535, "the split grid"));
      channel_partials_kernel<Op>
          <<<grid, kChannelThreads, 0, stream>>>(op, C, v.inner, len, ceil_div(len, splits), partials);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      const int64_t width = C * v.inner;
      const int64_t tiles = ceil_div(width, kRowThreadsX);
      splits = std::min(ceil_div(kTargetBlocks, tiles), ceil_div(v.outer, kMinRowsPerSplit));
      sub = v.inner;
      scratch = at::empty({splits * width * kWords}, device_opts.dtype(at::kDouble));
      partials = reinterpret_cast<State*>(scratch.data_ptr<double>());
      const dim3 grid(grid_dim(tiles, std::numeric_limits<int32_t>::max(), "the column grid"),
                      grid_dim(splits, 65535, "the split grid"));
      const dim3 block(kRowThreadsX, kRowThreadsY);
      row_partials_kernel<Op>
          <<<grid, block, 0, stream>>>(op, v.outer, width, v.inner, ceil_div(v.outer, splits), partials);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
  const unsigned int blocks =
      grid_dim(ceil_div(C, kPerChannelThreads), std::numeric_limits<int32_t>::max(), "the merge grid");
  merge_partials_kernel<Op><<<blocks, kPerChannelThreads, 0, stream>>>(op, partials, splits, C, sub);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Fills mean_out and m2_out (contiguous float64, C each, on x's device) with
// the per-channel moments of x (contiguous in the format `v` was built for);
// returns the per-channel element count.
double moments_into(const Tensor& x, const View& v, const Tensor& mean_out, const Tensor& m2_out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_moments_cuda", [&] {
    const MomentsOp<scalar_t> op{x.data_ptr<scalar_t>(), mean_out.data_ptr<double>(),
                                 m2_out.data_ptr<double>()};
    reduce_per_channel(v, op, x.options());
  });
  return static_cast<double>(v.outer * v.inner);
}

// ---------------------------------------------------------------- per-channel and elementwise kernels

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
  per_channel_kernel<F><<<blocks, kPerChannelThreads, 0, at::cuda::getCurrentCUDAStream()>>>(C, f);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// out[k] = f(channel of k, x[k], dy[k] or 0) over a tensor laid out as [outer][C][inner].
template <typename T, typename F>
__global__ void map_kernel(int64_t n, int64_t C, int64_t inner, const T* x, const T* dy, T* out, F f) {
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += step) {
    const int64_t c = (k / inner) % C;
    const double dv = dy != nullptr ? to_d(dy[k]) : 0.0;
    out[k] = from_d<T>(f(c, to_d(x[k]), dv));
  }
}

template <typename T, typename F>
void launch_map(int64_t n, const View& v, const T* x, const T* dy, T* out, const F& f) {
  if (n == 0) return;  // also covers C == 0 and inner == 0
  const int64_t blocks = std::min(ceil_div(n, kMapThreads), kMaxMapBlocks);
  map_kernel<T, F><<<static_cast<unsigned int>(blocks), kMapThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      n, v.channels, v.inner, x, dy, out, f);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// invstd = 1 / sqrt(M2 / count + eps); count 0 gives NaN, as on the CPU.
struct InvstdFn {
  const double* m2;
  double count;
  double eps;
  double* invstd;
  __device__ void operator()(int64_t c) const { invstd[c] = 1.0 / ::sqrt(__dadd_rn(m2[c] / count, eps)); }
};

// y = (x - mean) * scale + shift with scale = invstd * weight, shift = bias.
struct AffineFn {
  const double* mean;
  const double* scale;
  const double* shift;
  __device__ double operator()(int64_t c, double x, double /*dy*/) const {
    return __dadd_rn(__dmul_rn(__dsub_rn(x, mean[c]), scale[c]), shift[c]);
  }
};

// Per-channel coefficients of the input gradient, as the CPU computes them.
struct BackwardCoeffFn {
  const double* sum_dy;
  const double* sum_dy_xmu;
  const double* invstd;
  const double* weight;
  double total;
  double* grad_mean;
  double* proj;
  double* gscale;
  __device__ void operator()(int64_t c) const {
    const double vi = invstd[c];
    grad_mean[c] = sum_dy[c] / total;
    proj[c] = __dmul_rn(__dmul_rn(sum_dy_xmu[c] / total, vi), vi);
    gscale[c] = __dmul_rn(vi, weight[c]);
  }
};

// dx = (dy - grad_mean - (x - mean) * proj) * gscale
struct BackwardFn {
  const double* mean;
  const double* grad_mean;
  const double* proj;
  const double* gscale;
  __device__ double operator()(int64_t c, double x, double dy) const {
    return __dmul_rn(__dsub_rn(__dsub_rn(dy, grad_mean[c]), __dmul_rn(__dsub_rn(x, mean[c]), proj[c])), gscale[c]);
  }
};

// Chan merge of W gathered (count, mean, invstd) rows; rows with count <= 0 are skipped.
struct GatherFn {
  const double* mean;    // [W, C]
  const double* invstd;  // [W, C]
  const double* counts;  // [W]
  int64_t W;
  int64_t C;
  double eps;
  double* out_mean;
  double* out_invstd;
  double* out_unbiased_var;
  __device__ void operator()(int64_t c) const {
    double n = 0, avg = 0, var_n = 0;
    for (int64_t j = 0; j < W; ++j) {
      const double cnt = counts[j];
      if (cnt <= 0) continue;
      const double inv = invstd[j * C + c];
      const double var = __dsub_rn(1.0 / __dmul_rn(inv, inv), eps);
      chan_merge(n, avg, var_n, cnt, mean[j * C + c], __dmul_rn(var, cnt));
    }
    out_mean[c] = avg;
    out_invstd[c] = 1.0 / ::sqrt(__dadd_rn(var_n / n, eps));
    out_unbiased_var[c] = var_n / __dsub_rn(n, 1.0);
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
      chan_merge(n, mean, m2, row[0], row[1 + c], row[1 + C + c]);
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
  __device__ void operator()(int64_t /*c*/) const {
    double total = 0;
    for (int64_t j = 0; j < W; ++j) total = __dadd_rn(total, 0.0 < g[j] ? g[j] : 0.0);
    out[0] = total;
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
  const auto dopts = x.options().dtype(at::kDouble);
  Tensor mean = at::empty({C}, dopts);
  Tensor m2 = at::empty({C}, dopts);
  const double count = moments_into(x, v, mean, m2);
  Tensor invstd = at::empty({C}, dopts);
  launch_per_channel(C, InvstdFn{m2.data_ptr<double>(), count, eps, invstd.data_ptr<double>()});
  const auto acc = acc_type_of(input.scalar_type());
  return {mean.to(acc), invstd.to(acc)};
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
  const Tensor vm = as_doubles(mean, dev);
  const Tensor vi = as_doubles(invstd, dev);
  const Tensor vc = as_doubles(counts, dev);
  const auto dopts = mean.options().dtype(at::kDouble);
  Tensor r_mean = at::empty({C}, dopts);
  Tensor r_invstd = at::empty({C}, dopts);
  Tensor unbiased = at::empty({C}, dopts);
  launch_per_channel(C, GatherFn{vm.data_ptr<double>(), vi.data_ptr<double>(),
                                 vc.data_ptr<double>(), W, C, eps, r_mean.data_ptr<double>(),
                                 r_invstd.data_ptr<double>(), unbiased.data_ptr<double>()});
  if (running_mean.has_value() && running_mean->defined()) {
    Tensor rm = *running_mean;
    check_channels(rm.numel(), C, "running_mean");
    TORCH_CHECK(rm.device() == dev, "syncbn_ref: running_mean is on ", rm.device(), " but mean is on ", dev);
    Tensor upd = rm.to(at::kDouble) * (1.0 - momentum) + r_mean * momentum;
    rm.copy_(upd.view(rm.sizes()));
  }
  if (running_var.has_value() && running_var->defined()) {
    Tensor rv = *running_var;
    check_channels(rv.numel(), C, "running_var");
    TORCH_CHECK(rv.device() == dev, "syncbn_ref: running_var is on ", rv.device(), " but mean is on ", dev);
    Tensor upd = rv.to(at::kDouble) * (1.0 - momentum) + unbiased * momentum;
    rv.copy_(upd.view(rv.sizes()));
  }
  const auto out_dtype = acc_type_of(mean.scalar_type());
  return {r_mean.to(out_dtype), r_invstd.to(out_dtype)};
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
  const Tensor vm = as_doubles(mean, dev);
  Tensor scale = as_doubles(invstd, dev);
  if (weight.has_value() && weight->defined()) {
    check_channels(weight->numel(), C, "weight");
    scale = scale * as_doubles(*weight, dev);  // one IEEE product per channel, as on the CPU
  }
  Tensor shift;
  if (bias.has_value() && bias->defined()) {
    check_channels(bias->numel(), C, "bias");
    shift = as_doubles(*bias, dev);
  } else {
    shift = at::zeros({C}, x.options().dtype(at::kDouble));
  }
  Tensor out = at::empty_like(x, x.options(), fmt);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_elemt_cuda", [&] {
    launch_map<scalar_t>(x.numel(), v, x.data_ptr<scalar_t>(), nullptr, out.data_ptr<scalar_t>(),
                         AffineFn{vm.data_ptr<double>(), scale.data_ptr<double>(),
                                  shift.data_ptr<double>()});
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
  const Tensor vm = as_doubles(mean, dev);
  const auto dopts = x.options().dtype(at::kDouble);
  Tensor s = at::empty({C}, dopts);
  Tensor sx = at::empty({C}, dopts);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_backward_reduce_cuda", [&] {
    const GradSumsOp<scalar_t> op{x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                                  vm.data_ptr<double>(), s.data_ptr<double>(), sx.data_ptr<double>()};
    reduce_per_channel(v, op, x.options());
  });
  const bool has_w = weight.has_value() && weight->defined();
  const auto wopts = has_w ? weight->options() : input.options();
  // copy=true: each output is a fresh tensor even when no conversion is needed,
  // so sum_dy and grad_bias never alias (the CPU builds each one anew too).
  Tensor sum_dy, sum_dy_xmu, grad_weight, grad_bias;
  if (input_g) {
    sum_dy = s.to(mean.options(), /*non_blocking=*/false, /*copy=*/true);
    sum_dy_xmu = sx.to(mean.options(), /*non_blocking=*/false, /*copy=*/true);
  }
  if (weight_g) {
    check_channels(invstd.numel(), C, "invstd");
    grad_weight = (sx * as_doubles(invstd, dev)).to(wopts, /*non_blocking=*/false, /*copy=*/true);
  }
  if (bias_g) grad_bias = s.to(wopts, /*non_blocking=*/false, /*copy=*/true);
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
  // The one host sync of this file: the CPU kernel raises on a non-positive
  // total, and raising needs the value on the host.
  const double total = count.detach().to(at::kDouble).sum().item<double>();
  common::check_total(total);
  check_channels(mean.numel(), C, "mean");
  check_channels(sum_dy.numel(), C, "sum_dy");
  check_channels(sum_dy_xmu.numel(), C, "sum_dy_xmu");
  check_channels(invstd.numel(), C, "invstd");
  const auto dopts = x.options().dtype(at::kDouble);
  const Tensor vm = as_doubles(mean, dev);
  const Tensor vi = as_doubles(invstd, dev);
  const Tensor vs = as_doubles(sum_dy, dev);
  const Tensor vsx = as_doubles(sum_dy_xmu, dev);
  Tensor vw;
  if (weight.has_value() && weight->defined()) {
    check_channels(weight->numel(), C, "weight");
    vw = as_doubles(*weight, dev);
  } else {
    vw = at::ones({C}, dopts);
  }
  Tensor grad_mean = at::empty({C}, dopts);
  Tensor proj = at::empty({C}, dopts);
  Tensor gscale = at::empty({C}, dopts);
  launch_per_channel(C, BackwardCoeffFn{vs.data_ptr<double>(), vsx.data_ptr<double>(),
                                        vi.data_ptr<double>(), vw.data_ptr<double>(), total,
                                        grad_mean.data_ptr<double>(), proj.data_ptr<double>(),
                                        gscale.data_ptr<double>()});
  Tensor out = at::empty_like(x, x.options(), fmt);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_backward_elemt_cuda", [&] {
    launch_map<scalar_t>(x.numel(), v, x.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                         out.data_ptr<scalar_t>(),
                         BackwardFn{vm.data_ptr<double>(), grad_mean.data_ptr<double>(),
                                    proj.data_ptr<double>(), gscale.data_ptr<double>()});
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
  const double count = moments_into(x, v, out.narrow(0, 1, C), out.narrow(0, 1 + C, C));
  out.narrow(0, 0, 1).fill_(count);
  return out;
}

Tensor welford_merge(const Tensor& gathered) {
  common::check_welford_rows(gathered);
  check_cuda(gathered, "gathered");
  c10::cuda::CUDAGuard device_guard(gathered.device());
  const Tensor g = gathered.contiguous();
  const int64_t W = g.size(0), C = (g.size(1) - 1) / 2;
  Tensor out = at::zeros({2 * C + 1}, g.options());
  if (C > 0) {
    launch_per_channel(C, WelfordMergeFn{g.data_ptr<double>(), W, C, out.data_ptr<double>()});
  } else {
    launch_per_channel(1, CountOnlyFn{g.data_ptr<double>(), W, out.data_ptr<double>()});
  }
  return out;
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
}

}  // namespace syncbn_ref
