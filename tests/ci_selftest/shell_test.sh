#!/bin/bash
echo "<testcase name=\"x\"/> <failure"
exit 0
