"""Derive a target architecture's pyconfig.h for a CPython version that Debian ships no headers of.

    python3 .ci/pyconfig.py BASE REF_HOST REF_TARGET OUT

BASE is the version's own pyconfig.h, configured on x86-64. REF_HOST and REF_TARGET are Debian's
pyconfig.h of another CPython version for x86-64 and for the target. The macros on which those two
differ are the architecture's (type sizes and alignments, x87/x64 assembly, wchar_t, 128-bit
integers, large-file support, support tier); OUT is BASE with each of them set as REF_TARGET sets
it. .ci/wheels checks the method where Debian ships the real thing: the derived and Debian's own
pyconfig.h must preprocess pydsz's extension to the same C.
"""
import re
import sys

DEFINE = re.compile(r"^#define (\w+)(?: (.*))?$")
UNDEF = re.compile(r"^/\* #undef (\w+) \*/$")


def macros(path: str) -> dict:
    """Each macro pyconfig.h mentions: its value ("" when defined empty), or None when #undef'd."""
    found = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if m := DEFINE.match(line):
                found[m.group(1)] = m.group(2) or ""
            elif m := UNDEF.match(line):
                found[m.group(1)] = None
    return found


def line_for(name: str, value) -> str:
    if value is None:
        return f"/* #undef {name} */"
    return f"#define {name} {value}".rstrip()


def derive(base: str, ref_host: str, ref_target: str) -> tuple[str, list]:
    host, target = macros(ref_host), macros(ref_target)
    arch = sorted(n for n in set(host) | set(target) if host.get(n) != target.get(n))
    with open(base) as f:
        text = f.read()
    for name in arch:
        line = line_for(name, target.get(name))
        text, n = re.subn(rf"^(#define {name}\b.*|/\* #undef {name} \*/)$", line, text, flags=re.M)
        if n == 0:
            text += line + "\n"
    return text, arch


def main(argv) -> int:
    if len(argv) != 4:
        sys.exit(__doc__)
    text, arch = derive(*argv[:3])
    if not any(n.startswith("SIZEOF_") for n in arch) and "HAVE_GCC_ASM_FOR_X64" not in arch:
        sys.exit(f"{argv[1]} and {argv[2]} agree on the architecture's macros: not an x86-64 and a target pyconfig.h")
    with open(argv[3], "w") as f:
        f.write(text)
    print(" ".join(arch))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
