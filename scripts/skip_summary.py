"""Prints each test CTest skipped and why, from CTest's JUnit file (`ctest --output-junit`): the
message a GoogleTest GTEST_SKIP() gave (the line after "Skipped" in its output), else CTest's
own reason. Usage: python3 scripts/skip_summary.py build/ctest.xml"""

import sys
import xml.etree.ElementTree as ET


def reason(case):
    out = (case.findtext("system-out") or "").splitlines()
    for i, line in enumerate(out):
        if line.endswith(": Skipped") and i + 1 < len(out) and out[i + 1].strip():
            return out[i + 1].strip()
    skipped = case.find("skipped")
    return skipped.get("message", "skipped") if skipped is not None else "not run"


def main(path):
    cases = [c for c in ET.parse(path).getroot().iter("testcase")
             if c.get("status") in ("notrun", "disabled") or c.find("skipped") is not None]
    if not cases:
        print("ctest: no test skipped")
        return
    print(f"ctest: {len(cases)} test(s) skipped:")
    for c in cases:
        print(f"  {c.get('name')}: {reason(c)}")


if __name__ == "__main__":
    main(sys.argv[1])
