#!/usr/bin/env python3
"""Checks that the tree keeps its layers (ARCHITECTURE.md): every file in a
layer's folders includes only headers of its own layer or of layers below it,
no code outside amp switches on amp's concrete precision callbacks, the
default loss scale is written once, each public header's source carries its
name (or the header says it is header-only), and mixtrain.h includes every
public header that does not forward. Prints one line per breach; exits 1 if any.

Usage: check_layers.py [REPO_ROOT]
"""
import os
import re
import sys

# Layers from the bottom up; a layer may include its own folders and any below.
LAYERS = [
    ("util", ["util"]),
    ("data", ["data"]),
    ("parallel", ["parallel"]),
    ("models", ["models"]),
    ("core", ["core", "callbacks"]),
    ("amp", ["amp", "optim"]),
    ("diagnose", ["diagnose"]),
    ("run", ["run"]),
]
RANK = {folder: rank for rank, (_, folders) in enumerate(LAYERS) for folder in folders}
LAYER_OF = {folder: name for name, folders in LAYERS for folder in folders}
# Root headers that sit below every layer (the one libtorch-version seam) or
# above them all (the umbrella, the deprecated aliases, forwarding headers).
ROOT_BELOW_ALL = {"compat.h"}

PUBLIC = re.compile(r'^\s*#\s*include\s*[<"]mixtrain/([^>"]+)[>"]', re.M)
PRIVATE = re.compile(r'^\s*#\s*include\s*"(util)/[^"]+"', re.M)
CONCRETE = re.compile(r"(get_cb|dynamic_pointer_cast|dynamic_cast)<\s*(mixtrain::)?amp::(MixedPrecision|MasterWeights)\b")


UNBOUNDED_ARCHIVE = re.compile(r"\.load_from\((?!\s*\[)")
UNBOUNDED_SCRIPT = re.compile(r"\bjit::load\((?!\s*reader\b)")


def layer_rank(path):
    """The rank of the layer a header path (relative to include/mixtrain) or source belongs to."""
    parts = path.split("/")
    if len(parts) == 1:
        return -1 if parts[0] in ROOT_BELOW_ALL else None
    return RANK.get(parts[0])


def sources_named_after_headers(root):
    """A public header in a layer's folder is implemented in the source of its own name
    (include/mixtrain/amp/x.h in src/amp/x.cpp), or says it is header-only, or forwards to
    another; and mixtrain.h includes every public header that does not forward."""
    breaches, public = [], []
    top = os.path.join(root, "include/mixtrain")
    for dirpath, _, files in os.walk(top):
        rel_dir = os.path.relpath(dirpath, top)
        for name in sorted(files):
            if not name.endswith(".h"):
                continue
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            text = open(os.path.join(dirpath, name), encoding="utf-8").read()
            forwards = "this forwarding header goes in" in text
            if rel_dir == ".":
                continue  # root files: the umbrella, compat.h, the deprecated aliases and forwarding headers
            if not forwards:
                public.append(rel)
            source = os.path.join(root, "src", rel_dir, name[:-2] + ".cpp")
            if not forwards and not os.path.exists(source) and not re.search(r"[Hh]eader-only", text):
                breaches.append(f"include/mixtrain/{rel}: no src/{rel_dir}/{name[:-2]}.cpp (implement it there, or say "
                                f"'Header-only' in its comment)")
    umbrella_path = os.path.join(top, "mixtrain.h")
    if not os.path.exists(umbrella_path):
        return breaches + ["include/mixtrain/mixtrain.h: missing (the umbrella that includes every public header)"]
    umbrella = open(umbrella_path, encoding="utf-8").read()
    for rel in public:
        if f'"mixtrain/{rel}"' not in umbrella and f"<mixtrain/{rel}>" not in umbrella:
            breaches.append(f"include/mixtrain/mixtrain.h: does not include mixtrain/{rel}")
    return breaches


