"""``pytest cases/``: one test item per (case, implementation), run through the harness's warm pools.

Options: ``--impl NAME`` (repeatable; default: every built-in implementation),
``--case GLOB`` (repeatable), ``--exhaustive``, ``--device``, ``--backend``,
``--timeout``. Each pytest session (each xdist worker) keeps one pool per
world size and backend; their
rendezvous ports come from the OS, so ``pytest cases/ -n 2`` never collides.
Item IDs read like the case, with the implementation last:
``test_case[allgather-shape/uneven-2-6/float16-float32/channels_last/ws2-reference]``.
Markers: ``world_size(n)`` and ``device(name)``. A known upstream issue is an
expected failure (xfail with its link); JUnit XML comes from ``--junitxml``.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    from harness.selection import BACKENDS, DEVICES

    group = parser.getgroup("syncbn-harness")
    group.addoption("--impl", action="append", default=[], metavar="NAME",
                    help="implementation to test (repeatable): reference, torch, apex, MODULE:ATTR")
    group.addoption("--case", action="append", default=[], metavar="GLOB", help="case ID pattern (repeatable)")
    group.addoption("--exhaustive", action="store_true", help="the full product instead of the default selection")
    group.addoption("--device", default=None, choices=list(DEVICES), help="default: cuda if available")
    group.addoption("--backend", default=None, choices=list(BACKENDS),
                    help="process-group backend (default: nccl on cuda, gloo on cpu)")
    group.addoption("--timeout", type=float, default=None, help="seconds per case before it is a hang (default 120)")


def selection_of(config):
    """The pytest options as the harness's one Selection."""
    from harness.selection import Selection

    return Selection(impls=config.getoption("--impl"), case_patterns=config.getoption("--case"),
                     exhaustive=config.getoption("--exhaustive"), device=config.getoption("--device"),
                     backend=config.getoption("--backend"), timeout=config.getoption("--timeout"))


def pytest_generate_tests(metafunc):
    if "harness_case" not in metafunc.fixturenames:
        return
    selection = selection_of(metafunc.config)
    params = []
    for case in selection.cases:
        for impl in selection.impl_names:
            marks = [pytest.mark.world_size(case.world_size), pytest.mark.device(selection.resolved_device)]
            params.append(pytest.param(case, impl, id=f"{case.id}-{impl}", marks=marks))
    metafunc.parametrize(("harness_case", "impl_name"), params)


@pytest.fixture(scope="session")
def harness_session(request):
    """Warm pools for this pytest session (one per world size), closed at the end."""
    from harness.engine.session import Session

    selection = selection_of(request.config)
    session = Session(selection.resolve_impls(), selection.run_options())
    yield session
    session.close()


@pytest.fixture
def impl_adapter(harness_session, impl_name):
    return next(i for i in harness_session.impls if i.name == impl_name or i.key == impl_name)
