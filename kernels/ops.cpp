// Schemas of the syncbn_ref operator library, defined once.
//
// Two groups of ops live here:
//
// 1. Five ops with the contract of the ATen ops that torch.nn.SyncBatchNorm
//    calls (aten::batch_norm_stats, batch_norm_gather_stats_with_counts,
//    batch_norm_elemt, batch_norm_backward_reduce, batch_norm_backward_elemt):
//    same arguments, same output dtypes (statistics in float for half/bfloat16
//    input, outputs in the input dtype), same layouts (contiguous,
//    channels_last, channels_last_3d). The harness registers them as the CPU
//    kernels of the ATen ops inside rank processes, so torch's own SyncBN
//    Python code runs on CPU over gloo.
//
// 2. The reference SyncBN's own statistics: per-rank (count, mean, M2)
//    computed with chunked two-pass sums merged by Chan's formula, all in
//    float64, packed as one 1-D tensor [count, mean_0..mean_{C-1},
//    m2_0..m2_{C-1}] so that a single all_gather moves them, and the float64
//    merge of the gathered rows (rows with count 0 contribute nothing), and
//    welford_finish: from a merged row, the mean and invstd the forward
//    normalizes with, and the running statistics updated in place (unbiased
//    variance), on the device: the forward reads no count on the host.
//
// Kernels live in cpu/ (TORCH_LIBRARY_IMPL(syncbn_ref, CPU)) and cuda/
// (TORCH_LIBRARY_IMPL(syncbn_ref, CUDA)).
#include <torch/library.h>
#include <torch/version.h>

TORCH_LIBRARY(syncbn_ref, m) {
#if TORCH_VERSION_MAJOR == 2 && (TORCH_VERSION_MINOR == 2 || TORCH_VERSION_MINOR == 3)
  // torch 2.2 and 2.3 refuse the Python fakes (harness/kernels/fake.py) of ops defined in C++ unless the
  // library names the module that registers them; later releases need no stub.
  m.impl_abstract_pystub("harness.kernels.fake");
#endif
  m.def("batch_norm_stats(Tensor input, float eps) -> (Tensor, Tensor)");
  m.def(
      "batch_norm_gather_stats_with_counts(Tensor input, Tensor mean, Tensor invstd, "
      "Tensor(a!)? running_mean, Tensor(b!)? running_var, float momentum, float eps, "
      "Tensor counts) -> (Tensor, Tensor)");
  m.def(
      "batch_norm_elemt(Tensor input, Tensor? weight, Tensor? bias, Tensor mean, "
      "Tensor invstd, float eps) -> Tensor");
  m.def(
      "batch_norm_backward_reduce(Tensor grad_out, Tensor input, Tensor mean, "
      "Tensor invstd, Tensor? weight, bool input_g, bool weight_g, bool bias_g) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "batch_norm_backward_elemt(Tensor grad_out, Tensor input, Tensor mean, "
      "Tensor invstd, Tensor? weight, Tensor sum_dy, Tensor sum_dy_xmu, "
      "Tensor count) -> Tensor");
  m.def("welford_stats(Tensor input) -> Tensor");
  m.def("welford_merge(Tensor gathered) -> Tensor");
  m.def(
      "welford_finish(Tensor merged, Tensor(a!)? running_mean, Tensor(b!)? running_var, float momentum, "
      "float eps) -> (Tensor, Tensor)");
}
