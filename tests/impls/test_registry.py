"""The built-ins' table and the base of the adapters over torch's layer, driven by their declarations.

Design: the table is checked by loading every entry (each class declares the
name it is listed under, lives in ``harness.impls``, and the order is the
order of tables and of the default selection), and by a fresh interpreter
that imports the registry and must find no adapter imported. The base is
checked with an adapter declared here over a small package written to a
temporary folder and imported for real: its version, availability reasons
and a converter that takes no process group come from the declarations alone.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import catalog
from harness.errors import ImplUnavailable
from harness.impls import builtin_names, default_names, resolve
from harness.impls.base import Impl
from harness.impls.registry import BUILTINS, builtin_class
from harness.impls.torch_layer import TorchLayerAdapter

ORDER = ("reference", "torch", "apex", "timm", "timm-layer", "mmengine", "lightning", "lightning-trainer",
         "detectron2", "detectron2-n")


def test_the_table_lists_every_builtin_in_order_and_each_class_declares_its_name():
    assert tuple(builtin_names()) == ORDER
    assert default_names() == ["reference", "torch", "apex"]
    for name, spec in BUILTINS.items():
        cls = builtin_class(name)
        assert issubclass(cls, Impl) and cls.name == name, spec
        assert spec.startswith("harness.impls.") and cls.__module__ == spec.partition(":")[0]
        assert resolve(name).name == name


def test_the_registry_imports_no_adapter_until_a_name_is_resolved():
    code = ("import sys, harness.impls\n"
            "before = sorted(m for m in sys.modules if m.startswith('harness.impls.'))\n"
            "harness.impls.resolve('mmengine')\n"
            "after = sorted(m for m in sys.modules if m.startswith('harness.impls.'))\n"
            "print(before, after)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after = out.stdout.strip().split("] [")
    assert "mmengine_converter" not in before and "torch_native" not in before
    assert "mmengine_converter" in after and "torch_layer" in after and "lightning_converter" not in after


FAKELIB = {
    "fakelib/__init__.py": "__version__ = '1.2'\n",
    "fakelib/layers.py": "def convert(model):\n    return ('converted', model)\n",
}


class FakeAdapter(TorchLayerAdapter):
    """An adapter over a converter without a process group, declared as the real ones are."""

    name = "fake"
    package = "fakelib"
    probe = ("fakelib.layers", "convert")
    install_hint = "pip install fakelib"
    takes_process_group = False

    def library_converter(self):
        from fakelib.layers import convert

        return convert


@pytest.fixture
def fakelib(tmp_path, monkeypatch):
    for rel, text in FAKELIB.items():
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for m in [m for m in sys.modules if m == "fakelib" or m.startswith("fakelib.")]:
        del sys.modules[m]


def test_the_base_reads_the_declarations(fakelib):
    import torch

    adapter = FakeAdapter()
    adapter.check_available()
    assert adapter.version() == f"fakelib 1.2 on torch {torch.__version__}"
    assert adapter.repro_binding() is None  # a converter: no standalone layer file
    assert adapter.converter()("model", None) == ("converted", "model")
    with pytest.raises(ImplUnavailable, match="fake's converter takes no process group"):
        adapter.converter()("model", object())
    layer, nested_groups = catalog.select(["allgather-shape/uneven-2-6/float32-float32/contiguous/ws2",
                                           "process-group/convert-nested-subgroup/ws4"])
    assert adapter.unsupported_reason(layer, "cpu").startswith("fake brings a converter only")
    assert "fake's converter takes no process group" in adapter.unsupported_reason(nested_groups, "cpu")


def test_a_missing_name_or_package_is_unavailable_with_the_hint(fakelib, monkeypatch):
    monkeypatch.setattr(FakeAdapter, "probe", ("fakelib.layers", "convert_sync_batchnorm"))
    with pytest.raises(ImplUnavailable, match=r"fakelib not importable \(ImportError: cannot import name "
                                              r"'convert_sync_batchnorm'.*; pip install fakelib"):
        FakeAdapter().check_available()
    monkeypatch.setattr(FakeAdapter, "probe", ("nofakelib.layers", "convert"))
    with pytest.raises(ImplUnavailable, match="ModuleNotFoundError: No module named 'nofakelib'"):
        FakeAdapter().check_available_on("cpu")
