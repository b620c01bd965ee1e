// What the CPU and CUDA kernels of the syncbn_ref ops share: the view of a tensor as
// [outer][C][inner], the accumulation dtype, and the argument checks callers can get wrong.
//
// Both backends include this header, so a check and its message are written once: a caller
// error reads the same (and is a TORCH_CHECK, a c10::Error in Python) whichever device runs.
//
// Messages carry numbers and shapes as text made here (std::to_string), never through an
// iostream's number formatting: on an H200 machine (torch 2.11.0+cu130, nvcc 13.0) formatting a
// double into the message from the CUDA translation unit crashed the process (SIGSEGV inside
// ostream::_M_insert<double>, which the nvcc-compiled code had instantiated in this library).
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace syncbn_ref {
namespace common {

inline std::string text(int64_t v) {
  return std::to_string(v);
}

// A count or other value: as an integer when it is one, else with six decimals.
inline std::string text(double v) {
  return std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15 ? std::to_string(static_cast<int64_t>(v))
                                                                          : std::to_string(v);
}

// A shape as c10 prints one: [4, 3, 5].
inline std::string text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return out + "]";
}

// A dense tensor of N, C and spatial dims seen as [outer][C][inner]:
//   contiguous:         outer = N,          inner = prod(spatial)
//   channels_last(_3d): outer = N*spatial,  inner = 1
struct View {
  int64_t outer;
  int64_t channels;
  int64_t inner;
};

inline at::MemoryFormat format_of(const at::Tensor& t) {
  return t.suggest_memory_format();
}

inline View view_of(const at::Tensor& x, at::MemoryFormat fmt) {
  TORCH_CHECK(x.dim() >= 2, "syncbn_ref: expected input with at least 2 dims (N, C, ...), got ", text(x.dim()), "-D");
  const int64_t n = x.size(0);
  const int64_t c = x.size(1);
  const int64_t spatial = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
  if (fmt == at::MemoryFormat::ChannelsLast || fmt == at::MemoryFormat::ChannelsLast3d) {
    return {n * spatial, c, 1};
  }
  return {n, c, spatial};
}

// Statistics of half, bfloat16 and float input are float; of double input, double.
inline at::ScalarType acc_type_of(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

// A per-channel tensor (mean, invstd, weight, bias, running stats, sums) has C elements.
inline void check_channels(int64_t numel, int64_t C, const char* name) {
  TORCH_CHECK(numel == C, "syncbn_ref: ", name, " must have ", text(C), " elements (one per channel), got ", text(numel));
}

inline void check_grad_shape(const at::Tensor& grad_out, const at::Tensor& input) {
  TORCH_CHECK(grad_out.sizes() == input.sizes(), "syncbn_ref: grad_out shape ", text(grad_out.sizes()),
              " differs from input shape ", text(input.sizes()));
}

inline void check_stat_dtypes(const at::Tensor& mean, const at::Tensor& invstd) {
  TORCH_CHECK(mean.scalar_type() == invstd.scalar_type(), "syncbn_ref: mean and invstd need the same dtype, got ",
              mean.scalar_type(), " and ", invstd.scalar_type());
}

// batch_norm_gather_stats_with_counts: [W, C] rows of mean and invstd, W counts. Returns W.
inline int64_t check_gathered(const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& counts) {
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes(),
              "syncbn_ref: mean and invstd must be [world_size, C] of the same shape, got ", text(mean.sizes()),
              " and ", text(invstd.sizes()));
  const int64_t W = mean.size(0);
  TORCH_CHECK(counts.numel() == W, "syncbn_ref: counts must have one entry per gathered row (", text(W), "), got ",
              text(counts.numel()));
  return W;
}

// welford_merge: [W, 2C+1] float64 rows of (count, mean[C], M2[C]) from welford_stats.
inline void check_welford_rows(const at::Tensor& gathered) {
  TORCH_CHECK(gathered.dim() == 2 && gathered.size(1) % 2 == 1,
              "syncbn_ref: welford_merge expects [world_size, 2*C+1] rows from welford_stats, got ",
              text(gathered.sizes()));
  TORCH_CHECK(gathered.scalar_type() == at::kDouble, "syncbn_ref: welford_merge expects float64 rows, got ",
              gathered.scalar_type());
}

// welford_finish: one [2C+1] float64 row from welford_stats or welford_merge. Returns C.
inline int64_t check_welford_row(const at::Tensor& merged) {
  TORCH_CHECK(merged.dim() == 1 && merged.size(0) % 2 == 1,
              "syncbn_ref: welford_finish expects one [2*C+1] row from welford_stats or welford_merge, got ",
              text(merged.sizes()));
  TORCH_CHECK(merged.scalar_type() == at::kDouble, "syncbn_ref: welford_finish expects a float64 row, got ",
              merged.scalar_type());
  return (merged.size(0) - 1) / 2;
}

inline void check_total(double total) {
  TORCH_CHECK(total > 0, "syncbn_ref: the global element count must be positive, got ", text(total));
}

}  // namespace common
}  // namespace syncbn_ref