ANY_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def sources_that_include_each_other(root):
    """Two units (a header and its source, by stem: run/branch is include/mixtrain/run/branch.h
    with src/run/branch.cpp; a private src/run/x.h with its x.cpp) whose sources each include
    the other's header: two implementations that need each other, so that neither can be
    read, tested or changed alone. (A header that includes another's, whose source reaches
    back up, keeps an order: the headers say which sits below.) Checked in the run layer,
    where the three doctors and the branches had grown into each other; amp, core and
    diagnose still hold five such pairs (ARCHITECTURE.md, "Known knots").
    """
    edges = {}
    top = os.path.join(root, "src")
    for dirpath, _, files in os.walk(top):
        rel_dir = os.path.relpath(dirpath, top)
        if rel_dir != "run":
            continue
        for name in files:
            if not name.endswith(".cpp"):
                continue
            unit = f"{rel_dir}/{name[:-4]}"
            text = open(os.path.join(dirpath, name), encoding="utf-8").read()
            for inc in ANY_INCLUDE.findall(text):
                inc = inc[len("mixtrain/"):] if inc.startswith("mixtrain/") else inc
                target = os.path.splitext(inc if "/" in inc else f"{rel_dir}/{inc}")[0]
                if target != unit:
                    edges.setdefault(unit, set()).add(target)
    breaches = []
    for unit, targets in sorted(edges.items()):
        for target in sorted(targets):
            if unit < target and unit in edges.get(target, set()):
                breaches.append(f"src/{unit}.cpp and src/{target}.cpp include each other's header: one of them must sit "
                                "below the other")
    return breaches


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    breaches = []
    for base in ("include/mixtrain", "src"):
        top = os.path.join(root, base)
        for dirpath, _, files in os.walk(top):
            rel_dir = os.path.relpath(dirpath, top)
            if rel_dir == ".":
                continue  # root files: entry points and forwarding headers
            folder = rel_dir.split(os.sep)[0]
            if folder not in RANK:
                breaches.append(f"{base}/{rel_dir}: a folder that is in no layer (add it to scripts/check_layers.py and ARCHITECTURE.md)")
                continue
            for name in files:
                if not name.endswith((".h", ".cpp")):
                    continue
                rel = f"{base}/{rel_dir}/{name}"
                text = open(os.path.join(dirpath, name), encoding="utf-8").read()
                if "this forwarding header goes in" in text:
                    continue  # an old path kept for a minor version (CHANGELOG.md)
                includes = PUBLIC.findall(text) + [m + "/" for m in PRIVATE.findall(text)]
                for inc in includes:
                    r = layer_rank(inc)
                    if r is None:
                        breaches.append(f"{rel}: includes mixtrain/{inc}, a root header that no layer may use (include what it forwards to)")
                    elif r > RANK[folder] or (r == RANK[folder] and LAYER_OF[inc.split('/')[0]] != LAYER_OF[folder]):
                        breaches.append(f"{rel}: {LAYER_OF[folder]} includes mixtrain/{inc} from layer {LAYER_OF[inc.split('/')[0]]}")
                if folder != "amp" and CONCRETE.search(text):
                    breaches.append(f"{rel}: switches on a concrete amp callback; ask PrecisionCallback instead")
    breaches += sources_named_after_headers(root)
    breaches += sources_that_include_each_other(root)
    scale = []
    for base in ("include", "src", "tools", "python"):
        for dirpath, _, files in os.walk(os.path.join(root, base)):
            for name in files:
                if name.endswith((".h", ".cpp", ".py")):
                    path = os.path.join(dirpath, name)
                    for i, line in enumerate(open(path, encoding="utf-8"), 1):
                        if "65536" in line:
                            scale.append(f"{os.path.relpath(path, root)}:{i}")
                        # Every file libtorch unpickles is read through a bounded reader
                        # (ARCHITECTURE.md): an archive loads from a reader function, a
                        # TorchScript file from one; only bytes mixtrain wrote itself are trusted.
                        if name.endswith(".cpp") and "// trusted" not in line and (
                                UNBOUNDED_ARCHIVE.search(line) or UNBOUNDED_SCRIPT.search(line)):
                            breaches.append(f"{os.path.relpath(path, root)}:{i}: unpickles without a bounded reader "
                                            "(load_from a reader function, as checkpoints and model files do)")
    if len(scale) != 1:
        breaches.append(f"65536 is written {len(scale)} times ({', '.join(scale)}); name it once (amp::kDefaultInitScale)")
    for b in breaches:
        print(b)
    print(f"check_layers: {len(breaches)} breach(es)")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
