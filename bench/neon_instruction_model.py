#!/usr/bin/env python3
"""Static instruction model of the neon forward kernel's f32 inner loops (no Arm machine needed).

Disassembles the cross-compiled neon forward unit (fwd_neon.cc, generated from the ISA table) with aarch64-linux-gnu-objdump, finds the
inner loop of the S = Q K^T register tile and of the O += P V tile (the innermost loops with the
most FMLA instructions: the score loop is the one that also prefetches the next panel), counts its
instructions by class, and scales one iteration to a 64 x 64 block at head_dim = head_dim_v = D:

  iterations per block = 64 rows * 64 columns * D / (tile rows * tile columns)

(S: columns are keys, depth D; P V: columns are output columns, depth 64 keys). The FMA-bound ideal
is one FMLA per 4 multiply-adds and nothing else: 64 * 64 * D / 4 instructions. The tile prologue
and epilogue (accumulators zeroed, loaded, stored once per 64 or D steps) and remainder tiles are
left out; loads and stores against sp are register spills and are counted apart; "shuffle"
includes vector register moves (MOV v.16b), which only the register allocator adds.

Usage:
  scripts/test_aarch64.sh   # or any cross build into build/aarch64 (GCC)
  python3 bench/neon_instruction_model.py [--object PATH] [--head-dim 64] [--show]
  # the same file from clang:
  clang++ --target=aarch64-linux-gnu -O3 -DNDEBUG -std=c++17 -fno-math-errno -Isrc -Iinclude \
    -c build/aarch64/src/isa/fwd_neon.cc -o /tmp/fwd_neon_clang.o
  python3 bench/neon_instruction_model.py --object /tmp/fwd_neon_clang.o
"""
import argparse
import re
import subprocess
import sys

DEFAULT_OBJECT = "build/aarch64/src/CMakeFiles/anyattn_objects.dir/isa/fwd_neon.cc.o"
BLOCK = 64
LANES = 4

CLASSES = ("fma", "load", "store", "spill", "shuffle", "exp", "prefetch", "other")
FMA = re.compile(r"^(fmla|fmls|fmlal2?|fmlsl2?|bfdot|bfmmla|bfmlal[bt]|fmadd|fmsub)$")
LOAD = re.compile(r"^(ldr|ldur|ldp|ldnp|ld1r?|ld[234]r?)$")
STORE = re.compile(r"^(str|stur|stp|stnp|st[1234])$")
SHUFFLE = re.compile(r"^(dup|zip[12]|uzp[12]|trn[12]|ext|ins|mov|tbl|tbx|rev(16|32|64)|umov)$")
EXP = re.compile(r"^(frint[nmpzax]|fcvt[nmpza]?[su]|[su]cvtf|fmax|fmin|fmaxnm|fminnm|bsl|bit|bif|"
                 r"fcm[a-z]+|shl|sshl|ushl)$")
LINE = re.compile(r"^\s*([0-9a-f]+):\s+([a-z0-9.]+)\s*(.*)$")
SYMBOL = re.compile(r"^[0-9a-f]+ <(.*)>:$")
BRANCH_TARGET = re.compile(r"(?:^|, )([0-9a-f]+) <")


def classify(mnemonic, operands):
    base = mnemonic.split(".")[0]
    if FMA.match(base):
        return "fma"
    if base == "prfm":
        return "prefetch"
    if LOAD.match(base) or STORE.match(base):
        if "[sp" in operands:
            return "spill"
        return "load" if LOAD.match(base) else "store"
    vector = re.search(r"\bv[0-9]+\.", operands) is not None
    if SHUFFLE.match(base) and vector:
        return "shuffle"
    if EXP.match(base) and vector:
        return "exp"
    return "other"


def disassemble(path):
    text = subprocess.run(["aarch64-linux-gnu-objdump", "-d", "--no-show-raw-insn", "-C", path],
                          check=True, capture_output=True, text=True).stdout
    functions, name = {}, None
    for line in text.splitlines():
        symbol = SYMBOL.match(line)
        if symbol:
            name = symbol.group(1)
            functions.setdefault(name, [])
            continue
        match = LINE.match(line)
        if match and name is not None:
            address, mnemonic, operands = match.groups()
            functions[name].append((int(address, 16), mnemonic, operands.split("//")[0].strip()))
    return functions


def inner_loops(instructions):
    """The body of every loop closed by a conditional backward branch that holds no other one."""
    loops = []
    index = {address: i for i, (address, _, _) in enumerate(instructions)}
    for i, (address, mnemonic, operands) in enumerate(instructions):
        # Loops close with a conditional branch; a plain `b` back is a jump between blocks.
        if not mnemonic.startswith(("b.", "cb", "tb")):
            continue
        target = BRANCH_TARGET.search(operands)
        if not target:
            continue
        start = int(target.group(1), 16)
        if start >= address or start not in index:
            continue
        loops.append((index[start], i))
    innermost = [(s, e) for s, e in loops
                 if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in loops)]
    return [instructions[s:e + 1] for s, e in innermost]


def counts(body):
    result = {c: 0 for c in CLASSES}
    for _, mnemonic, operands in body:
        result[classify(mnemonic, operands)] += 1
    return result


def find_loop(functions, want_prefetch, name_filter):
    best = None
    for name, instructions in functions.items():
        if not name_filter(name):
            continue
        for body in inner_loops(instructions):
            c = counts(body)
            if (c["prefetch"] > 0) != want_prefetch:
                continue
            if best is None or c["fma"] > best[1]["fma"]:
                best = (name, c, body)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--object", default=DEFAULT_OBJECT)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--show", action="store_true", help="print the loops' instructions")
    args = parser.parse_args()
    functions = disassemble(args.object)
    blocked = lambda n: "neon::" in n and "direct" not in n and "decode" not in n
    loops = {
        "S = Q K^T": find_loop(functions, True, blocked),
        "O += P V": find_loop(functions, False, lambda n: blocked(n) and "pv_" in n),
    }
    ideal = BLOCK * BLOCK * args.head_dim // LANES
    print(f"f32, one 64 x 64 block, D = Dv = {args.head_dim}; FMA-bound ideal {ideal} instructions "
          "per product\n")
    print("| loop | inner loop | per iteration: " + " / ".join(CLASSES) +
          " | per block | FMA share |")
    print("|---|---|---|---|---|")
    failed = False
    for label, found in loops.items():
        if found is None:
            print(f"| {label} | not found | | | |")
            failed = True
            continue
        name, c, body = found
        fmas = c["fma"]
        total = sum(c.values())
        # Each FMLA does LANES multiply-adds; a block's product does 64 * 64 * D of them.
        iterations = BLOCK * BLOCK * args.head_dim / (fmas * LANES)
        per_block = {k: round(v * iterations) for k, v in c.items()}
        print(f"| {label} | {fmas} FMLA per iteration | " + " / ".join(str(c[k]) for k in CLASSES)
              + f" ({total}) | " + ", ".join(f"{k} {per_block[k]}" for k in CLASSES if per_block[k])
              + f" (total {round(total * iterations)}) | {100.0 * fmas / total:.1f}% |")
        if args.show:
            print(f"\n{name}:")
            for address, mnemonic, operands in body:
                print(f"  {address:6x}  {classify(mnemonic, operands):8s} {mnemonic} {operands}")
            print()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
