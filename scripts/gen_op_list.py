"""Prints the natively lowered aten ops (from the op table) as a Markdown block for the README.

Usage: .venv/bin/python scripts/gen_op_list.py [--update README.md]
"""
import re
import sys

import torch_xla

BEGIN, END = "<!-- ops:begin -->", "<!-- ops:end -->"


def render() -> str:
    rows = sorted(torch_xla._C._lowered_ops())
    lines = [BEGIN, f"{len(rows)} op-table rows (each also serves its in-place `name_` and `out=` variants):", "",
             "```"]
    line = ""
    for r in rows:
        if len(line) + len(r) + 2 > 100:
            lines.append(line.rstrip())
            line = ""
        line += r + "  "
    lines += [line.rstrip(), "```", END]
    return "\n".join(lines)


if __name__ == "__main__":
    text = render()
    if len(sys.argv) == 3 and sys.argv[1] == "--update":
        path = sys.argv[2]
        src = open(path).read()
        new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: text, src, flags=re.S)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(new)
        import os
        os.replace(tmp, path)
    else:
        print(text)
