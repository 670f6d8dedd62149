#!/usr/bin/env python3
"""Who may import whom inside a crate (docs/DESIGN.md, "Floors"). Cargo keeps a crate
from using a floor above it (bnn-kernels -> bnn-core -> bnn-run -> bnn); this script says
what Cargo cannot: the rooms within a floor. It fails, naming file, line and rule, on a
`crate::<module>` path (in code, not comments) that crosses a room the wrong way, and on
clap in the library crates other than as `cfg_attr(feature = "cli",
derive(clap::ValueEnum))` on an option enum, or `cfg_attr(feature = "cli",
derive(clap::Args))` on the settings layer, whose fields are `bnn train`'s flags so that
each setting is defined once (the binary's files, main.rs, cli.rs and commands.rs, are
the command line). Usage: python3 .ci/layers.py [project root]."""
import re
import sys
from pathlib import Path

# The floor below, as each library crate names it at its root (`use bnn_kernels as
# kernels; use bnn_kernels::{error, ...}`): always allowed.
KERNELS_FLOOR = {"kernels", "error", "rng", "pool", "alloc", "atomic", "signals"}
CORE_FLOOR = {"backprop", "convergence", "data", "driver", "engine", "ensemble", "hmc", "likelihood", "metrics",
              "model", "optim", "potential", "regression", "sample_file", "sampler", "schedule",
              "synthetic", "uncertainty"}

# crate folder -> module -> the modules of its own crate it may import (None: any).
GROUND = {"error", "rng", "pool", "alloc", "atomic", "signals"}
RULES = {
    "crates/bnn-kernels": {
        **{m: {"error"} for m in GROUND},
        "error": set(),
    },
    "crates/bnn-core": {
        # The sampler sees parameters and gradients only: no model, data or potential; it
        # builds the dynamics of `engine` (each update defined once, lent to the fused
        # kernels or to the composed interpreter) and the composed baselines, which see it
        # in turn.
        "sampler": KERNELS_FLOOR | {"engine::dynamics", "engine::composed"},
        "engine::dynamics": KERNELS_FLOOR | {"sampler", "engine::composed"},
        "engine::composed": KERNELS_FLOOR | {"sampler"},
        "engine::exchange": KERNELS_FLOOR,
        # The step plan's binding: a chain's θ, sampler state and potential in and out of
        # the plan's workspace.
        "engine::planned": KERNELS_FLOOR | {"model", "sampler", "potential", "likelihood", "engine::dynamics"},
        "data": KERNELS_FLOOR,
        # The chain driver sees transitions only: no model, sampler or data.
        "driver": KERNELS_FLOOR,
        "model": KERNELS_FLOOR,
        # The likelihood is arithmetic on outputs and targets: below the passes.
        "likelihood": KERNELS_FLOOR,
        # HMC sees a flat θ and an energy, as the samplers see parameters and gradients.
        "hmc": KERNELS_FLOOR,
        "engine::backprop": KERNELS_FLOOR | {"model", "likelihood"},
        "potential": KERNELS_FLOOR | {"model", "engine::backprop", "likelihood"},
        # The optimizers: a sampler over a posterior (the prior, a regression's noise).
        "optim": KERNELS_FLOOR | {"sampler", "potential", "likelihood"},
    },
    "crates/bnn-run": {
        "ranks": KERNELS_FLOOR,
    },
}
BINARY = {"main", "cli", "commands"}


# Modules whose submodules are rooms of their own (`engine::backprop`, `engine::dynamics`).
SPLIT = {"engine"}


def module_of(path: Path, src: Path) -> str:
    rel = path.relative_to(src)
    if rel.parts[0] in SPLIT and len(rel.parts) > 1:
        sub = rel.parts[1] if len(rel.parts) > 2 else Path(rel.parts[1]).stem
        return f"{rel.parts[0]}::{sub}"
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def code_lines(text: str):
    """(number, code, raw line): the code with comments and string literals blanked (so
    doc links do not count)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for n, raw in enumerate(text.splitlines(), 1):
        code = re.sub(r'"(\\.|[^"\\])*"', '""', raw)
        yield n, code.split("//", 1)[0], raw


def check_crate(src: Path, rules: dict, library: bool, errors: list):
    for path in sorted(src.rglob("*.rs")):
        mod = module_of(path, src)
        allowed = rules.get(mod)
        for n, line, raw in code_lines(path.read_text()):
            paths = [a if a not in SPLIT or not b else f"{a}::{b}"
                     for a, b in re.findall(r"\bcrate::([a-z_]+)(?:::([a-z_]+))?", line)]
            if path.parent == src:  # a top-level file's `super::` is the crate root
                paths += re.findall(r"\bsuper::([a-z_]+)", line)
            for used in paths:
                if allowed is not None and used != mod and used not in allowed:
                    errors.append(f"{path}:{n}: `{mod}` may not import `{used}` "
                                  f"(allowed: {', '.join(sorted(allowed)) or 'nothing'})")
            derives = ('cfg_attr(feature = "cli", derive(clap::ValueEnum))' in raw
                       or (mod == "settings"
                           and 'cfg_attr(feature = "cli", derive(clap::Args))' in raw))
            if re.search(r"\bclap\b", line) and (library or mod not in BINARY) and not derives:
                errors.append(f"{path}:{n}: clap belongs to the binary (main.rs, cli.rs, "
                              f"commands.rs); the library only derives ValueEnum (and the "
                              f"settings layer Args) under the `cli` feature")


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    errors = []
    for folder, rules in RULES.items():
        check_crate(root / folder / "src", rules, True, errors)
    check_crate(root / "src", {}, False, errors)
    for e in errors:
        print(e)
    if errors:
        print(f"layers: {len(errors)} forbidden import(s)")
        return 1
    print("layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
