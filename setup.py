"""Package discovery, the one thing pyproject.toml cannot say: find every package under harness/, plus the
fixed top-level folders cases/ and kernels/, which ship as harness.cases and harness.kernels (see
[tool.setuptools.package-dir] in pyproject.toml). A new subpackage is picked up without a change here.
"""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["harness", "harness.*"]) + ["harness.cases", "harness.kernels"])
