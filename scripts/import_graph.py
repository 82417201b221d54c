"""The core's import graph, package by package: for each sub-package of ``harness`` (and
each top-level module), the others it imports and through how many module imports, and the
modules of ``methods`` and ``benchmarks`` the core imports (none, by contract).

    python scripts/import_graph.py            # this checkout
    python scripts/import_graph.py --dot      # the same edges as Graphviz dot

Run from the repository root (the packages are found on the current path)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import grimp


def _unit(module: str) -> str:
    """``harness.experiments.planner`` -> ``harness.experiments``; top-level modules of the
    package stay themselves."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "harness" else parts[0]


def package_edges(graph: grimp.ImportGraph) -> Counter[tuple[str, str]]:
    """(importer's unit, imported unit) -> the number of module-to-module imports."""
    edges: Counter[tuple[str, str]] = Counter()
    for importer in graph.modules:
        if not importer.startswith("harness"):
            continue
        for imported in graph.find_modules_directly_imported_by(importer):
            source, target = _unit(importer), _unit(imported)
            if source != target:
                edges[source, target] += 1
    return edges


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dot", action="store_true", help="print Graphviz dot")
    arguments = parser.parse_args()
    sys.path.insert(0, str(Path.cwd()))
    packages = [name for name in ("harness", "methods", "benchmarks")
                if (Path.cwd() / name).is_dir()]
    graph = grimp.build_graph(*packages, cache_dir=None)
    edges = package_edges(graph)
    if arguments.dot:
        print("digraph core {")
        for (source, target), count in sorted(edges.items()):
            print(f'  "{source}" -> "{target}" [label={count}];')
        print("}")
        return 0
    units = sorted({unit for edge in edges for unit in edge})
    print(f"{len(units)} units, {len(edges)} edges, "
          f"{sum(edges.values())} module imports between units")
    for unit in units:
        targets = sorted((target, count) for (source, target), count in edges.items()
                         if source == unit)
        if targets:
            print(f"{unit} -> " + ", ".join(f"{target} ({count})" for target, count in targets))
    outside = sorted({target for (_, target) in edges if not target.startswith("harness")})
    print("core imports outside harness: " + (", ".join(outside) if outside else "none"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
