// CPU kernels of the syncbn_ref ops (schemas in ../ops.cpp).
//
// Memory: every op first makes its inputs contiguous in the input's suggested
// memory format (a no-op for contiguous, channels_last and channels_last_3d
// input) and then sees the data as [outer][C][inner]:
//   contiguous:              outer = N,          inner = prod(spatial)
//   channels_last(_3d):      outer = N*spatial,  inner = 1
// Large `inner` (NCHW with big images) is reduced per channel, parallel over
// channels. Small `inner` (channels-last, or 2-D/3-D input) is reduced in row
// blocks, parallel over blocks, vectorizable along C; block partials are merged
// in block order, so results do not depend on the number of threads.
//
// Precision: every reduction accumulates in float64 using chunked two-pass
// sums (chunk mean, then squared deviations from it) merged with Chan's
// formula, so a large mean offset does not cancel the variance. Elementwise
// ops compute in float64 and round once to the output dtype. Output dtypes
// follow the ATen contract: statistics in float for half/bfloat16/float input
// (double for double), outputs in the input dtype and memory format.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace syncbn_ref {
namespace {

using at::Tensor;

// Elements per block of the row-block path and per chunk of the channel path:
// small enough to stay in L1/L2 between the two passes.
constexpr int64_t kBlockElems = 8192;
// Below this many contiguous elements per (sample, channel) the row-block path wins.
constexpr int64_t kMinInnerForChannelPath = 16;

struct View {
  int64_t outer;
  int64_t channels;
  int64_t inner;
};

at::MemoryFormat format_of(const Tensor& t) {
  return t.suggest_memory_format();
}

View view_of(const Tensor& x, at::MemoryFormat fmt) {
  TORCH_CHECK(x.dim() >= 2, "syncbn_ref: expected input with at least 2 dims (N, C, ...), got ", x.dim(), "-D");
  const int64_t n = x.size(0);
  const int64_t c = x.size(1);
  const int64_t spatial = c == 0 || n == 0 ? 0 : x.numel() / (n * c);
  if (fmt == at::MemoryFormat::ChannelsLast || fmt == at::MemoryFormat::ChannelsLast3d) {
    return {n * spatial, c, 1};
  }
  return {n, c, spatial};
}

at::ScalarType acc_type_of(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

template <typename T>
inline double to_d(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
inline double to_d<double>(double v) {
  return v;
}
template <>
inline double to_d<float>(float v) {
  return static_cast<double>(v);
}

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
  const T* data = x.const_data_ptr<T>();
  const int64_t C = v.channels;
  const int64_t inner = v.inner;

  if (inner >= kMinInnerForChannelPath) {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double n = 0, mean = 0, m2 = 0;
        for (int64_t o = 0; o < v.outer; ++o) {
          const T* seg = data + (o * C + c) * inner;
          for (int64_t s = 0; s < inner; s += kBlockElems) {
            const int64_t len = std::min(kBlockElems, inner - s);
            double sum = 0;
            for (int64_t i = 0; i < len; ++i) sum += to_d(seg[s + i]);
            const double bm = sum / len;
            double bm2 = 0;
            for (int64_t i = 0; i < len; ++i) {
              const double d = to_d(seg[s + i]) - bm;
              bm2 += d * d;
            }
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
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(row, 1));
  const int64_t nblocks = (v.outer + rows_per_block - 1) / rows_per_block;
  std::vector<double> part_mean(nblocks * C), part_m2(nblocks * C), part_n(nblocks);
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<double> sum(C);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * rows_per_block;
      const int64_t r1 = std::min(v.outer, r0 + rows_per_block);
      const double n = static_cast<double>((r1 - r0) * inner);
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t r = r0; r < r1; ++r) {
        const T* p = data + r * row;
        if (inner == 1) {
          for (int64_t c = 0; c < C; ++c) sum[c] += to_d(p[c]);
        } else {
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < inner; ++i) sum[c] += to_d(p[c * inner + i]);
        }
      }
      double* bm = part_mean.data() + b * C;
      double* bm2 = part_m2.data() + b * C;
      for (int64_t c = 0; c < C; ++c) {
        bm[c] = sum[c] / n;
        bm2[c] = 0;
      }
      for (int64_t r = r0; r < r1; ++r) {
        const T* p = data + r * row;
        if (inner == 1) {
          for (int64_t c = 0; c < C; ++c) {
            const double d = to_d(p[c]) - bm[c];
            bm2[c] += d * d;
          }
        } else {
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < inner; ++i) {
              const double d = to_d(p[c * inner + i]) - bm[c];
              bm2[c] += d * d;
            }
        }
      }
      part_n[b] = n;
    }
  });
  for (int64_t c = 0; c < C; ++c) {
    double n = 0, mean = 0, m2 = 0;
    for (int64_t b = 0; b < nblocks; ++b) chan_merge(n, mean, m2, part_n[b], part_mean[b * C + c], part_m2[b * C + c]);
    out.mean[c] = mean;
    out.m2[c] = m2;
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
  const double* p = d.const_data_ptr<double>();
  return std::vector<double>(p, p + d.numel());
}

