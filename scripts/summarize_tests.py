# SPDX-License-Identifier: Apache-2.0
"""Sum the JUnit XML reports of scripts/test.sh: one line per suite, then the
closing line "N passed, N failed". Skips count as failures: a test that cannot
run here belongs in tests/upstream_deselect.txt with its reason.
Exit status 1 if anything failed, errored, was skipped or a suite did not run."""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

total_passed = total_failed = 0
for report in sys.argv[1:]:
    path = Path(report)
    if not path.exists():
        print(f"{path.stem}: did not run")
        total_failed += 1
        continue
    passed = failed = skipped = 0
    for case in ET.parse(path).iter("testcase"):
        outcome = {child.tag for child in case}
        if outcome & {"failure", "error"}:
            failed += 1
            print(f"  FAILED {case.get('classname')}::{case.get('name')}")
        elif "skipped" in outcome:
            skipped += 1
            print(f"  SKIPPED (counted as failed) {case.get('classname')}::{case.get('name')}")
        else:
            passed += 1
    print(f"{path.stem}: {passed} passed, {failed} failed, {skipped} skipped")
    total_passed += passed
    total_failed += failed + skipped
print(f"{total_passed} passed, {total_failed} failed")
sys.exit(1 if total_failed else 0)
