"""``fencecheck list``: the acceptance matrix with its invariants."""

from __future__ import annotations

import argparse

NAME = "list"
HELP = "the acceptance matrix with its invariants"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def main(args: argparse.Namespace) -> int:
    import scenarios

    for module in scenarios.all_modules():
        spec = module.SPEC
        variants = f" (variants: {', '.join(spec.variants)})" if spec.variants else ""
        print(f"{spec.id}  {spec.title}{variants}")
        print(f"   fault:     {spec.fault}")
        print(f"   invariant: {spec.invariant}")
        print(f"   rules:     {', '.join(map(str, spec.rules))}   source: {spec.seed_section}")
    return 0
