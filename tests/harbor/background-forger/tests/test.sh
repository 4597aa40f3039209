#!/bin/bash
# The genuine verifier: nothing can be solved here, so the reward is 0. It says what the
# agent's own attempts came to (in /app/attempts.txt) in test-stdout.txt.
echo "genuine verifier"
cat /app/attempts.txt 2>/dev/null
echo 0 > /logs/verifier/reward.txt
