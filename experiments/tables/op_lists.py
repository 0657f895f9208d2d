"""The op lists of the docs, generated from the registry (npusim/registry.py): between marker lines
in docs/numerics.md (the operators, and those proven in uint8) and docs/stm32n6.md (each op's
placement, fusion class and source), and the README's operator bullet (printed with --readme, for
the README's own markers).

    python -m experiments.tables.op_lists            # rewrite the blocks in docs/ (make op-lists)
    python -m experiments.tables.op_lists --check    # exit 1 when a committed block is out of date
    python -m experiments.tables.op_lists --readme   # print the README block

tests/test_registry.py fails when a committed block differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from npusim.registry import FAMILIES, REGISTRY

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "generated from npusim/registry.py by `make op-lists`; edit the registry, not this block"


def _family_lists() -> list[tuple[str, list[str]]]:
    return [(title, [k for k, s in REGISTRY.items() if s.family == key]) for key, title in FAMILIES.items()]


def _int16_kinds() -> list[str]:
    return [k for k, s in REGISTRY.items() if s.int16]


def _bullet(text: str) -> str:
    return "\n".join(textwrap.wrap(text, 100, subsequent_indent="  ", break_on_hyphens=False))


def numerics_block() -> str:
    lines = [f"Operators ({len(REGISTRY)}, int8, each bit-exact with TFLM):"]
    lines += [_bullet(f"- {title}: {', '.join(kinds)}") for title, kinds in _family_lists()]
    lines.append(_bullet(f"- int16 activations with int8 weights (16x8): {', '.join(_int16_kinds())}"))
    return "\n".join(lines)


def uint8_block() -> str:
    proven = [k for k, s in REGISTRY.items() if s.uint8]
    refused = [k for k, s in REGISTRY.items() if not s.uint8]
    return "\n".join(
        [
            _bullet(f"- proven in uint8 ({len(proven)}, tests/test_uint8.py): {', '.join(proven)}"),
            _bullet(f"- refused in a uint8 model: {', '.join(refused) or 'none'}"),
        ]
    )


def stm32n6_block() -> str:
    lines = ["| op | unit | fusion class | source of the placement |", "|---|---|---|---|"]
    for k, s in REGISTRY.items():
        lines.append(f"| {k} | {s.unit} | {s.fusion} | {s.placement} |")
    return "\n".join(lines)


def readme_block() -> str:
    families = "; ".join(", ".join(kinds) for _, kinds in _family_lists())
    text = (
        "- Operators (int8, bit-exact with TFLM; quirks in [docs/numerics.md](docs/numerics.md)): "
        f"{families}. int16 activations with int8 weights (16x8): {', '.join(_int16_kinds())}. "
        "Any other op is refused with its name."
    )
    return _bullet(text)


BLOCKS = {  # (file, marker name) -> block
    ("docs/numerics.md", "ops"): numerics_block,
    ("docs/numerics.md", "uint8"): uint8_block,
    ("docs/stm32n6.md", "placement"): stm32n6_block,
}
# README.md gets its block (`--readme`) from the lead, who then sets this to True so that the
# README's list is checked and rewritten with the others.
README_PLACED = True
if README_PLACED:
    BLOCKS["README.md", "ops"] = readme_block


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin ({SOURCE}) -->", f"<!-- {name}:end -->"


def with_block(text: str, name: str, block: str, where: str) -> str:
    """text with the lines between the markers `name` replaced by block."""
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"{where}: expected one '{begin}' line, then one '{end}' line")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def stale(root: Path = ROOT) -> list[str]:
    """The docs whose generated block differs from the registry."""
    out = []
    for (rel, name), make in BLOCKS.items():
        text = (root / rel).read_text()
        if with_block(text, name, make(), rel) != text and rel not in out:
            out.append(rel)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a committed block is out of date")
    ap.add_argument("--readme", action="store_true", help="print the README's block with its markers")
    args = ap.parse_args(argv)
    if args.readme:
        begin, end = markers("ops")
        print(f"{begin}\n{readme_block()}\n{end}")
        return 0
    if args.check:
        out = stale()
        for rel in out:
            print(f"{rel}: the op list is out of date; run `make op-lists`", file=sys.stderr)
        return 1 if out else 0
    for (rel, name), make in BLOCKS.items():
        path = ROOT / rel
        path.write_text(with_block(path.read_text(), name, make(), rel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