// Per-channel (scale, shift) such that y = (x - mean) * scale + shift.
struct Affine {
  std::vector<double> mean, scale, shift;
};

Affine affine_of(const Tensor& mean, const Tensor& invstd, const std::optional<Tensor>& weight,
                 const std::optional<Tensor>& bias, int64_t C) {
  TORCH_CHECK(mean.numel() == C && invstd.numel() == C, "syncbn_ref: mean and invstd must have ", C,
              " elements (one per channel), got ", mean.numel(), " and ", invstd.numel());
  Affine a;
  a.mean = as_doubles(mean);
  a.scale = as_doubles(invstd);
  a.shift.assign(C, 0.0);
  if (weight.has_value() && weight->defined()) {
    TORCH_CHECK(weight->numel() == C, "syncbn_ref: weight must have ", C, " elements, got ", weight->numel());
    const auto w = as_doubles(*weight);
    for (int64_t c = 0; c < C; ++c) a.scale[c] *= w[c];
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == C, "syncbn_ref: bias must have ", C, " elements, got ", bias->numel());
    a.shift = as_doubles(*bias);
  }
  return a;
}

// Applies out[o, c, i] = f(c, x[o, c, i], dy[o, c, i]) over the [outer][C][inner] view.
template <typename T, typename F>
void map_elements(const View& v, const T* x, const T* dy, T* out, const F& f) {
  const int64_t C = v.channels, inner = v.inner;
  const int64_t row = C * inner;
  if (inner >= kMinInnerForChannelPath) {
    at::parallel_for(0, v.outer * C, 1, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t c = s % C;
        const int64_t off = s * inner;
        for (int64_t i = 0; i < inner; ++i)
          out[off + i] = static_cast<T>(f(c, to_d(x[off + i]), dy ? to_d(dy[off + i]) : 0.0));
      }
    });
  } else {
    const int64_t grain = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(row, 1));
    at::parallel_for(0, v.outer, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t base = r * row;
        for (int64_t c = 0; c < C; ++c)
          for (int64_t i = 0; i < inner; ++i) {
            const int64_t k = base + c * inner + i;
            out[k] = static_cast<T>(f(c, to_d(x[k]), dy ? to_d(dy[k]) : 0.0));
          }
      }
    });
  }
}

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
                                                               const std::optional<Tensor>& running_mean,
                                                               const std::optional<Tensor>& running_var,
                                                               double momentum, double eps, const Tensor& counts) {
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes(),
              "syncbn_ref: mean and invstd must be [world_size, C] of the same shape, got ", mean.sizes(), " and ",
              invstd.sizes());
  const int64_t W = mean.size(0), C = mean.size(1);
  TORCH_CHECK(counts.numel() == W, "syncbn_ref: counts must have one entry per gathered row (", W, "), got ",
              counts.numel());
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
    TORCH_CHECK(rm.numel() == C, "syncbn_ref: running_mean must have ", C, " elements, got ", rm.numel());
    Tensor upd = rm.to(at::kDouble) * (1.0 - momentum) + r_mean * momentum;
    rm.copy_(upd.view(rm.sizes()));
  }
  if (running_var.has_value() && running_var->defined()) {
    Tensor rv = *running_var;
    TORCH_CHECK(rv.numel() == C, "syncbn_ref: running_var must have ", C, " elements, got ", rv.numel());
    Tensor unbiased = at::empty({C}, mean.options().dtype(at::kDouble));
    for (int64_t c = 0; c < C; ++c) unbiased.data_ptr<double>()[c] = out_var_n[c] / (out_n[c] - 1.0);
    Tensor upd = rv.to(at::kDouble) * (1.0 - momentum) + unbiased * momentum;
    rv.copy_(upd.view(rv.sizes()));
  }
  (void)input;
  return {r_mean.to(out_dtype), r_invstd.to(out_dtype)};
}

