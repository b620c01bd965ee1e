"""Can NCCL put two ranks on this machine's one GPU? Two processes try one all_reduce on ``cuda:0`` and say.

NCCL up to 2.29 refuses a communicator with two ranks on one device
("Duplicate GPU detected"); 2.30 added an experimental switch for it
(``NCCL_MULTI_RANK_GPU_ENABLE=1``, set here). The answer decides whether the
nccl families can run on a one-GPU machine, and is kept as evidence.

``python -m harness.gpu_suite.nccl_probe --out FILE.json`` writes the NCCL
version, whether the all_reduce gave the right sum on both ranks, and each
rank's error; exits 0 when it worked, 1 when NCCL refused (an answer, not a
failure), 2 when the probe itself could not run (no GPU, no NCCL).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

TIMEOUT_S = 45.0
WORLD = 2


def _rank(rank: int, port: int, queue) -> None:
    try:
        import datetime

        import torch
        import torch.distributed as dist

        os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S - 10))
        t = torch.full((4,), float(rank + 1), device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        got = t.tolist()
        dist.destroy_process_group()
        queue.put({"rank": rank, "ok": got == [3.0] * 4, "sum": got, "error": None})
    except BaseException as exc:  # noqa: BLE001 - the refusal is the answer; sent to the parent as data
        queue.put({"rank": rank, "ok": False, "sum": None, "error": f"{type(exc).__name__}: {exc}"[:2000]})


def probe(timeout_s: float = TIMEOUT_S) -> dict:
    """Run the two ranks; what they said (a rank that said nothing before ``timeout_s`` is reported as hung)."""
    import torch

    version = torch.cuda.nccl.version() if torch.cuda.is_available() and torch.distributed.is_nccl_available() \
        else None
    if version is None:
        return {"nccl": None, "works": None, "ranks": [], "why": "no GPU or no NCCL in this torch"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, queue), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    said: dict[int, dict] = {}
    deadline = time.monotonic() + timeout_s
    while len(said) < WORLD and time.monotonic() < deadline:
        try:
            msg = queue.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - queue.Empty: the deadline passed
            break
        said[msg["rank"]] = msg
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    ranks = [said.get(r, {"rank": r, "ok": False, "sum": None, "error": f"no answer in {timeout_s:.0f}s (hung)"})
             for r in range(WORLD)]
    v = list(version) if not isinstance(version, int) else [version // 1000, version // 100 % 10, version % 100]
    return {"nccl": v[:3], "works": all(r["ok"] for r in ranks), "ranks": ranks,
            "env": {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    found = probe()
    args.out.write_text(json.dumps(found, indent=2), encoding="utf-8")
    if found["works"] is None:
        print(f"cannot probe: {found['why']}")
        return 2
    version = ".".join(map(str, found["nccl"]))
    if found["works"]:
        print(f"NCCL {version}: two ranks on one GPU work (all_reduce sums right)")
        return 0
    errors = "; ".join(f"rank {r['rank']}: {r['error']}" for r in found["ranks"] if r["error"])
    print(f"NCCL {version}: two ranks on one GPU refused: {errors[:1500]}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
