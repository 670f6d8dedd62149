#!/usr/bin/env python3
"""Who may import whom (docs/DESIGN.md, "Layers"): fails, naming file, line and rule, on a
`crate::<module>` path (in code, not comments) that crosses a layer the wrong way, and on
clap in the library other than as `cfg_attr(feature = "cli", derive(clap::ValueEnum))` on
an option enum (the binary's files, main.rs, cli.rs and commands.rs, are the command
line). Usage: python3 .ci/layers.py [src dir]."""
import re
import sys
from pathlib import Path

GROUND = {"error", "rng", "pool", "atomic", "signals", "alloc", "ranks"}
# module -> the modules of ours it may import (besides itself).
ALLOWED = {m: {"error"} for m in GROUND}
ALLOWED["error"] = set()
ALLOWED["kernels"] = GROUND
ALLOWED["data"] = GROUND
ALLOWED["model"] = GROUND | {"kernels"}
ALLOWED["backprop"] = GROUND | {"kernels", "model"}
ALLOWED["potential"] = GROUND | {"kernels", "model", "backprop"}
ALLOWED["sampler"] = GROUND | {"kernels"}
ORCHESTRATION = {"train", "ensemble", "metrics", "checkpoint", "run_state", "eval",
                 "bench", "synthetic", "convergence", "schedule", "settings", "uncertainty",
                 "plot", "inspect", "predict"}
LIBRARY = GROUND | {"kernels", "data", "model", "backprop", "potential", "sampler"} | ORCHESTRATION
for m in ORCHESTRATION:
    ALLOWED[m] = LIBRARY
# The binary (main.rs with its modules cli.rs and commands.rs) uses the library as `bnn::`.
BINARY = {"main", "cli", "commands"}

def module_of(path: Path, src: Path) -> str:
    rel = path.relative_to(src)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem

def code_lines(text: str):
    """(number, code, raw line): the code with comments and string literals blanked (so
    doc links do not count)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for n, raw in enumerate(text.splitlines(), 1):
        code = re.sub(r'"(\\.|[^"\\])*"', '""', raw)
        yield n, code.split("//", 1)[0], raw

def main() -> int:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "src")
    errors = []
    for path in sorted(src.rglob("*.rs")):
        mod = module_of(path, src)
        if mod in BINARY:
            allowed = BINARY
        elif mod == "lib":
            allowed = LIBRARY
        elif mod not in ALLOWED:
            errors.append(f"{path}: module `{mod}` has no layer in .ci/layers.py")
            continue
        else:
            allowed = ALLOWED[mod]
        text = path.read_text()
        for n, line, raw in code_lines(text):
            paths = re.findall(r"\bcrate::([a-z_]+)", line)
            if path.parent == src:  # a top-level file's `super::` is the crate root
                paths += re.findall(r"\bsuper::([a-z_]+)", line)
            for used in paths:
                if used != mod and used not in allowed:
                    errors.append(f"{path}:{n}: `{mod}` may not import `{used}` "
                                  f"(allowed: {', '.join(sorted(allowed)) or 'nothing'})")
            if (re.search(r"\bclap\b", line) and mod not in BINARY
                    and 'cfg_attr(feature = "cli", derive(clap::ValueEnum))' not in raw):
                errors.append(f"{path}:{n}: clap belongs to the binary (main.rs, cli.rs, "
                              f"commands.rs); the library only derives ValueEnum under "
                              f"the `cli` feature")
    for e in errors:
        print(e)
    if errors:
        print(f"layers: {len(errors)} forbidden import(s)")
        return 1
    print("layers: ok")
    return 0

if __name__ == "__main__":
    sys.exit(main())
