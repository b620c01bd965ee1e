"""torch's own SyncBatchNorm history as a test of the harness: each upstream change undone, then every mutant.

- :mod:`~harness.undo.sources`: a torch release's SyncBatchNorm files, from its smallest wheel;
- :mod:`~harness.undo.hunks`: one change's hunks of a release diff, undone on the installed file;
- :mod:`~harness.undo.fixes`: the changes as data (``syncbn_fixes.toml``), each undone;
- :mod:`~harness.undo.mutants`: one small change per site of the same code;
- :mod:`~harness.undo.sweep`: a variant run as ``torch@DIR`` until a case's record differs from the control's;
- :mod:`~harness.undo.outcomes`: the sweeps' results files;
- :mod:`~harness.undo.page`: the page made of them, and what is left unexplained.
"""
