"""Judgement: the float64 truth, the tolerances, one implementation's tensors against them, and the verdict.

- :mod:`~harness.judge.oracle`: batch normalization over the global batch, exactly, in float64;
- :mod:`~harness.judge.budget`: the tolerance policy, in one place (how far a correct SyncBN may be);
- :mod:`~harness.judge.compare`: every tensor of a rank against the oracle under those budgets;
- :mod:`~harness.judge.network_budget`: the budget of a whole network's tensors, from the same constants;
- :mod:`~harness.judge.metric`: what a comparison says of one tensor (plain data, no torch);
- :mod:`~harness.judge.metric_key`: the name of a judged quantity (step, phase, tensor, rank), built and read here;
- :mod:`~harness.judge.elementwise`: one tensor against its truth, elementwise, under a final tolerance;
- :mod:`~harness.judge.invariants`: what must be bitwise the same on every rank of a group;
- :mod:`~harness.judge.call`: one recorded collective call (what "the same call" on two ranks is);
- :mod:`~harness.judge.desync`: the collectives the ranks issued, checked against each other;
- :mod:`~harness.judge.status`: the verdict's words (a case's status, a rank's status and outcome);
- :mod:`~harness.judge.mode`: how an implementation ran (native, cpu-emulation, ...), its notes apart;
- :mod:`~harness.judge.private_ops`: torch's five private SyncBN ops as float64 formulas, their outputs judged;
- :mod:`~harness.judge.plain_layer`: what ``nn.BatchNorm`` itself refuses, on CPU and on CUDA;
- :mod:`~harness.judge.verdict`: every rule that sets a ran case's status, in order (pure).
"""
