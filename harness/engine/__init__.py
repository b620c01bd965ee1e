"""The execution engine: rank processes that run cases, and the parent that attributes what they did.

- :mod:`~harness.engine.plan`: one plan per run (build key, pending cases, launcher) and its executor;
- :mod:`~harness.engine.launcher`: who starts a run's ranks (local warm pools, or a torchrun job), chosen once;
- :mod:`~harness.engine.admission`: whether a (case, impl) runs here, and its task (both launchers);
- :mod:`~harness.engine.session`: run a selection (one warm pool per world size), yield records;
- :mod:`~harness.engine.pool`: the parent side of a warm pool of rank processes;
- :mod:`~harness.engine.waiting`: how long the parent waits for a task's ranks (both launchers' one rule);
- :mod:`~harness.engine.forkserver`, :mod:`~harness.engine.warm`, :mod:`~harness.engine.warm_server`,
  :mod:`~harness.engine.warm_dynamo`: how rank processes start (forked from a server with torch, the harness
  and what ranks would import, preloaded);
- :mod:`~harness.engine.collectives`: every collective a rank issues, recorded in order;
- :mod:`~harness.engine.nccl_contract`: a CPU backend with NCCL's contract over gloo's transport;
- :mod:`~harness.engine.list_contract`: one with the list all_gather only, as MPI's (no flat all_gather);
- :mod:`~harness.engine.compiled`: a case's scenario under ``torch.compile``, beside it run eagerly;
- :mod:`~harness.engine.diagnosis`: a crash or hang run once more with collective debugging;
- :mod:`~harness.engine.logs`: rank logs kept (bounded) for failing cases only;
- :mod:`~harness.engine.exchange`: the harness's own sums between a pool's ranks (the oracle of a case drawn per rank);
- :mod:`~harness.engine.rank`: the rank side (the process loop, the per-process context, one task);
- :mod:`~harness.engine.attribution`: every rank's outcome of a task, and the case's status;
- :mod:`~harness.engine.reuse`: whether a pool can take the next task after a failure;
- :mod:`~harness.engine.assemble`: the one path from rank outcomes to a record;
- :mod:`~harness.engine.torchrun`: the same rank code as one rank of a torchrun job;
- :mod:`~harness.engine.torchrun_case`: one case of that job: its keys, fed to the waiting rule;
- :mod:`~harness.engine.torchrun_protocol`: the keys a torchrun job's ranks exchange, and its heartbeats;
- :mod:`~harness.engine.messages`: the plain data that crosses processes.
"""

# The variables by which torch.distributed and torchrun find a job. A caller's values must never reach a
# rank process or a child harness: ranks get their rendezvous from the parent, explicitly.
RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                  "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                  "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE")