Tensor batch_norm_elemt(const Tensor& input, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                        const Tensor& mean, const Tensor& invstd, double eps) {
  (void)eps;  // invstd already includes eps, as in the ATen op
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const View v = view_of(x, fmt);
  const Affine a = affine_of(mean, invstd, weight, bias, v.channels);
  Tensor out = at::empty_like(x, x.options(), fmt);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_elemt", [&] {
    map_elements<scalar_t>(v, x.const_data_ptr<scalar_t>(), nullptr, out.data_ptr<scalar_t>(),
                           [&](int64_t c, double xv, double) { return (xv - a.mean[c]) * a.scale[c] + a.shift[c]; });
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
  const T* px = x.const_data_ptr<T>();
  const T* pd = dy.const_data_ptr<T>();
  if (inner >= kMinInnerForChannelPath) {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double s = 0, sx = 0;
        for (int64_t o = 0; o < v.outer; ++o) {
          const int64_t off = (o * C + c) * inner;
          for (int64_t i = 0; i < inner; ++i) {
            const double d = to_d(pd[off + i]);
            s += d;
            sx += d * (to_d(px[off + i]) - mean[c]);
          }
        }
        sum_dy[c] = s;
        sum_dy_xmu[c] = sx;
      }
    });
    return;
  }
  const int64_t row = C * inner;
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(row, 1));
  const int64_t nblocks = (v.outer + rows_per_block - 1) / rows_per_block;
  std::vector<double> ps(nblocks * C, 0.0), psx(nblocks * C, 0.0);
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double* s = ps.data() + b * C;
      double* sx = psx.data() + b * C;
      const int64_t r1 = std::min(v.outer, (b + 1) * rows_per_block);
      for (int64_t r = b * rows_per_block; r < r1; ++r) {
        const int64_t base = r * row;
        for (int64_t c = 0; c < C; ++c)
          for (int64_t i = 0; i < inner; ++i) {
            const double d = to_d(pd[base + c * inner + i]);
            s[c] += d;
            sx[c] += d * (to_d(px[base + c * inner + i]) - mean[c]);
          }
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
                                                                      const std::optional<Tensor>& weight,
                                                                      bool input_g, bool weight_g, bool bias_g) {
  TORCH_CHECK(grad_out.sizes() == input.sizes(), "syncbn_ref: grad_out shape ", grad_out.sizes(),
              " differs from input shape ", input.sizes());
  TORCH_CHECK(mean.scalar_type() == invstd.scalar_type(), "syncbn_ref: mean and invstd need the same dtype, got ",
              mean.scalar_type(), " and ", invstd.scalar_type());
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const Tensor dy = grad_out.to(x.scalar_type()).contiguous(fmt);
  const View v = view_of(x, fmt);
  const auto vmean = as_doubles(mean);
  const auto vinv = as_doubles(invstd);
  TORCH_CHECK(static_cast<int64_t>(vmean.size()) == v.channels && static_cast<int64_t>(vinv.size()) == v.channels,
              "syncbn_ref: mean and invstd must have ", v.channels, " elements, got ", vmean.size(), " and ",
              vinv.size());
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
                                 const Tensor& invstd, const std::optional<Tensor>& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xmu, const Tensor& count) {
  TORCH_CHECK(grad_out.sizes() == input.sizes(), "syncbn_ref: grad_out shape ", grad_out.sizes(),
              " differs from input shape ", input.sizes());
  const auto fmt = format_of(input);
  const Tensor x = input.contiguous(fmt);
  const Tensor dy = grad_out.to(x.scalar_type()).contiguous(fmt);
  const View v = view_of(x, fmt);
  const int64_t C = v.channels;
  double total = 0;
  for (double n : as_doubles(count)) total += n;
  TORCH_CHECK(total > 0, "syncbn_ref: the global element count must be positive, got ", total);
  const auto vm = as_doubles(mean), vi = as_doubles(invstd), s = as_doubles(sum_dy), sx = as_doubles(sum_dy_xmu);
  TORCH_CHECK(static_cast<int64_t>(vm.size()) == C && static_cast<int64_t>(s.size()) == C &&
                  static_cast<int64_t>(sx.size()) == C,
              "syncbn_ref: mean, sum_dy and sum_dy_xmu must have ", C, " elements");
  TORCH_CHECK(static_cast<int64_t>(vi.size()) == C, "syncbn_ref: invstd must have ", C, " elements, got ", vi.size());
  std::vector<double> w(C, 1.0);
  if (weight.has_value() && weight->defined()) {
    w = as_doubles(*weight);
    TORCH_CHECK(static_cast<int64_t>(w.size()) == C, "syncbn_ref: weight must have ", C, " elements, got ", w.size());
  }
  std::vector<double> grad_mean(C), proj(C), gscale(C);
  for (int64_t c = 0; c < C; ++c) {
    grad_mean[c] = s[c] / total;
    proj[c] = sx[c] / total * vi[c] * vi[c];
    gscale[c] = vi[c] * w[c];
  }
  Tensor out = at::empty_like(x, x.options(), fmt);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_ref_backward_elemt", [&] {
    map_elements<scalar_t>(v, x.const_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                           [&](int64_t c, double xv, double dv) {
                             return (dv - grad_mean[c] - (xv - vm[c]) * proj[c]) * gscale[c];
                           });
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
  TORCH_CHECK(gathered.dim() == 2 && gathered.size(1) % 2 == 1,
              "syncbn_ref: welford_merge expects [world_size, 2*C+1] rows from welford_stats, got ",
              gathered.sizes());
  TORCH_CHECK(gathered.scalar_type() == at::kDouble, "syncbn_ref: welford_merge expects float64 rows, got ",
              gathered.scalar_type());
  const Tensor g = gathered.contiguous();
  const int64_t W = g.size(0), C = (g.size(1) - 1) / 2;
  const double* p = g.const_data_ptr<double>();
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

}  // namespace

TORCH_LIBRARY_IMPL(syncbn_ref, CPU, m) {
  m.impl("batch_norm_stats", &batch_norm_stats);
  m.impl("batch_norm_gather_stats_with_counts", &batch_norm_gather_stats_with_counts);
  m.impl("batch_norm_elemt", &batch_norm_elemt);
  m.impl("batch_norm_backward_reduce", &batch_norm_backward_reduce);
  m.impl("batch_norm_backward_elemt", &batch_norm_backward_elemt);
  m.impl("welford_stats", &welford_stats);
  m.impl("welford_merge", &welford_merge);
}

}  // namespace syncbn_ref
