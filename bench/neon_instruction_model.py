#!/usr/bin/env python3
"""Static instruction model of the neon forward kernel's inner loops (no Arm machine needed).

Disassembles the cross-compiled neon forward unit (fwd_neon.cc, generated from the ISA table) and
the packed forward's bf16 and f16 score units (fwd_scores_bf16_dot_neon.cc, BFDOT, and
fwd_scores_f16_fml_neon.cc, FMLAL) with aarch64-linux-gnu-objdump, finds the inner loop of each
S = Q K^T register tile and of the f32 O += P V tile (the innermost loops with the most
multiply-add instructions: a score loop is the one that also prefetches the next panel), counts
its instructions by class, and scales one iteration to a 64 x 64 block at head_dim = head_dim_v = D:

  iterations per block = 64 * 64 * D / (multiply-add instructions per iteration * multiply-adds
                                        per instruction)

(FMLA and FMLAL do 4 multiply-adds, BFDOT 8). The FMA-bound ideal is that many instructions and
nothing else: 64 * 64 * D / 4 for FMLA and FMLAL, / 8 for BFDOT. The tile prologue
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

OBJECTS = "build/aarch64/src/CMakeFiles/anyattn_objects.dir/"
DEFAULT_OBJECT = OBJECTS + "isa/fwd_neon.cc.o"
BF16_DOT_OBJECT = OBJECTS + "cpu/forward/fwd_scores_bf16_dot_neon.cc.o"
F16_FML_OBJECT = OBJECTS + "cpu/forward/fwd_scores_f16_fml_neon.cc.o"
BLOCK = 64

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
    parser.add_argument("--object", default=DEFAULT_OBJECT, help="the f32 unit (fwd_neon.cc)")
    parser.add_argument("--bf16-dot-object", default=BF16_DOT_OBJECT)
    parser.add_argument("--f16-fml-object", default=F16_FML_OBJECT)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--show", action="store_true", help="print the loops' instructions")
    args = parser.parse_args()
    f32_unit = disassemble(args.object)
    blocked = lambda n: "neon::" in n and "direct" not in n and "decode" not in n
    # (label, loop, multiply-adds per multiply-add instruction)
    loops = [
        ("S = Q K^T, f32 (FMLA)", find_loop(f32_unit, True, blocked), 4),
        ("O += P V, f32 (FMLA)", find_loop(f32_unit, False, lambda n: blocked(n) and "pv_" in n),
         4),
        ("S = Q K^T, bf16 (BFDOT)",
         find_loop(disassemble(args.bf16_dot_object), True, lambda n: "neon_bf16::" in n), 8),
        ("S = Q K^T, f16 (FMLAL)",
         find_loop(disassemble(args.f16_fml_object), True, lambda n: "neon_f16::" in n), 4),
    ]
    print(f"One 64 x 64 block, D = Dv = {args.head_dim}\n")
    print("| loop | inner loop | per iteration: " + " / ".join(CLASSES) +
          " | per block | FMA-bound ideal | FMA share |")
    print("|---|---|---|---|---|---|")
    failed = False
    for label, found, multiply_adds in loops:
        if found is None:
            print(f"| {label} | not found | | | | |")
            failed = True
            continue
        name, c, body = found
        fmas = c["fma"]
        total = sum(c.values())
        products = BLOCK * BLOCK * args.head_dim
        iterations = products / (fmas * multiply_adds)
        per_block = {k: round(v * iterations) for k, v in c.items()}
        print(f"| {label} | {fmas} multiply-add instructions per iteration | "
              + " / ".join(str(c[k]) for k in CLASSES) + f" ({total}) | "
              + ", ".join(f"{k} {per_block[k]}" for k in CLASSES if per_block[k])
              + f" (total {round(total * iterations)}) | {products // multiply_adds} | "
              + f"{100.0 * fmas / total:.1f}% |")
        if args.show:
            print(f"\n{name}:")
            for address, mnemonic, operands in body:
                print(f"  {address:6x}  {classify(mnemonic, operands):8s} {mnemonic} {operands}")
            print()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
