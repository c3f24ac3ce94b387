# SPDX-License-Identifier: Apache-2.0
"""Compares two pytest junit-xml reports of the same suite (numba-cuda's, under Numba's
built-in memory manager and under spillway.numba): prints the outcome counts of each, then
every test whose outcome differs, with the first line of its message.

    python tests/python/compare_junit.py builtin.xml spillway.xml
"""
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path):
    res = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                msg = (el.get("message") or el.text or "").strip().splitlines()[:1]
                msg = msg[0][:160] if msg else ""
                break
        res[name] = (outcome, msg)
    return res


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    for label, r in ((sys.argv[1], a), (sys.argv[2], b)):
        c = Counter(o for o, _ in r.values())
        print(f"{label}: {len(r)} tests: " + ", ".join(f"{c[k]} {k}" for k in
                                                        ("passed", "failed", "error", "skipped")))
    diff = sorted(n for n in set(a) | set(b)
                  if a.get(n, ("absent", ""))[0] != b.get(n, ("absent", ""))[0])
    print(f"\n{len(diff)} tests differ (first: {sys.argv[1]}, second: {sys.argv[2]}):")
    for n in diff:
        oa, ma = a.get(n, ("absent", ""))
        ob, mb = b.get(n, ("absent", ""))
        print(f"- {n}: {oa} -> {ob}" + (f": {mb or ma}" if (mb or ma) else ""))


if __name__ == "__main__":
    main()
