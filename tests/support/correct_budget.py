"""How much of its error budget a correct implementation may use, wherever a test judges one quiet.

The judgement's tolerances leave a margin: a correct SyncBN (the reference, the independent ones of this
folder) uses at most half of any tensor's budget (err/tol) anywhere in the catalog; docs/catalog-and-judgement.md
states the same bound. The full-product judgement (tests/judge/test_judgement.py) and the CLI's run of the
reference over the default selection (tests/commands/test_cli.py) share the cases between them, so both hold
their records to this one bound.
"""

CORRECT_USE_AT_MOST = 0.5
