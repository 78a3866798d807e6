"""``fencecheck list``: the acceptance matrix with its invariants, by layer."""

from __future__ import annotations

import argparse

NAME = "list"
HELP = "the acceptance matrix with its invariants, by the layer each experiment judges"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def main(args: argparse.Namespace) -> int:
    import scenarios
    from harness.engine.experiment import LAYERS

    modules = scenarios.all_modules()
    for layer, meaning in LAYERS.items():
        print(f"== {meaning}")
        for module in modules:
            spec = module.SPEC
            here = [v for v in spec.variants or (None,) if spec.layer_for(v) == layer]
            if not here:
                continue
            variants = f" (variants: {', '.join(str(v) for v in here)})" if spec.variants else ""
            print(f"{spec.id}  {spec.title}{variants}")
            print(f"   fault:     {spec.fault}")
            print(f"   invariant: {spec.invariant}")
            print(f"   rules:     {', '.join(map(str, spec.rules))}   source: {spec.seed_section}")
            needs = sorted({n.describe() for v in here for n in spec.needs_for(v)})
            if needs:
                print(f"   needs:     {', '.join(needs)}")
        print()
    return 0
