# SPDX-License-Identifier: Apache-2.0
"""Run one command as a one-test JUnit report, so that scripts/test.sh's
summary counts a step that is not a pytest suite (a build, the series check):

    junit_step.py REPORT.xml NAME COMMAND...

The command's output passes through; a non-zero exit becomes a failure (its
last lines in the report). Always exits 0: the summary decides."""

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import deque

report, name, *command = sys.argv[1:]
start = time.monotonic()
tail: deque[str] = deque(maxlen=40)
with subprocess.Popen(
    command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
) as proc:
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        tail.append(line)
suite = ET.Element("testsuite", name=name, tests="1")
case = ET.SubElement(
    suite, "testcase", classname="step", name=name,
    time=f"{time.monotonic() - start:.1f}",
)  # fmt: skip
if proc.returncode:
    failure = ET.SubElement(case, "failure", message=f"exit status {proc.returncode}")
    failure.text = "".join(tail)
ET.ElementTree(suite).write(report)
