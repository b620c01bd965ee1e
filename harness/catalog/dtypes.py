"""The floating-point dtypes a case may name, and how finely each rounds: one table, without torch.

A case names its dtypes by torch's names (``"float16"``, ...: :data:`DTYPE_NAMES`).
:data:`ROUNDOFF_OF` is each one's unit roundoff u = 2**-p (p the bits of its
significand, the hidden one included): the largest relative error of rounding
a real number to it. The tolerances (the judge's error bounds), the severity
of a failure (an error of a few u is precision, not a wrong value) and a
repro's own bounds all count in these units; they read them here, by name, so
no module needs torch to know them. The map from these names to torch's dtype
objects is :data:`harness.catalog.data.DTYPES` (the catalog's torch side).
The names are unique across the harness: a long repro file holds this
module's code beside the judge's, in one namespace.
"""

from __future__ import annotations

DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
ROUNDOFF_OF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}  # unit roundoffs
HALF_DTYPES = ("float16", "bfloat16")  # the 16-bit dtypes: autocast's, and those that accumulate in float32
