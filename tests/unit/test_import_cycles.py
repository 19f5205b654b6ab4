"""No import cycle inside the packages listed here (lazy imports count; `if TYPE_CHECKING:` ones do not), and no
module taking another's private names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import find_cycle, import_graph, private_imports

ROOT = Path(__file__).resolve().parents[2]
# Each package's modules and the imports between them; extend the list to hold more of the tree to it.
PACKAGES = ("gpumond",)


def test_no_import_cycle_inside_the_listed_packages():
    cycle = find_cycle(import_graph(ROOT, PACKAGES))
    assert cycle is None, "import cycle: " + " → ".join(cycle or ())


def test_no_module_takes_another_ones_private_names():
    assert private_imports(ROOT, PACKAGES) == []


def test_a_private_name_taken_from_a_sibling_is_seen(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("")
    (tmp_path / "p" / "a.py").write_text("_x = 1\n")
    (tmp_path / "p" / "b.py").write_text("from .a import _x\nfrom os import _exit\n")
    assert private_imports(tmp_path, ["p"]) == ["p.b: from p.a import _x"]


@pytest.mark.parametrize("source, cycle", [
    ({"a.py": "from p import b\n", "b.py": "def f():\n    from p.a import x\n"}, True),  # a lazy import counts
    ({"a.py": "from . import b\n", "b.py": "from .a import x\n"}, True),
    ({"a.py": "from p import b\n", "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                          "    from p.a import x\n"}, False),
    ({"a.py": "import p.b\n", "b.py": "import os\n"}, False),
])
def test_the_graph_sees_a_cycle_through_any_import_that_runs(tmp_path, source, cycle):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("")
    for name, text in source.items():
        (tmp_path / "p" / name).write_text(text)
    assert (find_cycle(import_graph(tmp_path, ["p"])) is not None) == cycle
